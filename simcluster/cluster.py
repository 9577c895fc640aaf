"""The simulated cluster put together: its state, the JobSet controller that runs it, the
HTTPS Kubernetes API, the scenario's fault timeline, and the thread-safe methods tests call
(faults, ground truth, bounded waits).

Who does what (docs/simcluster.md): objects.py (pods, JobSets, Kueue Workloads, containers),
state.py (the store and watch events), controller.py (admission, pod lifecycle, trainer
output, workload faults),
logs.py (kubelet log files, rotation, log streams), api.py + discovery.py + render.py (the
Kubernetes API), faults.py (API faults), truth.py (ground truth).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import os
import secrets
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from steptail.simcluster import kube
from steptail.simcluster.api import KubeApi
from steptail.simcluster.controller import Controller
from steptail.simcluster.dbproxy import DbProxy
from steptail.simcluster.objects import CONTAINER, JobSetState, Pod
from steptail.simcluster.scenario import ACTIONS, FaultSpec, JobSetSpec, Scenario, parse_size
from steptail.simcluster.state import ClusterState
from steptail.simcluster.truth import AppliedFault, Truth, wrote_step

TICK = 0.005  # driver period: pending pods start, steps are written, logs rotate by size


class SimCluster:
    """The simulator. Create with a :class:`Scenario` (or a dict), then either
    ``await sim.start()`` in a running loop or ``sim.start_in_thread()``. Every public method
    takes the state lock, so tests may call them from any thread."""

    def __init__(
        self,
        scenario: Scenario | dict | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        state_dir: str | Path | None = None,
        kubeconfig_out: str | Path | None = None,
        account: str = "steptail-agent@steptail-sim.iam.gserviceaccount.com",
        db_proxy: DbProxy | None = None,
    ) -> None:
        if scenario is None:
            scenario = Scenario()
        elif isinstance(scenario, dict):
            scenario = Scenario.from_dict(scenario)
        self.scenario = scenario
        self.host = host
        self.port = port
        self.account = account
        self._tmp = None
        if state_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="simcluster-")
            state_dir = self._tmp.name
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.kubeconfig_path = Path(kubeconfig_out) if kubeconfig_out else self.state_dir / "kubeconfig"
        # the exec plugin (authplugin.py) reads these two files
        self.token = secrets.token_urlsafe(32)
        (self.state_dir / "token").write_text(self.token)
        (self.state_dir / "lapse_until").write_text("0")
        self.state = ClusterState(scenario)
        self.controller = Controller(self.state, self._on_step)
        self.api = KubeApi(self.state, self.token, scenario.watch_timeout_seconds)
        # sim.truth(jobset) -> [StepTruth]; sim.truth.servable(jobset) -> [LineTruth] (truth.py)
        self.truth = Truth(self.state, db_proxy)
        self._pending_faults: list[FaultSpec] = list(scenario.faults)
        # at_step faults whose step was written but not yet served (faults_wait_for_reader)
        self._waiting: list[tuple[FaultSpec, JobSetState, float]] = []
        # scenario JobSets with `start_after`: created that many seconds after the start
        self._pending_jobsets: list[JobSetSpec] = []
        self.db_proxy = db_proxy  # a started DbProxy in front of the store: `db_outage` cuts it
        self._check_faults(scenario.faults)
        self._db_restore_at: float | None = None  # time.monotonic() when a db_outage ends
        self._started_mono = 0.0
        self._tasks: list[asyncio.Task] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.server_url = ""

    @property
    def lock(self):
        return self.state.lock

    @property
    def pods(self) -> dict[tuple[str, str], Pod]:
        return self.state.pods

    @property
    def requests(self) -> list[tuple[str, str, int]]:
        """(method, path?query, status) of every API request (timeline() without the times)."""
        return [(method, url, status) for _, _, _, method, url, status in self.timeline()]

    def timeline(self) -> list[tuple[float, float, str, str, str, int]]:
        """(asked, answered, user, method, path?query, status) of every API request, times in
        seconds since the epoch (the last 10,000 to 20,000)."""
        with self.state.lock:
            return list(self.api.timeline)

    def woke_since(self, account: str, t: float) -> float | None:
        """When `account` first asked the API at or after `t` following a silence (api.WAKE_SILENCE):
        a client started at `t` is up from then. None: not yet."""
        with self.lock:
            return next((w for w in self.api.woke.get(account, []) if w >= t), None)

    @property
    def log_reads(self) -> list:
        """Every pods/log request (api.LogRead: account, pod, follow, start and end), a copy."""
        with self.lock:
            return list(self.api.log_reads)

    @property
    def namespace(self) -> str:
        return self.scenario.namespace

    # ---- lifecycle
    async def start(self) -> SimCluster:
        self._loop = asyncio.get_running_loop()
        ca, crt, key = kube.make_tls(self.state_dir / "tls", self.host)
        self.port = await self.api.listen(self.host, self.port, crt, key)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.server_url = f"https://{host}:{self.port}"
        kube.write_kubeconfig(
            self.kubeconfig_path,
            kube.kubeconfig(server=self.server_url, ca_pem=ca, state_dir=self.state_dir,
                            namespace=self.scenario.namespace),
        )
        self._started_mono = time.monotonic()
        with self.lock:
            for spec in self.scenario.jobsets:
                if spec.start_after > 0:
                    self._pending_jobsets.append(spec)
                else:
                    self.add_jobset(spec)
        self._tasks.append(asyncio.create_task(self._drive()))
        return self

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        await self.api.close()

    def start_in_thread(self, timeout: float = 20.0) -> SimCluster:
        """Run the server and driver on a private event loop in a daemon thread."""
        loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, name="simcluster", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.start(), loop).result(timeout)
        return self

    def stop_thread(self, timeout: float = 10.0) -> None:
        loop = self._loop
        if loop is None or self._thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self.stop(), loop).result(timeout)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            self._thread.join(timeout)
            if not self._thread.is_alive():
                loop.close()
            self._thread = None
            if self._tmp is not None:
                self._tmp.cleanup()
                self._tmp = None

    def __enter__(self) -> SimCluster:
        return self.start_in_thread()

    def __exit__(self, *exc) -> None:
        self.stop_thread()

    def env(self, account: bool = True, base: dict | None = None) -> dict:
        """Environment for a kubectl / client subprocess pointed at this simulator."""
        env = dict(os.environ if base is None else base)
        env["KUBECONFIG"] = str(self.kubeconfig_path)
        env.pop("CLOUDSDK_CORE_ACCOUNT", None)
        if account:
            env["CLOUDSDK_CORE_ACCOUNT"] = self.account
        return env

    # ---- driver: the controller's clock and the scenario's fault timeline
    async def _drive(self) -> None:
        while True:  # ends when stop() cancels it
            await asyncio.sleep(TICK)
            try:
                with self.lock:
                    self._tick()
            except Exception:  # pragma: no cover - keep the sim alive, surface in logs
                traceback.print_exc()

    def _tick(self) -> None:
        mono = time.monotonic()
        elapsed = mono - self._started_mono
        for spec in list(self._pending_jobsets):
            if elapsed >= spec.start_after:
                self._pending_jobsets.remove(spec)
                self.state.add_jobset(spec)
        for f in list(self._pending_faults):
            if f.at is not None and elapsed >= f.at:
                self._pending_faults.remove(f)
                self.apply_fault(f)
        for w in list(self._waiting):
            f, js, deadline = w
            if mono >= deadline or self._p0_served(js):
                self._waiting.remove(w)
                js.stalled_until = mono  # held since the step: the trainer goes on after the fault
                self.apply_fault(f)
        if self._db_restore_at is not None and mono >= self._db_restore_at:
            self._db_restore_at = None
            self.db_proxy.restore()
        self.controller.tick(mono)

    def _on_step(self, js: JobSetState, step: int) -> None:
        """`at_step` faults fire right after the step is written, the first time it is reached
        (with `faults_wait_for_reader`, or the fault's own `wait_for_reader`: once a response served
        it, the trainer held till then)."""
        for f in list(self._pending_faults):
            if f.at_step == step and (f.jobset in (None, js.spec.name)):
                self._pending_faults.remove(f)
                wait = self.scenario.faults_wait_for_reader if f.wait_for_reader is None else f.wait_for_reader
                if wait > 0 and not self._p0_served(js):
                    self._waiting.append((f, js, time.monotonic() + wait))
                    js.stalled_until = math.inf
                else:
                    self.apply_fault(f)

    def _p0_served(self, js: JobSetState) -> bool:
        """Every line process 0's running container wrote was in some log response."""
        p0 = self.state.process0(js)
        entries = p0.current.log.entries if p0 is not None and p0.instances else []
        return not entries or entries[-1].served

    # ---- faults (see docs/simcluster.md for what each does to the wire)
    def _fault_call(self, f: FaultSpec) -> tuple[Callable, tuple, dict]:
        """The method a scenario fault is and its arguments: each action is the method of its
        name, given the scenario's JobSet when it takes one (a `jobset` parameter)."""
        if f.action not in ACTIONS:
            raise ValueError(f"unknown fault action {f.action!r}")
        act = getattr(self, f.action)
        if "jobset" in inspect.signature(act).parameters:
            return act, (), {**f.params, "jobset": f.jobset}
        return act, (), dict(f.params)

    def _check_faults(self, faults: list[FaultSpec]) -> None:
        """A fault that cannot run fails at construction, not silently in the driver later."""
        for f in faults:
            act, args, kw = self._fault_call(f)
            try:
                inspect.signature(act).bind(*args, **kw)
            except TypeError as e:
                raise ValueError(f"fault {f.action!r}: {e} (params {f.params})") from None
            if f.action in ("db_outage", "db_restore") and self.db_proxy is None:
                raise ValueError(f"fault {f.action!r} needs SimCluster(db_proxy=DbProxy(...))")

    def apply_fault(self, f: FaultSpec) -> None:
        """Apply one scenario fault now and record it (sim.truth.faults()); one that fails
        (e.g. delete_pod of a pod gone meanwhile) is recorded with its error and printed, and
        the driver goes on."""
        act, args, kw = self._fault_call(f)
        rec = AppliedFault(f.action, f.jobset, dict(f.params), time.time_ns(), f.at, f.at_step)
        try:
            act(*args, **kw)
        except Exception as e:  # noqa: BLE001 - any failure of a fault is its record, not the driver's end
            rec.error = f"{type(e).__name__}: {e}"
            print(f"simcluster: fault {f.action} {f.params} failed: {rec.error}", file=sys.stderr, flush=True)
        with self.lock:
            self.state.applied.append(rec)

    def write_lines(self, jobset: str | None = None, lines: list[str] = ()) -> None:
        """Process 0 prints these lines as they are (hostile input: values no store can hold,
        NUL, absurd steps), each with the kubelet's timestamp of now."""
        with self.lock:
            self.controller.write_lines(self.state.jobset(jobset), lines)

    def garbage(self, jobset: str | None = None, lines: int = 10, size: int = 200, seed: int = 0) -> None:
        """Process 0 prints `lines` lines of `size` random bytes (binary garbage: invalid UTF-8,
        control bytes; no newline inside), the same for the same `seed`."""
        import random

        rnd = random.Random(seed)
        texts = [rnd.randbytes(size).replace(b"\n", b"\x00").replace(b"\r", b"\x00").decode("utf-8", "surrogateescape")
                 for _ in range(lines)]
        self.write_lines(jobset, texts)

    def endless_line(self, jobset: str | None = None, bytes: int | str = "64Mi") -> None:
        """Process 0 prints `bytes` of one line and never its newline: whatever it prints after
        continues that line on the wire (a read ends it only at EOF)."""
        n = parse_size(bytes)
        with self.lock:
            p = self.state.process0(self.state.jobset(jobset))
            if p is not None and p.current.state == "running":
                p.current.log.write("x" * n).unterminated = True

    def flood(self, jobset: str | None = None, bytes: int | str = "1Mi", pod: str | None = None,
              all_pods: bool = False) -> None:
        """Process 0 (or `pod`, or every running pod) prints `bytes` (e.g. `20Mi`) of XLA debug
        output at once: big logs, fast (benchmarks/archive.py)."""
        n = parse_size(bytes)
        with self.lock:
            self.controller.flood(self.state.jobset(jobset), n, pod, all_pods)

    def delete_pod(self, pod: str | None = None, grace_seconds: float = 0.0, namespace: str | None = None,
                   jobset: str | None = None) -> None:
        """`kubectl delete pod`: being deleted (log readable) for `grace_seconds`, then gone (404).
        Without `pod`: the current process 0 of `jobset` (a scenario can name no pod otherwise)."""
        with self.lock:
            if pod is None:
                p0 = self.state.process0(self.state.jobset(jobset))
                if p0 is None:
                    return
                pod, namespace = p0.name, p0.namespace
            self.controller.delete_pod(namespace or self.scenario.namespace, pod, grace_seconds)

    def rotate(self, jobset: str | None = None, pod: str | None = None, all_pods: bool = False) -> None:
        """Rotate the current log file of process 0 (or `pod`, or every pod): open follow
        streams go silent without EOF; later reads serve only the new current file."""
        with self.lock:
            self.controller.rotate(self.state.jobset(jobset), pod, all_pods)

    def restart_jobset(self, jobset: str | None = None, pending_seconds: float | None = None,
                       grace_seconds: float | None = None, head_rotated: int | None = None) -> None:
        """Preempt: old pods get a deletionTimestamp (logs readable for the grace period, then
        DELETED), new pods with new names and restart-attempt + 1 are ADDED (Pending for
        pending_seconds), and the trainer resumes from its last checkpoint. `head_rotated: N`:
        the new process 0's log rotates once it printed its start-up lines and N steps (0: the
        start-up lines alone), in the same tick, so no follower can have read that head."""
        with self.lock:
            grace = self.scenario.grace_seconds if grace_seconds is None else grace_seconds
            pend = self.scenario.restart_pending_seconds if pending_seconds is None else pending_seconds
            self.controller.restart_jobset(self._live(jobset), pend, grace, head_rotated)

    def restart_container(self, jobset: str | None = None, pod: str | None = None,
                          container: str = CONTAINER, head_rotated: int | None = None) -> None:
        """Restart a container in place (default: process 0's): restartCount + 1, the old
        output is served with previous=true; process 0's trainer resumes from its checkpoint.
        `head_rotated` as for restart_jobset."""
        with self.lock:
            self.controller.restart_container(self._live(jobset), pod, head_rotated)

    def stamp_skew(self, jobset: str | None = None, micros: int = 1, every: int = 1,
                   steps: int | None = None) -> None:
        """For the next `steps` steps (None: the rest of the run), every `every`-th step's
        LOSS-PARTS line is stamped `micros` µs before the line written just before it, as
        containerd's separate stdout/stderr stamping does (moby/moby#31706)."""
        with self.lock:
            self.controller.stamp_skew(self.state.jobset(jobset), micros, every, steps)

    def clock_step(self, jobset: str | None = None, seconds: float = -2.0, pod: str | None = None) -> None:
        """Process 0's (or `pod`'s) node clock steps by `seconds` (negative: back, as NTP does):
        every later stamp of that pod is offset, so stamps go back once."""
        with self.lock:
            self.controller.clock_step(self.state.jobset(jobset), seconds, pod)

    def repeat_lines(self, jobset: str | None = None, lines: int = 40, age: float = 10.0) -> int:
        """Process 0's log serves again a block of `lines` lines written about `age` seconds ago
        (the oldest it has, if younger), unchanged — kubelet stamp and text — after the lines
        it holds now: a repeat older than any window a follower keeps (the live twin of two
        overlapping captures joined into one file). Returns how many lines were repeated."""
        with self.lock:
            return self.controller.repeat_lines(self.state.jobset(jobset), int(lines), float(age))

    def stall(self, jobset: str | None = None, seconds: float = 5.0) -> None:
        """The trainer writes nothing for `seconds` (pods keep running)."""
        with self.lock:
            self.controller.stall(self.state.jobset(jobset), seconds)

    def set_rate(self, jobset: str | None = None, steps_per_second: float = 1.0) -> None:
        with self.lock:
            self.controller.set_rate(self.state.jobset(jobset), steps_per_second)

    def _live(self, jobset: str | None) -> JobSetState:
        js = self.state.jobset(jobset)
        if js.deleted:
            raise KeyError(f"JobSet {js.spec.name!r} was deleted")
        return js

    def set_image(self, jobset: str | None = None, *, image: str) -> None:
        """The JobSet's pod template gets `image` (spec.replicatedJobs[].template…image, generation
        + 1): pods created after it — the next restart_jobset — run that image (and report its
        imageID); the current pods keep theirs. A resume on another image."""
        with self.lock:
            self.controller.set_image(self._live(jobset), image)

    def suspend(self, jobset: str | None = None) -> None:
        """spec.suspend: true on the JobSet (MODIFIED); its Kueue Workload stays admitted and
        active and its pods keep running: suspending an admitted JobSet does nothing."""
        with self.lock:
            self.controller.suspend(self._live(jobset))

    def fail_jobset(self, jobset: str | None = None, reap_after: float = 30.0) -> None:
        """Every pod of the JobSet goes Failed (container exit code 1, reason Error; `kubectl
        logs` still serves it), the JobSet gets a Failed condition and terminalState Failed,
        its Workload Finished (reason Failed); `reap_after` seconds later the JobSet, its
        Workload and its pods are deleted (DELETED; logs gone, 404)."""
        with self.lock:
            self.controller.fail_jobset(self._live(jobset), reap_after)

    def auth_lapse(self, seconds: float) -> None:
        """For `seconds`: the exec plugin fails like gke-gcloud-auth-plugin and the server
        answers 401 to every request."""
        with self.lock:
            faults = self.state.faults
            faults.lapse_until = time.time() + seconds
            faults.record("auth_lapse", seconds)
            (self.state_dir / "lapse_until").write_text(repr(faults.lapse_until))

    def fail_next(self, n: int = 1, code: int = 503, path: str | None = "/pods",
                  retry_after: int | None = None) -> None:
        """The next `n` requests whose path contains `path` (None = any) fail with `code`;
        `retry_after`: their Status carries `retryAfterSeconds` and a `Retry-After` header (as
        the apiserver's 429 from Priority and Fairness; client-go retries those by itself)."""
        with self.lock:
            self.state.faults.queue_failures(n, code, path, retry_after)

    def throttle(self, seconds: float = 5.0, path: str | None = None, retry_after: int = 1) -> None:
        """For `seconds`, every request whose path and query contain `path` (None: any) gets 429
        TooManyRequests with `Retry-After: retry_after`, as API Priority and Fairness rejects
        while a priority level is saturated: for a span of time, however often a client asks."""
        with self.lock:
            self.state.faults.add_throttle(seconds, path, retry_after)

    def deny(self, seconds: float | None = None, user: str | None = None) -> None:
        """For `seconds` (None: from now on) pod list and watch requests get 403 Forbidden with
        the Status body RBAC gives a service account without the Role (deploy/rbac.yaml)."""
        with self.lock:
            faults = self.state.faults
            faults.deny_until = math.inf if seconds is None else time.time() + float(seconds)
            faults.deny_user = user or f"system:serviceaccount:{self.scenario.namespace}:steptail"
            faults.record("deny", seconds, user=faults.deny_user)

    def corrupt_pods(self, seconds: float = 5.0) -> None:
        """For `seconds` pods served by list and watch carry a creationTimestamp that is not
        RFC 3339: the kubernetes Python client cannot deserialize them (kubectl's tables and
        single-pod reads stay intact)."""
        with self.lock:
            self.state.faults.corrupt_until = time.time() + float(seconds)
            self.state.faults.record("corrupt_pods", seconds)

    def slow_api(self, seconds: float = 5.0, delay: float = 2.0, path: str | None = None) -> None:
        """For `seconds`, every request whose path and query contain `path` (None: any) is answered
        `delay` seconds late (an overloaded apiserver or kubelet)."""
        with self.lock:
            self.state.faults.add_slow(seconds, delay, path)

    def hang_api(self, seconds: float = 5.0, path: str | None = None, streams: bool = False) -> None:
        """For `seconds`, requests whose path and query contain `path` (None: any; e.g.
        "watch=true") get no answer at all until the fault ends (then they are served, if the
        client still waits); `streams`: open follow and watch streams of that path send
        nothing meanwhile either."""
        with self.lock:
            self.state.faults.add_hang(seconds, path, streams)

    def watch_gone(self, mode: str = "expired") -> None:
        """Watches fail. `expired`: every open watch gets an `ERROR` event carrying a Status 410
        `Expired` ("too old resource version") and ends, and the event history is compacted: a
        new watch from an older resourceVersion gets the same at once (relist needed).
        `drop`: every open watch's connection is dropped (no final chunk, no event)."""
        if mode not in ("expired", "drop"):
            raise ValueError(f"watch_gone mode must be 'expired' or 'drop', got {mode!r}")
        with self.lock:
            faults = self.state.faults
            faults.record("watch_gone", 0, mode=mode)
            if mode == "expired":
                faults.gone_gen += 1
                faults.compacted_rv = self.state.rv
            else:
                faults.watch_drop_gen += 1

    def db_outage(self, seconds: float | None = 10.0, mode: str = "refuse", existing: str = "close") -> None:
        """The database goes away for `seconds` (None: until db_restore; 0: a restart — every
        connection reset, new ones welcome at once) through the DbProxy the simulator was given:
        live connections reset (existing="stall": hang), new ones refused or blackholed (`mode`)."""
        if self.db_proxy is None:
            raise RuntimeError("db_outage needs SimCluster(db_proxy=DbProxy(...)) started")
        with self.lock:
            self.db_proxy.cut(mode, existing)
            self._db_restore_at = None if seconds is None else time.monotonic() + float(seconds)
            if seconds == 0:
                self._db_restore_at = None
                self.db_proxy.restore()

    def db_restore(self) -> None:
        """End a db_outage now."""
        with self.lock:
            self._db_restore_at = None
            self.db_proxy.restore()

    def eof_streams(self, abort: bool = False) -> None:
        """End every open follow/watch stream cleanly (like an idle timeout or apiserver
        restart); `abort`: drop their connections instead (no final chunk: a reset)."""
        with self.lock:
            faults = self.state.faults
            faults.record("eof_streams", 0, abort=abort or None)
            if abort:
                faults.abort_gen += 1
            else:
                faults.eof_gen += 1

    # ---- JobSets, ground truth, bounded waits
    def add_jobset(self, spec: JobSetSpec | dict) -> JobSetState:
        """Create a JobSet now (its Workload, and its pods Pending for spec.pending_seconds, or
        none until admitted after spec.queued_seconds); `start_after` applies only to the
        scenario's JobSets."""
        if isinstance(spec, dict):
            spec = JobSetSpec.from_dict(spec)
        with self.lock:
            return self.state.add_jobset(spec)

    def process0(self, jobset: str | None = None) -> str | None:
        with self.lock:
            p = self.state.process0(self.state.jobset(jobset))
            return p.name if p else None

    def pod_names(self, jobset: str | None = None) -> list[str]:
        with self.lock:
            return [p.name for p in self.state.jobset_pods(self.state.jobset(jobset))]

    def jobset_state(self, jobset: str | None = None) -> JobSetState:
        return self.state.jobset(jobset)

    def last_step(self, jobset: str | None = None) -> int:
        with self.lock:
            return self.state.jobset(jobset).last_step

    def _not_yet(self, jobset: str | None) -> bool:
        """A scenario JobSet whose `start_after` has not come yet (no live JobSet of that name)."""
        return jobset is not None and any(s.name == jobset for s in self._pending_jobsets) \
            and not any(n == jobset for _, n in self.state.jobsets)

    def wait_step(self, step: int, jobset: str | None = None, timeout: float = 20.0,
                  incarnation: int | None = None) -> None:
        """Block (bounded) until the trainer wrote `step` (in `incarnation` if given)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                js = None if self._not_yet(jobset) else self.state.jobset(jobset)
                if js is not None and js.last_step >= step and (incarnation is None or js.incarnation >= incarnation):
                    if incarnation is None or wrote_step(self.state, js, incarnation, step):
                        return
                if js is not None and js.state in ("done", "failed") and incarnation is None:
                    return
            time.sleep(0.01)
        raise TimeoutError(f"step {step} not reached within {timeout}s")

    def wait_done(self, jobset: str | None = None, timeout: float = 30.0) -> None:
        """Block (bounded) until the JobSet completed (or failed: fail_jobset)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if not self._not_yet(jobset) and self.state.jobset(jobset).state in ("done", "failed"):
                    return
            time.sleep(0.01)
        raise TimeoutError("JobSet did not finish")

    def log_lines(self, pod: str, namespace: str | None = None, previous: bool = False,
                  current_file_only: bool = True) -> list[tuple[str, str]]:
        """(timestamp, text) of a container instance's log as stored (for comparisons)."""
        with self.lock:
            p = self.state.pods[(namespace or self.scenario.namespace, pod)]
            inst = p.previous if previous else p.current
            if inst is None:
                return []
            log = inst.log
            start = log.cur_start if current_file_only else log.base
            return [(e.ts, e.text) for i in range(start, log.end) if (e := log.get(i))]


def run_in_thread(scenario: Scenario | dict | None = None, **kw) -> SimCluster:
    """Start a simulator on a background thread; stop it with ``sim.stop_thread()``."""
    return SimCluster(scenario, **kw).start_in_thread()
