"""Ledger export of one run: per-table Parquet, manifest.json and a CE plot.

The bundle is built in a temporary directory next to the destination and renamed into
place, so the ledger never sees a partial export; an existing destination is replaced only
when asked (force)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import sqlalchemy as sa

import steptail
from steptail.parsers import format_ns
from steptail.runs.names import RunNameError, check_run_name
from steptail.storage import plots
from steptail.storage.db import Store
from steptail.storage.durable import file_sha256, hidden_name
from steptail.storage.export_files import (
    BundleFileError,
    add_archives,
    add_raw,
    bundle_files,
    ingested,
)
from steptail.storage.findings import load_findings
from steptail.storage.goodput import timing_on
from steptail.storage.parquet import JSON_PARTS_SCHEMA, SCHEMAS
from steptail.storage.reads import json_value, missing_steps, run_exists
from steptail.storage.run_inputs import reference_document, stored_reference
from steptail.storage.superseded import load_superseded, superseded_event

MANIFEST_VERSION = 1
Progress = Callable[[int, int], None]  # (stages done, stages)
_CHUNK = 20_000
_TS = pa.timestamp("ns", tz="UTC")

FINDINGS_SCHEMA = pa.schema([
    ("kind", pa.string()), ("incarnation", pa.int32()), ("first_step", pa.int64()),
    ("last_step", pa.int64()), ("detail", pa.string()), ("severity", pa.string()),
    ("detected", _TS),
])
EXPORT_SCHEMAS = {
    "loss_parts": JSON_PARTS_SCHEMA,  # the ledger keeps `parts` as JSON text (manifest version 1)
    "required_rbf": SCHEMAS["required_rbf"],
    "pod_metrics": SCHEMAS["pod_metrics"],
    "findings": FINDINGS_SCHEMA,
}
_SQL = {
    "loss_parts": "SELECT incarnation, step, ts_ns, ce, ce_raw, parts FROM loss_parts"
                  " WHERE run = :run ORDER BY incarnation, step",
    "required_rbf": "SELECT incarnation, step, ts_ns, max, per_layer, program FROM required_rbf"
                    " WHERE run = :run ORDER BY incarnation, step",
    "pod_metrics": "SELECT incarnation, step, ts_ns, seconds, tflops, tokens_per_s, total_weights,"
                   " loss, extra FROM pod_metrics WHERE run = :run ORDER BY incarnation, step",
}


class ExportError(Exception):
    """One line, safe to show."""


def check_export_name(run: str) -> str:
    """A run name read from the store names files and directories of an export: refuse anything
    but one safe path component (another writer of a shared store may have stored '../x')."""
    try:
        return check_run_name(run)
    except RunNameError as exc:
        raise ExportError(f"cannot export: {exc}") from None


def _json_text(value) -> str:
    # PostgreSQL (JSONB) hands back objects, SQLite the stored text: one canonical form.
    return json.dumps(json_value(value), separators=(",", ":"), sort_keys=True)


def _convert(table: str, rows: list[tuple]) -> dict[str, list]:
    names = [f.name for f in EXPORT_SCHEMAS[table]]
    cols = dict(zip(names, map(list, zip(*rows, strict=True)), strict=True))
    if "parts" in cols:
        cols["parts"] = [_json_text(v) for v in cols["parts"]]
    if "extra" in cols:
        cols["extra"] = [_json_text(v) for v in cols["extra"]]
    if "per_layer" in cols:
        cols["per_layer"] = [json_value(v) for v in cols["per_layer"]]
    return cols


def _table_rows(conn: sa.Connection, table: str, run: str) -> Iterator[list[tuple]]:
    result = conn.execution_options(stream_results=True).execute(sa.text(_SQL[table]), {"run": run})
    while chunk := result.fetchmany(_CHUNK):
        yield [tuple(r) for r in chunk]


def _findings_rows(conn: sa.Connection, run: str) -> list[tuple]:
    return [(f.kind, f.incarnation, f.first_step, f.last_step, f.detail, f.severity, f.detected_ns)
            for f in load_findings(conn, run)]


def _write_parquet(path: Path, table: str, chunks) -> int:
    schema = EXPORT_SCHEMAS[table]
    n = 0
    with pq.ParquetWriter(path, schema, compression="zstd") as writer:
        for rows in chunks:
            if rows:
                writer.write_table(pa.Table.from_pydict(_convert(table, rows), schema=schema))
                n += len(rows)
        if n == 0:
            writer.write_table(schema.empty_table())
    return n


def _manifest_facts(conn: sa.Connection, run: str) -> dict:
    info = conn.execute(sa.text("SELECT jobset, namespace FROM runs WHERE run = :run"),
                        {"run": run}).one()
    per_inc = {r.incarnation: r for r in conn.execute(sa.text(
        "SELECT incarnation, COUNT(*) AS steps, MIN(step) AS lo, MAX(step) AS hi,"
        " MIN(ts_ns) AS t0, MAX(ts_ns) AS t1 FROM loss_parts WHERE run = :run"
        " GROUP BY incarnation"), {"run": run})}
    incarnations = []
    for r in conn.execute(sa.text(
            "SELECT incarnation, started_ns, saw_start, first_step, last_step, restored_from,"
            " process_count, pod, image, image_id, topology, hosts, container_started_ns FROM incarnations"
            " WHERE run = :run ORDER BY incarnation"),
            {"run": run}):
        s = per_inc.get(r.incarnation)
        incarnations.append({
            "incarnation": r.incarnation, "pod": r.pod, "pods": [r.pod] if r.pod else [],
            "started": format_ns(r.started_ns) if r.started_ns else None,
            "saw_start": bool(r.saw_start), "restored_from": r.restored_from,
            "process_count": r.process_count,
            # what it ran on (follow reads it off the pod): which image produced these steps
            "image": r.image, "image_id": r.image_id, "topology": r.topology, "hosts": r.hosts,
            "container_started": format_ns(r.container_started_ns) if r.container_started_ns else None,
            "first_step": s.lo if s else None, "last_step": s.hi if s else None,
            "steps": s.steps if s else 0,
            "first_ts": format_ns(s.t0) if s and s.t0 is not None else None,
            "last_ts": format_ns(s.t1) if s and s.t1 is not None else None,
        })
    config: dict[str, dict[str, str]] = {}
    for inc, name, value in conn.execute(sa.text(
            "SELECT incarnation, name, value FROM config WHERE run = :run ORDER BY incarnation, name"),
            {"run": run}):
        config.setdefault(str(inc), {})[name] = value
    lo, hi = conn.execute(sa.text("SELECT MIN(step), MAX(step) FROM loss_parts WHERE run = :run"),
                          {"run": run}).one()
    stream_gaps = [
        {"stream": s, "start": format_ns(a), "end": format_ns(b) if b else None, "reason": why}
        for s, a, b, why in conn.execute(sa.text(
            "SELECT stream, start_ns, end_ns, reason FROM stream_gaps WHERE run = :run"
            " ORDER BY start_ns"), {"run": run})
    ]
    schema = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar()
    return {
        "run": run, "jobset": info.jobset, "namespace": info.namespace,
        "incarnations": incarnations, "config": config,
        "step_range": {"first": lo, "last": hi},
        "gaps": {"steps": missing_steps(conn, run), "streams": stream_gaps},
        "schema_version": schema,
    }


_CE = "SELECT incarnation, step, ce, ce_raw FROM loss_parts WHERE run = :run ORDER BY incarnation, step"
_INCARNATION_COLORS = ("C0", "C1", "C2", "C4", "C5", "C6", "C7", "C8", "C9")  # red (C3) marks missing steps


def ce_rows(conn: sa.Connection, run: str) -> list[tuple]:
    """(incarnation, step, ce, ce_raw) of every LOSS-PARTS row of `run` in log order: ce.png's data."""
    return [tuple(r) for r in conn.execute(sa.text(_CE), {"run": run})]


