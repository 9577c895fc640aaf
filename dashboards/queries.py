"""The SQL of every panel, annotation, variable and alert rule (PostgreSQL, Grafana macros).

Kept apart from the builders so that tests and the benchmark run exactly this text, after
expanding Grafana's macros and variables (dashboards.macros). Timestamps are `ts_ns`
nanoseconds, hence `$__unixEpochNanoFilter` and `to_timestamp(ts_ns / 1e9)`. A series is one
incarnation of one run, named `<run> #<incarnation>`: replayed steps after a restore show as
their own line instead of zig-zagging back over the first recording."""

from __future__ import annotations

from steptail.runs import state as st
from steptail.runs.detect import Settings
from steptail.runs.findings import CRITICAL, NONFINITE_CE, RESUME_MISMATCH, STEP1_CE_GATE

# Finding kinds written by the detectors (steptail.runs.findings.KINDS). A step-1 gate that could
# not run for want of a reference is a warning, not a failed gate. "divergence" also matches
# an arm-vs-control kind should one be stored.
GATE_KINDS = f"f.kind = '{STEP1_CE_GATE}' AND f.severity = '{CRITICAL}'"
DIVERGENCE_KINDS = f"(f.kind IN ('{RESUME_MISMATCH}', '{NONFINITE_CE}') OR f.kind LIKE '%diverg%')"
STALL_FACTOR = Settings().stall_k  # stalled: no step for k x the median step time
ALERT_WINDOW_S = 6 * 3600  # alerts consider runs that logged a step in the last 6 h

SERIES = "run || ' #' || incarnation"

# -- variables ------------------------------------------------------------------------
VAR_NAMESPACE = "SELECT DISTINCT COALESCE(namespace, '-') FROM runs ORDER BY 1"
VAR_RUN = (
    "SELECT run FROM runs WHERE COALESCE(namespace, '-') IN ($namespace) ORDER BY updated_ns DESC"
)

# -- Run dashboard ----------------------------------------------------------------------
# A panel gets what it can draw, not every step: the steps of the selected runs are cut into
# at most $points buckets of equal width (`points` dashboard variable; 0 = every step, the raw
# series), and each bucket gives its lowest and highest value (at its first and last step, so
# a line through them draws the band the raw series fills). A non-finite value (stored as
# NULL) and missing steps stay visible: each adds a NULL point where it is, which breaks the
# line there. The width comes from `loss_summary`, so no pass over the rows is needed for it.
POINTS_VARIABLE = "points"
POINTS_DEFAULT = 1000  # a full-width panel is ~1,000-2,000 px: at most 2 points per pixel
BLOCK = 16  # steps per loss_rollup block (storage.summary)

def _span(blocks: str) -> str:
    """The CTEs `span` (the selected runs' steps, from loss_summary) and `width` (the buckets'
    width and first step; `blocks`: SQL that says whether they are made of loss_rollup blocks)."""
    return f"""
span AS (
  SELECT MIN(lo) AS lo, CASE WHEN $points > 0
      THEN GREATEST(1, CEIL((MAX(hi) - MIN(lo) + 1) / $points::numeric))::int ELSE 1 END AS w
  FROM loss_summary WHERE run IN ($run)
),
width AS (
  SELECT {blocks} AS blocks,
         CASE WHEN {blocks} THEN lo / {BLOCK} * {BLOCK} ELSE lo END AS lo,
         CASE WHEN {blocks} THEN (w + {BLOCK - 1}) / {BLOCK} * {BLOCK} ELSE w END AS width
  FROM span
)""".strip()


