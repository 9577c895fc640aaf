"""No log line can cost good data (issue 10): a value no store can hold, a step that jumps
absurdly or a timestamp far from its neighbours is counted or flagged, and every other line of
the log is recorded — by `ingest` and on the live path (RunModel -> RunSink), on SQLite and on
PostgreSQL."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from steptail.collector.live.detect import Detectors
from steptail.collector.live.sink import RunSink
from steptail.collector.offline.files import open_source
from steptail.collector.offline.ingest import apply_parsed, ingest
from steptail.parsers import Malformed, bounds, format_ns, parse_line
from steptail.parsers import block as block_module
from steptail.parsers.block import line_by_line, parse_block
from steptail.parsers.fast import parse_fast
from steptail.runs.model import RunModel
from steptail.runs.rows import FINDINGS
from steptail.storage.db import open_store
from steptail.storage.findings import check_run, sync_findings
from steptail.storage.reads import iter_loss_parts, iter_required_rbf, list_findings
from steptail.storage.sql import load_model

STEPS = 300
T0 = 1_796_011_200 * 10**9  # 2026-11-30T04:00:00Z
STEPTAIL = str(Path(sys.executable).with_name("steptail"))


def stamp(ns: int) -> bytes:
    return format_ns(ns).encode() + b" "


def ce(n: int) -> str:
    return f"{2 + 1 / n:.6f}"


def startup(config_steps: int | None = None) -> list[bytes]:
    lines = [b"I1130 max_utils.py:273] Attempting to initialize the jax distributed system...",
             b"I1130 max_utils.py:290] Jax distributed system initialized! process_index=0 process_count=32",
             b"I1130 pyconfig.py:584] Config param ici_context_parallelism: 1"]
    if config_steps is not None:
        lines.append(b"I1130 pyconfig.py:584] Config param steps: %d" % config_steps)
    return [stamp(T0) + line for line in lines]


def step_lines(n: int) -> list[bytes]:
    t = stamp(T0 + n * 10**9)
    return [
        t + f"I1130 train_sft.py:301] LOSS-PARTS step={n} ce={ce(n)} z_loss=1.2e-04 weights=1048576".encode(),
        t + f"I1130 train.py:1333] REQUIRED_RBF step={n} max=1.3958 per_layer=[1.3958,1.1695] program=normal".encode(),
        t + f"I1130 metric_logger.py:210] completed step: {n}, seconds: 12.251, TFLOP/s/device: 181.918, "
            f"Tokens/s/device: 4016.205, total_weights: 1048576, loss: 5.191".encode(),
    ]


def good_log(config_steps: int | None = None, extra: dict[int, list[bytes]] | None = None) -> list[bytes]:
    """STEPS steps; `extra[n]`: lines put after step n's lines."""
    lines = startup(config_steps)
    for n in range(1, STEPS + 1):
        lines += step_lines(n)
        lines += (extra or {}).get(n, [])
    return lines


def write(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


def ingest_file(store, run: str, path: Path):
    source = open_source(str(path))
    try:
        return ingest(store, run, [source])
    finally:
        source.close()


def rows(store, sql: str, **params) -> list[tuple]:
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(sql), params)]


def recorded(store, run: str) -> dict:
    """What the store holds for `run`, reduced to what the tests compare."""
    q = {"run": run}
    return {
        "loss": [(inc, step, ce_raw) for inc, step, _, _, ce_raw, _ in iter_loss_parts(store, run)],
        "rbf": [(inc, step, program) for inc, step, _, _, _, program in iter_required_rbf(store, run)],
        "pod": rows(store, "SELECT incarnation, step FROM pod_metrics WHERE run = :run ORDER BY 1, 2", **q),
        "incarnations": rows(store, "SELECT incarnation FROM incarnations WHERE run = :run ORDER BY 1", **q),
        "config": rows(store, "SELECT name, value FROM config WHERE run = :run ORDER BY 1", **q),
        "checkpoints": rows(store, "SELECT kind, step FROM checkpoints WHERE run = :run ORDER BY 1, 2", **q),
    }


