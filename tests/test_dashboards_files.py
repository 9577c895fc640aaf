"""What `dashboards render` writes for a Grafana that reads files (a ConfigMap mount) or
imports JSON in its UI: the datasource template variable and `__inputs` resolve to the right
datasource both ways (checked with Grafana's own rules, restated below), the provisioning YAML
has Grafana's structure and holds the same alert rules as the API's JSON, no secret is
written, every file is readable by another user, and real kubectl builds ConfigMaps from it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

from steptail.dashboards.alerts import FOLDER_TITLE, FOLDER_UID, GROUP_INTERVAL_S, RULE_GROUP
from steptail.dashboards.provision import bind_inputs, datasource_body
from steptail.dashboards.provisioning_files import DEFAULT_DB_URL, Database
from steptail.dashboards.render import dashboards_json, render, rules_json
from steptail.dashboards.sqlquery import (
    DATASOURCE_INPUT,
    DATASOURCE_NAME,
    DATASOURCE_TYPE,
    DATASOURCE_UID,
    DATASOURCE_VARIABLE,
)

STEPTAIL = str(Path(sys.executable).parent / "steptail")
BOARDS = dashboards_json()
RULES = rules_json()
KINDS = ("dashboards", "datasources", "alerting")
# Grafana's import (pkg/services/dashboardimport/utils: DashTemplateEvaluator)
_INPUT = re.compile(r"\$\{.+?\}")
_VARIABLE_REF = re.compile(r"\$\{(\w+)\}|\$(\w+)")


def _render(tmp_path: Path, *args: str) -> Path:
    out = tmp_path / "grafana"
    res = subprocess.run([STEPTAIL, "dashboards", "render", "--out", str(out), *args],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return out


def _yaml(out: Path, kind: str) -> dict:
    return yaml.safe_load((out / "provisioning" / kind / "steptail.yaml").read_text())


def grafana_import(board: dict, inputs: dict[str, str]) -> dict:
    """Grafana's evaluator: every `${NAME}` of an input in any string becomes its value; the
    other `${...}` stay; `__inputs` goes. An input the request lacks fails the import."""
    values = {f"${{{i['name']}}}": inputs[i["name"]] for i in board["__inputs"]}

    def walk(v):
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items() if k != "__inputs"}
        if isinstance(v, list):
            return [walk(x) for x in v]
        return _INPUT.sub(lambda m: values.get(m[0], m[0]), v) if isinstance(v, str) else v

    return walk(board)


def datasource_refs(value) -> list[dict]:
    if isinstance(value, dict):
        found = [value["datasource"]] if isinstance(value.get("datasource"), dict) else []
        return found + [r for v in value.values() for r in datasource_refs(v)]
    if isinstance(value, list):
        return [r for v in value for r in datasource_refs(v)]
    return []


def queried_uids(board: dict, datasources: list[dict]) -> set[str]:
    """The datasource uid every panel, target, annotation and variable queries, as Grafana
    (scenes) resolves it: `${name}` is the datasource variable; its options are the
    datasources of its plugin type (label: name, value: uid); the current value is matched by
    value first, then by text, else the first option is taken."""
    chosen = {}
    for v in board["templating"]["list"]:
        if v["type"] != "datasource":
            continue
        options = [(d["uid"], d["name"]) for d in datasources if d["type"] == v["query"]]
        cur = v["current"]
        by_value = [u for u, _ in options if u == cur["value"]]
        by_text = [u for u, n in options if n == cur["text"]]
        chosen[v["name"]] = (by_value or by_text or [options[0][0]])[0]
    uids = set()
    for ref in datasource_refs(board["panels"]) + datasource_refs(board["templating"]) + \
            datasource_refs(board["annotations"]):
        m = _VARIABLE_REF.fullmatch(ref["uid"])
        uids.add(chosen[m[1] or m[2]] if m else ref["uid"])
    return uids


# -- the dashboards: a variable, no uid -------------------------------------------------
@pytest.mark.parametrize("uid", sorted(BOARDS))
def test_every_query_goes_through_the_datasource_variable(uid):
    board = BOARDS[uid]
    assert board["schemaVersion"] >= 39  # the Grafana 11/12 line
    first = board["templating"]["list"][0]  # before the query variables that use it
    assert first["type"] == "datasource" and first["name"] == DATASOURCE_VARIABLE
    assert first["query"] == DATASOURCE_TYPE and first["multi"] is False
    assert first["current"] == {"selected": True, "text": DATASOURCE_NAME,
                                "value": f"${{{DATASOURCE_INPUT}}}"}
    refs = datasource_refs(board["panels"]) + datasource_refs(board["annotations"]) + \
        datasource_refs(board["templating"])
    panels_and_targets = len(board["panels"]) + sum(len(p["targets"]) for p in board["panels"])
    assert len(refs) >= panels_and_targets
    assert all(r == {"type": DATASOURCE_TYPE, "uid": f"${{{DATASOURCE_VARIABLE}}}"} for r in refs)
    assert DATASOURCE_UID not in json.dumps(board)  # no hard-coded uid anywhere


@pytest.mark.parametrize("uid", sorted(BOARDS))
def test_inputs_are_grafanas_export_format(uid):
    board = BOARDS[uid]
    assert board["__inputs"] == [{
        "name": DATASOURCE_INPUT, "label": DATASOURCE_NAME, "type": "datasource",
        "description": "the PostgreSQL store steptail writes",
        "pluginId": DATASOURCE_TYPE, "pluginName": "PostgreSQL",
    }]
    required = {(r["type"], r["id"]) for r in board["__requires"]}
    assert ("datasource", DATASOURCE_TYPE) in required and ("grafana", "grafana") in required
    assert {("panel", p["type"]) for p in board["panels"]} <= required
    # every ${...} is an input or a variable: an import leaves nothing unresolved
    variables = {v["name"] for v in board["templating"]["list"]}
    tokens = {m[1] for m in re.finditer(r"\$\{(\w+)", json.dumps(board))}
    assert DATASOURCE_INPUT in tokens and tokens <= variables | {DATASOURCE_INPUT}


OTHER_PG = {"uid": "aaa-other-pg", "name": "Another PostgreSQL", "type": DATASOURCE_TYPE}
LOKI = {"uid": "loki", "name": "Loki", "type": "loki"}


@pytest.mark.parametrize("uid", sorted(BOARDS))
def test_file_provisioning_queries_the_provisioned_datasource(uid, tmp_path):
    out = _render(tmp_path)
    board = json.loads((out / "dashboards" / f"{uid}.json").read_text())  # as mounted: no substitution
    provisioned = _yaml(out, "datasources")["datasources"][0]
    # another PostgreSQL datasource sorts first: the fallback to the first option would be wrong
    assert queried_uids(board, [LOKI, OTHER_PG, provisioned]) == {DATASOURCE_UID}


@pytest.mark.parametrize("uid", sorted(BOARDS))
def test_ui_import_queries_the_chosen_datasource(uid):
    steptail_pg = {"uid": DATASOURCE_UID, "name": DATASOURCE_NAME, "type": DATASOURCE_TYPE}
    imported = grafana_import(BOARDS[uid], {DATASOURCE_INPUT: OTHER_PG["uid"]})
    assert queried_uids(imported, [steptail_pg, OTHER_PG]) == {OTHER_PG["uid"]}
    # the variable still switches every query: nothing was bound to the uid but its default
    assert datasource_refs(imported["panels"]) == datasource_refs(BOARDS[uid]["panels"])
    with pytest.raises(KeyError):
        grafana_import(BOARDS[uid], {})  # Grafana refuses an import without the input


@pytest.mark.parametrize("uid", sorted(BOARDS))
def test_api_provisioning_binds_the_inputs_like_an_import(uid):
    assert bind_inputs(BOARDS[uid]) == grafana_import(BOARDS[uid], {DATASOURCE_INPUT: DATASOURCE_UID})


# -- the provisioning YAML --------------------------------------------------------------
def test_dashboard_provider(tmp_path):
    out = _render(tmp_path, "--dashboards-path", "/etc/dashboards/steptail")
    doc = _yaml(out, "dashboards")
    assert doc["apiVersion"] == 1 and len(doc["providers"]) == 1
    p = doc["providers"][0]
    assert p["type"] == "file" and p["orgId"] == 1 and p["name"]
    assert p["options"]["path"] == "/etc/dashboards/steptail"
    assert p["folder"] == FOLDER_TITLE and "folderUid" not in p  # by title, like the rules
    assert p["allowUiUpdates"] is False and p["updateIntervalSeconds"] > 0
    default = _yaml(_render(tmp_path / "default"), "dashboards")["providers"][0]
    assert default["options"]["path"] == "/var/lib/grafana/dashboards/steptail"


def test_datasource_from_the_url_without_a_secret(tmp_path):
    url = "postgresql://grafana_ro@db.internal:6432/telemetry?sslmode=require"
    out = _render(tmp_path, "--datasource-url", url)
    doc = _yaml(out, "datasources")
    assert doc["apiVersion"] == 1 and len(doc["datasources"]) == 1
    ds = doc["datasources"][0]
    assert ds["uid"] == DATASOURCE_UID and ds["name"] == DATASOURCE_NAME and ds["type"] == DATASOURCE_TYPE
    assert ds["url"] == "db.internal:6432" and ds["user"] == "grafana_ro"
    assert ds["jsonData"]["database"] == "telemetry" and ds["jsonData"]["sslmode"] == "require"
    assert ds["secureJsonData"] == {"password": "$STEPTAIL_DB_PASSWORD"}  # Grafana's env expansion
    assert ds["editable"] is False and ds["orgId"] == 1
    # the same settings `dashboards provision` sends through the API
    api_body, password = datasource_body(sa.make_url(url.replace("grafana_ro@", "grafana_ro:pw@")))
    assert password == "pw" and {k: ds[k] for k in api_body} == api_body
    # the default URL is the default Database
    assert Database.from_url(DEFAULT_DB_URL) == Database()


def test_a_password_in_the_url_is_refused_and_never_written(tmp_path):
    out = tmp_path / "grafana"
    for url, message in (("postgresql://steptail:hunter2-secret@db/steptail", "must not hold a password"),
                         ("sqlite:///x.db", "PostgreSQL")):
        res = subprocess.run([STEPTAIL, "dashboards", "render", "--out", str(out), "--datasource-url", url],
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 2 and message in res.stderr, res.stderr
        assert len(res.stderr.strip().splitlines()) == 1 and "hunter2" not in res.stderr + res.stdout
    assert not out.exists()


def test_no_secret_in_any_rendered_file(tmp_path):
    out = _render(tmp_path)
    texts = "".join(p.read_text() for p in out.rglob("*") if p.is_file())
    assert "password" in texts  # the one place, as a reference to the environment
    for m in re.finditer(r"password\W*:\s*(\S+)", texts):
        assert m[1].strip("'\"") == "$STEPTAIL_DB_PASSWORD"


_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def _duration_s(text: str) -> float:
    """Prometheus' duration format (model.ParseDuration), which Grafana parses these with."""
    parts = _DURATION.findall(text)
    assert parts and "".join(n + u for n, u in parts) == text, text
    return sum(int(n) * _SECONDS[u] for n, u in parts)


