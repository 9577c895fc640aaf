"""The runbook's rules checked from a JobSet before it is submitted: the rules as data
(runs/runbook.yaml, CEL), their evaluation (runs/runbook.py, runs/manifest.py) and
`steptail lint` (exit 0 clean, 1 flagged, 2 error with one line)."""

from __future__ import annotations

import copy
import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from steptail.commands.lint import default_policy_text
from steptail.runs import manifest
from steptail.runs.runbook import PolicyError, cel_error, evaluate, load_policy

MANIFESTS = Path(__file__).resolve().parent / "manifests"
SAMPLES = Path(__file__).resolve().parent / "samples"
STEPTAIL = str(Path(sys.executable).with_name("steptail"))
DEFAULTS = ("runbook.yaml", default_policy_text())
IMAGE = "maxtext-posttrain:51f8cc4b-p907d86f3-rfb46e215e"


def steptail(*args: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "STEPTAIL_DB"}
    return subprocess.run([STEPTAIL, *map(str, args)], cwd=cwd, input=stdin, capture_output=True, text=True,
                          env=env, timeout=120)


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("steptail: error: "), lines
    assert proc.stdout == ""
    return lines[0]


def good() -> dict:
    docs, _ = manifest.split_manifest((MANIFESTS / "good.yaml").read_text(), "good.yaml")
    return copy.deepcopy(docs[0].body)


def template(js: dict, j: int = 0) -> dict:
    return js["spec"]["replicatedJobs"][j]["template"]["spec"]["template"]["spec"]


def trainer(js: dict) -> dict:
    return template(js)["containers"][0]


POLICY = load_policy([DEFAULTS])


def rules_broken(js: dict, facts: dict | None = None, policy=POLICY) -> list[str]:
    return [f.rule for f in evaluate(policy, js, facts=facts) if f.severity != "info"]


def not_evaluable(js: dict, facts: dict | None = None, policy=POLICY) -> dict[str, str]:
    return {f.rule: f.message for f in evaluate(policy, js, facts=facts) if f.severity == "info"}


# -- each rule: a JobSet that breaks it, one that keeps it ------------------------------------


def _queue(q):
    return lambda js: js["metadata"]["labels"].__setitem__("kueue.x-k8s.io/queue-name", q)


