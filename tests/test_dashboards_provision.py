"""Contract test of `dashboards provision` against a local HTTP server that mimics the Grafana
API endpoints it uses and records every call: endpoints, methods, payloads; a second run
makes no mutating call; drift is repaired with exactly the calls needed."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from aiohttp import web

from steptail.dashboards.provision import ProvisionError, bind_inputs, provision
from steptail.dashboards.render import dashboards_json, rules_json

TOKEN = "glsa_test-token-0123456789"
PASSWORD = "pg-s3cret-pw"
DB_URL = sa.make_url(f"postgresql+psycopg://steptail:{PASSWORD}@db.internal:5433/telemetry")
STEPTAIL = str(Path(sys.executable).parent / "steptail")
MUTATING = {"POST", "PUT", "PATCH", "DELETE"}
BODY = web.RequestKey("body", object)


class FakeGrafana:
    """Just enough of Grafana's HTTP API; stores what it is sent, adds what Grafana adds."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict | None]] = []
        self.auth: list[str | None] = []
        self.datasources: dict[str, dict] = {}
        self.folders: dict[str, dict] = {}
        self.dashboards: dict[str, dict] = {}
        self.rules: dict[str, dict] = {}
        self.group_interval: dict[tuple[str, str], int] = {}
        self.next_id = 1

    def mutations(self) -> list[tuple[str, str, dict | None]]:
        return [c for c in self.calls if c[0] in MUTATING]

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._record])
        r = app.router
        r.add_get("/api/datasources/uid/{uid}", self.get_ds)
        r.add_post("/api/datasources", self.post_ds)
        r.add_put("/api/datasources/uid/{uid}", self.put_ds)
        r.add_get("/api/folders/{uid}", self.get_folder)
        r.add_post("/api/folders", self.post_folder)
        r.add_put("/api/folders/{uid}", self.put_folder)
        r.add_get("/api/dashboards/uid/{uid}", self.get_dash)
        r.add_post("/api/dashboards/db", self.post_dash)
        r.add_get("/api/v1/provisioning/alert-rules/{uid}", self.get_rule)
        r.add_post("/api/v1/provisioning/alert-rules", self.post_rule)
        r.add_put("/api/v1/provisioning/alert-rules/{uid}", self.put_rule)
        r.add_get("/api/v1/provisioning/folder/{folder}/rule-groups/{group}", self.get_group)
        r.add_put("/api/v1/provisioning/folder/{folder}/rule-groups/{group}", self.put_group)
        return app

    @web.middleware
    async def _record(self, request: web.Request, handler):
        body = await request.json() if request.can_read_body else None
        self.calls.append((request.method, request.path, body))
        self.auth.append(request.headers.get("Authorization"))
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.json_response({"message": "invalid API key"}, status=401)
        request[BODY] = body
        return await handler(request)

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id

    @staticmethod
    def _404():
        return web.json_response({"message": "not found"}, status=404)

    # datasources: secrets are write-only (GET shows secureJsonFields instead)
    def _store_ds(self, body: dict, old: dict | None) -> dict:
        body = dict(body)
        secret = body.pop("secureJsonData", None) or {}
        fields = dict((old or {}).get("secureJsonFields", {}))
        fields.update({k: True for k in secret})
        ds = {**body, "id": (old or {}).get("id") or self._id(), "orgId": 1, "readOnly": False,
              "secureJsonFields": fields, "_secret": {**(old or {}).get("_secret", {}), **secret}}
        self.datasources[body["uid"]] = ds
        return ds

    async def get_ds(self, req):
        ds = self.datasources.get(req.match_info["uid"])
        return self._404() if ds is None else web.json_response({k: v for k, v in ds.items() if k != "_secret"})

    async def post_ds(self, req):
        ds = self._store_ds(req[BODY], None)
        return web.json_response({"id": ds["id"], "message": "Datasource added"})

    async def put_ds(self, req):
        old = self.datasources.get(req.match_info["uid"])
        if old is None:
            return self._404()
        self._store_ds(req[BODY], old)
        return web.json_response({"message": "Datasource updated"})

    async def get_folder(self, req):
        f = self.folders.get(req.match_info["uid"])
        return self._404() if f is None else web.json_response(f)

    async def post_folder(self, req):
        b = req[BODY]
        self.folders[b["uid"]] = {"uid": b["uid"], "title": b["title"], "id": self._id(), "version": 1}
        return web.json_response(self.folders[b["uid"]])

    async def put_folder(self, req):
        f = self.folders[req.match_info["uid"]]
        f["title"] = req[BODY]["title"]
        f["version"] += 1
        return web.json_response(f)

    async def get_dash(self, req):
        d = self.dashboards.get(req.match_info["uid"])
        return self._404() if d is None else web.json_response(d)

    async def post_dash(self, req):
        b = req[BODY]
        uid = b["dashboard"]["uid"]
        if b.get("folderUid") not in self.folders:
            return web.json_response({"message": "folder not found"}, status=400)
        old = self.dashboards.get(uid)
        version = old["dashboard"]["version"] + 1 if old else 1
        self.dashboards[uid] = {
            "dashboard": {**b["dashboard"], "id": self._id(), "version": version},
            "meta": {"folderUid": b["folderUid"], "slug": uid, "provisioned": False},
        }
        return web.json_response({"status": "success", "uid": uid, "version": version})

    def _store_rule(self, body: dict) -> dict:
        rule = json.loads(json.dumps(body))
        for d in rule["data"]:  # Grafana fills defaults into every query model
            d["model"].setdefault("intervalMs", 1000)
            d["model"].setdefault("maxDataPoints", 43200)
        rule |= {"id": self._id(), "updated": "2026-11-30T05:00:00Z", "provenance": "api"}
        self.rules[rule["uid"]] = rule
        self.group_interval.setdefault((rule["folderUID"], rule["ruleGroup"]), 10)
        return rule

    async def get_rule(self, req):
        r = self.rules.get(req.match_info["uid"])
        return self._404() if r is None else web.json_response(r)

    async def post_rule(self, req):
        if req[BODY]["folderUID"] not in self.folders:
            return web.json_response({"message": "folder not found"}, status=400)
        return web.json_response(self._store_rule(req[BODY]), status=201)

    async def put_rule(self, req):
        if req.match_info["uid"] not in self.rules:
            return self._404()
        return web.json_response(self._store_rule(req[BODY]))

    async def get_group(self, req):
        key = (req.match_info["folder"], req.match_info["group"])
        rules = [r for r in self.rules.values() if (r["folderUID"], r["ruleGroup"]) == key]
        if not rules:
            return self._404()
        return web.json_response({"title": key[1], "folderUid": key[0],
                                  "interval": self.group_interval[key], "rules": rules})

    async def put_group(self, req):
        key = (req.match_info["folder"], req.match_info["group"])
        self.group_interval[key] = req[BODY]["interval"]
        return web.json_response(req[BODY])