# Once a bucket holds 16 steps or more it is made of whole loss_rollup blocks (the width
# rounded up to a multiple of 16, the first bucket starting on a block): the panel reads one
# row per block, not per step. Below that, or with a step below 0 (block 0 holds -15..15), the
# rows themselves.
_BLOCKS_WHEN = f"w >= {BLOCK} AND lo >= 0"
# CE reads its rows only when the buckets are not made of blocks: the steps -2^31..2^31-1
# (loss_parts.step is an INTEGER: all of them), or none (1..0). The bounds are known only when
# the query runs, so the planner takes them to keep 0.5% of the rows, not all: without them a
# 5-run panel was planned as reading the 100,000 rows it never reads, and that cost alone made
# PostgreSQL JIT-compile the query (past jit_above_cost): ~100 ms of its ~110 ms. With
# $points = 0 (every step) the rows are always read, and the planner is left to know it.
# (REQUIRED_RBF reads all its rows: there the planner's estimate is right.)
_CE_ROWS_WHEN = (f"($points = 0 OR t.step BETWEEN (SELECT CASE WHEN NOT blocks THEN {-(2**31)} ELSE 1 END FROM width)"
                 f"\n    AND (SELECT CASE WHEN NOT blocks THEN {2**31 - 1} ELSE 0 END FROM width))")

_BUCKETS_OF_ROWS = """
  SELECT t.run, t.incarnation, (t.step - width.lo) / width.width AS bucket,
         MIN(t.step) AS s0, MAX(t.step) AS s1, COUNT(*) AS n, MIN(t.{y}) AS y_lo, MAX(t.{y}) AS y_hi,
         MIN(CASE WHEN t.{y} IS NULL THEN t.step END) AS nan_step
  FROM {table} t CROSS JOIN width
  WHERE t.run IN ($run) AND {rows_when}
  GROUP BY t.run, t.incarnation, 3""".strip("\n")

_BUCKETS_OF_BLOCKS = """
  SELECT r.run, r.incarnation, (r.s0 - width.lo) / width.width AS bucket,
         MIN(r.s0), MAX(r.s1), SUM(r.steps), MIN(r.ce_lo), MAX(r.ce_hi), MIN(r.nan_step)
  FROM loss_rollup r CROSS JOIN width
  WHERE r.run IN ($run) AND (SELECT blocks FROM width)
  GROUP BY r.run, r.incarnation, 3""".strip("\n")

# Each bucket gives its points in one pass over the buckets, k = 0..4 (a NULL step is no
# point): its lowest value at its first step (0), its highest at its last (1), a break at its
# first non-finite value (2), just after the previous bucket's last step when steps are missing
# before it (3), just after its own first step when steps are missing inside it (4). (Not five
# scans of the buckets, nor a LATERAL VALUES list: PostgreSQL 15 builds its expressions anew for
# every bucket.)
_BUCKETED_BY_STEP = """
WITH {span},
b AS (
{buckets}
),
g AS (
  SELECT b.*, LAG(s1) OVER (PARTITION BY run, incarnation ORDER BY bucket) AS prev FROM b
)
SELECT run || ' #' || incarnation AS series, step, {y} FROM (
  SELECT g.run, g.incarnation, k.k,
         CASE k.k WHEN 0 THEN CASE WHEN g.y_lo IS NOT NULL THEN g.s0 END
                  WHEN 1 THEN CASE WHEN g.y_hi IS NOT NULL AND g.s1 > g.s0 THEN g.s1 END
                  WHEN 2 THEN g.nan_step
                  WHEN 3 THEN CASE WHEN g.s0 > g.prev + 1 THEN g.prev + 1 END
                  ELSE CASE WHEN g.n < g.s1 - g.s0 + 1 THEN g.s0 + 1 END END AS step,
         CASE k.k WHEN 0 THEN g.y_lo WHEN 1 THEN g.y_hi END AS {y}
  FROM g CROSS JOIN unnest('{{0,1,2,3,4}}'::int[]) AS k (k)
) p
WHERE step IS NOT NULL
ORDER BY run, incarnation, step, k
""".strip()

