"""The simulated cluster against the real `kubectl` binary (no mocks, no shell)."""

from __future__ import annotations

import json
import queue
import re
import subprocess
import threading
import time

import pytest
from sim_fixtures import FAST

from steptail.simcluster.kube import parse_rfc3339_ns

pytestmark = pytest.mark.timeout(60)

TS = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d*[1-9])?Z) (.*)$")
LOSS = re.compile(r"LOSS-PARTS step=(\d+) ce=(\S+)")
JS = "jobset.sigs.k8s.io/jobset-name=olmo3-sft"
P0 = JS + ",jobset.sigs.k8s.io/job-index=0,batch.kubernetes.io/job-completion-index=0"


def kubectl(sim, *args, account=True, timeout=20, home=None):
    env = sim.env(account=account)
    env["HOME"] = str(sim.state_dir)
    return subprocess.run(["kubectl", *args], env=env, capture_output=True, text=True, timeout=timeout)


class Follower:
    """`kubectl logs -f` in a subprocess, lines collected by a thread; every wait bounded."""

    def __init__(self, sim, *args):
        env = sim.env()
        env["HOME"] = str(sim.state_dir)
        self.proc = subprocess.Popen(["kubectl", "logs", "-f", *args], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.q: queue.Queue = queue.Queue()
        self.t = threading.Thread(target=self._pump, daemon=True)
        self.t.start()

    def _pump(self):
        for line in self.proc.stdout:
            self.q.put(line.rstrip("\n"))
        self.q.put(None)

    def until(self, pred, timeout=10.0) -> list[str]:
        got, deadline = [], time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.q.get(timeout=0.1)
            except queue.Empty:
                continue
            if line is None:
                raise EOFError(f"stream ended; got {got[-3:]}")
            got.append(line)
            if pred(line):
                return got
        raise TimeoutError(f"no matching line within {timeout}s; last {got[-3:]}")

    def drain(self, seconds: float) -> list[str | None]:
        got, deadline = [], time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                got.append(self.q.get(timeout=0.05))
            except queue.Empty:
                pass
        return got

    def kill(self):
        self.proc.kill()
        self.proc.wait(5)


def loss_steps(text: str) -> list[tuple[int, str]]:
    return [(int(m.group(1)), m.group(2)) for m in LOSS.finditer(text)]


def wait_running(sim, jobset=None, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with sim.lock:
            if sim.jobset_state(jobset).state != "pending":
                return
        time.sleep(0.02)
    raise TimeoutError


def test_get_pods_by_label_and_jobsets(simcluster):
    r = kubectl(simcluster, "get", "pods", "-l", JS, "-o", "json")
    assert r.returncode == 0, r.stderr
    items = json.loads(r.stdout)["items"]
    assert len(items) == 4
    labels = items[0]["metadata"]["labels"]
    for k in ("jobset.sigs.k8s.io/replicatedjob-name", "jobset.sigs.k8s.io/job-index",
              "jobset.sigs.k8s.io/job-global-index", "jobset.sigs.k8s.io/restart-attempt",
              "batch.kubernetes.io/job-completion-index"):
        assert k in labels
    r = kubectl(simcluster, "get", "pods", "-l", P0, "-o", "name")
    assert r.stdout.strip() == f"pod/{simcluster.process0()}"
    r = kubectl(simcluster, "get", "pods", "-l",
                "batch.kubernetes.io/job-completion-index in (1,2)", "--no-headers")
    assert r.returncode == 0 and len(r.stdout.strip().splitlines()) == 2
    r = kubectl(simcluster, "get", "jobsets")
    assert r.returncode == 0 and "olmo3-sft" in r.stdout, r.stderr


def test_the_api_records_when_an_account_began_asking(simcluster):
    """woke_since: the first request of an account after a silence of 0.5 s (a restarted client
    is up from then)."""
    import time

    t0 = time.time()
    assert simcluster.woke_since(simcluster.account, t0) is None
    assert kubectl(simcluster, "get", "pods").returncode == 0
    first = simcluster.woke_since(simcluster.account, t0)
    assert first is not None and t0 <= first <= time.time()
    time.sleep(0.6)
    t1 = time.time()
    assert kubectl(simcluster, "get", "pods").returncode == 0
    assert simcluster.woke_since(simcluster.account, t1) >= t1  # asked again after a silence: a wake
    assert simcluster.woke_since("nobody@example.com", t0) is None


def test_full_log_matches_ground_truth(make_simcluster):
    sim = make_simcluster({**FAST, "rate": 200,
                           "jobsets": [{"name": "olmo3-sft", "hosts": 3,
                                        "trainer": {"steps": 80, "nan_steps": [7], "no_rbf_steps": [9]}}]})
    sim.wait_done(timeout=15)
    p0 = sim.process0()
    r = kubectl(sim, "logs", p0)
    assert r.returncode == 0, r.stderr
    truth = sim.truth()
    assert [t.step for t in truth] == list(range(1, 81))
    got = loss_steps(r.stdout)
    assert got == [(t.step, "nan" if t.ce != t.ce else f"{t.ce:.6f}") for t in truth]
    assert all(t.served and t.retrievable and not t.rotated for t in truth)
    assert "REQUIRED_RBF step=9 " not in r.stdout and "REQUIRED_RBF step=10 " in r.stdout
    assert [e.loss_parts for e in sim.jobset_state().trainer.truth] == \
        [ln.split("] ", 1)[1] for ln in r.stdout.splitlines() if "LOSS-PARTS" in ln]
    # --timestamps: exactly kubelet's stored lines, RFC3339Nano without trailing zeros
    r = kubectl(sim, "logs", p0, "--timestamps")
    lines = r.stdout.splitlines()
    assert lines == [f"{ts} {text}" for ts, text in sim.log_lines(p0)]
    assert all(TS.match(ln) for ln in lines)
    stamps = [TS.match(ln).group(1) for ln in lines]
    assert len(set(stamps)) < len(stamps)  # several lines share one timestamp
    # other pods: per-pod completed step lines only, with their own loss
    other = [n for n in sim.pod_names() if n != p0][0]
    r = kubectl(sim, "logs", other)
    assert "LOSS-PARTS" not in r.stdout and "completed step: 80," in r.stdout
    # tailLines / limitBytes / sinceSeconds
    assert len(kubectl(sim, "logs", p0, "--tail=5").stdout.splitlines()) == 5
    assert len(kubectl(sim, "logs", p0, "--limit-bytes=100").stdout) == 100
    assert kubectl(sim, "logs", p0, "--since=1h").stdout == kubectl(sim, "logs", p0).stdout


def test_follow_timestamps_since_time_and_errors(make_simcluster):
    # pending long enough that the first kubectl call lands while the pod is still being
    # created, however slow a loaded machine starts kubectl
    sim = make_simcluster({**FAST, "jobsets": [{"name": "olmo3-sft", "hosts": 2, "pending_seconds": 4.0,
                                                "trainer": {"steps": 1000}}]})
    p0 = sim.process0()
    r = kubectl(sim, "logs", p0)
    assert r.returncode == 1
    assert f'container "jax-tpu" in pod "{p0}" is waiting to start: ContainerCreating' in r.stderr
    r = kubectl(sim, "logs", "olmo3-sft-slice-0-0-gone1")
    assert r.returncode == 1 and 'pods "olmo3-sft-slice-0-0-gone1" not found' in r.stderr
    r = kubectl(sim, "get", "pods", "nope")
    assert r.returncode == 1 and "NotFound" in r.stderr
    r = kubectl(sim, "logs", p0, "--previous")
    assert r.returncode == 1

    wait_running(sim)
    f = Follower(sim, "--timestamps", p0)
    try:
        got = f.until(lambda ln: "LOSS-PARTS step=5 " in ln)
        assert got[0].split(" ", 1)[1].endswith("Attempting to initialize the jax distributed system...")
        assert all(TS.match(ln) for ln in got)
        assert f.proc.poll() is None
    finally:
        f.kill()

    sim.wait_step(30)
    lines = [f"{ts} {t}" for ts, t in sim.log_lines(p0)]
    pivot = next(ln for ln in lines if "LOSS-PARTS step=20 " in ln)
    since = pivot.split(" ", 1)[0]
    r = kubectl(sim, "logs", p0, "--timestamps", f"--since-time={since}")
    assert r.returncode == 0
    out = r.stdout.splitlines()
    # kubectl sends whole seconds: everything from the start of that second comes back
    sec_ns = parse_rfc3339_ns(since) // 10**9 * 10**9
    first_ts = parse_rfc3339_ns(out[0].split(" ", 1)[0])
    assert sec_ns <= first_ts <= parse_rfc3339_ns(since)
    assert pivot in out
    expect = [ln for ln in lines if parse_rfc3339_ns(ln.split(" ", 1)[0]) >= sec_ns]
    assert out[: len(expect)] == expect


def test_missing_account_and_auth_lapse(simcluster):
    r = kubectl(simcluster, "get", "pods", account=False)
    assert r.returncode == 1
    assert "getting credentials" in r.stderr and "CLOUDSDK_CORE_ACCOUNT" in r.stderr
    simcluster.auth_lapse(1.5)
    r = kubectl(simcluster, "logs", simcluster.process0())
    assert r.returncode == 1 and "getting credentials: exec" in r.stderr
    time.sleep(1.6)
    r = kubectl(simcluster, "get", "pods")
    assert r.returncode == 0, r.stderr


def test_fail_next_and_stream_eof(simcluster):
    wait_running(simcluster)
    simcluster.fail_next(1, code=503)
    r = kubectl(simcluster, "logs", simcluster.process0())
    assert r.returncode == 1 and "ServiceUnavailable" in r.stderr
    simcluster.fail_next(1, code=500, path="/log")
    r = kubectl(simcluster, "logs", simcluster.process0())
    assert r.returncode == 1 and "InternalError" in r.stderr
    assert kubectl(simcluster, "logs", simcluster.process0()).returncode == 0
    f = Follower(simcluster, simcluster.process0())
    try:
        f.until(lambda ln: "LOSS-PARTS" in ln)
        simcluster.eof_streams()
        rest = f.drain(2.0)
        assert None in rest  # EOF
        assert f.proc.wait(5) == 0
    finally:
        f.kill()


def test_rotation_silences_follow_and_drops_rotated_lines(make_simcluster):
    sim = make_simcluster({**FAST, "jobsets": [{"name": "olmo3-sft", "hosts": 2,
                                                "trainer": {"steps": 2000}}]})
    wait_running(sim)
    p0 = sim.process0()
    sim.wait_step(10)
    before = sim.log_lines(p0)[0][0]  # a timestamp from before the rotation
    f = Follower(sim, "--timestamps", p0)
    try:
        f.until(lambda ln: "LOSS-PARTS step=10 " in ln)
        sim.wait_step(15)
        f.until(lambda ln: "LOSS-PARTS step=15 " in ln)
        sim.rotate()
        step_at_rotation = sim.last_step()
        # drain whatever was still in the old file, then silence while the trainer goes on
        f.drain(0.5)
        sim.wait_step(step_at_rotation + 25)
        assert f.drain(1.0) == []  # silent, no EOF
        assert f.proc.poll() is None
    finally:
        f.kill()
    r = kubectl(sim, "logs", p0, "--timestamps", f"--since-time={before}")
    new_file = sim.log_lines(p0)
    assert r.stdout.splitlines()[0] == f"{new_file[0][0]} {new_file[0][1]}"
    assert "Attempting to initialize" not in r.stdout
    truth = sim.truth()
    rotated = [t for t in truth if t.rotated]
    assert rotated and all(not t.retrievable for t in rotated)
    assert all(t.retrievable for t in truth if not t.rotated)
    assert {t.step for t in rotated if t.served} >= set(range(1, 16))


def test_size_based_rotation(make_simcluster):
    sim = make_simcluster({**FAST, "rate": 200, "log_max_size": "20Ki", "log_max_files": 2,
                           "jobsets": [{"name": "olmo3-sft", "hosts": 1, "trainer": {"steps": 150}}]})
    sim.wait_done(timeout=15)
    st = sim.jobset_state()
    log = sim.state.pods[("default", sim.process0())].current.log
    assert log.rotations >= 3
    truth = sim.truth()
    lost = [t.step for t in truth if t.rotated_unread]
    assert lost and lost[0] == 1
    r = kubectl(sim, "logs", sim.process0())
    got = [s for s, _ in loss_steps(r.stdout)]
    assert got == [t.step for t in truth if t.retrievable]
    assert got[-1] == 150 and st.state == "done"


def test_jobset_restart_and_container_restart(make_simcluster):
    sim = make_simcluster({**FAST, "rate": 100, "grace_seconds": 2,
                           "jobsets": [{"name": "olmo3-sft", "hosts": 2, "trainer": {"steps": 5000}}],
                           "faults": [{"at_step": 70, "action": "restart_jobset"}]})
    wait_running(sim)
    old = sim.process0()
    sim.wait_step(51, incarnation=2, timeout=15)
    new = sim.process0()
    assert new != old
    r = kubectl(sim, "get", "pods", "-l", P0, "-o", "json")
    pods = json.loads(r.stdout)["items"]
    by = {p["metadata"]["name"]: p for p in pods}
    assert by[new]["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"] == "1"
    # the old pod is terminating but its log is still readable during the grace period
    assert by[old]["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"] == "0"
    assert "deletionTimestamp" in by[old]["metadata"]
    r = kubectl(sim, "logs", old)
    assert r.returncode == 0 and "TPU host preempted" in r.stdout
    assert loss_steps(r.stdout)[-1][0] == 70
    r = kubectl(sim, "logs", new)
    assert "Restoring checkpoint from step 50." in r.stdout
    assert loss_steps(r.stdout)[0][0] == 51
    truth = {(t.incarnation, t.step): t for t in sim.truth()}
    assert truth[(1, 60)].ce == truth[(2, 60)].ce and truth[(2, 60)].pod == new
    # after the grace period the old pod is gone: 404
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline and old in kubectl(sim, "get", "pods", "-o", "name").stdout:
        time.sleep(0.2)
    r = kubectl(sim, "logs", old)
    assert r.returncode == 1 and f'pods "{old}" not found' in r.stderr

    # container restart in place: --previous serves the old container's output
    sim.wait_step(110, incarnation=2)
    sim.restart_container()
    ck = sim.jobset_state().resume_from
    assert ck >= 100 and ck % 50 == 0
    r = kubectl(sim, "get", "pod", new, "-o", "json")
    assert json.loads(r.stdout)["status"]["containerStatuses"][0]["restartCount"] == 1
    prev = kubectl(sim, "logs", new, "--previous")
    assert prev.returncode == 0 and "TPU host preempted" in prev.stdout
    assert loss_steps(prev.stdout)[0][0] == 51
    sim.wait_step(ck + 2, incarnation=3)
    cur = kubectl(sim, "logs", new)
    assert f"Restoring checkpoint from step {ck}." in cur.stdout
    assert loss_steps(cur.stdout)[0][0] == ck + 1


def test_stall_and_rate(simcluster):
    wait_running(simcluster)
    simcluster.wait_step(5)
    simcluster.stall(seconds=0.8)
    s0 = simcluster.last_step()
    time.sleep(0.5)
    assert simcluster.last_step() == s0
    simcluster.wait_step(s0 + 3, timeout=5)
    simcluster.set_rate(steps_per_second=2)
    s1 = simcluster.last_step()
    time.sleep(0.6)
    assert simcluster.last_step() - s1 <= 2


def test_kubectl_get_watch_shows_restart(make_simcluster):
    sim = make_simcluster({**FAST, "grace_seconds": 0.5, "restart_pending_seconds": 0.3,
                           "jobsets": [{"name": "olmo3-sft", "hosts": 2, "trainer": {"steps": 3000}}]})
    wait_running(sim)
    env = sim.env()
    env["HOME"] = str(sim.state_dir)
    proc = subprocess.Popen(["kubectl", "get", "pods", "-w", "-l", JS], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.0)
        old = set(sim.pod_names())
        sim.restart_jobset()
        time.sleep(1.5)
    finally:
        proc.kill()
        out, _ = proc.communicate(timeout=5)
    rows = [ln.split() for ln in out.splitlines()[1:]]
    assert {r[0] for r in rows if r[2] == "Terminating"} == old
    new = set(sim.pod_names())
    assert {r[0] for r in rows if r[2] == "ContainerCreating"} == new
    assert {r[0] for r in rows if r[2] == "Running"} >= new


def _held_then_applied(sim, timeout: float) -> tuple[float, int]:
    """Seconds the trainer stood at step 10 before the at_step fault was applied, and the steps
    written when it was."""
    held_from = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with sim.lock:
            written = sim.jobset_state().next_step - 1
            applied = [f for f in sim.state.applied if f.action == "set_rate"]
        if applied:
            return (0.0 if held_from is None else time.monotonic() - held_from), written
        if written == 10 and held_from is None:
            held_from = time.monotonic()
        time.sleep(0.02)
    raise TimeoutError("the fault was never applied")


@pytest.mark.parametrize("reader", [False, True])
def test_a_fault_waits_for_the_reader(make_simcluster, reader):
    """`faults_wait_for_reader`: an at_step fault strikes once a log response served its step,
    the trainer held till then (at most that long): with no reader it waits out its bound, with
    `kubectl logs -f` open it strikes at once."""
    sim = make_simcluster({**FAST, "rate": 20, "faults_wait_for_reader": 3 if not reader else 60,
                           "jobsets": [{"name": "olmo3-sft", "hosts": 1, "trainer": {"steps": 100}}],
                           "faults": [{"action": "set_rate", "at_step": 10, "steps_per_second": 20}]})
    _assert_held(sim, reader)


@pytest.mark.parametrize("reader", [False, True])
def test_one_fault_waits_for_the_reader(make_simcluster, reader):
    """The same, asked by the fault alone (`wait_for_reader`): the scenario's other faults keep
    their timing."""
    sim = make_simcluster({**FAST, "rate": 20, "jobsets": [{"name": "olmo3-sft", "hosts": 1, "trainer": {"steps": 100}}],
                           "faults": [{"action": "set_rate", "at_step": 10, "steps_per_second": 20,
                                       "wait_for_reader": 3 if not reader else 60}]})
    _assert_held(sim, reader)


def test_wait_for_reader_is_seconds_on_an_at_step_fault():
    from steptail.simcluster.scenario import FaultSpec

    for bad in ({"at": 3, "wait_for_reader": 5}, {"at_step": 3, "wait_for_reader": "5"}):
        with pytest.raises(ValueError, match="`wait_for_reader` is seconds, on an `at_step` fault"):
            FaultSpec.from_dict({"action": "stall", "seconds": 1, **bad})


def _assert_held(sim, reader: bool) -> None:
    f = Follower(sim, sim.process0()) if reader else None
    try:
        held, written = _held_then_applied(sim, timeout=30)
    finally:
        if f is not None:
            f.kill()
    assert written == 10  # nothing written past the fault's step before it struck
    if reader:
        assert held < 30  # served, not waited out (its bound is 60 s)
    else:
        assert held >= 2.5
