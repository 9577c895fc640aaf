"""API faults against the real kubectl and kubernetes client: hanging and slow answers, open
streams frozen or dropped, watches expired (410 Gone) or dropped, and their record in the
truth (`sim.truth.unavailable()`)."""

from __future__ import annotations

import threading
import time

import pytest
import urllib3
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException
from test_sim_kubectl import LOSS, Follower, kubectl, wait_running

pytestmark = pytest.mark.timeout(60)

JS = "jobset.sigs.k8s.io/jobset-name=olmo3-sft"


def scenario(rate: float = 50, steps: int = 3000, faults: list | None = None) -> dict:
    return {"rate": rate, "grace_seconds": 2, "restart_pending_seconds": 0.3,
            "jobsets": [{"name": "olmo3-sft", "hosts": 2, "trainer": {"steps": steps}}], "faults": faults or []}


def core(sim, monkeypatch) -> client.CoreV1Api:
    monkeypatch.setenv("CLOUDSDK_CORE_ACCOUNT", sim.account)
    return client.CoreV1Api(config.new_client_from_config(config_file=str(sim.kubeconfig_path)))


def test_hang_api_answers_nothing_until_it_ends(make_simcluster, monkeypatch):
    sim = make_simcluster(scenario())
    v1 = core(sim, monkeypatch)
    wait_running(sim)
    sim.hang_api(seconds=2.5, path="/pods")
    r = kubectl(sim, "get", "pods", "--request-timeout=1s")
    # kubectl's own timeout, whichever of its two clocks fires first: the HTTP client's or the
    # request context's (under load the connection itself may not be up within the second)
    assert r.returncode == 1 and ("Client.Timeout exceeded while awaiting headers" in r.stderr
                                  or "context deadline exceeded" in r.stderr), r.stderr
    # a request that waits longer is answered once the hang is over, not before
    [hang] = [o for o in sim.truth.unavailable() if o.kind == "hang_api"]
    pods = v1.list_namespaced_pod("default", label_selector=JS, _request_timeout=20)
    assert time.time_ns() >= hang.to_ns and len(pods.items) == 2
    assert hang.params == {"path": "/pods", "streams": False}
    assert hang.to_ns - hang.from_ns == pytest.approx(2.5e9, abs=1e6)
    # other paths were never held
    assert kubectl(sim, "get", "jobsets", "--request-timeout=5s").returncode == 0


def test_hang_api_streams_freezes_an_open_follow_and_loses_nothing(make_simcluster):
    sim = make_simcluster(scenario(rate=50))
    wait_running(sim)
    f = Follower(sim, sim.process0())
    try:
        got = f.until(lambda ln: "LOSS-PARTS step=5 " in ln)
        sim.hang_api(seconds=2.0, path="/log", streams=True)
        got += f.drain(0.4)  # what was sent or in flight before the follow loop saw the hang
        step_then = sim.last_step()
        during = f.drain(1.0)
        assert during == [] and sim.last_step() > step_then + 20  # the trainer ran on; nothing was sent
        got += f.until(lambda ln: f"LOSS-PARTS step={sim.last_step()} " in ln, timeout=10)
        assert f.proc.poll() is None  # held, not ended
    finally:
        f.kill()
    steps = [int(m.group(1)) for ln in got if ln for m in [LOSS.search(ln)] if m]
    assert steps[0] == 1 and steps == list(range(1, steps[-1] + 1)) and steps[-1] > step_then + 20


def test_slow_api_answers_late_on_its_path_only(make_simcluster):
    sim = make_simcluster(scenario())
    wait_running(sim)
    sim.wait_step(3)
    p0 = sim.process0()
    sim.slow_api(seconds=10, delay=2.0, path="/log")
    r = kubectl(sim, "logs", p0, "--request-timeout=1s")
    assert r.returncode == 1 and ("deadline exceeded" in r.stderr or "Timeout exceeded" in r.stderr), r.stderr
    assert kubectl(sim, "get", "pods", "--request-timeout=1s").returncode == 0
    r = kubectl(sim, "logs", p0, "--request-timeout=8s")
    assert r.returncode == 0 and "LOSS-PARTS step=3 " in r.stdout
    [slow] = [o for o in sim.truth.unavailable() if o.kind == "slow_api"]
    assert slow.params == {"delay": 2.0, "path": "/log"}
    # the timed request log: each log read answered 2 s after it was asked, by whom
    logs = [(a, b, who, status) for a, b, who, _, url, status in sim.timeline() if url.split("?")[0].endswith("/log")]
    assert logs[-1][1] - logs[-1][0] >= 2.0 and logs[-1][2:] == (sim.account, 200), logs
    assert any(url.split("?")[0].endswith("/pods") and b - a < 1.0 for a, b, _, _, url, _ in sim.timeline())