# The same over time: buckets of Grafana's $__interval_ms (the time range over the panel's
# width), each bucket's lowest and highest CE at its first and last timestamp.
_BUCKETED_OVER_TIME = """
WITH b AS (
  SELECT run, incarnation, ts_ns / ($__interval_ms::bigint * 1000000) AS bucket,
         MIN(ts_ns) AS t0, MAX(ts_ns) AS t1, MIN(step) AS s0, MAX(step) AS s1, COUNT(*) AS n,
         MIN({y}) AS y_lo, MAX({y}) AS y_hi, MIN(ts_ns) FILTER (WHERE {y} IS NULL) AS nan_ts
  FROM {table}
  WHERE run IN ($run) AND $__unixEpochNanoFilter(ts_ns)
  GROUP BY run, incarnation, 3
),
g AS (
  SELECT b.*, LAG(s1) OVER w AS prev_step, LAG(t1) OVER w AS prev_t
  FROM b WINDOW w AS (PARTITION BY run, incarnation ORDER BY bucket)
)
SELECT to_timestamp(t / 1e9) AS time, run || ' #' || incarnation AS metric, value FROM (
  SELECT run, incarnation, t0 AS t, y_lo AS value FROM g WHERE y_lo IS NOT NULL
  UNION ALL
  SELECT run, incarnation, t1, y_hi FROM g WHERE y_hi IS NOT NULL AND t1 > t0
  UNION ALL
  SELECT run, incarnation, nan_ts, NULL FROM g WHERE nan_ts IS NOT NULL
  UNION ALL  -- missing steps: a break just after the last step before them
  SELECT run, incarnation, prev_t + 1, NULL FROM g WHERE s0 > prev_step + 1
  UNION ALL
  SELECT run, incarnation, t0 + 1, NULL FROM g WHERE n < s1 - s0 + 1 AND t1 > t0
) p
ORDER BY 1, 2
""".strip()

CE_BY_STEP = _BUCKETED_BY_STEP.format(span=_span(_BLOCKS_WHEN), y="ce", buckets=(
    _BUCKETS_OF_ROWS.format(table="loss_parts", y="ce", rows_when=_CE_ROWS_WHEN)
    + "\n  UNION ALL\n" + _BUCKETS_OF_BLOCKS))

# Every step, for "raw" (points = 0 gives the same rows, plus the breaks).
CE_BY_STEP_RAW = f"""
SELECT {SERIES} AS series, step, ce
FROM loss_parts
WHERE run IN ($run)
ORDER BY run, incarnation, step
""".strip()

CE_OVER_TIME = _BUCKETED_OVER_TIME.format(table="loss_parts", y="ce")

STEP_SECONDS = f"""
SELECT to_timestamp(ts_ns / 1e9) AS time, {SERIES} AS metric, seconds AS value
FROM pod_metrics
WHERE run IN ($run) AND seconds IS NOT NULL AND $__unixEpochNanoFilter(ts_ns)
ORDER BY 1, 2
""".strip()

TOKENS_PER_S = f"""
SELECT to_timestamp(ts_ns / 1e9) AS time, {SERIES} AS metric, tokens_per_s AS value
FROM pod_metrics
WHERE run IN ($run) AND tokens_per_s IS NOT NULL AND $__unixEpochNanoFilter(ts_ns)
ORDER BY 1, 2
""".strip()

# A finding is drawn over the time of its steps: from the last recorded step at or before
# first_step to the first recorded step at or after last_step (a gap's steps have no row). One
# not tied to a step (first_step -1: a runbook rule the JobSet breaks, a stream or auth failure
# before any step) is drawn where it was detected.
FINDINGS_ANNOTATIONS = """
SELECT to_timestamp(a.t0 / 1e9) AS time, to_timestamp(COALESCE(a.t1, a.t0) / 1e9) AS timeend,
       a.run || ': ' || a.kind
         || CASE WHEN a.first_step < 0 THEN ' ' ELSE ' (steps ' || a.first_step || '-' || a.last_step || ') ' END
         || a.detail AS text,
       a.kind || ',' || a.severity || ',' || a.run AS tags
FROM (
  SELECT f.*,
    CASE WHEN f.first_step < 0 THEN f.detected_ns ELSE
    COALESCE((SELECT l.ts_ns FROM loss_parts l
              WHERE l.run = f.run AND (f.incarnation = 0 OR l.incarnation = f.incarnation)
                AND l.step <= f.first_step AND l.ts_ns IS NOT NULL
              ORDER BY l.step DESC, l.incarnation DESC LIMIT 1), f.detected_ns) END AS t0,
    CASE WHEN f.first_step < 0 THEN NULL ELSE
    (SELECT l.ts_ns FROM loss_parts l
     WHERE l.run = f.run AND (f.incarnation = 0 OR l.incarnation = f.incarnation)
       AND l.step >= f.last_step AND l.ts_ns IS NOT NULL
     ORDER BY l.step, l.incarnation LIMIT 1) END AS t1
  FROM findings f
  WHERE f.run IN ($run)
) a
WHERE a.t0 BETWEEN $__unixEpochNanoFrom() AND $__unixEpochNanoTo()
ORDER BY 1
""".strip()

