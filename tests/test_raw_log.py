"""The raw process-0 log (issue 14): `follow --raw` keeps every line read in gzip segments,
durable before the rows they make; `reparse` rebuilds a run from them; `export` carries them
and the archive manifest; `ingest` records its sources' sha256. Simulated cluster, real
kubectl, SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from test_follow_support import follow_sim, read, recorded, rows, scenario

from steptail.parsers.fast import line_ts
from steptail.storage.db import open_store
from steptail.storage.raw import RawLog, read_members, read_segment, scan
from steptail.storage.reads import iter_loss_parts

pytestmark = pytest.mark.timeout(150)
CLI = [sys.executable, "-c", "from steptail.cli import main; main()"]
RESTART = scenario({"action": "restart_jobset", "at_step": 130})
# every table a run's lines make, and its stream gaps; compared with the run name left out
TABLES = {
    "loss_parts": "incarnation, step, ts_ns, ce, ce_raw, parts",
    "required_rbf": "incarnation, step, ts_ns, max, per_layer, program",
    "pod_metrics": "incarnation, step, ts_ns, seconds, tflops, tokens_per_s, total_weights, loss, extra",
    "config": "incarnation, name, value",
    "checkpoints": "incarnation, kind, step, ts_ns",
    "incarnations": "incarnation, started_ns, saw_start, first_step, last_step, restored_from, process_index,"
                    " process_count, pod",
    "findings": "kind, incarnation, first_step, last_step, detail, severity",
    "quarantine": "kind, incarnation, step, ts_ns, reason",
    "stream_gaps": "stream, start_ns, end_ns, reason",
}


@pytest.fixture(autouse=True)
def _account_env(monkeypatch):
    monkeypatch.setenv("CLOUDSDK_CORE_ACCOUNT", "placeholder@example.invalid")


def _norm(v):
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True)
    if isinstance(v, str) and v[:1] in "[{":
        return json.dumps(json.loads(v), sort_keys=True)
    return v


def run_tables(db: str, run: str) -> dict[str, list[tuple]]:
    return {t: sorted((tuple(_norm(v) for v in r) for r in rows(db, f"SELECT {cols} FROM {t} WHERE run = :r", run)),
                      key=repr) for t, cols in TABLES.items()}


def raw_lines(root: Path, run: str) -> list[bytes]:
    return [line for s in scan(root, run) for seg in s.segments
            for line in read_segment(seg)[0].splitlines()]


def loss_lines(lines: list[bytes]) -> set[tuple[int, int]]:
    """(step, kubelet ts) of the LOSS-PARTS lines."""
    return {(int(m.split(b"step=")[1].split()[0]), line_ts(m)) for m in lines if b"LOSS-PARTS step=" in m}


def test_follow_raw_keeps_every_committed_line_and_reparse_equals_the_run(make_simcluster, tmp_path, db_url):
    from steptail.collector.offline.reparse import reparse
    from steptail.storage.durable import file_sha256

    sim = make_simcluster(RESTART)
    raw = tmp_path / "raw"
    follow_sim(sim, db_url, raw=str(raw))
    got = recorded(db_url, "r")
    assert len(got) == 190
    # every committed LOSS-PARTS row's line is in a segment, as kubectl printed it (timestamped)
    lines = raw_lines(raw, "r")
    have = loss_lines(lines)
    for step, ts in [(s, ts) for _, s, ts, *_ in read(db_url, iter_loss_parts, "r")]:
        assert (step, ts) in have, f"step {step} committed without its line"
    assert all(line_ts(m) is not None for m in lines)  # each as kubectl printed it: timestamped
    assert len(lines) > len(have)  # every line read, not only the records
    # the segments are recorded, closed at shutdown, with their sha256, bytes and lines
    files = rows(db_url, "SELECT path, sha256, bytes, lines FROM run_files WHERE run = :r AND kind = 'raw_segment'",
                 "r")
    assert len(files) == 2  # one stream per pod: the JobSet restarted once
    for path, sha, nbytes, nlines in files:
        assert sha == file_sha256(path)
        data, cut = read_segment(path)
        assert not cut and len(data) == nbytes and data.count(b"\n") == nlines

    store, ticks = open_store(db_url), []
    try:
        result = reparse(store, "r", raw, progress=lambda done, total: ticks.append((done, total)))
    finally:
        store.dispose()
    assert run_tables(db_url, "r-reparse") == run_tables(db_url, "r")
    doc = result.document()
    assert not doc["changed"] and doc["changes"]["loss_parts"]["after"] == 190
    # progress: bytes of the joined segments read, rising to all of them
    total = ticks[-1][1]
    assert total > 0 and ticks[-1][0] == total and {t for _, t in ticks} == {total}
    assert [d for d, _ in ticks] == sorted(d for d, _ in ticks)
    assert sorted(recorded(db_url, "r-reparse")) == sorted(got)


def test_a_changed_parser_shows_in_the_report_and_replace_is_one_transaction(make_simcluster, tmp_path,
                                                                              monkeypatch, db_url):
    from steptail.collector.offline import ingest as ingest_mod
    from steptail.collector.offline.reparse import reparse
    from steptail.parsers import block, fast

    sim = make_simcluster(RESTART)
    raw = tmp_path / "raw"
    follow_sim(sim, db_url, raw=str(raw))
    before = run_tables(db_url, "r")

    # a parser that reads ce= differently (doubled): the steady path in Python, patched
    orig = fast.loss_row

    def doubled(ts, step, ce_raw, tail):
        row = orig(ts, step, ce_raw, tail)
        return None if row is None else (row[0], row[1], row[2] * 2, row[3], row[4])

    monkeypatch.setattr(block, "_native", None)
    monkeypatch.setattr(block, "loss_row", doubled)
    monkeypatch.setattr(fast, "loss_row", doubled)
    store = open_store(db_url)
    try:
        # --replace that fails half-way (the second stream's bookkeeping): nothing changed
        calls = []
        real = ingest_mod.record_ingest

        def failing(*args):
            calls.append(1)
            if len(calls) == 2:
                raise RuntimeError("injected failure")
            return real(*args)

        monkeypatch.setattr(ingest_mod, "record_ingest", failing)
        with pytest.raises(RuntimeError, match="injected"):
            reparse(store, "r", raw, replace=True)
        assert len(calls) == 2
        assert run_tables(db_url, "r") == before
        monkeypatch.setattr(ingest_mod, "record_ingest", real)

        result = reparse(store, "r", raw, replace=True)
    finally:
        store.dispose()
    lp = result.document()["changes"]["loss_parts"]
    assert lp["changed"] == 190 and lp["added"] == lp["removed"] == 0
    ex = next(e for e in lp["examples"] if e["change"] == "changed")
    assert ex["after"]["ce"] == pytest.approx(2 * ex["before"]["ce"])
    assert result.document()["changes"]["required_rbf"]["changed"] == 0
    after = run_tables(db_url, "r")
    assert after["required_rbf"] == before["required_rbf"] and after["loss_parts"] != before["loss_parts"]
    ce = dict(((i, s), c) for i, s, _, c, _, _ in before["loss_parts"])
    assert all(c == pytest.approx(2 * ce[(i, s)]) for i, s, _, c, _, _ in after["loss_parts"])


def test_reparse_cli_reports_by_kind_and_refuses_bad_input(make_simcluster, tmp_path):
    sim = make_simcluster(RESTART)
    db, raw = str(tmp_path / "s.db"), tmp_path / "raw"
    follow_sim(sim, db, raw=str(raw))
    r = subprocess.run([*CLI, "reparse", "r", "--raw", str(raw), "--db", db, "--into", "again", "-o", "json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["into"] == "again" and not doc["changed"]
    assert set(doc["changes"]) >= {"loss_parts", "required_rbf", "pod_metrics", "config", "checkpoints",
                                   "incarnations", "findings"}
    for args, says in ((["r", "--into", "again"], "exists"), (["nope"], "no run"),
                       (["r", "--into", "x", "--replace"], "exclude"), (["../x"], "run name")):
        r = subprocess.run([*CLI, "reparse", *args, "--raw", str(raw), "--db", db], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = subprocess.run([*CLI, "reparse", "r", "--raw", str(tmp_path / "elsewhere"), "--db", db, "--into", "y"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0  # the segments recorded in run_files are found where they are


def _follow(sim, db: str, raw: Path, *extra: str) -> subprocess.Popen:
    args = [*CLI, "follow", "--jobset", "olmo3-sft", "--run", "r", "-n", "default", "--kubeconfig",
            str(sim.kubeconfig_path), "--db", db, "--raw", str(raw), "--silence", "1", "--no-view", *extra]
    env = {**os.environ, "CLOUDSDK_CORE_ACCOUNT": sim.account}
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_sigkilled_follower_leaves_whole_segments_and_no_row_without_its_line(make_simcluster, tmp_path):
    from steptail.collector.offline.reparse import reparse

    sim = make_simcluster(scenario(rate=40, jobsets=[{"name": "olmo3-sft", "hosts": 2,
                                                      "trainer": {"steps": 400, "checkpoint_period": 50}}]))
    db, raw = str(tmp_path / "f.db"), tmp_path / "raw"
    proc = _follow(sim, db, raw)
    try:
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read()
            try:
                if len(recorded(db, "r")) >= 80:
                    break
            except Exception:  # noqa: BLE001 - schema not there yet
                pass
            time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    committed = [(s, ts) for _, s, ts, *_ in read(db, iter_loss_parts, "r")]
    assert len(committed) >= 80
    # every segment reads back: its complete members, a cut-off tail at most
    have = loss_lines(raw_lines(raw, "r"))
    for step, ts in committed:
        assert (step, ts) in have, f"step {step} committed without its line"
    open_segments = rows(db, "SELECT path FROM run_files WHERE run = :r AND sha256 IS NULL", "r")
    assert open_segments  # killed: its segment was never closed

    # the next follower starts a segment of its own (never appends to the killed one's)
    proc = _follow(sim, db, raw, "--until-done")
    proc.communicate(timeout=90)
    assert proc.returncode == 0
    segs = [seg.name for s in scan(raw, "r") for seg in s.segments]
    assert "000002.log.gz" in segs and len(recorded(db, "r")) == 400
    store = open_store(db)
    try:
        result = reparse(store, "r", raw)
    finally:
        store.dispose()
    assert run_tables(db, "r-reparse")["loss_parts"] == run_tables(db, "r")["loss_parts"]
    assert not result.document()["changes"]["loss_parts"]["changed"]


def test_a_cut_off_last_member_is_left_out_and_the_writer_never_appends(tmp_path):
    log = RawLog(tmp_path, "r", cap=1 << 20)
    for n in range(3):
        log.add("uid/c/0", f"2026-01-01T00:00:0{n}.000000000Z LOSS-PARTS step={n} ce=1.0\n".encode(), n, "p")
        log.write(log.take())
    seg = next(iter(scan(tmp_path, "r"))).segments[0]
    data = seg.read_bytes()
    whole, cut = read_members(data)
    assert len(whole) == 3 and not cut
    seg.write_bytes(data[:-7])  # a crash during the last member's write
    members, cut = read_members(seg.read_bytes())
    assert cut and b"".join(members).count(b"\n") == 2
    again = RawLog(tmp_path, "r")
    again.add("uid/c/0", b"2026-01-01T00:00:09.000000000Z x\n", 9, "p")
    again.write(again.take())
    assert [p.name for p in next(iter(scan(tmp_path, "r"))).segments] == ["000001.log.gz", "000002.log.gz"]
    # a size cap closes the segment (sha256 known) and the next line opens the next one
    small = RawLog(tmp_path, "s", cap=10)
    small.add("k", b"0123456789abc\n", 1)
    small.write(small.take())
    closed = small.take_touched()
    assert closed[0].sha256 == hashlib.sha256(Path(closed[0].path).read_bytes()).hexdigest()


def test_a_raw_write_failure_keeps_the_rows_uncommitted_until_it_clears(tmp_path, db_url):
    from steptail.collector.live.detect import Detectors
    from steptail.collector.live.sink import RunSink
    from steptail.runs.model import RunModel

    store = open_store(db_url)
    try:
        blocked = tmp_path / "raw"
        blocked.write_text("a file where the raw log's directory should be")
        sink = RunSink(store, "r", None, Detectors("r", store), raw=RawLog(blocked, "r"))
        model = RunModel("r")
        line = b"2026-01-01T00:00:01.000000000Z LOSS-PARTS step=1 ce=2.5\n"
        sink.raw.add("uid/c/0", line, None, "p")
        model.feed_stamped(line, None, stream="uid/c/0")
        assert asyncio.run(sink.flush(model)) == 0
        assert "raw log write failed" in sink.error and recorded(db_url, "r") == []
        blocked.unlink()
        sink.retry_at = 0.0
        assert asyncio.run(sink.flush(model)) == 1
        assert recorded(db_url, "r") == [(1, 1)] and raw_lines(blocked, "r") == [line.rstrip(b"\n")]
        assert sink.error is None
    finally:
        store.dispose()


def _archive(folder: Path) -> Path:
    """A JobSet archive as `steptail archive` lays it out: process 0 and another pod."""
    files = []
    for pod, body in (("js-0-0-a", b"2026-01-01T00:00:01Z LOSS-PARTS step=1 ce=2.5\n"), ("js-1-0-b", b"other\n")):
        path = folder / pod / "main.log.gz"
        path.parent.mkdir(parents=True)
        path.write_bytes(gzip.compress(body))
        files.append({"path": f"{pod}/main.log.gz", "pod": pod, "container": "main",
                      "sha256": hashlib.sha256(path.read_bytes()).hexdigest()})
    pods = [{"name": "js-0-0-a", "job_index": 0, "completion_index": 0, "containers": [{"name": "main"}]},
            {"name": "js-1-0-b", "job_index": 1, "completion_index": 0, "containers": [{"name": "main"}]}]
    manifest = folder / "manifest.json"
    manifest.write_text(json.dumps({"jobset": "js", "namespace": "default", "pods": pods, "files": files}))
    return manifest


def test_export_carries_the_raw_segments_and_the_archive_manifest(make_simcluster, tmp_path, db_url):
    from steptail.storage.export import ExportError, export_run, verify
    from steptail.storage.run_files import ARCHIVE_MANIFEST, RunFile, record_file

    sim = make_simcluster(RESTART)
    raw = tmp_path / "raw"
    follow_sim(sim, db_url, raw=str(raw))
    manifest = _archive(tmp_path / "archive" / "js")
    store = open_store(db_url)
    try:
        with store.engine.begin() as conn:
            record_file(conn, RunFile("r", ARCHIVE_MANIFEST, str(manifest),
                                      hashlib.sha256(manifest.read_bytes()).hexdigest(), manifest.stat().st_size))
        out = tmp_path / "ledger" / "r"
        m = export_run(store, "r", out, parents=True)
        segs = m["raw"]["segments"]
        assert len(segs) == 2 and all((out / s["file"]).is_file() for s in segs)
        for s in segs:
            assert m["files"][s["file"]]["sha256"] == s["sha256"] == hashlib.sha256((out / s["file"]).read_bytes()
                                                                                   ).hexdigest()
            assert s["closed"] and s["stream"].count("/") == 2
        (arch,) = m["archives"]
        assert arch["process0_files"] == ["archive/js/js-0-0-a/main.log.gz"]  # process 0 only
        assert (out / arch["manifest"]).read_bytes() == manifest.read_bytes()
        assert not (out / "archive/js/js-1-0-b").exists()
        assert verify(out) == []
        (out / segs[0]["file"]).write_bytes(b"tampered")
        assert verify(out) == [segs[0]["file"]]
        # an archived log that no longer matches its manifest: no bundle, the old one kept
        (manifest.parent / "js-0-0-a" / "main.log.gz").write_bytes(gzip.compress(b"changed\n"))
        with pytest.raises(ExportError, match="does not match"):
            export_run(store, "r", out, force=True)
        assert (out / "manifest.json").is_file()
    finally:
        store.dispose()


def test_ingest_records_each_source_files_sha256(tmp_path, db_url, samples, monkeypatch):
    from steptail.collector.offline import ingest as ingest_mod
    from steptail.collector.offline.ingest import ingest_paths

    plain = samples / "clean-300.log"
    gz = tmp_path / "clean.log.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    untimed = tmp_path / "untimed.log"
    untimed.write_bytes(b"LOSS-PARTS step=1 ce=2.5\n")

    def digest(p: Path) -> str:
        return hashlib.sha256(p.read_bytes()).hexdigest()

    res = ingest_paths(db_url, "a", [str(plain), str(gz)])
    assert res.sha256 == {str(plain): digest(plain), str(gz): digest(gz)}
    ingest_paths(db_url, "u", [str(untimed)])
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(plain.read_bytes())))
    ingest_paths(db_url, "s", ["-"])
    monkeypatch.setattr(ingest_mod, "POOL_MIN_BYTES", 0)  # workers read the ranges: hashed beside them
    ingest_paths(db_url, "w", [str(plain)])
    store = open_store(db_url)
    try:
        with store.engine.connect() as c:
            got = {(r, s): d for r, s, d in c.execute(sa.text("SELECT run, source, sha256 FROM ingest_stats"))}
    finally:
        store.dispose()
    assert got == {("a", str(plain)): digest(plain), ("a", str(gz)): digest(gz),
                   ("u", str(untimed)): digest(untimed), ("s", "<stdin>"): digest(plain),
                   ("w", str(plain)): digest(plain)}


def test_an_untimestamped_log_plain_then_gzipped_is_ingested_once(tmp_path, db_url):
    """Its identity is its content; each file's own sha256 is still what is recorded."""
    from steptail.collector.offline.ingest import ingest_paths

    untimed = tmp_path / "untimed.log"
    untimed.write_bytes(b"LOSS-PARTS step=1 ce=2.5\nLOSS-PARTS step=2 ce=2.4\n")
    gz = tmp_path / "untimed.log.gz"
    gz.write_bytes(gzip.compress(untimed.read_bytes()))
    first = ingest_paths(db_url, "u", [str(untimed)])
    second = ingest_paths(db_url, "u", [str(gz)])
    assert first.loss_parts == 2 and second.skipped == [str(gz)] and second.loss_parts == 0
    store = open_store(db_url)
    try:
        with store.engine.connect() as c:
            steps = c.execute(sa.text("SELECT incarnation, step FROM loss_parts WHERE run = 'u'")).all()
            shas = c.execute(sa.text("SELECT source, sha256, content_sha256 FROM ingest_stats")).all()
    finally:
        store.dispose()
    assert sorted(steps) == [(1, 1), (1, 2)]
    assert shas == [(str(untimed), hashlib.sha256(untimed.read_bytes()).hexdigest(),
                     hashlib.sha256(untimed.read_bytes()).hexdigest())]