def all_good(store, run: str, incarnation: int = 1) -> bool:
    got = recorded(store, run)
    assert got["loss"] == [(incarnation, n, ce(n)) for n in range(1, STEPS + 1)]
    assert got["rbf"] == [(incarnation, n, "normal") for n in range(1, STEPS + 1)]
    assert got["pod"] == [(incarnation, n) for n in range(1, STEPS + 1)]
    assert got["incarnations"] == [(incarnation,)]
    return True


def findings(store, run: str, kind: str) -> list[tuple]:
    return [(f[FINDINGS.INCARNATION], f[FINDINGS.FIRST_STEP], f[FINDINGS.DETAIL]) for f in list_findings(store, run)
            if f[FINDINGS.KIND] == kind]


def quarantined(store, run: str) -> list[tuple]:
    return rows(store, "SELECT kind, step, reason, data FROM quarantine WHERE run = :run ORDER BY id", run=run)


# -- the live path without a cluster: lines into a RunModel, batches through a RunSink ---------------------
def follow_lines(store, run: str, lines: list[bytes], model: RunModel | None = None, chunk: int = 40,
                 stream: str = "pod/jax/0") -> tuple[RunModel, RunSink]:
    model = model or RunModel(run)
    sink = RunSink(store, run, None, Detectors(run, store=store))

    async def go() -> None:
        for i in range(0, len(lines), chunk):
            for line in lines[i : i + chunk]:
                model.feed(line, stream=stream)
            await sink.flush(model)
        await sink.flush(model)

    asyncio.run(go())
    assert sink.pending == [] and sink.error is None
    return model, sink


# -- 1. values no store can hold: bad lines at the parser's edge ---------------------------------------------
POISON = {
    "step beyond 64 bits": b"I1130 train_sft.py:301] LOSS-PARTS step=99999999999999999999 ce=1.0",
    "step beyond INTEGER": b"I1130 train_sft.py:301] LOSS-PARTS step=3000000000 ce=1.0",
    "70-digit ce": b"I1130 train_sft.py:301] LOSS-PARTS step=100 ce=" + b"1" * 70,
    "300-character program": b"REQUIRED_RBF step=101 max=1.0 per_layer=[1.0] program=" + b"p" * 300,
    "NUL in a value": b"I1130 train_sft.py:301] LOSS-PARTS step=100 ce=1.0 mode=a\x00b",
    "NUL in a config value": b"I1130 pyconfig.py:584] Config param tag: a\x00b",
    "300-character config name": b"Config param " + b"n" * 300 + b": 1",
    "total_weights beyond 64 bits": b"completed step: 101, seconds: 1.0, TFLOP/s/device: 1.0, Tokens/s/device: 1.0, "
                                    b"total_weights: 99999999999999999999999, loss: 1.0",
    "NUL in a per-pod field": b"completed step: 101, seconds: 1.0, x\x00y: 1",
    "checkpoint step beyond INTEGER": b"Saved a checkpoint at step 99999999999.",
    "process_index beyond INTEGER": b"Jax distributed system initialized! process_index=99999999999 process_count=32",
}


@pytest.mark.parametrize("name", POISON)
def test_each_poison_line_is_a_bad_line_of_the_parser(name):
    line = stamp(T0) + POISON[name]
    assert isinstance(parse_line(line).record, Malformed), name
    assert parse_fast(line) is None
    native = block_module._native
    assert native is None or native.steady(line + b"\n", block_module._save_of) is None


def test_bounds_are_the_columns(store):
    """parsers.bounds against the columns the migrations made (and the C scan's copy)."""
    t = store.tables
    assert t["loss_parts"].c.ce_raw.type.length == bounds.CE_RAW_MAX
    assert t["required_rbf"].c.program.type.length == bounds.PROGRAM_MAX
    assert t["config"].c.name.type.length == bounds.CONFIG_NAME_MAX
    for table, column in [("loss_parts", "step"), ("required_rbf", "step"), ("pod_metrics", "step"),
                          ("checkpoints", "step"), ("incarnations", "first_step"), ("incarnations", "restored_from"),
                          ("incarnations", "process_index"), ("incarnations", "process_count"), ("findings", "first_step")]:
        kind = t[table].c[column].type
        assert isinstance(kind, sa.Integer) and not isinstance(kind, sa.BigInteger), (table, column)
    for table, column in [("pod_metrics", "total_weights"), ("loss_parts", "ts_ns"), ("checkpoints", "ts_ns")]:
        assert isinstance(t[table].c[column].type, sa.BigInteger), (table, column)
    assert bounds.INT32_MAX == 2**31 - 1 and bounds.INT64_MAX == 2**63 - 1
    native = block_module._native
    if native is not None:
        assert (native.STEP_MAX, native.CE_RAW_MAX, native.PROGRAM_MAX, native.CLOCK_JUMP_NS) == (
            bounds.INT32_MAX, bounds.CE_RAW_MAX, bounds.PROGRAM_MAX, bounds.CLOCK_JUMP_NS)


