"""The simulated cluster's JobSets carry what the runbook's rules read (queue label, trainer
image, topology, MaxText arguments, gcsfuse volumes, spec.suspend), each JobSet has its Kueue
Workload, and the runbook's faults (another image, suspend, a failed JobSet) happen — all seen
through the real kubectl, `steptail lint` and the kubernetes Python client."""

from __future__ import annotations

import calendar
import hashlib
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config, watch

from steptail.commands.lint import default_policy_text
from steptail.runs.runbook import evaluate, load_policy
from steptail.simcluster.cluster import SimCluster
from steptail.simcluster.scenario import DEFAULT_IMAGE, Scenario

pytestmark = pytest.mark.timeout(90)

STEPTAIL = str(Path(sys.executable).with_name("steptail"))
# The simulated slices run 1-4 pods on a "4x4x8" (32 hosts): lint's host-count check is off here.
SIM_POLICY = Path(__file__).resolve().parent / "manifests" / "sim-policy.yaml"
POLICY = load_policy([("runbook.yaml", default_policy_text()), ("sim-policy.yaml", SIM_POLICY.read_text())])
KUEUE = ("kueue.x-k8s.io", "v1beta1")
JOBSET = ("jobset.x-k8s.io", "v1alpha2")
OTHER_IMAGE = "us-docker.pkg.dev/steptail-sim/maxtext/maxtext-posttrain:0e1d2c3b"
P0 = "jobset.sigs.k8s.io/job-index=0,batch.kubernetes.io/job-completion-index=0"


