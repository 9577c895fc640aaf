"""The Python API for notebooks and ledger jobs: a store's runs, steps (every execution, or
the final lineage), step times, config, checkpoints, incarnations, findings, gaps and
arm-vs-control comparisons as pandas DataFrames.

    import steptail

    with steptail.open("steptail.db") as st:      # or a postgresql:// URL; None: $STEPTAIL_DB
        steps = st.steps("arm-a", from_step=1, to_step=500)
        cmp = st.compare("arm-a", "control", tolerance=0.01)
        lp = st.lake("loss_parts", "gs://bucket/steptail", run="arm-a")   # the lake's table

Column types: steps, incarnations and counts are int64 (Int64 where a value may be missing),
times `datetime64[ns, UTC]` (NaT when the log had no kubelet timestamps), CE and other
measurements float64, text pandas' "string" dtype. `ce` is NaN when the logged value was not
finite; `ce_raw` keeps the token as printed ("nan", "inf").

The `steptail compare` and `steptail export` commands read through this class as well."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from steptail.runs import tables
from steptail.runs.lineage import survives
from steptail.storage import reads
from steptail.storage.compare import CompareRefused, Comparison, compare_runs
from steptail.storage.db import Store, open_store
from steptail.storage.flat import part_column, part_keys
from steptail.storage.reads import UnknownRun

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["CompareRefused", "Steptail", "UnknownRun", "open"]

_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
_INT64 = range(-(2**63), 2**63)
Lineage = Literal["all", "final"]
# The findings frame: runs.rows.FINDINGS in order, detected_ns as a timestamp.
FINDING_COLUMNS = (("run", "string"), ("kind", "string"), ("incarnation", "int64"),
                   ("first_step", "int64"), ("last_step", "int64"), ("detail", "string"),
                   ("severity", "string"), ("detected", "ns"))


def open(db: str | None = None) -> Steptail:
    """Open the store at `db` (SQLAlchemy URL or SQLite path; None: $STEPTAIL_DB, else
    ./steptail.db) for reading. A missing SQLite file is an error, never created."""
    return Steptail(open_store(db, create=False))


class Steptail:
    """Reads of one store. Use as a context manager, or call close()."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lakes: dict = {}  # location -> storage.lake.Lake, its catalog's engine closed with the store

    def __enter__(self) -> Steptail:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        for lake in self._lakes.values():
            engine = getattr(lake._catalog, "engine", None)  # None: never opened
            if engine is not None:
                engine.dispose()
        self._lakes.clear()
        self.store.dispose()

    def __repr__(self) -> str:
        return f"<steptail store {self.store.describe()}>"

    def _known(self, run: str) -> str:
        if "\x00" in run:  # PostgreSQL cannot even compare it (a driver error, not UnknownRun)
            raise UnknownRun(f"no run {run!r} in {self.store.describe()}")
        return reads.known_run(self.store, run)

    def _lineage(self, run: str, lineage: str, rows) -> list:
        """Rows (incarnation, step, ...) of every execution, or of the final lineage only."""
        if lineage == "all":
            return list(rows)
        if lineage != "final":
            raise ValueError(f"lineage must be 'all' or 'final', not {lineage!r}")
        bounds = reads.lineage_bounds(self.store, run)
        return [r for r in rows if survives(bounds, r[0], r[1])]

    # -- frames --------------------------------------------------------------------------
    def runs(self) -> pd.DataFrame:
        """One row per run (the fields of `steptail runs --json`): run, jobset, namespace,
        sources (list), state and state_reason (steptail.runs.state), incarnations, steps, max_step, last_step,
        last_ce, last_ts, bad_lines, updated."""
        rows = reads.run_summaries(self.store)
        return _frame({
            "run": (_column(rows, "run"), "string"),
            "jobset": (_column(rows, "jobset"), "string"),
            "namespace": (_column(rows, "namespace"), "string"),
            "sources": (_column(rows, "sources"), object),
            "state": (_column(rows, "state"), "string"),
            "state_reason": (_column(rows, "state_reason"), "string"),
            "incarnations": (_column(rows, "incarnations"), "int64"),
            "steps": (_column(rows, "steps"), "int64"),
            "max_step": (_column(rows, "max_step"), "Int64"),
            "last_step": (_column(rows, "last_step"), "Int64"),
            "last_ce": (_column(rows, "last_ce"), "float64"),
            "last_ts": (_column(rows, "last_ts_ns"), "ns"),
            "bad_lines": (_column(rows, "bad_lines"), "int64"),
            "updated": (_column(rows, "updated_ns"), "ns"),
        })

    def steps(self, run: str, incarnation: int | None = None, from_step: int | None = None,
              to_step: int | None = None, parts: Literal["columns", "dict"] = "columns",
              lineage: Lineage = "all") -> pd.DataFrame:
        """LOSS-PARTS rows of `run` in log order (a replayed step once per incarnation):
        incarnation, step, ts, ce, ce_raw, then the other loss parts.

        lineage="final": each step once, from the execution whose result survives (a step a
        later incarnation ran again is dropped): the curve to plot, without the zig-zag of
        replays (docs/goodput.md, "final lineage"). lineage="all" (default): every execution.

        parts="columns" (default): one column per part key as logged (z_loss, moe_lb, total,
        weights, ...): Int64 when every value is an integer, else float64 (non-finite
        restored), else string; a key named like a fixed column becomes `parts.<key>` (the
        names of `steptail steps -o csv`: steptail.storage.flat).
        parts="dict": one object column `parts` holding each row's dict as stored (non-finite
        values as the words "nan", "inf", "-inf"), as in `steptail steps --json`."""
        if parts not in ("columns", "dict"):
            raise ValueError(f"parts must be 'columns' or 'dict', not {parts!r}")
        run = self._known(run)
        rows = self._lineage(run, lineage, reads.iter_loss_parts(self.store, run, incarnation, from_step, to_step))
        frame = _declared_scalars(tables.LOSS_PARTS, rows)
        stored = [r[_at(tables.LOSS_PARTS, "parts")] for r in rows]
        if parts == "dict":
            frame["parts"] = _series(stored, object)
            return frame
        for key, series in _part_columns(stored).items():
            frame[part_column(key)] = series
        return frame

    def rbf(self, run: str, incarnation: int | None = None, from_step: int | None = None,
            to_step: int | None = None, lineage: Lineage = "all") -> pd.DataFrame:
        """REQUIRED_RBF rows of `run` in log order: incarnation, step, ts, max (float64),
        per_layer (a list of floats per row), program. `lineage` as for steps()."""
        run = self._known(run)
        rows = self._lineage(run, lineage, reads.iter_required_rbf(self.store, run, incarnation, from_step, to_step))
        frame = _declared_scalars(tables.REQUIRED_RBF, rows)
        at = _at(tables.REQUIRED_RBF, "per_layer")
        frame.insert(frame.columns.get_loc("max") + 1, "per_layer",
                     _series([[float(_NONFINITE.get(v, v)) for v in r[at]] for r in rows], object))
        return frame

    def findings(self, run: str | None = None) -> pd.DataFrame:
        """Stored findings (what `check` and `follow` recorded) of `run`, or of every run:
        run, kind, incarnation, first_step, last_step (-1 when not tied to a step), detail,
        severity, detected."""
        rows = reads.list_findings(self.store, None if run is None else self._known(run))
        columns = list(zip(*rows, strict=True)) or [()] * len(FINDING_COLUMNS)
        return _frame({name: (list(values), kind)
                       for (name, kind), values in zip(FINDING_COLUMNS, columns, strict=True)})

    def superseded(self, run: str) -> pd.DataFrame:
        """Findings of `run` a newer evaluation changed or no longer raised (kept, never
        deleted): the findings' columns, then superseded (when), superseded_by (check, ingest,
        reparse, follow) and why."""
        from steptail.storage.superseded import load_superseded

        run = self._known(run)
        with self.store.engine.connect() as conn:
            rows = load_superseded(conn, run)
        names = [n for n, _ in FINDING_COLUMNS] + ["superseded", "superseded_by", "why"]
        kinds = [k for _, k in FINDING_COLUMNS] + ["ns", "string", "string"]
        keys = [n for n, _ in FINDING_COLUMNS[:-1]] + ["detected_ns", "superseded_ns", "superseded_by", "why"]
        return _frame({n: ([r[key] for r in rows], k) for n, k, key in zip(names, kinds, keys, strict=True)})

    def gaps(self, run: str) -> pd.DataFrame:
        """Steps missing from `run`, one row per range: kind ('gap' between two recorded steps,
        'head_gap' before an incarnation's first step), incarnation, first_step, last_step,
        missing (how many steps). The ranges of the export manifest's gaps.steps."""
        rows = reads.step_gaps(self.store, self._known(run))
        return _frame({
            "kind": (_column(rows, "kind"), "string"),
            "incarnation": (_column(rows, "incarnation"), "int64"),
            "first_step": (_column(rows, "first_step"), "int64"),
            "last_step": (_column(rows, "last_step"), "int64"),
            "missing": ([g["last_step"] - g["first_step"] + 1 for g in rows], "int64"),
        })

    def goodput(self, run: str) -> pd.DataFrame:
        """Step time per incarnation of `run`: incarnation, steps, median_step_s, step_s_mad,
        tokens_per_s_device, tflops_per_device (NaN when not logged); `attrs["goodput"]` holds
        the rest of `steptail goodput --json` (wall, productive, ... seconds, goodput, restarts:
        docs/goodput.md)."""
        from steptail.storage.goodput import run_goodput

        g = run_goodput(self.store, self._known(run))
        rows = g["incarnations"]
        frame = _frame({
            "incarnation": (_column(rows, "incarnation"), "int64"),
            "steps": (_column(rows, "steps"), "int64"),
            **{k: ([math.nan if r[k] is None else r[k] for r in rows], "float64")
               for k in ("median_step_s", "step_s_mad", "tokens_per_s_device", "tflops_per_device")},
        })
        frame.attrs["goodput"] = g
        return frame

    def step_times(self, run: str, lineage: Lineage = "all") -> pd.DataFrame:
        """Each step's time and throughput as the trainer printed them (MaxText's `completed step:
        N, seconds: S, TFLOP/s/device: …, Tokens/s/device: …`): incarnation, step, ts, seconds,
        tflops_per_device, tokens_per_s_device, total_weights, loss (NaN where a line had no such
        field: profiler steps print no `seconds`, ramp-up lines no throughput). `lineage` as for
        steps(); goodput() has the per-incarnation medians."""
        run = self._known(run)
        rows = self._lineage(run, lineage, reads.table_rows(
            self.store, "pod_metrics", run,
            ("incarnation", "step", "ts_ns", "seconds", "tflops", "tokens_per_s", "total_weights", "loss"),
            "incarnation, step"))
        names = ("incarnation", "step", "ts", "seconds", "tflops_per_device", "tokens_per_s_device",
                 "total_weights", "loss")
        kinds = ("int64", "int64", "ns", "float64", "float64", "float64", "float64", "float64")
        return _frame({n: ([_float(r[i]) if k == "float64" else r[i] for r in rows], k)
                       for i, (n, k) in enumerate(zip(names, kinds, strict=True))})

    def config(self, run: str, incarnation: int | None = None) -> pd.DataFrame:
        """The resolved configuration the trainer printed (`Config param NAME: VALUE`) per
        incarnation: incarnation, name, value (as printed, a string). One incarnation's as a
        dict: `dict(zip(df.name, df.value))`."""
        names = ("incarnation", "name", "value")
        rows = reads.table_rows(self.store, "config", self._known(run), names, "incarnation, name")
        if incarnation is not None:
            rows = [r for r in rows if r[0] == incarnation]
        return _declared(tables.CONFIG, names, rows)

    def checkpoints(self, run: str) -> pd.DataFrame:
        """Checkpoints saved and restored: incarnation, kind ('save' or 'restore'), step, ts."""
        names = ("incarnation", "kind", "step", "ts_ns")
        rows = reads.table_rows(self.store, "checkpoints", self._known(run), names, "incarnation, step, kind")
        return _declared(tables.CHECKPOINTS, names, rows)

    def incarnations(self, run: str) -> pd.DataFrame:
        """One row per incarnation (each start of the trainer, a restart or a resume): incarnation,
        started (its first line: the start-up line when read), saw_start (followed from its first
        line), first_step, last_step, restored_from (the checkpoint step it resumed from),
        process_index, process_count, pod, image, topology, hosts, container_started (its
        container's start, when followed live)."""
        names = ("incarnation", "started_ns", "saw_start", "first_step", "last_step", "restored_from",
                 "process_index", "process_count", "pod", "image", "topology", "hosts", "container_started_ns")
        rows = reads.table_rows(self.store, "incarnations", self._known(run), names, "incarnation")
        return _declared(tables.INCARNATIONS, names, rows)

    def stream_gaps(self, run: str) -> pd.DataFrame:
        """Stretches of a followed log that could not be read back: stream, start, end (NaT
        while open), reason."""
        rows = reads.stream_gaps(self.store, self._known(run))
        return _frame({
            "stream": ([r[0] for r in rows], "string"),
            "start": ([r[1] for r in rows], "ns"),
            "end": ([r[2] for r in rows], "ns"),
            "reason": ([r[3] for r in rows], "string"),
        })

    def compare(self, arm: str, control: str, tolerance: float = 1e-3, rel: float = 0.0) -> pd.DataFrame:
        """CE of `arm` against `control` at each common step (each step's value from its latest
        incarnation): step, arm_ce, control_ce, delta (arm - control; NaN when a side is not
        finite), beyond (|delta| > tolerance + rel x |control_ce|, or one side not finite).
        `frame.attrs["summary"]` holds the fields of `steptail compare --json` but the steps.
        Raises CompareRefused when the runs ran on different slice shapes or share no step."""
        result = self.comparison(arm, control, tolerance, rel)
        frame = _frame({
            "step": (_column(result.rows, "step"), "int64"),
            "arm_ce": (_column(result.rows, "arm_ce"), "float64"),
            "control_ce": (_column(result.rows, "control_ce"), "float64"),
            "delta": (_column(result.rows, "delta"), "float64"),
            "beyond": (_column(result.rows, "beyond"), "bool"),
        })
        frame.attrs["summary"] = result.summary()
        return frame

    def lake(self, table: str, location: str, run: str | None = None) -> pd.DataFrame:
        """One table of the lake at `location` (s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or
        file:///DIR; its catalog in this store's database), every run or `run`, read through
        the table's current snapshot: never a listing of files (docs/lake.md). Credentials
        and endpoints come from the environment, as `follow --parquet URL` takes them.

        Columns: `run`, then the table's columns as Parquet has them (steptail.storage.lake
        lake_schema): timestamps `datetime64[ns, UTC]` (stored in microseconds), text
        pandas' `string`, maps (`loss_parts.parts`, `parts_text`) as dicts, lists as lists.
        A table not written yet, or a run it does not hold, gives no row. Raises ValueError
        for a table steptail does not write, storage.lake.LakeError when the lake cannot be
        read (a one-line message)."""
        import pandas as pd
        import pyarrow as pa

        from steptail.storage.lake import TABLES, Lake

        if table not in TABLES:
            raise ValueError(f"no lake table {table!r}: one of {', '.join(TABLES)}")
        if location not in self._lakes:
            self._lakes[location] = Lake(location, self.store.catalog_url())
        data = self._lakes[location].read(table, run)
        data = data.cast(pa.schema([pa.field(f.name, pa.timestamp("ns", tz="UTC")) if pa.types.is_timestamp(f.type)
                                    else f for f in data.schema]))
        types = {pa.string(): pd.StringDtype(), pa.large_string(): pd.StringDtype()}
        return data.to_pandas(types_mapper=types.get, maps_as_pydicts="strict")

    # -- objects ---------------------------------------------------------------------------
    def comparison(self, arm: str, control: str, tolerance: float = 1e-3, rel: float = 0.0) -> Comparison:
        """The comparison behind compare(), with its summary and plot (steptail.storage.compare)."""
        for run in (arm, control):
            self._known(run)
        return compare_runs(self.store, arm, control, tolerance, rel)

    def export(self, run: str, out: str | Path, *, force: bool = False, progress=None) -> dict:
        """Write the ledger bundle of `run` (Parquet per table, manifest.json, ce.png) to the
        directory `out`, creating missing parents; returns the manifest. An existing `out` is
        replaced only with force=True (storage.export.ExportError otherwise).
        `progress(stages_done, stages)` is called as the bundle is made."""
        from steptail.storage.export import check_export_name, export_run

        check_export_name(run)
        self._known(run)
        return export_run(self.store, run, out, force=force, parents=True, progress=progress)


