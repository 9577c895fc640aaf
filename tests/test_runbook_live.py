"""The runbook's rules while a run goes on: `steptail follow` (real kubectl and the kubernetes
client against the simulated cluster) checks each followed JobSet, its process-0 pods and its
Kueue Workload with the policy `lint` uses, on SQLite and PostgreSQL. Each broken rule is a
finding of the run (`rule:<name>`), stored and shown by `check`; each incarnation records the
image it ran on; a failed JobSet is archived before it is reaped, or flagged when deleted
unsaved."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from sim_fixtures import make_simcluster  # noqa: F401
from store_fixtures import db_url  # noqa: F401

from steptail.storage.db import open_store

pytestmark = pytest.mark.timeout(240)
CLI = [sys.executable, "-c", "from steptail.cli import main; main()"]
IMAGE = "us-docker.pkg.dev/steptail-sim/maxtext/maxtext-posttrain:51f8cc4b-p907d86f3-rfb46e215e"
OTHER_IMAGE = "us-docker.pkg.dev/steptail-sim/maxtext/maxtext-posttrain:0ddba11-p1-r2"
TRAINER = {"steps": 60, "checkpoint_period": 20}
# The simulated slices run 1-4 pods on a "4x4x8" (32 hosts): lint's host-count check is off for them.
SIM_POLICY = Path(__file__).resolve().parent / "manifests" / "sim-policy.yaml"


def base(**extra) -> dict:
    return {"rate": 50, "grace_seconds": 2, "restart_pending_seconds": 0.3, **extra}


def js(name: str, **keys) -> dict:
    trainer = {**TRAINER, **keys.pop("trainer", {})}
    return {"name": name, "hosts": 2, "trainer": trainer, **keys}


def steptail(*args: str, account: str | None = None, timeout: float = 150) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("STEPTAIL_DB", "CLOUDSDK_CORE_ACCOUNT")}
    if account:
        env["CLOUDSDK_CORE_ACCOUNT"] = account
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=timeout)


def follow(sim, db: str, *extra: str) -> subprocess.CompletedProcess:
    proc = steptail("follow", "--all", "-n", "default", "--kubeconfig", str(sim.kubeconfig_path), "--db", db,
                    "--silence", "1", "--no-view", "--json", *extra, account=sim.account)
    assert proc.returncode == 0, proc.stderr
    return proc


_STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _no_follow_left():
    """A test that fails while its background follow runs does not leave it running."""
    yield
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)


def follow_started(sim, db: str, *extra: str) -> subprocess.Popen:
    """`follow --all` in the background, once it has committed a few steps of olmo3-sft: a
    fault injected after this happens while it follows (not before it started)."""
    env = {k: v for k, v in os.environ.items() if k != "STEPTAIL_DB"} | {"CLOUDSDK_CORE_ACCOUNT": sim.account}
    proc = subprocess.Popen([*CLI, "follow", "--all", "-n", "default", "--kubeconfig", str(sim.kubeconfig_path),
                             "--db", db, "--silence", "1", "--no-view", "--json", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    _STARTED.append(proc)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if query(db, "SELECT COUNT(*) FROM loss_parts WHERE run = 'olmo3-sft'")[0][0] >= 10:
                return proc
        except Exception:  # noqa: BLE001 - the store is created by follow: not yet there
            pass
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"follow did not start: {proc.communicate()[1]}")


def ended(proc: subprocess.Popen, stop: bool = False) -> str:
    """stderr of the background follow, once it ended (SIGTERM first when `stop`)."""
    if stop:
        proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return err


def findings(db: str) -> dict[str, set[tuple[str, int]]]:
    """run -> {(kind, incarnation)} of the rule findings stored."""
    store = open_store(db)
    try:
        with store.engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT run, kind, incarnation FROM findings"
                                        " WHERE kind LIKE 'rule:%' OR kind = 'logs_not_saved'")).all()
    finally:
        store.dispose()
    out: dict[str, set] = {}
    for run, kind, inc in rows:
        out.setdefault(run, set()).add((kind, inc))
    return out


def query(db: str, sql: str, **params) -> list[tuple]:
    store = open_store(db)
    try:
        with store.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.text(sql), params)]
    finally:
        store.dispose()


# Each JobSet breaks one rule (as `lint` would flag its manifest), `good` keeps them all.
BREAKERS = {
    "good": ({}, set()),
    "hero-queue": ({"queue": "hero"}, {"rule:queue"}),
    "other-image": ({"image": OTHER_IMAGE}, {"rule:restore_fix_image"}),
    "own-topology": ({"topology": "2x2x1"}, {"rule:slice_topology"}),
    "borrowed": ({"topology": "8x8x16"}, {"rule:borrowed_topology"}),
    "cp4-lb": ({"trainer": {"context_parallelism": 4, "load_balance": True}}, {"rule:load_balance"}),
    "wide-mount": ({"volumes": [{"name": "everything", "bucket": "post-training", "only_dir": "post-training"}]},
                   {"rule:checkpoint_mount"}),
}


def test_each_rule_broken_by_a_live_jobset_is_a_finding_of_its_run(make_simcluster, db_url, tmp_path):  # noqa: F811
    sim = make_simcluster(base(jobsets=[js(name, **keys) for name, (keys, _) in BREAKERS.items()]))
    # lint agrees on the same objects as the API serves them
    for name, (_, expected) in BREAKERS.items():
        manifest = tmp_path / f"{name}.yaml"
        got = subprocess.run(["kubectl", "--kubeconfig", str(sim.kubeconfig_path), "get", "jobset", name, "-o", "yaml"],
                             capture_output=True, text=True, env={**os.environ, "CLOUDSDK_CORE_ACCOUNT": sim.account})
        assert got.returncode == 0, got.stderr
        manifest.write_text(got.stdout)
        lint = steptail("lint", str(manifest), "--policy", str(SIM_POLICY), "-o", "json")
        flagged = {"rule:" + f["rule"] for j in json.loads(lint.stdout)["jobsets"] for f in j["findings"]}
        assert flagged == expected, (name, lint.stdout)
        assert lint.returncode == (1 if expected else 0)
    follow(sim, db_url, "--until-done")
    found = findings(db_url)
    for name, (_, expected) in BREAKERS.items():
        # once, at incarnation 0 for a rule on the JobSet (the run as submitted), at the
        # incarnation its pod's lines opened for a rule on the pods
        assert found.get(name, set()) == {(k, 0 if k == "rule:queue" else 1) for k in expected}, (name, found)
    # stored with their severity and message; `check` keeps them (not recomputable offline)
    (detail, severity), = query(db_url, "SELECT detail, severity FROM findings WHERE run = 'hero-queue'"
                                        " AND kind = 'rule:queue'")
    assert severity == "critical" and "queue 'hero': the runbook requires a post-training queue" in detail
    check = steptail("check", "hero-queue", "--db", db_url, "--json")
    assert check.returncode == 1
    assert "rule:queue" in {f["kind"] for f in json.loads(check.stdout)["findings"]}
    # one cause, one finding: the load-balance rule seen in the config lines and in the trainer's
    # args is one critical citing both, in the words lint prints; `check` (the config lines
    # alone) keeps both citations
    lb_lint = next(f["message"] for f in json.loads(steptail("lint", str(tmp_path / "cp4-lb.yaml"), "--policy",
                                                             str(SIM_POLICY), "-o", "json").stdout)["jobsets"][0]["findings"])
    assert lb_lint.startswith("ici_context_parallelism=4 with context_parallel_load_balance=True: the runbook forbids")
    assert lb_lint.endswith("; set context_parallel_load_balance=False")

    def critical(run: str) -> list[tuple]:
        return query(db_url, "SELECT kind, incarnation, detail FROM findings WHERE run = :run"
                             " AND severity = 'critical'", run=run)

    [(kind, inc, detail)] = critical("cp4-lb")
    assert (kind, inc) == ("rule:load_balance", 1)
    assert detail.startswith(lb_lint + " (seen in "), detail
    assert "the config lines of incarnation 1" in detail and "the trainer args of pod cp4-lb-" in detail
    check = steptail("check", "cp4-lb", "--db", db_url, "--json")
    assert check.returncode == 1
    assert [f["detail"] for f in json.loads(check.stdout)["findings"] if f["severity"] == "critical"] == [detail]
    assert critical("cp4-lb") == [(kind, inc, detail)]
    # each incarnation records what it ran on
    (image, image_id, topology, hosts), = query(
        db_url, "SELECT image, image_id, topology, hosts FROM incarnations WHERE run = 'good'")
    assert image == IMAGE and image_id.startswith(IMAGE.split(":")[0] + "@sha256:") and len(image_id) > 70
    assert (topology, hosts) == ("4x4x8", 2)
    # one slice shape per experiment: lint --control reads the control's recorded topology
    same = steptail("lint", str(tmp_path / "good.yaml"), "--control", "good", "--db", db_url,
                    "--policy", str(SIM_POLICY), "-o", "json")
    assert same.returncode == 0, same.stdout + same.stderr
    other = steptail("lint", str(tmp_path / "own-topology.yaml"), "--control", "good", "--db", db_url,
                     "--policy", str(SIM_POLICY), "-o", "json")
    flagged = {f["rule"]: f["message"] for j in json.loads(other.stdout)["jobsets"] for f in j["findings"]}
    assert other.returncode == 1 and "slice_shape" in flagged, other.stdout
    assert "differs from the control good's 4x4x8 x 2 hosts" in flagged["slice_shape"]


def test_a_resume_on_another_image_is_a_finding_of_that_incarnation(make_simcluster, db_url, tmp_path):  # noqa: F811
    # held at step 30 until the test restarts it: on a loaded machine (CI, 2026-12-06) the 120
    # steps were done before the restart came, and only incarnation 1 was stored
    sim = make_simcluster(base(rate=20, grace_seconds=4, jobsets=[js("olmo3-sft", trainer={"steps": 120})],
                               faults=[{"at_step": 30, "action": "stall", "seconds": 600}]))
    proc = follow_started(sim, db_url, "--until-done", "--raw", str(tmp_path / "raw"))
    sim.wait_step(30)  # the stall fired (once): the resumed steps below 30 do not stall again
    sim.set_image("olmo3-sft", image=OTHER_IMAGE)  # the restart's pods run another image
    sim.restart_jobset("olmo3-sft")
    sim.stall("olmo3-sft", seconds=0)  # the new pods step again
    ended(proc)
    incs = query(db_url, "SELECT incarnation, image, image_id FROM incarnations WHERE run = 'olmo3-sft'"
                         " ORDER BY incarnation")
    assert [(n, image) for n, image, _ in incs] == [(1, IMAGE), (2, OTHER_IMAGE)]
    assert incs[0][2] != incs[1][2]  # another digest ran
    assert findings(db_url) == {"olmo3-sft": {("rule:restore_fix_image", 2)}}
    (detail,), = query(db_url, "SELECT detail FROM findings WHERE kind = 'rule:restore_fix_image'")
    assert OTHER_IMAGE in detail and "pods/olmo3-sft-" in detail
    # the export's facts carry which image produced which steps
    out = tmp_path / "bundle"
    assert steptail("export", "olmo3-sft", "--db", db_url, "--out", str(out)).returncode == 0
    facts = json.loads((out / "manifest.json").read_text())
    assert [(i["incarnation"], i["image"]) for i in facts["incarnations"]] == [(1, IMAGE), (2, OTHER_IMAGE)]
    # a rebuild from the raw log keeps what only the cluster said
    assert steptail("reparse", "olmo3-sft", "--db", db_url, "--raw", str(tmp_path / "raw"),
                    "--replace").returncode in (0, 1)
    assert [(n, image) for n, image, _ in query(
        db_url, "SELECT incarnation, image, image_id FROM incarnations WHERE run = 'olmo3-sft'"
                " ORDER BY incarnation")] == [(1, IMAGE), (2, OTHER_IMAGE)]


def test_a_suspended_jobset_still_admitted_is_a_finding(make_simcluster, db_url):  # noqa: F811
    # held at step 30 while the test suspends it, as the resume test above (120 steps can be
    # done before a loaded machine's test acts)
    sim = make_simcluster(base(rate=20, jobsets=[js("olmo3-sft", trainer={"steps": 120}),
                                                 js("other", trainer={"steps": 120})],
                               faults=[{"at_step": 30, "action": "stall", "seconds": 600, "jobset": "olmo3-sft"}]))
    proc = follow_started(sim, db_url, "--until-done")
    sim.wait_step(30, "olmo3-sft")
    sim.suspend("olmo3-sft")  # admitted: Kueue keeps it running, nothing stops
    sim.stall("olmo3-sft", seconds=0)
    err = ended(proc)
    assert findings(db_url) == {"olmo3-sft": {("rule:suspend", 0)}}, err
    (detail,), = query(db_url, "SELECT detail FROM findings WHERE kind = 'rule:suspend'")
    assert "still admitted and active" in detail and "workloads.kueue.x-k8s.io" in detail
    assert query(db_url, "SELECT COUNT(*) FROM loss_parts WHERE run = 'olmo3-sft'") == [(120,)]


def test_two_big_slices_started_close_together_flag_the_later_one(make_simcluster, db_url, tmp_path):  # noqa: F811
    policy = tmp_path / "policy.yaml"
    policy.write_text("settings:\n  stagger: {hosts: 2, seconds: 600}\n")  # these JobSets count as big
    # first still runs when second starts (follow --all --until-done ends once all it found are done)
    sim = make_simcluster(base(jobsets=[js("first", trainer={"steps": 400}), js("second", start_after=3)]))
    follow(sim, db_url, "--until-done", "--policy", str(policy))
    assert findings(db_url) == {"second": {("rule:stagger", 0)}}
    (detail,), = query(db_url, "SELECT detail FROM findings WHERE kind = 'rule:stagger'")
    assert "after big-slice JobSet first" in detail


def _reaped(sim, jobset: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if sim.process0(jobset) is None:
                break
        except Exception:  # noqa: BLE001 - the JobSet is gone
            break
        time.sleep(0.2)
    time.sleep(2)  # follow sees the DELETED events


def test_a_failed_jobset_is_archived_before_it_is_reaped(make_simcluster, db_url, tmp_path):  # noqa: F811
    sim = make_simcluster(base(rate=20, jobsets=[js("olmo3-sft", trainer={"steps": 600})]))
    archive = tmp_path / "archive"
    proc = follow_started(sim, db_url, "--archive", str(archive))
    sim.fail_jobset("olmo3-sft", reap_after=4)
    _reaped(sim, "olmo3-sft")
    err = ended(proc, stop=True)
    manifest = json.loads((archive / "olmo3-sft" / "manifest.json").read_text())
    assert manifest["jobset"] == "olmo3-sft" and manifest["files"], manifest
    files = manifest["files"].values() if isinstance(manifest["files"], dict) else manifest["files"]
    assert all((archive / "olmo3-sft" / f["path"]).exists() for f in files)
    assert query(db_url, "SELECT kind FROM run_files WHERE run = 'olmo3-sft'") == [("archive_manifest",)]
    assert findings(db_url) == {}, err  # saved: nothing to flag once it is deleted
    assert "archived failed JobSet olmo3-sft" in err


def test_a_failed_jobset_deleted_with_its_logs_unsaved_is_a_finding(make_simcluster, db_url):  # noqa: F811
    sim = make_simcluster(base(rate=20, jobsets=[js("olmo3-sft", trainer={"steps": 600})]))
    proc = follow_started(sim, db_url)
    sim.fail_jobset("olmo3-sft", reap_after=3)
    _reaped(sim, "olmo3-sft")
    err = ended(proc, stop=True)
    assert findings(db_url) == {"olmo3-sft": {("logs_not_saved", 0)}}, err
    assert "JobSet olmo3-sft failed; save its pod logs before deleting it" in err


def test_follow_without_the_jobset_rbac_says_so_once_and_follows(make_simcluster, tmp_path):  # noqa: F811
    sim = make_simcluster(base(jobsets=[js("olmo3-sft")]))
    sim.fail_next(10_000, 403, "/jobsets")  # as a Role without jobsets answers: Forbidden
    db = f"sqlite:///{tmp_path / 's.db'}"
    proc = follow(sim, db, "--until-done")
    lines = [ln for ln in proc.stderr.splitlines() if "jobsets failing" in ln]
    assert len(lines) == 1 and "forbidden" in lines[0], proc.stderr
    assert query(db, "SELECT COUNT(*) FROM loss_parts WHERE run = 'olmo3-sft'") == [(60,)]
    assert Path(tmp_path / "s.db").exists()
    # the rules could not be evaluated: one info finding naming what is missing, never a breach
    [(kind, severity, detail)] = query(db, "SELECT kind, severity, detail FROM findings WHERE run = 'olmo3-sft'")
    assert (kind, severity) == ("rule:runbook", "info")
    assert detail.startswith("not evaluable: the JobSet (the collector cannot list jobsets: forbidden) missing")
    assert steptail("check", "olmo3-sft", "--db", db).returncode == 0  # info alone: nothing to do


def test_a_jobset_the_views_cannot_read_is_one_line_per_change_never_a_crash(caplog):
    """What the API sends is input: a JobSet of the wrong shape costs its rules, said once per
    change of the object, and the other JobSets are still checked."""
    import asyncio
    from types import SimpleNamespace

    from steptail.collector.cluster.jobsets import ClusterObjects
    from steptail.collector.live.runbook_live import RunbookLive, RunTarget
    from steptail.commands.lint import policy_from

    got = []
    bad = {"metadata": {"name": "bad", "resourceVersion": "1"}, "spec": {"replicatedJobs": [
        {"name": "slice", "template": {"spec": {"template": {"spec": "not a mapping"}}}}]}}
    hero = {"metadata": {"name": "hero", "resourceVersion": "1", "labels": {"kueue.x-k8s.io/queue-name": "hero"}},
            "spec": {"replicatedJobs": [{"name": "slice", "template": {"spec": {"template": {"spec": {
                "containers": [{"name": "jax-tpu", "image": IMAGE}]}}}}}]}}
    objects = ClusterObjects(target=None)
    objects.jobsets.update(bad=bad, hero=hero)
    objects.listed = {"jobsets": True, "workloads": True}
    detectors = SimpleNamespace(cluster_findings=got.extend)
    targets = {name: RunTarget(name, name, detectors, None) for name in ("bad", "hero")}
    discovery = SimpleNamespace(pods={}, process0=lambda j: [])

    async def passes():
        live = RunbookLive(policy_from(None), objects, discovery, lambda: targets, store=None)
        live.check_all()
        live.check_all()  # nothing changed: not said again
        bad["metadata"]["resourceVersion"] = "2"
        live.check_all()  # changed, still unreadable: said again

    with caplog.at_level("WARNING", logger="steptail.follow"):
        asyncio.run(passes())
    said = [r.getMessage() for r in caplog.records if "runbook rules not checked on JobSet bad" in r.getMessage()]
    assert len(said) == 2, said
    assert [(f.run, f.kind) for f in got] == [("hero", "rule:queue")]


# -- one cause, one finding: the engine joins the evidences (no cluster needed) ------------------

LB_TEXT = ("ici_context_parallelism=4 with context_parallel_load_balance=True: the runbook forbids load balancing "
           "with context parallelism (it moved step-1 CE by +0.39 at cp4 and +1.98 at cp8); "
           "set context_parallel_load_balance=False")
CONFIG_SEEN = "the config lines of incarnation 1"
POD_SEEN = "the trainer args of pod qwen3-cp4-slice-0-0-abcde"


def _config_batch():
    from steptail.runs.model import Batch

    b = Batch()
    b.config = [("qwen3-cp4", 1, "ici_context_parallelism", "4"), ("qwen3-cp4", 1, "context_parallel_load_balance", "True")]
    return b


def _seen(inc: int, where: str, severity: str = "critical", text: str = LB_TEXT):
    from steptail.runs.findings import Finding
    from steptail.runs.rule_text import cite

    return Finding("rule:load_balance", "qwen3-cp4", inc, -1, -1, cite(text, [where]), severity, 1)


def test_the_load_balance_rule_seen_in_the_config_and_the_args_is_one_finding_either_way():
    from steptail.runs.detectors import FindingEngine

    # the config lines first, then follow's look at the process-0 pod
    engine = FindingEngine("qwen3-cp4")
    [first] = engine.observe(_config_batch())
    assert first.detail == f"{LB_TEXT} (seen in {CONFIG_SEEN})"
    [joined] = engine.observe_cluster([_seen(1, POD_SEEN)])
    assert joined.key == first.key and joined.detail == f"{LB_TEXT} (seen in {CONFIG_SEEN} and in {POD_SEEN})"
    assert engine.observe_cluster([_seen(1, POD_SEEN)]) == []  # seen there already: nothing new
    assert [f.key for f in engine.findings.values()] == [first.key]
    # the pod first: the config lines join it
    engine = FindingEngine("qwen3-cp4")
    engine.observe_cluster([_seen(1, POD_SEEN)])
    [joined] = engine.observe(_config_batch())
    assert joined.detail == f"{LB_TEXT} (seen in {POD_SEEN} and in {CONFIG_SEEN})"
    assert len(engine.findings) == 1
    # the JobSet as submitted (incarnation 0, before its pods ran): the config lines join it too
    engine = FindingEngine("qwen3-cp4")
    engine.observe_cluster([_seen(0, "the JobSet's trainer args (spec.replicatedJobs[0]…args)")])
    [joined] = engine.observe(_config_batch())
    assert joined.incarnation == 0 and len(engine.findings) == 1 and CONFIG_SEEN in joined.detail


def test_not_evaluable_never_replaces_the_verdict_and_gives_way_to_one():
    from steptail.runs.detectors import FindingEngine

    missing = "not evaluable: the trainer container missing"
    engine = FindingEngine("qwen3-cp4")
    engine.observe(_config_batch())
    assert engine.observe_cluster([_seen(1, POD_SEEN, "info", missing)]) == []
    [f] = engine.findings.values()
    assert f.severity == "critical" and missing not in f.detail
    engine = FindingEngine("qwen3-cp4")
    engine.observe_cluster([_seen(1, POD_SEEN, "info", missing)])
    [f] = engine.observe(_config_batch())
    assert (f.severity, f.detail) == ("critical", f"{LB_TEXT} (seen in {CONFIG_SEEN})")


def test_a_check_from_the_config_lines_keeps_the_stored_args_evidence():
    """`check` replays the stored rows into an engine that remembers the stored finding: the
    JobSet's evidence, which the log cannot give again, stays cited and nothing changes."""
    from steptail.runs.detectors import FindingEngine

    stored = _seen(1, POD_SEEN)
    stored.detail = f"{LB_TEXT} (seen in {CONFIG_SEEN} and in {POD_SEEN})"
    engine = FindingEngine("qwen3-cp4")
    engine.remember([stored])
    assert engine.observe(_config_batch()) == []
    assert [f.detail for f in engine.findings.values()] == [stored.detail]


