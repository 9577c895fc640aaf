"""Exactly once by identity (issue 33): a record line whose kubelet stamp and text were
recorded for the run is a repeat however long ago (runs.identities.Identities: each step row's
stamp, per kind and incarnation; start-up and checkpoint lines by their stamps); a replay is an
earlier step with a new stamp. Stamps going back lose nothing, and the cursor holds nothing
back: no hold to outlive a node clock stepped back. A model resumed from the store
(storage.sql.load_model) holds a step going back as it would have before the stop.

Saved logs with a block read twice (10 s, 10 min, the whole file), stamps going back inside,
through `ingest` and the live path (RunModel -> RunSink, collector restarts from the store), on
both stores; a node clock stepped back then a rotation, followed in the project's simulator;
an out-of-sequence step right after a resume."""

from __future__ import annotations

import asyncio
import tracemalloc

import pytest
import sqlalchemy as sa
from test_cursor_order import KEY, S, floor_second
from test_cursor_order import follow as follow_lines
from test_follow_support import assert_exactly_once, follow_sim
from test_follow_support import findings as stored_findings
from test_follow_support import read as read_store
from test_follow_support import scenario as follow_scenario
from test_poison_lines import T0, ingest_file, write

from steptail.collector.live.detect import Detectors
from steptail.collector.live.overlap import Overlap
from steptail.collector.live.sink import RunSink
from steptail.parsers import format_ns
from steptail.parsers.fast import line_ts
from steptail.parsers.timestamps import parse_rfc3339
from steptail.runs.cursor import Cursor
from steptail.runs.detect import Settings
from steptail.runs.identities import LOSS, Identities
from steptail.runs.model import RunModel
from steptail.runs.rows import FINDINGS
from steptail.storage.findings import check_run
from steptail.storage.reads import list_findings
from steptail.storage.sql import load_model

STEP_TABLES = ("loss_parts", "required_rbf", "pod_metrics")
TABLES = (*STEP_TABLES, "incarnations", "checkpoints", "config")


# -- a run's log: 1 step a second, stamps going back inside --------------------------------------

def clock(back_at: int | None, back_ns: int = 2 * S + 500):
    """Step n's k-th line at T0 + n s + k µs; every 7th step's LOSS-PARTS (k = 1) 1 µs before the
    absl line before it (stdout and stderr stamped apart); from step `back_at` on, the node
    clock `back_ns` behind (an NTP step)."""
    def at(n: int, k: int) -> int:
        ts = T0 + n * S + (k * 1000 if not (k == 1 and n % 7 == 0) else -1000)
        return ts - (back_ns if back_at is not None and n >= back_at else 0)
    return at


def run_log(steps: int, at, restart: tuple[int, int] | None = None) -> list[bytes]:
    """Start-up, config, `steps` steps (absl line, LOSS-PARTS, REQUIRED_RBF, completed step), a
    checkpoint saved every 50; `restart` (after, restored_from): the trainer restarts after step
    `after` from the checkpoint at `restored_from` and replays the steps after it (new stamps)."""
    def startup(n: int) -> list[bytes]:
        return [format_ns(at(n, 10 + k)).encode() + b" " + text for k, text in enumerate((
            b"I1130 max_utils.py:273] Attempting to initialize the jax distributed system...",
            b"I1130 max_utils.py:290] Jax distributed system initialized! process_index=0 process_count=32",
            b"I1130 pyconfig.py:584] Config param steps: %d" % steps,
            b"I1130 pyconfig.py:584] Config param checkpoint_period: 50"))]

    def step(n: int, t: int, inc: int) -> list[bytes]:
        body = [
            b"I1130 absl] step %d starting" % n,
            b"I1130 train_sft.py:301] LOSS-PARTS step=%d ce=%.6f z_loss=1.2e-04 weights=1048576" % (n, 2 + 1 / n + inc),
            b"I1130 train.py:1333] REQUIRED_RBF step=%d max=1.3958 per_layer=[1.3958,1.1695] program=normal" % n,
            b"I1130 metric_logger.py:210] completed step: %d, seconds: 1.0, TFLOP/s/device: 1.0, "
            b"Tokens/s/device: 1.0, total_weights: 1048576, loss: 5.191" % n,
        ]
        if n % 50 == 0:
            body.append(b"I1130 checkpoint_manager.py:1] Saved a checkpoint at step %d." % n)
        return [format_ns(at(t, k)).encode() + b" " + line for k, line in enumerate(body)]

    out, t = startup(0), 0
    for n in range(1, steps + 1):
        t += 1
        out += step(n, t, 1)
        if restart is not None and n == restart[0]:
            t += 1
            out += startup(t)
            out.append(format_ns(at(t, 20)).encode() + b" I1130 checkpoint_manager.py:1] Restoring checkpoint "
                       b"from step %d." % restart[1])
            for m in range(restart[1] + 1, n + 1):  # replayed: new stamps, the same steps
                t += 1
                out += step(m, t, 2)
    return out