# -- typed frames --------------------------------------------------------------------------
# pandas loads with the first frame, not with this module: the compare and export commands
# share this class and need no pandas.
def _column(rows: list[dict], name: str) -> list:
    return [r[name] for r in rows]


def _float(value) -> float:
    return math.nan if value is None else float(value)


def _series(values: list, kind) -> pd.Series:
    import numpy as np
    import pandas as pd

    if kind == "ns":  # ns since the epoch; None becomes NaT (int64's minimum)
        nat = np.iinfo(np.int64).min
        raw = np.array([nat if v is None else v for v in values], dtype=np.int64)
        return pd.Series(raw.view("datetime64[ns]")).dt.tz_localize("UTC")
    if kind is object:
        out = pd.Series([None] * len(values), dtype=object)
        for i, v in enumerate(values):  # lists and dicts kept whole, not spread over rows
            out.iat[i] = v
        return out
    return pd.Series(values, dtype=kind)


# A declared type (runs/tables.py) as a pandas dtype: nullable integers where NULL can be.
_PANDAS = {"int32": "Int64", "int": "Int64", "int64": "Int64", "float": "float64", "text": "string",
           "bool": "bool", "ts_ns": "ns"}


def _declared(table: tables.Table, names: tuple[str, ...], rows) -> pd.DataFrame:
    """Columns `names` of a declared table: typed by the declaration, stamps named as in
    Parquet (`ts_ns` -> `ts`)."""
    out = {}
    for i, name in enumerate(names):
        col = table.col(name)
        kind = "int64" if _PANDAS[col.type] == "Int64" and not col.null else _PANDAS[col.type]
        values = [bool(r[i]) for r in rows] if col.type == "bool" else [r[i] for r in rows]
        out[col.parquet_name] = (values, kind)
    return _frame(out)


