"""A step as the reads return it (`steps --json`, the HTTP API's steps, reads.iter_steps): its
LOSS-PARTS row and the REQUIRED_RBF row of the same step, joined on the key, derived from the
two tables' declarations (runs/tables.py). A column declared there is a field here, in the
select lists and in the JSON, with no list to edit (REQUIRED_RBF's fields prefixed `rbf_`)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from steptail.runs.tables import JSON_TYPES, LOSS_PARTS, REQUIRED_RBF, Col

# What both rows share: the run and the step's key, and the kubelet stamp (REQUIRED_RBF's is
# shown when the step has no LOSS-PARTS row)
SHARED = ("run", "incarnation", "step", "ts_ns")
KEY_FIELDS = ("incarnation", "step", "ts")
assert LOSS_PARTS.names[:4] == REQUIRED_RBF.names[:4] == SHARED  # a row is its key, then its own columns

LOSS_COLS: tuple[Col, ...] = tuple(c for c in LOSS_PARTS.cols if c.name not in SHARED)
RBF_COLS: tuple[Col, ...] = tuple(c for c in REQUIRED_RBF.cols if c.name not in SHARED)
# each table's own fields of a step, in order: (its name, its column)
LOSS_FIELDS: tuple[tuple[str, Col], ...] = tuple((c.name, c) for c in LOSS_COLS)
RBF_FIELDS: tuple[tuple[str, Col], ...] = tuple((f"rbf_{c.name}", c) for c in RBF_COLS)
FIELDS = (*LOSS_FIELDS, *RBF_FIELDS)
KEYS: tuple[str, ...] = (*KEY_FIELDS, *(name for name, _ in FIELDS))
# one name, one column: a select list's column is known by its name alone (api_reads)
assert not {c.name for c in LOSS_COLS} & {c.name for c in RBF_COLS}


def absent(col: Col):
    """A field of a step that has no such row: a map of parts is empty (a new one each time:
    a caller may fill it), anything else unknown."""
    return {} if col.type == "float_map" else None


def columns(cols: tuple[Col, ...], alias: str = "", json_text: bool = False) -> str:
    """`cols` as a select list (`l.ce, l.parts`); the JSON ones as the store's text when
    `json_text` (a JSONB value is an object on PostgreSQL)."""
    prefix = f"{alias}." if alias else ""
    return ", ".join(f"CAST({prefix}{c.name} AS TEXT)" if json_text and c.type in JSON_TYPES else f"{prefix}{c.name}"
                     for c in cols)


def nulls(cols: tuple[Col, ...]) -> str:
    """A NULL per column: the other table's half of a row that has only one."""
    return ", ".join("NULL" for _ in cols)


def own(values: Sequence, fields: tuple[tuple[str, Col], ...]) -> dict:
    """A row's own columns (`values`, in `fields`' order) as a step's fields: JSON decoded (a
    store or a batch may hold its text), `absent` for NULL."""
    return {name: absent(col) if v is None else json_value(v) if col.type in JSON_TYPES else v
            for (name, col), v in zip(fields, values, strict=True)}


def json_value(value):
    """A JSON column's value: SQLite (and a batch) hands back the text, PostgreSQL (JSONB) objects."""
    return json.loads(value) if isinstance(value, str) else value
