"""The few Grafana HTTP API calls `dashboards provision` makes, on aiohttp.

In place of grafana-client, whose HTTP stack (niquests, urllib3-future) replaces `urllib3`
for the whole environment, the kubernetes client's included. Same requests as grafana-client
5 made for these calls: the paths, methods and JSON bodies, `Authorization: Bearer <token>`
when a token is given (no X-Disable-Provenance header: grafana-client sends it only on
request, and provision never asked), TLS verified against the system's trust store
(REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE / SSL_CERT_FILE honoured, as niquests did), proxies and
.netrc from the environment. An error status becomes GrafanaError with grafana-client's
wording; a failure to talk to Grafana at all becomes GrafanaUnreachable, named as niquests
named it (ConnectionError, SSLError, ConnectTimeout, ReadTimeout, TooManyRedirects)."""

from __future__ import annotations

import json
import os
import ssl
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from steptail import __version__


class GrafanaError(Exception):
    """Grafana answered with an error status (or with something that is not its API)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class GrafanaUnreachable(Exception):
    """No usable answer: `kind` names the failure (connection refused, DNS, TLS, timeout)."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


def _error(status: int, payload: Any, text: str) -> GrafanaError:
    """grafana-client's words for an error status (GrafanaClient._extract_from_response)."""
    message = payload["message"] if isinstance(payload, dict) and "message" in payload else text
    if status >= 500:
        return GrafanaError(status, f"Server Error {status}: {message}")
    if status == 400:
        return GrafanaError(status, f"Bad Input: `{payload}`")
    if status == 401:
        return GrafanaError(status, "Unauthorized")
    return GrafanaError(status, f"Client Error {status}: {message}")


def _unreachable(exc: aiohttp.ClientError) -> GrafanaUnreachable:
    if isinstance(exc, aiohttp.ClientSSLError):
        return GrafanaUnreachable("SSLError")
    if isinstance(exc, getattr(aiohttp, "ConnectionTimeoutError", ())):  # aiohttp >= 3.10
        return GrafanaUnreachable("ConnectTimeout")
    if isinstance(exc, aiohttp.ServerTimeoutError):
        return GrafanaUnreachable("ReadTimeout")
    if isinstance(exc, aiohttp.TooManyRedirects):
        return GrafanaUnreachable("TooManyRedirects")
    return GrafanaUnreachable("ConnectionError")


class GrafanaApi:
    """`async with GrafanaApi(...) as api:` one HTTP session; `base` ends in /api."""

    def __init__(self, base: str, token: str | None, timeout_s: float) -> None:
        self.base = base
        self.headers = {"User-Agent": f"steptail/{__version__}"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self.timeout = aiohttp.ClientTimeout(
            total=None, connect=timeout_s, sock_connect=timeout_s, sock_read=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> GrafanaApi:
        bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
        try:
            tls = ssl.create_default_context(cafile=bundle or None)
        except OSError:  # an unreadable bundle: as a TLS failure, one line
            raise GrafanaUnreachable("SSLError") from None
        self._session = aiohttp.ClientSession(
            headers=self.headers, timeout=self.timeout, trust_env=True,
            connector=aiohttp.TCPConnector(ssl=tls, limit=4))
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(self, method: str, path: str, body: dict | None = None) -> Any:
        """The decoded JSON answer (None for 204); GrafanaError on an error status."""
        assert self._session is not None, "use `async with GrafanaApi(...)`"
        try:
            async with self._session.request(method, self.base + path, json=body) as r:
                text = await r.text(errors="replace")
                status, ctype = r.status, r.content_type
        except aiohttp.ClientError as exc:
            raise _unreachable(exc) from None
        except TimeoutError:
            raise GrafanaUnreachable("ReadTimeout") from None
        try:
            payload: Any = json.loads(text)
        except ValueError:
            payload = text  # as grafana-client: the text stands in for an undecodable body
        if status >= 400:
            raise _error(status, payload, text)
        if status == 204:
            return None
        if not isinstance(payload, dict | list):
            where = urlsplit(self.base).path + path
            raise GrafanaError(status, f"{method} {where} answered {ctype}, not Grafana's JSON")
        return payload

    # the calls, as grafana-client's elements made them

    async def get_datasource(self, uid: str) -> dict:
        return await self.request("GET", f"/datasources/uid/{uid}")

    async def create_datasource(self, body: dict) -> dict:
        return await self.request("POST", "/datasources", body)

    async def update_datasource(self, uid: str, body: dict) -> dict:
        return await self.request("PUT", f"/datasources/uid/{uid}", body)

    async def get_folder(self, uid: str) -> dict:
        return await self.request("GET", f"/folders/{uid}")

    async def create_folder(self, title: str, uid: str) -> dict:
        return await self.request("POST", "/folders", {"title": title, "uid": uid})

    async def update_folder(self, uid: str, title: str) -> dict:
        return await self.request("PUT", f"/folders/{uid}", {"title": title, "overwrite": True})

    async def get_dashboard(self, uid: str) -> dict:
        return await self.request("GET", f"/dashboards/uid/{uid}")

    async def update_dashboard(self, body: dict) -> dict:
        """Create or overwrite: POST /api/dashboards/db."""
        return await self.request("POST", "/dashboards/db", body)

    async def get_alert_rule(self, uid: str) -> dict:
        return await self.request("GET", f"/v1/provisioning/alert-rules/{uid}")

    async def create_alert_rule(self, rule: dict) -> dict:
        return await self.request("POST", "/v1/provisioning/alert-rules", rule)

    async def update_alert_rule(self, uid: str, rule: dict) -> dict:
        return await self.request("PUT", f"/v1/provisioning/alert-rules/{uid}", rule)

    async def get_rule_group(self, folder_uid: str, group: str) -> dict:
        return await self.request("GET", f"/v1/provisioning/folder/{folder_uid}/rule-groups/{group}")

    async def update_rule_group(self, folder_uid: str, group: str, body: dict) -> dict:
        return await self.request("PUT", f"/v1/provisioning/folder/{folder_uid}/rule-groups/{group}", body)