def kubectl(sim: SimCluster, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = sim.env()
    env["HOME"] = str(sim.state_dir)  # kubectl's discovery cache: this simulator's own
    r = subprocess.run(["kubectl", *args], env=env, capture_output=True, text=True, timeout=30)
    if check:
        assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r


def kjson(sim: SimCluster, *args: str) -> dict:
    return json.loads(kubectl(sim, *args, "-o", "json").stdout)


def lint(*files: Path) -> tuple[int, dict]:
    r = subprocess.run([STEPTAIL, "lint", *map(str, files), "--policy", str(SIM_POLICY), "-o", "json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode in (0, 1), (r.returncode, r.stdout, r.stderr)
    return r.returncode, json.loads(r.stdout)


def rules_of(report: dict) -> dict[str, set[str]]:
    return {j["jobset"]: {f["rule"] for f in j["findings"]} for j in report["jobsets"]}


def process0(sim: SimCluster, jobset: str) -> dict:
    items = kjson(sim, "get", "pods", "-l", f"jobset.sigs.k8s.io/jobset-name={jobset},{P0}")["items"]
    live = [p for p in items if not p["metadata"].get("deletionTimestamp")]
    assert len(live) == 1, [p["metadata"]["name"] for p in items]
    return live[0]


def wait(pred, timeout: float = 20.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.05)
    raise TimeoutError(f"{what} not reached within {timeout}s")


def kueue_name(jobset: str, uid: str) -> str:
    """Kueue's jobframework.GetWorkloadNameForOwnerWithGVK, written out independently."""
    h = hashlib.sha1(f"JobSet\njobset.x-k8s.io\n{jobset}\n{uid}".encode()).hexdigest()
    return f"jobset-{jobset}-{h[:5]}"


def condition(obj: dict, typ: str) -> dict | None:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == typ), None)


def api(sim: SimCluster) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(config.new_client_from_config(config_file=str(sim.kubeconfig_path)))


@pytest.fixture
def account(monkeypatch, request):
    """The kubernetes client runs the exec plugin with this process's environment."""
    def set_for(sim: SimCluster) -> SimCluster:
        monkeypatch.setenv("CLOUDSDK_CORE_ACCOUNT", sim.account)
        return sim
    return set_for


# -- the JobSet as written: every rule kept by default, each broken by one scenario key -------


def test_a_default_jobset_keeps_every_rule_and_its_pods_carry_its_template(make_simcluster, tmp_path):
    sim = make_simcluster({"rate": 20, "jobsets": [{"name": "olmo3-sft", "hosts": 2,
                                                    "trainer": {"steps": 200}}]})
    sim.wait_step(2)
    out = tmp_path / "olmo3-sft.yaml"
    out.write_text(kubectl(sim, "get", "jobset", "olmo3-sft", "-o", "yaml").stdout)
    every = tmp_path / "all.yaml"
    every.write_text(kubectl(sim, "get", "jobsets", "-o", "yaml").stdout)  # a `kind: List`
    code, report = lint(out, every)
    assert code == 0 and report["findings"] == 0, report

    js = yaml.safe_load(out.read_text())
    assert js["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "post-training"}
    assert js["spec"]["suspend"] is False
    rjob = js["spec"]["replicatedJobs"][0]
    assert (rjob["replicas"], rjob["template"]["spec"]["parallelism"]) == (1, 2)
    tmpl = rjob["template"]["spec"]["template"]["spec"]
    c = tmpl["containers"][0]
    assert c["name"] == "jax-tpu" and c["image"] == DEFAULT_IMAGE
    assert DEFAULT_IMAGE.endswith("/maxtext-posttrain:51f8cc4b-p907d86f3-rfb46e215e")
    assert {"ici_context_parallelism=1", "context_parallel_load_balance=False", "run_name=olmo3-sft",
            "steps=200"} <= set(c["args"])
    assert c["resources"] == {"limits": {"google.com/tpu": "4"}}
    assert tmpl["nodeSelector"] == {"cloud.google.com/gke-tpu-topology": "4x4x8",
                                    "cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice"}
    mounts = {v["name"]: v["csi"] for v in tmpl["volumes"]}
    assert {n: (m["driver"], m["readOnly"], m["volumeAttributes"]["bucketName"],
                m["volumeAttributes"]["mountOptions"]) for n, m in mounts.items()} == {
        "data": ("gcsfuse.csi.storage.gke.io", True, "post-training", "implicit-dirs,only-dir=post-training/data"),
        "tokenizers": ("gcsfuse.csi.storage.gke.io", True, "post-training",
                       "implicit-dirs,only-dir=post-training/tokenizers")}
    assert js["status"]["conditions"] == [{**js["status"]["conditions"][0], "type": "Suspended", "status": "False",
                                           "reason": "ResumeJobs"}]
    assert "terminalState" not in js["status"]

    # a live pod: the template's container, node selector and volumes, and the image's digest
    p0 = process0(sim, "olmo3-sft")
    pc = p0["spec"]["containers"][0]
    assert (pc["image"], pc["args"], pc["command"]) == (c["image"], c["args"], c["command"])
    assert p0["spec"]["nodeSelector"] == tmpl["nodeSelector"] and p0["spec"]["volumes"] == tmpl["volumes"]
    cs = p0["status"]["containerStatuses"][0]
    assert cs["image"] == DEFAULT_IMAGE
    assert re.fullmatch(r"us-docker\.pkg\.dev/steptail-sim/maxtext/maxtext-posttrain@sha256:[0-9a-f]{64}",
                        cs["imageID"]), cs["imageID"]
    assert evaluate(POLICY, js, pods=[p0]) == []


BROKEN = [  # (JobSet keys, the rules lint flags)
    ({"name": "hero", "queue": "hero"}, {"queue"}),
    ({"name": "no-queue", "queue": ""}, {"queue"}),
    ({"name": "old-image", "image": OTHER_IMAGE}, {"restore_fix_image"}),
    ({"name": "borrowed", "topology": "8x8x16"}, {"borrowed_topology"}),
    ({"name": "tiny", "topology": "2x2x1"}, {"slice_topology"}),
    ({"name": "cp4-lb", "trainer": {"context_parallelism": 4, "load_balance": True}}, {"load_balance"}),
    ({"name": "cp4-args", "trainer": {"context_parallelism": 4},
      "args": {"context_parallel_load_balance": True}}, {"load_balance"}),
    ({"name": "wide-mount", "volumes": [{"name": "post-training", "bucket": "post-training",
                                         "only_dir": "post-training", "mount_path": "/gcs"}]},
     {"checkpoint_mount"}),
    ({"name": "whole-bucket", "volumes": [{"name": "bucket", "bucket": "post-training"}]}, {"checkpoint_mount"}),
    ({"name": "suspended", "suspend": True}, {"suspend"}),
    ({"name": "cp4-kept", "trainer": {"context_parallelism": 4, "load_balance": False}}, set()),
]


def test_jobsets_built_to_break_each_rule_are_flagged_by_lint_and_on_their_live_pods(make_simcluster, tmp_path):
    sim = make_simcluster({"rate": 5, "jobsets": [{**keys, "hosts": 1, "trainer": {"steps": 100, **keys.get("trainer", {})}}
                                                  for keys, _ in BROKEN]})
    files = []
    for keys, _ in BROKEN:
        f = tmp_path / f"{keys['name']}.yaml"
        f.write_text(kubectl(sim, "get", "jobset", keys["name"], "-o", "yaml").stdout)
        files.append(f)
    code, report = lint(*files)
    assert code == 1
    assert rules_of(report) == {keys["name"]: rules for keys, rules in BROKEN}

    # the live process-0 pods carry the same: pod-scope rules flag them too
    for keys, rules in BROKEN:
        js = yaml.safe_load((tmp_path / f"{keys['name']}.yaml").read_text())
        sim.wait_step(1, jobset=keys["name"])
        found = evaluate(POLICY, js, pods=[process0(sim, keys["name"])])
        assert {f.rule for f in found} == rules, keys["name"]
        live = {f.rule for f in found if f.path.startswith("pods/")}
        assert live == rules & {"restore_fix_image", "slice_topology", "borrowed_topology", "load_balance",
                                "checkpoint_mount"}, keys["name"]

    # the cp4 trainer's log says what its arguments say
    p0 = process0(sim, "cp4-lb")["metadata"]["name"]
    log = kubectl(sim, "logs", p0).stdout
    assert "Config param ici_context_parallelism: 4" in log and "Config param context_parallel_load_balance: True" in log


def test_scenario_keys_are_type_checked_at_load():
    for bad, msg in [({"queue": 3}, "`queue` must be a string"),
                     ({"image": ""}, "`image` must not be empty"),
                     ({"suspend": "yes"}, "`suspend` must be true or false"),
                     ({"start_after": "30"}, "`start_after` must be a number"),
                     ({"queued_seconds": -1}, "must not be negative"),
                     ({"args": "a=b"}, "`args` must be a list"),
                     ({"volumes": [{"name": "x"}]}, "needs `bucket`"),
                     ({"volumes": [{"name": "x", "bucket": "b", "onlydir": "y"}]}, "unknown keys"),
                     ({"volumes": [{"name": "x", "bucket": "b", "read_only": "no"}]}, "`read_only`"),
                     ({"trainer": {"load_balance": "true"}}, "`load_balance` must be true or false")]:
        with pytest.raises(ValueError, match=re.escape(msg)):
            Scenario.from_dict({"jobsets": [bad]})
    sc = Scenario.from_dict({"jobsets": [{"args": ["a=1"], "volumes": [{"name": "d", "bucket": "b",
                                                                     "mount_options": "implicit-dirs,ro"}]}]})
    js = sc.jobsets[0]
    assert js.args == ["a=1"] and js.volumes[0]["mount_options"] == ["implicit-dirs", "ro"]
    assert (js.queue, js.topology, js.accelerator, js.suspend, js.start_after) == (
        "post-training", "4x4x8", "tpu-v5p-slice", False, 0.0)


# -- Kueue Workloads ----------------------------------------------------------------------------


def test_one_admitted_workload_per_jobset_through_kubectl(make_simcluster):
    sim = make_simcluster({"rate": 20, "jobsets": [
        {"name": "olmo3-sft", "hosts": 2, "trainer": {"steps": 300}},
        {"name": "qwen3-cp4", "hosts": 2, "queue": "hero", "trainer": {"steps": 300}},
        {"name": "unqueued", "hosts": 1, "queue": "", "trainer": {"steps": 300}}]})
    sim.wait_step(1, jobset="qwen3-cp4")
    table = kubectl(sim, "get", "workloads").stdout.splitlines()
    assert table[0].split() == ["NAME", "QUEUE", "RESERVED", "IN", "ADMITTED", "FINISHED", "AGE"]
    uids = {o["metadata"]["name"]: o["metadata"]["uid"] for o in kjson(sim, "get", "jobsets")["items"]}
    names = {j: kueue_name(j, uids[j]) for j in ("olmo3-sft", "qwen3-cp4")}
    rows = {line.split()[0]: line.split()[1:] for line in table[1:]}  # FINISHED empty: AGE follows ADMITTED
    assert {n: r[:3] for n, r in rows.items()} == {names["olmo3-sft"]: ["post-training", "post-training-cq", "True"],
                                                   names["qwen3-cp4"]: ["hero", "hero-cq", "True"]}
    assert all(len(r) == 4 and re.fullmatch(r"\d+s", r[3]) for r in rows.values())

    wls = yaml.safe_load(kubectl(sim, "get", "workloads.kueue.x-k8s.io", "-o", "yaml").stdout)
    assert wls["kind"] == "List" and len(wls["items"]) == 2  # none for the JobSet without a queue label
    for wl in wls["items"]:
        js = wl["metadata"]["ownerReferences"][0]["name"]
        assert wl["apiVersion"] == "kueue.x-k8s.io/v1beta1" and wl["kind"] == "Workload"
        assert wl["metadata"]["name"] == names[js]
        assert wl["metadata"]["ownerReferences"] == [{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                                                      "name": js, "uid": uids[js], "controller": True,
                                                      "blockOwnerDeletion": True}]
        assert wl["metadata"]["labels"] == {"kueue.x-k8s.io/job-uid": uids[js]}
        assert wl["spec"]["active"] is True
        assert wl["spec"]["queueName"] == {"olmo3-sft": "post-training", "qwen3-cp4": "hero"}[js]
        ps = wl["spec"]["podSets"]
        assert [(p["name"], p["count"]) for p in ps] == [("slice", 2)]
        assert ps[0]["template"]["spec"]["containers"][0]["image"] == DEFAULT_IMAGE
        assert {c["type"]: (c["status"], c["reason"]) for c in wl["status"]["conditions"]} == {
            "QuotaReserved": ("True", "QuotaReserved"), "Admitted": ("True", "Admitted")}
        assert wl["status"]["admission"]["clusterQueue"] == f"{wl['spec']['queueName']}-cq"
        assert wl["status"]["admission"]["podSetAssignments"][0]["resourceUsage"] == {"google.com/tpu": "8"}

    one = kjson(sim, "get", "workload", names["qwen3-cp4"])
    assert one["metadata"]["name"] == names["qwen3-cp4"]
    r = kubectl(sim, "get", "workload", "jobset-nope-00000", check=False)
    assert r.returncode == 1 and 'workloads.kueue.x-k8s.io "jobset-nope-00000" not found' in r.stderr
    assert kubectl(sim, "get", "wl", "-l", f"kueue.x-k8s.io/job-uid={uids['olmo3-sft']}",
                   "-o", "name").stdout.split() == [f"workload.kueue.x-k8s.io/{names['olmo3-sft']}"]


def test_python_client_lists_and_watches_workloads_and_jobsets(make_simcluster, account):
    sim = account(make_simcluster({"rate": 40, "bookmark_seconds": 0.3, "jobsets": [
        {"name": "short", "hosts": 1, "trainer": {"steps": 120}},
        {"name": "long", "hosts": 1, "trainer": {"steps": 3000}}]}))
    co = api(sim)
    wls = co.list_namespaced_custom_object(*KUEUE, "default", "workloads")
    assert wls["kind"] == "WorkloadList" and wls["apiVersion"] == "kueue.x-k8s.io/v1beta1"
    assert sorted(o["metadata"]["ownerReferences"][0]["name"] for o in wls["items"]) == ["long", "short"]
    page = co.list_cluster_custom_object(*KUEUE, "workloads", limit=1)
    assert len(page["items"]) == 1 and page["metadata"]["continue"]
    rest = co.list_cluster_custom_object(*KUEUE, "workloads", limit=1, _continue=page["metadata"]["continue"])
    assert len(rest["items"]) == 1 and "continue" not in rest["metadata"]
    uid = next(o["metadata"]["uid"] for o in co.list_namespaced_custom_object(*JOBSET, "default", "jobsets")["items"]
               if o["metadata"]["name"] == "short")
    sel = co.list_namespaced_custom_object(*KUEUE, "default", "workloads", label_selector=f"kueue.x-k8s.io/job-uid={uid}")
    assert [o["metadata"]["name"] for o in sel["items"]] == [kueue_name("short", uid)]
    got = co.get_namespaced_custom_object(*KUEUE, "default", "workloads", kueue_name("short", uid))
    assert got["spec"]["queueName"] == "post-training"
    with pytest.raises(client.ApiException) as e:
        co.get_namespaced_custom_object(*KUEUE, "default", "workloads", "jobset-gone-12345")
    assert e.value.status == 404 and json.loads(e.value.body)["details"]["group"] == "kueue.x-k8s.io"

    # a watch from the list's resourceVersion: the short run's Workload Finished, and bookmarks
    events = []
    for ev in watch.Watch().stream(co.list_namespaced_custom_object, *KUEUE, "default", "workloads",
                                   resource_version=wls["metadata"]["resourceVersion"],
                                   allow_watch_bookmarks=True, timeout_seconds=6):
        events.append((ev["type"], ev["object"]))
        if ev["type"] == "MODIFIED" and condition(ev["object"], "Finished"):
            break
    fin = events[-1][1]
    assert events[-1][0] == "MODIFIED" and fin["metadata"]["name"] == kueue_name("short", uid)
    assert condition(fin, "Finished")["reason"] == "Succeeded"
    assert condition(fin, "Finished")["message"] == "jobset completed successfully"
    assert condition(fin, "Admitted")["status"] == "True"
    marks = [o for t, o in events if t == "BOOKMARK"]
    assert marks and all(set(o["metadata"]) == {"resourceVersion"} and o["kind"] == "Workload" for o in marks)

    # JobSets: a watch from 0 gets both ADDED, then the short one Completed
    seen = {}
    for ev in watch.Watch().stream(co.list_namespaced_custom_object, *JOBSET, "default", "jobsets",
                                   timeout_seconds=5):
        o = ev["object"]
        seen.setdefault(o["metadata"]["name"], []).append((ev["type"], o["status"].get("terminalState")))
        if o["status"].get("terminalState") == "Completed":
            break
    assert seen["short"][-1] == ("ADDED", "Completed") or seen["short"][-1] == ("MODIFIED", "Completed")
    assert seen["long"] == [("ADDED", None)]
    done = co.get_namespaced_custom_object(*JOBSET, "default", "jobsets", "short")
    assert condition(done, "Completed")["reason"] == "AllJobsCompleted"
    assert done["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["args"]


# -- the runbook's faults -----------------------------------------------------------------------


def test_set_image_gives_the_restarted_process0_the_new_image(make_simcluster, tmp_path):
    sim = make_simcluster({"rate": 20, "grace_seconds": 15, "restart_pending_seconds": 0.3, "jobsets": [
        {"name": "olmo3-sft", "hosts": 2, "trainer": {"steps": 400, "checkpoint_period": 10}}],
        "faults": [{"at_step": 12, "action": "set_image", "image": OTHER_IMAGE},
                   {"at_step": 14, "action": "restart_container"}]})
    sim.wait_step(13)
    js = kjson(sim, "get", "jobset", "olmo3-sft")
    assert js["metadata"]["generation"] == 2
    assert js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["image"] == OTHER_IMAGE
    old = process0(sim, "olmo3-sft")
    assert old["spec"]["containers"][0]["image"] == DEFAULT_IMAGE  # a pod keeps the image it was created with
    old_id = old["status"]["containerStatuses"][0]["imageID"]

    sim.wait_step(16)  # restarted in place: the same pod, the same image
    same = process0(sim, "olmo3-sft")
    assert same["metadata"]["name"] == old["metadata"]["name"]
    assert same["status"]["containerStatuses"][0]["restartCount"] == 1
    assert (same["spec"]["containers"][0]["image"], same["status"]["containerStatuses"][0]["imageID"]) == (
        DEFAULT_IMAGE, old_id)

    # the JobSet restart once the pod above was read (as an at_step fault 0.3 s of steps later,
    # a loaded machine's kubectl read the new pod as `same`)
    with sim.lock:
        reached = sim.state.jobset("olmo3-sft").last_step
    sim.restart_jobset("olmo3-sft")
    sim.wait_step(reached + 1, incarnation=3)  # the JobSet restart: new pods from the new template
    new = process0(sim, "olmo3-sft")
    assert new["metadata"]["name"] != old["metadata"]["name"]
    assert new["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"] == "1"
    cs = new["status"]["containerStatuses"][0]
    assert new["spec"]["containers"][0]["image"] == cs["image"] == OTHER_IMAGE
    assert cs["imageID"].startswith("us-docker.pkg.dev/steptail-sim/maxtext/maxtext-posttrain@sha256:")
    assert cs["imageID"] != old_id
    # the replaced pod, terminating, still shows its own image
    gone = kjson(sim, "get", "pod", old["metadata"]["name"])
    assert gone["metadata"].get("deletionTimestamp") and gone["spec"]["containers"][0]["image"] == DEFAULT_IMAGE
    # the rule: flagged on the JobSet's template and on the live process 0
    found = evaluate(POLICY, js, pods=[new])
    assert {(f.rule, f.path.split(".")[0]) for f in found} == {
        ("restore_fix_image", "spec"), ("restore_fix_image", f"pods/{new['metadata']['name']}")}
    # the Workload keeps the podSets it was admitted with
    wl = kjson(sim, "get", "workloads")["items"][0]
    assert wl["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["image"] == DEFAULT_IMAGE


def test_fail_jobset_fails_every_pod_logs_stay_readable_then_everything_is_deleted(make_simcluster, account):
    reap = 3.0
    sim = account(make_simcluster({"rate": 20, "jobsets": [
        {"name": "doomed", "hosts": 2, "trainer": {"steps": 400}},
        {"name": "other", "hosts": 1, "trainer": {"steps": 400}}],
        "faults": [{"at_step": 10, "action": "fail_jobset", "jobset": "doomed", "reap_after": reap}]}))
    co = api(sim)
    rv = co.list_namespaced_custom_object(*KUEUE, "default", "workloads")["metadata"]["resourceVersion"]
    pods = sim.pod_names("doomed")
    p0 = sim.process0("doomed")

    def failed():
        js = kjson(sim, "get", "jobset", "doomed")
        return js if js["status"].get("terminalState") == "Failed" else None

    js = wait(failed, what="terminalState Failed")
    t_failed = time.monotonic()
    assert condition(js, "Failed")["status"] == "True" and condition(js, "Failed")["reason"] == "FailedJobs"
    assert js["status"]["replicatedJobsStatus"][0]["failed"] == 1
    items = kjson(sim, "get", "pods", "-l", "jobset.sigs.k8s.io/jobset-name=doomed")["items"]
    assert sorted(p["metadata"]["name"] for p in items) == sorted(pods)
    for p in items:
        term = p["status"]["containerStatuses"][0]["state"]["terminated"]
        assert p["status"]["phase"] == "Failed" and term["exitCode"] == 1 and term["reason"] == "Error"
    log = kubectl(sim, "logs", p0).stdout  # a Failed pod's log is served
    steps = [int(m) for m in re.findall(r"LOSS-PARTS step=(\d+)", log)]
    assert steps and max(steps) == 10
    wl = kjson(sim, "get", "workloads", "-l", f"kueue.x-k8s.io/job-uid={js['metadata']['uid']}")["items"][0]
    assert (condition(wl, "Finished")["reason"], condition(wl, "Admitted")["status"]) == ("Failed", "True")
    assert sim.last_step("doomed") == 10  # the trainer wrote nothing after the failure

    # reaped: the JobSet, its Workload and its pods DELETED, 404 after; the other JobSet untouched
    deleted = {}
    for ev in watch.Watch().stream(co.list_namespaced_custom_object, *KUEUE, "default", "workloads",
                                   resource_version=rv, timeout_seconds=int(reap) + 5):
        if ev["type"] == "DELETED":
            deleted["workload"] = (time.monotonic(), ev["object"])
            break
    assert deleted, "no DELETED workload event"
    assert deleted["workload"][0] - t_failed >= reap - 1.0
    assert deleted["workload"][1]["metadata"]["ownerReferences"][0]["name"] == "doomed"
    assert kubectl(sim, "get", "jobset", "doomed", check=False).returncode == 1
    r = kubectl(sim, "logs", p0, check=False)
    assert r.returncode == 1 and "not found" in r.stderr
    assert kjson(sim, "get", "pods", "-l", "jobset.sigs.k8s.io/jobset-name=doomed")["items"] == []
    assert [o["metadata"]["ownerReferences"][0]["name"] for o in kjson(sim, "get", "workloads")["items"]] == ["other"]
    with sim.lock:  # every watch saw the deletions
        gone = {(k, o["metadata"]["name"]) for _, k, t, o in sim.state.events if t == "DELETED"}
    assert {("jobsets", "doomed"), ("workloads", deleted["workload"][1]["metadata"]["name"])} <= gone
    assert {("pods", p) for p in pods} <= gone
    assert sim.truth("doomed")[-1].step == 10  # its ground truth stays readable
    assert sim.jobset_state("other").state == "running"
    assert [f.error for f in sim.truth.faults()] == [None]


def test_suspend_leaves_the_pods_running_and_the_workload_admitted(make_simcluster, tmp_path):
    sim = make_simcluster({"rate": 20, "jobsets": [{"name": "olmo3-sft", "hosts": 2, "trainer": {"steps": 400}}],
                           "faults": [{"at_step": 5, "action": "suspend"}]})
    sim.wait_step(15)
    js = kjson(sim, "get", "jobset", "olmo3-sft")
    assert js["spec"]["suspend"] is True and js["metadata"]["generation"] == 2
    assert js["status"]["replicatedJobsStatus"][0]["suspended"] == 0
    pods = kjson(sim, "get", "pods")["items"]
    assert len(pods) == 2 and {p["status"]["phase"] for p in pods} == {"Running"}
    assert {p["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"] for p in pods} == {"0"}
    wl = kjson(sim, "get", "workloads")["items"][0]
    assert wl["spec"]["active"] is True and condition(wl, "Admitted")["status"] == "True"
    assert condition(wl, "Finished") is None
    f = tmp_path / "js.yaml"
    f.write_text(kubectl(sim, "get", "jobset", "olmo3-sft", "-o", "yaml").stdout)
    assert rules_of(lint(f)[1]) == {"olmo3-sft": {"suspend"}}
    before = sim.last_step()
    sim.wait_step(before + 5)  # still training


# -- when JobSets start -------------------------------------------------------------------------


def test_start_after_creates_jobsets_apart_and_queued_seconds_holds_admission(make_simcluster):
    # wide enough that the first kubectl calls land before big-b exists and while "queued"
    # waits, however slow a loaded machine starts kubectl
    apart = 5.0
    sim = make_simcluster({"rate": 20, "jobsets": [
        {"name": "big-a", "hosts": 2, "trainer": {"steps": 400}},
        {"name": "big-b", "hosts": 2, "start_after": apart, "trainer": {"steps": 400}},
        {"name": "queued", "hosts": 1, "queued_seconds": 10.0, "trainer": {"steps": 400}}]})
    t0 = time.monotonic()
    assert kubectl(sim, "get", "jobset", "big-b", check=False).returncode == 1  # not yet created
    q = kjson(sim, "get", "jobset", "queued")
    assert q["spec"]["suspend"] is True and condition(q, "Suspended")["status"] == "True"
    assert q["status"]["replicatedJobsStatus"][0]["suspended"] == 1
    assert kjson(sim, "get", "pods", "-l", "jobset.sigs.k8s.io/jobset-name=queued")["items"] == []
    wl = next(o for o in kjson(sim, "get", "workloads")["items"]
              if o["metadata"]["ownerReferences"][0]["name"] == "queued")
    assert condition(wl, "QuotaReserved")["status"] == "False" and condition(wl, "QuotaReserved")["reason"] == "Pending"
    assert condition(wl, "Admitted") is None and "admission" not in wl["status"]

    sim.wait_step(1, jobset="big-b", timeout=apart + 10)
    assert time.monotonic() - t0 >= apart - 0.5
    a, b = (kjson(sim, "get", "jobset", n) for n in ("big-a", "big-b"))
    ca, cb = (calendar.timegm(time.strptime(o["metadata"]["creationTimestamp"], "%Y-%m-%dT%H:%M:%SZ"))
              for o in (a, b))
    assert apart - 1 <= cb - ca <= apart + 1  # creationTimestamp has whole seconds
    with sim.lock:
        starts = [sim.state.jobset(n).created_ns for n in ("big-a", "big-b")]
    assert starts[1] - starts[0] >= apart * 1e9

    sim.wait_step(1, jobset="queued", timeout=15)
    q = kjson(sim, "get", "jobset", "queued")
    assert q["spec"]["suspend"] is False and condition(q, "Suspended")["reason"] == "ResumeJobs"
    assert q["metadata"]["generation"] == 2
    wl = next(o for o in kjson(sim, "get", "workloads")["items"]
              if o["metadata"]["ownerReferences"][0]["name"] == "queued")
    assert condition(wl, "Admitted")["status"] == "True" and wl["status"]["admission"]["clusterQueue"]
    assert len(kjson(sim, "get", "pods", "-l", "jobset.sigs.k8s.io/jobset-name=queued")["items"]) == 1
