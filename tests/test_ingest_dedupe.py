"""Re-ingest, overlapping and out-of-order inputs store every record exactly once."""

from __future__ import annotations

import gzip
import io
import sys

import pytest
import sqlalchemy as sa

from steptail.collector.offline.files import open_source
from steptail.collector.offline.ingest import ingest
from steptail.storage.reads import iter_loss_parts


def counts(store, run: str) -> dict[str, int]:
    with store.engine.connect() as conn:
        return {
            t: conn.execute(sa.text(f"SELECT COUNT(*) FROM {t} WHERE run = :r"), {"r": run}).scalar()
            for t in ("loss_parts", "required_rbf", "pod_metrics", "incarnations", "config", "checkpoints")
        }


def ingest_paths(store, run, *paths):
    sources = [open_source(str(p)) for p in paths]
    try:
        return ingest(store, run, sources)
    finally:
        for s in sources:
            s.close()


@pytest.fixture
def pieces(tmp_path, samples):
    """resume-gap split into two files that overlap by 500 lines (a reconnect's overlap)."""
    lines = (samples / "resume-gap.log").read_bytes().splitlines(keepends=True)
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_bytes(b"".join(lines[:2000]))
    b.write_bytes(b"".join(lines[1500:]))
    return a, b


def test_reingest_adds_nothing(store, samples):
    first = ingest_paths(store, "rg", samples / "resume-gap.log")
    before = counts(store, "rg")
    again = ingest_paths(store, "rg", samples / "resume-gap.log")
    assert (again.loss_parts, again.required_rbf, again.pod_steps) == (0, 0, 0)
    assert again.duplicates >= first.loss_parts + first.required_rbf + first.pod_steps
    assert counts(store, "rg") == before == {
        "loss_parts": 426, "required_rbf": 424, "pod_metrics": 426, "incarnations": 2,
        "config": 14, "checkpoints": 9,
    }


def test_overlapping_files_in_one_call_and_any_order(store, samples, pieces):
    a, b = pieces
    ingest_paths(store, "whole", samples / "resume-gap.log")
    ingest_paths(store, "split", b, a)  # given out of order: sorted by first timestamp
    assert counts(store, "split") == counts(store, "whole")


def test_overlapping_files_in_separate_calls(store, samples, pieces):
    a, b = pieces
    ingest_paths(store, "whole", samples / "resume-gap.log")
    r1 = ingest_paths(store, "split", a)
    r2 = ingest_paths(store, "split", b)
    assert r2.duplicates > 0 and r1.incarnations == 2 and r2.incarnations == 2
    assert counts(store, "split") == counts(store, "whole")
    def ces(run):
        return [(inc, step, ce) for inc, step, _, ce, *_ in iter_loss_parts(store, run)]
    assert ces("split") == ces("whole")


def test_untimestamped_file_ingested_once(store, samples):
    first = ingest_paths(store, "cp", samples / "cp4-lb-nan.log")
    again = ingest_paths(store, "cp", samples / "cp4-lb-nan.log")
    assert first.loss_parts == 120 and again.loss_parts == 0
    assert again.skipped == [str(samples / "cp4-lb-nan.log")]
    assert counts(store, "cp")["loss_parts"] == 120 and counts(store, "cp")["incarnations"] == 1


def test_gzip_and_stdin(store, samples, tmp_path, monkeypatch):
    gz = tmp_path / "clean.log.gz"
    gz.write_bytes(gzip.compress((samples / "clean-300.log").read_bytes()))
    assert ingest_paths(store, "gz", gz).loss_parts == 300
    stdin = io.TextIOWrapper(io.BytesIO((samples / "clean-300.log").read_bytes()))
    monkeypatch.setattr(sys, "stdin", stdin)
    assert ingest_paths(store, "stdin", "-").loss_parts == 300
    assert counts(store, "gz") == counts(store, "stdin")


@pytest.mark.parametrize("compressed", [False, True])
def test_worker_processes_give_the_same_rows(store, samples, monkeypatch, tmp_path, compressed):
    """Big inputs are parsed in worker processes (reading their own ranges of a plain file,
    or sent blocks of a compressed one): same rows, same order, same counts."""
    import steptail.collector.offline.ingest as ingest_module

    path = samples / "resume-gap.log"
    if compressed:
        path = tmp_path / "resume-gap.log.gz"
        path.write_bytes(gzip.compress((samples / "resume-gap.log").read_bytes()))
    ingest_paths(store, "seq", samples / "resume-gap.log")
    monkeypatch.setattr(ingest_module, "POOL_MIN_BYTES", 0)
    monkeypatch.setattr(ingest_module, "READ_BLOCK", 64 << 10)  # many blocks in flight
    result = ingest_paths(store, "pool", path)
    assert (result.loss_parts, result.required_rbf, result.pod_steps, result.incarnations) == (426, 424, 426, 2)
    with store.engine.connect() as conn:
        for table in ("loss_parts", "required_rbf", "pod_metrics", "checkpoints", "config"):
            q = f"SELECT * FROM {table} WHERE run = :r"
            a = sorted(tuple(r[1:]) for r in conn.execute(sa.text(q), {"r": "seq"}))
            b = sorted(tuple(r[1:]) for r in conn.execute(sa.text(q), {"r": "pool"}))
            assert a == b, table