def test_alert_rules_file_has_grafanas_structure(tmp_path):
    out = _render(tmp_path)
    doc = _yaml(out, "alerting")
    assert doc["apiVersion"] == 1 and set(doc) == {"apiVersion", "groups"}
    [group] = doc["groups"]
    assert group["orgId"] == 1 and group["name"] == RULE_GROUP and group["folder"] == FOLDER_TITLE
    assert _duration_s(group["interval"]) == GROUP_INTERVAL_S
    # one folder for dashboards and rules: both name it by title
    provider = _yaml(out, "dashboards")["providers"][0]
    assert provider["folder"] == group["folder"]
    for rule in group["rules"]:
        assert {"uid", "title", "condition", "data", "for", "labels", "annotations",
                "noDataState", "execErrState"} <= set(rule)
        assert 0 < len(rule["uid"]) <= 40 and rule["title"]
        assert rule["noDataState"] in {"Alerting", "NoData", "OK", "KeepLast"}
        assert rule["execErrState"] in {"Alerting", "Error", "OK", "KeepLast"}
        _duration_s(rule["for"])
        assert rule["condition"] in {q["refId"] for q in rule["data"]}
        for q in rule["data"]:
            assert q["datasourceUid"] in {DATASOURCE_UID, "__expr__"} and q["model"]["refId"] == q["refId"]
        # Grafana expands $VAR in the file's plain string fields; annotations and query
        # models it reads raw (so `{{ $labels.run }}` and `$__unixEpochNanoFrom()` survive)
        plain = [rule["uid"], rule["title"], rule["condition"], rule["for"], rule["noDataState"],
                 rule["execErrState"], *rule["labels"].values(),
                 *(q[k] for q in rule["data"] for k in ("refId", "datasourceUid"))]
        assert not [s for s in plain if "$" in s]


