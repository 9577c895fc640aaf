"""Block states (runs.goodput.block_state) of a range of an incarnation's steps at once, from
columns: what a commit recomputes, in numpy rather than a Python loop per row (a bulk ingest
stores hundreds of thousands of steps; the loop was a fifth of its time).

`block_states` gives exactly what block_state gives block after block, each block's `prev`
the one before's "end": the same float operations in the same order, sums in integers. Rows it
cannot take as columns (a line with no stamp, a step or stamp near the ends of int64, seconds
beyond an int64 of microseconds) go to block_state itself, so every input has one meaning."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from steptail.runs import goodput as gp
from steptail.runs.goodput import BURST_NS, NS, US, block_of, block_state, q

_SAFE = 2**62
_MAX_SECS = 1e12  # microseconds of more would not fit an int64 (Python's ints hold them)


class Columns(NamedTuple):
    """Rows (step, ts_ns, seconds, tflops, tokens) as arrays in step order; NaN is "not logged"."""
    step: np.ndarray
    ts: np.ndarray
    secs: np.ndarray
    tflops: np.ndarray
    tokens: np.ndarray

    def rows(self) -> list[tuple]:
        floats = [[None if math.isnan(v) else v for v in col.tolist()] for col in (self.secs, self.tflops, self.tokens)]
        return list(zip(self.step.tolist(), self.ts.tolist(), *floats, strict=True))


def block_states(rows: list[tuple], prev: tuple | None, first: int, started_ns: int | None,
                 saves: set[int], cuts) -> dict[int, dict]:
    """{block: state} of `rows` ((step, ts_ns, seconds, tflops, tokens), in step order, any
    number of blocks of one incarnation); `prev` as block_state takes it for the first."""
    cols = from_rows(rows)
    if cols is None:
        return _one_by_one(rows, prev, first, started_ns, saves, cuts)
    return states_of(cols, prev, first, started_ns, saves, cuts)


def states_of(cols: Columns, prev: tuple | None, first: int, started_ns: int | None,
              saves: set[int], cuts) -> dict[int, dict]:
    """block_states of rows already in columns."""
    if not len(cols.step):
        return {}
    if (prev is not None and any(v is None for v in prev)) or (np.abs(cols.secs) >= _MAX_SECS).any():
        return _one_by_one(cols.rows(), prev, first, started_ns, saves, cuts)
    return _vectorized(*cols, prev, first, started_ns, saves, sorted(set(cuts)))


def _one_by_one(rows, prev, first, started_ns, saves, cuts) -> dict[int, dict]:
    out: dict[int, dict] = {}
    at = 0
    while at < len(rows):
        b = block_of(rows[at][0])
        end = at
        while end < len(rows) and block_of(rows[end][0]) == b:
            end += 1
        out[b] = state = block_state(rows[at:end], prev, first, started_ns, saves, cuts)
        prev, at = tuple(state["end"]), end
    return out


def from_rows(rows: list[tuple]) -> Columns | None:
    """Rows as columns, or None when one needs block_state itself."""
    if not rows:
        return None
    return columns(*(list(c) for c in zip(*rows, strict=True)))


def columns(step: list, ts: list, secs: list, tflops: list, tokens: list) -> Columns | None:
    """Lists as columns (step order is the caller's), or None when one needs block_state: a
    line with no stamp, integers whose differences could wrap."""
    if not step or None in ts:
        return None
    if min(step) < -_SAFE or max(step) > _SAFE or min(ts) < -_SAFE or max(ts) > _SAFE:
        return None
    return Columns(np.array(step, dtype=np.int64), np.array(ts, dtype=np.int64),
                   *(_floats(col) for col in (secs, tflops, tokens)))


def _floats(col) -> np.ndarray:
    """A column as floats, NaN where not logged: None, and NaN or infinite values, which
    block_state takes as not logged too."""
    arr = np.array(col, dtype=np.float64)  # None becomes NaN
    arr[~np.isfinite(arr)] = np.nan
    return arr


def joined(steps, ts, metric_steps, secs, tflops, tokens) -> Columns | None:
    """LOSS-PARTS steps and stamps LEFT JOINed with `completed step` figures by step, in step
    order: what storage.goodput reads from the two tables, from rows in memory (sequences, one
    per column). None when a step repeats (the store would keep one of them) or columns()
    would refuse them."""
    if not steps or None in ts:
        return None
    if min(steps) < -_SAFE or max(steps) > _SAFE or min(ts) < -_SAFE or max(ts) > _SAFE:
        return None
    step, stamp = np.array(steps, dtype=np.int64), np.array(ts, dtype=np.int64)
    order = np.argsort(step, kind="stable")
    step, stamp = step[order], stamp[order]
    if (np.diff(step) == 0).any():
        return None
    if not len(metric_steps):
        nan = np.full(len(step), np.nan)
        return Columns(step, stamp, nan, nan.copy(), nan.copy())
    if min(metric_steps) < -_SAFE or max(metric_steps) > _SAFE:
        return None
    m_step = np.array(metric_steps, dtype=np.int64)
    figures = [_floats(col) for col in (secs, tflops, tokens)]
    m_order = np.argsort(m_step, kind="stable")
    m_step = m_step[m_order]
    if (np.diff(m_step) == 0).any():
        return None
    at = np.minimum(np.searchsorted(m_step, step), len(m_step) - 1)
    found = m_step[at] == step
    return Columns(step, stamp, *(np.where(found, f[m_order][at], np.nan) for f in figures))


def concat(parts: list[Columns]) -> Columns:
    return Columns(*(np.concatenate(col) for col in zip(*parts, strict=True)))


def _vectorized(step, ts, secs, tflops, tokens, prev, first, started_ns, saves, cuts) -> dict[int, dict]:
    n = len(step)
    # the line before each row: the row before, or `prev` for the first
    p_step = np.empty(n, np.int64)
    p_ts = np.empty(n, np.int64)
    p_step[1:], p_ts[1:] = step[:-1], ts[:-1]
    has_p = np.ones(n, bool)
    if prev is None:
        has_p[0] = False
        p_step[0] = p_ts[0] = 0
    else:
        p_step[0], p_ts[0] = prev[0], prev[1]
    d_ts = ts - p_ts
    burst = has_p & (d_ts >= 0) & (d_ts < BURST_NS)
    # a row's anchor: the line before the last row that began a burst (or `prev`'s own anchor)
    began = np.where(~burst, np.arange(n), -1)
    np.maximum.accumulate(began, out=began)
    a_step, a_ts = p_step[np.maximum(began, 0)], p_ts[np.maximum(began, 0)]
    has_a = has_p[np.maximum(began, 0)].copy()
    inherited = began < 0
    if inherited.any():
        init = prev[2:] if prev is not None and len(prev) == 4 else (prev[:2] if prev is not None else None)
        if init is None:
            has_a[inherited] = False
        else:
            a_step[inherited], a_ts[inherited] = init
    known = ~np.isnan(secs)
    secs = secs.copy()
    # capped by the interval from the anchor, per step
    capping = known & has_a & (step > a_step)
    if capping.any():
        cap = np.full(n, np.nan)
        cap[capping] = (ts[capping] - a_ts[capping]).astype(np.float64) / NS / \
            (step[capping] - a_step[capping]).astype(np.float64)
        over = capping & (secs > cap) & (cap >= 0)
        secs[over] = cap[over]
    after = has_p & (step > p_step)
    interval = np.zeros(n)
    interval[after] = (ts[after] - p_ts[after]).astype(np.float64) / NS
    fill = after & ~known
    secs[fill] = interval[fill] / (step[fill] - p_step[fill]).astype(np.float64)
    known = known | fill
    saves_arr = np.fromiter(saves, np.int64, len(saves)) if saves else np.empty(0, np.int64)
    after_save = np.isin(step - 1, saves_arr) if len(saves_arr) else np.zeros(n, bool)
    if not after[0] and step[0] == first and known[0] and started_ns is not None:
        secs[0] = min(float(secs[0]), max(0.0, (int(ts[0]) - started_ns) / NS))  # the scalar rule, as written
    us = np.zeros(n, np.int64)
    us[known] = np.rint(secs[known] * US).astype(np.int64)
    secs[known] = us[known].astype(np.float64) / US
    phase = (step == first) | after_save
    save_iv = np.flatnonzero(after & after_save & (p_step == step - 1))
    blocks = step // gp.BLOCK  # numpy floors as Python does (gp.BLOCK read here: tests make it small)
    starts = np.flatnonzero(np.r_[True, blocks[1:] != blocks[:-1]])
    ends = np.r_[starts[1:], n]
    cut_arr = np.array(cuts, dtype=np.int64)
    cut_count = np.searchsorted(cut_arr, step, side="right")  # cuts at or below each step
    steady = ~phase
    nb = len(starts)
    row_block = np.repeat(np.arange(nb), ends - starts)  # each row's block, 0..nb-1
    steady_known = steady & known
    hists = _hists(secs[steady_known], row_block[steady_known], nb)
    has_tok, has_tfl = steady & ~np.isnan(tokens), steady & ~np.isnan(tflops)
    toks, tfls = _hists(tokens[has_tok], row_block[has_tok], nb), _hists(tflops[has_tfl], row_block[has_tfl], nb)
    out: dict[int, dict] = {}
    for k, (lo, hi) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        s0, s1 = int(step[lo]), int(step[hi - 1])
        bounds = [c for c in cuts if s0 < c <= s1]
        segs = [[s0, 0, 0, 0]] + [[c, 0, 0, 0] for c in bounds]
        st = steady[lo:hi]
        kn = known[lo:hi] & st
        if bounds:
            seg = (cut_count[lo:hi] - cut_count[lo])
            for i, s in enumerate(segs):
                mine = seg == i
                s[1] = int(us[lo:hi][mine & kn].sum())
                s[2] = int((mine & kn).sum())
                s[3] = int((mine & st & ~kn).sum())
        else:
            segs[0][1], segs[0][2] = int(us[lo:hi][kn].sum()), int(kn.sum())
            segs[0][3] = int((st & ~kn).sum())
        ph = np.flatnonzero(phase[lo:hi]) + lo
        last = hi - 1
        out[int(blocks[lo])] = {
            "n": hi - lo, "t0": int(ts[lo:hi].min()), "t1": int(ts[lo:hi].max()),
            "hist": hists[k], "tok": toks[k], "tfl": tfls[k],
            "segs": segs,
            "phase": [[int(step[i]), int(ts[i]), float(secs[i]) if known[i] else None] for i in ph.tolist()],
            "saves": [[int(step[i]) - 1, float(interval[i])] for i in save_iv[(save_iv >= lo) & (save_iv < hi)].tolist()],
            "cuts": bounds,
            "end": [int(step[last]), int(ts[last]),
                    int(a_step[last]) if has_a[last] else None, int(a_ts[last]) if has_a[last] else None],
        }
    return out


# 10**k as floats, exactly (k = 0..22: every power of ten a double holds exactly)
_POW10 = np.array([float(10**k) for k in range(23)])
_TIE = 1e-6  # a scaled value this close to a rounding tie (or an edge) is formatted on its own


def _hists(values: np.ndarray, block: np.ndarray, blocks: int) -> list[dict[str, int]]:
    """runs.goodput._hist of each block's `values` (`block`: each value's block, in order):
    counts by q(), keys in the order first seen. q() is called once per distinct rounded value
    rather than per value: a value's 4 significant figures are found in numpy (scaled to
    [1000, 10000) by an exact power of ten, one rounding, then rint) wherever that cannot
    differ from the decimal rounding q() does; a value near a tie, or zero, or outside
    1e-18..1e25, keeps its own group and is formatted itself."""
    out: list[dict[str, int]] = [{} for _ in range(blocks)]
    if not len(values):
        return out
    mag = np.abs(values)
    ok = (mag > 1e-18) & (mag < 1e25)
    exp = np.zeros(len(values), np.int64)
    exp[ok] = np.floor(np.log10(mag[ok])).astype(np.int64)
    shift = 3 - exp
    scaled = np.zeros(len(values))
    up, down = ok & (shift >= 0), ok & (shift < 0)
    scaled[up] = mag[up] * _POW10[np.minimum(shift[up], 22)]
    scaled[down] = mag[down] / _POW10[np.minimum(-shift[down], 22)]
    ok &= (np.abs(shift) <= 22) & (scaled > 999.5 + _TIE) & (scaled < 9999.5 - _TIE)
    ok &= np.abs(scaled - np.floor(scaled) - 0.5) > _TIE
    # a group key per value: sign, 4 digits and exponent; the others by their exact value
    key = np.zeros(len(values), np.int64)
    key[ok] = (np.rint(scaled[ok]).astype(np.int64) * 64 + exp[ok] + 20) * np.where(values[ok] < 0, -1, 1)
    if not ok.all():
        _, rank = np.unique(np.ascontiguousarray(values[~ok]).view(np.int64), return_inverse=True)  # by bits: -0.0 is not 0.0
        key[~ok] = (1 << 24) + rank.reshape(-1)
    pair = block.astype(np.int64) * (1 << 26) + key + (1 << 25)
    _, first, counts = np.unique(pair, return_index=True, return_counts=True)
    order = np.argsort(first, kind="stable")  # first seen first; rows run block by block
    first, counts = first[order], counts[order].tolist()
    keys, rep, inverse = np.unique(key[first], return_index=True, return_inverse=True)
    names = [q(v) for v in values[first[rep]].tolist()]  # q() once per distinct key
    named = [names[i] for i in inverse.reshape(-1).tolist()]
    owner = block[first]
    edges = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1], True])
    merge = len(set(names)) != len(names)  # a value formatted alone may name a group's key too
    for a, b in zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True):
        if merge:
            h = out[int(owner[a])]
            for name, n in zip(named[a:b], counts[a:b], strict=True):
                h[name] = h.get(name, 0) + n
        else:
            out[int(owner[a])] = dict(zip(named[a:b], counts[a:b], strict=True))
    return out