def plot_ce(path: Path, run: str, ce: list[tuple], incarnations: list[dict],
            gaps: list[dict]) -> None:
    """ce.png: the chart of ce_figure."""
    plots.save_png(ce_figure(run, ce, incarnations, gaps), path)


def write_ce_plot(store: Store, run: str, path: Path) -> None:
    """The ce.png of `run`'s export bundle, written alone to `path`."""
    with store.engine.connect() as conn:
        marks = plots.read_marks(conn, run)
        ce = ce_rows(conn, run)
    plot_ce(path, run, ce, marks.incarnations, marks.gaps)


def ce_figure(run: str, ce: list[tuple], incarnations: list[dict], gaps: list[dict]):
    """CE against step, one line per incarnation (ce_rows), broken over its missing steps; a
    replay drawn over the first recording of its steps without hiding it; missing steps
    shaded, non-finite CE and restores marked (storage/plots.py)."""
    fig = plots.new_figure()
    ax = fig.add_subplot()
    by_inc: dict[int, list[tuple]] = {}
    for inc, step, value, raw in ce:
        by_inc.setdefault(inc, []).append((step, value, raw))
    for order, (inc, rows) in enumerate(sorted(by_inc.items())):
        color = _INCARNATION_COLORS[order % len(_INCARNATION_COLORS)]
        xs, ys = plots.broken_line((step, value) for step, value, _ in rows)
        ax.plot(xs, ys, color=color, label=f"incarnation {inc}", **plots.curve_style(order, len(by_inc)))
        plots.mark_nonfinite(ax, [(step, raw) for step, value, raw in rows if not plots.finite(value)],
                             color, f"incarnation {inc}: " if len(by_inc) > 1 else "")
    plots.shade_missing(ax, [(g["first_step"], g["last_step"]) for g in gaps])
    plots.mark_restores([ax], incarnations)
    ax.set_xlabel("step")
    ax.set_ylabel("ce")
    ax.set_title(f"{run}: LOSS-PARTS ce")
    ax.grid(True, alpha=0.3)
    plots.legend(ax)
    return fig


