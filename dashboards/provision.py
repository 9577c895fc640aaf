"""Create or update the datasource, folder, dashboards and alert rules in Grafana.

Idempotent: every object is read first and written only when it differs from the code, so
a second run makes no mutating call. Credentials: a bearer token (from a file or the
environment, never argv); the database password goes to the datasource's secureJsonData
and is never printed."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import sqlalchemy as sa

from steptail.dashboards.alerts import FOLDER_TITLE, FOLDER_UID, GROUP_INTERVAL_S, RULE_GROUP
from steptail.dashboards.grafana_api import GrafanaApi, GrafanaError, GrafanaUnreachable
from steptail.dashboards.provisioning_files import Database, datasource_settings
from steptail.dashboards.render import dashboards_json, rules_json
from steptail.dashboards.sqlquery import DATASOURCE_INPUT, DATASOURCE_UID

log = logging.getLogger(__name__)
TIMEOUT_S = 15.0


class ProvisionError(Exception):
    """One line, safe to show."""


def datasource_body(url: sa.URL) -> tuple[dict, str | None]:
    """Grafana datasource JSON for a PostgreSQL URL, and the password (secret, apart)."""
    if url.get_backend_name() != "postgresql":
        raise ProvisionError("Grafana reads the shared PostgreSQL store: pass a postgresql:// --db")
    return datasource_settings(Database.from_url(url)), url.password


def bind_inputs(board: dict, datasource_uid: str = DATASOURCE_UID) -> dict:
    """What Grafana's import does with `__inputs`: `${DS_STEPTAIL}` in any string becomes the
    datasource uid, and `__inputs` goes. /api/dashboards/db substitutes nothing."""
    token = f"${{{DATASOURCE_INPUT}}}"

    def walk(value):
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items() if k != "__inputs"}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value.replace(token, datasource_uid) if isinstance(value, str) else value

    return walk(board)


@dataclass
class Report:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"created": self.created, "updated": self.updated, "unchanged": self.unchanged}


async def _get(call: Awaitable[dict]) -> dict | None:
    """The object, or None when Grafana answers 404."""
    try:
        return await call
    except GrafanaError as exc:
        if exc.status == 404:
            return None
        raise


def _differs(want, have) -> bool:
    """True when something we set has another value in Grafana; keys that Grafana adds on
    its side (ids, versions, defaults filled into query models) are ignored."""
    if isinstance(want, dict) and isinstance(have, dict):
        return any(_differs(v, have.get(k)) for k, v in want.items())
    if isinstance(want, list) and isinstance(have, list):
        return len(want) != len(have) or any(_differs(w, h) for w, h in zip(want, have, strict=True))
    return want != have


class Provisioner:
    def __init__(self, api: GrafanaApi, datasource: tuple[dict, str | None] | None) -> None:
        self.api = api
        self.datasource = datasource
        self.report = Report()

    def run(self) -> Report:
        return asyncio.run(self.run_async())

    async def run_async(self) -> Report:
        try:
            async with self.api:
                if self.datasource is not None:
                    await self._datasource(*self.datasource)
                await self._folder()
                for uid, board in sorted(dashboards_json().items()):
                    await self._dashboard(uid, bind_inputs(board))
                for uid, rule in sorted(rules_json().items()):
                    await self._rule(uid, rule)
                await self._group()
        except GrafanaError as exc:
            raise ProvisionError(f"Grafana refused: {_reason(exc)}") from None
        except GrafanaUnreachable as exc:  # connection refused, DNS, TLS, timeouts
            raise ProvisionError(f"cannot reach Grafana: {exc.kind}") from None
        except OSError as exc:
            raise ProvisionError(f"cannot reach Grafana: {type(exc).__name__}") from None
        return self.report

    async def _datasource(self, body: dict, password: str | None) -> None:
        api = self.api
        have = await _get(api.get_datasource(DATASOURCE_UID))
        name = f"datasource {DATASOURCE_UID}"
        secret = {"secureJsonData": {"password": password}} if password else {}
        if have is None:
            await api.create_datasource(body | secret)
            self.report.created.append(name)
            return
        missing_password = bool(password) and not (have.get("secureJsonFields") or {}).get("password")
        if _differs(body, have) or missing_password:
            await api.update_datasource(DATASOURCE_UID, body | secret)
            self.report.updated.append(name)
        else:
            self.report.unchanged.append(name)

    async def _folder(self) -> None:
        name = f"folder {FOLDER_UID}"
        have = await _get(self.api.get_folder(FOLDER_UID))
        if have is None:
            await self.api.create_folder(FOLDER_TITLE, uid=FOLDER_UID)
            self.report.created.append(name)
        elif have.get("title") != FOLDER_TITLE:
            await self.api.update_folder(FOLDER_UID, title=FOLDER_TITLE)  # overwrite: true
            self.report.updated.append(name)
        else:
            self.report.unchanged.append(name)

    async def _dashboard(self, uid: str, board: dict) -> None:
        name = f"dashboard {uid}"
        have = await _get(self.api.get_dashboard(uid))
        if have is not None:
            in_folder = (have.get("meta") or {}).get("folderUid") == FOLDER_UID
            if in_folder and not _differs(board, have.get("dashboard") or {}):
                self.report.unchanged.append(name)
                return
        await self.api.update_dashboard({
            "dashboard": board, "folderUid": FOLDER_UID, "overwrite": True,
            "message": "steptail dashboards provision",
        })
        (self.report.created if have is None else self.report.updated).append(name)

    async def _rule(self, uid: str, rule: dict) -> None:
        name = f"alert rule {uid}"
        have = await _get(self.api.get_alert_rule(uid))
        if have is None:
            await self.api.create_alert_rule(rule)
            self.report.created.append(name)
        elif _differs(rule, have):
            await self.api.update_alert_rule(uid, rule)
            self.report.updated.append(name)
        else:
            self.report.unchanged.append(name)

    async def _group(self) -> None:
        name = f"rule group {RULE_GROUP}"
        have = await _get(self.api.get_rule_group(FOLDER_UID, RULE_GROUP)) or {}
        if have.get("interval") == GROUP_INTERVAL_S:
            self.report.unchanged.append(name)
            return
        group = {"title": RULE_GROUP, "folderUid": FOLDER_UID, "interval": GROUP_INTERVAL_S,
                 "rules": have.get("rules") or list(rules_json().values())}
        await self.api.update_rule_group(FOLDER_UID, RULE_GROUP, group)
        self.report.updated.append(name)


def _reason(exc: GrafanaError) -> str:
    msg = str(exc.message or exc).strip().splitlines()
    return msg[0][:200] if msg else type(exc).__name__


def connect(url: str, token: str | None) -> GrafanaApi:
    """The client for `url` (http(s)://host[:port][/prefix]; the API is under <prefix>/api).
    Nothing is sent until Provisioner.run."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme not in ("http", "https") or not parts.hostname or port == -1:
        raise ProvisionError(f"bad Grafana URL {url!r} (expected http(s)://host[:port])")
    if parts.password:
        raise ProvisionError("no credentials in --url: use --token-file or $GRAFANA_TOKEN")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    netloc = host if port is None else f"{host}:{port}"  # a user name alone is dropped, as before
    base = f"{parts.scheme}://{netloc}{parts.path.rstrip('/')}/api"
    return GrafanaApi(base, token or None, TIMEOUT_S)


def provision(url: str, token: str | None, db_url: sa.URL | None) -> Report:
    api = connect(url, token)
    return Provisioner(api, datasource_body(db_url) if db_url is not None else None).run()
