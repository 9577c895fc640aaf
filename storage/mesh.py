"""The measured mesh table (`steptail mesh`, docs/goodput.md): per slice shape (topology, host
count) and mesh configuration (the `ici_*`/`dcn_*` parallelism, per-device batch and sequence
length of the `Config param` lines), what the runs that ran it measured."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from statistics import median

import sqlalchemy as sa

from steptail.storage.db import Store
from steptail.storage.goodput import timing_on

SHAPE_PARAMS = ("per_device_batch_size", "max_target_length")
_RUNS = sa.text("SELECT r.run, MIN(s.first_ts_ns), MAX(s.last_ts_ns) FROM runs r"
                " LEFT JOIN loss_summary s ON s.run = r.run GROUP BY r.run ORDER BY r.run")
_CONFIG = sa.text("SELECT run, incarnation, name, value FROM config"
                  " WHERE name LIKE 'ici%' OR name LIKE 'dcn%' OR name IN ('per_device_batch_size', 'max_target_length')")
_SLICES = sa.text("SELECT run, incarnation, topology, hosts FROM incarnations")
_REPORTS = sa.text("SELECT run, report FROM run_goodput")


def is_mesh_param(name: str) -> bool:
    return (name.startswith(("ici_", "dcn_")) and name.endswith("_parallelism")) or name in SHAPE_PARAMS


def mesh_table(store: Store, pattern: str | None = None, since_ns: int | None = None,
               until_ns: int | None = None) -> list[dict]:
    """One row per (topology, hosts, mesh): runs, incarnations, median step time, tokens/s and
    TFLOP/s per device (medians over the incarnations' medians), goodput (median over the runs),
    and `control`: another mesh measured on the same slice shape (None when the slice is
    unknown). Runs by name (`pattern`, a shell glob) and by time (their steps overlap [since, until]; a run without stamps is left
    out when a time is given)."""
    with store.engine.connect() as conn:
        return mesh_on(conn, pattern, since_ns, until_ns)


def mesh_on(conn: sa.Connection, pattern: str | None = None, since_ns: int | None = None,
            until_ns: int | None = None) -> list[dict]:
    """mesh_table on a connection the caller holds."""
    runs = [run for run, t0, t1 in conn.execute(_RUNS) if _wanted(run, t0, t1, pattern, since_ns, until_ns)]
    wanted = set(runs)
    mesh: dict[tuple[str, int], dict[str, str]] = {}
    for run, inc, name, value in conn.execute(_CONFIG):
        if run in wanted and is_mesh_param(name):
            mesh.setdefault((run, inc), {})[name] = value
    slices = {(run, inc): (topo, hosts) for run, inc, topo, hosts in conn.execute(_SLICES) if run in wanted}
    # the runs' figures as kept at commit (storage.goodput): one read for the whole table
    reports = {run: json.loads(text) for run, text in conn.execute(_REPORTS) if run in wanted}
    groups: dict[tuple, dict] = {}
    for run in runs:
        report = reports.get(run) or timing_on(conn, run).report()
        for stats in report["incarnations"]:
            if stats["median_step_s"] is None:
                continue
            key_inc = (run, stats["incarnation"])
            topo, hosts = slices.get(key_inc, (None, None))
            config = _latest(mesh, run, stats["incarnation"])
            key = (topo, hosts, tuple(sorted(config.items())))
            g = groups.setdefault(key, {"runs": {}, "step": [], "tokens": [], "tflops": [], "incs": 0})
            g["runs"][run] = report["goodput"]
            g["incs"] += 1
            g["step"].append(stats["median_step_s"])
            for k, src in (("tokens", "tokens_per_s_device"), ("tflops", "tflops_per_device")):
                if stats[src] is not None:
                    g[k].append(stats[src])
    shapes: dict[tuple, int] = {}
    for topo, hosts, _ in groups:
        shapes[(topo, hosts)] = shapes.get((topo, hosts), 0) + 1
    rows = []
    for (topo, hosts, config), g in sorted(groups.items(), key=lambda kv: (str(kv[0][0]), kv[0][1] or 0, kv[0][2])):
        goodputs = [v for v in g["runs"].values() if v is not None]
        rows.append({
            "topology": topo, "hosts": hosts, "mesh": dict(config), "runs": sorted(g["runs"]),
            "incarnations": g["incs"], "median_step_s": median(g["step"]),
            "tokens_per_s_device": median(g["tokens"]) if g["tokens"] else None,
            "tflops_per_device": median(g["tflops"]) if g["tflops"] else None,
            "goodput": median(goodputs) if goodputs else None,
            # unknown slice (saved logs): whether a control ran on it is unknown too
            "control": None if topo is None and hosts is None else shapes[(topo, hosts)] > 1,
        })
    return rows


def iso_ns(value: str) -> int:
    """An ISO 8601 time (UTC unless it says otherwise) in ns since the epoch; ValueError if not one."""
    t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return int(t.timestamp()) * 10**9 + t.microsecond * 1000


def _wanted(run: str, t0, t1, pattern, since_ns, until_ns) -> bool:
    if pattern is not None and not fnmatchcase(run, pattern):
        return False
    if since_ns is None and until_ns is None:
        return True
    if t0 is None or t1 is None:
        return False
    return (since_ns is None or t1 >= since_ns) and (until_ns is None or t0 <= until_ns)


def _latest(mesh: dict, run: str, inc: int) -> dict[str, str]:
    """The incarnation's mesh params, else the latest earlier incarnation's (a restart whose
    config lines rotated away ran what was configured before)."""
    for n in range(inc, 0, -1):
        if (run, n) in mesh:
            return mesh[(run, n)]
    return {}
