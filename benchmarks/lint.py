"""Benchmark of the runbook rules (runs/runbook.py, CEL): what `steptail lint` costs on a
32-pod JobSet manifest, what `follow` would pay to check a JobSet with its 32 live pods, and
one discovery pass's worth: 50 JobSets.

    .venv/bin/python benchmarks/lint.py [--repeat 30] [--json]

Times are medians of --repeat runs (the policy compiled once, as a long-lived follow would);
`lint_cli_ms` is the whole command, start-up included, once per repeat (fewer of them)."""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
GOOD = ROOT / "tests" / "manifests" / "good.yaml"


def jobset_32(i: int = 0) -> dict:
    """tests/manifests/good.yaml as 2 slices x 16 hosts = 32 pods; every 5th one breaks rules."""
    js = yaml.safe_load(GOOD.read_text())
    js["metadata"]["name"] = f"olmo3-sft-{i:02d}"
    if i % 5 == 4:
        js["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "hero"
        js["spec"]["suspend"] = True
    return js


def live_pods(js: dict) -> list[dict]:
    rj = js["spec"]["replicatedJobs"][0]
    tmpl = rj["template"]["spec"]["template"]
    pods = []
    for job in range(rj["replicas"]):
        for index in range(rj["template"]["spec"]["parallelism"]):
            pods.append({"metadata": {"name": f"{js['metadata']['name']}-slice-{job}-{index}-abcde", "labels": {
                "jobset.sigs.k8s.io/replicatedjob-name": rj["name"], "jobset.sigs.k8s.io/job-index": str(job),
                "batch.kubernetes.io/job-completion-index": str(index)}},
                "spec": copy.deepcopy(tmpl["spec"])})
    return pods


def live_pass(policy, fleet: list[dict], repeat: int) -> dict:
    """`follow`'s pass over 50 followed JobSets (collector.live.runbook_live.RunbookLive.check_all),
    on the real code with the cluster's objects filled in by hand: every JobSet changed (each
    evaluated with its process-0 pod, its Workload and the stagger facts), and a quiet pass
    (nothing changed: signatures compared only)."""
    import asyncio
    from types import SimpleNamespace

    from steptail.collector.cluster.discovery import PodInfo
    from steptail.collector.cluster.jobsets import ClusterObjects, WorkloadInfo
    from steptail.collector.live.runbook_live import RunbookLive, RunTarget

    class Detectors:
        def __init__(self):
            self.got = []

        def cluster_findings(self, fs):
            self.got += fs

    objects = ClusterObjects(target=None)
    objects.listed = {"jobsets": True, "workloads": True}  # as once both lists were read
    pods: dict[str, PodInfo] = {}
    targets = {}
    for i, js in enumerate(fleet):
        name = js["metadata"]["name"]
        js.setdefault("metadata", {})["resourceVersion"] = "1"
        objects.jobsets[name] = js
        objects.workloads[f"jobset-{name}"] = WorkloadInfo(f"jobset-{name}", name, True, True, False, None)
        view = live_pods(js)[0]
        pod = PodInfo(view["metadata"]["name"], f"uid-{i}", name, 0, f"2026-12-02 06:{i:02d}:00+00:00", "Running",
                      False, "jax-tpu", 0, "running", "", None, None, None,
                      image=view["spec"]["containers"][0]["image"], view=view)
        pods[pod.uid] = pod
        model = SimpleNamespace(current=SimpleNamespace(pod=pod.name, number=1))
        targets[name] = RunTarget(name, name, Detectors(), SimpleNamespace(model=model, set_hosts=lambda n: None))
    discovery = SimpleNamespace(pods=pods, process0=lambda j: [p for p in pods.values() if p.jobset == j])

    async def build():
        return RunbookLive(policy, objects, discovery, lambda: targets, store=None)

    live = asyncio.run(build())

    def changed():
        for js in fleet:  # a new resourceVersion: every JobSet evaluated again
            js["metadata"]["resourceVersion"] = str(int(js["metadata"]["resourceVersion"]) + 1)
        assert live.check_all() == len(fleet)

    def quiet():
        assert live.check_all() == 0

    out = {"live_pass_50_changed_ms": round(median_ms(changed, max(3, repeat // 5)), 2),
           "live_pass_50_quiet_ms": round(median_ms(quiet, repeat), 3)}
    out["live_findings_in_50"] = sum(len(t.detectors.got) for t in targets.values())
    return out


def median_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from steptail.commands.lint import default_policy_text
    from steptail.runs.manifest import split_manifest
    from steptail.runs.runbook import evaluate, load_policy

    t = time.perf_counter()
    policy = load_policy([("runbook.yaml", default_policy_text())])
    compile_ms = (time.perf_counter() - t) * 1000
    one = jobset_32()
    text = yaml.safe_dump(one)
    pods = live_pods(one)
    fleet = [jobset_32(i) for i in range(50)]
    facts = {"control": {"run": "base", "topology": "4x4x8", "hosts": 32}}

    report = {
        "rules": len(policy.rules),
        "pods_per_jobset": len(pods),
        "compile_policy_ms": round(compile_ms, 2),
        # lint's work on one file: YAML parsed, the JobSet checked and viewed, every rule
        "lint_manifest_ms": round(median_ms(
            lambda: evaluate(policy, split_manifest(text, "m.yaml")[0][0].body, facts=facts), args.repeat), 3),
        "evaluate_manifest_ms": round(median_ms(lambda: evaluate(policy, one, facts=facts), args.repeat), 3),
        # follow's: the JobSet and its 32 live pods (pod rules on each pod)
        "evaluate_with_32_pods_ms": round(median_ms(lambda: evaluate(policy, one, pods=pods), args.repeat), 3),
        # one discovery pass: 50 JobSets (templates only), and with their 32 pods each
        "evaluate_50_jobsets_ms": round(median_ms(lambda: [evaluate(policy, j) for j in fleet],
                                                  max(3, args.repeat // 5)), 2),
        "evaluate_50_jobsets_with_pods_ms": round(median_ms(
            lambda: [evaluate(policy, j, pods=live_pods(j)) for j in fleet], max(3, args.repeat // 10)), 2),
    }
    report["findings_in_50"] = sum(len(evaluate(policy, j)) for j in fleet)
    report.update(live_pass(policy, fleet, args.repeat))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "jobset.yaml"
        path.write_text(text)
        exe = str(Path(sys.executable).with_name("steptail"))
        report["lint_cli_ms"] = round(median_ms(
            lambda: subprocess.run([exe, "lint", str(path)], capture_output=True, check=False),
            max(3, args.repeat // 10)), 1)
    if args.json:
        print(json.dumps(report))
    else:
        for k, v in report.items():
            print(f"{k:34} {v}")


if __name__ == "__main__":
    main()