def stored(store, run: str) -> dict[str, list[tuple]]:
    """Every row of the run's tables but the run's name (incarnations: number, start, steps)."""
    out = {}
    with store.engine.connect() as conn:
        for table in TABLES:
            cols = "incarnation, started_ns, first_step, last_step, restored_from" if table == "incarnations" else "*"
            rows = conn.execute(sa.text(f"SELECT {cols} FROM {table} WHERE run = :r"), {"r": run})
            out[table] = sorted(tuple(r[1:] if cols == "*" else r) for r in rows)
        out["quarantine"] = conn.execute(sa.text("SELECT kind, step FROM quarantine WHERE run = :r"),
                                         {"r": run}).fetchall()
        out["flags"] = sorted(conn.execute(sa.text("SELECT kind, incarnation, first_step FROM findings WHERE run = :r"),
                                           {"r": run}).fetchall())
    out["findings"] = sorted((f.kind, f.incarnation, f.first_step) for f in check_run(store, run))
    return out


def twice(lines: list[bytes], start: int, length: int) -> list[bytes]:
    """The log with lines[start:start + length] read twice in a row (two captures joined)."""
    return lines[:start + length] + lines[start:start + length] + lines[start + length:]


def line_at(lines: list[bytes], text: bytes, nth: int = 0) -> int:
    return [i for i, ln in enumerate(lines) if text in ln][nth]


STEPS = 1000


def repeated_logs() -> dict[str, tuple[list[bytes], list[bytes]]]:
    """(the log, the log with a repeat) for each repeat: 10 s (40 lines) at the clock's step back,
    10 min across it and the restart, the whole file concatenated to itself."""
    lines = run_log(STEPS, clock(back_at=400), restart=(700, 650))
    back = line_at(lines, b"LOSS-PARTS step=400 ")
    return {
        "10 s": (lines, twice(lines, back - 20, 40)),
        "10 min": (lines, twice(lines, line_at(lines, b"LOSS-PARTS step=300 "), 600 * 4)),
        "whole file": (lines, lines + lines),
    }


@pytest.mark.parametrize("repeat", ["10 s", "10 min", "whole file"])
def test_a_saved_log_with_a_repeat_gives_exactly_its_records(store, tmp_path, repeat):
    """Issue 33, defect 1: a block of the log read twice (two overlapping captures joined into one
    file) added its steps twice and opened a false incarnation once it was older than the 4 s the
    cursor remembers. Ingested whole, the repeated log gives exactly the log's rows and findings."""
    lines, repeated = repeated_logs()[repeat]
    clean = ingest_file(store, "clean", write(tmp_path / "clean.log", lines))
    assert (clean.loss_parts, clean.incarnations) == (STEPS + 50, 2)
    result = ingest_file(store, "rep", write(tmp_path / "rep.log", repeated))
    want = stored(store, "clean")
    assert stored(store, "rep") == want
    assert (result.loss_parts, result.required_rbf, result.pod_steps, result.incarnations) == \
        (clean.loss_parts, clean.required_rbf, clean.pod_steps, 2)
    def records(log):
        return sum(any(tag in ln for tag in (b"LOSS-PARTS", b"REQUIRED_RBF", b"completed step")) for ln in log)
    assert result.duplicates >= records(repeated) - records(lines) > 0
    # the store is asked too: the repeated log ingested again into the run adds nothing
    again = ingest_file(store, "rep", write(tmp_path / "rep.log", repeated))
    assert (again.loss_parts, again.required_rbf, again.pod_steps, again.flagged) == (0, 0, 0, 0)
    assert stored(store, "rep") == want