# -- REQUIRED_RBF dashboard ----------------------------------------------------------------
# REQUIRED_RBF has no rollup: its buckets are made of rows at any width.
RBF_MAX_BY_STEP = _BUCKETED_BY_STEP.format(
    span=_span("false"), y="max",
    buckets=_BUCKETS_OF_ROWS.format(table="required_rbf", y="max", rows_when="true"))

# One series per layer (zero-padded so that buckets sort), as the heatmap's y buckets.
RBF_PER_LAYER = """
SELECT to_timestamp(r.ts_ns / 1e9) AS time,
       'layer ' || lpad((e.ord - 1)::text, 3, '0') AS metric, e.v::float8 AS value
FROM required_rbf r
CROSS JOIN LATERAL jsonb_array_elements_text(r.per_layer) WITH ORDINALITY AS e(v, ord)
WHERE r.run IN ($run) AND $__unixEpochNanoFilter(r.ts_ns)
ORDER BY 1, 2
""".strip()

# -- Fleet dashboard ---------------------------------------------------------------------
# The runs seen since the start of the time range: a step logged in it (loss_summary's index
# on the last timestamp) or written to since (ix_runs_updated: a run with no step yet). The
# fleet table costs the fleet's size, not the store's history. "reconnects": streams the
# follower re-opened (silence, EOF); "stream gaps": stretches of log that could not be read
# back; "open findings": every finding recorded for the run (findings carry no resolution
# state). "state": steptail.runs.state.decide in SQL, with its constants (tests hold the two
# to the same answers): the run's source, the end the collector recorded, its heartbeat, the
# last step against k x the latest incarnation's mean step time (at least MIN_STALL_S).
_NOW_NS = "(EXTRACT(EPOCH FROM now()) * 1e9)"
_STATE = f"""
  CASE
    WHEN NOT EXISTS (SELECT 1 FROM run_sources x WHERE x.run = r.run AND x.source <> 'files') THEN '{st.INGESTED}'
    WHEN r.outcome IN ('{st.COMPLETED}', '{st.JOBSET_FAILED}')
         AND (span.last_ns IS NULL OR r.outcome_ns IS NULL OR span.last_ns <= r.outcome_ns + {st.STALE_NS})
      THEN CASE r.outcome WHEN '{st.COMPLETED}' THEN '{st.ENDED}' ELSE '{st.FAILED}' END
    WHEN r.followed_ns IS NULL OR {_NOW_NS} - r.followed_ns > {st.FOLLOWED_NS} THEN '{st.UNKNOWN}'
    WHEN span.last_ns IS NULL THEN '{st.LIVE}'
    WHEN {_NOW_NS} - span.last_ns > GREATEST({st.STALL_K} * COALESCE(pace.seconds, 0), {st.MIN_STALL_S}) * 1e9
      THEN '{st.STALLED}'
    ELSE '{st.LIVE}'
  END""".strip()
