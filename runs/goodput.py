"""Where a run's wall time went (docs/goodput.md): productive, replayed, recovery, checkpoint
and other seconds, goodput = productive / wall, and each incarnation's step time.

Pure: fed the run's rows (each LOSS-PARTS step with its `completed step` figures, the
checkpoint saves, the incarnations), in any order, by whichever path holds them; `report()`
computes the figures. No I/O, no clock: absent input gives None ("not evaluable"), never 0."""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median

NS = 1e9


@dataclass
class _Inc:
    number: int
    started_ns: int | None = None
    # per step: [ts_ns, seconds, tflops, tokens_per_s] (seconds etc. None when not logged)
    steps: dict[int, list] = field(default_factory=dict)
    saves: set[int] = field(default_factory=set)
    last_save_ns: int | None = None  # latest stamp of its save lines

    def last_line_ns(self) -> int | None:
        """The latest stamp of its rows (steps and saves)."""
        stamps = [ts for ts, *_ in self.steps.values() if ts is not None]
        if self.last_save_ns is not None:
            stamps.append(self.last_save_ns)
        return max(stamps, default=None)


class RunTiming:
    """A run's timing facts, fed row by row; `report()` gives the goodput figures."""

    def __init__(self, run: str) -> None:
        self.run = run
        self.incs: dict[int, _Inc] = {}
        self.queued_s: dict[int, float] = {}  # per incarnation: seen pending live (docs/goodput.md)

    def _inc(self, n: int) -> _Inc:
        inc = self.incs.get(n)
        if inc is None:
            inc = self.incs[n] = _Inc(n)
        return inc

    def incarnation(self, n: int, started_ns: int | None) -> None:
        self._inc(n).started_ns = started_ns

    def step(self, n: int, step: int, ts_ns: int | None, seconds=None, tflops=None, tokens=None) -> None:
        """A LOSS-PARTS step of incarnation n, with its `completed step` figures if logged."""
        self._inc(n).steps[step] = [ts_ns, seconds, tflops, tokens]

    def add_steps(self, rows) -> None:
        """step() for each (incarnation, step, ts_ns, seconds, tflops, tokens) row, in bulk."""
        n, steps = None, None
        for row in rows:
            if row[0] != n:
                n = row[0]
                steps = self._inc(n).steps
            steps[row[1]] = list(row[2:])

    def save(self, n: int, step: int, ts_ns: int | None) -> None:
        inc = self._inc(n)
        inc.saves.add(step)
        if ts_ns is not None and (inc.last_save_ns is None or ts_ns > inc.last_save_ns):
            inc.last_save_ns = ts_ns

    def queued(self, n: int, seconds: float) -> None:
        """Incarnation n's pod or Workload was seen not running for `seconds` before it started."""
        self.queued_s[n] = self.queued_s.get(n, 0.0) + seconds

    # -- the figures -------------------------------------------------------------------
    def report(self) -> dict:
        incs = [self.incs[n] for n in sorted(self.incs) if self.incs[n].steps]
        timed = [_timed(inc) for inc in incs]
        stats = [_stats(inc, t) for inc, t in zip(incs, timed, strict=True)]
        fallback = _median([m for s in stats if (m := s["median_step_s"]) is not None])
        productive = replayed = checkpoint = 0.0
        cut = None  # the lowest first step of the incarnations after this one: its steps from there were redone
        for inc, t, s in reversed(list(zip(incs, timed, stats, strict=True))):
            med = s["median_step_s"] if s["median_step_s"] is not None else fallback
            for step, (_, secs, phase) in t.items():
                if secs is None:
                    secs = med if med is not None else 0.0
                elif phase and med is not None:
                    secs = min(secs, med)  # its excess is compilation or a save, counted there
                if cut is not None and step >= cut:
                    replayed += secs
                else:
                    productive += secs
            checkpoint += _checkpoint_excess(inc, med)
            first = min(inc.steps)
            cut = first if cut is None else min(cut, first)
        restarts = [self._restart(prev, inc, t, s["median_step_s"] if s["median_step_s"] is not None else fallback)
                    for prev, inc, t, s in zip(incs, incs[1:], timed[1:], stats[1:], strict=False)]
        recovery = float(sum(r["recovery_s"] or 0.0 for r in restarts))
        wall = self._wall(incs)
        other = None if wall is None else max(0.0, wall - productive - replayed - recovery - checkpoint)
        return {
            "run": self.run, "wall_s": wall, "productive_s": productive, "replayed_s": replayed,
            "recovery_s": recovery, "checkpoint_s": checkpoint, "other_s": other,
            "goodput": None if not wall else productive / wall,
            "restarts": restarts, "incarnations": stats,
        }

    def _wall(self, incs: list[_Inc]) -> float | None:
        if not incs:
            return None
        first = incs[0]
        start = first.started_ns if first.started_ns is not None else _first_ts(first)
        end = max((ts for inc in incs for ts, *_ in inc.steps.values() if ts is not None), default=None)
        if start is None or end is None or end < start:
            return None
        return (end - start) / NS

    def _restart(self, prev: _Inc, inc: _Inc, t: dict, med: float | None) -> dict:
        first = min(inc.steps)
        first_ts, first_s = inc.steps[first][0], t[first][1]
        own = first_s if first_s is not None else med
        compile_s = None if first_s is None or med is None else max(0.0, first_s - med)
        counted_own = own if own is None or med is None else min(own, med)
        recovery = down = startup = None
        last = prev.last_line_ns()
        if last is not None and first_ts is not None and counted_own is not None:
            recovery = max(0.0, (first_ts - last) / NS - counted_own)
        if last is not None and inc.started_ns is not None:
            down = max(0.0, (inc.started_ns - last) / NS)
        if inc.started_ns is not None and first_ts is not None and own is not None:
            startup = max(0.0, (first_ts - inc.started_ns) / NS - own)
        if compile_s is not None and recovery is not None:
            compile_s = min(compile_s, recovery)  # a part of the recovery, never more than it
        return {"incarnation": inc.number, "recovery_s": recovery, "queued_s": self.queued_s.get(inc.number),
                "down_s": down, "startup_s": startup, "compile_s": compile_s}


