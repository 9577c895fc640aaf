"""Parquet sink: hive-partitioned files per run and table, zstd, declared schemas.

`DIR/<table>/run=<run>/part-<time>-<id>.parquet`. A file is written under a `.tmp` name and
renamed into place on commit, so readers never see a half-written file and a failed ingest
leaves nothing behind (not even the directories it created). The partition column `run`
lives in the path, not in the file.

`loss_parts.parts` is a map<string, double> (nan/inf included); a value that is not a number
goes to `parts_text` instead. Files of the first schema (`parts` as JSON text) still read:
`read_table` and compaction (storage.compact) convert them (`upgrade`)."""

from __future__ import annotations

import json
import math
import os
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from steptail.runs import tables
from steptail.runs.model import Batch
from steptail.runs.rows import COLUMNS
from steptail.runs.tables import Table
from steptail.storage.durable import hidden_name
from steptail.storage.parquet_error import ParquetError
from steptail.storage.paths import inside

_TS = pa.timestamp("ns", tz="UTC")
PARTS_TYPE = pa.map_(pa.string(), pa.float64())
PARTS_TEXT_TYPE = pa.map_(pa.string(), pa.string())
# loss_parts as first written, `parts` as JSON text: still read, and kept by the ledger export.
JSON_PARTS_SCHEMA = pa.schema([
    ("incarnation", pa.int32()), ("step", pa.int64()), ("ts", _TS), ("ce", pa.float64()),
    ("ce_raw", pa.string()), ("parts", pa.string()),
])
# Each declared type as Arrow holds it (runs/tables.py).
ARROW = {
    "int32": pa.int32(), "int": pa.int64(), "int64": pa.int64(), "float": pa.float64(), "text": pa.string(),
    "bool": pa.bool_(), "ts_ns": _TS, "float_list": pa.list_(pa.float64()), "float_map": PARTS_TYPE,
    "json": pa.string(),
}


def arrow_schema(table: Table) -> pa.Schema:
    """A declared table's Parquet schema: `run` is the partition, not a column."""
    fields = []
    for col in table.cols:
        if col.name == "run":
            continue
        fields.append(pa.field(col.parquet_name, ARROW[col.type]))
        if col.type == "float_map":  # the values that are not numbers (`nan`, a token)
            fields.append(pa.field(f"{col.name}_text", PARTS_TEXT_TYPE))
    return pa.schema(fields)


SCHEMAS = {t.name: arrow_schema(t) for t in tables.ROW_TABLES}
# Tables rewritten whole from SQL at each write (storage.compact.write_snapshots): findings
# grow and are dropped in place, so appending parts would keep stale rows.
SNAPSHOT_SCHEMAS = {t.name: arrow_schema(t) for t in (tables.FINDINGS, tables.STREAM_GAPS, tables.RECONNECTS)}


# Columns whose values repeat (a few hundred distinct per-layer values, program names…).
# Dictionary encoding elsewhere (floats, JSON text) is tried, found useless and costs time.
DICTIONARY = {
    "loss_parts": (),
    "required_rbf": ("per_layer.list.element", "program"),
    "pod_metrics": ("extra",),
    "config": ("name", "value"),
    "checkpoints": ("kind",),
}


def _row_type(table: str) -> pa.StructType:
    """The Batch row tuples as Arrow sees them (JSON text as strings, ts as int ns)."""
    schema = SCHEMAS[table]
    return pa.struct([
        pa.field(name, pa.int64() if name == "ts_ns" else pa.string() if name in ("run", "per_layer", "parts")
                 else schema.field(name).type)
        for name in COLUMNS[table]
    ])


_ROW_TYPES = {table: _row_type(table) for table in SCHEMAS}


def _layers(json_text: pa.Array) -> pa.Array:
    """JSON lists of numbers -> list<double>, vectorised. nan/inf arrive as quoted words and
    `[]` as an empty string once the brackets are cut; the passes for those run only when
    such a value is there (they would double the cost of the usual block)."""
    text = pc.utf8_slice_codeunits(json_text, 1, -1)
    if _holds_byte(json_text, '"'):
        text = pc.replace_substring(text, '"', "")
    parts = pc.split_pattern(text, ",")
    if pc.any(pc.equal(text, "")).as_py():
        parts = pc.if_else(pc.equal(text, ""), pa.scalar([], pa.list_(pa.string())), parts)
    return pc.cast(parts, pa.list_(pa.float64()))


