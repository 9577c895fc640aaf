"""Rendered dashboards and alert rules are valid Grafana models: they read back through the
foundation SDK's model types unchanged, and hold together (ids, grid, variables, refs)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models import alerting as am
from grafana_foundation_sdk.models import dashboard as dm

from steptail.dashboards.alerts import FOLDER_UID, RULE_GROUP
from steptail.dashboards.render import dashboards_json, rules_json, to_plain
from steptail.dashboards.sqlquery import (
    DATASOURCE_TYPE,
    DATASOURCE_UID,
    DATASOURCE_VARIABLE,
    SqlDataquery,
)

register_default_plugins()
STEPTAIL = str(Path(sys.executable).parent / "steptail")
BOARDS = dashboards_json()
RULES = rules_json()
_VAR = re.compile(r"\$(?!__)(\w+)|\$\{(\w+)(?::\w+)?\}|\[\[(\w+)(?::\w+)?\]\]")
VARIABLE_REF = {"type": DATASOURCE_TYPE, "uid": f"${{{DATASOURCE_VARIABLE}}}"}


def _without_annotation_targets(board: dict) -> dict:
    board = {k: v for k, v in board.items() if k not in ("__inputs", "__requires")}  # export header
    board = json.loads(json.dumps(board))
    for a in board.get("annotations", {}).get("list", []):
        a.pop("target", None)
    return board


@pytest.mark.parametrize("uid", sorted(BOARDS))
def test_dashboard_reads_back_as_sdk_model(uid):
    board = BOARDS[uid]
    model = dm.Dashboard.from_json(board)
    assert _without_annotation_targets(to_plain(model)) == _without_annotation_targets(board)
    # The SDK types only Grafana's built-in annotation target: ours is a SQL query model.
    for a in board.get("annotations", {}).get("list", []):
        assert to_plain(SqlDataquery.from_json(a["target"])) == a["target"]


@pytest.mark.parametrize("uid", sorted(BOARDS))
def test_dashboard_holds_together(uid):
    board = BOARDS[uid]
    assert board["uid"] == uid and len(uid) <= 40 and board["title"]
    assert board["schemaVersion"] >= 36 and "steptail" in board["tags"]
    panels = board["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells = set()
    for p in panels:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0
        area = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not area & cells, f"panel {p['title']} overlaps another"
        cells |= area
        assert p["datasource"] == VARIABLE_REF
        assert p["targets"] and all(t["datasource"] == VARIABLE_REF for t in p["targets"])
    defined = {v["name"] for v in board["templating"]["list"]}
    texts = [t["rawSql"] for p in panels for t in p["targets"]]
    texts += [v["query"] for v in board["templating"]["list"]]
    texts += [a["target"]["rawSql"] for a in board.get("annotations", {}).get("list", [])]
    for text in texts:
        used = {next(g for g in m.groups() if g) for m in _VAR.finditer(text)}
        assert used <= defined, f"undefined variables {used - defined}"
    for p in panels:
        if p.get("repeat"):
            assert p["repeat"] in defined


def test_run_dashboard_shape():
    run = BOARDS["steptail-run"]
    names = {v["name"]: v for v in run["templating"]["list"]}
    assert names["run"]["multi"] is True and names["namespace"]["includeAll"] is True
    types = [p["type"] for p in run["panels"]]
    assert types[0] == "xychart" and types.count("timeseries") == 3
    xy = run["panels"][0]
    assert xy["transformations"][0]["id"] == "partitionByValues"  # one line per incarnation
    assert run["annotations"]["list"][0]["name"] == "Findings"
    rbf = BOARDS["steptail-rbf"]
    assert {p["type"] for p in rbf["panels"]} == {"xychart", "heatmap"}


@pytest.mark.parametrize("uid", sorted(RULES))
def test_alert_rule_reads_back_and_is_consistent(uid):
    rule = RULES[uid]
    assert to_plain(am.Rule.from_json(rule)) == rule
    assert rule["uid"] == uid and rule["folderUID"] == FOLDER_UID and rule["ruleGroup"] == RULE_GROUP
    refs = {d["refId"]: d for d in rule["data"]}
    assert rule["condition"] in refs
    cond = refs[rule["condition"]]["model"]
    assert cond["type"] == "threshold" and cond["expression"] in refs
    src = refs[cond["expression"]]
    assert src["datasourceUid"] == DATASOURCE_UID and src["model"]["format"] == "table"
    assert src["relativeTimeRange"]["from"] > 0
    assert rule["labels"]["service"] == "steptail"


def test_the_four_required_alerts_exist():
    titles = " ".join(r["title"] for r in RULES.values())
    for word in ("missing steps", "stall", "step-1", "divergence"):
        assert word in titles


def test_render_cli_writes_the_json(tmp_path):
    out = tmp_path / "grafana"
    res = subprocess.run([STEPTAIL, "dashboards", "render", "--out", str(out),
                          "--json"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    written = {Path(p).relative_to(out).as_posix() for p in json.loads(res.stdout)["written"]}
    assert {f"dashboards/{u}.json" for u in BOARDS} | {f"alert-rules/{u}.json" for u in RULES} | {
        f"provisioning/{kind}/steptail.yaml" for kind in ("dashboards", "datasources", "alerting")
    } <= written
    assert written == {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    for uid, board in BOARDS.items():
        assert json.loads((out / "dashboards" / f"{uid}.json").read_text()) == board
    for uid, rule in RULES.items():
        assert json.loads((out / "alert-rules" / f"{uid}.json").read_text()) == rule
    assert not [p for p in out.rglob(".*")]  # no temporary files left behind


def test_render_cli_refuses_a_file_as_out(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    res = subprocess.run([STEPTAIL, "dashboards", "render", "--out", str(f)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "not a directory" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
