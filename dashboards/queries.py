"""The SQL of every panel, annotation, variable and alert rule (PostgreSQL, Grafana macros).

Kept apart from the builders so that tests and the benchmark run exactly this text, after
expanding Grafana's macros and variables (dashboards.macros). Timestamps are `ts_ns`
nanoseconds, hence `$__unixEpochNanoFilter` and `to_timestamp(ts_ns / 1e9)`. A series is one
incarnation of one run, named `<run> #<incarnation>`: replayed steps after a restore show as
their own line instead of zig-zagging back over the first recording."""

from __future__ import annotations

from steptail.runs.findings import CRITICAL, NONFINITE_CE, RESUME_MISMATCH, STEP1_CE_GATE, Settings

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
CE_BY_STEP = f"""
SELECT {SERIES} AS series, step, ce
FROM loss_parts
WHERE run IN ($run)
ORDER BY run, incarnation, step
""".strip()

CE_OVER_TIME = f"""
SELECT to_timestamp(ts_ns / 1e9) AS time, {SERIES} AS metric, ce AS value
FROM loss_parts
WHERE run IN ($run) AND $__unixEpochNanoFilter(ts_ns)
ORDER BY 1, 2
""".strip()

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
# first_step to the first recorded step at or after last_step (a gap's steps have no row).
FINDINGS_ANNOTATIONS = """
SELECT to_timestamp(a.t0 / 1e9) AS time, to_timestamp(COALESCE(a.t1, a.t0) / 1e9) AS timeend,
       a.run || ': ' || a.kind || ' (steps ' || a.first_step || '-' || a.last_step || ') '
         || a.detail AS text,
       a.kind || ',' || a.severity || ',' || a.run AS tags
FROM (
  SELECT f.*,
    COALESCE((SELECT l.ts_ns FROM loss_parts l
              WHERE l.run = f.run AND (f.incarnation = 0 OR l.incarnation = f.incarnation)
                AND l.step <= f.first_step AND l.ts_ns IS NOT NULL
              ORDER BY l.step DESC, l.incarnation DESC LIMIT 1), f.detected_ns) AS t0,
    (SELECT l.ts_ns FROM loss_parts l
     WHERE l.run = f.run AND (f.incarnation = 0 OR l.incarnation = f.incarnation)
       AND l.step >= f.last_step AND l.ts_ns IS NOT NULL
     ORDER BY l.step, l.incarnation LIMIT 1) AS t1
  FROM findings f
  WHERE f.run IN ($run)
) a
WHERE a.t0 BETWEEN $__unixEpochNanoFrom() AND $__unixEpochNanoTo()
ORDER BY 1
""".strip()

# -- REQUIRED_RBF dashboard ----------------------------------------------------------------
RBF_MAX_BY_STEP = f"""
SELECT {SERIES} AS series, step, max
FROM required_rbf
WHERE run IN ($run)
ORDER BY run, incarnation, step
""".strip()

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
# "reconnects": streams the follower re-opened (silence, EOF); "stream gaps": stretches of
# log that could not be read back; "open findings": every finding recorded for the run
# (findings carry no resolution state).
FLEET = """
SELECT r.run, r.namespace, r.jobset, last.incarnation, last.step AS last_step,
       EXTRACT(EPOCH FROM now()) - last.ts_ns / 1e9 AS seconds_since_last_step,
       (SELECT COUNT(*) FROM stream_reconnects c WHERE c.run = r.run) AS reconnects,
       (SELECT COUNT(*) FROM stream_gaps g WHERE g.run = r.run) AS stream_gaps,
       (SELECT COUNT(*) FROM findings f WHERE f.run = r.run) AS open_findings
FROM runs r
LEFT JOIN LATERAL (
  SELECT l.incarnation, l.step, l.ts_ns FROM loss_parts l WHERE l.run = r.run
  ORDER BY l.incarnation DESC, l.step DESC LIMIT 1
) last ON true
WHERE COALESCE(r.namespace, '-') IN ($namespace)
ORDER BY r.run
""".strip()

# -- alert rules (table format: string columns become labels, the number is the value) ----
_ACTIVE = """
SELECT run FROM loss_parts
WHERE ts_ns BETWEEN $__unixEpochNanoFrom() AND $__unixEpochNanoTo()
GROUP BY run
""".strip()

# The steps missing per run, as steptail.runs.gaps defines them (held to it on both stores by
# tests/test_missing_step_definition.py): between two recorded steps of one incarnation, plus
# head gaps: before an incarnation's first step and after the step it is known to start from
# (its restored checkpoint, 0 for a fresh start, when the start-up or a restore line was read;
# else the highest checkpoint its earlier incarnations saved, 0 when none was read and one of
# them had an unread head, else the last multiple of the config's checkpoint_period at or below
# their highest step, else their highest step, 0 for the first: a head never read).
# (run, incarnation, step) is unique, so max - min + 1 - count is exactly the sum of the inner
# gaps: one aggregate instead of a window over every row.
ALERT_MISSING_STEPS = f"""
WITH active AS ({_ACTIVE}),
per_inc AS (
  SELECT run, incarnation, MIN(step) AS lo, MAX(step) AS hi, COUNT(*) AS n FROM loss_parts
  WHERE run IN (SELECT run FROM active) GROUP BY run, incarnation
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

# Time since the last step, in median step intervals of the current incarnation's last 100.
ALERT_STALL = f"""
WITH active AS ({_ACTIVE}),
cur AS (
  SELECT run, MAX(incarnation) AS incarnation FROM loss_parts
  WHERE run IN (SELECT run FROM active) GROUP BY run
),
recent AS (
  SELECT l.run, l.step, l.ts_ns,
         ROW_NUMBER() OVER (PARTITION BY l.run ORDER BY l.step DESC) AS k
  FROM loss_parts l JOIN cur c ON c.run = l.run AND c.incarnation = l.incarnation
  WHERE l.ts_ns IS NOT NULL
),
intervals AS (
  SELECT run, ts_ns - LEAD(ts_ns) OVER (PARTITION BY run ORDER BY step DESC) AS dt
  FROM recent WHERE k <= 101
)
SELECT i.run,
       (($__unixEpochNanoTo() - MAX(r.ts_ns))
         / NULLIF(percentile_cont(0.5) WITHIN GROUP (ORDER BY i.dt), 0))::float8 AS stall_ratio
FROM intervals i JOIN recent r ON r.run = i.run AND r.k = 1
WHERE i.dt IS NOT NULL AND i.dt > 0
GROUP BY i.run
ORDER BY i.run
""".strip()

_FINDINGS_OF_ACTIVE = """
SELECT r.run, COUNT(f.id)::float8 AS {column}
FROM runs r
LEFT JOIN findings f ON f.run = r.run AND {kinds}
WHERE r.run IN (SELECT run FROM active) OR f.detected_ns >= $__unixEpochNanoFrom()
GROUP BY r.run
ORDER BY r.run
""".strip()

ALERT_STEP1_GATE = f"WITH active AS ({_ACTIVE})\n" + _FINDINGS_OF_ACTIVE.format(
    column="failed_gates", kinds=GATE_KINDS)

ALERT_DIVERGENCE = f"WITH active AS ({_ACTIVE})\n" + _FINDINGS_OF_ACTIVE.format(
    column="divergences", kinds=DIVERGENCE_KINDS)
