"""A run's state, from the run itself (never from when a row was last written): one definition
for the page, `runs`, the API, the live view and the dashboards (docs/verdicts.md "Run state").

Pure: the caller gathers the facts (the store's rows, or the live follower's view).

- `ingested`: the run comes from saved files only (no cluster source): nothing follows it.
- `failed`: the collector saw its JobSet fail (terminalState/condition Failed, or deleted after
  failing).
- `ended`: the collector saw it end well (process 0 completed, or the JobSet Completed).
  An outcome older than the run's last step (by over STALE_NS) is stale: the run went on after
  it (a JobSet of that name again), and it is ignored.
- `unknown`: a run of the cluster no collector follows now (its heartbeat is older than
  `followed_ns`) and whose end was never seen: "not followed since …".
- `stalled`: followed now, and no step for longer than k × its step time (and at least
  `min_stall_s`, the store's lag: a step reaches it a flush after it was logged).
- `live`: followed now, a step within that bound (or no step yet: waiting for the first)."""

from __future__ import annotations

from dataclasses import dataclass

from steptail.parsers import format_ns
from steptail.runs.detect.stall import StallSettings

LIVE, STALLED, ENDED, FAILED, INGESTED, UNKNOWN = "live", "stalled", "ended", "failed", "ingested", "unknown"
STATES = (LIVE, STALLED, ENDED, FAILED, INGESTED, UNKNOWN)
ADMITTED = (LIVE, STALLED)  # the workload is still admitted: stopping it applies (runs.policy)

# What the collector records of a run's end (runs.outcome).
COMPLETED, JOBSET_FAILED = "completed", "failed"
OUTCOMES = (COMPLETED, JOBSET_FAILED)

STALL_K = StallSettings.stall_k  # the detectors' default: stalled after k x the median step time
MIN_STALL_S = 30.0  # below this a quiet spell is the store's and the clocks' lag, not the run's
HEARTBEAT_S = 10.0  # how often a collector says it still follows its runs (runs.followed_ns)
FOLLOWED_NS = 60 * 10**9  # a heartbeat this recent: the run is followed now (6 beats missed: not)
# An end is stale when a step came this long after it (log stamps are the kubelet's clock, the
# end the collector's: a skew of seconds must not undo an end)
STALE_NS = 60 * 10**9


@dataclass(frozen=True)
class Facts:
    """What is known of one run, wherever it comes from."""

    from_cluster: bool  # a kubernetes:… source (follow), not only saved files
    outcome: str | None = None  # COMPLETED, JOBSET_FAILED, or None: no end seen
    outcome_ns: int | None = None
    outcome_reason: str | None = None
    followed_ns: int | None = None  # the collector's last heartbeat for the run (its liveness, not the run's)
    last_step_ns: int | None = None  # the stamp of the run's last step (its log's clock)
    step_seconds: float | None = None  # the run's step time (the store: a mean per step)


@dataclass(frozen=True)
class RunState:
    state: str
    reason: str  # one sentence: why this state
    since_ns: int | None = None  # when it became so, where known

    def to_dict(self) -> dict:
        return {"state": self.state, "reason": self.reason,
                "since": None if self.since_ns is None else format_ns(self.since_ns)}


def stall_after_s(step_seconds: float | None, k: float = STALL_K, min_stall_s: float = MIN_STALL_S) -> float:
    """Seconds without a step after which a followed run is `stalled`."""
    if step_seconds is None or step_seconds <= 0 or k <= 0:
        return min_stall_s
    return max(k * step_seconds, min_stall_s)


def decide(f: Facts, now_ns: int, k: float = STALL_K, followed_ns: int = FOLLOWED_NS,
           min_stall_s: float = MIN_STALL_S) -> RunState:
    """The run's state now (see the module's docstring)."""
    if not f.from_cluster:
        return RunState(INGESTED, "from saved log files: not followed")
    stale = f.outcome_ns is not None and f.last_step_ns is not None and f.last_step_ns > f.outcome_ns + STALE_NS
    if f.outcome in OUTCOMES and not stale:
        why = f.outcome_reason or ("process 0 completed" if f.outcome == COMPLETED else "its JobSet failed")
        return RunState(ENDED if f.outcome == COMPLETED else FAILED, why, f.outcome_ns)
    if f.followed_ns is None or now_ns - f.followed_ns > followed_ns:
        seen = f.followed_ns if f.followed_ns is not None else f.last_step_ns
        when = f"since {format_ns(seen)}" if seen is not None else "(never heard from a collector)"
        return RunState(UNKNOWN, f"not followed {when}; its end was not seen", seen)
    if f.last_step_ns is None:
        return RunState(LIVE, "followed; no step yet")
    quiet = (now_ns - f.last_step_ns) / 1e9
    bound = stall_after_s(f.step_seconds, k, min_stall_s)
    if quiet > bound:
        per = f" = {k:g} × {f.step_seconds:.3g} s per step" if f.step_seconds and k * f.step_seconds >= min_stall_s \
            else f" (at least {min_stall_s:g} s)"
        return RunState(STALLED, f"no step for {quiet:.0f} s (bound {bound:.3g} s{per})", f.last_step_ns)
    return RunState(LIVE, f"followed; last step {quiet:.0f} s ago", f.last_step_ns)


def step_seconds(first_ts_ns: int | None, last_ts_ns: int | None, lo: int | None, hi: int | None) -> float | None:
    """The mean time per step of one incarnation's span (loss_summary): None if under 2 steps
    or unstamped. A mean, not a median: the store keeps the span, not every interval."""
    if None in (first_ts_ns, last_ts_ns, lo, hi) or hi <= lo or last_ts_ns < first_ts_ns:
        return None
    return (last_ts_ns - first_ts_ns) / 1e9 / (hi - lo)
