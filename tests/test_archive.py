"""`steptail archive` against the simulated cluster with the real kubectl: every line the
simulator holds is in the archive, checksums verify, a second run is a no-op, a pod deleted
mid-archive is reported, process 0 lands in the store (and adds nothing to a followed run)."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from test_follow_support import follow_sim, recorded, scenario

import steptail
from steptail.storage.db import open_store

pytestmark = pytest.mark.timeout(90)
CLI = [sys.executable, "-c", "from steptail.cli import main; main()"]
JOBSET = "olmo3-sft"

# 2 slices x 2 hosts; process 0's container restarts at step 40, the JobSet at step 120: the
# old pods are Failed and being deleted (60 s grace) while the new ones stay Pending (60 s).
MID_RESTART = {
    "rate": 50, "grace_seconds": 60, "restart_pending_seconds": 60,
    "jobsets": [{"name": JOBSET, "slices": 2, "hosts": 2, "trainer": {"steps": 300, "checkpoint_period": 50}}],
    "faults": [{"at_step": 40, "action": "restart_container"}, {"at_step": 120, "action": "restart_jobset"}],
}


def archive(sim, out: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "archive", "--jobset", JOBSET, "--out", str(out), *args],
                          env=env or sim.env(), capture_output=True, text=True, timeout=60)


def sim_pods(sim) -> dict:
    with sim.lock:
        return {name: p for (_ns, name), p in sim.pods.items() if p.jobset == JOBSET}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def no_temporary_files(folder: Path) -> bool:
    return not [p for p in folder.rglob("*") if ".part-" in p.name]


def test_archive_mid_restart_holds_every_line_verifies_and_resumes_as_a_no_op(make_simcluster, tmp_path, db_url):
    sim = make_simcluster(MID_RESTART)
    sim.wait_step(120, timeout=30)  # the restart fault fires in the same tick as step 120
    pods = sim_pods(sim)
    old = [p for p in pods.values() if p.deletion_ns is not None]
    assert len(pods) == 8 and len(old) == 4 and all(p.phase == "Failed" for p in old)
    out = tmp_path / "archive"
    first = archive(sim, out, "--db", db_url, "-o", "json")
    assert first.returncode == 0, first.stderr
    summary = json.loads(first.stdout)
    folder = out / JOBSET
    manifest = json.loads((folder / "manifest.json").read_text())
    assert (manifest["jobset"], manifest["namespace"], manifest["steptail_version"]) == \
        (JOBSET, "default", steptail.__version__)
    assert manifest["errors"] == [] and summary["errors"] == []

    # pods: every one listed, as the API shows it
    listed = {p["name"]: p for p in manifest["pods"]}
    assert set(listed) == set(pods)
    for name, p in pods.items():
        m = listed[name]
        assert (m["uid"], m["node"], m["phase"]) == (p.uid, p.node, p.phase)
        assert (m["job_index"], m["completion_index"], m["restart_attempt"]) == (
            int(p.labels["jobset.sigs.k8s.io/job-index"]),
            int(p.labels["batch.kubernetes.io/job-completion-index"]),
            int(p.labels["jobset.sigs.k8s.io/restart-attempt"]))
        assert (m["deletion_timestamp"] is not None) == (p.deletion_ns is not None)
        assert m["containers"][0]["restart_count"] == p.current.restart_count

    # files: every line the simulator holds, current and previous; checksums and counts verify
    files = {f["path"]: f for f in manifest["files"]}
    expected = {}
    for name, p in pods.items():
        if p.current.state != "waiting":
            expected[f"{name}/jax-tpu.log.gz"] = sim.log_lines(name)
        if p.previous is not None:
            expected[f"{name}/jax-tpu.previous.log.gz"] = sim.log_lines(name, previous=True)
    assert set(files) == set(expected) and len(expected) == 5  # 4 old pods, process 0's previous too
    for path, lines in expected.items():
        f, gz = files[path], folder / path
        text = gzip.decompress(gz.read_bytes()).decode()
        assert text == "".join(f"{ts} {line}\n" for ts, line in lines), path
        assert f["sha256"] == sha256(gz) and f["bytes_compressed"] == gz.stat().st_size
        assert (f["bytes"], f["lines"]) == (len(text.encode()), len(lines))
        assert (f["first_timestamp"], f["last_timestamp"]) == (lines[0][0], lines[-1][0])
        assert f["final"] is True  # terminated containers only: the new pods never started
    assert no_temporary_files(folder)

    # process 0 (both containers of attempt 0) into the store: the steps the trainer wrote
    truth = {(t.incarnation, t.step) for t in sim.truth()}
    assert len(truth) == 40 + 120
    got = recorded(db_url, JOBSET)
    assert len(got) == len(set(got)) and set(got) == truth
    assert summary["ingest"]["loss_parts"] == 160
    store = open_store(db_url)
    try:
        with store.engine.connect() as c:
            row = c.execute(sa.text("SELECT path, sha256, bytes FROM run_files WHERE run = :r AND kind = "
                                    "'archive_manifest'"), {"r": JOBSET}).one()
            source = c.execute(sa.text("SELECT source FROM run_sources WHERE run = :r"), {"r": JOBSET}).scalars().all()
    finally:
        store.dispose()
    assert row == (str((folder / "manifest.json").resolve()), sha256(folder / "manifest.json"),
                   (folder / "manifest.json").stat().st_size)
    assert source == [f"kubernetes:default/{JOBSET}"]

    # a second run: nothing read, nothing rewritten, nothing added
    stamps = {p: (folder / p).stat().st_mtime_ns for p in files}
    again = archive(sim, out, "--db", db_url, "-o", "json")
    assert again.returncode == 0, again.stderr
    s2 = json.loads(again.stdout)
    assert (s2["read"], s2["written"], s2["skipped"], s2["errors"]) == (0, 0, 5, [])
    assert s2["ingest"]["loss_parts"] == 0
    assert {p: (folder / p).stat().st_mtime_ns for p in files} == stamps
    assert {f["path"]: f["sha256"] for f in json.loads((folder / "manifest.json").read_text())["files"]} == \
        {p: f["sha256"] for p, f in files.items()}
    assert sorted(recorded(db_url, JOBSET)) == sorted(got)
    human = archive(sim, out, "--db", db_url)
    assert human.returncode == 0 and "5 files already archived and verified, 0 read" in human.stdout


def test_a_pod_deleted_mid_archive_is_reported_and_nothing_half_written(make_simcluster, tmp_path):
    sim = make_simcluster(scenario())
    sim.wait_done()
    pods = sorted(sim_pods(sim))  # the archive reads them in this order (one restart attempt)
    victim = pods[-1]
    out = tmp_path / "archive"
    proc = subprocess.Popen([*CLI, "archive", "--jobset", JOBSET, "--out", str(out), "--parallel", "1",
                             "--no-ingest"], env=sim.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def delete_after_first_read() -> None:  # one log at a time: the last pod is still to come
        while proc.poll() is None and not sim.log_reads:
            time.sleep(0.002)
        assert victim not in {r.pod for r in sim.log_reads}
        sim.delete_pod(victim)

    deleter = threading.Thread(target=delete_after_first_read)
    deleter.start()
    stdout, stderr = proc.communicate(timeout=60)
    deleter.join()
    assert proc.returncode == 1, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("steptail: error: could not read 1 log of 1 pod: ") and last.endswith(
        "(the manifest lists them; run again to retry)") and victim in last
    assert any(ln.startswith(f"steptail: warning: {victim}: jax-tpu: ") and "not found" in ln
               for ln in stderr.splitlines())
    folder = out / JOBSET
    manifest = json.loads((folder / "manifest.json").read_text())
    assert [(e["pod"], e["kind"]) for e in manifest["errors"]] == [(victim, "not_found")]
    assert sorted(f["pod"] for f in manifest["files"]) == pods[:-1]
    assert not (folder / victim).exists() or not list((folder / victim).iterdir())
    assert no_temporary_files(folder)
    # the pod is gone for good: a later run still says its log is missing
    again = archive(sim, out, "--no-ingest")
    assert again.returncode == 1 and victim in again.stderr.strip().splitlines()[-1]


def test_archive_of_a_followed_jobset_adds_nothing_and_another_source_is_refused(make_simcluster, tmp_path,
                                                                                 samples):
    db = str(tmp_path / "s.db")
    sim = make_simcluster(scenario({"action": "restart_container", "at_step": 70}))
    follow_sim(sim, db, {JOBSET: "r"})
    followed = sorted(recorded(db, "r"))
    assert len(followed) == 70 + 110 == len(sim.truth())  # 1..70, then 51..160 after the restart
    out = tmp_path / "archive"
    done = archive(sim, out, "--db", db, "--run", "r", "-o", "json")
    assert done.returncode == 0, done.stderr
    ingest = json.loads(done.stdout)["ingest"]
    assert ingest["loss_parts"] == 0 and ingest["duplicates"] > 0
    assert sorted(recorded(db, "r")) == followed

    files = subprocess.run([*CLI, "ingest", str(samples / "clean-300.log"), "--run", "saved", "--db", db],
                           capture_output=True, text=True)
    assert files.returncode == 0, files.stderr
    refused = archive(sim, out, "--db", db, "--run", "saved")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert refused.stderr.startswith('steptail: error: run "saved" holds data ingested from files; following '
                                     f"kubernetes:default/{JOBSET} would append to it")
    assert archive(sim, out, "--db", db, "--run", "saved", "--append").returncode == 0


@pytest.mark.parametrize("case", ["account", "kubeconfig", "context", "parallel", "no-pods", "unreachable",
                                  "no-ingest-run"])
def test_bad_options_exit_2_with_one_line(simcluster, tmp_path, case):
    sim, out = simcluster, tmp_path / "archive"
    env, args = sim.env(), []
    if case == "account":
        env = sim.env(account=False)
    elif case == "kubeconfig":
        args = ["--kubeconfig", str(tmp_path / "missing")]
    elif case == "context":
        args = ["--context", "nope"]
    elif case == "parallel":
        args = ["--parallel", "0"]
    elif case == "no-pods":
        args = ["-n", "elsewhere"]
    elif case == "unreachable":
        kc = tmp_path / "kc"
        kc.write_text(sim.kubeconfig_path.read_text().replace(sim.server_url, "https://127.0.0.1:9"))
        args = ["--kubeconfig", str(kc)]
    elif case == "no-ingest-run":
        args = ["--no-ingest", "--run", "x"]
    proc = archive(sim, out, "--db", str(tmp_path / "s.db"), *args, env=env)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("steptail: error: "), lines
    assert not (out / JOBSET).exists() or not os.listdir(out / JOBSET)
