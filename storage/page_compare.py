"""The page's compare view: an arm against its control as `steptail compare` makes it
(storage/compare.py: CE aligned by step from each step's latest incarnation, refused across
slice shapes), its Δ cut into buckets (min, max, last Δ and steps beyond the tolerance, as
page_series cuts CE) so the answer is bounded whatever the runs' length, and the `Config
param` values that differ: arm vs control (their latest incarnations), and each incarnation
of a run vs the one before it."""

from __future__ import annotations

import sqlalchemy as sa

from steptail.storage.compare import CompareRefused, compare_runs
from steptail.storage.db import Store

_CONFIG = sa.text("SELECT incarnation, name, value FROM config WHERE run = :run ORDER BY incarnation, name")
DELTA_COLUMNS = ("s0", "s1", "d_min", "d_max", "d_last", "beyond")


def configs(conn: sa.Connection, run: str) -> dict[int, dict[str, str]]:
    """{incarnation: {name: value}} of each incarnation that printed its config."""
    out: dict[int, dict[str, str]] = {}
    for inc, name, value in conn.execute(_CONFIG, {"run": run}):
        out.setdefault(inc, {})[name] = value
    return out


def differing(a: dict[str, str], b: dict[str, str]) -> list[list]:
    """[name, a's value, b's value] of each name whose values differ (None: not printed)."""
    return [[n, a.get(n), b.get(n)] for n in sorted(a.keys() | b.keys()) if a.get(n) != b.get(n)]


def incarnation_diffs(conn: sa.Connection, run: str) -> list[dict]:
    """Each incarnation's config against the previous one's that printed any."""
    by_inc = configs(conn, run)
    incs = sorted(by_inc)
    return [{"run": run, "from": a, "to": b, "params": differing(by_inc[a], by_inc[b])}
            for a, b in zip(incs, incs[1:], strict=False)]


def config_diff(conn: sa.Connection, arm: str, control: str) -> dict:
    """arm vs control (each its latest incarnation that printed a config) and incarnation vs
    incarnation within each."""
    a, c = configs(conn, arm), configs(conn, control)
    return {
        "arm_incarnation": max(a, default=None), "control_incarnation": max(c, default=None),
        "arm_vs_control": differing(a[max(a)], c[max(c)]) if a and c else [],
        "incarnations": incarnation_diffs(conn, arm) + incarnation_diffs(conn, control),
    }


def compared(store: Store, arm: str, control: str, tolerance: float, rel: float, buckets: int,
             lo: int | None = None, hi: int | None = None) -> dict:
    """The comparison's summary and its Δ in at most `buckets` buckets, or `refused` (why), with
    the config diff either way. `lo`..`hi`: the Δ of those steps only (a zoom); the summary is
    still the whole comparison's."""
    with store.engine.connect() as conn:
        config = config_diff(conn, arm, control)
    try:
        result = compare_runs(store, arm, control, tolerance, rel)
    except CompareRefused as e:
        return {"arm": arm, "control": control, "refused": str(e), "config": config}
    rows = [r for r in result.rows if (lo is None or r["step"] >= lo) and (hi is None or r["step"] <= hi)]
    out = {"arm": arm, "control": control, "refused": None, "summary": result.summary(), "width": None,
           "columns": list(DELTA_COLUMNS), "delta": [], "config": config}
    if not rows:
        return out
    lo, hi = rows[0]["step"], rows[-1]["step"]
    width = -(-(hi - lo + 1) // buckets)
    cut: dict[int, list] = {}
    for r in rows:
        k = (r["step"] - lo) // width
        d = r["delta"]
        b = cut.get(k)
        if b is None:
            b = cut[k] = [r["step"], r["step"], d, d, d, 0]
        b[1], b[4] = r["step"], d
        if d is not None:
            b[2] = d if b[2] is None else min(b[2], d)
            b[3] = d if b[3] is None else max(b[3], d)
        b[5] += r["beyond"]
    return out | {"width": width, "delta": [cut[k] for k in sorted(cut)]}
