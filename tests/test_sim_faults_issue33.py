"""The faults issue 33 found missing from the simulator: old lines served again unchanged,
429/503 with and without Retry-After as the apiserver writes them, a JobSet object without
optional fields, UUID pod uids, and the first-served time the chaos oracle measures recovery by."""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import time
import uuid

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from test_sim_kubectl import kubectl, wait_running

pytestmark = pytest.mark.timeout(60)


def scenario(rate: float = 50, steps: int = 3000, **js) -> dict:
    return {"rate": rate, "grace_seconds": 2, "restart_pending_seconds": 0.3,
            "jobsets": [{"name": "olmo3-sft", "hosts": 2, "trainer": {"steps": steps}, **js}]}


def core(sim, monkeypatch) -> client.CoreV1Api:
    monkeypatch.setenv("CLOUDSDK_CORE_ACCOUNT", sim.account)
    return client.CoreV1Api(config.new_client_from_config(config_file=str(sim.kubeconfig_path)))


def test_repeat_lines_serves_an_old_block_again_unchanged_and_out_of_the_truth(make_simcluster):
    sim = make_simcluster(scenario(rate=20))
    wait_running(sim)
    sim.wait_step(40)
    pod = sim.process0()
    before = sim.log_lines(pod)
    truth_before = len(sim.truth.servable())
    sim.stall(seconds=30)  # nothing else written meanwhile
    assert sim.repeat_lines(lines=40, age=600.0) == 40  # older than the run: its oldest lines
    after = sim.log_lines(pod)
    assert after[:len(before)] == before
    block = after[len(before):]
    assert len(block) == 40 and block == before[:40]  # same kubelet stamps, same text
    assert any("LOSS-PARTS" in text for _, text in block)
    assert len(sim.truth.servable()) == truth_before  # copies, not lines written
    # younger than any line: the newest block written (the copies are not lines written)
    assert sim.repeat_lines(lines=5, age=0.0) == 5
    assert sim.log_lines(pod)[-5:] == before[-5:]


def test_a_repeat_is_served_on_the_wire_with_its_old_stamp(make_simcluster, monkeypatch):
    sim = make_simcluster(scenario(rate=20))
    v1 = core(sim, monkeypatch)
    wait_running(sim)
    sim.wait_step(10)
    sim.stall(seconds=30)
    first = v1.read_namespaced_pod_log(sim.process0(), "default", timestamps=True).splitlines()
    sim.repeat_lines(lines=10, age=600.0)
    again = v1.read_namespaced_pod_log(sim.process0(), "default", timestamps=True).splitlines()
    assert again[len(first):] == first[:10]


def raw_get(sim, path: str) -> tuple[int, dict, dict]:
    """(status, headers, body: JSON decoded, else bytes) of one GET with the bare token, no
    client retrying it."""
    ctx = ssl.create_default_context(cadata=base64.b64decode(
        yaml.safe_load(sim.kubeconfig_path.read_text())["clusters"][0]["cluster"]["certificate-authority-data"]
    ).decode())
    host, port = sim.server_url.removeprefix("https://").rsplit(":", 1)
    conn = http.client.HTTPSConnection(host, int(port), context=ctx, timeout=10)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {sim.token}"})
        r = conn.getresponse()
        body = r.read()
        return r.status, dict(r.getheaders()), json.loads(body) if "json" in r.getheader("Content-Type", "") else body
    finally:
        conn.close()


def test_429_and_503_carry_retry_after_only_when_asked(make_simcluster, monkeypatch):
    sim = make_simcluster(scenario())
    wait_running(sim)
    sim.fail_next(1, code=429, path="/pods", retry_after=1)
    code, headers, body = raw_get(sim, "/api/v1/namespaces/default/pods")
    assert code == 429 and headers["Retry-After"] == "1"
    assert body["reason"] == "TooManyRequests" and body["details"] == {"retryAfterSeconds": 1}
    sim.fail_next(1, code=503, path="/pods")
    code, headers, body = raw_get(sim, "/api/v1/namespaces/default/pods")
    assert code == 503 and "Retry-After" not in headers
    assert body["reason"] == "ServiceUnavailable" and "details" not in body
    assert [o.params for o in sim.truth.unavailable() if o.kind == "fail_next"] == [
        {"n": 1, "code": 429, "path": "/pods", "retry_after": 1}, {"n": 1, "code": 503, "path": "/pods"}]
    # the kubernetes client (urllib3) retries a Retry-After answer by itself; a bare 503 it raises
    v1 = core(sim, monkeypatch)
    sim.fail_next(2, code=429, path="/pods", retry_after=1)
    assert v1.list_namespaced_pod("default", _request_timeout=10).items
    sim.fail_next(1, code=503, path="/pods")
    with pytest.raises(ApiException) as e:
        v1.list_namespaced_pod("default", _request_timeout=10)
    assert e.value.status == 503


