"""deploy/ deploys: `kubectl kustomize deploy/` (the real kubectl, offline) renders it, and the
rendered objects fit together — the probes hit the port the metrics server listens on, the
selectors pick the pods, the container's args parse with the real CLI, the pods can run on a
read-only root filesystem with the image's HOME and caches on emptyDirs, secrets come only
from Secrets, and the RBAC stays read-only. deploy/Containerfile is checked statically
here (its release build pulls from registries); tests/test_image.py builds it without them and runs it."""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path, PurePosixPath

import pytest
import yaml
from object_store_support import unique_prefix
from test_follow_support import recorded, scenario

from steptail.storage.db import open_store
from steptail.storage.lake import Lake

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
CONTAINERFILE = DEPLOY / "Containerfile"
STEPTAIL = Path(sys.executable).parent / "steptail"
STEPS = 500  # followed on a read-only root: 10 s at 50 steps/s, time enough to probe it
IMAGE_PLACEHOLDER = "REGISTRY/steptail:VERSION"  # deploy/deployment.yaml's; an overlay sets the real one
KINDS = {"ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Deployment",
         "PodDisruptionBudget", "Service", "PodMonitor"}


# --- the rendered kustomization -------------------------------------------------------------

@pytest.fixture(scope="module")
def rendered() -> str:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is needed on PATH (it renders kustomizations offline)"
    done = subprocess.run([kubectl, "kustomize", str(DEPLOY)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def objects(rendered) -> dict[str, list[dict]]:
    by_kind: dict[str, list[dict]] = {}
    for doc in yaml.safe_load_all(rendered):
        by_kind.setdefault(doc["kind"], []).append(doc)
    return by_kind


def one(objects, kind: str) -> dict:
    assert len(objects[kind]) == 1, kind
    return objects[kind][0]


@pytest.fixture(scope="module")
def pod(objects) -> dict:
    return one(objects, "Deployment")["spec"]["template"]


@pytest.fixture(scope="module")
def container(pod) -> dict:
    (c,) = pod["spec"]["containers"]
    return c


def flag(args: list[str], name: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in args if a.startswith(f"{name}=")]
    return value


def under(path: str, mount: str) -> bool:
    return PurePosixPath(path).is_relative_to(PurePosixPath(mount))


def emptydir_mounts(pod, container) -> list[str]:
    empty = {v["name"] for v in pod["spec"]["volumes"] if "emptyDir" in v}
    return [m["mountPath"] for m in container["volumeMounts"] if m["name"] in empty]


def test_kustomize_renders_every_object_and_no_secret(objects):
    assert set(objects) == KINDS
    assert "Secret" not in objects  # created by hand (docs/deploy.md "Secrets"), never from git


def test_two_replicas_roll_without_a_gap_on_different_nodes(objects, pod):
    spec = one(objects, "Deployment")["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    spread = {c["topologyKey"]: c for c in pod["spec"]["topologySpreadConstraints"]}
    by_node = spread["kubernetes.io/hostname"]
    assert by_node["maxSkew"] == 1 and by_node["whenUnsatisfiable"] == "ScheduleAnyway"
    assert by_node["labelSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    pdb = one(objects, "PodDisruptionBudget")["spec"]
    assert pdb["maxUnavailable"] == 1
    assert pdb["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()


def test_probes_reach_the_metrics_server_on_its_port(container):
    args = container["args"]
    port = int(flag(args, "--metrics-port"))
    assert flag(args, "--metrics-host") == "0.0.0.0"  # the kubelet and Prometheus are not on loopback
    (named,) = [p for p in container["ports"] if p["containerPort"] == port]
    assert named["name"] == "metrics"
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "metrics"}
    assert container["startupProbe"]["httpGet"] == {"path": "/livez", "port": "metrics"}


def test_resources_request_cpu_and_memory_and_limit_memory(container):
    res = container["resources"]
    assert {"cpu", "memory"} <= set(res["requests"])
    assert "memory" in res["limits"] and "cpu" not in res["limits"]  # a CPU limit only throttles


def test_pod_runs_unprivileged(pod, container):
    pod_sc, sc = pod["spec"]["securityContext"], container["securityContext"]
    assert pod_sc["runAsNonRoot"] is True and pod_sc["runAsUser"] == 65532
    assert pod_sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 65532
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert int(image_user().split(":")[0]) == sc["runAsUser"]


def test_every_path_written_is_on_an_emptydir(pod, container):
    """Read-only root filesystem: /tmp is an emptyDir, and the image's HOME, TMPDIR, caches and
    gcloud config lie on it. Parquet goes to the bucket, never into the pod."""
    writable = emptydir_mounts(pod, container)
    assert set(writable) == {"/tmp"}
    env = image_env()
    for name in ("HOME", "TMPDIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "CLOUDSDK_CONFIG", "MPLCONFIGDIR"):
        assert any(under(env[name], m) for m in writable), (name, env[name])
    assert not any(m.get("readOnly") is False for m in container["volumeMounts"])


def test_parquet_goes_to_a_bucket_named_in_the_configmap(objects, container):
    """The lake (docs/lake.md): both replicas commit to Iceberg tables on a bucket, the catalog
    in the store; the placeholder bucket is the overlay's to set."""
    assert flag(container["args"], "--parquet") == "$(STEPTAIL_LAKE)"
    lake = settings(objects, container)["STEPTAIL_LAKE"]
    assert lake.startswith("gs://")
    from steptail.storage.object_store import parse_location

    with pytest.raises(ValueError):  # the placeholder, left unset, stops follow at start
        parse_location(lake)
    assert parse_location(lake.replace("BUCKET", "example-training-telemetry")).scheme == "gs"
    doc = (ROOT / "docs" / "deploy.md").read_text()
    assert "STEPTAIL_LAKE" in doc and "objectCreator" in doc


def test_secrets_come_from_secrets_only(rendered, objects, pod, container):
    env = {e["name"]: e for e in container["env"]}
    assert env["STEPTAIL_DB"]["valueFrom"]["secretKeyRef"] == {"name": "steptail-db", "key": "url"}
    assert not re.search(r"postgres(ql)?(\+\w+)?://|password", rendered, re.I)
    assert not any("value" in e and "://" in e["value"] for e in container["env"])
    # the webhook URLs: a file of the mounted Secret (its key `urls`), passed by path
    path = PurePosixPath(flag(container["args"], "--alert-webhook-file"))
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == str(path.parent)]
    assert mount["readOnly"] is True
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == "steptail-webhooks" and "items" not in volume["secret"]
    assert path.name == "urls"
    # a 0440 file: readable by the pod's fsGroup, which the runtime user is in
    assert volume["secret"]["defaultMode"] == 0o440
    assert pod["spec"]["securityContext"]["fsGroup"] == container["securityContext"]["runAsGroup"]
    assert not any(a.startswith("--alert-webhook=") or a == "--alert-webhook" for a in container["args"])


def settings(objects, container) -> dict[str, str]:
    """The container's env vars set from the generated ConfigMap, with their values."""
    out = {}
    for e in container["env"]:
        ref = e.get("valueFrom", {}).get("configMapKeyRef")
        if ref:
            (config,) = [c for c in objects["ConfigMap"] if c["metadata"]["name"] == ref["name"]]
            out[e["name"]] = config["data"][ref["key"]]
    return out


def test_selector_and_account_are_settings_of_the_generated_configmap(objects, container):
    """Documented defaults (deploy/kustomization.yaml, docs/deploy.md): the `slice` replicated
    job, and no Google account (in a pod kubectl uses the ServiceAccount's token)."""
    assert settings(objects, container) == {"STEPTAIL_SELECTOR": "jobset.sigs.k8s.io/replicatedjob-name=slice",
                                             "CLOUDSDK_CORE_ACCOUNT": "", "STEPTAIL_LAKE": "gs://BUCKET/steptail"}
    assert flag(container["args"], "--selector") == "$(STEPTAIL_SELECTOR)"
    doc = (ROOT / "docs" / "deploy.md").read_text()
    assert "STEPTAIL_SELECTOR" in doc and "jobset.sigs.k8s.io/replicatedjob-name=slice" in doc


def test_namespace_comes_from_the_downward_api(container):
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    for var in re.findall(r"\$\((\w+)\)", " ".join(container["args"])):
        assert var in env, f"$({var}) in args is not a container env var"


def test_rbac_is_exactly_read_pods_their_logs_jobsets_and_workloads(objects, pod):
    assert not {"ClusterRole", "ClusterRoleBinding"} & set(objects)
    (role,) = objects["Role"]
    rules = sorted((tuple(r["apiGroups"]), tuple(r["resources"]), tuple(sorted(r["verbs"])))
                   for r in role["rules"])
    assert rules == [(("",), ("pods",), ("get", "list", "watch")), (("",), ("pods/log",), ("get",)),
                     (("jobset.x-k8s.io",), ("jobsets",), ("get", "list", "watch")),
                     (("kueue.x-k8s.io",), ("workloads",), ("get", "list", "watch"))]
    assert all(set(r) == {"apiGroups", "resources", "verbs"} for r in role["rules"])  # no resourceNames
    (binding,) = objects["RoleBinding"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    (sa,) = objects["ServiceAccount"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"]}]
    assert pod["spec"]["serviceAccountName"] == sa["metadata"]["name"]


def test_service_and_podmonitor_select_the_pods_metrics_port(objects, pod, container):
    labels = pod["metadata"]["labels"]
    deployment = one(objects, "Deployment")
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    port_name = container["ports"][0]["name"]

    svc = one(objects, "Service")["spec"]
    assert svc["type"] == "ClusterIP"
    assert svc["selector"].items() <= labels.items()
    assert svc["ports"] == [{"name": port_name, "port": 9464, "targetPort": port_name, "protocol": "TCP"}]

    monitor = one(objects, "PodMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert monitor["spec"]["podMetricsEndpoints"] == [{"port": port_name, "path": "/metrics", "interval": "30s"}]


def test_container_args_parse_with_the_real_cli(container):
    """Every flag is one `steptail follow` has, each value converts to its type, and the real
    binary accepts the whole line."""
    from steptail.cli import main

    args = container["args"]
    assert args[:2] == ["follow", "--all"]
    command = main.get_command(None, args[0])
    ctx = command.make_context(args[0], list(args[1:]))
    assert ctx.params["follow_all"] is True and ctx.params["no_view"] is True
    assert ctx.params["selector"] == flag(args, "--selector")
    assert ctx.params["metrics_port"] == int(flag(args, "--metrics-port"))
    assert ctx.params["log_format"] == "json"
    done = subprocess.run([str(STEPTAIL), *args, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    for name in {a.split("=", 1)[0] for a in args[1:]}:
        assert re.search(rf"(^|[\s,]){re.escape(name)}\b", done.stdout), name


def test_the_base_leaves_image_and_namespace_to_the_user(objects, container):
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert container["image"] == IMAGE_PLACEHOLDER
    assert "secret.example.yaml" not in kustomization["resources"]
    assert all("namespace" not in d["metadata"] for docs in objects.values() for d in docs)
    assert "namespace" not in kustomization  # left to `-n NS` or an overlay


def test_secret_example_names_what_the_deployment_reads(container):
    docs = list(yaml.safe_load_all((DEPLOY / "secret.example.yaml").read_text()))
    keys = {(d["metadata"]["name"], k) for d in docs for k in d["stringData"]}
    env = {e["name"]: e for e in container["env"]}
    ref = env["STEPTAIL_DB"]["valueFrom"]["secretKeyRef"]
    assert (ref["name"], ref["key"]) in keys and ("steptail-webhooks", "urls") in keys


# --- deploy/Containerfile, statically --------------------------------------------------------

def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out, pending = [], ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.lstrip().startswith("#"):  # a comment inside a continued instruction
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        word, _, rest = (pending + line).strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        pending = ""
    assert not pending, "a continued instruction never ends"
    return out


def stages() -> list[list[tuple[str, str]]]:
    """The instructions of each stage (the global ARGs before the first FROM are stage -1's)."""
    result: list[list[tuple[str, str]]] = [[]]
    for ins in instructions(CONTAINERFILE.read_text()):
        if ins[0] == "FROM":
            result.append([])
        result[-1].append(ins)
    return result


def global_args() -> dict[str, str]:
    return dict(a.split("=", 1) for op, a in stages()[0] if op == "ARG")


def resolved(text: str, args: dict[str, str] | None = None) -> str:
    """`text` with ${ARG} expanded as a build with these --build-args (else the defaults) does;
    an ARG's default may name an earlier one."""
    values = global_args() | (args or {})
    while (expanded := re.sub(r"\$\{(\w+)\}", lambda m: values[m[1]], text)) != text:
        text = expanded
    return text


def named_stages() -> dict[str, list[tuple[str, str]]]:
    """Each stage by its `AS` name."""
    out = {}
    for stage in stages()[1:]:
        words = stage[0][1].split()
        assert len(words) == 3 and words[1].upper() == "AS", f"every stage is named: {stage[0]}"
        out[words[2]] = stage
    return out


def base_of(stage, args: dict[str, str] | None = None) -> str:
    return resolved(stage[0][1].split()[0], args)


def final_stage() -> list[tuple[str, str]]:
    return stages()[-1]


def kubectl_stage(source: str | None = None) -> list[tuple[str, str]]:
    """The stage the final one is built on: where kubectl comes from, for KUBECTL_SOURCE=source
    (None: the default)."""
    return named_stages()[base_of(final_stage(), {"KUBECTL_SOURCE": source} if source else None)]


def image_env() -> dict[str, str]:
    env = {}
    for op, rest in final_stage():
        if op == "ENV":
            env.update(dict(word.split("=", 1) for word in shlex.split(rest)))
    return env


def image_user() -> str:
    (user,) = [rest for op, rest in final_stage() if op == "USER"][-1:]
    return user


def runs(stage) -> str:
    return "\n".join(rest for op, rest in stage if op == "RUN")


def test_the_default_build_is_slim_python_in_two_stages():
    """By default (the release image) every stage starts from slim Python or from a stage before
    it; the build stage comes first, and the image is built on the apt stage."""
    named = named_stages()
    assert list(named)[0] == "build" and len(named) >= 2
    for i, (name, stage) in enumerate(named.items()):
        base = base_of(stage)
        assert base in list(named)[:i] or re.fullmatch(r"python:3\.1[1-9]-slim(-\w+)?", base), (name, base)
    assert global_args()["KUBECTL_SOURCE"] == "apt" and kubectl_stage() == named["kubectl-apt"]


def test_the_compiler_stays_in_the_build_stage():
    build = named_stages()["build"]
    assert re.search(r"apt-get install [^&]*\bgcc\b", runs(build))
    assert "pip install" in runs(build) and "import steptail.parsers._steady" in runs(build)
    for name, stage in named_stages().items():
        if name != "build":
            assert not re.search(r"\b(gcc|g\+\+|clang|build-essential|pip install)\b", runs(stage)), name
    assert any(op == "COPY" and rest.startswith("--from=build ") for op, rest in final_stage())


def test_kubectl_and_the_gke_auth_plugin_come_from_googles_signed_repository():
    script = runs(kubectl_stage())
    repo = re.search(r"deb \[signed-by=(\S+)\] https://packages\.cloud\.google\.com/apt cloud-sdk main", script)
    assert repo, "the cloud-sdk apt repository, with its keyring"
    assert re.search(rf"gpg --dearmor -o {re.escape(repo[1])}\b", script)
    assert "https://packages.cloud.google.com/apt/doc/apt-key.gpg" in script
    install = re.findall(r"apt-get install ([^&]+)", script)
    packages = {w for line in install for w in line.split() if not w.startswith("-")}
    assert {"kubectl", "google-cloud-cli-gke-gcloud-auth-plugin", "tini"} <= packages
    assert not re.search(r"\|\s*(sudo\s+)?(ba|z|da)?sh\b", CONTAINERFILE.read_text())  # no curl | sh
    assert "apt-key add" not in script
    assert image_env()["USE_GKE_GCLOUD_AUTH_PLUGIN"] == "True"


def test_kubectl_source_context_copies_both_binaries_from_the_named_context():
    """KUBECTL_SOURCE=context (deploy/build-image.sh, CI): the binaries of the build context
    `kubectl`, nothing from Google's repository; both run in the final stage either way."""
    stage = kubectl_stage("context")
    assert stage != kubectl_stage("apt")
    copies = [rest.split() for op, rest in stage if op == "COPY"]
    assert ["--from=kubectl", "kubectl", "gke-gcloud-auth-plugin", "/usr/local/bin/"] in copies
    assert "packages.cloud.google.com" not in runs(stage)
    assert re.search(r"kubectl version --client\b.*\bgke-gcloud-auth-plugin --version", runs(final_stage()), re.S)


def test_the_image_runs_as_a_numeric_non_root_user_on_a_read_only_root():
    user, _, group = image_user().partition(":")
    assert user.isdigit() and int(user) != 0 and group.isdigit() and int(group) != 0
    env = image_env()
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert under(env["HOME"], "/tmp")
    assert "/opt/steptail/bin" in env["PATH"].split(":")


def test_the_entrypoint_is_steptail():
    (entry,) = [rest for op, rest in final_stage() if op == "ENTRYPOINT"]
    argv = json.loads(entry)  # exec form: signals reach the process, no shell in between
    assert argv[-1] == "steptail"
    assert not {"sh", "/bin/sh", "bash", "-c"} & set(argv)


def test_the_build_context_leaves_local_state_out():
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".git", ".venv", "**/*.so", "**/__pycache__"} <= ignored
    for needed in ("pyproject.toml", "README.md", "LICENSE", "parsers", "steptail"):
        assert needed not in ignored and (ROOT / needed).exists()


def test_the_documented_overlay_sets_namespace_image_and_selector(tmp_path):
    """The overlay docs/deploy.md shows (a heredoc in its console example), rendered against a
    copy of deploy/ beside it."""
    doc = (ROOT / "docs" / "deploy.md").read_text()
    match = re.search(r"cat > (\S+)/kustomization\.yaml <<'EOF'\n(.*?)^> EOF$", doc, re.S | re.M)
    assert match, "docs/deploy.md: the overlay's kustomization.yaml"
    body = "".join(line[2:] + "\n" for line in match[2].splitlines())  # the "> " prompts dropped
    overlay = tmp_path / match[1]
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(body)
    shutil.copytree(DEPLOY, tmp_path / "deploy")
    done = subprocess.run([shutil.which("kubectl"), "kustomize", str(overlay)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    docs = list(yaml.safe_load_all(done.stdout))
    assert {d["kind"] for d in docs} == KINDS
    namespace = yaml.safe_load(body)["namespace"]
    assert {d["metadata"].get("namespace") for d in docs} == {namespace}
    by_kind = {d["kind"]: d for d in docs}
    (binding_subject,) = by_kind["RoleBinding"]["subjects"]
    assert binding_subject.get("namespace", namespace) == namespace
    (c,) = by_kind["Deployment"]["spec"]["template"]["spec"]["containers"]
    (image,) = yaml.safe_load(body)["images"]
    assert c["image"] == f"{image['newName']}:{image['newTag']}" != IMAGE_PLACEHOLDER
    ref = {e["name"]: e for e in c["env"]}["CLOUDSDK_CORE_ACCOUNT"]["valueFrom"]["configMapKeyRef"]
    assert by_kind["ConfigMap"]["metadata"]["name"] == ref["name"]
    assert by_kind["ConfigMap"]["data"] == {"STEPTAIL_SELECTOR": "jobset.sigs.k8s.io/replicatedjob-name=train",
                                            "CLOUDSDK_CORE_ACCOUNT": "",
                                            "STEPTAIL_LAKE": "gs://example-training-telemetry/steptail"}


def test_the_documented_secret_command_makes_the_key_the_pod_reads(container):
    """docs/deploy.md "Secrets": the URL through stdin becomes the Secret key STEPTAIL_DB comes from,
    byte for byte (no trailing newline in the URL). Offline: --dry-run=client."""
    ref = {e["name"]: e for e in container["env"]}["STEPTAIL_DB"]["valueFrom"]["secretKeyRef"]
    url = "postgresql://steptail:s3cret@db.example:5432/steptail"
    done = subprocess.run(
        [shutil.which("kubectl"), "create", "secret", "generic", ref["name"], "--from-file=url=/dev/stdin",
         "--dry-run=client", "-o", "json"],
        input=url, capture_output=True, text=True, timeout=60, env={"KUBECONFIG": "/dev/null", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    secret = json.loads(done.stdout)
    assert secret["metadata"]["name"] == ref["name"]
    assert base64.b64decode(secret["data"][ref["key"]]).decode() == url
    assert "--from-file=url=/dev/stdin" in (ROOT / "docs" / "deploy.md").read_text()


# --- the container's args and the image's environment, on a read-only root ------------------

def test_follow_runs_on_a_read_only_root_with_the_images_environment(make_simcluster, moto_s3, tmp_path, objects,
                                                                      container):
    """The Deployment's args and the Containerfile's ENV (with /tmp mapped to a writable
    directory, and one more for the test's SQLite store, everything else read-only) follow a
    simulated JobSet to its end into a lake on the S3 emulator: kubectl, its auth plugin and
    steptail write nowhere else, and the probes' paths answer on the metrics port while it runs."""
    unshare = shutil.which("unshare")
    if os.geteuid() != 0 or not unshare or not shutil.which("mount"):
        pytest.skip("needs root, unshare and mount for a private read-only mount namespace")
    sim = make_simcluster(scenario(rate=50, jobsets=[
        {"name": "olmo3-sft", "hosts": 2, "trainer": {"steps": STEPS, "checkpoint_period": 100}}]))
    scratch, data = tmp_path / "tmp", tmp_path / "data"
    scratch.mkdir()
    data.mkdir()
    webhooks = tmp_path / "webhook-urls"
    webhooks.write_text("# none\n")

    def mapped(value: str) -> str:
        for inside, outside in (("/tmp", scratch), ("/data", data)):
            if value == inside or value.startswith(inside + "/"):
                return str(outside) + value[len(inside):]
        return value

    env = {k: mapped(v) for k, v in image_env().items() if k != "PATH"}
    env |= {"PATH": f"{STEPTAIL.parent}:/usr/local/bin:/usr/bin:/bin", "POD_NAMESPACE": "default",
            "CLOUDSDK_CORE_ACCOUNT": sim.account, "STEPTAIL_DB": str(data / "steptail.db")}
    port = free_port()
    env |= moto_s3.env  # the bucket's endpoint and keys, as the SDK reads them
    lake = moto_s3.url(unique_prefix("deploy"))
    defined = {"POD_NAMESPACE": "default", **settings(objects, container), "STEPTAIL_LAKE": lake}

    def expand(value: str) -> str:  # $(VAR) as the kubelet expands it from the container's env
        return re.sub(r"\$\((\w+)\)", lambda m: defined[m[1]], value)

    args = []
    for arg in container["args"]:
        name, _, value = arg.partition("=")
        value = {"--metrics-port": str(port), "--metrics-host": "127.0.0.1",  # tests bind loopback
                 "--alert-webhook-file": str(webhooks)}.get(name, mapped(expand(value)))
        args.append(f"{name}={value}" if value else name)
    args += [f"--kubeconfig={sim.kubeconfig_path}", "--until-done", "--silence=1"]

    probes = [str(ROOT), str(STEPTAIL.parent), str(tmp_path), "/"]
    proc = subprocess.Popen(
        [unshare, "-m", sys.executable, str(ROOT / "tests" / "readonly_root.py"),
         "--writable", str(scratch), "--writable", str(data), *[f"--probe={p}" for p in probes],
         "--", str(STEPTAIL), *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        probed = {path: wait_for_200(proc, f"http://127.0.0.1:{port}{path}")
                  for path in (container["readinessProbe"]["httpGet"]["path"],
                               container["livenessProbe"]["httpGet"]["path"])}
        out, err = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    if proc.returncode == 97:
        pytest.skip("this machine cannot make its mounts read-only in a private namespace")
    assert proc.returncode == 0, err[-3000:]
    assert all(probed.values()), (probed, err[-3000:])
    assert "read-only file system" not in err.lower()
    steps = recorded(str(data / "steptail.db"), "olmo3-sft")
    assert sorted(s for _, s in steps) == list(range(1, STEPS + 1))
    store = open_store(str(data / "steptail.db"))
    try:
        table = Lake(lake, store.catalog_url(), env=moto_s3.env).read("loss_parts", "olmo3-sft")
    finally:
        store.dispose()
    assert sorted(table["step"].to_pylist()) == list(range(1, STEPS + 1))
    assert (scratch / ".kube" / "cache").is_dir()  # kubectl's cache went to the image's HOME


def wait_for_200(proc: subprocess.Popen, url: str) -> bool:
    """Whether `url` answered 200 before the process ended (a 503 or no answer yet: retry)."""
    while proc.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return True
        except OSError:
            time.sleep(0.1)
    return False


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