def test_alert_rules_file_round_trips_the_api_rules(tmp_path):
    out = _render(tmp_path)
    [group] = _yaml(out, "alerting")["groups"]
    assert group["folder"] == FOLDER_TITLE  # the API names the same folder by uid
    back = {r["uid"]: {**r, "folderUID": FOLDER_UID, "ruleGroup": group["name"],
                       "orgID": group["orgId"]} for r in group["rules"]}
    assert back == RULES  # every field of every rule, nothing lost or added
    on_disk = {p.stem: json.loads(p.read_text()) for p in (out / "alert-rules").glob("*.json")}
    assert on_disk == RULES


# -- on disk ----------------------------------------------------------------------------
def test_modes_are_readable_by_grafanas_user_whatever_the_umask(tmp_path):
    out = tmp_path / "grafana"
    old = os.umask(0o077)
    try:
        render(out)
        render(out)  # again over the same tree: modes stay
    finally:
        os.umask(old)
    mine = [out / "dashboards", out / "alert-rules", out / "provisioning"]
    paths = [out] + [p for d in mine for p in [d, *d.rglob("*")]]
    modes = {p.relative_to(out).as_posix(): oct(p.stat().st_mode & 0o777) for p in paths}
    assert {m for p, m in modes.items() if (out / p).is_dir()} == {"0o755"}, modes
    files = {p: m for p, m in modes.items() if (out / p).is_file()}
    assert len(files) == len(BOARDS) + len(RULES) + len(KINDS)
    assert set(files.values()) == {"0o644"}, files
    assert not list(out.rglob(".*"))  # no temporary file left behind