def _findings_summary(rows: list[tuple]) -> dict:
    by_kind: dict[str, int] = {}
    by_severity: dict[str, int] = {}
    for kind, _inc, _a, _b, _detail, severity, _t in rows:
        by_kind[kind] = by_kind.get(kind, 0) + 1
        by_severity[severity] = by_severity.get(severity, 0) + 1
    return {"total": len(rows), "by_kind": dict(sorted(by_kind.items())),
            "by_severity": dict(sorted(by_severity.items()))}


def _build(store: Store, run: str, folder: Path, progress: Progress | None = None) -> dict:
    counts, files = {}, {}
    stages = len(_SQL) + 4  # the tables, then findings, the other facts, the plot, the checksums
    tick = progress or (lambda _done, _total: None)
    with store.engine.connect() as conn:
        facts = _manifest_facts(conn, run)
        for n, table in enumerate(_SQL):
            tick(n, stages)
            counts[table] = _write_parquet(folder / f"{table}.parquet", table,
                                           _table_rows(conn, table, run))
        tick(len(_SQL), stages)
        findings = _findings_rows(conn, run)
        counts["findings"] = _write_parquet(folder / "findings.parquet", "findings", [findings])
        ce = ce_rows(conn, run)
        try:  # the raw process-0 log and the archive manifest, when recorded for the run
            kept = {"raw": add_raw(conn, run, folder), "archives": add_archives(conn, run, folder)}
        except BundleFileError as exc:
            raise ExportError(f"cannot export {run}: {exc}") from None
        kept["ingested"] = ingested(conn, run)
        tick(len(_SQL) + 1, stages)
        goodput = timing_on(conn, run).report()  # where the run's time went (docs/goodput.md)
        # the gate's input and the verdicts newer evaluations replaced (issue 32): the ledger
        # says what the findings were evaluated with, and what they were before
        verdicts = {"reference_ce": reference_document(stored_reference(conn, run)),
                    "superseded_findings": [superseded_event(r) for r in load_superseded(conn, run)]}
    tick(len(_SQL) + 2, stages)
    plot_ce(folder / "ce.png", run, ce, facts["incarnations"], facts["gaps"]["steps"])
    tick(len(_SQL) + 3, stages)
    for path in bundle_files(folder):
        files[path.relative_to(folder).as_posix()] = {"sha256": file_sha256(path), "bytes": path.stat().st_size}
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        **facts,
        "counts": {**counts, "incarnations": len(facts["incarnations"]),
                   "steps": len({row[1] for row in ce})},
        "findings": _findings_summary(findings),
        "goodput": goodput,
        **verdicts,
        **{k: v for k, v in kept.items() if v},
        "files": files,
        "steptail_version": steptail.__version__,
    }
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2, allow_nan=False) + "\n")
    tick(stages, stages)
    return manifest


def export_run(store: Store, run: str, out: str | Path, *, force: bool = False,
               parents: bool = False, progress: Progress | None = None) -> dict:
    """Write the bundle of RUN to OUT; returns the manifest. `parents`: create OUT's missing
    parent directories (removed again when the export fails). `progress(stages_done, stages)`."""
    out = Path(out)
    check_export_name(run)
    if not run_exists(store, run):
        raise ExportError(f"no run {run!r} in {store.describe()}")
    if out.exists() and not force:
        raise ExportError(f"{out} already exists (use --force to replace it)")
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out} exists and is not a directory")
    created = _make_parents(out.parent) if parents else []
    if not out.parent.is_dir():
        raise ExportError(f"directory {out.parent} does not exist")
    tmp = None
    try:
        tmp = Path(tempfile.mkdtemp(prefix=hidden_name(out, "tmp-").name, dir=out.parent))
        manifest = _build(store, run, tmp, progress)
        os.chmod(tmp, 0o755)
        _swap_into_place(tmp, out)
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        for folder in created:
            with contextlib.suppress(OSError):  # not empty: another writer uses it now
                folder.rmdir()
        raise
    return manifest


def _make_parents(folder: Path) -> list[Path]:
    """Create FOLDER and its missing ancestors; returns those created, deepest first."""
    missing = []
    ancestor = folder
    while not ancestor.exists() and ancestor != ancestor.parent:
        missing.append(ancestor)
        ancestor = ancestor.parent
    folder.mkdir(parents=True, exist_ok=True)
    return missing


def _swap_into_place(tmp: Path, out: Path) -> None:
    if not out.exists():
        tmp.rename(out)
        return
    old = Path(tempfile.mkdtemp(prefix=hidden_name(out, "old-").name, dir=out.parent))
    old.rmdir()
    out.rename(old)
    try:
        tmp.rename(out)
    except BaseException:
        old.rename(out)  # put the previous export back
        raise
    shutil.rmtree(old, ignore_errors=True)


def verify(folder: str | Path) -> list[str]:
    """Names of files whose sha256 does not match the manifest (empty: the bundle is whole)."""
    folder = Path(folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    bad = [name for name, f in manifest["files"].items()
           if not (folder / name).is_file() or file_sha256(folder / name) != f["sha256"]]
    extra = {p.relative_to(folder).as_posix() for p in bundle_files(folder)} - set(manifest["files"])
    return sorted(bad + list(extra))
