"""What the cluster sends is input too (issue 20): `follow` against a hostile API server
(simcluster/hostile.py), with the real kubectl and kubernetes client and both stores.

Each case says what is refused, what is logged, what is kept, and that nothing is written
outside its directory: every file under the test's tmp dir is where it belongs, and the
paths a hostile name points at do not exist."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from test_follow_support import FAST, assert_exactly_once, rows

from steptail.storage.paths import UnsafePath, inside, relative_inside

pytestmark = pytest.mark.timeout(240)
CLI = [sys.executable, "-c", "from steptail.cli import main; main()"]
TRAINER = {"hosts": 1, "trainer": {"steps": 60, "checkpoint_period": 50}}
TABLES = ("loss_parts", "required_rbf", "pod_metrics", "incarnations", "cursors", "findings", "run_sources",
          "stream_gaps")


def follow(sim, db: str, *extra: str, timeout: float = 150) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("STEPTAIL_DB", "CLOUDSDK_CORE_ACCOUNT")}
    env["CLOUDSDK_CORE_ACCOUNT"] = sim.account
    return subprocess.run([*CLI, "follow", "-n", "default", "--kubeconfig", str(sim.kubeconfig_path), "--db", db,
                           "--silence", "1", "--no-view", "--json", *extra],
                          capture_output=True, text=True, env=env, timeout=timeout)


def follow_until(sim, db: str, done, *extra: str, timeout: float = 150) -> subprocess.CompletedProcess:
    """`follow` as above, stopped with SIGTERM (its clean stop) as soon as `done(stderr so far)`."""
    env = {k: v for k, v in os.environ.items() if k not in ("STEPTAIL_DB", "CLOUDSDK_CORE_ACCOUNT")}
    env["CLOUDSDK_CORE_ACCOUNT"] = sim.account
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([*CLI, "follow", "-n", "default", "--kubeconfig", str(sim.kubeconfig_path), "--db", db,
                                 "--silence", "1", "--no-view", "--json", *extra],
                                stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        try:
            deadline = time.monotonic() + timeout
            while proc.poll() is None and time.monotonic() < deadline:
                err.seek(0)
                if done(err.read()):
                    proc.send_signal(signal.SIGTERM)
                    break
                time.sleep(0.2)
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        err.seek(0)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err.read())


def steps_stored(db: str, run: str) -> int:
    try:
        return rows(db, "SELECT COUNT(*) FROM loss_parts WHERE run = :r", run)[0][0]
    except Exception:  # noqa: BLE001 - the store is created by follow: not yet there
        return 0


def runs_stored(db: str) -> set[str]:
    """Every run name any table holds: a refused name must be in none."""
    names = {r[0] for r in rows(db, "SELECT run FROM runs WHERE :r = :r", "")}
    for t in TABLES:
        names |= {r[0] for r in rows(db, f"SELECT DISTINCT run FROM {t} WHERE :r = :r", "")}
    return names


def files_under(root: Path) -> list[Path]:
    return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file() or p.is_symlink())


def assert_only_in_run_dirs(tmp: Path, runs: set[str]) -> None:
    """Under raw/ only <run>/…, under pq/ only <table>/run=<run>/…, nothing else beside them but
    the simulator's and SQLite's own files."""
    for rel in files_under(tmp):
        top = rel.parts[0]
        if top == "raw":
            assert rel.parts[1] in runs and len(rel.parts) == 4, rel
        elif top == "pq":
            assert rel.parts[2].removeprefix("run=") in runs and len(rel.parts) == 4, rel
        else:
            assert top.startswith(("sim", "steptail.db", "arch")), f"file outside its directory: {rel}"


def test_paths_helper_refuses_every_way_out(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "link").symlink_to(tmp_path)
    for bad in ("..", ".", "", "a/b", "../x", "a\0b", "x" * 256, "link"):  # link: a symlink out of the root
        with pytest.raises(UnsafePath):
            inside(root, bad)
    for bad in ("/etc/passwd", "a/../../x", "../x", "link/x"):
        with pytest.raises(UnsafePath):
            relative_inside(root, bad)
    assert inside(root, "ok", "x" * 255) == root.absolute() / "ok" / ("x" * 255)
    assert relative_inside(root, "pod/c.log.gz") == root.absolute() / "pod" / "c.log.gz"


HOSTILE_LABELS = {  # real JobSet -> the jobset-name label the API serves for its pods
    "js-traversal": f"../../../../tmp/x-{uuid.uuid4().hex[:8]}",
    "js-space": "a b",
    "js-semicolon": "semi;colon",
    "js-unicode": "ünï",
    "js-long": "x" * 300,
}
HOSTILE_PODS = {  # real JobSet -> the pod / container name served for its pod
    "js-podname": {"pod": "--kubeconfig=/tmp/evil"},
    "js-container": {"container": "../" + "c" * 300},
}


def test_follow_all_refuses_unsafe_names_from_the_api(make_simcluster, db_url, tmp_path):
    jobsets = ["olmo3-sft", *HOSTILE_LABELS, *HOSTILE_PODS]
    sim = make_simcluster({**FAST, "jobsets": [{"name": j, **TRAINER} for j in jobsets]})
    sim.api.hostile.relabel = dict(HOSTILE_LABELS)
    sim.api.hostile.rename = dict(HOSTILE_PODS)
    raw, pq = tmp_path / "raw", tmp_path / "pq"
    proc = follow(sim, db_url, "--all", "--until-done", "--raw", str(raw), "--parquet", str(pq))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)

    # kept: the honest JobSet, every step once; refused: the others, never a run
    assert [(r["run"], r["state"]) for r in report["runs"]] == [("olmo3-sft", "done")]
    assert len(assert_exactly_once(sim, db_url, "olmo3-sft")["got"]) == 60
    assert runs_stored(db_url) == {"olmo3-sft"}
    refused = report["discovery"]["refused"]
    assert report["discovery"]["refused_count"] == len(refused) == 7, refused
    assert all("is not a safe identifier" in r["reason"] for r in refused)
    keys = " ".join(r["name"] for r in refused)
    for label in HOSTILE_LABELS.values():
        assert repr(label[:80]) in keys
    assert "pod '--kubeconfig=/tmp/evil'" in keys and "container '../cccc" in keys

    # logged: one line per refused name (and its finding, collector-level), no traceback
    lines = [ln for ln in proc.stderr.splitlines() if "pod discovery: refused" in ln]
    assert len(lines) == 7, proc.stderr
    assert all(len(ln) < 1000 for ln in lines)
    findings = [ln for ln in proc.stderr.splitlines() if " steptail.alerts kind=unsafe_name " in ln]
    assert len(findings) == 7 and not any(" run=" in ln for ln in findings)  # the collector's: run ""
    assert "Traceback" not in proc.stderr and "store outage" not in proc.stderr

    # nothing written outside its directory
    assert_only_in_run_dirs(tmp_path, {"olmo3-sft"})
    for label in HOSTILE_LABELS.values():
        assert not os.path.lexists(os.path.normpath(raw / label))
        assert not os.path.lexists(os.path.normpath(pq / "loss_parts" / f"run={label}"))
    assert not (Path("/tmp") / HOSTILE_LABELS["js-traversal"].rsplit("/", 1)[1]).exists()


def test_a_flood_of_pods_costs_a_log_line_not_the_collector(make_simcluster, db_url, tmp_path):
    sim = make_simcluster({**FAST, "jobsets": [{"name": "olmo3-sft", **TRAINER}]})
    sim.api.hostile.flood = 20_000  # one Pending pod per JobSet, each of its own JobSet
    # stopped (SIGTERM: the clean stop --duration makes too) once all it is asked about has
    # happened: a whole pod list read, the over-the-bound line said, the real run's steps stored;
    # --duration 40 still bounds it
    proc = follow_until(sim, db_url, lambda err: sim.api.hostile.pages >= 41 and "--max-runs=5" in err
                        and steps_stored(db_url, "olmo3-sft") >= 60,
                        "--all", "--max-runs", "5", "--duration", "40", "--raw", str(tmp_path / "raw"))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)

    # bounded: 5 runs followed (the real one first in the list), the rest counted, not followed
    assert len(report["runs"]) == 5 and report["runs"][0]["run"] == "olmo3-sft"
    assert report["discovery"]["over_max_runs"] == 20_001 - 5
    over = [ln for ln in proc.stderr.splitlines() if "--max-runs=5" in ln]
    assert len(over) == 1, proc.stderr
    # read a page at a time: 20,001 pods in pages of 500, at least once
    assert sim.api.hostile.pages >= 41
    # no run row before a run's first record line: the Pending flood made none
    assert runs_stored(db_url) == {"olmo3-sft"}
    assert len(assert_exactly_once(sim, db_url, "olmo3-sft")["got"]) == 60
    assert "Traceback" not in proc.stderr
    assert_only_in_run_dirs(tmp_path, {"olmo3-sft"})


def test_garbage_answers_to_list_get_and_watch(make_simcluster, db_url, tmp_path):
    sim = make_simcluster({**FAST, "jobsets": [{"name": "olmo3-sft", **TRAINER}]})
    sim.api.hostile.garble = {"list": 2, "watch": 2, "get": 2}
    proc = follow(sim, db_url, "--jobset", "olmo3-sft", "--until-done", "--parquet", str(tmp_path / "pq"))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert sim.api.hostile.garble == {"list": 0, "watch": 0, "get": 0}  # every garbage answer was read

    # kept: every step once; logged: discovery failing (deserialize) once, and once ok again
    assert [(r["run"], r["state"]) for r in report["runs"]] == [("olmo3-sft", "done")]
    assert len(assert_exactly_once(sim, db_url, "olmo3-sft")["got"]) == 60
    d = report["discovery"]
    assert d["errors"].get("deserialize", 0) >= 2, d
    said = [ln for ln in proc.stderr.splitlines() if " discovery failing " in ln or " discovery ok again " in ln]
    failing = [ln for ln in said if "discovery failing (deserialize)" in ln]
    assert 1 <= len(failing) <= 4 and len(said) == 2 * len(failing), proc.stderr  # a line per spell, not per retry
    assert all("cannot read the API's pod objects" in ln for ln in failing)
    assert any("a watch event that is not a pod" in ln for ln in failing), failing
    assert " ok again " in said[-1], said
    assert "Traceback" not in proc.stderr
    assert runs_stored(db_url) == {"olmo3-sft"}
    assert_only_in_run_dirs(tmp_path, {"olmo3-sft"})


def test_a_flood_of_unsafe_names_is_logged_twenty_times_then_counted(make_simcluster, tmp_path):
    sim = make_simcluster({**FAST, "jobsets": [{"name": "olmo3-sft", **TRAINER}]})
    sim.api.hostile.flood, sim.api.hostile.flood_name = 2_000, "../flood {i}"
    db = f"sqlite:///{tmp_path / 'steptail.db'}"  # the store does not matter: nothing of them is stored
    proc = follow(sim, db, "--all", "--until-done", "--raw", str(tmp_path / "raw"))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert [(r["run"], r["state"]) for r in report["runs"]] == [("olmo3-sft", "done")]
    d = report["discovery"]
    assert d["refused_count"] == 2_000 and len(d["refused"]) == 1_000  # the first 1,000 kept for the summary
    refused = [ln for ln in proc.stderr.splitlines() if "pod discovery: refused" in ln]
    assert len(refused) == 20
    assert sum("further ones are counted" in ln for ln in proc.stderr.splitlines()) == 1
    assert sum(' kind=unsafe_name ' in ln for ln in proc.stderr.splitlines()) == 20
    assert runs_stored(db) == {"olmo3-sft"}
    assert_only_in_run_dirs(tmp_path, {"olmo3-sft"})


def test_archive_refuses_pods_whose_names_would_leave_the_folder(make_simcluster, tmp_path):
    sim = make_simcluster({**FAST, "jobsets": [{"name": "olmo3-sft", **TRAINER}, {"name": "js-evil", **TRAINER}]})
    sim.wait_done("olmo3-sft")
    sim.api.hostile.rename = {"js-evil": {"container": "../../../escape"}}
    env = {k: v for k, v in os.environ.items() if k not in ("STEPTAIL_DB", "CLOUDSDK_CORE_ACCOUNT")}
    env["CLOUDSDK_CORE_ACCOUNT"] = sim.account
    out = tmp_path / "arch"

    def archive(jobset: str) -> subprocess.CompletedProcess:
        return subprocess.run([*CLI, "archive", "--jobset", jobset, "-n", "default", "--out", str(out), "--no-ingest",
                               "--kubeconfig", str(sim.kubeconfig_path), "-o", "json"],
                              capture_output=True, text=True, env=env, timeout=120)

    evil = archive("js-evil")
    assert evil.returncode == 1, evil.stderr  # a log not archived: exit 1, one line naming the pod
    doc = json.loads((out / "js-evil" / "manifest.json").read_text())
    assert [e["kind"] for e in doc["errors"]] == ["unsafe_name"]
    assert "container name '../../../escape' is not a safe identifier" in doc["errors"][0]["reason"]
    assert doc["files"] == [] and "Traceback" not in evil.stderr
    ok = archive("olmo3-sft")  # the honest JobSet beside it is archived as ever
    assert ok.returncode == 0, ok.stderr
    assert [p.relative_to(out).parts[0] for p in out.rglob("*") if p.is_file()].count("js-evil") == 1
    assert_only_in_run_dirs(tmp_path, set())  # nothing under raw/ or pq/ and nothing outside arch/
    assert not (tmp_path / "escape").exists() and not (tmp_path.parent / "escape").exists()