def test_poison_lines_in_ingest_cost_only_themselves(store, tmp_path):
    for i, (name, poison) in enumerate(POISON.items()):
        run = f"p{i}"
        path = write(tmp_path / f"{run}.log", good_log(extra={100: [stamp(T0 + 100 * 10**9) + poison]}))
        result = ingest_file(store, run, path)
        assert (result.bad_lines, result.loss_parts, result.incarnations) == (1, STEPS, 1), name
        assert len(result.bad_samples) == 1 and "\x00" not in result.bad_samples[0]
        assert all_good(store, run)
        assert recorded(store, run)["config"] == [("ici_context_parallelism", "1")]
        # re-ingest: every record a repeat (by its identity), and the bad line too (by its stamp
        # and text: counted once, however often it is read)
        again = ingest_file(store, run, path)
        assert (again.loss_parts, again.bad_lines) == (0, 0) and all_good(store, run)
        with store.engine.connect() as conn:  # the samples are stored too (PostgreSQL JSONB refuses NUL)
            samples = conn.execute(sa.text("SELECT bad_samples FROM ingest_stats WHERE run = :r"), {"r": run}).first()[0]
        assert samples


def test_poison_lines_on_the_live_path_cost_only_themselves(store):
    for i, (name, poison) in enumerate(POISON.items()):
        run = f"f{i}"
        model, sink = follow_lines(store, run, good_log(extra={100: [stamp(T0 + 100 * 10**9) + poison]}))
        assert model.counters.bad_lines == 1, name
        assert all_good(store, run)