FLEET = f"""
WITH seen AS (
  SELECT run FROM loss_summary WHERE last_ts_ns >= $__unixEpochNanoFrom()
  UNION SELECT run FROM runs WHERE updated_ns >= $__unixEpochNanoFrom()
)
SELECT r.run, {_STATE} AS state, r.namespace, r.jobset, last.incarnation, last.hi AS last_step,
       EXTRACT(EPOCH FROM now()) - last.last_ts_ns / 1e9 AS seconds_since_last_step,
       (SELECT COUNT(*) FROM stream_reconnects c WHERE c.run = r.run) AS reconnects,
       (SELECT COUNT(*) FROM stream_gaps g WHERE g.run = r.run) AS stream_gaps,
       (SELECT COUNT(*) FROM findings f WHERE f.run = r.run) AS open_findings
FROM runs r JOIN seen ON seen.run = r.run
LEFT JOIN LATERAL (
  SELECT s.incarnation, s.hi, s.last_ts_ns FROM loss_summary s WHERE s.run = r.run
  ORDER BY s.incarnation DESC LIMIT 1
) last ON true
LEFT JOIN LATERAL (SELECT MAX(s.last_ts_ns) AS last_ns FROM loss_summary s WHERE s.run = r.run) span ON true
LEFT JOIN LATERAL (
  SELECT (s.last_ts_ns - s.first_ts_ns) / 1e9 / (s.hi - s.lo) AS seconds FROM loss_summary s
  WHERE s.run = r.run AND s.hi > s.lo AND s.last_ts_ns >= s.first_ts_ns
  ORDER BY s.incarnation DESC LIMIT 1
) pace ON true
WHERE COALESCE(r.namespace, '-') IN ($namespace)
ORDER BY r.run
""".strip()

# Goodput per run that logged a step in the range (docs/goodput.md): the figures kept at commit
# in run_goodput (storage.goodput), one row per run: the cost of the live runs, not of their steps.
GOODPUT = """
WITH seen AS (SELECT DISTINCT run FROM loss_summary WHERE last_ts_ns >= $__unixEpochNanoFrom())
SELECT g.run, g.goodput, g.wall_s, g.productive_s, g.replayed_s, g.recovery_s, g.checkpoint_s, g.other_s,
       g.median_step_s
FROM run_goodput g JOIN seen ON seen.run = g.run JOIN runs r ON r.run = g.run
WHERE COALESCE(r.namespace, '-') IN ($namespace)
ORDER BY g.run
""".strip()

# -- alert rules (table format: string columns become labels, the number is the value) ----
# Runs that logged a step in the window, from the per-incarnation summary kept at commit
# (storage.summary) and its index on the latest timestamp: a range scan over the live runs,
# whatever the history. "In the window" is read as "its steps span reaches into it": the same
# for any run whose clock runs forward.
_ACTIVE = """
SELECT DISTINCT run FROM loss_summary
WHERE last_ts_ns >= $__unixEpochNanoFrom() AND first_ts_ns <= $__unixEpochNanoTo()
""".strip()

# The steps missing per run, as steptail.runs.gaps defines them (held to it on both stores by
# tests/test_missing_step_definition.py): between two recorded steps of one incarnation, plus
# head gaps: before an incarnation's first step and after the step it is known to start from
# (its restored checkpoint, 0 for a fresh start, when the start-up or a restore line was read;
# else the highest checkpoint its earlier incarnations saved, 0 when none was read and one of
# them had an unread head, else the last multiple of the config's checkpoint_period at or below
# their highest step, else their highest step, 0 for the first: a head never read).
# (run, incarnation, step) is unique, so hi - lo + 1 - steps (loss_summary, kept at commit) is
# exactly the sum of the inner gaps: no pass over the rows at all.
ALERT_MISSING_STEPS = f"""
WITH active AS ({_ACTIVE}),
per_inc AS (
  SELECT run, incarnation, lo, hi, steps AS n FROM loss_summary WHERE run IN (SELECT run FROM active)
),
inner_gaps AS (
  SELECT run, SUM(hi - lo + 1 - n) AS missing FROM per_inc GROUP BY run
),
periods AS (
  SELECT run, incarnation, CASE WHEN v <> '' AND LENGTH(v) <= 9 AND LTRIM(v, '0123456789') = ''
      THEN NULLIF(CAST(v AS INTEGER), 0) END AS period
  FROM (SELECT run, incarnation, TRIM(value) AS v FROM config
        WHERE name = 'checkpoint_period' AND run IN (SELECT run FROM active)) c
),
heads AS (
  SELECT i.run, i.first_step, CASE WHEN i.saw_start OR i.restored_from IS NOT NULL
      THEN COALESCE(i.restored_from, 0)
      ELSE COALESCE((SELECT MAX(c.step) FROM checkpoints c WHERE c.run = i.run AND c.kind = 'save'
                       AND c.incarnation < i.incarnation),
                    (SELECT MIN(0) FROM incarnations e WHERE e.run = i.run AND e.incarnation < i.incarnation
                       AND e.first_step IS NOT NULL AND NOT e.saw_start AND e.restored_from IS NULL),
                    (SELECT MAX(p.hi) FROM per_inc p WHERE p.run = i.run AND p.incarnation < i.incarnation)
                      / (SELECT k.period FROM periods k WHERE k.run = i.run AND k.incarnation <= i.incarnation
                           AND k.period IS NOT NULL ORDER BY k.incarnation DESC LIMIT 1)
                      * (SELECT k.period FROM periods k WHERE k.run = i.run AND k.incarnation <= i.incarnation
                           AND k.period IS NOT NULL ORDER BY k.incarnation DESC LIMIT 1),
                    (SELECT MAX(p.hi) FROM per_inc p WHERE p.run = i.run AND p.incarnation < i.incarnation), 0)
    END AS known
  FROM incarnations i WHERE i.run IN (SELECT run FROM active) AND i.first_step IS NOT NULL
),
head_gaps AS (
  SELECT run, SUM(first_step - known - 1) AS missing FROM heads WHERE first_step > known + 1 GROUP BY run
)
SELECT a.run, (COALESCE(g.missing, 0) + COALESCE(h.missing, 0))::float8 AS missing_steps
FROM active a LEFT JOIN inner_gaps g ON g.run = a.run LEFT JOIN head_gaps h ON h.run = a.run
ORDER BY a.run
""".strip()

