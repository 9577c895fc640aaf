"""Timestamps that go back lose no line (issue 19, defect 5): containerd stamps stdout and stderr
apart (a LOSS-PARTS line microseconds before the absl line before it), NTP steps node clocks
back. Dedupe drops only a re-read's overlap; past it every line is taken whatever its stamp,
by `ingest` (files generated here) and on the live path (RunModel -> RunSink, with re-reads
served as kubelet serves them: the lines read so far stamped >= the whole second of `since`),
on both stores."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import sqlalchemy as sa
from test_follow_support import assert_exactly_once, follow_sim, gaps
from test_follow_support import findings as stored_findings
from test_follow_support import scenario as follow_scenario
from test_poison_lines import T0, findings, ingest_file, recorded, write

from steptail.collector.live.detect import Detectors
from steptail.collector.live.sink import RunSink
from steptail.parsers import format_ns
from steptail.parsers.fast import line_ts
from steptail.runs.cursor import JUMP_CONFIRM_LINES, floor_second, line_digest
from steptail.runs.model import RunModel
from steptail.storage.findings import check_run
from steptail.storage.reads import iter_loss_parts
from steptail.storage.sql import load_model

KEY = "uid/jax/0"
S = 10**9


def log(steps: int, clock, absl: bool = False) -> list[bytes]:
    """`steps` steps, step n's lines stamped clock(n, k) (k: the line's index in the step)."""
    out = [format_ns(clock(0, 0)).encode() + b" I1130 max_utils.py:273] Attempting to initialize the jax "
           b"distributed system..."]
    for n in range(1, steps + 1):
        body = ([b"I1130 absl] step %d starting" % n] if absl else []) + [
            b"I1130 train_sft.py:301] LOSS-PARTS step=%d ce=%.6f z_loss=1.2e-04 weights=1048576" % (n, 2 + 1 / n),
            b"I1130 train.py:1333] REQUIRED_RBF step=%d max=1.3958 per_layer=[1.3958,1.1695] program=normal" % n,
            b"I1130 metric_logger.py:210] completed step: %d, seconds: 1.0, TFLOP/s/device: 1.0, "
            b"Tokens/s/device: 1.0, total_weights: 1048576, loss: 5.191" % n,
        ]
        out += [format_ns(clock(n, k)).encode() + b" " + line for k, line in enumerate(body)]
    return out


def inverted(every: int):
    """An absl line then LOSS-PARTS 1 µs before it, on every `every`th step."""
    return lambda n, k: T0 + n * S + (k * 1000 if not (k == 1 and n and n % every == 0) else -1000)


def stepped(at: int, back_ns: int):
    """One step a second; from step `at` on, the node clock is `back_ns` behind."""
    return lambda n, k: T0 + n * S + k * 1000 - (back_ns if n >= at else 0)


def follow(store, run: str, lines: list[bytes], rereads: tuple[int, ...] = (), chunk: int = 40):
    """The live path: lines in chunks of `chunk`, each chunk a commit; at each index of
    `rereads` a reconnect: a new read from the cursor's mark, served as kubelet does."""
    model = RunModel(run)
    sink = RunSink(store, run, None, Detectors(run, store=store))
    served: list[bytes] = []

    async def go() -> None:
        nonlocal model
        i = 0
        for cut in (*rereads, len(lines)):
            while i < cut:
                for line in lines[i:min(cut, i + chunk)]:
                    served.append(line)
                    model.feed(line, stream=KEY)
                i = min(cut, i + chunk)
                await sink.flush(model)
            if cut == len(lines):
                break
            if cut % 2:  # every other re-read is a collector restarted from the store
                with store.engine.connect() as conn:
                    model = load_model(conn, run)
            cursor = model.cursors[KEY]
            cursor.new_read()  # what RunFollower._since does before each read
            since = floor_second(cursor.since_ns)
            for line in [ln for ln in served if line_ts(ln) >= since]:
                model.feed(line, stream=KEY)
            await sink.flush(model)
        await sink.flush(model)

    asyncio.run(go())
    return model


