"""The simulated cluster against the real `kubernetes` Python client (exec auth plugin,
list/watch with label selectors, reading and streaming logs), and the CLI with a scenario file."""

from __future__ import annotations

import subprocess
import threading
import time

import pytest
import yaml
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

pytestmark = pytest.mark.timeout(60)

JS = "jobset.sigs.k8s.io/jobset-name=olmo3-sft"
P0 = JS + ",jobset.sigs.k8s.io/job-index=0,batch.kubernetes.io/job-completion-index=0"


def api(sim, monkeypatch) -> client.CoreV1Api:
    monkeypatch.setenv("CLOUDSDK_CORE_ACCOUNT", sim.account)
    return client.CoreV1Api(config.new_client_from_config(config_file=str(sim.kubeconfig_path)))


def wait_running(sim, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and sim.jobset_state().state == "pending":
        time.sleep(0.02)


def test_list_read_and_stream_logs(simcluster, monkeypatch):
    v1 = api(simcluster, monkeypatch)
    pods = v1.list_namespaced_pod("default", label_selector=P0)
    assert [p.metadata.name for p in pods.items] == [simcluster.process0()]
    p = pods.items[0]
    assert p.metadata.labels["jobset.sigs.k8s.io/restart-attempt"] == "0"
    assert p.metadata.uid and p.metadata.resource_version and p.metadata.creation_timestamp
    assert len(v1.list_namespaced_pod("default", label_selector=JS).items) == 4
    assert v1.list_namespaced_pod("default", label_selector="jobset.sigs.k8s.io/jobset-name=other").items == []
    wait_running(simcluster)
    simcluster.wait_step(5)
    p = v1.read_namespaced_pod(simcluster.process0(), "default")
    assert p.status.phase == "Running" and p.status.container_statuses[0].restart_count == 0
    text = v1.read_namespaced_pod_log(simcluster.process0(), "default", timestamps=True)
    assert "LOSS-PARTS step=5 " in text
    with pytest.raises(ApiException) as e:
        v1.read_namespaced_pod_log("nope", "default")
    assert e.value.status == 404
    # streaming follow
    resp = v1.read_namespaced_pod_log(simcluster.process0(), "default", follow=True,
                                      _preload_content=False, _request_timeout=10)
    seen, buf = [], b""
    deadline = time.monotonic() + 10
    try:
        for chunk in resp.stream(1024):
            buf += chunk
            seen = buf.decode().splitlines()
            if any("LOSS-PARTS step=12 " in ln for ln in seen) or time.monotonic() > deadline:
                break
    finally:
        resp.release_conn()
    assert any("LOSS-PARTS step=12 " in ln for ln in seen)


def test_watch_sees_jobset_restart(make_simcluster, monkeypatch):
    sim = make_simcluster({"rate": 50, "grace_seconds": 1, "restart_pending_seconds": 0.2,
                           "jobsets": [{"name": "olmo3-sft", "hosts": 2, "trainer": {"steps": 3000}}]})
    v1 = api(sim, monkeypatch)
    old = set(sim.pod_names())
    pods = v1.list_namespaced_pod("default", label_selector=JS)
    events: list[tuple[str, str, str]] = []
    w = watch.Watch()

    def run():
        for ev in w.stream(v1.list_namespaced_pod, "default", label_selector=JS,
                           resource_version=pods.metadata.resource_version, timeout_seconds=15):
            o = ev["object"]
            events.append((ev["type"], o.metadata.name,
                           o.metadata.labels["jobset.sigs.k8s.io/restart-attempt"]))
            if sum(1 for t, *_ in events if t == "DELETED") == len(old):
                w.stop()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    wait_running(sim)
    time.sleep(0.2)
    sim.restart_jobset()
    t.join(15)
    assert not t.is_alive()
    new = set(sim.pod_names())
    assert new.isdisjoint(old) and len(new) == 2
    assert {n for typ, n, _ in events if typ == "DELETED"} == old
    assert {(n, a) for typ, n, a in events if typ == "ADDED"} == {(n, "1") for n in new}
    # old pods went through graceful deletion (MODIFIED with deletionTimestamp) first
    first_deleted = next(i for i, e in enumerate(events) if e[0] == "DELETED")
    assert any(typ == "MODIFIED" and n in old for typ, n, _ in events[:first_deleted])
    # the new process-0 pod is found by the same label selector
    sim.wait_step(sim.jobset_state().resume_from + 1, incarnation=2)
    p0 = v1.list_namespaced_pod("default", label_selector=P0).items[0]
    assert p0.metadata.name == sim.process0()
    assert p0.metadata.labels["jobset.sigs.k8s.io/restart-attempt"] == "1"


def test_cli_with_scenario_file(tmp_path):
    from sim_fixtures import simcluster_subprocess
    scen = tmp_path / "scenario.yaml"
    scen.write_text(yaml.safe_dump({
        "namespace": "train", "rate": 50,
        "jobsets": [{"name": "cp4-run", "hosts": 2,
                     "trainer": {"steps": 40, "context_parallelism": 4, "load_balance": True}}],
        "faults": [{"at_step": 10, "action": "rotate", "jobset": "cp4-run"}],
    }))
    with simcluster_subprocess(str(scen)) as (proc, kc):
        import os
        env = {**os.environ, "KUBECONFIG": kc, "CLOUDSDK_CORE_ACCOUNT": "sa@x", "HOME": str(tmp_path)}
        deadline = time.monotonic() + 15
        out = ""
        while time.monotonic() < deadline:
            r = subprocess.run(["kubectl", "logs", "-n", "train", "-l",
                                "jobset.sigs.k8s.io/jobset-name=cp4-run,batch.kubernetes.io/job-completion-index=0",
                                "--tail=-1"], env=env, capture_output=True, text=True, timeout=20)
            out = r.stdout
            if "LOSS-PARTS step=40 " in out:
                break
            time.sleep(0.2)
        assert "LOSS-PARTS step=40 " in out
        # rotated at step 10: the start-up config and the first steps are gone
        assert "Config param ici_context_parallelism" not in out and "LOSS-PARTS step=5 " not in out
        assert proc.poll() is None
