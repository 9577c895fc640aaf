"""The tables every sink carries, declared once: each column's name, type, size and whether it
may be NULL, each table's key and the sinks that hold it. Derived from here: the row column
orders (runs/rows.py), the Parquet schemas (storage/parquet.py); held to it by a test: the schema
the migrations build, on SQLite and PostgreSQL (tests/test_table_declarations.py). Adding a
column is its line here, its producer and one migration.

Types are logical; each sink maps them (storage/parquet.py for Arrow):
    int32           an integer (SQL INTEGER, Arrow int32): an incarnation
    int             an integer that may outgrow 32 bits (SQL INTEGER: 64 bits on SQLite, 32 on
                    PostgreSQL, where a larger one is refused and quarantined; Arrow int64): a step
    int64           an integer (SQL BIGINT, Arrow int64)
    float           a double (NULL: not finite, the raw token kept beside it)
    text            a string (SQL VARCHAR(size), TEXT without one)
    bool            a flag
    ts_ns           a kubelet stamp in ns since the epoch (SQL BIGINT; Parquet a UTC timestamp
                    named without the `_ns`)
    float_list      JSON of a list of numbers (per-layer values)
    float_map       JSON of an object of numbers (loss parts; Parquet adds `<name>_text` for
                    the values that are not numbers)
    json            any other JSON (Parquet: its text)"""

from __future__ import annotations

from dataclasses import dataclass

TYPES = ("int32", "int", "int64", "float", "text", "bool", "ts_ns", "float_list", "float_map", "json")
JSON_TYPES = frozenset({"float_list", "float_map", "json"})  # a JSON value (text in Parquet, JSONB in PostgreSQL)
SQL, PARQUET, LAKE = "sql", "parquet", "lake"


@dataclass(frozen=True)
class Col:
    name: str
    type: str
    size: int | None = None  # a text's longest, in characters (SQL VARCHAR)
    null: bool = True
    parquet: str | None = None  # its name in Parquet when not the usual (a stamp: without `_ns`)

    @property
    def parquet_name(self) -> str:
        if self.parquet:
            return self.parquet
        return self.name.removesuffix("_ns") if self.type == "ts_ns" else self.name

    def __post_init__(self) -> None:
        if self.type not in TYPES:
            raise ValueError(f"{self.name}: unknown type {self.type!r}")


@dataclass(frozen=True)
class Table:
    name: str
    cols: tuple[Col, ...]  # in row order (the tuples a Batch holds)
    key: tuple[str, ...]  # what makes a row one: the SQL primary key or unique constraint (none: ())
    sinks: frozenset[str]
    surrogate: str | None = None  # an SQL-only id column the rows do not carry

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.cols)

    def col(self, name: str) -> Col:
        return next(c for c in self.cols if c.name == name)


def _run_key(*more: Col) -> tuple[Col, ...]:
    return (Col("run", "text", 128, null=False), Col("incarnation", "int32", null=False), *more)


_STEP = Col("step", "int", null=False)
_TS = Col("ts_ns", "ts_ns")
_EVERY = frozenset({SQL, PARQUET, LAKE})

LOSS_PARTS = Table("loss_parts", (
    *_run_key(_STEP, _TS), Col("ce", "float"), Col("ce_raw", "text", 64, null=False),
    Col("parts", "float_map", null=False),
), key=("run", "incarnation", "step"), sinks=_EVERY)
REQUIRED_RBF = Table("required_rbf", (
    *_run_key(_STEP, _TS), Col("max", "float"), Col("per_layer", "float_list", null=False),
    Col("program", "text", 128),
), key=("run", "incarnation", "step"), sinks=_EVERY)
POD_METRICS = Table("pod_metrics", (
    *_run_key(_STEP, _TS), Col("seconds", "float"), Col("tflops", "float"), Col("tokens_per_s", "float"),
    Col("total_weights", "int64"), Col("loss", "float"),  # the per-pod loss: never the loss of record
    Col("extra", "json", null=False),
), key=("run", "incarnation", "step"), sinks=_EVERY)
CONFIG = Table("config", (
    *_run_key(), Col("name", "text", 256, null=False), Col("value", "text", null=False),
), key=("run", "incarnation", "name"), sinks=_EVERY)
CHECKPOINTS = Table("checkpoints", (
    *_run_key(), Col("kind", "text", 16, null=False), _STEP, _TS,
), key=("run", "incarnation", "kind", "step"), sinks=_EVERY)
INCARNATIONS = Table("incarnations", (
    *_run_key(), Col("started_ns", "ts_ns"), Col("saw_start", "bool", null=False),
    Col("first_step", "int"), Col("last_step", "int"), Col("restored_from", "int"),
    Col("process_index", "int32"), Col("process_count", "int32"), Col("pod", "text", 253),
    # what it ran on, read off the cluster by `follow` (NULL for files)
    Col("image", "text", 512), Col("image_id", "text", 512), Col("topology", "text", 64), Col("hosts", "int32"),
    Col("container_started_ns", "ts_ns"),  # its container's startedAt (goodput's queued_s)
), key=("run", "incarnation"), sinks=frozenset({SQL}))
FINDINGS = Table("findings", (
    Col("run", "text", 128, null=False), Col("kind", "text", 64, null=False),
    Col("incarnation", "int32", null=False), Col("first_step", "int", null=False),
    Col("last_step", "int", null=False), Col("detail", "text", null=False),
    Col("severity", "text", 16, null=False), Col("detected_ns", "ts_ns", null=False),
), key=("run", "kind", "incarnation", "first_step"), sinks=_EVERY, surrogate="id")
QUARANTINE = Table("quarantine", (
    Col("run", "text", 128, null=False), Col("kind", "text", 32, null=False), Col("incarnation", "int32"),
    Col("step", "int64"), Col("ts_ns", "int64"), Col("reason", "text", null=False),
    Col("data", "text", null=False), Col("digest", "text", 32, null=False),
    Col("detected_ns", "int64", null=False),
), key=("run", "digest"), sinks=frozenset({SQL}), surrogate="id")
RECONNECTS = Table("stream_reconnects", (
    Col("run", "text", 128, null=False), Col("stream", "text", 512, null=False),
    Col("ts_ns", "ts_ns", null=False), Col("reason", "text", 64, null=False),  # silence | eof
), key=(), sinks=_EVERY, surrogate="id")

STREAM_GAPS = Table("stream_gaps", (
    Col("run", "text", 128, null=False), Col("stream", "text", 512, null=False),
    Col("start_ns", "ts_ns", null=False, parquet="start_ts"), Col("end_ns", "ts_ns", parquet="end_ts"),
    Col("reason", "text", null=False), Col("detected_ns", "ts_ns", null=False),
), key=("run", "stream", "start_ns"), sinks=_EVERY, surrogate="id")

# The tables of per-line rows (a Batch's), in the order a batch writes them.
ROW_TABLES = (LOSS_PARTS, REQUIRED_RBF, POD_METRICS, CONFIG, CHECKPOINTS)
DECLARED = {t.name: t for t in (*ROW_TABLES, INCARNATIONS, FINDINGS, QUARANTINE, RECONNECTS, STREAM_GAPS)}