def _no_queue(js):
    del js["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]


def _image(image):
    return lambda js: trainer(js).__setitem__("image", image)


def _topology(t):
    return lambda js: template(js)["nodeSelector"].__setitem__("cloud.google.com/gke-tpu-topology", t)


def _no_topology(js):
    del template(js)["nodeSelector"]["cloud.google.com/gke-tpu-topology"]


def _args(*args):
    return lambda js: trainer(js).__setitem__("args", ["sft.yml", *args])


def _shell_args(js):
    c = trainer(js)
    c["command"] = ["bash", "-c"]
    c["args"] = ["cd /app && python3 -m maxtext.train sft.yml 'run_name=x' ici_context_parallelism=4"]


def _only_dir(value):
    return lambda js: template(js)["volumes"][0]["csi"]["volumeAttributes"].__setitem__("mountOptions", value)


def _suspend(v):
    return lambda js: js["spec"].__setitem__("suspend", v)


def _jobspec(key, value):
    return lambda js: js["spec"]["replicatedJobs"][0]["template"]["spec"].__setitem__(key, value)


def _selector(key, value):
    return lambda js: template(js)["nodeSelector"].__setitem__(f"cloud.google.com/gke-tpu-{key}", value)


def _tpus(n):
    return lambda js: trainer(js)["resources"]["limits"].__setitem__("google.com/tpu", n)


def _nothing(js):
    pass


BREAKS = [
    ("queue", _queue("hero")),
    ("queue", _queue("dev")),
    ("queue", _no_queue),
    ("restore_fix_image", _image("maxtext-posttrain:0e1d2c3b")),
    ("restore_fix_image", _image("us-docker.pkg.dev/p/i/maxtext-posttrain:51f8cc4b-p907d86f3-rfb46e215e-old")),
    ("slice_topology", _topology("2x2x1")),
    ("borrowed_topology", _topology("8x8x16")),
    ("load_balance", _args("ici_context_parallelism=2")),
    ("load_balance", _args("ici_context_parallelism=-1", "context_parallel_load_balance=True")),
    ("load_balance", _shell_args),
    ("checkpoint_mount", _only_dir("implicit-dirs,only-dir=post-training")),
    ("checkpoint_mount", _only_dir("only-dir=/post-training/checkpoints/")),
    ("checkpoint_mount", _only_dir("implicit-dirs")),
    ("suspend", _suspend(True)),
    ("slice_hosts", _jobspec("parallelism", 8)),
    ("slice_hosts", _topology("8x8x16")),  # 1024 chips: 256 hosts
    ("slice_completions", _jobspec("completions", 16)),
    ("tpu_request", _tpus("8")),
    ("tpu_request", _tpus("four")),
]
KEEPS = [
    ("queue", _nothing),
    ("restore_fix_image", _image(IMAGE)),
    ("restore_fix_image", _image("gcr.io/x/" + IMAGE)),
    ("slice_topology", _topology("4x4x8")),
    ("borrowed_topology", _topology("4x4x8")),
    ("load_balance", _args("ici_context_parallelism=1")),
    ("load_balance", _args("ici_context_parallelism=8", "context_parallel_load_balance=false")),
    ("load_balance", _args("steps=10")),
    ("checkpoint_mount", _only_dir("implicit-dirs,only-dir=post-training/data")),
    ("checkpoint_mount", _only_dir("only-dir=post-training/tokenizers")),
    ("suspend", _suspend(False)),
    ("slice_hosts", _jobspec("parallelism", 32)),
    ("slice_completions", _jobspec("completions", 32)),
    ("tpu_request", _tpus(4)),
]


@pytest.mark.parametrize("rule, change", BREAKS, ids=lambda x: x if isinstance(x, str) else "")
def test_a_jobset_that_breaks_the_rule_is_flagged(rule, change):
    js = good()
    change(js)
    assert rules_broken(js) == [rule] or rule in rules_broken(js)
    # a topology or host count changed breaks the slice's shape too
    shape = {"slice_topology", "borrowed_topology", "slice_hosts", "slice_completions"}
    assert all(r in ({rule} | shape) for r in rules_broken(js))


@pytest.mark.parametrize("rule, change", KEEPS, ids=lambda x: x if isinstance(x, str) else "")
def test_a_jobset_that_keeps_the_rule_is_clean(rule, change):
    js = good()
    change(js)
    assert rules_broken(js) == []


def test_each_default_rule_is_tested():
    # slice_shape needs a control, stagger the neighbours' start times: tested below with facts
    assert {r.name for r in POLICY.rules} == {r for r, _ in BREAKS} | {"slice_shape", "stagger"}


# -- absent input is never a breach: not evaluable (info), naming what is missing ----------------


def _no_image(js):
    del trainer(js)["image"]


def _no_containers(js):
    template(js)["containers"] = []


NOT_EVALUABLE = [  # (change, {rule: the missing input named})
    (_no_image, {"restore_fix_image": "the trainer container's image"}),
    (lambda js: trainer(js).__setitem__("image", ""), {"restore_fix_image": "the trainer container's image"}),
    (_no_topology, {"slice_topology": "the cloud.google.com/gke-tpu-topology node selector"}),
    (lambda js: template(js)["nodeSelector"].pop("cloud.google.com/gke-tpu-accelerator"),
     {"slice_hosts": "the cloud.google.com/gke-tpu-accelerator node selector"}),
    (_selector("accelerator", "tpu-v9-hyperslice"), {"slice_hosts": "the chips per host of this accelerator type"}),
    (_no_containers, {"restore_fix_image": "the trainer container", "load_balance": "the trainer container",
                      "tpu_request": "the trainer container"}),
    (lambda js: template(js)["volumes"][0]["csi"]["volumeAttributes"].pop("bucketName"),
     {"checkpoint_mount": "the gcsfuse volume's bucketName"}),
]


@pytest.mark.parametrize("change, expected", NOT_EVALUABLE)
def test_a_rule_without_its_input_is_not_evaluable_never_broken(change, expected):
    js = good()
    change(js)
    assert rules_broken(js) == []
    got = not_evaluable(js)
    assert set(got) == set(expected), got
    for rule, field in expected.items():
        assert got[rule].startswith(f"not evaluable: {field}") and got[rule].endswith(" missing"), got[rule]


def test_live_suspend_without_a_workload_is_not_evaluable():
    js = good()
    _suspend(True)(js)
    assert rules_broken(js) == ["suspend"]  # lint: spec.suspend does nothing once admitted
    live = {"live": True}  # follow read no Workload (no Kueue, or RBAC denied)
    assert rules_broken(js, live) == [] and set(not_evaluable(js, live)) == {"suspend"}
    assert "Kueue Workload" in not_evaluable(js, live)["suspend"]
    _suspend(False)(js)
    assert not_evaluable(js, live) == {}  # nothing to ask of the Workload


def test_slice_hosts_says_what_to_change():
    js = good()
    _jobspec("parallelism", 8)(js)
    _jobspec("completions", 8)(js)
    [f] = evaluate(POLICY, js)
    assert (f.rule, f.severity) == ("slice_hosts", "critical")
    assert f.message == ("parallelism 8 but a 4x4x8 tpu-v5p-slice has 32 hosts (128 chips ÷ 4 per host): the "
                         "runbook requires one pod per host; set parallelism and completions to 32")
    assert evaluate(POLICY, js, live=True) == []  # a running JobSet was scheduled: lint's check only


def test_rule_messages_say_what_to_change_never_a_double_negative():
    docs, _ = manifest.split_manifest((MANIFESTS / "bad.yaml").read_text(), "bad.yaml")
    found = evaluate(POLICY, docs[0].body)
    for f in found:
        assert " without " not in f.message and "(it is " not in f.message, f.message
        if f.severity != "info":
            assert "the runbook" in f.message and ("; " in f.message), f.message
    lb = next(f for f in found if f.rule == "load_balance")
    assert lb.message == ("ici_context_parallelism=2 with context_parallel_load_balance=True: the runbook forbids "
                          "load balancing with context parallelism (it moved step-1 CE by +0.39 at cp4 and +1.98 "
                          "at cp8); set context_parallel_load_balance=False")


def _workload(admitted: bool, active: bool = True) -> dict:
    return {"workload": {"name": "jobset-olmo3-sft-1a2b3", "admitted": admitted, "active": active,
                         "finished": False}}


def test_live_suspend_is_flagged_only_while_the_workload_is_admitted_and_active():
    js = good()
    _suspend(True)(js)
    found = evaluate(POLICY, js, facts=_workload(admitted=True))
    assert [f.rule for f in found] == ["suspend"]
    assert "Workload jobset-olmo3-sft-1a2b3 is still admitted and active" in found[0].message
    assert '\'{"spec":{"active":false}}\'' in found[0].message
    assert rules_broken(js, _workload(admitted=False)) == []  # Kueue holds it suspended until admission
    assert rules_broken(js, _workload(admitted=True, active=False)) == []  # deactivated: stopping
    _suspend(False)(js)
    assert rules_broken(js, _workload(admitted=True)) == []


def test_stagger_flags_a_big_slice_started_inside_the_window_of_another():
    js = good()
    assert rules_broken(js) == []  # offline: no neighbours known
    found = evaluate(POLICY, js, facts={"stagger": {"neighbour": "qwen3-cp4", "seconds": 30, "window": 600}})
    assert [(f.rule, f.severity) for f in found] == [("stagger", "warning")]
    assert found[0].message.startswith("started 30 s after big-slice JobSet qwen3-cp4 (window 600 s)")


def test_findings_name_the_rule_severity_message_and_path():
    js = good()
    _queue("hero")(js)
    _image("maxtext-posttrain:old")(js)
    _only_dir("only-dir=post-training")(js)
    by_rule = {f.rule: f for f in evaluate(POLICY, js)}
    assert by_rule["queue"].severity == "critical" and "'hero'" in by_rule["queue"].message
    assert by_rule["queue"].path == 'metadata.labels["kueue.x-k8s.io/queue-name"]'
    assert by_rule["restore_fix_image"].path == "spec.replicatedJobs[0].template.spec.template.spec.containers[0].image"
    assert by_rule["checkpoint_mount"].path == "spec.replicatedJobs[0].template.spec.template.spec.volumes[0]"
    assert "gs://post-training-bucket/post-training" in by_rule["checkpoint_mount"].message
    assert by_rule["queue"].jobset == "olmo3-sft-a" and by_rule["queue"].namespace == "post-training"
    assert not any(f.error for f in by_rule.values())


def test_slice_shape_against_the_control():
    js = good()  # 4x4x8, 1 replica x 32 hosts
    same = {"control": {"run": "base", "topology": "4x4x8", "hosts": 32}}
    assert rules_broken(js, same) == []
    assert rules_broken(js) == []  # no control, nothing to compare
    other = {"control": {"run": "base", "topology": "4x4x8", "hosts": 16}}
    [f] = evaluate(POLICY, js, facts=other)
    assert f.rule == "slice_shape" and "32 hosts" in f.message and "base's 4x4x8 x 16 hosts" in f.message
    assert rules_broken(js, {"control": {"run": "b", "topology": "8x8x16", "hosts": 32}}) == ["slice_shape"]
    assert rules_broken(js, {"control": {"run": "b", "topology": "", "hosts": 32}}) == []  # topology unknown
    _no_topology(js)  # the arm's topology unknown: not evaluable against a control that has one
    control = {"control": {"run": "b", "topology": "4x4x8", "hosts": 32}}
    assert rules_broken(js, control) == []
    assert not_evaluable(js, control)["slice_shape"].startswith(
        "not evaluable: the JobSet's cloud.google.com/gke-tpu-topology node selector")


def test_the_sidecar_and_the_trainer():
    js = good()
    tmpl = template(js)
    tmpl["containers"].insert(0, {"name": "log-shipper", "image": "fluent-bit:3"})
    tmpl["containers"][1]["args"] = ["sft.yml", "ici_context_parallelism=2"]  # the trainer (asks for TPUs)
    [f] = evaluate(POLICY, js)
    assert f.rule == "load_balance" and f.path.endswith("spec.containers[1].args")


def test_live_pods_are_checked_too():
    """follow will pass the JobSet's pods: a template Kueue or a webhook changed on admission."""
    js = good()
    pods = []
    for i in range(3):
        pod = {"metadata": {"name": f"olmo3-sft-a-slice-0-{i}-x", "labels": {
            "jobset.sigs.k8s.io/replicatedjob-name": "slice", "jobset.sigs.k8s.io/job-index": "0",
            "batch.kubernetes.io/job-completion-index": str(i)}},
            "spec": copy.deepcopy(template(js))}
        pods.append(pod)
    pods[0]["spec"]["containers"][0]["image"] = "maxtext-posttrain:old"  # process 0
    pods[2]["spec"]["nodeSelector"]["cloud.google.com/gke-tpu-topology"] = "2x2x2"
    found = {(f.rule, f.path) for f in evaluate(POLICY, js, pods=pods)}
    assert found == {("restore_fix_image", "pods/olmo3-sft-a-slice-0-0-x.spec.containers[0].image"),
                     ("slice_topology", 'pods/olmo3-sft-a-slice-0-2-x.spec.nodeSelector["cloud.google.com/gke-tpu-topology"]')}


# -- the policy file ----------------------------------------------------------------------------


def test_a_custom_policy_changes_the_queue_list():
    js = good()
    _queue("hero")(js)
    assert rules_broken(js) == ["queue"]
    mine = load_policy([DEFAULTS, ("mine.yaml", "settings:\n  queues: [post-training, hero]\n")])
    assert rules_broken(js, policy=mine) == []
    assert mine.settings["image"] == IMAGE  # other settings kept
    assert mine.settings["gcsfuse"]["forbidden_only_dirs"] == POLICY.settings["gcsfuse"]["forbidden_only_dirs"]


def test_a_custom_policy_overrides_disables_adds_or_replaces_rules():
    js = good()
    _suspend(True)(js)
    mine = load_policy([DEFAULTS, ("mine.yaml", """
rules:
  - {name: suspend, severity: critical}
  - {name: queue, enabled: false}
  - name: run_name
    scope: process0
    severity: warning
    message: the trainer's run_name must be the JobSet's name
    expression: pod.trainer.overrides.run_name == jobset.name
""")])
    _queue("hero")(js)
    trainer(js)["args"] = ["sft.yml", "run_name=another"]
    found = {f.rule: f for f in evaluate(mine, js)}
    assert found["suspend"].severity == "critical" and "queue" not in {r.name for r in mine.rules}
    assert set(found) == {"suspend", "run_name"}
    trainer(js)["args"] = ["sft.yml", "run_name=olmo3-sft-a"]
    assert rules_broken(js, policy=mine) == ["suspend"]
    only = load_policy([DEFAULTS, ("only.yaml", """
defaults: replace
settings: {queues: [q]}
rules:
  - {name: q, severity: warning, message: not q, expression: jobset.queue in settings.queues}
""")])
    assert [r.name for r in only.rules] == ["q"] and only.settings == {"queues": ["q"]}


@pytest.mark.parametrize("text, expected", [
    ("rules: [", "mine.yaml: not YAML (line 1, column"),
    ("color: red\n", "mine.yaml: unknown key 'color'"),
    ("rules:\n  - {name: queue, colour: red}\n", "mine.yaml: rule 'queue': unknown key 'colour'"),
    ("rules:\n  - {name: queue, severity: fatal}\n", "mine.yaml: rule 'queue': severity must be warning or critical, not 'fatal'"),
    ("rules:\n  - {name: new, severity: warning, message: m}\n", "mine.yaml: rule 'new': no `expression`"),
    ("rules:\n  - {name: queue, expression: 'jobset.queue in ['}\n", "mine.yaml: rule 'queue': expression does not compile: line 1, column"),
    ("rules:\n  - {name: queue, expression: 'pod.tpu'}\n", "mine.yaml: rule 'queue': expression: unknown variable 'pod' (scope jobset has object, jobset, settings, facts)"),
    ("rules:\n  - {name: queue, expression: 'jobset.queue.lowerAscii() == \"x\"'}\n", "mine.yaml: rule 'queue': expression: unknown function 'lowerAscii'"),
    ("rules:\n  - {name: queue, scope: cluster}\n", "mine.yaml: rule 'queue': scope must be one of"),
    ("rules:\n  - {name: queue, path: '{podd}'}\n", "mine.yaml: rule 'queue': `path` '{podd}'"),
    ("rules:\n  - {name: Queue}\n", "mine.yaml: rule 1: `name` must be lower_snake_case"),
    ("defaults: keep\n", "mine.yaml: `defaults` is merge or replace"),
    ("- a\n", "mine.yaml: a policy is a mapping"),
    ("rules:\n  - {name: queue, requires: x}\n", "mine.yaml: rule 'queue': `requires` must be a list"),
    ("rules:\n  - {name: queue, requires: [{field: f}]}\n", "mine.yaml: rule 'queue': requires[0] must be a mapping"),
    ("rules:\n  - {name: queue, requires: [{field: f, expression: 'pod.tpu'}]}\n",
     "mine.yaml: rule 'queue': requires[0].expression: unknown variable 'pod'"),
    ("rules:\n  - {name: queue, live: 'no'}\n", "mine.yaml: rule 'queue': `live` must be true or false"),
])
def test_a_malformed_policy_names_the_file_and_the_rule(text, expected):
    with pytest.raises(PolicyError) as exc:
        load_policy([DEFAULTS, ("mine.yaml", text)])
    assert str(exc.value).startswith(expected), str(exc.value)
    assert "\n" not in str(exc.value)


def test_cel_compile_errors_are_one_line_with_the_column():
    raw = ("Failed to parse expression 'a ==': ERROR: <input>:1:5: Syntax error: mismatched input "
           "'<EOF>' expecting {'['}\n| a ==\n| ....^")
    assert cel_error(raw) == "line 1, column 5: Syntax error: mismatched input '<EOF>' expecting {'['}"
    with pytest.raises(PolicyError, match=r"rule 'x': expression does not compile: line 1, column 15: Syntax error"):
        load_policy([("p.yaml", "rules:\n  - {name: x, severity: warning, message: m, expression: 'jobset.labels.('}\n")])


def test_a_runtime_error_is_a_finding_of_the_rule_not_a_crash():
    mine = load_policy([("p.yaml", "rules:\n  - {name: x, severity: warning, message: m, "
                                   "expression: 'object.spec.nothing == 1'}\n  - {name: y, severity: warning, "
                                   "message: m, expression: '\"not a bool\"'}\n")])
    found = evaluate(mine, good())
    assert [(f.rule, f.error) for f in found] == [("x", True), ("y", True)]
    assert found[0].message.startswith("cannot evaluate: no such key") and "not true or false" in found[1].message


# -- manifests ---------------------------------------------------------------------------------


def test_multi_document_files_and_lists():
    docs, notes = manifest.split_manifest((MANIFESTS / "multi.yaml").read_text(), "multi.yaml")
    assert [(d.index, d.name) for d in docs] == [(1, "arm-a"), (2, "arm-b")]
    assert notes == ["multi.yaml: document 1 (ConfigMap sft-config) is not a JobSet: ignored"]
    listed = yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [good(), good()]})
    docs, notes = manifest.split_manifest(listed, "list.yaml")
    assert len(docs) == 2 and notes == []