@pytest.mark.parametrize("repeat", ["10 s", "10 min", "whole file"])
def test_a_stream_with_a_repeat_on_the_live_path(store, tmp_path, repeat):
    """The same logs through the live path: rows committed in small batches, re-reads from the
    cursor's mark, every other one by a collector restarted from the store (load_model)."""
    lines, repeated = repeated_logs()[repeat]
    ingest_file(store, "clean", write(tmp_path / "clean.log", lines))
    n = len(repeated)
    follow_lines(store, "live", repeated, rereads=(n // 5, n // 3, n // 2 + 1, 3 * n // 4, n - 7), chunk=200)
    got, want = stored(store, "live"), stored(store, "clean")
    for table in (*STEP_TABLES, "checkpoints", "config", "quarantine", "findings", "flags"):
        assert got[table] == want[table], table
    assert [r[:2] for r in got["incarnations"]] == [r[:2] for r in want["incarnations"]]
    assert [r[0] for r in got["incarnations"]] == [1, 2]


def test_a_replay_is_an_earlier_step_with_a_new_stamp():
    """The restart's replayed steps (same step numbers, new stamps) open an incarnation, though
    each (step) was recorded; the same lines read again are repeats."""
    lines = run_log(120, clock(None), restart=(100, 50))
    model = RunModel("r")
    for line in lines + lines:
        model.feed(line)
    batch = model.take()
    assert [(r[1], r[2]) for r in batch.loss_parts] == [(1, n) for n in range(1, 101)] + [(2, n) for n in range(51, 121)]
    assert sorted(batch.incarnations) == [1, 2] and not batch.flags and not batch.quarantine


def test_an_old_block_holding_steps_never_read_is_no_replay():
    """Steps 30-37 rotated away before they were read; 20 s later an old block (steps 28-39, their
    own stamps) is served again. Its unread steps went back with no restart evidence and the next
    one went on from them: taken for a replay, a false incarnation (chaos seed 1007). Stamped
    between the steps recorded either side, they are late lines of incarnation 1."""
    lines = run_log(60, clock(None))
    lost = range(line_at(lines, b"absl] step 30 "), line_at(lines, b"absl] step 38 "))
    block = lines[line_at(lines, b"absl] step 28 "):line_at(lines, b"absl] step 40 ")]
    model = RunModel("r")
    for line in [ln for i, ln in enumerate(lines) if i not in lost] + block:
        model.feed(line)
    batch = model.take()
    assert sorted(batch.incarnations) == [1] and not batch.quarantine
    assert sorted((r[1], r[2]) for r in batch.loss_parts) == [(1, n) for n in range(1, 61)]
    assert sorted(r[2] for r in batch.required_rbf) == list(range(1, 61))
    assert sorted(r[2] for r in batch.pod_metrics) == list(range(1, 61))
    # a replay still opens an incarnation: its steps come with stamps after the last step's
    test_a_replay_is_an_earlier_step_with_a_new_stamp()


def test_a_repeated_start_up_opens_nothing_and_files_no_config_elsewhere():
    """The whole file again, where the restart's start-up lines were rotated away (a restore
    line, then the replay): the first start-up and its config, read again, are incarnation 1's
    (within its start-up: from its opening line to its first record), never incarnation 2's."""
    lines = run_log(120, clock(None), restart=(100, 50))
    second = line_at(lines, b"Attempting to initialize", 1)
    lines = lines[:second] + lines[second + 4:]  # the restart's start-up and config rotated away
    batches = []
    for log in (lines, lines + lines):
        model = RunModel("r")
        for line in log:
            model.feed(line)
        batches.append(model.take())
    clean, repeated = batches
    assert sorted((r[1], r[2]) for r in repeated.config) == [(1, "checkpoint_period"), (1, "steps")]
    assert sorted(repeated.incarnations) == [1, 2] and len(repeated.loss_parts) == 170
    for table in ("loss_parts", "required_rbf", "pod_metrics", "config", "checkpoints"):
        assert getattr(repeated, table) == getattr(clean, table), table
    assert repeated.incarnations == clean.incarnations and not repeated.flags


# -- the cursor holds nothing back: a node clock stepped back ------------------------------------

def read_up_to(lines: list[bytes], cut: int) -> RunModel:
    model = RunModel("r")
    for line in lines[:cut]:
        model.feed(line, stream=KEY)
    model.take()
    return model


def gaps_of(model: RunModel, served: list[bytes]) -> tuple[Overlap, list[tuple]]:
    """The follower's overlap check over a read from the cursor's mark serving `served`."""
    cursor = model.cursors[KEY]
    check, gaps = Overlap(cursor.since_ns, None, cursor, model.recorded), []
    for line in served:
        gaps += check.see(line_ts(line), line)
        model.feed(line, stream=KEY)
    return check, gaps


def test_a_clock_stepped_back_an_hour_then_a_rotation_loses_nothing():
    """Issue 33, defect 2, at the cursor and the follower's overlap check: a clock stepped back an
    hour, then the log rotated. Before, `forgot_ns` stayed at the old clock while the mark went
    back; the re-read of the new file held every line at or before it (an hour's worth), and the
    check recorded no gap: every later line was lost, silently. Now every line is taken at once,
    and the rotation is a stream gap from the mark to the re-read's first line."""
    lines = run_log(200, clock(back_at=100, back_ns=3600 * S))
    cut = line_at(lines, b"LOSS-PARTS step=150 ")  # 50 steps after the step back: the lines before it forgotten
    model = read_up_to(lines, cut)
    model.cursors[KEY].new_read()  # the file rotated after the last line read: the re-read serves only new lines
    for line in lines[cut:]:
        model.feed(line, stream=KEY)
        if b"LOSS-PARTS" in line:  # a row at once: nothing held
            assert model.batch.loss_parts and model.batch.loss_parts[-1][2] == int(line.split(b"step=")[1].split()[0])
    batch = model.take()
    assert [r[2] for r in batch.loss_parts] == list(range(150, 201))
    assert not batch.flags and not batch.quarantine
    # the follower's check: lines read before the step are stamped after the mark, so a new
    # line there may be one of them; the first record line tells: new, a gap from the mark
    model = read_up_to(lines, cut)
    assert model.cursors[KEY].top_ns > model.cursors[KEY].hwm_ns
    check, gaps = gaps_of(model, lines[cut:])
    (start, end, why), = gaps
    assert start < line_ts(lines[cut]) <= end and "rotated" in why


@pytest.mark.parametrize("back_s", [20, 3601])
def test_a_re_read_after_a_clock_stepped_back_serves_old_lines_no_gap_nothing_twice(back_s):
    """After a clock stepped back, a re-read from the new mark serves the lines read before the
    step again (stamped after the mark, long forgotten): no gap, no row twice, nothing held."""
    lines = run_log(200, clock(back_at=100, back_ns=back_s * S))
    first = 100 + min(back_s // 2, 30)  # the mark a few seconds into the clock stepped back
    cut = line_at(lines, b"LOSS-PARTS step=%d " % first)
    for gap_check in (False, True):
        model = read_up_to(lines, cut)
        cursor = model.cursors[KEY]
        cursor.new_read()
        since = floor_second(cursor.since_ns)
        served = [ln for ln in lines[:cut] if line_ts(ln) >= since]  # kubelet filters, it does not seek
        assert any(b"step 99 " in ln for ln in served)  # lines read before the step, long forgotten
        if gap_check:
            check, gaps = gaps_of(model, served + lines[cut:])
            assert check.resolved and not gaps
        else:
            for line in served + lines[cut:]:
                model.feed(line, stream=KEY)
        batch = model.take()
        assert [r[2] for r in batch.loss_parts] == list(range(first, 201))
        assert not batch.quarantine and not batch.flags and len(batch.incarnations) <= 1


def test_the_cursor_keeps_no_hold():
    """What existed only to guess repeats is gone: no held lines, no forgotten stamp."""
    for name in ("held", "released", "unsure", "forgot_ns", "overlap"):
        assert not hasattr(Cursor(), name), name
    # an older steptail's saved cursor (with its forgotten stamp) still loads
    cursor = Cursor(T0, {f"{T0}:abc", f"forgot:{T0 - 5 * S}"})
    assert cursor.hwm_ns == T0 and cursor.top_ns == T0 and "forgot:" not in " ".join(cursor.at_hwm)


STEPPED = 800  # the simulator writes ~50 steps a second: 4 s of memory is ~200 steps


@pytest.mark.parametrize("seconds", [-3600, -20])
def test_follow_a_clock_stepped_back_then_a_rotation(make_simcluster, db_url, seconds):
    """Issue 33, defect 2, through the follower and the real kubectl against the simulator: the
    node clock steps back (an hour: every later line was lost, unflagged, 94 of 200 steps on
    another simulator; 20 s: lines held ~15 s, a false stall), then the log rotates."""
    over = {"jobsets": [{"name": "olmo3-sft", "hosts": 2, "trainer": {"steps": STEPPED, "checkpoint_period": 50}}]}
    sim = make_simcluster(follow_scenario({"at_step": 400, "action": "clock_step", "seconds": seconds},
                                          {"at_step": 600, "action": "rotate"}, **over))
    # a stall under 5 s is the simulator's own pause on a loaded machine (its stamps say so); the
    # defect's false stall was ~15 s of held lines
    follow_sim(sim, db_url, settings=Settings(stall_min_seconds=5.0))
    seen = assert_exactly_once(sim, db_url, "r")  # what was lost lies in a stream gap
    kinds = {k for k, _ in stored_findings(db_url, "r")}
    assert len(seen["got"]) == STEPPED, (len(seen["got"]), kinds)
    assert not kinds & {"step_jump", "resume_mismatch", "head_gap"}, stored_findings(db_url, "r")
    # A stall is false unless the simulator itself paused that long: a starved writer thread on a
    # loaded machine stamps a real pause (CI: step 686 stamped 6.6 s after 685), and is one
    stamps = {(t.incarnation, t.step): parse_rfc3339(t.timestamp) for t in seen["truth"]}
    for f in read_store(db_url, list_findings, "r"):
        if f[FINDINGS.KIND] == "stall":
            inc, step = f[FINDINGS.INCARNATION], f[FINDINGS.FIRST_STEP]
            paused = (stamps[(inc, step)] - stamps[(inc, step - 1)]) / 1e9
            assert paused >= 5.0, (paused, f[FINDINGS.DETAIL])


# -- a model resumed from the store holds a step going back -------------------------------------

def resume_logs(repeat: bool) -> tuple[list[bytes], list[bytes]]:
    """Steps 1-137, then (after a stop) a LOSS-PARTS line of step 119 and steps 138-160: a lone
    out-of-sequence line (a new stamp, ce=1.0) before any other step line, or (`repeat`) step
    119's own line (its stamp and text, long forgotten by the cursor) after step 138's."""
    lines = run_log(160, clock(None))
    cut = line_at(lines, b"LOSS-PARTS step=138 ") - 1  # the absl line of step 138
    old = lines[line_at(lines, b"LOSS-PARTS step=119 ")]
    odd = old if repeat else format_ns(line_ts(lines[cut - 1]) + 1000).encode() + \
        b" I1130 train_sft.py:301] LOSS-PARTS step=119 ce=1.000000 z_loss=1.2e-04 weights=1048576"
    at = cut + 2 if repeat else cut  # the repeat after step 138's LOSS-PARTS line, the other one first
    return lines[:cut], lines[cut:at] + [odd] + lines[at:]


def check_resumed(store, run: str, repeat: bool) -> None:
    got = stored(store, run)
    assert [r[:1] for r in got["incarnations"]] == [(1,)]
    assert [r[1] for r in got["loss_parts"]] == list(range(1, 161))
    assert got["quarantine"] == ([] if repeat else [("loss_parts", 119)])
    assert got["flags"] == ([] if repeat else [("step_jump", 1, 119)])  # one warning
    assert not got["findings"]  # no resume_mismatch, no head_gap


@pytest.mark.parametrize("repeat", [False, True], ids=["out of sequence", "repeat"])
def test_a_step_going_back_right_after_a_resumed_ingest(store, tmp_path, repeat):
    """Issue 33, defect 3: load_model never restored the stream of the last step, so a step going
    back right after a resume was taken for a restart: incarnation 2, a critical resume_mismatch,
    a false head_gap, the rest of the run filed under incarnation 2. Resumed, the model holds it
    as followed continuously: the next step decides (a lone line: quarantined, one warning); a
    repeat of a recorded line is no step at all."""
    before, after = resume_logs(repeat)
    ingest_file(store, "r", write(tmp_path / "a.log", before))
    result = ingest_file(store, "r", write(tmp_path / "b.log", after))  # a model loaded from the store
    assert result.incarnations == 1
    check_resumed(store, "r", repeat)


@pytest.mark.parametrize("repeat", [False, True], ids=["out of sequence", "repeat"])
def test_a_step_going_back_right_after_a_resumed_follow(store, repeat):
    """The same on the live path: a collector restarted (or a replica taking over) loads the
    model from the store and reads on."""
    before, after = resume_logs(repeat)

    async def go() -> None:
        model = RunModel("f")
        sink = RunSink(store, "f", None, Detectors("f", store=store))
        for line in before:
            model.feed(line, stream=KEY)
        await sink.flush(model)
        with store.engine.connect() as conn:  # the collector restarts
            model = load_model(conn, "f")
        sink = RunSink(store, "f", None, Detectors("f", store=store))
        for line in after:
            model.feed(line, stream=KEY)
        await sink.flush(model)

    asyncio.run(go())
    check_resumed(store, "f", repeat)


def test_load_model_restores_the_stream_and_the_step_before(store, tmp_path):
    lines = run_log(120, clock(None), restart=(100, 50))
    ingest_file(store, "r", write(tmp_path / "a.log", lines))
    with store.engine.connect() as conn:
        model = load_model(conn, "r")
    assert (model.current.number, model.current.last_step, model._step_stream, model._prior_step) == (2, 120, "log", 100)
    ids = model.ids
    assert ids.starts.keys() == {1, 2} and ids.top_ns == max(line_ts(ln) for ln in lines)
    assert ids.known(LOSS, 60, line_ts(lines[line_at(lines, b"LOSS-PARTS step=60 ")]))  # incarnation 1's
    assert ids.known(LOSS, 60, line_ts(lines[line_at(lines, b"LOSS-PARTS step=60 ", 1)]))  # the replay's
    assert not ids.known(LOSS, 60, line_ts(lines[line_at(lines, b"LOSS-PARTS step=61 ")]))
    assert sum(len(s.segs[0]) for kind in ids.kinds for s in kind.values()) == 3 * (100 + 70)


# -- the index's size ----------------------------------------------------------------------------

def test_identities_take_8_bytes_a_record():
    """One stamp a record in arrays: 100,000 steps of three kinds, with a restart replaying
    1,000 of them and a few steps missing, in well under 3 MB (benchmarks/identity.py measures)."""
    tracemalloc.start()
    ids = Identities()
    for inc, steps in ((1, range(1, 60_001)), (2, range(59_001, 101_001))):
        for kind in range(3):
            for step in steps:
                if step % 997:
                    ids.add(kind, inc, step, T0 + step * S + kind)
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert ids.nbytes() <= 8 * 3 * 102_000 and size < 3 << 20
    assert ids.known(LOSS, 59_500, T0 + 59_500 * S) and not ids.known(LOSS, 59_500, T0 + 59_500 * S + 1)
    assert not ids.known(LOSS, 997, T0 + 997 * S)
