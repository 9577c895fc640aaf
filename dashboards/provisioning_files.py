"""Grafana's file-provisioning YAML (apiVersion 1), written beside the dashboard JSON so that
mounting ConfigMaps is all a cluster needs: a dashboard provider, the PostgreSQL datasource
and the alert rules. Nothing secret is written: the datasource's password is
`$STEPTAIL_DB_PASSWORD`, which Grafana expands from its own environment when it reads the file."""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
import yaml

from steptail.dashboards.alerts import FOLDER_TITLE, GROUP_INTERVAL_S, RULE_GROUP
from steptail.dashboards.sqlquery import DATASOURCE_NAME, DATASOURCE_TYPE, DATASOURCE_UID

# Where Grafana sees DIR/dashboards (the ConfigMap's mountPath): the provider's options.path.
DEFAULT_DASHBOARDS_PATH = "/var/lib/grafana/dashboards/steptail"
DEFAULT_DB_URL = "postgresql://steptail@postgresql:5432/steptail"
PASSWORD_ENV = "STEPTAIL_DB_PASSWORD"
PROVIDER_NAME = "steptail"
ORG_ID = 1
# Keys of a rule and of a rule query in the file format (Grafana's AlertRuleV1, QueryV1).
_RULE_KEYS = ("uid", "title", "condition", "data", "for", "labels", "annotations",
              "noDataState", "execErrState", "isPaused")
_QUERY_KEYS = ("refId", "queryType", "relativeTimeRange", "datasourceUid", "model")


class SettingsError(ValueError):
    """One line, safe to show."""


@dataclass(frozen=True)
class Database:
    """Where Grafana's datasource connects; never a password."""

    host: str = "postgresql"
    port: int = 5432
    user: str = "steptail"
    name: str = "steptail"
    sslmode: str = "disable"

    @classmethod
    def from_url(cls, url: str | sa.URL) -> Database:
        """postgresql://USER@HOST[:PORT]/DB[?sslmode=MODE]; a password in it is not kept."""
        try:
            url = sa.make_url(url) if isinstance(url, str) else url
        except sa.exc.ArgumentError:
            raise SettingsError(f"not a database URL: {url!r}") from None
        if url.get_backend_name() != "postgresql":
            raise SettingsError("Grafana reads the shared PostgreSQL store: pass a postgresql:// URL")
        return cls(host=url.host or "localhost", port=url.port or 5432, user=url.username or "",
                   name=url.database or "", sslmode=str(url.query.get("sslmode", "disable")))


def datasource_settings(db: Database) -> dict:
    """The datasource as Grafana's API and its provisioning files both take it."""
    return {
        "uid": DATASOURCE_UID,
        "name": DATASOURCE_NAME,
        "type": DATASOURCE_TYPE,
        "access": "proxy",
        "url": f"{db.host}:{db.port}",
        "user": db.user,
        "isDefault": False,
        "jsonData": {
            "database": db.name,
            "sslmode": db.sslmode,
            "postgresVersion": 1500,
            "timescaledb": False,
            "maxOpenConns": 10,
        },
    }


def datasource_file(db: Database) -> dict:
    source = datasource_settings(db) | {
        "orgId": ORG_ID,
        "editable": False,
        # Grafana's env interpolation: the secret stays in the pod's environment (a Secret).
        "secureJsonData": {"password": f"${PASSWORD_ENV}"},
    }
    return {"apiVersion": 1, "datasources": [source]}


def dashboard_provider_file(path: str = DEFAULT_DASHBOARDS_PATH) -> dict:
    return {"apiVersion": 1, "providers": [{
        "name": PROVIDER_NAME,
        "orgId": ORG_ID,
        "type": "file",
        # By title, as the alert rules name it: Grafana provisions alerting first and makes
        # the folder; a folderUid here would then ask for a second folder of the same title.
        "folder": FOLDER_TITLE,
        "disableDeletion": False,
        "allowUiUpdates": False,  # the files are the source: UI edits would be overwritten
        "updateIntervalSeconds": 60,
        "options": {"path": path, "foldersFromFilesStructure": False},
    }]}


def file_rule(rule: dict) -> dict:
    """One rule of the API's JSON (rules_json) in the file format."""
    out = {k: rule[k] for k in _RULE_KEYS if k in rule}
    out["data"] = [{k: q[k] for k in _QUERY_KEYS if k in q} for q in rule["data"]]
    return out


def alert_rules_file(rules: dict[str, dict]) -> dict:
    """The rules as one group; the folder is named by title (Grafana makes it if missing)."""
    return {"apiVersion": 1, "groups": [{
        "orgId": ORG_ID,
        "name": RULE_GROUP,
        "folder": FOLDER_TITLE,
        "interval": f"{GROUP_INTERVAL_S}s",
        "rules": [file_rule(r) for _, r in sorted(rules.items())],
    }]}


class _Dumper(yaml.SafeDumper):
    """SQL and other multi-line strings as literal blocks: the files stay readable."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(doc: dict, header: str) -> str:
    body = yaml.dump(doc, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)
    return "".join(f"# {line}\n" for line in header.splitlines()) + body


def provisioning_files(rules: dict[str, dict], db: Database,
                       dashboards_path: str = DEFAULT_DASHBOARDS_PATH) -> dict[str, str]:
    """{relative path: YAML text}, laid out like /etc/grafana/provisioning."""
    made = "Written by `steptail dashboards render`; Grafana reads it from"
    return {
        "provisioning/dashboards/steptail.yaml": to_yaml(
            dashboard_provider_file(dashboards_path),
            f"{made} /etc/grafana/provisioning/dashboards/.\n"
            f"options.path is where dashboards/*.json are mounted ({dashboards_path})."),
        "provisioning/datasources/steptail.yaml": to_yaml(
            datasource_file(db),
            f"{made} /etc/grafana/provisioning/datasources/.\n"
            f"The password comes from ${PASSWORD_ENV} in Grafana's environment."),
        "provisioning/alerting/steptail.yaml": to_yaml(
            alert_rules_file(rules), f"{made} /etc/grafana/provisioning/alerting/."),
    }