@pytest.mark.parametrize("text, expected", [
    ("kind: JobSet\n  bad: [", "m.yaml: not YAML"),
    ("just a string\n", "m.yaml: document 1 is not a Kubernetes object (a str)"),
    ("apiVersion: batch/v1\nkind: JobSet\nmetadata: {name: x}\n", "m.yaml: document 1: JobSet x has apiVersion 'batch/v1'"),
    ("apiVersion: jobset.x-k8s.io/v1alpha2\nkind: JobSet\nmetadata: {name: x}\nspec: {replicatedJobs: {}}\n",
     "m.yaml: document 1: spec.replicatedJobs must be a list, not dict"),
    ("apiVersion: jobset.x-k8s.io/v1alpha2\nkind: JobSet\nmetadata: {name: x}\nspec:\n  replicatedJobs:\n"
     "    - {name: s, template: {spec: {template: {spec: {containers: [{name: c, args: 'a=b'}]}}}}}\n",
     "m.yaml: document 1: spec.replicatedJobs[0].template.spec.template.spec.containers[0].args must be a list"),
])
def test_a_malformed_manifest_is_one_error(text, expected):
    with pytest.raises(manifest.ManifestError) as exc:
        manifest.split_manifest(text, "m.yaml")
    assert str(exc.value).startswith(expected) and "\n" not in str(exc.value), str(exc.value)