def _first_ts(inc: _Inc) -> int | None:
    return min((ts for ts, *_ in inc.steps.values() if ts is not None), default=None)


def _timed(inc: _Inc) -> dict[int, tuple]:
    """Per step: (ts_ns, seconds, phase). A step's time is its `seconds:`, else the interval
    from the step before it in the incarnation (stamps; over lost steps, shared by them), else
    None; never more than that interval, nor a first step more than the time since its start-up
    line. A phase step, the incarnation's first (compilation) or the one after a checkpoint
    save, is left out of the median and counted at most at the median: its excess is the
    compilation (recovery) or the save (checkpoint), counted there."""
    out, prev_step, prev_ts = {}, None, None
    first = min(inc.steps)
    for step in sorted(inc.steps):
        ts, secs, *_ = inc.steps[step]
        if ts is not None and prev_ts is not None and step > prev_step:
            interval = (ts - prev_ts) / NS / (step - prev_step)  # per step: steps lost between ran too
            if secs is None:
                secs = interval
            elif secs > interval >= 0:
                secs = interval  # no step outlasts the lines around it (a trainer clock unlike the kubelet's)
        elif step == first and secs is not None and ts is not None and inc.started_ns is not None:
            secs = min(secs, max(0.0, (ts - inc.started_ns) / NS))  # nor the time since the trainer started
        out[step] = (ts, secs, step == first or (step - 1) in inc.saves)
        prev_step, prev_ts = step, ts
    return out


def _stats(inc: _Inc, t: dict) -> dict:
    steady = [secs for _, secs, phase in t.values() if secs is not None and not phase]
    if not steady:
        steady = [secs for _, secs, *_ in t.values() if secs is not None]
    med = _median(steady)
    mad = None if med is None else _median([abs(s - med) for s in steady])
    rows = inc.steps
    return {
        "incarnation": inc.number, "steps": len(rows), "median_step_s": med, "step_s_mad": mad,
        "tokens_per_s_device": _median([r[3] for s, r in rows.items() if r[3] is not None and not t[s][2]]),
        "tflops_per_device": _median([r[2] for s, r in rows.items() if r[2] is not None and not t[s][2]]),
    }


def _checkpoint_excess(inc: _Inc, med: float | None) -> float:
    """Each save's stretch (from its step's stamp to the next step's) beyond the median."""
    if med is None:
        return 0.0
    total, steps = 0.0, inc.steps
    for n in inc.saves:
        here, after = steps.get(n), steps.get(n + 1)
        if here and after and here[0] is not None and after[0] is not None:
            total += max(0.0, (after[0] - here[0]) / NS - med)
    return total


def _median(values: list[float]) -> float | None:
    return median(values) if values else None


def ratio(slow: float | None, fast: float | None) -> float | None:
    """How many times slower `slow` is than `fast` (None when either is unknown or zero)."""
    return None if not slow or not fast else slow / fast