def test_ranges_read_like_pieces(tmp_path, samples):
    """Ranges read by workers give the same blocks, line counts and bad lines as read_pieces;
    a line too long to find a boundary in sends the file back to read_pieces."""
    from steptail.collector.offline.files import line_ranges, read_pieces, read_range

    head = (samples / "clean-300.log").read_bytes()[:50_000]
    path = tmp_path / "h.log"
    path.write_bytes(head + b"LOSS-PARTS step=10 ce=2.")  # a cut-off last line
    source = open_source(str(path))
    ranges = line_ranges(source, 16 << 10)
    pieces = list(read_pieces(source, 16 << 10))
    source.close()
    got = [read_range(str(path), a, b) for a, b in ranges]
    assert len(got) > 2 and b"".join(p.block for p in got) == b"".join(p.block for p in pieces)
    assert sum(p.lines for p in got) == sum(p.lines for p in pieces)
    assert [p.bad for p in got if p.bad] == [p.bad for p in pieces if p.bad] != []

    path.write_bytes(head + b"LOSS-PARTS step=9 ce=" + b"7" * (2 << 20) + b"\n")
    source = open_source(str(path))
    assert line_ranges(source, 16 << 10) is None
    source.close()


def test_ingest_workers_die_with_a_killed_ingest(tmp_path):
    """A crashed or killed ingest leaves no parse worker behind (they would hold its pipes)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "pool.py"
    script.write_text(
        "import multiprocessing as mp, os, time\n"
        "from concurrent.futures import ProcessPoolExecutor\n"
        "from steptail.collector.offline.files import worker_init\n"
        "def pid(_):\n"
        "    time.sleep(0.2)\n"
        "    return os.getpid()\n"
        "if __name__ == '__main__':\n"
        "    pool = ProcessPoolExecutor(2, mp_context=mp.get_context('forkserver'), initializer=worker_init)\n"
        "    print(' '.join(map(str, sorted(set(pool.map(pid, range(4)))))), flush=True)\n"
        "    time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    workers = [int(p) for p in proc.stdout.readline().split()]
    assert workers
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    def running(pid: int) -> bool:
        try:  # a process can vanish between any two looks at /proc: gone is gone
            with open(f"/proc/{pid}/stat") as f:
                return f.read().split()[2] != "Z"
        except (FileNotFoundError, ProcessLookupError):
            return False

    deadline = time.monotonic() + 10
    alive = workers
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if running(p)]
        time.sleep(0.1)
    assert not alive


def _bad_lines(store, run: str) -> int:
    from steptail.storage.reads import list_runs

    return next(r["bad_lines"] for r in list_runs(store) if r["run"] == run)


def test_reingest_counts_malformed_lines_once(store, samples, tmp_path):
    """Malformed record lines far apart (steps ~12 s apart: beyond the cursor's ~4 s memory)
    are counted bad once: a second ingest of the same log finds them by their identity (stamp
    and text, kept in the quarantine table) and counts them as duplicates. BAD LINES of
    `steptail runs` doubled with each ingest of the same file."""
    lines = (samples / "clean-300.log").read_bytes().splitlines(keepends=True)
    out, bad = [], 0
    for line in lines:
        out.append(line)
        if b"LOSS-PARTS step=" in line and int(line.split(b"step=")[1].split()[0]) % 50 == 0:
            stamp = line.split(b" ", 1)[0]  # the step's own stamp: a line beside it
            out.append(stamp + b" I1130 train_sft.py:301] LOSS-PARTS step=oops ce=nan?\n")
            out.append(stamp + b" I1130 train_sft.py:301] REQUIRED_RBF step=7 max=\n")
            bad += 2
    log = tmp_path / "bad.log"
    log.write_bytes(b"".join(out))
    first = ingest_paths(store, "bad", log)
    assert first.bad_lines == bad == 12 and first.loss_parts == 300
    before = counts(store, "bad")
    again = ingest_paths(store, "bad", log)
    assert (again.bad_lines, again.loss_parts) == (0, 0)
    assert again.duplicates >= bad
    assert _bad_lines(store, "bad") == bad
    assert counts(store, "bad") == before