def test_kubectl_retries_a_429_with_retry_after_by_itself(make_simcluster):
    sim = make_simcluster(scenario())
    wait_running(sim)
    sim.fail_next(3, code=429, path="/pods", retry_after=1)
    r = kubectl(sim, "get", "pods", "--request-timeout=20s")
    assert r.returncode == 0, r.stderr  # client-go waits Retry-After and retries
    statuses = [s for _, path, s in sim.requests if "/pods" in path and "/log" not in path]
    assert statuses[-4:] == [429, 429, 429, 200]


def test_a_throttle_refuses_for_its_span_however_often_one_asks(make_simcluster):
    """API Priority and Fairness rejects while a priority level is saturated: a span of time,
    not a count of requests (a client asking less often is not refused longer)."""
    sim = make_simcluster(scenario())
    wait_running(sim)
    sim.throttle(seconds=1.5, path="/log", retry_after=1)
    log = f"/api/v1/namespaces/default/pods/{sim.process0()}/log?tailLines=1"
    answers = [raw_get(sim, log) for _ in range(5)]
    assert all(code == 429 and headers["Retry-After"] == "1" and body["reason"] == "TooManyRequests"
               for code, headers, body in answers)
    assert raw_get(sim, "/api/v1/namespaces/default/pods")[0] == 200  # another path is served
    throttle = [o for o in sim.truth.unavailable() if o.kind == "throttle"]
    assert [o.params for o in throttle] == [{"path": "/log", "retry_after": 1}]
    assert throttle[0].to_ns - throttle[0].from_ns == 1_500_000_000
    while time.time_ns() < throttle[0].to_ns:
        time.sleep(0.05)
    code, _, body = raw_get(sim, log)
    assert code == 200 and body  # served again once it ends


def test_a_jobset_object_without_optional_fields(make_simcluster, monkeypatch):
    sim = make_simcluster(scenario(omit=["image", "annotations", "status", "nodeSelector"]))
    monkeypatch.setenv("CLOUDSDK_CORE_ACCOUNT", sim.account)
    api = client.CustomObjectsApi(config.new_client_from_config(config_file=str(sim.kubeconfig_path)))
    wait_running(sim)
    js = api.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", "default", "jobsets", "olmo3-sft")
    assert "status" not in js and "annotations" not in js["metadata"]
    assert js["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "post-training"}  # kept: Kueue's
    tmpl = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert "image" not in tmpl["spec"]["containers"][0] and "nodeSelector" not in tmpl["spec"]
    assert "annotations" not in tmpl["metadata"]
    assert tmpl["spec"]["containers"][0]["args"]  # what was not omitted is still there
    # the pods keep theirs (a pod without an image is not admitted)
    pod = core(sim, monkeypatch).read_namespaced_pod(sim.process0(), "default")
    assert pod.spec.containers[0].image and pod.spec.node_selector
    r = kubectl(sim, "get", "jobset", "olmo3-sft", "-o", "yaml")
    assert r.returncode == 0 and "status:" not in r.stdout, r.stderr


def test_omit_is_checked_when_the_scenario_loads():
    from steptail.simcluster.scenario import Scenario

    with pytest.raises(ValueError, match="omit"):
        Scenario.from_dict(scenario(omit=["labels"]))  # that is queue: "" (no Workload either)
    with pytest.raises(ValueError, match="omit"):
        Scenario.from_dict(scenario(omit="image"))


def test_uids_are_uuids_and_lines_know_when_first_served(make_simcluster, monkeypatch):
    sim = make_simcluster(scenario(rate=20))
    v1 = core(sim, monkeypatch)
    wait_running(sim)
    pods = v1.list_namespaced_pod("default").items
    for p in pods:
        assert uuid.UUID(p.metadata.uid).version == 4
    sim.wait_step(5)
    t0 = time.time_ns()
    v1.read_namespaced_pod_log(sim.process0(), "default")
    lines = sim.truth.servable()
    served = [ln for ln in lines if ln.served]
    assert served and all(ln.served_ns >= t0 and ln.served_ns >= ln.wall_ns for ln in served)
    assert all(ln.served_ns is None for ln in lines if not ln.served)
