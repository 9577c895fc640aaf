"""A run's goodput (docs/goodput.md), kept as state at commit: `after_write` (called by
SqlSink.write, so by every path that stores rows: follow, ingest, reparse) recomputes the
blocks of 256 steps the batch touched (runs.goodput.block_state), moves their difference
into the incarnation's aggregate and stores the run's figures in `run_goodput`. Readers
(`steptail goodput`, the API, /metrics, the export manifest, the pandas API, the mesh table,
Grafana) read that row: their cost is the run's, not its steps'.

`recompute_on` is the full recomputation from the rows (runs.goodput.RunTiming), kept as the
reference the stored state is tested against."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from itertools import groupby, repeat
from operator import floordiv, itemgetter

import orjson
import sqlalchemy as sa

from steptail.runs import goodput as gp
from steptail.runs import goodput_columns as gc
from steptail.runs.rows import CHECKPOINTS, INCARNATIONS, LOSS_PARTS, POD_METRICS
from steptail.storage.db import Store
from steptail.storage.reads import known_run

FIGURES = ("wall_s", "productive_s", "replayed_s", "recovery_s", "checkpoint_s", "other_s", "goodput")

_INCARNATIONS = sa.text("SELECT incarnation, started_ns, container_started_ns FROM incarnations WHERE run = :run")
_STEPS = sa.text(
    "SELECT l.incarnation, l.step, l.ts_ns, p.seconds, p.tflops, p.tokens_per_s FROM loss_parts l"
    " LEFT JOIN pod_metrics p ON p.run = l.run AND p.incarnation = l.incarnation AND p.step = l.step"
    " WHERE l.run = :run")
_SAVES = sa.text("SELECT incarnation, step, ts_ns FROM checkpoints WHERE run = :run AND kind = 'save'")
_LAST_SAVES = sa.text("SELECT incarnation, MAX(ts_ns) FROM checkpoints WHERE run = :run AND kind = 'save'"
                      " GROUP BY incarnation")

# One block's inputs.
_BLOCK_ROWS = sa.text(
    "SELECT l.step, l.ts_ns, p.seconds, p.tflops, p.tokens_per_s FROM loss_parts l"
    " LEFT JOIN pod_metrics p ON p.run = l.run AND p.incarnation = l.incarnation AND p.step = l.step"
    " WHERE l.run = :run AND l.incarnation = :inc AND l.step BETWEEN :lo AND :hi ORDER BY l.step")
_PREV = sa.text("SELECT step, ts_ns FROM loss_parts WHERE run = :run AND incarnation = :inc AND step < :lo"
                " ORDER BY step DESC LIMIT 1")
_NEXT = sa.text("SELECT MIN(step) FROM loss_parts WHERE run = :run AND incarnation = :inc AND step > :hi")
_BLOCK_SAVES = sa.text("SELECT step FROM checkpoints WHERE run = :run AND incarnation = :inc AND kind = 'save'"
                       " AND step BETWEEN :lo AND :hi")
_SPANS = sa.text("SELECT incarnation, lo, hi FROM loss_summary WHERE run = :run")
_STARTED = sa.text("SELECT started_ns FROM incarnations WHERE run = :run AND incarnation = :inc")
_BLOCK = sa.text("SELECT state FROM goodput_blocks WHERE run = :run AND incarnation = :inc AND block = :b")
_BLOCKS_IN = sa.text("SELECT block, state FROM goodput_blocks WHERE run = :run AND incarnation = :inc"
                     " AND block BETWEEN :b0 AND :b1")
_BLOCKS_FROM = sa.text("SELECT state FROM goodput_blocks WHERE run = :run AND incarnation = :inc AND block >= :b"
                       " ORDER BY block")
_PUT_BLOCK = sa.text("INSERT INTO goodput_blocks (run, incarnation, block, state) VALUES (:run, :inc, :b, :state)"
                     " ON CONFLICT (run, incarnation, block) DO UPDATE SET state = excluded.state")
_DROP_BLOCK = sa.text("DELETE FROM goodput_blocks WHERE run = :run AND incarnation = :inc AND block = :b")
_AGG = sa.text("SELECT state FROM goodput_incs WHERE run = :run AND incarnation = :inc")
_AGGS = sa.text("SELECT incarnation, state FROM goodput_incs WHERE run = :run")
_PUT_AGG = sa.text("INSERT INTO goodput_incs (run, incarnation, state) VALUES (:run, :inc, :state)"
                   " ON CONFLICT (run, incarnation) DO UPDATE SET state = excluded.state")
_PUT_RUN = sa.text(
    "INSERT INTO run_goodput (run, " + ", ".join(FIGURES) + ", median_step_s, report, updated_ns) VALUES (:run, "
    + ", ".join(f":{f}" for f in FIGURES) + ", :median_step_s, :report, :now) ON CONFLICT (run) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in (*FIGURES, "median_step_s", "report", "updated_ns")))
_REPORT = sa.text("SELECT report FROM run_goodput WHERE run = :run")


# -- at commit ------------------------------------------------------------------------------
Fresh = dict[tuple[str, int], tuple[int, int]]  # (run, incarnation) -> the batch's step span there


def before_write(conn: sa.Connection, batch) -> Fresh:
    """The batch's spans of LOSS-PARTS steps (a block's worth or more, per incarnation) where
    the table holds no loss_parts or pod_metrics row yet. After the write, unless the store
    refused a row, the table's rows there are the batch's: after_write takes them from the
    batch rather than reading back what a bulk ingest just wrote."""
    fresh: Fresh = {}
    step_i = LOSS_PARTS.STEP
    for key, group in groupby(batch.loss_parts, itemgetter(LOSS_PARTS.RUN, LOSS_PARTS.INCARNATION)):
        steps = [row[step_i] for row in group]
        if len(steps) < gp.BLOCK or min(steps) < LOWEST or max(steps) > HIGHEST:
            continue
        p = {"run": key[0], "inc": key[1], "lo": min(steps), "hi": max(steps)}
        if key not in fresh and not any(conn.execute(q, p).first() for q in _ANY_IN):
            fresh[key] = (p["lo"], p["hi"])
    return fresh


_ANY_IN = tuple(sa.text(f"SELECT 1 FROM {t} WHERE run = :run AND incarnation = :inc AND step BETWEEN :lo AND :hi"
                        " LIMIT 1") for t in ("loss_parts", "pod_metrics"))


def after_write(conn: sa.Connection, batch, fresh: Fresh | None = None) -> None:
    """Keep the goodput state of the runs `batch` wrote to (in the caller's transaction, after
    its rows and loss_summary). Recomputed from the table, not the batch: a duplicate or a
    refused row changes nothing; only in `fresh` spans (before_write's, no row refused) are the
    table's rows taken from the batch."""
    touched: dict[tuple[str, int], set[int]] = {}
    runs: set[str] = set()
    size = gp.BLOCK
    grouped: tuple[dict, dict] = ({}, {})  # (run, incarnation) -> its loss_parts, pod_metrics rows
    for rows, cols, by_key in ((batch.loss_parts, LOSS_PARTS, grouped[0]), (batch.pod_metrics, POD_METRICS, grouped[1])):
        take_step = itemgetter(cols.STEP)
        # a batch's rows come by incarnation: one set per run of them, filled in C
        for key, group in groupby(rows, itemgetter(cols.RUN, cols.INCARNATION)):
            group = list(group)
            by_key.setdefault(key, []).extend(group)
            steps = list(map(take_step, group))
            blocks = set(map(floordiv, steps, repeat(size)))
            if min(steps) < LOWEST or max(steps) > HIGHEST:  # no column holds it: refused, nothing stored
                blocks = {step // size for step in steps if LOWEST <= step <= HIGHEST}
            touched.setdefault(key, set()).update(blocks)
    for row in batch.checkpoints:
        runs.add(row[CHECKPOINTS.RUN])  # a save's stamp is the incarnation's last line until a step follows
        if row[CHECKPOINTS.KIND] == "save" and LOWEST <= row[CHECKPOINTS.STEP] < HIGHEST:
            # the step after it is a phase step; its interval the save's
            touched.setdefault((row[CHECKPOINTS.RUN], row[CHECKPOINTS.INCARNATION]), set()).add(
                gp.block_of(row[CHECKPOINTS.STEP] + 1))
    started = {}
    for row in batch.incarnations.values():
        runs.add(row[0])
        started[(row[0], row[1])] = row[INCARNATIONS.STARTED_NS]
    for run in {run for run, _ in touched} | runs:
        spans = {inc: (lo, hi) for inc, lo, hi in conn.execute(_SPANS, {"run": run})}
        mine = {inc: blocks for (r, inc), blocks in touched.items() if r == run}
        for (r, inc), ns in started.items():
            if r == run and inc in spans:  # its start-up stamp bounds its first step's time
                agg = conn.execute(_AGG, {"run": run, "inc": inc}).scalar()
                if agg is None or _state(agg).get("started_ns") != ns:
                    mine.setdefault(inc, set()).add(gp.block_of(spans[inc][0]))
        for inc, blocks in list(mine.items()):
            if inc not in spans:
                continue
            lo, hi = spans[inc]
            # the step after a touched block: its interval starts in it (inside a run of adjacent
            # blocks that step is in the run, or the one after the run's last block)
            for _, b in _runs_of(blocks):
                nxt = conn.execute(_NEXT, {"run": run, "inc": inc, "hi": _end(b)}).scalar()
                if nxt is not None:
                    blocks.add(gp.block_of(nxt))
            # a later incarnation's first step cuts the earlier ones' blocks (their replayed part)
            for other, (o_lo, o_hi) in spans.items():
                if other < inc and o_lo < lo <= o_hi:
                    state = conn.execute(_BLOCK, {"run": run, "inc": other, "b": gp.block_of(lo)}).scalar()
                    if state is not None and lo not in _state(state)["cuts"]:
                        mine.setdefault(other, set()).add(gp.block_of(lo))
        for inc, blocks in mine.items():
            if inc in spans and blocks:
                held = _held(grouped, run, inc, fresh[(run, inc)]) if fresh and (run, inc) in fresh else None
                _recompute(conn, run, inc, blocks, spans, held)
        _store_report(conn, run)


LOWEST, HIGHEST = -(2**63), 2**63 - 1  # the widest a step column holds (SQLite's INTEGER)


def _text(state: dict) -> str:
    """A state as compact JSON: orjson's, ~8x json's (Python's json for what it refuses: an
    integer beyond 64 bits, as seconds no clock gives can sum to)."""
    try:
        return orjson.dumps(state).decode()
    except TypeError:
        return json.dumps(state, separators=(",", ":"))


def _state(text: str) -> dict:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def _end(block: int) -> int:
    return min((block + 1) * gp.BLOCK - 1, HIGHEST)


def _held(grouped: tuple[dict, dict], run: str, inc: int, span: tuple[int, int]):
    """(span, the batch's rows of the incarnation as columns), or None if they cannot be."""
    loss, metrics = (rows.get((run, inc)) or [] for rows in grouped)
    if not loss:
        return None
    m = POD_METRICS
    cols = gc.joined(*_columns(loss, LOSS_PARTS.STEP, LOSS_PARTS.TS_NS),
                     *_columns(metrics, m.STEP, m.SECONDS, m.TFLOPS, m.TOKENS_PER_S))
    return None if cols is None else (span, cols)


def _columns(rows: list[tuple], *at: int) -> list[list]:
    """The columns at these positions (each a pass in C)."""
    return [list(map(itemgetter(i), rows)) for i in at]


def _recompute(conn: sa.Connection, run: str, inc: int, blocks: set[int], spans: dict, held=None) -> None:
    p = {"run": run, "inc": inc}
    old_agg = conn.execute(_AGG, p).scalar()
    agg = gp.empty() if old_agg is None else _state(old_agg)
    started = conn.execute(_STARTED, p).scalar()
    first = spans[inc][0]
    later = [lo for other, (lo, _) in spans.items() if other > inc]
    agg.pop("tail", None)  # its replayed sums (runs.goodput.tail) may be in the blocks recomputed
    puts, drops = [], []
    for b0, b1 in _runs_of(blocks):  # a run of adjacent blocks: read in one query each, not per block
        lo, hi = max(b0 * gp.BLOCK, LOWEST), _end(b1)
        pr = {**p, "lo": lo, "hi": hi}
        olds = dict(conn.execute(_BLOCKS_IN, {**p, "b0": b0, "b1": b1}).fetchall())
        saves = {s for (s,) in conn.execute(_BLOCK_SAVES, {**p, "lo": max(lo - 1, LOWEST), "hi": hi - 1})}
        cols = _from_batch(conn, p, lo, hi, held) if held is not None else None
        if cols is not None:
            states = gc.states_of(cols, _prev(conn, p, lo), first, started, saves, later)
        else:
            rows = conn.execute(_BLOCK_ROWS, pr).fetchall()
            states = gc.block_states(rows, _prev(conn, p, lo), first, started, saves, later) if rows else {}
        for b in range(b0, b1 + 1):
            old = olds.get(b)
            if old is not None:
                gp.add(agg, _state(old), -1)
            state = states.get(b)
            if state is None:
                if old is not None:
                    drops.append({**p, "b": b})
                continue
            gp.add(agg, state)
            puts.append({**p, "b": b, "state": _text(state)})
    if drops:
        conn.execute(_DROP_BLOCK, drops)
    if puts:
        conn.execute(_PUT_BLOCK, puts)
    agg["started_ns"] = started
    conn.execute(_PUT_AGG, {**p, "state": _text(agg)})


def _from_batch(conn: sa.Connection, p: dict, lo: int, hi: int, held) -> gc.Columns | None:
    """The rows of steps lo..hi as columns: those in the fresh span from the batch, the rest
    (a block's edges outside it) read; None when they do not meet the span or cannot be."""
    (f_lo, f_hi), cols = held
    if hi < f_lo or lo > f_hi:
        return None
    inside = (cols.step >= max(lo, f_lo)) & (cols.step <= min(hi, f_hi))
    parts = [gc.Columns(*(c[inside] for c in cols))]
    for a, b in ((lo, f_lo - 1), (f_hi + 1, hi)):
        if a <= b:
            rows = conn.execute(_BLOCK_ROWS, {**p, "lo": a, "hi": b}).fetchall()
            if rows:
                edge = gc.from_rows(rows)
                if edge is None:
                    return None
                parts.append(edge)
    parts.sort(key=lambda c: int(c.step[0]) if len(c.step) else 0)
    return gc.concat(parts)


def _prev(conn: sa.Connection, p: dict, lo: int) -> tuple | None:
    """The incarnation's stored step before `lo`, with the anchor of its burst when its block
    kept one (runs.goodput.block_state's "end"; a store from before has none: the step alone)."""
    row = conn.execute(_PREV, {**p, "lo": lo}).first()
    if row is None:
        return None
    state = conn.execute(_BLOCK, {**p, "b": gp.block_of(row[0])}).scalar()
    end = _state(state).get("end") if state is not None else None
    return tuple(end) if end is not None and end[0] == row[0] else tuple(row)


def _runs_of(blocks: set[int]) -> list[tuple[int, int]]:
    """Adjacent blocks as (first, last) pairs."""
    out: list[tuple[int, int]] = []
    for b in sorted(blocks):
        if out and out[-1][1] == b - 1:
            out[-1] = (out[-1][0], b)
        else:
            out.append((b, b))
    return out


def stored_facts(conn: sa.Connection, run: str) -> tuple[list[gp.IncFacts], gp.BlocksFrom]:
    """The run's incarnations' aggregates as stored, and a reader of their blocks."""
    p = {"run": run}
    started = {inc: (ns, container) for inc, ns, container in conn.execute(_INCARNATIONS, p)}
    saves = dict(conn.execute(_LAST_SAVES, p).fetchall())
    incs = []
    for inc, state in conn.execute(_AGGS, p):
        ns, container = started.get(inc, (None, None))
        incs.append(gp.IncFacts(inc, ns, saves.get(inc), _state(state), container))

    def blocks_from(inc: int, b: int):
        return [_state(s) for (s,) in conn.execute(_BLOCKS_FROM, {**p, "inc": inc, "b": b})]
    return incs, blocks_from


def refresh(conn: sa.Connection, run: str) -> None:
    """Store the run's figures again after an incarnation's facts changed outside a write."""
    _store_report(conn, run)


def _store_report(conn: sa.Connection, run: str) -> dict:
    incs, blocks_from = stored_facts(conn, run)
    tails = {i.number: i.agg.get("tail") for i in incs}
    report = gp.report(run, incs, blocks_from)
    for inc in incs:  # a replayed part read from the blocks: kept for the next commit
        if inc.agg.get("tail") != tails[inc.number]:
            conn.execute(_PUT_AGG, {"run": run, "inc": inc.number, "state": _text(inc.agg)})
    latest = report["incarnations"][-1]["median_step_s"] if report["incarnations"] else None
    conn.execute(_PUT_RUN, {"run": run, **{f: report[f] for f in FIGURES}, "median_step_s": latest,
                            "report": json.dumps(report), "now": time.time_ns()})
    return report


def rebuild(conn: sa.Connection, run: str) -> None:
    """The run's state from its rows alone (a migration's fill; a repair)."""
    for table in ("goodput_blocks", "goodput_incs", "run_goodput"):
        conn.execute(sa.text(f"DELETE FROM {table} WHERE run = :run"), {"run": run})
    timing = recompute_on(conn, run)
    for inc, blocks in timing.blocks().items():
        agg = gp.empty()
        for b, state in blocks.items():
            gp.add(agg, state)
            conn.execute(_PUT_BLOCK, {"run": run, "inc": inc, "b": b, "state": _text(state)})
        agg["started_ns"] = timing.incs[inc].started_ns
        conn.execute(_PUT_AGG, {"run": run, "inc": inc, "state": _text(agg)})
    _store_report(conn, run)


# -- reading --------------------------------------------------------------------------------
class Stored:
    """A run's figures as kept at commit (what timing_on gives: `.report()`)."""

    def __init__(self, conn: sa.Connection, run: str) -> None:
        self.conn, self.run = conn, run

    def report(self) -> dict:
        text = self.conn.execute(_REPORT, {"run": self.run}).scalar()
        if text is None:  # no step stored yet: nothing to account for
            return gp.report(self.run, [], lambda n, b: [])
        return json.loads(text)


def timing_on(conn: sa.Connection, run: str) -> Stored:
    """The run's figures on `conn`, as kept at commit."""
    return Stored(conn, run)


def recompute_on(conn: sa.Connection, run: str) -> gp.RunTiming:
    """The full recomputation: the run's RunTiming fed from every row on `conn`."""
    timing, p = gp.RunTiming(run), {"run": run}
    for inc, started, container in conn.execute(_INCARNATIONS, p):
        timing.incarnation(inc, started, container)
    timing.add_steps(conn.execute(_STEPS, p).fetchall())  # fetchall: a row at a time costs twice as much
    for inc, s, ts in conn.execute(_SAVES, p):
        timing.save(inc, s, ts)
    return timing


def run_goodput(store: Store, run: str) -> dict:
    """The figures of `steptail goodput RUN -o json`; UnknownRun for no such run."""
    known_run(store, run)
    with store.engine.connect() as conn:
        return timing_on(conn, run).report()


class GoodputCache:
    """Each run's report for the /metrics gauges, read again only when the run's rows changed
    (its step count or last stamp: what run_gauges reads from loss_summary) and then at most every
    `every_s` seconds. The report is kept at commit, so a read is one row; this keeps a scrape
    from reading even that for runs that did not move."""

    def __init__(self, store: Store, every_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.store, self.every_s, self.clock = store, every_s, clock
        self._reports: dict[str, tuple[tuple, float, dict]] = {}

    def get(self, run: str, state: tuple) -> dict:
        """The run's report; `state` tells whether its rows changed since it was read."""
        known = self._reports.get(run)
        now = self.clock()
        if known is not None and (known[0] == state or now - known[1] < self.every_s):
            return known[2]
        with self.store.engine.connect() as conn:
            report = timing_on(conn, run).report()
        self._reports[run] = (state, now, report)
        return report

    def keep(self, runs: set[str]) -> None:
        """Forget the runs no longer asked for (the gauges' runs are bounded; so is this)."""
        for run in set(self._reports) - runs:
            del self._reports[run]