# -- the command -------------------------------------------------------------------------------


def test_lint_exit_codes_and_table(tmp_path):
    clean = steptail("lint", MANIFESTS / "good.yaml", cwd=tmp_path)
    assert clean.returncode == 0, clean.stderr
    assert "olmo3-sft-a" in clean.stdout and "clean" in clean.stdout
    flagged = steptail("lint", MANIFESTS / "bad.yaml", cwd=tmp_path)
    assert flagged.returncode == 1, flagged.stderr
    rows = flagged.stdout.splitlines()
    assert rows[0].split() == ["SEVERITY", "RULE", "JOBSET", "MESSAGE"]
    assert {r.split()[1] for r in rows[1:-1]} == {"queue", "restore_fix_image", "borrowed_topology",
                                                  "load_balance", "checkpoint_mount", "suspend", "slice_hosts"}
    assert rows[-1] == "1 JobSet: 7 findings, 4 critical, 1 not evaluable"  # no accelerator selector
    wide = steptail("lint", MANIFESTS / "bad.yaml", "-o", "wide", cwd=tmp_path)
    assert "PATH" in wide.stdout and "bad.yaml#1" in wide.stdout


def test_lint_json_csv_ndjson(tmp_path):
    proc = steptail("lint", MANIFESTS / "multi.yaml", MANIFESTS / "good.yaml", "-o", "json", cwd=tmp_path)
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    assert [(j["jobset"], j["document"], j["clean"]) for j in doc["jobsets"]] == [
        ("arm-a", 2, True), ("arm-b", 3, False), ("olmo3-sft-a", 1, True)]
    assert doc["jobsets"][1]["findings"][0]["rule"] == "queue" and doc["findings"] == 1 and doc["critical"] == 1
    assert doc["ignored"] == [f"{MANIFESTS / 'multi.yaml'}: document 1 (ConfigMap sft-config) is not a JobSet: ignored"]
    assert "is not a JobSet: ignored" in proc.stderr  # the note, on stderr
    assert doc["control"] is None and "queue" in doc["rules"]
    rows = list(csv.DictReader(io.StringIO(steptail("lint", MANIFESTS / "bad.yaml", "-o", "csv", cwd=tmp_path).stdout)))
    assert len(rows) == 7 and rows[0]["rule"] == "queue" and rows[0]["document"] == "1"
    lines = steptail("lint", MANIFESTS / "bad.yaml", "-o", "ndjson", cwd=tmp_path).stdout.splitlines()
    assert [json.loads(line)["rule"] for line in lines][:2] == ["queue", "restore_fix_image"]


