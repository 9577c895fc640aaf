"""Steps as flat columns: one column per loss part and per REQUIRED_RBF layer, for
`steps -o csv`, `steps -o wide` and the Python API's steps frame (steptail.api), which name
the parts alike.

A part's column is its key as logged (`z_loss`, `moe_lb`, `total`, `weights`, ...), in the
order the keys first appear; a key named like a fixed column becomes `parts.<key>`.
REQUIRED_RBF's per-layer values are `rbf_layer_0` ... `rbf_layer_<n-1>` (n: the most layers
of a row). `-o json` and `-o ndjson` keep `parts` and `rbf_per_layer` nested."""

from __future__ import annotations

from collections.abc import Iterable

from steptail.storage import step_columns as sc

# `steps --json`'s fields (storage.step_columns), nested ones spread in place: parts after
# LOSS-PARTS' other fields, layers last.
RECORD_HEAD = (*sc.KEY_FIELDS, *(n for n, c in sc.LOSS_FIELDS if c.type not in sc.JSON_TYPES))
RECORD_TAIL = tuple(n for n, c in sc.RBF_FIELDS if c.type not in sc.JSON_TYPES)
# The steps frame's fixed columns (steptail.api): a loss part must not overwrite one.
STEP_COLUMNS = RECORD_HEAD
LAYER = "rbf_layer_{}"


def part_keys(parts: Iterable[dict]) -> list[str]:
    """Every key of the parts dicts, in the order they first appear."""
    return list(dict.fromkeys(key for p in parts for key in p))


def part_column(key: str, taken: Iterable[str] = STEP_COLUMNS) -> str:
    """The column of part `key`: the key itself, `parts.<key>` when a fixed column has its name."""
    return f"parts.{key}" if key in taken else key


def layer_column(index: int) -> str:
    return LAYER.format(index)


class StepColumns:
    """The flat columns of a list of `steps --json` records (storage.reads.iter_steps)."""

    def __init__(self, records: list[dict]) -> None:
        self.keys = part_keys(r.get("parts") or {} for r in records)
        self.layers = max((len(r.get("rbf_per_layer") or ()) for r in records), default=0)
        layer_names = [layer_column(i) for i in range(self.layers)]
        taken = {*RECORD_HEAD, *RECORD_TAIL, *layer_names}
        self.parts = {key: part_column(key, taken) for key in self.keys}  # key -> column
        self.layer_names = layer_names

    @property
    def names(self) -> list[str]:
        """Every column, in this order: incarnation, step, ts, ce, ce_raw, the parts, rbf_max,
        rbf_program, the layers."""
        return [*RECORD_HEAD, *self.parts.values(), *RECORD_TAIL, *self.layer_names]

    def flat(self, record: dict) -> dict:
        """`record` with every column of `names` (None where the row has no such value)."""
        parts = record.get("parts") or {}
        layers = record.get("rbf_per_layer") or []
        out = {k: record.get(k) for k in RECORD_HEAD}
        out.update((column, parts.get(key)) for key, column in self.parts.items())
        out.update((k, record.get(k)) for k in RECORD_TAIL)
        out.update((name, layers[i] if i < len(layers) else None) for i, name in enumerate(self.layer_names))
        return out