def steps_of(store, run: str) -> list[tuple]:
    return [(inc, step) for inc, step, *_ in iter_loss_parts(store, run)]


def assert_all(store, run: str, steps: int) -> None:
    got = recorded(store, run)
    assert got["loss"] and [s for _, s, _ in got["loss"]] == list(range(1, steps + 1))
    assert [s for _, s, _ in got["rbf"]] == list(range(1, steps + 1))
    assert [s for _, s in got["pod"]] == list(range(1, steps + 1))
    assert got["incarnations"] == [(1,)]


def test_each_loss_line_stamped_before_the_line_before_it(store, tmp_path):
    lines = log(100, inverted(1), absl=True)
    follow(store, "f", lines, rereads=(37, 151, 152, 260))
    assert_all(store, "f", 100)
    result = ingest_file(store, "i", write(tmp_path / "i.log", lines))
    assert (result.loss_parts, result.duplicates, result.flagged) == (100, 0, 0)
    assert_all(store, "i", 100)


def test_every_20th_step_inverted_raises_no_false_missing_step(store, tmp_path):
    lines = log(300, inverted(20), absl=True)
    follow(store, "f", lines, rereads=(80, 81, 500, 799))
    ingest_file(store, "i", write(tmp_path / "i.log", lines))
    for run in ("f", "i"):
        assert_all(store, run, 300)
        assert not [f for f in check_run(store, run) if f.kind in ("gap", "missing_rbf", "clock_jump")]


def test_node_clock_stepped_back_two_seconds(store, tmp_path):
    lines = log(200, stepped(100, 2 * S + 500))
    at = lines.index(next(ln for ln in lines if b"LOSS-PARTS step=100 " in ln))
    # re-reads just after the step (the server repeats the 2 s before it too) and later
    follow(store, "f", lines, rereads=(at + 1, at + 4, at + 9, at + 30))
    ingest_file(store, "i", write(tmp_path / "i.log", lines))
    for run in ("f", "i"):
        assert_all(store, run, 200)
        assert not findings(store, run, "clock_jump")


def test_node_clock_stepped_back_an_hour_and_a_second(store, tmp_path):
    lines = log(200, stepped(100, 3601 * S))
    at = lines.index(next(ln for ln in lines if b"LOSS-PARTS step=100 " in ln))
    model = follow(store, "f", lines, rereads=(at + 6, at + 31))
    # the re-reads serve the hour before the step again: repeats, none admitted twice
    ingest_file(store, "i", write(tmp_path / "i.log", lines))
    for run in ("f", "i"):
        assert_all(store, run, 200)
        (inc, step, _), = findings(store, run, "clock_jump")  # the step back, flagged once
        assert (inc, step) == (1, 100)
    assert model.cursors[KEY].hwm_ns < T0  # the mark followed the clock back


def test_node_clock_stepped_two_hours_ahead_and_staying_there(store, tmp_path):
    """Chaos seed 1190 (benchmark): a node clock stepped 2 h ahead of the wall clock and kept
    it. Each line so far ahead is a clock jump that must not move the mark (one line stamped
    2099 would have the server filter out the rest), but lines that go on from it in the new
    clock are the node's clock: the mark moves to it, after a few lines flagged. Before, every
    line stayed a jump until the cursor's 256 were spent, then each was dropped as bad."""
    base = time.time_ns() - 600 * S  # step n at base + n s: in the past until the step

    def ahead(n, k):
        return base + n * S + k * 1000 + (7200 * S if n >= 100 else 0)

    lines = log(600, ahead)
    at = lines.index(next(ln for ln in lines if b"LOSS-PARTS step=100 " in ln))
    model = follow(store, "f", lines, rereads=(at + 3, at + 60, at + 1000))
    ingest_file(store, "i", write(tmp_path / "i.log", lines))
    for run in ("f", "i"):
        assert_all(store, run, 600)
        flagged = findings(store, run, "clock_jump")
        assert 1 <= len(flagged) <= JUMP_CONFIRM_LINES, flagged  # until the new clock is confirmed
    assert model.cursors[KEY].hwm_ns > time.time_ns() + 3600 * S  # the mark followed the clock ahead