def test_lint_reads_stdin(tmp_path):
    proc = steptail("lint", "-", "--json", cwd=tmp_path, stdin=(MANIFESTS / "bad.yaml").read_text())
    assert proc.returncode == 1 and json.loads(proc.stdout)["jobsets"][0]["file"] == "<stdin>"


def test_lint_with_a_custom_policy_file(tmp_path):
    (tmp_path / "p.yaml").write_text("settings:\n  queues: [post-training, dev]\n")
    proc = steptail("lint", MANIFESTS / "multi.yaml", "--policy", "p.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("policy, expected", [
    ("rules: [\n", "steptail: error: bad policy: p.yaml: not YAML"),
    ("rules:\n  - {name: queue, severity: fatal}\n", "steptail: error: bad policy: p.yaml: rule 'queue': severity"),
    ("rules:\n  - {name: queue, expression: 'jobset.queue in ['}\n",
     "steptail: error: bad policy: p.yaml: rule 'queue': expression does not compile: line 1, column"),
    ("rules:\n  - {name: queue, when: x}\n", "steptail: error: bad policy: p.yaml: rule 'queue': unknown key 'when'"),
])
def test_lint_with_a_malformed_policy_exits_2_with_one_line(tmp_path, policy, expected):
    (tmp_path / "p.yaml").write_text(policy)
    line = one_line_error(steptail("lint", MANIFESTS / "good.yaml", "--policy", "p.yaml", cwd=tmp_path))
    assert line.startswith(expected), line