@pytest.fixture
async def grafana():
    fake = FakeGrafana()
    runner = web.AppRunner(fake.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    yield fake, f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def _provision(url, token=TOKEN, db=DB_URL):
    return await asyncio.wait_for(asyncio.to_thread(provision, url, token, db), 60)


async def test_first_run_creates_everything(grafana):
    fake, url = grafana
    report = await _provision(url)
    calls = [(m, p) for m, p, _ in fake.mutations()]
    boards, rules = dashboards_json(), rules_json()
    assert calls == (
        [("POST", "/api/datasources"), ("POST", "/api/folders")]
        + [("POST", "/api/dashboards/db")] * len(boards)
        + [("POST", "/api/v1/provisioning/alert-rules")] * len(rules)
        + [("PUT", "/api/v1/provisioning/folder/steptail/rule-groups/steptail")]
    )
    assert all(a == f"Bearer {TOKEN}" for a in fake.auth)
    ds = fake.mutations()[0][2]
    assert ds["uid"] == "steptail-pg" and ds["type"] == "grafana-postgresql-datasource"
    assert ds["url"] == "db.internal:5433" and ds["user"] == "steptail"
    assert ds["jsonData"]["database"] == "telemetry"
    assert ds["secureJsonData"] == {"password": PASSWORD}
    assert fake.mutations()[1][2] == {"uid": "steptail", "title": "steptail"}
    posted = {b["dashboard"]["uid"]: b for m, p, b in fake.mutations() if p == "/api/dashboards/db"}
    # as a UI import would bind them: ${DS_STEPTAIL} -> the datasource just provisioned
    assert {u: b["dashboard"] for u, b in posted.items()} == {u: bind_inputs(b) for u, b in boards.items()}
    for b in posted.values():
        text = json.dumps(b["dashboard"])
        assert "__inputs" not in text and "${DS_STEPTAIL}" not in text
        ds_var = b["dashboard"]["templating"]["list"][0]
        assert ds_var["type"] == "datasource" and ds_var["current"]["value"] == "steptail-pg"
    assert all(b["folderUid"] == "steptail" and b["overwrite"] for b in posted.values())
    sent_rules = [b for m, p, b in fake.mutations() if p == "/api/v1/provisioning/alert-rules"]
    assert {r["uid"]: r for r in sent_rules} == rules
    assert fake.mutations()[-1][2]["interval"] == 60
    assert len(report.created) == 2 + len(boards) + len(rules) and report.updated == ["rule group steptail"]


async def test_second_run_changes_nothing(grafana):
    fake, url = grafana
    await _provision(url)
    before = len(fake.calls)
    report = await _provision(url)
    second = fake.calls[before:]
    assert second and all(m == "GET" for m, _, _ in second)
    assert report.created == [] and report.updated == []
    assert len(report.unchanged) == 3 + len(dashboards_json()) + len(rules_json())


async def test_drift_is_repaired_with_only_the_needed_calls(grafana):
    fake, url = grafana
    await _provision(url)
    fake.dashboards["steptail-fleet"]["dashboard"]["title"] = "edited by hand"
    fake.rules["steptail-stall"]["for"] = "1h"
    fake.datasources["steptail-pg"]["url"] = "elsewhere:5432"
    before = len(fake.calls)
    report = await _provision(url)
    changed = [(m, p) for m, p, _ in fake.calls[before:] if m in MUTATING]
    assert changed == [
        ("PUT", "/api/datasources/uid/steptail-pg"),
        ("POST", "/api/dashboards/db"),
        ("PUT", "/api/v1/provisioning/alert-rules/steptail-stall"),
    ]
    assert fake.dashboards["steptail-fleet"]["dashboard"]["title"] == dashboards_json()["steptail-fleet"]["title"]
    assert fake.rules["steptail-stall"]["for"] == rules_json()["steptail-stall"]["for"]
    assert len(report.updated) == 3


async def test_without_db_the_datasource_is_left_alone(grafana):
    fake, url = grafana
    await _provision(url, db=None)
    assert not [p for _, p, _ in fake.calls if "datasources" in p]


async def test_wrong_token_is_a_one_line_error_without_the_token(grafana):
    fake, url = grafana
    with pytest.raises(ProvisionError) as err:
        await _provision(url, token="wrong-token")
    assert "wrong-token" not in str(err.value) and "\n" not in str(err.value)
    assert not fake.mutations()


def test_non_postgresql_store_is_refused():
    with pytest.raises(ProvisionError, match="PostgreSQL"):
        provision("http://127.0.0.1:9", TOKEN, sa.make_url("sqlite:///x.db"))


async def _cli(args, env_extra, tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **env_extra}
    proc = await asyncio.create_subprocess_exec(
        STEPTAIL, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, out.decode(), err.decode()


async def test_cli_token_from_file_and_env_never_printed(grafana, tmp_path):
    fake, url = grafana
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    db_env = {"STEPTAIL_DB": DB_URL.render_as_string(hide_password=False)}
    code, out, err = await _cli(["dashboards", "provision", "--url", url, "--token-file", str(token_file),
                                 "--json"], db_env, tmp_path)
    assert code == 0, err
    assert TOKEN not in out + err and PASSWORD not in out + err
    assert json.loads(out)["created"]
    code, out, err = await _cli(["dashboards", "provision", "--url", url],
                                db_env | {"GRAFANA_TOKEN": TOKEN}, tmp_path)
    assert code == 0, err
    assert "created" not in out and "updated" not in out and "unchanged" in out
    assert TOKEN not in out + err and PASSWORD not in out + err


async def test_cli_errors_are_one_line_exit_2(grafana, tmp_path):
    fake, url = grafana
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    cases = [
        (["--url", closed, "--skip-datasource"], {"GRAFANA_TOKEN": TOKEN}, "cannot reach Grafana"),
        (["--url", "http://admin:pw@127.0.0.1:1"], {}, "no credentials in --url"),
        (["--url", url, "--token-file", str(tmp_path / "missing")], {}, "cannot read token file"),
        (["--url", url, "--skip-datasource"], {"GRAFANA_TOKEN": "bad"}, "Grafana refused"),
    ]
    for args, env, message in cases:
        code, out, err = await _cli(["dashboards", "provision", *args], env, tmp_path)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, (args, err)
    assert not fake.mutations()


# ---- the HTTP client (dashboards/grafana_api.py): what grafana-client did, on aiohttp ----


@pytest.fixture
async def stub():
    """start(handler, tls=None) -> base URL of a server answering every path with `handler`;
    the requests it got are in the returned list."""
    runners, seen = [], []

    async def start(handler, tls=None):
        async def record(request):
            seen.append((request.method, request.path, request.headers.get("Authorization")))
            return await handler(request)

        app = web.Application()
        app.router.add_route("*", "/{path:.*}", record)
        runner = web.AppRunner(app)
        await runner.setup()
        runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        return f"{'https' if tls else 'http'}://127.0.0.1:{port}"

    yield start, seen
    for runner in runners:
        await runner.cleanup()


def _answer(status, body="", content_type="application/json"):
    async def handler(request):
        return web.Response(status=status, text=body, content_type=content_type)
    return handler


async def _refusal(url, token=TOKEN) -> str:
    with pytest.raises(ProvisionError) as err:
        await _provision(url, token=token, db=None)
    message = str(err.value)
    assert "\n" not in message and TOKEN not in message
    return message


async def test_without_token_no_authorization_header(grafana):
    fake, url = grafana
    assert await _refusal(url, token=None) == "Grafana refused: Unauthorized"
    assert fake.auth == [None] and not fake.mutations()


@pytest.mark.parametrize("status, body, content_type, message", [
    (400, '{"message": "bad folder"}', "application/json", "Bad Input: `{'message': 'bad folder'}`"),
    (403, '{"message": "no access\\nto this folder"}', "application/json", "Client Error 403: no access"),
    (404, '{"message": "not found"}', "application/json", None),  # GET 404: the create follows
    (502, "<html>bad gateway</html>", "text/html", "Server Error 502: <html>bad gateway</html>"),
    (200, "<html>log in</html>", "text/html", "GET /api/folders/steptail answered text/html, not Grafana's JSON"),
])
async def test_refusals_are_grafana_client_worded(stub, status, body, content_type, message):
    start, seen = stub
    url = await start(_answer(status, body, content_type))
    got = await _refusal(url)
    if message is None:  # 404 on GET -> create -> 404 again: the POST's refusal
        assert seen[:2] == [("GET", "/api/folders/steptail", f"Bearer {TOKEN}"),
                            ("POST", "/api/folders", f"Bearer {TOKEN}")]
        message = "Client Error 404: not found"
    assert got == f"Grafana refused: {message}"


async def test_connection_refused():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    assert await _refusal(closed) == "cannot reach Grafana: ConnectionError"


async def test_no_answer_within_the_timeout(stub, monkeypatch):
    import steptail.dashboards.provision as provision_module

    async def silent(request):
        await asyncio.sleep(5)
        return web.json_response({})

    start, _ = stub
    url = await start(silent)
    monkeypatch.setattr(provision_module, "TIMEOUT_S", 0.3)
    assert await _refusal(url) == "cannot reach Grafana: ReadTimeout"


async def test_https_verifies_the_certificate(stub, tmp_path, monkeypatch):
    import ssl

    from steptail.simcluster.kube import make_tls

    ca, cert, key = make_tls(tmp_path, "127.0.0.1")
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    start, seen = stub
    url = await start(_answer(401, '{"message": "invalid API key"}'), tls=tls)
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    assert await _refusal(url) == "cannot reach Grafana: SSLError"
    assert seen == []  # nothing was sent, the token included
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(ca))  # a trusted CA (as niquests honoured it)
    assert await _refusal(url) == "Grafana refused: Unauthorized"
    assert seen == [("GET", "/api/folders/steptail", f"Bearer {TOKEN}")]


async def test_url_path_prefix_and_bad_urls(stub):
    start, seen = stub
    url = await start(_answer(401))
    await _refusal(url + "/grafana/")
    await _refusal(url.replace("://", "://someone@") + "/grafana")  # a user name alone is dropped
    assert [p for _, p, _ in seen] == ["/grafana/api/folders/steptail"] * 2
    for bad in ["ftp://grafana.example", "http://grafana.example:99999", "http://:3000"]:
        with pytest.raises(ProvisionError, match="bad Grafana URL"):
            provision(bad, TOKEN, None)
    with pytest.raises(ProvisionError, match="no credentials in --url"):
        provision(url.replace("://", "://admin:pw@"), TOKEN, None)