def test_all_poison_lines_at_once_through_the_command(db_url, tmp_path):
    extra = {10 * (i + 1): [stamp(T0 + 10 * (i + 1) * 10**9) + p] for i, p in enumerate(POISON.values())}
    path = write(tmp_path / "all.log", good_log(extra=extra))
    env = {k: v for k, v in os.environ.items() if k != "STEPTAIL_DB"}
    proc = subprocess.run([STEPTAIL, "ingest", str(path), "--run", "all", "--db", db_url, "--json"],
                          capture_output=True, env=env, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert (out["bad_lines"], out["loss_parts"], out["required_rbf"], out["pod_steps"]) == (len(POISON), STEPS, STEPS, STEPS)
    store = open_store(db_url)
    try:
        assert all_good(store, "all")
    finally:
        store.dispose()


# -- 2. defence in depth: a row the store refuses is quarantined, the others commit ------------------------
def bad_rows(run: str) -> dict[str, list[tuple]]:
    """Rows the parser would never make: beyond BIGINT (both stores refuse it), beyond INTEGER,
    too long, NUL (PostgreSQL refuses those; SQLite takes them)."""
    return {
        "loss_parts": [(run, 1, 10**20, T0, 1.0, "1.0", "{}"), (run, 1, 5000, T0, 1.0, "1" * 70, "{}")],
        "required_rbf": [(run, 1, 3 * 10**9, T0, 1.0, "[1.0]", "normal")],
        "config": [(run, 1, "tag", "a\x00b")],
    }


def check_quarantine(store, run: str, injected: dict[str, list[tuple]], refused: int) -> None:
    kept = quarantined(store, run)
    assert len(kept) == refused
    assert all(reason.startswith("store refused: ") for _, _, reason, _ in kept)
    assert ("loss_parts", None, json.dumps(injected["loss_parts"][0])) in [(k, s, d) for k, s, _, d in kept]
    stored_steps = {s for _, s, _ in recorded(store, run)["loss"]}
    # every injected row is either stored or quarantined, never both, never lost
    assert (5000 in stored_steps) != any(k == "loss_parts" and s == 5000 for k, s, _, _ in kept)


def test_a_refused_row_never_blocks_later_commits_on_the_live_path(store):
    run = "dd"
    injected = bad_rows(run)
    lines = good_log()
    model = RunModel(run)
    sink = RunSink(store, run, None, Detectors(run, store=store))

    async def go() -> None:
        for i in range(0, len(lines), 40):
            for line in lines[i : i + 40]:
                model.feed(line)
            if i == 400:
                for table, extra in injected.items():
                    getattr(model.batch, table).extend(extra)
            await sink.flush(model)
            assert sink.pending == [] and sink.error is None  # every commit went through

    asyncio.run(go())
    refused = 1 if store.is_sqlite else 4
    assert model.counters.bad_lines == refused
    check_quarantine(store, run, injected, refused)
    got = recorded(store, run)
    assert [r for r in got["loss"] if r[1] != 5000] == [(1, n, ce(n)) for n in range(1, STEPS + 1)]
    assert [r for r in got["rbf"] if r[1] != 3 * 10**9] == [(1, n, "normal") for n in range(1, STEPS + 1)]


def test_a_refused_row_costs_only_itself_in_ingest(store, tmp_path, monkeypatch):
    run = "di"
    injected = bad_rows(run)
    take = RunModel.take

    def take_with_bad_rows(model):
        batch = take(model)
        if batch.loss_parts and injected:
            for table, extra in injected.items():
                getattr(batch, table).extend(extra)
            injected_copy.update(injected)
            injected.clear()
        return batch

    injected_copy: dict = {}
    monkeypatch.setattr(RunModel, "take", take_with_bad_rows)
    result = ingest_file(store, run, write(tmp_path / "di.log", good_log()))
    refused = 1 if store.is_sqlite else 4
    assert result.bad_lines == refused and any("store refused" in s for s in result.bad_samples)
    check_quarantine(store, run, injected_copy, refused)
    assert [r for r in recorded(store, run)["loss"] if r[1] != 5000] == [(1, n, ce(n)) for n in range(1, STEPS + 1)]


# -- 3. absurd step jumps: flagged and quarantined, no false incarnation -------------------------------------
JUMPS = {
    "LOSS-PARTS": b"I1130 train_sft.py:301] LOSS-PARTS step=1000000000 ce=1.5",
    "REQUIRED_RBF": b"REQUIRED_RBF step=1000000000 max=1.0 per_layer=[1.0] program=normal",
    "completed step": b"completed step: 1000000000, seconds: 1.0, TFLOP/s/device: 1.0, Tokens/s/device: 1.0, "
                      b"total_weights: 1, loss: 1.0",
}


def check_step_jump(store, run: str) -> None:
    assert all_good(store, run)
    (kind, step, reason, _), = quarantined(store, run)
    assert step == 1_000_000_000 and reason.startswith("step_jump: step 1000000000 after step 25")
    (inc, first, detail), = findings(store, run, "step_jump")
    assert (inc, first) == (1, 1_000_000_000) and "1000000000, " in detail or "step=1000000000" in detail


@pytest.mark.parametrize("config_steps", [None, STEPS])
def test_a_step_jump_is_flagged_not_recorded_nor_a_restart(store, tmp_path, config_steps):
    for i, line in enumerate(JUMPS.values()):
        run = f"j{i}"
        path = write(tmp_path / f"{run}.log", good_log(config_steps, extra={25: [stamp(T0 + 25 * 10**9 + 1) + line]}))
        result = ingest_file(store, run, path)
        assert (result.flagged, result.bad_lines, result.incarnations) == (1, 0, 1)
        check_step_jump(store, run)
        again = ingest_file(store, run, path)
        assert (again.loss_parts, again.flagged) == (0, 0)
        check_step_jump(store, run)
        with store.engine.begin() as conn:  # `check` reports it, and no gap
            kinds = {f.kind for f in sync_findings(conn, run, check_run(store, run))}
        assert "step_jump" in kinds and "gap" not in kinds


def test_a_step_jump_on_the_live_path(store):
    for i, line in enumerate(JUMPS.values()):
        run = f"jf{i}"
        model, _ = follow_lines(store, run, good_log(extra={25: [stamp(T0 + 25 * 10**9 + 1) + line]}))
        assert model.counters.flagged == 1
        check_step_jump(store, run)


def test_beyond_the_configured_steps_is_a_jump_but_the_next_step_is_not(store, tmp_path):
    extra = {25: [stamp(T0 + 25 * 10**9 + 1) + b"LOSS-PARTS step=5000 ce=1.5"]}
    result = ingest_file(store, "cfg", write(tmp_path / "cfg.log", good_log(STEPS, extra=extra)))
    assert (result.flagged, result.incarnations) == (1, 1)
    assert all_good(store, "cfg")
    # a run that goes on past its configured steps, one step at a time, is recorded
    model = RunModel("more", planned_steps=3)
    for n in range(1, 8):
        model.feed(step_lines(n)[0])
    assert [r[2] for r in model.take().loss_parts] == list(range(1, 8)) and model.counters.flagged == 0


# -- 4. clock jumps: one far timestamp hides nothing --------------------------------------------------------------
CLOCKS = {
    "2099": b"2099-06-01T00:00:00.5Z ",
    "beyond BIGINT": b"9999-12-31T23:59:59Z ",
    "1999": b"1999-01-01T00:00:00Z ",
}


def stamped_at(lines: list[bytes], step: int, clock: bytes) -> list[bytes]:
    """The log with step `step`'s LOSS-PARTS line stamped `clock`."""
    at = len(startup()) + 3 * (step - 1)
    assert b"LOSS-PARTS step=%d " % step in lines[at]
    return lines[:at] + [clock + lines[at].split(b"Z ", 1)[1]] + lines[at + 1 :]


def check_clock_jump(store, run: str, step: int) -> None:
    assert all_good(store, run)
    (inc, first, detail), = findings(store, run, "clock_jump")
    assert (inc, first) == (1, step) and f"LOSS-PARTS step={step}" in detail
    ts = rows(store, "SELECT ts_ns FROM loss_parts WHERE run = :run AND step = :s", run=run, s=step)[0][0]
    assert ts == T0 + (step - 1) * 10**9  # read as if stamped at the line before it


@pytest.mark.parametrize("clock", CLOCKS)
def test_one_far_timestamp_hides_nothing_in_ingest(store, tmp_path, clock):
    path = write(tmp_path / "c.log", stamped_at(good_log(), 25, CLOCKS[clock]))
    result = ingest_file(store, "c", path)
    assert (result.loss_parts, result.flagged, result.duplicates) == (STEPS, 1, 0)
    check_clock_jump(store, "c", 25)
    with store.engine.begin() as conn:  # `check` names it and finds no step missing
        kinds = {f.kind for f in sync_findings(conn, "c", check_run(store, "c"))}
    assert kinds == {"clock_jump"}
    before = recorded(store, "c")
    again = ingest_file(store, "c", path)  # re-ingest: nothing added, nothing flagged again
    assert (again.loss_parts, again.required_rbf, again.pod_steps, again.flagged) == (0, 0, 0, 0)
    assert recorded(store, "c") == before
    check_clock_jump(store, "c", 25)


def test_one_far_timestamp_on_the_live_path_with_reconnects_and_a_restart(store):
    lines = stamped_at(good_log(), 298, CLOCKS["2099"])
    model, _ = follow_lines(store, "cl", lines)
    assert model.counters.flagged == 1
    check_clock_jump(store, "cl", 298)
    # a reconnect re-reads from a second before the last line: the far line comes again too
    cursor = model.cursors["pod/jax/0"]
    overlap = [ln for ln in lines if not ln.startswith(b"2026") or parse_line(ln).ts_ns >= cursor.hwm_ns - 10**9]
    assert any(ln.startswith(b"2099") for ln in overlap)
    before = model.counters.duplicates
    follow_lines(store, "cl", overlap, model=model)
    assert model.counters.duplicates - before == len(overlap) and model.counters.flagged == 1
    # a collector restarted from the store reads the whole log again: nothing new
    with store.engine.connect() as conn:
        resumed = load_model(conn, "cl")
    follow_lines(store, "cl", lines, model=resumed)
    assert resumed.counters.loss_parts == 0 and resumed.counters.flagged == 0
    check_clock_jump(store, "cl", 298)


def _state(model: RunModel) -> tuple:
    batch = model.take()
    cursors = {k: (c.hwm_ns, sorted(c.at_hwm)) for k, c in model.cursors.items()}
    flags = [f[:7] for f in batch.flags]  # not the time of detection
    return (batch.loss_parts, batch.required_rbf, batch.pod_metrics, batch.incarnations, cursors, flags,
            [q[:8] for q in batch.quarantine], model.counters.flagged, model.counters.duplicates)


def both_paths(lines: list[bytes], cuts: list[int]) -> tuple[tuple, tuple, list[bool]]:
    """The lines cut in blocks at `cuts`, read line by line and by the steady scan + run model:
    both states, and what feed_steady answered block by block."""
    data = [ln + b"\n" for ln in lines]
    ref, steady, taken = RunModel("r"), RunModel("r"), []
    feed = steady.feed_steady
    steady.feed_steady = lambda body, stream="log": taken.append(feed(body, stream)) or taken[-1]
    for a, b in itertools.pairwise(cuts):
        block = b"".join(data[a:b])
        ref.feed_items(line_by_line(block))
        apply_parsed(steady, parse_block(block), lambda x, y, blk=block: blk[x:y])
    return _state(ref), _state(steady), taken


@pytest.mark.parametrize("odd", [CLOCKS["2099"], CLOCKS["1999"], None])
def test_the_steady_path_takes_no_jump_whole(odd):
    """Blocks cut right around the odd line: the steady scan and run model give what line by line gives."""
    lines = good_log()
    if odd is None:
        at = len(startup()) + 3 * 24 + 3
        lines = lines[:at] + [stamp(T0 + 25 * 10**9) + JUMPS["LOSS-PARTS"]] + lines[at:]
    else:
        lines = stamped_at(lines, 25, odd)
        at = len(startup()) + 3 * 24
    ref, steady, taken = both_paths(lines, [0, at - 3, at, at + 1, at + 4, len(lines)])
    assert steady == ref and ref[-2] == 1 and taken.count(True) >= 2


@pytest.mark.parametrize("gap", [False, True], ids=["lone line ahead", "steps lost"])
def test_the_steady_path_decides_a_step_ahead_as_the_lines_do(gap):
    """Step 1000 right after step 25 (a lone line, quarantined) or steps 26-40 missing (a gap,
    recorded): blocks cut at and around it give what line by line gives."""
    lines = good_log()
    at = len(startup()) + 3 * 25
    if gap:
        lines = lines[:at] + lines[at + 3 * 15:]
    else:
        lines = lines[:at] + [stamp(T0 + 25 * 10**9) + b"LOSS-PARTS step=1000 ce=1.5"] + lines[at:]
    # cut at step starts (a block starting mid-step goes back to its step's stamp: line by line)
    cuts = [0, at - 30, at, at + 42, len(lines)] if gap else [0, at - 30, at, at + 1, at + 40, len(lines)]
    ref, steady, taken = both_paths(lines, cuts)
    assert steady == ref and ref[-2] == (0 if gap else 1) and taken.count(True) >= 2
    assert ref[0][-1][2] == STEPS and len(ref[0]) == STEPS - (15 if gap else 0)


def test_the_steady_path_past_the_configured_steps():
    """A run that goes on past its configured steps is taken whole; a jump beyond them is not."""
    lines = good_log(config_steps=100)
    at = len(startup(100)) + 3 * 200
    lines = lines[:at] + [stamp(T0 + 200 * 10**9 + 1) + b"LOSS-PARTS step=5000 ce=1.5"] + lines[at:]
    step = [len(startup(100)) + 3 * (n - 1) for n in range(1, 202)]  # where each step's lines begin
    ref, steady, taken = both_paths(lines, [0, step[10], step[60], step[180], at, at + 1, at + 91, len(lines)])
    assert steady == ref and ref[-2] == 1
    # steps 11-60, 61-180 (past 100), 181-200 whole; the jump alone not; 201-230 whole again
    assert taken[:5] == [True, True, True, False, True]


# -- 5. fuzz: hostile lines among good ones never cost a good step --------------------------------------------
HUGE = st.one_of(st.integers(2**31, 10**30), st.integers(10**7, 2**31 - 1).map(lambda n: n * 1000 % 2**31))
HOSTILE_TS = st.sampled_from([b"", b"2099-06-01T00:00:00Z ", b"9999-12-31T23:59:59.999999999Z ",
                              b"1970-01-01T00:00:00Z ", b"1999-12-31T23:59:59Z "])
HOSTILE_BODY = st.one_of(
    HUGE.map(lambda n: b"LOSS-PARTS step=%d ce=1.0" % n),
    HUGE.map(lambda n: b"REQUIRED_RBF step=%d max=1.0 per_layer=[1.0] program=p" % n),
    HUGE.map(lambda n: b"completed step: %d, seconds: 1.0, total_weights: 1, loss: 1.0" % n),
    st.integers(65, 400).map(lambda n: b"LOSS-PARTS step=1 ce=0." + b"0" * n),
    st.integers(129, 400).map(lambda n: b"REQUIRED_RBF step=1 max=1 per_layer=[] program=" + b"q" * n),
    st.integers(257, 400).map(lambda n: b"Config param " + b"k" * n + b": v"),
    st.binary(max_size=12).map(lambda b: b"LOSS-PARTS step=1 ce=1.0 k=\x00" + b.replace(b"\n", b"")),
    st.binary(max_size=12).map(lambda b: b"Config param x: \x00" + b.replace(b"\n", b"")),
    st.integers(2**31, 10**20).map(lambda n: b"Saved a checkpoint at step %d." % n),
    st.integers(2**31, 10**20).map(lambda n: b"distributed system initialized! process_index=%d process_count=1" % n),
    st.binary(max_size=80).map(lambda b: b.replace(b"\n", b"") + b" LOSS-PARTS " + b.replace(b"\n", b"")),
)
FUZZ_DB: dict = {}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(1, 60), HOSTILE_TS, HOSTILE_BODY), max_size=12), st.integers(5, 60))
def test_fuzz_hostile_lines_never_cost_a_good_step(tmp_path_factory, hostile, chunk):
    if "store" not in FUZZ_DB:
        FUZZ_DB["store"] = open_store(f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'f.db'}")
    store = FUZZ_DB["store"]
    run = f"z{len(FUZZ_DB)}"
    FUZZ_DB[run] = True
    extra: dict[int, list[bytes]] = {}
    for after, ts, body in hostile:
        extra.setdefault(after, []).append((ts or stamp(T0 + after * 10**9)) + body)
    lines = startup() + [ln for n in range(1, 61) for ln in step_lines(n) + extra.get(n, [])]
    model, sink = follow_lines(store, run, lines, chunk=chunk)
    got = recorded(store, run)
    assert {(n, ce(n)) for n in range(1, 61)} <= {(s, c) for _, s, c in got["loss"]}
    assert {n for n in range(1, 61)} <= {s for _, s, _ in got["rbf"]}
    assert {n for n in range(1, 61)} <= {s for _, s in got["pod"]}