@pytest.mark.parametrize("text, expected", [
    ("kind: JobSet\n  bad: [", "bad manifest: m.yaml: not YAML (line 2, column 6): mapping values"),
    ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n", "no JobSet in m.yaml (1 other object ignored)"),
    ("", "no JobSet in m.yaml"),
])
def test_lint_with_a_malformed_manifest_exits_2_with_one_line(tmp_path, text, expected):
    (tmp_path / "m.yaml").write_text(text)
    assert one_line_error(steptail("lint", "m.yaml", cwd=tmp_path)).startswith(f"steptail: error: {expected}")
    assert one_line_error(steptail("lint", "missing.yaml", cwd=tmp_path)).startswith(
        "steptail: error: cannot read manifest missing.yaml: No such file")


def test_lint_control_manifest(tmp_path):
    proc = steptail("lint", MANIFESTS / "good.yaml", "--control-manifest", MANIFESTS / "bad.yaml", "--json",
                    cwd=tmp_path)
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    assert doc["control"] == {"run": "olmo3-sft-b", "topology": "8x8x16", "hosts": 32,
                              "from": [str(MANIFESTS / "bad.yaml")]}
    assert [f["rule"] for f in doc["jobsets"][0]["findings"]] == ["slice_shape"]
    same = steptail("lint", MANIFESTS / "good.yaml", "--control-manifest", MANIFESTS / "good.yaml", cwd=tmp_path)
    assert same.returncode == 0 and "control olmo3-sft-a: 4x4x8 x 32 hosts" in same.stdout
    two = one_line_error(steptail("lint", MANIFESTS / "good.yaml", "--control-manifest", MANIFESTS / "multi.yaml",
                                  cwd=tmp_path))
    assert "holds 2 JobSets" in two


