"""The rows a run model produces (Batch), one plain tuple per row, and their column names.

Defined once here; storage (SQL statements, Parquet row types) and every reader take them
from here. A row is a plain tuple, not a NamedTuple: building NamedTuples costs about seven
times as much in the bulk path (RunModel.feed_steady zips whole blocks into rows). Readers
index rows by name instead: `row[LOSS_PARTS.STEP]`, a position looked up once per loop."""

from __future__ import annotations


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
LOSS_PARTS = Columns("run", "incarnation", "step", "ts_ns", "ce", "ce_raw", "parts")
REQUIRED_RBF = Columns("run", "incarnation", "step", "ts_ns", "max", "per_layer", "program")
POD_METRICS = Columns(
    "run", "incarnation", "step", "ts_ns", "seconds", "tflops", "tokens_per_s", "total_weights", "loss", "extra",
)
CONFIG = Columns("run", "incarnation", "name", "value")
CHECKPOINTS = Columns("run", "incarnation", "kind", "step", "ts_ns")
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
INCARNATIONS = Columns(
    "run", "incarnation", "started_ns", "saw_start", "first_step", "last_step", "restored_from",
    "process_index", "process_count", "pod", "image", "image_id", "topology", "hosts",
    "container_started_ns",
)
# Batch.quarantine: rows kept out of their table, and why.
QUARANTINE = Columns("run", "kind", "incarnation", "step", "ts_ns", "reason", "data", "digest", "detected_ns")
# The findings table, every reader's and writer's column order.
FINDINGS = Columns("run", "kind", "incarnation", "first_step", "last_step", "detail", "severity", "detected_ns")
# Batch.flags: lines the model flagged, as findings rows.
FLAGS = FINDINGS
# Batch.reconnects: streams re-opened (live path).
RECONNECTS = Columns("run", "stream", "ts_ns", "reason")
# Any table a row can be refused from, by name.
TABLES = COLUMNS | {"incarnations": INCARNATIONS}