def test_eof_streams_abort_drops_the_follow(make_simcluster):
    sim = make_simcluster(scenario())
    wait_running(sim)
    f = Follower(sim, sim.process0())
    f.until(lambda ln: "LOSS-PARTS step=3 " in ln)
    sim.eof_streams(abort=True)
    f.proc.wait(10)
    assert f.proc.returncode == 1 and "unexpected EOF" in f.proc.stderr.read()
    f2 = Follower(sim, sim.process0())
    try:  # a clean end, for comparison: kubectl exits 0
        f2.until(lambda ln: "LOSS-PARTS step=3 " in ln)
        sim.eof_streams()
        f2.proc.wait(10)
        assert f2.proc.returncode == 0
    finally:
        f.kill()
        f2.kill()


def test_watch_gone_expired_is_an_error_event_410_and_compacts(make_simcluster, monkeypatch):
    sim = make_simcluster(scenario())
    v1 = core(sim, monkeypatch)
    wait_running(sim)
    # the watch starts from a resourceVersion taken before its two MODIFIED events are made
    # (not before the pods' start: on a loaded machine they could be running before the list)
    rv = v1.list_namespaced_pod("default", label_selector=JS).metadata.resource_version
    errors: list = []
    seen: list = []

    def run():
        try:
            for ev in watch.Watch().stream(v1.list_namespaced_pod, "default", label_selector=JS,
                                           resource_version=rv, timeout_seconds=20):
                seen.append(ev["type"])
        except ApiException as e:
            errors.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    for pod in sim.pod_names():  # a container restart in each pod: one MODIFIED each
        sim.restart_container(pod=pod)
    deadline = time.monotonic() + 10
    while len(seen) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert seen[:2] == ["MODIFIED", "MODIFIED"]
    sim.watch_gone()
    t.join(10)
    assert not t.is_alive()
    [e] = errors
    assert e.status == 410 and e.reason.startswith("Expired: too old resource version")
    # the history is compacted: a watch from the old resourceVersion is expired at once
    raw = v1.list_namespaced_pod("default", label_selector=JS, watch=True, resource_version=rv,
                                 timeout_seconds=5, _preload_content=False)
    [line] = [ln for ln in raw.data.decode().splitlines() if ln]
    assert '"type": "ERROR"' in line and '"code": 410' in line and '"reason": "Expired"' in line
    # a relist and a watch from its resourceVersion work
    rv2 = v1.list_namespaced_pod("default", label_selector=JS).metadata.resource_version
    raw = v1.list_namespaced_pod("default", label_selector=JS, watch=True, resource_version=rv2,
                                 timeout_seconds=1, _preload_content=False)
    assert "ERROR" not in raw.data.decode()
    assert [o.params for o in sim.truth.unavailable() if o.kind == "watch_gone"] == [{"mode": "expired"}]


def test_watch_gone_drop_cuts_the_connection(make_simcluster, monkeypatch):
    sim = make_simcluster(scenario())
    v1 = core(sim, monkeypatch)
    errors: list = []

    def run():
        try:
            for _ in watch.Watch().stream(v1.list_namespaced_pod, "default", label_selector=JS, timeout_seconds=20):
                pass
        except Exception as e:  # noqa: BLE001 - the type is the assertion
            errors.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    time.sleep(0.5)
    sim.watch_gone(mode="drop")
    t.join(10)
    assert not t.is_alive()
    [e] = errors
    assert isinstance(e, urllib3.exceptions.ProtocolError), repr(e)


def test_unavailable_records_every_api_fault(make_simcluster):
    sim = make_simcluster(scenario(faults=[{"at": 0, "action": "fail_next", "n": 2, "code": 503, "path": "/pods"},
                                           {"at": 0, "action": "auth_lapse", "seconds": 0.2},
                                           {"at": 0, "action": "deny", "seconds": 1}]))
    deadline = time.monotonic() + 10
    while len(sim.truth.unavailable()) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)  # the lapse is over
    fail = next(o for o in sim.truth.unavailable() if o.kind == "fail_next")
    assert fail.to_ns is None  # queued, not yet answered
    for _ in range(2):
        assert kubectl(sim, "get", "pods", "-o", "name").returncode == 1
    out = {o.kind: o for o in sim.truth.unavailable()}
    assert out["fail_next"].to_ns is not None and out["fail_next"].params == {"n": 2, "code": 503, "path": "/pods"}
    assert out["auth_lapse"].to_ns - out["auth_lapse"].from_ns == pytest.approx(0.2e9, abs=1e6)
    assert out["deny"].params["user"] == "system:serviceaccount:default:steptail"
    assert [o.kind for o in sim.truth.unavailable()] == ["fail_next", "auth_lapse", "deny"]


def test_hang_api_on_the_query_holds_watches_not_lists(make_simcluster, monkeypatch):
    sim = make_simcluster(scenario())
    v1 = core(sim, monkeypatch)
    sim.hang_api(seconds=30, path="watch=true")
    assert len(v1.list_namespaced_pod("default", label_selector=JS, _request_timeout=2).items) == 2
    with pytest.raises(urllib3.exceptions.MaxRetryError, match="Read timed out"):  # urllib3 tried 3 times
        v1.list_namespaced_pod("default", label_selector=JS, watch=True, timeout_seconds=1,
                               _preload_content=False, _request_timeout=1)  # no headers come
