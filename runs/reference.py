"""The HF reference CE for the step-1 gate: a number, or a JSON / CSV file of step -> ce from
an HF forward of the same batch.

Accepted files: JSON `{"1": 3.39, ...}`, `[{"step": 1, "ce": 3.39}, ...]` or
`{"step": 1, "ce": 3.39}`; CSV with a `step,ce` header (other columns ignored) or bare
`step,ce` pairs. A directory holds one such file per run, `<run>.json` or `<run>.csv`
(for `follow --all`, whose runs each have their own batch)."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path


class ReferenceError(ValueError):
    """One line, safe to show."""


class Reference(dict):
    """step -> ce, and where it came from (`source`: the file read, or the value given on the
    command line), stored with the run so a later evaluation without one uses it."""

    def __init__(self, ce: dict[int, float], source: str) -> None:
        super().__init__(ce)
        self.source = source


def _number(value, where: str) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ReferenceError(f"{where}: {value!r} is not a number") from None
    if not math.isfinite(x):
        raise ReferenceError(f"{where}: reference CE must be finite, got {value!r}")
    return x


def _step(value, where: str) -> int:
    try:
        return int(str(value).strip())
    except ValueError:
        raise ReferenceError(f"{where}: step {value!r} is not an integer") from None


def _from_json(data, name: str) -> dict[int, float]:
    if isinstance(data, dict) and "step" in data and "ce" in data:
        data = [data]
    if isinstance(data, dict):
        return {_step(k, name): _number(v, f"{name} step {k}") for k, v in data.items()}
    if isinstance(data, list):
        out = {}
        for i, item in enumerate(data):
            if not isinstance(item, dict) or "step" not in item or "ce" not in item:
                raise ReferenceError(f"{name}: item {i} is not an object with step and ce")
            out[_step(item["step"], name)] = _number(item["ce"], f"{name} step {item['step']}")
        return out
    raise ReferenceError(f"{name}: expected an object of step -> ce or a list of {{step, ce}}")


def _from_csv(text: str, name: str) -> dict[int, float]:
    rows = [r for r in csv.reader(io.StringIO(text)) if r and any(c.strip() for c in r)]
    if not rows:
        return {}
    head = [c.strip().lower() for c in rows[0]]
    header = "step" in head and "ce" in head
    i, j = (head.index("step"), head.index("ce")) if header else (0, 1)
    out = {}
    for n, r in enumerate(rows[1:] if header else rows, 2 if header else 1):
        if len(r) <= max(i, j):
            raise ReferenceError(f"{name} line {n}: expected step and ce")
        out[_step(r[i], f"{name} line {n}")] = _number(r[j], f"{name} line {n}")
    return out


def load_reference(value: str | None) -> dict[int, float] | Path | None:
    """`--reference-ce`: a number (step 1), a path to a JSON/CSV file, or a directory of
    per-run files (returned as is: reference_for reads a run's file when it is needed)."""
    if value is None:
        return None
    try:
        return Reference({1: _number(value, "--reference-ce")}, f"--reference-ce {value.strip()}")
    except ReferenceError:
        pass
    path = Path(value)
    if path.is_dir():
        return path
    if not path.is_file():
        raise ReferenceError(f"--reference-ce {value!r} is neither a number nor a readable file or directory")
    return _read(path)


def reference_for(reference: dict[int, float] | Path | None, run: str) -> dict[int, float] | None:
    """The reference of one run: the one given, or from a directory `<run>.json` / `<run>.csv`
    (None when the directory has neither: the gate then reports the missing reference)."""
    if not isinstance(reference, Path):
        return reference
    for suffix in (".json", ".csv"):
        path = reference / f"{run}{suffix}"
        if path.is_file():
            return _read(path)
    return None


def _read(path: Path) -> Reference:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ReferenceError(f"cannot read {path}: {exc}") from None
    if text.lstrip()[:1] in ("{", "["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ReferenceError(f"{path}: bad JSON ({exc.msg} at line {exc.lineno})") from None
        ref = _from_json(data, path.name)
    else:
        ref = _from_csv(text, path.name)
    if not ref:
        raise ReferenceError(f"{path}: no step -> ce pairs")
    return Reference(ref, str(path.resolve()))
