"""`loss_summary` (per incarnation: its LOSS-PARTS row count, lowest and highest step and
earliest and latest timestamp) and `loss_rollup` (the same per block of 16 steps, with the
CE extremes), kept in the same transaction as the rows.

Counted from the table around each write, not from the batch: a duplicate (ON CONFLICT DO
NOTHING) or a refused row changes nothing, so the summary is exactly what `loss_parts` holds.
Each count is a range scan over the batch's steps only (and a block's worth around them): the
cost follows the batch, not the incarnation's history. Alerts and panels read these instead
of aggregating every step stored."""

from __future__ import annotations

import sqlalchemy as sa

from steptail.runs.rows import LOSS_PARTS

_IN_SPAN = (" FROM loss_parts WHERE run = :run AND incarnation = :inc"
            " AND step BETWEEN :lo AND :hi")
_COUNT = sa.text("SELECT COUNT(*)" + _IN_SPAN)
_SPAN = sa.text("SELECT COUNT(*), MIN(step), MAX(step), MIN(ts_ns), MAX(ts_ns)" + _IN_SPAN)
_ROW = sa.text("SELECT steps, lo, hi, first_ts_ns, last_ts_ns FROM loss_summary"
               " WHERE run = :run AND incarnation = :inc")
_UPSERT = sa.text(
    "INSERT INTO loss_summary (run, incarnation, steps, lo, hi, first_ts_ns, last_ts_ns)"
    " VALUES (:run, :inc, :steps, :lo, :hi, :t0, :t1) ON CONFLICT (run, incarnation) DO UPDATE SET"
    " steps = excluded.steps, lo = excluded.lo, hi = excluded.hi,"
    " first_ts_ns = excluded.first_ts_ns, last_ts_ns = excluded.last_ts_ns")

# A block's rows counted again whole (SQL's integer division truncates: block 0 holds -15..15).
_BLOCKS = sa.text(
    "INSERT INTO loss_rollup (run, incarnation, block, steps, s0, s1, ce_lo, ce_hi, nan_step)"
    " SELECT run, incarnation, step / 16, COUNT(*), MIN(step), MAX(step), MIN(ce), MAX(ce),"
    " MIN(CASE WHEN ce IS NULL THEN step END)" + _IN_SPAN + " GROUP BY run, incarnation, step / 16"
    " ON CONFLICT (run, incarnation, block) DO UPDATE SET steps = excluded.steps, s0 = excluded.s0,"
    " s1 = excluded.s1, ce_lo = excluded.ce_lo, ce_hi = excluded.ce_hi, nan_step = excluded.nan_step")
BLOCK = 16

Span = tuple[str, int, int, int]  # run, incarnation, lowest step, highest step


def spans(rows: list[tuple]) -> list[Span]:
    """The step span of each incarnation in a batch's LOSS-PARTS rows."""
    out: dict[tuple[str, int], list[int]] = {}
    run_i, inc_i, step_i = LOSS_PARTS.RUN, LOSS_PARTS.INCARNATION, LOSS_PARTS.STEP
    for row in rows:
        span = out.get((row[run_i], row[inc_i]))
        step = row[step_i]
        if span is None:
            out[(row[run_i], row[inc_i])] = [step, step]
        elif step < span[0]:
            span[0] = step
        elif step > span[1]:
            span[1] = step
    return [(run, inc, lo, hi) for (run, inc), (lo, hi) in out.items()]


def before_write(conn: sa.Connection, rows: list[tuple]) -> list[tuple[Span, int]]:
    """Each span of `rows` with the rows the table already holds in it: call before writing
    them, then pass the result to `after_write` in the same transaction."""
    return [(s, conn.execute(_COUNT, _params(s)).scalar()) for s in spans(rows)]


def after_write(conn: sa.Connection, counted: list[tuple[Span, int]]) -> None:
    """Add what the write stored to each incarnation's summary."""
    for span, before in counted:
        p = _params(span)
        n, lo, hi, t0, t1 = conn.execute(_SPAN, p).one()
        if n == before:
            continue  # nothing new: duplicates, or every row refused
        old = conn.execute(_ROW, p).first()
        if old is not None:
            steps, old_lo, old_hi, old_t0, old_t1 = old
            n, lo, hi = steps + n - before, min(lo, old_lo), max(hi, old_hi)
            t0, t1 = _least(t0, old_t0), _greatest(t1, old_t1)
        conn.execute(_UPSERT, {"run": p["run"], "inc": p["inc"], "steps": n, "lo": lo, "hi": hi,
                               "t0": t0, "t1": t1})
        run, inc, lo, hi = span
        conn.execute(_BLOCKS, _params((run, inc, _block_start(lo), _block_end(hi))))


def _block_start(step: int) -> int:
    """The lowest step of the block holding `step`, as SQL's `step / 16` groups them."""
    block = int(step / BLOCK)
    return block * BLOCK - (BLOCK - 1 if block <= 0 else 0)


def _block_end(step: int) -> int:
    block = int(step / BLOCK)
    return block * BLOCK + (BLOCK - 1 if block >= 0 else 0)


def _params(span: Span) -> dict:
    run, inc, lo, hi = span
    # A step no column holds (refused, quarantined) must not fail the count itself.
    return {"run": run, "inc": inc, "lo": max(lo, -(2**63)), "hi": min(hi, 2**63 - 1)}


def _least(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _greatest(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)
