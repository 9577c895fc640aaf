"""Dashboards and alert rules as plain JSON (what Grafana's HTTP API takes), and on disk."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from grafana_foundation_sdk.cog.encoder import JSONEncoder

from steptail.dashboards import prometheus
from steptail.dashboards.alerts import all_rules
from steptail.dashboards.boards import all_dashboards


def to_plain(model) -> dict:
    """The SDK model as JSON-ready dicts/lists (through the SDK's own encoder)."""
    return json.loads(json.dumps(model, cls=JSONEncoder))


def dashboards_json() -> dict[str, dict]:
    return {uid: to_plain(d) for uid, d in all_dashboards().items()}


def rules_json() -> dict[str, dict]:
    return {r.uid: to_plain(r) for r in all_rules()}


def _write(path: Path, data: dict) -> None:
    # Write-then-rename: a reader never sees half a file.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=2, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, path)


def render(out: str | Path) -> list[Path]:
    """Write DIR/dashboards/<uid>.json and DIR/alert-rules/<uid>.json; returns the paths."""
    out = Path(out)
    written = []
    for sub, items in (("dashboards", dashboards_json()), ("alert-rules", rules_json())):
        folder = out / sub
        folder.mkdir(parents=True, exist_ok=True)
        for uid, data in sorted(items.items()):
            path = folder / f"{uid}.json"
            _write(path, data)
            written.append(path)
    written += prometheus.render(out)  # DIR/prometheus/: the rules file and the PrometheusRule
    return written
