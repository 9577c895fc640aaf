"""The live path's surroundings: findings reach a webhook (real HTTP) and the Prometheus
metrics server while following; the RBAC manifest stays read-only."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
import yaml
from aiohttp import web

from steptail.collector.cluster.kubectl import KubeTarget, classify
from steptail.collector.live.follower import FollowConfig
from steptail.collector.live.supervisor import Plan
from steptail.collector.live.wiring import follow
from steptail.storage.db import open_store

pytestmark = pytest.mark.timeout(90)
DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


async def test_findings_go_to_webhooks_and_metrics_while_following(make_simcluster, tmp_path, monkeypatch):
    monkeypatch.setenv("CLOUDSDK_CORE_ACCOUNT", "placeholder@example.invalid")
    got: list[dict] = []

    async def hook(request: web.Request) -> web.Response:
        got.append(await request.json())
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/hook"

    sim = make_simcluster({"rate": 50, "jobsets": [{"name": "olmo3-sft", "hosts": 2,
                                                    "trainer": {"steps": 120, "nan_steps": [30]}}]})
    store = open_store(str(tmp_path / "l.db"))
    plan = Plan(KubeTarget("default", sim.account, str(sim.kubeconfig_path)), {"olmo3-sft": "r"},
                config=FollowConfig(silence=1.0, until_done=True))
    scraped: list[str] = []

    def on_start(sup, metrics_url):
        async def scrape():
            async with aiohttp.ClientSession() as s:
                for _ in range(200):  # bounded: until the step gauge shows up
                    async with s.get(metrics_url) as resp:
                        text = await resp.text()
                    if 'steptail_last_step{run="r"}' in text:
                        scraped.append(text)
                        return
                    await asyncio.sleep(0.05)

        asyncio.get_running_loop().create_task(scrape())

    try:
        sup = await asyncio.wait_for(follow(store, plan, webhooks=(url,), metrics_port=0, on_start=on_start), 60)
    finally:
        store.dispose()
        await runner.cleanup()
    assert sup.status["r"].done
    assert scraped and "steptail_last_step" in scraped[0]
    kinds = {p["kind"] for p in got}
    assert "nonfinite_ce" in kinds
    assert all(p["run"] == "r" for p in got)


def test_rbac_is_read_only():
    docs = list(yaml.safe_load_all((DEPLOY / "rbac.yaml").read_text()))
    kinds = {d["kind"]: d for d in docs}
    assert set(kinds) == {"ServiceAccount", "Role", "RoleBinding"}
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): set(r["verbs"]) for r in kinds["Role"]["rules"]}
    assert all(verbs <= {"get", "list", "watch"} for verbs in rules.values())  # the exact rules: test_deploy
    binding = kinds["RoleBinding"]
    assert binding["roleRef"]["name"] == kinds["Role"]["metadata"]["name"]
    assert binding["subjects"][0]["name"] == kinds["ServiceAccount"]["metadata"]["name"]
    dep = yaml.safe_load((DEPLOY / "deployment.yaml").read_text())
    spec = dep["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "steptail"
    env = {e["name"]: e for e in spec["containers"][0]["env"]}
    assert "CLOUDSDK_CORE_ACCOUNT" in env and "secretKeyRef" in env["STEPTAIL_DB"]["valueFrom"]


def test_a_log_read_is_one_raw_request_with_kubectl_logs_query():
    t = KubeTarget("team-a", "agent@example.com", kubeconfig="/k/config", context="gke_p_z_c")
    argv = t.logs_argv("olmo3-sft-slice-0-0-x7z", "jax-tpu", follow=True, since_ns=1_796_400_000_999_999_999,
                       previous=True, limit_bytes=1 << 20)
    assert argv == ["kubectl", "get", "--raw",
                    "/api/v1/namespaces/team-a/pods/olmo3-sft-slice-0-0-x7z/log?container=jax-tpu&timestamps=true"
                    "&follow=true&previous=true&sinceTime=2026-12-04T16%3A00%3A00Z&limitBytes=1048576",
                    "--kubeconfig=/k/config", "--context=gke_p_z_c"]
    # sinceTime in whole seconds, truncated, as `kubectl logs --since-time` sends it
    assert t.logs_argv("p", "c") == ["kubectl", "get", "--raw", "/api/v1/namespaces/team-a/pods/p/log?"
                                     "container=c&timestamps=true", "--kubeconfig=/k/config", "--context=gke_p_z_c"]


@pytest.mark.parametrize("stderr,kind", [
    ("E1130 cred.go:145] print credential failed\nERROR: (gcloud.config.config-helper) Reauthentication "
     "failed.\nUnable to connect to the server: getting credentials: exec: executable python failed", "auth"),
    ('Error from server (NotFound): pods "x" not found', "not_found"),
    ('Error from server (BadRequest): container "jax-tpu" in pod "x" is waiting to start: ContainerCreating',
     "container_creating"),
    ('Error from server (InternalError): an error on the server ("unknown") has prevented the request', "server_error"),
    ("Unable to connect to the server: dial tcp 10.0.0.1:443: connect: connection refused", "network"),
])
def test_stderr_is_classified_and_secrets_masked(stderr, kind):
    assert classify(stderr)[0] == kind
    assert "abcdefghijklmnop" not in classify("error: Bearer abcdefghijklmnopqrstuvwxyz invalid")[1]


def test_follow_passes_detector_settings_to_the_live_engine(store):
    """`follow --reference-ce/--stall-k…` reach the same engine `check` uses."""
    from steptail.collector.live.detect import Detectors
    from steptail.runs.detect import Settings

    det = Detectors("r", store, settings=Settings(stall_k=7.0), reference_ce={1: 3.5})
    assert det.engine.settings.stall_k == 7.0 and det.engine.reference_ce == {1: 3.5}


async def test_follow_all_gives_each_run_its_own_reference(store, tmp_path):
    """--reference-ce DIR: run a's gate gets a.json; a bad file for b is reported on b's
    status and b is followed without a reference; neither stops the other."""
    from steptail.collector.live.follower import RunStatus
    from steptail.collector.live.supervisor import Supervisor

    (tmp_path / "a.json").write_text('{"1": 3.5}')
    (tmp_path / "b.json").write_text("{oops")
    sup = Supervisor(store, Plan(KubeTarget("default", "x@y"), follow_all=True, reference_ce=tmp_path))
    for run in ("a", "b"):
        await sup.assemble_run(run, run, RunStatus(run, run))
    assert sup.detectors["a"].engine.reference_ce == {1: 3.5}
    assert sup.detectors["b"].engine.reference_ce == {}
    assert "b.json" in (sup.followers["b"].status.last_error or "")


async def test_shutdown_outlasts_a_follower_that_absorbs_a_cancel():
    """A cancel can be swallowed (3.11's wait_for race, a library's except): shutdown cancels
    again instead of waiting forever on a follower that keeps reading."""
    from steptail.collector.live.supervisor import cancel_all

    cancels = []

    async def stubborn():
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancels.append(1)
                if len(cancels) == 2:
                    raise

    async def fails():
        raise RuntimeError("boom")

    tasks = [asyncio.create_task(stubborn()), asyncio.create_task(fails())]
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_all(tasks, every=0.05), 5)
    assert len(cancels) == 2 and tasks[0].cancelled()
    assert isinstance(tasks[1].exception(), RuntimeError)