def test_a_live_jobset_without_an_image_is_not_evaluable_never_a_breach():
    import asyncio
    from types import SimpleNamespace

    from steptail.collector.cluster.jobsets import ClusterObjects
    from steptail.collector.live.runbook_live import RunbookLive, RunTarget
    from steptail.commands.lint import policy_from

    got = []
    no_image = {"metadata": {"name": "no-image", "resourceVersion": "1",
                             "labels": {"kueue.x-k8s.io/queue-name": "post-training"}},
                "spec": {"replicatedJobs": [{"name": "slice", "template": {"spec": {"template": {"spec": {
                    "nodeSelector": {"cloud.google.com/gke-tpu-topology": "4x4x8",
                                     "cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice"},
                    "containers": [{"name": "jax-tpu", "resources": {"limits": {"google.com/tpu": "4"}}}]}}}}}]}}
    objects = ClusterObjects(target=None)
    objects.jobsets.update({"no-image": no_image})
    objects.listed = {"jobsets": True, "workloads": True}
    targets = {"no-image": RunTarget("no-image", "no-image", SimpleNamespace(cluster_findings=got.extend), None)}
    discovery = SimpleNamespace(pods={}, process0=lambda j: [])

    async def one_pass():
        RunbookLive(policy_from(None), objects, discovery, lambda: targets, store=None).check_all()

    asyncio.run(one_pass())
    assert [(f.kind, f.severity) for f in got] == [("rule:restore_fix_image", "info")]
    assert got[0].detail.startswith("not evaluable: the trainer container's image missing")