def _parts_maps(json_text: pa.Array) -> tuple[pa.Array, pa.Array]:
    """JSON objects of LOSS-PARTS values -> (parts, parts_text) maps. The parser's usual shape
    (`{"k":1.5,"j":2}`: numbers only) is split and cast vectorised; when that fails (a quoted
    value: nan/inf or a word) or an escape is present, the odd rows are decoded one by one.
    Detecting odd rows up front would cost a pass over every usual block."""
    if json_text.null_count:
        return _parts_maps_decoded(json_text.to_pylist())
    text = pc.utf8_slice_codeunits(json_text, 1, -1)
    if not _holds_byte(json_text, "\\"):
        try:
            return _numeric_parts(text), _empty_maps(len(text))
        except (pa.ArrowInvalid, pa.ArrowIndexError, IndexError):
            pass
    # Usual rows vectorised, odd rows decoded, then put back in order.
    odd = pc.or_(pc.match_substring(text, ':"'), pc.match_substring(text, "\\"))
    odd_at = pc.indices_nonzero(odd)
    usual_at = pc.indices_nonzero(pc.invert(odd))
    try:
        usual = (_numeric_parts(text.take(usual_at)), _empty_maps(len(usual_at)))
    except (pa.ArrowInvalid, pa.ArrowIndexError, IndexError):  # another shape: all decoded
        return _parts_maps_decoded(json_text.to_pylist())
    decoded = _parts_maps_decoded(json_text.take(odd_at).to_pylist())
    order = pc.sort_indices(pa.concat_arrays([usual_at, odd_at]))
    return tuple(pa.concat_arrays([u, d]).take(order) for u, d in zip(usual, decoded, strict=True))


def _holds_byte(strings: pa.Array, char: str) -> bool:
    """Whether the text of a string array may hold `char` (its whole data buffer is scanned:
    one vectorised pass, several times cheaper than a match per string; a slice's neighbours may
    answer True, which only costs the pass that handles it)."""
    data = strings.buffers()[2]
    return data is not None and bool((np.frombuffer(data, np.uint8) == ord(char)).any())


def _numeric_parts(text: pa.Array) -> pa.Array:
    entries = pc.split_pattern(text, ",")
    if pc.any(pc.equal(text, "")).as_py():  # `{}`
        entries = pc.if_else(pc.equal(text, ""), pa.scalar([], pa.list_(pa.string())), entries)
    key_value = pc.split_pattern(pc.list_flatten(entries), '":', max_splits=1)
    keys = pc.utf8_slice_codeunits(pc.list_element(key_value, 0), 1)
    values = pc.cast(pc.list_element(key_value, 1), pa.float64())
    return pa.MapArray.from_arrays(entries.offsets, keys, values, type=PARTS_TYPE)


def _empty_maps(n: int) -> pa.Array:
    return pa.MapArray.from_arrays(pa.array([0] * (n + 1), pa.int32()), pa.array([], pa.string()),
                                   pa.array([], pa.string()), type=PARTS_TEXT_TYPE)


_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _parts_maps_decoded(texts: list) -> tuple[pa.Array, pa.Array]:
    numbers, words = [], []
    for text in texts:
        if text is None:
            numbers.append(None)
            words.append(None)
            continue
        obj = json.loads(text) if isinstance(text, str) else text
        numbers.append([(k, v if v is None else float(_NONFINITE.get(v, v))) for k, v in obj.items()
                        if not isinstance(v, str) or v in _NONFINITE])
        words.append([(k, v) for k, v in obj.items() if isinstance(v, str) and v not in _NONFINITE])
    return pa.array(numbers, PARTS_TYPE), pa.array(words, PARTS_TEXT_TYPE)


def upgrade(table: str, data: pa.Table) -> pa.Table:
    """A file's table in any schema `table` was written with -> SCHEMAS[table] (or
    SNAPSHOT_SCHEMAS): loss_parts' JSON `parts` become the maps; a missing column is null."""
    schema = dataset_schema(table)
    if data.schema.remove_metadata() == schema:
        return data
    cols = {name: data.column(name) for name in data.column_names}
    if table == "loss_parts" and pa.types.is_string(data.schema.field("parts").type):
        cols["parts"], cols["parts_text"] = _parts_maps(data.column("parts").combine_chunks())
    return pa.Table.from_arrays(
        [cols[f.name].cast(f.type) if f.name in cols else pa.nulls(data.num_rows, f.type) for f in schema],
        schema=schema)


def dataset_schema(table: str) -> pa.Schema:
    return SCHEMAS[table] if table in SCHEMAS else SNAPSHOT_SCHEMAS[table]


def to_arrow(table: str, rows: list[tuple]) -> pa.Table:
    """Batch rows -> a table of SCHEMAS[table]. Arrow converts the tuples itself (a struct
    array), several times faster than transposing them in Python first."""
    rows_ = pa.RecordBatch.from_struct_array(pa.array(rows, type=_ROW_TYPES[table]))
    cols = []
    for name in SCHEMAS[table].names:
        if name == "ts":
            cols.append(rows_.column("ts_ns").cast(_TS))
        elif name == "per_layer":
            cols.append(_layers(rows_.column("per_layer")))
        elif name == "parts":
            cols.extend(_parts_maps(rows_.column("parts")))
        elif name == "parts_text":
            continue  # with `parts`
        else:
            cols.append(rows_.column(name))
    return pa.Table.from_arrays(cols, schema=SCHEMAS[table])


