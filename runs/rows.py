"""The rows a run model produces (Batch), one plain tuple per row, and their column names.

The names come from the tables' declaration (runs/tables.py); storage (SQL statements, Parquet
row types) and every reader take them from here. A row is a plain tuple, not a NamedTuple: building NamedTuples costs about seven
times as much in the bulk path (RunModel.feed_steady zips whole blocks into rows). Readers
index rows by name instead: `row[LOSS_PARTS.STEP]`, a position looked up once per loop."""

from __future__ import annotations

from steptail.runs import tables


class Columns(tuple):
    """A table's column names in row order, with each column's position as an upper-case
    attribute: LOSS_PARTS.STEP == LOSS_PARTS.index("step")."""

    def __new__(cls, *names: str) -> Columns:
        columns = super().__new__(cls, names)
        for position, name in enumerate(names):
            setattr(columns, name.upper(), position)
        return columns

    def __reduce__(self):
        return (Columns, tuple(self))


# Every table row starts with these two (stream_reconnects aside).
RUN, INCARNATION = 0, 1
LOSS_PARTS = Columns(*tables.LOSS_PARTS.names)
REQUIRED_RBF = Columns(*tables.REQUIRED_RBF.names)
POD_METRICS = Columns(*tables.POD_METRICS.names)
CONFIG = Columns(*tables.CONFIG.names)
CHECKPOINTS = Columns(*tables.CHECKPOINTS.names)
# The tables of per-line rows, as Batch holds them (JSON columns as JSON text).
COLUMNS = {
    "loss_parts": LOSS_PARTS,
    "required_rbf": REQUIRED_RBF,
    "pod_metrics": POD_METRICS,
    "config": CONFIG,
    "checkpoints": CHECKPOINTS,
}
ROW_TABLES = tuple(COLUMNS)
# Of those, the rows of one step each: keyed by (incarnation, step).
STEP_TABLES = ("loss_parts", "required_rbf", "pod_metrics")
# Batch.incarnations values (Incarnation.row).
INCARNATIONS = Columns(*tables.INCARNATIONS.names)
# Batch.quarantine: rows kept out of their table, and why.
QUARANTINE = Columns(*tables.QUARANTINE.names)
# The findings table, every reader's and writer's column order.
FINDINGS = Columns(*tables.FINDINGS.names)
# Batch.flags: lines the model flagged, as findings rows.
FLAGS = FINDINGS
# Batch.reconnects: streams re-opened (live path).
RECONNECTS = Columns(*tables.RECONNECTS.names)
# Any table a row can be refused from, by name.
TABLES = COLUMNS | {"incarnations": INCARNATIONS}
