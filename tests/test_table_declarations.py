"""The tables' declaration (runs/tables.py) against what uses it: the schema the migrations
build on each store, the row column orders and the Parquet schemas."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
import sqlalchemy as sa

from steptail.runs import rows, tables
from steptail.storage.parquet import SCHEMAS, SNAPSHOT_SCHEMAS

# A reflected SQL type -> the declared types it can hold.
FAMILIES = {
    "INTEGER": {"int32", "int"}, "BIGINT": {"int64", "ts_ns"}, "FLOAT": {"float"},
    "DOUBLE_PRECISION": {"float"}, "DOUBLE": {"float"}, "VARCHAR": {"text"}, "TEXT": {"text"},
    "JSON": {"float_list", "float_map", "json"}, "JSONB": {"float_list", "float_map", "json"},
    "BOOLEAN": {"bool"},
}


def _sql_type(col: dict) -> tuple[str, int | None]:
    kind = type(col["type"]).__name__.upper()
    return kind, getattr(col["type"], "length", None)


@pytest.mark.parametrize("table", sorted(tables.DECLARED))
def test_the_migrations_build_each_declared_table(store, table):
    """Same columns in the same order, each of a type family its declared type maps to, the
    same text sizes and NULLs, and the declared key as the primary key or a unique constraint."""
    decl = tables.DECLARED[table]
    insp = sa.inspect(store.engine)
    got = insp.get_columns(table)
    names = [c["name"] for c in got if c["name"] != decl.surrogate]
    assert names == list(decl.names), "a column added to the declaration needs its migration (and back)"
    for col in got:
        if col["name"] == decl.surrogate:
            continue
        want = decl.col(col["name"])
        kind, length = _sql_type(col)
        assert want.type in FAMILIES[kind], (col["name"], kind, want.type)
        if want.type == "text":
            assert (length if kind == "VARCHAR" else None) == want.size, (col["name"], length, want.size)
        assert col["nullable"] == want.null, col["name"]
    pk = insp.get_pk_constraint(table)["constrained_columns"]
    uniques = [tuple(u["column_names"]) for u in insp.get_unique_constraints(table)]
    if decl.surrogate:
        assert pk == [decl.surrogate]
        assert (decl.key in uniques) if decl.key else True, (decl.key, uniques)
    else:
        assert tuple(pk) == decl.key


def test_rows_and_parquet_take_the_declaration():
    pairs = [(rows.LOSS_PARTS, tables.LOSS_PARTS), (rows.REQUIRED_RBF, tables.REQUIRED_RBF),
             (rows.POD_METRICS, tables.POD_METRICS), (rows.CONFIG, tables.CONFIG),
             (rows.CHECKPOINTS, tables.CHECKPOINTS), (rows.INCARNATIONS, tables.INCARNATIONS),
             (rows.QUARANTINE, tables.QUARANTINE), (rows.FINDINGS, tables.FINDINGS),
             (rows.RECONNECTS, tables.RECONNECTS)]
    assert all(columns == t.names for columns, t in pairs)
    for t in tables.ROW_TABLES:
        assert rows.COLUMNS[t.name] == t.names
        assert SCHEMAS[t.name].names == [c.parquet_name for c in t.cols if c.name != "run"] + (
            ["parts_text"] if t.name == "loss_parts" else [])
    assert SNAPSHOT_SCHEMAS["stream_gaps"].names == ["stream", "start_ts", "end_ts", "reason", "detected"]
    assert SNAPSHOT_SCHEMAS["stream_gaps"].field("start_ts").type == pa.timestamp("ns", tz="UTC")
    assert SCHEMAS["required_rbf"].field("per_layer").type == pa.list_(pa.float64())


def test_a_bad_type_is_refused_where_it_is_declared():
    with pytest.raises(ValueError, match="unknown type"):
        tables.Col("x", "integer")


def test_the_step_reads_carry_every_declared_column(store, samples):
    """A step as read (`steps --json`, the API's pages, reads.iter_loss_parts/iter_required_rbf)
    is its LOSS-PARTS and REQUIRED_RBF columns as declared, with no list of its own: each read
    row is the table's row as stored (`SELECT *`, but the run), each step's fields the
    declared columns (REQUIRED_RBF's prefixed `rbf_`)."""
    from store_fixtures import ingest_sample

    from steptail.storage import api_reads, reads

    ingest_sample(store, samples, "r", "resume-gap")
    for table, read in ((tables.LOSS_PARTS, reads.iter_loss_parts), (tables.REQUIRED_RBF, reads.iter_required_rbf)):
        with store.engine.connect() as conn:
            stored = conn.execute(sa.text(f"SELECT * FROM {table.name} WHERE run = 'r' ORDER BY incarnation, step")).all()
        got = list(read(store, "r"))
        assert got and len(got) == len(stored)
        assert all(len(row) == len(table.names) - 1 for row in got)
        json_at = [i for i, name in enumerate(table.names[1:]) if table.col(name).type in tables.JSON_TYPES]
        for mine, theirs in zip(got, stored, strict=True):
            theirs = tuple(theirs)[1:]
            assert [v for i, v in enumerate(mine) if i not in json_at] == [v for i, v in enumerate(theirs) if i not in json_at]
            assert all(reads.json_value(theirs[i]) == mine[i] for i in json_at)
    own = [c.name for c in tables.LOSS_PARTS.cols[4:]] + [f"rbf_{c.name}" for c in tables.REQUIRED_RBF.cols[4:]]
    want = ["incarnation", "step", "ts", *own]
    steps = list(reads.iter_steps(store, "r"))
    assert all(list(s) == want for s in steps)
    with store.engine.connect() as conn:
        page = json.loads(api_reads.steps_json(api_reads.step_rows(conn, "r", None, None, 0, 10_000, None)))
    assert [list(s) for s in page] == [want] * len(steps)