def _declared_scalars(table: tables.Table, rows) -> pd.DataFrame:
    """The columns of a step table's reads.iter_* rows (the table's columns but the run) that
    are not JSON, typed by the declaration."""
    names = table.names[1:]
    scalar = [i for i, name in enumerate(names) if table.col(name).type not in tables.JSON_TYPES]
    return _declared(table, tuple(names[i] for i in scalar), [tuple(r[i] for i in scalar) for r in rows])


def _at(table: tables.Table, name: str) -> int:
    """Where column `name` is in a reads.iter_* row of `table` (its columns but the run)."""
    return table.names.index(name) - 1


def _frame(columns: dict[str, tuple[list, object]]) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame({name: _series(values, kind) for name, (values, kind) in columns.items()})


def _part_columns(stored: list[dict]) -> dict[str, pd.Series]:
    out = {}
    for key in part_keys(stored):
        values = [parts.get(key) for parts in stored]
        present = [v for v in values if v is not None]
        if all(type(v) is int and v in _INT64 for v in present):
            out[key] = _series(values, "Int64")
        elif all(type(v) in (int, float) or v in _NONFINITE for v in present):
            out[key] = _series([None if v is None else float(_NONFINITE.get(v, v)) for v in values],
                               "float64")
        else:  # a bare word among the values
            out[key] = _series([None if v is None else str(v) for v in values], "string")
    return out
