"""A run's CE downsampled for the page: per incarnation and per bucket of steps (a pixel's
worth), the rows, first and last step, CE min, max and last, the first non-finite step, the
first and last timestamp and the REQUIRED_RBF rows. The page draws a run of any length from a
bounded number of buckets and asks again for the range it zooms into; once a bucket is one
step wide, that is every step.

Min and max keep a spike visible however wide the bucket; `nan_step` keeps a NaN (stored as a
NULL ce); a bucket without rows is no bucket, so a gap wider than a bucket still breaks the
line (and the outline's gaps are exact). Buckets of 16 steps or more are made of
`loss_rollup`'s blocks of 16 (storage/summary.py, kept with the rows): a sixteenth of the rows
to group, so `from` is moved down to a block's start and `width` up to a multiple of 16; t0 is
then the timestamp of the bucket's first step. Narrower ones group the rows. Either way one
primary-key lookup per bucket for its last CE, and a GROUP BY of the REQUIRED_RBF rows.

That GROUP BY is the one cost that grows with the rows (there is no rollup of REQUIRED_RBF:
on PostgreSQL a scan of the table, its per-layer JSON inline); `rbf=False` leaves it out
(`rbf` None), so that the page's first draw of a long run does not wait for it."""

from __future__ import annotations

import sqlalchemy as sa

BUCKETS_MAX = 4000  # a wide screen's pixels; more is no downsampling

_SPAN = sa.text("SELECT MIN(lo), MAX(hi) FROM loss_summary WHERE run = :run")
# `step - :lo` is never negative here, so integer division floors on both stores.
_BUCKETS = sa.text("""
WITH b AS (
  SELECT incarnation, (step - :lo) / :w AS k, COUNT(*) AS n, MIN(step) AS s0, MAX(step) AS s1,
         MIN(ce) AS ce_min, MAX(ce) AS ce_max, MIN(CASE WHEN ce IS NULL THEN step END) AS nan_step,
         MIN(ts_ns) AS t0, MAX(ts_ns) AS t1
  FROM loss_parts WHERE run = :run AND step >= :lo AND step <= :hi
  GROUP BY incarnation, (step - :lo) / :w
)
SELECT b.incarnation, b.k, b.n, b.s0, b.s1, b.ce_min, b.ce_max, l.ce, l.ce_raw, b.nan_step, b.t0, b.t1
FROM b JOIN loss_parts l ON l.run = :run AND l.incarnation = b.incarnation AND l.step = b.s1
ORDER BY b.incarnation, b.k
""")
_ROLLED = sa.text("""
WITH b AS (
  SELECT incarnation, (block * 16 - :lo) / :w AS k, SUM(steps) AS n, MIN(s0) AS s0, MAX(s1) AS s1,
         MIN(ce_lo) AS ce_min, MAX(ce_hi) AS ce_max, MIN(nan_step) AS nan_step
  FROM loss_rollup WHERE run = :run AND block >= :lo / 16 AND block <= :hi / 16
  GROUP BY incarnation, (block * 16 - :lo) / :w
)
SELECT b.incarnation, b.k, b.n, b.s0, b.s1, b.ce_min, b.ce_max, l.ce, l.ce_raw, b.nan_step, f.ts_ns, l.ts_ns
FROM b JOIN loss_parts l ON l.run = :run AND l.incarnation = b.incarnation AND l.step = b.s1
JOIN loss_parts f ON f.run = :run AND f.incarnation = b.incarnation AND f.step = b.s0
ORDER BY b.incarnation, b.k
""")
BLOCK = 16  # storage.summary.BLOCK: loss_rollup's steps per block
_RBF = sa.text("""
SELECT incarnation, (step - :lo) / :w, COUNT(*) FROM required_rbf
WHERE run = :run AND step >= :lo AND step <= :hi GROUP BY incarnation, (step - :lo) / :w
""")
_BUCKET_KEYS = ("k", "n", "s0", "s1", "ce_min", "ce_max", "ce_last", "ce_last_raw", "nan_step", "t0_ns", "t1_ns",
                "rbf")