def run_folder(root: str | Path, table: str, run: str) -> Path:
    """ROOT/<table>/run=<run>: refused (storage.paths.UnsafePath) if the name would leave it."""
    return inside(root, table, f"run={run}")


class ParquetSink:
    """Files are written under temporary names; `commit` publishes them, `abort` removes them
    and the directories this sink created, leaving the tree as it was."""

    def __init__(self, root: str | Path, run: str) -> None:
        self.root = Path(root)
        self.run = run
        self._writers: dict[str, pq.ParquetWriter] = {}  # open files, by table
        self._files: list[tuple[Path, Path]] = []  # (temporary, final) of every file begun
        self._made_dirs: list[Path] = []
        self._failed: ParquetError | None = None

    def write(self, batch: Batch) -> None:
        for table in SCHEMAS:
            if rows := getattr(batch, table):
                self.write_table(table, to_arrow(table, rows))

    def write_table(self, table: str, data: pa.Table) -> None:
        """Rows already in SCHEMAS[table] (write's, or a back-fill's filtered by key)."""
        if self._failed is not None:  # pyarrow's writer is unusable after an I/O error
            raise self._failed
        with self._io_errors():
            self._writer(table).write_table(data)

    def _writer(self, table: str) -> pq.ParquetWriter:
        if table not in self._writers:
            folder = run_folder(self.root, table, self.run)
            for missing in (folder, *folder.parents):
                if missing.exists():
                    break
                self._made_dirs.append(missing)
            folder.mkdir(parents=True, exist_ok=True)
            name = f"part-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}.parquet"
            tmp = hidden_name(folder / name, "tmp")
            self._files.append((tmp, folder / name))
            self._writers[table] = pq.ParquetWriter(tmp, SCHEMAS[table], compression="zstd",
                                                    use_dictionary=list(DICTIONARY[table]))
        return self._writers[table]

    def finish(self) -> None:
        """Complete the open files (footers: where a full disk shows last) without publishing
        them, so that a caller can do this before its SQL commit."""
        with self._io_errors():
            while self._writers:
                _table, writer = self._writers.popitem()  # popped first: never closed twice
                writer.close()

    def commit(self) -> list[Path]:
        """Finish and move the files into place; later writes start new files."""
        self.finish()
        done = []
        with self._io_errors():
            for tmp, final in self._files:
                tmp.rename(final)
                done.append(final)
        self._files.clear()
        self._made_dirs.clear()
        return done

    def abort(self) -> None:
        """Remove every file begun and every directory created (when empty). Never raises:
        it runs while another error is on its way out."""
        while self._writers:
            _table, writer = self._writers.popitem()
            try:
                writer.close()  # closed here, or pyarrow closes it at garbage collection and prints
            except Exception:  # noqa: BLE001, S110 - the file is deleted next
                pass
        for tmp, _ in self._files:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
        self._files.clear()
        for folder in sorted(self._made_dirs, key=lambda p: len(p.parts), reverse=True):
            try:
                folder.rmdir()  # only if empty: another writer's files stay
            except OSError:
                pass
        self._made_dirs.clear()

    @contextmanager
    def _io_errors(self):
        try:
            yield
        except OSError as exc:
            reason = os.strerror(exc.errno) if exc.errno else str(exc).strip().splitlines()[0]
            self._failed = ParquetError(f"cannot write Parquet under {self.root}: {reason}")
            raise self._failed from exc


def read_table(root: str | Path, table: str, run: str | None = None) -> pa.Table:
    """Read one table back (all runs, or one), with `run` restored from the path. Files of an
    earlier schema are converted (`upgrade`), so a dataset of mixed files reads as one."""
    base = Path(root) / table
    folders = [run_folder(root, table, run)] if run is not None else sorted(base.glob("run=*"))
    pieces = []
    for folder in folders:
        name = folder.name.removeprefix("run=")
        for path in visible_files(folder):
            data = upgrade(table, pq.ParquetFile(path).read())
            pieces.append(data.append_column("run", pa.array([name] * data.num_rows, pa.string())))
    if not pieces:
        return dataset_schema(table).empty_table().append_column("run", pa.array([], pa.string()))
    return pa.concat_tables(pieces)


def visible_files(folder: Path) -> list[Path]:
    """The files readers see (`*.parquet`); hidden ones (`.` first) are being written or replaced."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob("*.parquet") if not p.name.startswith("."))