def test_lint_control_run_from_the_store(tmp_path):
    """The store records each incarnation's process_count (no topology): the host count is compared."""
    db = tmp_path / "s.db"
    ingest = steptail("ingest", SAMPLES / "clean-300.log", "--run", "base", "--db", db, cwd=tmp_path)
    assert ingest.returncode in (0, 1), ingest.stderr  # process_count=32
    ok = steptail("lint", MANIFESTS / "good.yaml", "--control", "base", "--db", db, "--json", cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert json.loads(ok.stdout)["control"] == {"run": "base", "topology": "", "hosts": 32, "from": ["run base"]}
    assert "only the host count is compared" in ok.stderr
    js = good()
    js["spec"]["replicatedJobs"][0]["replicas"] = 2
    (tmp_path / "double.yaml").write_text(yaml.safe_dump(js))
    double = steptail("lint", "double.yaml", "--control", "base", "--db", db, cwd=tmp_path)
    assert double.returncode == 1 and "slice_shape" in double.stdout and "64 hosts" in double.stdout
    unknown = one_line_error(steptail("lint", MANIFESTS / "good.yaml", "--control", "nope", "--db", db, cwd=tmp_path))
    assert "no run 'nope'" in unknown


# -- the issue's cases through the CLI: one wording, absent input, the slice's shape -------------


def test_lint_of_the_issue_cases(tmp_path):
    no_image = steptail("lint", MANIFESTS / "no-image.yaml", "-o", "json", cwd=tmp_path)
    assert no_image.returncode == 0, no_image.stdout  # info only: nothing to change
    [f] = json.loads(no_image.stdout)["jobsets"][0]["findings"]
    assert (f["rule"], f["severity"], f["evaluable"]) == ("restore_fix_image", "info", False)
    assert f["message"] == "not evaluable: the trainer container's image missing"
    assert json.loads(no_image.stdout)["jobsets"][0]["clean"] is True
    table = steptail("lint", MANIFESTS / "no-image.yaml", cwd=tmp_path)
    assert table.returncode == 0 and "clean (1 rule not evaluable)" in table.stdout

    hosts = steptail("lint", MANIFESTS / "hosts-8.yaml", cwd=tmp_path)
    assert hosts.returncode == 1
    assert ("parallelism 8 but a 4x4x8 tpu-v5p-slice has 32 hosts (128 chips ÷ 4 per host): the runbook "
            "requires one pod per host; set parallelism and completions to 32") in " ".join(hosts.stdout.split())

    lb = steptail("lint", MANIFESTS / "cp4-lb.yaml", "-o", "json", cwd=tmp_path)
    assert lb.returncode == 1
    [f] = json.loads(lb.stdout)["jobsets"][0]["findings"]
    assert (f["rule"], f["severity"]) == ("load_balance", "critical")
    assert f["message"] == LB_TEXT

    good_run = steptail("lint", MANIFESTS / "good.yaml", "-o", "json", cwd=tmp_path)
    assert good_run.returncode == 0 and json.loads(good_run.stdout)["findings"] == 0


LB_TEXT = ("ici_context_parallelism=4 with context_parallel_load_balance=True: the runbook forbids load balancing "
           "with context parallelism (it moved step-1 CE by +0.39 at cp4 and +1.98 at cp8); "
           "set context_parallel_load_balance=False")


def test_check_of_the_cp4_load_balance_log_is_one_finding_in_lints_words(tmp_path):
    """Offline (a saved log, no JobSet): the config lines alone raise the rule, once, worded
    as lint words it; a second check changes nothing."""
    db = tmp_path / "s.db"
    assert steptail("ingest", SAMPLES / "cp4-lb-nan.log", "--run", "qwen3-cp4", "--db", db, cwd=tmp_path).returncode == 0
    for _ in range(2):
        check = steptail("check", "qwen3-cp4", "--db", db, "--json", cwd=tmp_path)
        assert check.returncode == 1
        lb = [f for f in json.loads(check.stdout)["findings"] if "load_balance" in f["kind"]]
        assert [(f["kind"], f["severity"], f["incarnation"]) for f in lb] == [("rule:load_balance", "critical", 1)]
        assert lb[0]["detail"] == LB_TEXT + " (seen in the config lines of incarnation 1)"
        assert " without " not in check.stdout
