"""Dashboards and alert rules as plain JSON (what Grafana's HTTP API takes), and on disk."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from grafana_foundation_sdk.cog.encoder import JSONEncoder

from steptail.dashboards import prometheus
from steptail.dashboards.alerts import all_rules
from steptail.dashboards.boards import all_dashboards, export_format
from steptail.dashboards.provisioning_files import (
    DEFAULT_DASHBOARDS_PATH,
    Database,
    provisioning_files,
)
from steptail.storage.durable import hidden_name


def to_plain(model) -> dict:
    """The SDK model as JSON-ready dicts/lists (through the SDK's own encoder)."""
    return json.loads(json.dumps(model, cls=JSONEncoder))


def dashboards_json() -> dict[str, dict]:
    """Each dashboard in Grafana's export format (`__inputs`: the UI's import asks for the
    datasource)."""
    return {uid: export_format(to_plain(d)) for uid, d in all_dashboards().items()}


def rules_json() -> dict[str, dict]:
    return {r.uid: to_plain(r) for r in all_rules()}


def _write(path: Path, data: dict | str) -> None:
    """JSON (a dict) or text, written then renamed: a reader never sees half a file. 0644, not
    mkstemp's 0600: Grafana (or a ConfigMap built from the folder) reads as another user."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=hidden_name(path, "").name)
    try:
        with os.fdopen(fd, "w") as fh:
            if isinstance(data, str):
                fh.write(data)
            else:
                json.dump(data, fh, indent=2, sort_keys=True)
                fh.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _folder(out: Path, sub: str) -> Path:
    """out/sub and the folders between, 0755 whatever the umask (folders made here only)."""
    folder = out
    for part in Path(sub).parts:
        folder = folder / part
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        folder.chmod(0o755)
    return folder


def render(out: str | Path, db: Database | None = None,
           dashboards_path: str = DEFAULT_DASHBOARDS_PATH) -> list[Path]:
    """Write DIR/dashboards/<uid>.json, DIR/alert-rules/<uid>.json (the API's format),
    DIR/provisioning/{dashboards,datasources,alerting}/steptail.yaml and DIR/prometheus/*.yaml
    (steptail.rules.yaml, prometheusrule.yaml); returns the paths.
    db: where the provisioned datasource connects; dashboards_path: where Grafana sees
    DIR/dashboards (the dashboard provider's options.path)."""
    out = Path(out)
    if not out.is_dir():
        out.mkdir(parents=True)
        out.chmod(0o755)
    written = []
    rules = rules_json()
    for sub, items in (("dashboards", dashboards_json()), ("alert-rules", rules)):
        folder = _folder(out, sub)
        for uid, data in sorted(items.items()):
            path = folder / f"{uid}.json"
            _write(path, data)
            written.append(path)
    # DIR/provisioning/…, and DIR/prometheus/: the rules file and the PrometheusRule
    texts = {**provisioning_files(rules, db or Database(), dashboards_path), **prometheus.rule_files()}
    for rel, text in texts.items():
        path = _folder(out, str(Path(rel).parent)) / Path(rel).name
        _write(path, text)
        written.append(path)
    return written