# Time since the last step, in median step intervals of the current incarnation's last 100:
# each active run reads its last 101 timestamped steps backwards along the key, no more.
ALERT_STALL = f"""
WITH active AS ({_ACTIVE}),
cur AS (
  SELECT run, MAX(incarnation) AS incarnation FROM loss_summary
  WHERE run IN (SELECT run FROM active) GROUP BY run
),
recent AS (
  SELECT c.run, x.step, x.ts_ns, ROW_NUMBER() OVER (PARTITION BY c.run ORDER BY x.step DESC) AS k
  FROM cur c CROSS JOIN LATERAL (
    SELECT l.step, l.ts_ns FROM loss_parts l
    WHERE l.run = c.run AND l.incarnation = c.incarnation AND l.ts_ns IS NOT NULL
    ORDER BY l.step DESC LIMIT 101
  ) x
),
intervals AS (
  SELECT run, ts_ns - LEAD(ts_ns) OVER (PARTITION BY run ORDER BY step DESC) AS dt
  FROM recent
)
SELECT i.run,
       (($__unixEpochNanoTo() - MAX(r.ts_ns))
         / NULLIF(percentile_cont(0.5) WITHIN GROUP (ORDER BY i.dt), 0))::float8 AS stall_ratio
FROM intervals i JOIN recent r ON r.run = i.run AND r.k = 1
WHERE i.dt IS NOT NULL AND i.dt > 0
GROUP BY i.run
ORDER BY i.run
""".strip()

# The runs in scope: the active ones, and those with a finding of the kinds detected in the
# window (ix_findings_detected): an active run counts all its findings of the kinds, another
# only the recent ones.
_FINDINGS_OF_ACTIVE = """
SELECT s.run, COUNT(f.id)::float8 AS {column}
FROM (SELECT run FROM active
      UNION SELECT f.run FROM findings f WHERE {kinds} AND f.detected_ns >= $__unixEpochNanoFrom()) s
LEFT JOIN findings f ON f.run = s.run AND {kinds}
  AND (s.run IN (SELECT run FROM active) OR f.detected_ns >= $__unixEpochNanoFrom())
GROUP BY s.run
ORDER BY s.run
""".strip()

ALERT_STEP1_GATE = f"WITH active AS ({_ACTIVE})\n" + _FINDINGS_OF_ACTIVE.format(
    column="failed_gates", kinds=GATE_KINDS)

ALERT_DIVERGENCE = f"WITH active AS ({_ACTIVE})\n" + _FINDINGS_OF_ACTIVE.format(
    column="divergences", kinds=DIVERGENCE_KINDS)