def test_kubectl_builds_the_configmaps(tmp_path):
    """The ConfigMaps a cluster mounts, built by real kubectl from the rendered folders (no
    cluster needed): keys are the file names and the data reads back as written."""
    out = _render(tmp_path)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "none")}
    for name, folder in (("steptail-dashboards", out / "dashboards"),
                         *((f"steptail-grafana-{k}", out / "provisioning" / k) for k in KINDS)):
        res = subprocess.run(["kubectl", "create", "configmap", name, f"--from-file={folder}",
                              "--dry-run=client", "-o", "json"],
                             capture_output=True, text=True, timeout=60, env=env)
        assert res.returncode == 0, res.stderr
        cm = json.loads(res.stdout)
        assert cm["kind"] == "ConfigMap" and cm["metadata"]["name"] == name
        assert cm["data"] == {p.name: p.read_text() for p in folder.iterdir()}
        assert len(res.stdout.encode()) < 1024 * 1024  # a ConfigMap holds at most 1 MiB
    boards = json.loads(subprocess.run(
        ["kubectl", "create", "configmap", "x", f"--from-file={out / 'dashboards'}", "--dry-run=client",
         "-o", "json"], capture_output=True, text=True, timeout=60, env=env).stdout)["data"]
    assert {k: json.loads(v) for k, v in boards.items()} == {f"{u}.json": b for u, b in BOARDS.items()}