AHEAD = {"pod": b"completed step: 1000, seconds: 1.0, total_weights: 1, loss: 1.0",
         "rbf": b"REQUIRED_RBF step=1000 max=1.0 per_layer=[1.0] program=p"}


@pytest.mark.parametrize("chunk", [5, 40])
@pytest.mark.parametrize("kind", sorted(AHEAD))
def test_a_record_far_ahead_costs_no_good_row(tmp_path, kind, chunk):
    """Found by the fuzz test above: a well-formed `completed step: 1000` right after step 1
    made steps 2-60 look behind their kind's last step, and cost them their pod rows."""
    store = open_store(f"sqlite:///{tmp_path / 'f.db'}")
    try:
        ahead = stamp(T0 + 10**9) + AHEAD[kind]
        lines = startup() + [ln for n in range(1, 61) for ln in step_lines(n) + ([ahead] if n == 1 else [])]
        model, _ = follow_lines(store, "r", lines, chunk=chunk)
        got = recorded(store, "r")
        assert {(n, ce(n)) for n in range(1, 61)} <= {(s, c) for _, s, c in got["loss"]}
        assert {n for n in range(1, 61)} <= {s for _, s, _ in got["rbf"]}
        assert {n for n in range(1, 61)} <= {s for _, s in got["pod"]}
        assert got["incarnations"] == [(1,)] and model.counters.duplicates == 0
    finally:
        store.dispose()