def test_one_first_line_two_hours_ahead_in_ingest(store, tmp_path):
    lines = log(300, lambda n, k: T0 + n * S + k * 1000 + (2 * 3600 * S if n == 0 else 0))
    result = ingest_file(store, "i", write(tmp_path / "i.log", lines))
    assert result.loss_parts == 300
    assert_all(store, "i", 300)
    # a second ingest of the same file adds nothing
    again = ingest_file(store, "i", write(tmp_path / "i.log", lines))
    assert (again.loss_parts, again.required_rbf, again.pod_steps) == (0, 0, 0)
    assert_all(store, "i", 300)


def test_one_first_line_a_day_ahead_on_a_long_log(store, tmp_path):
    """Steady blocks (the scans) after a first line a day ahead: nothing lost."""
    steps = 20_000
    lines = log(steps, lambda n, k: T0 + n * S // 100 + k * 1000 + (86_400 * S if n == 0 else 0))
    result = ingest_file(store, "i", write(tmp_path / "i.log", lines))
    assert (result.loss_parts, result.required_rbf, result.pod_steps) == (steps, steps, steps)
    assert steps_of(store, "i") == [(1, n) for n in range(1, steps + 1)]


def test_overlapping_files_and_old_cursor_rows(store, tmp_path):
    """A second file overlapping the first (inverted stamps across the cut) adds only what is
    new; a cursor saved in the old format (digests of the lines at the mark) still loads."""
    lines = log(60, inverted(1), absl=True)
    ingest_file(store, "o", write(tmp_path / "a.log", lines[:100]))
    ingest_file(store, "o", write(tmp_path / "b.log", lines[90:]))
    assert_all(store, "o", 60)
    # the row as an older steptail saved it: the mark and the digests of the lines at it
    last = [ln for ln in lines if b"LOSS-PARTS" in ln or b"REQUIRED_RBF" in ln or b"completed step" in ln][-3:]
    hwm = max(line_ts(ln) for ln in last)
    at = [line_digest(ln) for ln in last if line_ts(ln) == hwm]
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE cursors SET hwm_ns = :h, at_hwm = :a WHERE run = 'o'"),
                     {"h": hwm, "a": json.dumps(at)})
    with store.engine.connect() as conn:
        cursor = load_model(conn, "o").cursors["log"]
    assert cursor.hwm_ns == hwm and all(cursor.seen(hwm, ln) for ln in last if line_ts(ln) == hwm)
    again = ingest_file(store, "o", write(tmp_path / "c.log", lines))  # the whole log again: nothing new
    assert (again.loss_parts, again.required_rbf, again.pod_steps) == (0, 0, 0)
    assert_all(store, "o", 60)


# -- follow against the simulator, real kubectl: stamps going back, streams re-opened --------------------------

EOFS = [{"action": "eof_streams", "at_step": s} for s in (30, 61, 62, 95, 130)]  # re-reads from the mark


def followed(make_simcluster, db_url, *faults, eofs=EOFS, steps: int = 160) -> tuple:
    over = {"jobsets": [{"name": "olmo3-sft", "hosts": 2, "trainer": {"steps": steps, "checkpoint_period": 50}}]}
    sim = make_simcluster(follow_scenario(*faults, *eofs, **over))
    follow_sim(sim, db_url)
    seen = assert_exactly_once(sim, db_url, "r")
    assert len(seen["got"]) == steps and not seen["lost"] and not gaps(db_url, "r")
    return sim, {k for k, _ in stored_findings(db_url, "r")}


def test_follow_each_loss_line_stamped_before_the_line_before_it(make_simcluster, db_url):
    _, kinds = followed(make_simcluster, db_url, {"at": 0, "action": "stamp_skew", "micros": 1})
    assert not kinds & {"gap", "clock_jump", "step_jump"}


def test_follow_every_20th_step_inverted(make_simcluster, db_url):
    _, kinds = followed(make_simcluster, db_url, {"at": 0, "action": "stamp_skew", "micros": 1, "every": 20})
    assert not kinds & {"gap", "clock_jump", "step_jump"}