def series(conn: sa.Connection, run: str, buckets: int, lo: int | None = None, hi: int | None = None,
           rbf: bool = True) -> dict:
    """{"from", "to", "width", "buckets", "columns", "incarnations": [{"incarnation", "rows"}]}:
    steps `lo`..`hi` (default: the run's whole span, from loss_summary) cut into at most
    `buckets` buckets of `width` steps; each row in `columns`' order (column-wise keys once,
    not per bucket: a fifth of the bytes). rbf=False: each bucket's `rbf` None, not counted."""
    if lo is None or hi is None:
        first, last = conn.execute(_SPAN, {"run": run}).one()
        lo = first if lo is None else lo
        hi = last if hi is None else hi
    out = {"from": lo, "to": hi, "width": None, "buckets": buckets, "columns": list(_BUCKET_KEYS),
           "incarnations": []}
    if lo is None or hi is None or lo > hi:
        return out
    width = -(-(hi - lo + 1) // buckets)  # ceil: at most `buckets` buckets
    rolled = width >= BLOCK and lo >= 0  # block 0 holds -15..15 (SQL truncates): whole blocks from 0 up
    if rolled:
        lo -= lo % BLOCK
        width = BLOCK * -(-(hi - lo + 1) // (BLOCK * buckets))
        hi = lo + width * -(-(hi - lo + 1) // width) - 1  # the last block's end
        out["from"], out["to"] = lo, hi
    p = {"run": run, "lo": lo, "hi": hi, "w": width}
    counts = {(inc, k): int(n) for inc, k, n in conn.execute(_RBF, p)} if rbf else None
    incs: dict[int, list] = {}
    for inc, k, n, s0, s1, ce_min, ce_max, ce_last, raw, nan_step, t0, t1 in conn.execute(
            _ROLLED if rolled else _BUCKETS, p):
        incs.setdefault(inc, []).append([k, int(n), s0, s1, ce_min, ce_max, ce_last, raw, nan_step, t0, t1,
                                         None if counts is None else counts.get((inc, k), 0)])
    out["width"] = width
    out["incarnations"] = [{"incarnation": inc, "rows": rows} for inc, rows in sorted(incs.items())]
    return out


_STEP_TIMES = sa.text("""
SELECT incarnation, (step - :lo) / :w AS k, COUNT(*), MIN(step), MAX(step), MIN(seconds), MAX(seconds),
       AVG(seconds), AVG(tokens_per_s), AVG(tflops), MAX(ts_ns)
FROM pod_metrics WHERE run = :run AND step >= :lo AND step <= :hi
GROUP BY incarnation, (step - :lo) / :w ORDER BY incarnation, k
""")
_STEP_SPAN = sa.text("SELECT MIN(step), MAX(step) FROM pod_metrics WHERE run = :run")
STEP_TIME_KEYS = ("k", "n", "s0", "s1", "seconds_min", "seconds_max", "seconds", "tokens_per_s", "tflops", "t1_ns")


def step_times(conn: sa.Connection, run: str, buckets: int) -> dict:
    """The MaxText `completed step` lines (pod_metrics: seconds, TFLOP/s and tokens/s per
    device) per incarnation in at most `buckets` buckets of steps: the mean of each (and the
    slowest and fastest step: a stall shows however wide the bucket). Shaped as series()."""
    lo, hi = conn.execute(_STEP_SPAN, {"run": run}).one()
    out = {"from": lo, "to": hi, "width": None, "buckets": buckets, "columns": list(STEP_TIME_KEYS),
           "incarnations": []}
    if lo is None:
        return out
    width = -(-(hi - lo + 1) // buckets)
    incs: dict[int, list] = {}
    for inc, *rest in conn.execute(_STEP_TIMES, {"run": run, "lo": lo, "hi": hi, "w": width}):
        incs.setdefault(inc, []).append([int(rest[0]), int(rest[1]), *rest[2:]])
    out["width"] = width
    out["incarnations"] = [{"incarnation": inc, "rows": rows} for inc, rows in sorted(incs.items())]
    return out
