"""Where a run's wall time went (docs/goodput.md): productive, replayed, recovery, checkpoint
and other seconds, goodput = productive / wall, and each incarnation's step time.

Pure, and shared by every path. The facts are kept in two layers so that a store can keep them
at commit (storage.goodput) and the cost of a figure follows the live runs, not the history:

- a *block* (BLOCK steps of one incarnation): `block_state()` of its rows, the only part
  computed from rows; what a commit recomputes for the blocks its rows touch;
- an incarnation's *aggregate*: its blocks added up (`add()`, and taken out again when a block
  is recomputed): counts, exact integer-microsecond sums, histograms of step time,
  tokens/s and TFLOP/s to 4 significant figures (what the medians are taken over), the first
  and after-save steps, the saves' intervals.

`report()` turns aggregates into the figures. RunTiming is the full recomputation: fed every
row, it builds the same blocks and aggregates in memory. No I/O, no clock: absent input gives
None ("not evaluable"), never 0."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import repeat
from math import isfinite

NS = 1e9
BLOCK = 256  # steps per block: a live commit recomputes at most a block's rows per incarnation
US = 1_000_000
BURST_NS = 1_000_000  # lines stamped closer than 1 ms came in one burst: their own interval is no step's


def same_burst(prev_ts: int | None, ts: int | None) -> bool:
    """A line stamped under BURST_NS after the one before: both reached the kubelet in one burst."""
    return ts is not None and prev_ts is not None and 0 <= ts - prev_ts < BURST_NS


def q(value: float) -> str:
    """A value to 4 significant figures, as a histogram key: medians are over these (the log
    prints seconds to the millisecond; 4 figures keeps every histogram small)."""
    return f"{value:.4g}"


def block_of(step: int) -> int:
    return step // BLOCK


# -- a block ------------------------------------------------------------------------------
def block_state(rows: list[tuple], prev: tuple | None, first: int | None, started_ns: int | None,
                saves: set[int], cuts: Iterable[int] = ()) -> dict:
    """The state of one block: `rows` its (step, ts_ns, seconds, tflops, tokens) in step order,
    `prev` the (step, ts_ns) of the incarnation's stored step before them (None if none), or
    the previous block's "end" (that and the (step, ts_ns) of the line before its burst),
    `first` the incarnation's first step, `saves` its checkpoint-save steps (those just before
    a row matter), `cuts` the first steps of later incarnations: the non-phase sums are kept
    per segment starting at each, so the replayed part is a sum of whole segments.

    A step's time is its `seconds:`, else the interval from the step before it (stamps; over
    lost steps, shared by them), else unknown (counted at the median); never more than that
    interval, nor a first step more than the time since its start-up line. A phase step (the
    first, compilation; the one after a save) is kept apart: counted at most at the median."""
    bounds = sorted({c for c in cuts if rows and rows[0][0] < c <= rows[-1][0]})
    segs = [[rows[0][0] if rows else 0, 0, 0, 0]] + [[c, 0, 0, 0] for c in bounds]  # from, sum_us, known, unknown
    stamps = [r[1] for r in rows if r[1] is not None]
    times: list[float] = []  # the values histogrammed, keyed at the end (_hist: in C, not per row)
    toks: list[float] = []
    tfls: list[float] = []
    phase: list[list] = []
    save_iv: list[list] = []
    prev_step, prev_ts = prev[:2] if prev is not None else (None, None)
    # a step's `seconds` are capped by the interval from the line before it, unless that line
    # came in one burst with it (stamps under BURST_NS apart: a buffered stdout, a lagging pipe):
    # then from the line before the burst, shared by the steps since (the j-th step of a burst
    # is capped at 1/j of the burst's interval, never below an honest step's own time)
    anchor_step, anchor_ts = prev[2:] if prev is not None and len(prev) == 4 else (prev_step, prev_ts)
    seg, last_seg = 0, len(segs) - 1
    s, next_cut = segs[0], (segs[1][0] if last_seg else None)
    for step, ts, secs, tflops, tokens in rows:
        if secs is not None and not isfinite(secs):
            secs = None  # `seconds: nan` or `inf`: no time a clock gives (nor a histogram's)
        if tflops is not None and not isfinite(tflops):
            tflops = None
        if tokens is not None and not isfinite(tokens):
            tokens = None
        if not same_burst(prev_ts, ts):
            anchor_step, anchor_ts = prev_step, prev_ts
        if secs is not None and ts is not None and anchor_ts is not None and step > anchor_step:
            cap = (ts - anchor_ts) / NS / (step - anchor_step)  # per step: steps lost between ran too
            if secs > cap >= 0:
                secs = cap  # no step outlasts the lines around it (a trainer clock unlike the kubelet's)
        if ts is not None and prev_ts is not None and step > prev_step:
            if secs is None:  # stamps only: the intervals add up to the time, bursts or not
                secs = (ts - prev_ts) / NS / (step - prev_step)
            if step - 1 in saves and prev_step == step - 1:
                save_iv.append([step - 1, (ts - prev_ts) / NS])
        elif step == first and secs is not None and ts is not None and started_ns is not None:
            secs = min(secs, max(0.0, (ts - started_ns) / NS))  # nor the time since the trainer started
        if secs is not None:
            us = round(secs * US)  # the microsecond: sums are exact integers, in any order
            secs = us / US
        if step == first or step - 1 in saves:
            phase.append([step, ts, secs])
        else:
            if next_cut is not None and step >= next_cut:
                while seg < last_seg and step >= segs[seg + 1][0]:
                    seg += 1
                s, next_cut = segs[seg], (segs[seg + 1][0] if seg < last_seg else None)
            if secs is None:
                s[3] += 1
            else:
                s[1] += us
                s[2] += 1
                times.append(secs)
            if tokens is not None:
                toks.append(tokens)
            if tflops is not None:
                tfls.append(tflops)
        prev_step, prev_ts = step, ts
    return {"n": len(rows), "t0": min(stamps) if stamps else None, "t1": max(stamps) if stamps else None,
            "hist": _hist(times), "tok": _hist(toks), "tfl": _hist(tfls),
            "segs": segs, "phase": phase, "saves": save_iv, "cuts": bounds,
            # the next block's `prev`: a burst that goes on across the edge keeps its anchor
            "end": [prev_step, prev_ts, anchor_step, anchor_ts]}


def _hist(values: list[float]) -> dict[str, int]:
    """Counts by q(): keys in the order first seen."""
    return dict(Counter(map(format, values, repeat(".4g"))))


def _count(h: dict[str, int], key: str, by: int = 1) -> None:
    n = h.get(key, 0) + by
    if n:
        h[key] = n
    else:
        h.pop(key, None)


# -- an incarnation's aggregate -------------------------------------------------------------
def empty() -> dict:
    return {"n": 0, "t0": None, "t1": None, "hist": {}, "tok": {}, "tfl": {}, "sum_us": 0, "known": 0,
            "unknown": 0, "phase": {}, "saves": {}}


def add(agg: dict, block: dict, sign: int = 1) -> None:
    """Add a block's state to an incarnation's aggregate (sign -1: take it out). Stamps only
    widen: rows are never taken back (ON CONFLICT DO NOTHING), a reparse starts afresh."""
    agg["n"] += sign * block["n"]
    for key in ("hist", "tok", "tfl"):
        h = agg[key]
        if sign > 0:  # nothing drops to zero: the common case, without a call per key
            for value, n in block[key].items():
                h[value] = h.get(value, 0) + n
        else:
            for value, n in block[key].items():
                _count(h, value, -n)
    for _, sum_us, known, unknown in block["segs"]:
        agg["sum_us"] += sign * sum_us
        agg["known"] += sign * known
        agg["unknown"] += sign * unknown
    for step, ts, secs in block["phase"]:
        if sign > 0:
            agg["phase"][str(step)] = [ts, secs]
        else:
            agg["phase"].pop(str(step), None)
    for step, interval in block["saves"]:
        if sign > 0:
            agg["saves"][str(step)] = interval
        else:
            agg["saves"].pop(str(step), None)
    if sign > 0:
        for key, pick in (("t0", min), ("t1", max)):
            if block[key] is not None:
                agg[key] = block[key] if agg[key] is None else pick(agg[key], block[key])


@dataclass
class IncFacts:
    """What report() needs of an incarnation besides its aggregate."""
    number: int
    started_ns: int | None
    last_save_ns: int | None
    agg: dict
    # its container's startedAt, as follow saw the pod (whole seconds; None offline): the end
    # of the wait before it (queued_s) and, for the first, the start of the wall time
    container_started_ns: int | None = None

    @property
    def container_ns(self) -> int | None:
        """The container's start when it can be this incarnation's: not after its first line
        (a container restarted in place since gives the newer one's start)."""
        c, first = self.container_started_ns, self.started_ns if self.started_ns is not None else self.agg["t0"]
        return c if c is not None and (first is None or c <= first) else None


# The blocks of incarnation `n` from block `b` on (its replayed part is read from them).
BlocksFrom = Callable[[int, int], Iterable[dict]]


def report(run: str, incs: list[IncFacts], blocks_from: BlocksFrom) -> dict:
    """The figures of `steptail goodput RUN -o json` from the incarnations' aggregates."""
    incs = sorted((i for i in incs if i.agg["n"]), key=lambda i: i.number)
    stats = [_stats(i) for i in incs]
    fallback = _median_of([m for s in stats if (m := s["median_step_s"]) is not None])
    meds = [s["median_step_s"] if s["median_step_s"] is not None else fallback for s in stats]
    productive = replayed = checkpoint = 0.0
    cut = None  # the lowest first step of the incarnations after this one: its steps from there were redone
    for inc, med in reversed(list(zip(incs, meds, strict=True))):
        agg, first = inc.agg, _first(inc.agg)
        total = _counted(agg["sum_us"], agg["unknown"], agg["phase"].items(), med)
        if cut is None:
            lost = 0.0
        elif cut <= first:
            lost = total
        else:
            lost = _replayed(blocks_from, inc.number, agg, cut, med)
        productive += total - lost
        replayed += lost
        if med is not None:
            checkpoint += sum(max(0.0, iv - med) for _, iv in sorted(agg["saves"].items(), key=_by_step))
        cut = first if cut is None else min(cut, first)
    restarts = [_restart(prev, inc, med)
                for prev, inc, med in zip(incs, incs[1:], meds[1:], strict=False)]
    recovery = float(sum(r["recovery_s"] or 0.0 for r in restarts))
    wall = _wall(incs)
    other = None if wall is None else max(0.0, wall - productive - replayed - recovery - checkpoint)
    return {
        "run": run, "wall_s": wall, "productive_s": productive, "replayed_s": replayed,
        "recovery_s": recovery, "checkpoint_s": checkpoint, "other_s": other,
        "goodput": None if not wall else productive / wall,
        "restarts": restarts, "incarnations": stats,
    }


def _by_step(item) -> int:
    return int(item[0])


def _first(agg: dict) -> int:
    return min(int(s) for s in agg["phase"])  # the first step is always a phase step


def _counted(sum_us: int, unknown: int, phases, med: float | None) -> float:
    """Seconds of steps: the known non-phase ones, the unknown at the median, and the phase
    ones at most at the median (their excess is compilation or a save, counted there)."""
    total = sum_us / US + unknown * (med if med is not None else 0.0)
    for _, (_, secs) in sorted(phases, key=_by_step):
        if secs is None:
            total += med if med is not None else 0.0
        else:
            total += secs if med is None else min(secs, med)
    return total


def tail(blocks: Iterable[dict], cut: int) -> dict:
    """The non-phase sums of the segments from `cut` on: an incarnation's replayed steps."""
    sum_us = unknown = 0
    for block in blocks:
        for start, s_us, _, unk in block["segs"]:
            if start >= cut:
                sum_us += s_us
                unknown += unk
    return {"cut": cut, "sum_us": sum_us, "unknown": unknown}


def _replayed(blocks_from: BlocksFrom, n: int, agg: dict, cut: int, med: float | None) -> float:
    """The replayed seconds from `cut` on; a store keeps the last tail() in the aggregate (it
    is valid while the cut and the incarnation's blocks are: storage.goodput drops it when a
    block of the incarnation is recomputed), so a commit reads no block for it."""
    kept = agg.get("tail")
    if kept is None or kept["cut"] != cut:
        kept = agg["tail"] = tail(blocks_from(n, block_of(cut)), cut)
    sum_us, unknown = kept["sum_us"], kept["unknown"]
    phases = [(s, v) for s, v in agg["phase"].items() if int(s) >= cut]
    return _counted(sum_us, unknown, phases, med)


def _wall(incs: list[IncFacts]) -> float | None:
    if not incs:
        return None
    first = incs[0]
    start = first.container_ns
    if start is None:
        start = first.started_ns if first.started_ns is not None else first.agg["t0"]
    end = max((i.agg["t1"] for i in incs if i.agg["t1"] is not None), default=None)
    if start is None or end is None or end < start:
        return None
    return (end - start) / NS


def _restart(prev: IncFacts, inc: IncFacts, med: float | None) -> dict:
    first_ts, first_s = inc.agg["phase"][str(_first(inc.agg))]
    own = first_s if first_s is not None else med
    compile_s = None if first_s is None or med is None else max(0.0, first_s - med)
    counted_own = own if own is None or med is None else min(own, med)
    recovery = down = startup = queued = None
    last = max((t for t in (prev.agg["t1"], prev.last_save_ns) if t is not None), default=None)
    if last is not None and first_ts is not None and counted_own is not None:
        recovery = max(0.0, (first_ts - last) / NS - counted_own)
    if last is not None and inc.started_ns is not None:
        down = max(0.0, (inc.started_ns - last) / NS)
    if last is not None and inc.container_ns is not None:
        # no container of the run was running: the old one's last line to the new one's start
        # (pods recreated, the Workload re-admitted, scheduled, the image pulled)
        waited = max(0.0, (inc.container_ns - last) / NS)
        queued = min([waited, *(x for x in (down, recovery) if x is not None)])  # a part, never more
    # start-up: from the container's start (the line-based start-up line when not seen live)
    up = inc.container_ns if inc.container_ns is not None else inc.started_ns
    if up is not None and first_ts is not None and own is not None:
        startup = max(0.0, (first_ts - up) / NS - own)
    if compile_s is not None and recovery is not None:
        compile_s = min(compile_s, recovery)  # a part of the recovery, never more than it
    return {"incarnation": inc.number, "recovery_s": recovery, "queued_s": queued,
            "down_s": down, "startup_s": startup, "compile_s": compile_s}


def _stats(inc: IncFacts) -> dict:
    agg = inc.agg
    hist = {float(k): n for k, n in agg["hist"].items()}
    if not hist:  # no steady step: the phase steps', rather than nothing
        for _, secs in agg["phase"].values():
            if secs is not None:
                hist[float(q(secs))] = hist.get(float(q(secs)), 0) + 1
    med = _hist_median(hist)
    mad = None
    if med is not None:
        dev: dict[float, int] = {}
        for v, n in hist.items():
            d = abs(v - med)
            dev[d] = dev.get(d, 0) + n
        mad = _hist_median(dev)
    return {
        "incarnation": inc.number, "steps": agg["n"], "median_step_s": med, "step_s_mad": mad,
        "tokens_per_s_device": _hist_median({float(k): n for k, n in agg["tok"].items()}),
        "tflops_per_device": _hist_median({float(k): n for k, n in agg["tfl"].items()}),
    }


def _hist_median(hist: dict[float, int]) -> float | None:
    """statistics.median of the values a histogram counts (the two middle ones' mean)."""
    total = sum(hist.values())
    if not total:
        return None
    lo_rank, hi_rank = (total - 1) // 2, total // 2
    seen, lo = 0, None
    for value in sorted(hist):
        seen += hist[value]
        if lo is None and seen > lo_rank:
            lo = value
        if seen > hi_rank:
            return (lo + value) / 2 if lo != value else value
    return lo


def _median_of(values: list[float]) -> float | None:
    return _hist_median({v: values.count(v) for v in set(values)}) if values else None


# -- the full recomputation ---------------------------------------------------------------
@dataclass
class _Inc:
    started_ns: int | None = None
    container_started_ns: int | None = None
    rows: dict[int, tuple] = field(default_factory=dict)  # step -> (ts_ns, seconds, tflops, tokens)
    saves: set[int] = field(default_factory=set)
    last_save_ns: int | None = None


class RunTiming:
    """A run's timing facts, fed row by row; `report()` gives the goodput figures, built in
    memory through the same blocks and aggregates a store keeps at commit."""

    def __init__(self, run: str) -> None:
        self.run = run
        self.incs: dict[int, _Inc] = {}

    def _inc(self, n: int) -> _Inc:
        inc = self.incs.get(n)
        if inc is None:
            inc = self.incs[n] = _Inc()
        return inc

    def incarnation(self, n: int, started_ns: int | None, container_started_ns: int | None = None) -> None:
        inc = self._inc(n)
        inc.started_ns, inc.container_started_ns = started_ns, container_started_ns

    def step(self, n: int, step: int, ts_ns: int | None, seconds=None, tflops=None, tokens=None) -> None:
        """A LOSS-PARTS step of incarnation n, with its `completed step` figures if logged."""
        self._inc(n).rows[step] = (ts_ns, seconds, tflops, tokens)

    def add_steps(self, rows) -> None:
        """step() for each (incarnation, step, ts_ns, seconds, tflops, tokens) row, in bulk."""
        n, steps = None, None
        for row in rows:
            if row[0] != n:
                n = row[0]
                steps = self._inc(n).rows
            steps[row[1]] = tuple(row[2:])

    def save(self, n: int, step: int, ts_ns: int | None) -> None:
        inc = self._inc(n)
        inc.saves.add(step)
        if ts_ns is not None and (inc.last_save_ns is None or ts_ns > inc.last_save_ns):
            inc.last_save_ns = ts_ns

    def blocks(self) -> dict[int, dict[int, dict]]:
        """Every incarnation's block states, as a store keeps them."""
        firsts = {n: min(inc.rows) for n, inc in self.incs.items() if inc.rows}
        out: dict[int, dict[int, dict]] = {}
        for n, inc in self.incs.items():
            if not inc.rows:
                continue
            cuts = [f for m, f in firsts.items() if m > n]
            by_block: dict[int, list[tuple]] = {}
            for step in sorted(inc.rows):
                by_block.setdefault(block_of(step), []).append((step, *inc.rows[step]))
            prev = None
            out[n] = {}
            for b in sorted(by_block):
                rows = by_block[b]
                out[n][b] = block_state(rows, prev, firsts[n], inc.started_ns, inc.saves, cuts)
                prev = tuple(out[n][b]["end"])
        return out

    def facts(self) -> tuple[list[IncFacts], BlocksFrom]:
        blocks = self.blocks()
        incs = []
        for n, inc in self.incs.items():
            agg = empty()
            for state in blocks.get(n, {}).values():
                add(agg, state)
            incs.append(IncFacts(n, inc.started_ns, inc.last_save_ns, agg, inc.container_started_ns))
        return incs, lambda n, b: [s for k, s in sorted(blocks.get(n, {}).items()) if k >= b]

    def report(self) -> dict:
        incs, blocks_from = self.facts()
        return report(self.run, incs, blocks_from)


def ratio(slow: float | None, fast: float | None) -> float | None:
    """How many times slower `slow` is than `fast` (None when either is unknown or zero)."""
    return None if not slow or not fast else slow / fast