@pytest.mark.parametrize("seconds", [-2, -3601])
def test_follow_node_clock_stepped_back(make_simcluster, db_url, seconds):
    # A step back of 2 s is covered by starting re-reads a little before the mark
    # (Cursor.since_ns). An hour's makes a stream opened with --since-time go quiet (kubelet
    # filters the new lines out): the watchdog's probe sees an unread line stamped before the
    # mark and the stream is re-opened from before it; the trainer runs on long enough.
    _, kinds = followed(make_simcluster, db_url, {"at_step": 60, "action": "clock_step", "seconds": seconds},
                        steps=160 if seconds == -2 else 400)
    assert "gap" not in kinds and "step_jump" not in kinds
    if seconds == -2:
        assert "clock_jump" not in kinds


def test_a_re_read_past_what_the_cursor_remembers_holds_nothing_and_repeats_nothing():
    """A clock stepped back 10 s: a re-read from the new mark repeats lines the cursor forgot.
    Nothing is held back (issue 33: a hold could outlive the clock and drop every later line):
    each line is taken at once, its record a repeat by its identity (stamp and step) or new."""
    lines = log(40, stepped(20, 10 * S))  # 1 step a second, 3 lines a step
    at = next(i for i, ln in enumerate(lines) if b"LOSS-PARTS step=25 " in ln)
    for case in ("repeats", "rotated", "cut short"):
        model = RunModel("r")
        for line in lines[:at]:
            model.feed(line, stream=KEY)
        model.take()
        cursor = model.cursors[KEY]
        cursor.new_read()
        since = floor_second(cursor.since_ns)
        served = [ln for ln in lines[:at] if line_ts(ln) >= since]
        if case == "rotated":  # the file rotated just after the last line read: only new lines
            served = []
        elif case == "cut short":  # the stream ends within the forgotten lines; the next re-read is whole
            for line in served[:4]:
                model.feed(line, stream=KEY)
            cursor.new_read()
        for line in served + lines[at:]:
            model.feed(line, stream=KEY)
            if b"LOSS-PARTS" in line and line not in served:  # a new step is a row at once
                assert model.batch.loss_parts[-1][2] == int(line.split(b"step=")[1].split()[0]), case
        batch = model.take()
        assert [r[2] for r in batch.loss_parts] == list(range(25, 41)), case  # no step lost, none twice
        assert not batch.flags and not model.counters.flagged, case


def test_a_re_read_after_a_rotation_and_a_clock_stepped_back_opens_both_windows():
    """The file rotated between reads, 20 s ago, and the node clock stepped back 15 s meanwhile:
    the re-read's first line is new yet stamped before the mark. The lines lost lie after the
    mark (written before the step) or, by at most those 20 s, before that first line (after
    it): a stream gap for each window."""
    import time

    from steptail.collector.live.overlap import Overlap

    lines = log(60, stepped(30, 15 * S))
    at = next(i for i, ln in enumerate(lines) if b"LOSS-PARTS step=25 " in ln)
    model = RunModel("r")
    for line in lines[:at]:
        model.feed(line, stream=KEY)
    model.take()
    cursor = model.cursors[KEY]
    mark = cursor.hwm_ns
    cursor.read_at_ns = time.time_ns() - 20 * S  # the last line was read 20 s ago
    cursor.new_read()
    since = floor_second(cursor.since_ns)
    first = next(ln for ln in lines if b"LOSS-PARTS step=36 " in ln)  # steps 25-35 rotated away
    assert since <= line_ts(first) < mark
    gaps = Overlap(cursor.since_ns, None, cursor).see(line_ts(first), first)
    assert len(gaps) == 2 and gaps[0][0] == mark and gaps[1][1] == line_ts(first)
    assert all("clock stepped back" in g[2] for g in gaps)
    lost = [line_ts(ln) for ln in lines if any(b"step=%d " % n in ln for n in range(25, 36))]
    assert len(lost) == 22 and all(any(a < ts <= b for a, b, _ in gaps) for ts in lost)
