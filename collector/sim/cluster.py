"""The simulated cluster: state (JobSets, pods, kubelet-style container logs), the trainer
driver, faults, ground truth, and the HTTPS Kubernetes API server (aiohttp).

All mutable state is guarded by one re-entrant lock, so the fault API can be called from
any thread (a test's thread while the server runs in :func:`run_in_thread`) or from the
server's own event loop. Streams (log follow, watch) poll the state every few ms.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import secrets
import ssl
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web

from collector.sim import kube
from collector.sim.scenario import FaultSpec, JobSetSpec, Scenario
from collector.sim.trainer import Trainer

CONTAINER = "jax-tpu"
IMAGE = "us-docker.pkg.dev/steptail-sim/maxtext/maxtext-tpu:sim"
POLL = 0.01


def _now_ns() -> int:
    return time.time_ns()


# ---- container logs ------------------------------------------------------------------------


@dataclass
class Entry:
    """One line as kubelet stored it."""

    ts_ns: int
    ts: str  # RFC3339Nano, kubelet style
    text: str
    file_gen: int  # which log file (0 = first) holds it
    served: bool = False  # included in at least one API response
    key: tuple | None = None  # (incarnation, step, kind) for trainer lines


class ContainerLog:
    """The log files of one container instance (pod uid, container, restart count), with
    kubelet rotation: `current` file + up to max_files-1 rotated files; only the current file
    is served by the logs endpoint (kubelet's ReadLogs opens the current path only)."""

    def __init__(self, max_size: int, max_files: int) -> None:
        self.max_size = max_size
        self.max_files = max_files
        self.entries: list[Entry] = []
        self.base = 0  # absolute index of entries[0] (older files were removed)
        self.gen = 0  # current file generation
        self.file_starts = [0]  # absolute start index of each generation
        self.cur_size = 0
        self.last_ts = 0
        self.terminated = False  # container exited: follow streams end at EOF
        self.rotations = 0

    @property
    def end(self) -> int:
        return self.base + len(self.entries)

    @property
    def cur_start(self) -> int:
        return self.file_starts[self.gen]

    def file_end(self, gen: int) -> int:
        return self.file_starts[gen + 1] if gen + 1 < len(self.file_starts) else self.end

    def write(self, text: str, ts_ns: int | None = None, key: tuple | None = None) -> Entry:
        ts_ns = max(ts_ns or _now_ns(), self.last_ts)
        self.last_ts = ts_ns
        e = Entry(ts_ns, kube.rfc3339nano(ts_ns), text, self.gen, key=key)
        self.entries.append(e)
        # CRI line: "<ts> stdout F <text>\n"
        self.cur_size += len(e.ts) + 10 + len(text.encode("utf-8", "replace")) + 1
        return e

    def get(self, idx: int) -> Entry | None:
        i = idx - self.base
        return self.entries[i] if 0 <= i < len(self.entries) else None

    def rotate(self) -> None:
        self.gen += 1
        self.file_starts.append(self.end)
        self.cur_size = 0
        self.rotations += 1
        # keep current + (max_files - 1) rotated files
        keep_from_gen = max(0, self.gen - (self.max_files - 1))
        cut = self.file_starts[keep_from_gen]
        if cut > self.base:
            del self.entries[: cut - self.base]
            self.base = cut

    def maybe_rotate(self) -> bool:
        if self.max_size > 0 and self.cur_size > self.max_size:
            self.rotate()
            return True
        return False


# ---- pods and JobSets ----------------------------------------------------------------------


@dataclass
class ContainerInstance:
    restart_count: int
    log: ContainerLog
    state: str = "waiting"  # waiting | running | terminated
    reason: str = "ContainerCreating"
    started_ns: int = 0
    finished_ns: int = 0
    exit_code: int = 0
    container_id: str = field(default_factory=lambda: "containerd://" + secrets.token_hex(32))


@dataclass
class Pod:
    name: str
    namespace: str
    uid: str
    labels: dict
    jobset: str
    job_name: str
    created_ns: int
    node: str
    process_index: int
    phase: str = "Pending"
    resource_version: int = 0
    deletion_ns: int | None = None
    grace_seconds: int = 0
    start_ns: int | None = None
    instances: list[ContainerInstance] = field(default_factory=list)

    @property
    def current(self) -> ContainerInstance:
        return self.instances[-1]

    @property
    def previous(self) -> ContainerInstance | None:
        return self.instances[-2] if len(self.instances) >= 2 else None


@dataclass
class JobSetState:
    spec: JobSetSpec
    uid: str
    created_ns: int
    trainer: Trainer
    restart_attempt: int = 0
    incarnation: int = 0
    state: str = "pending"  # pending | running | done
    pending_until: float = 0.0
    next_step: int = 1
    next_step_at: float = 0.0
    interval: float = 0.02
    stalled_until: float = 0.0
    resume_from: int = 0
    last_step: int = 0
    pods: list[str] = field(default_factory=list)
    resource_version: int = 0


@dataclass
class StepTruth:
    """Ground truth for one (incarnation, step) the process-0 trainer wrote."""

    incarnation: int
    step: int
    ce: float
    rbf_max: float | None
    pod: str
    pod_uid: str
    container: str
    restart_count: int
    timestamp: str  # kubelet timestamp of the LOSS-PARTS line
    loss_parts: str
    retrievable: bool  # still served by the logs endpoint (current or previous, current file)
    rotated: bool  # its file was rotated away (not served any more)
    served: bool  # some API response included it
    rotated_unread: bool  # rotated away before any response served it


class SimCluster:
    """The simulator. Create with a :class:`Scenario` (or a dict), then either
    ``await sim.start()`` in a running loop or ``sim.start_in_thread()``."""

    def __init__(
        self,
        scenario: Scenario | dict | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        state_dir: str | Path | None = None,
        kubeconfig_out: str | Path | None = None,
        account: str = "steptail-agent@steptail-sim.iam.gserviceaccount.com",
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
        self.token = secrets.token_urlsafe(32)
        (self.state_dir / "token").write_text(self.token)
        (self.state_dir / "lapse_until").write_text("0")
        self.lock = threading.RLock()
        self.rv = 1000
        self.events: list[tuple[int, str, str, dict]] = []  # (rv, kind, type, object)
        self.pods: dict[tuple[str, str], Pod] = {}
        self.jobsets: dict[tuple[str, str], JobSetState] = {}
        self.truth_index: dict[str, list[tuple[tuple, Pod, ContainerInstance, Entry]]] = {}
        self.requests: list[tuple[str, str, int]] = []
        self._fail_queue: list[tuple[int, str | None]] = []
        self._lapse_until = 0.0
        self._deny_until = 0.0  # pod list/watch answered 403 Forbidden until then (time.time())
        self._deny_user = ""
        self._corrupt_until = 0.0  # pods in list/watch undeserializable until then
        self._eof_gen = 0
        self._rng = random.Random(scenario.seed)
        self._closing = False
        self._started_mono = 0.0
        self._pending_faults: list[FaultSpec] = list(scenario.faults)
        self._runner: web.AppRunner | None = None
        self._tasks: list[asyncio.Task] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.server_url = ""

    # ================================================================== lifecycle
    async def start(self) -> SimCluster:
        self._loop = asyncio.get_running_loop()
        ca, crt, key = kube.make_tls(self.state_dir / "tls", self.host)
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(str(crt), str(key))
        ctx.set_alpn_protocols(["http/1.1"])
        app = web.Application(middlewares=[self._middleware])
        self._routes(app)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True,
                                      shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, ssl_context=ctx)
        await site.start()
        sock = site._server.sockets[0]  # type: ignore[union-attr]
        self.port = sock.getsockname()[1]
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.server_url = f"https://{host}:{self.port}"
        kube.write_kubeconfig(
            self.kubeconfig_path,
            kube.kubeconfig(
                server=self.server_url,
                ca_pem=ca,
                state_dir=self.state_dir,
                namespace=self.scenario.namespace,
            ),
        )
        self._started_mono = time.monotonic()
        with self.lock:
            for spec in self.scenario.jobsets:
                self.add_jobset(spec)
        self._tasks.append(asyncio.create_task(self._driver()))
        return self

    async def stop(self) -> None:
        self._closing = True
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        if self._runner is not None:
            await self._runner.cleanup()
        self._runner = None

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

    @property
    def namespace(self) -> str:
        return self.scenario.namespace

    def env(self, account: bool = True, base: dict | None = None) -> dict:
        """Environment for a kubectl / client subprocess pointed at this simulator."""
        import os

        env = dict(os.environ if base is None else base)
        env["KUBECONFIG"] = str(self.kubeconfig_path)
        env.pop("CLOUDSDK_CORE_ACCOUNT", None)
        if account:
            env["CLOUDSDK_CORE_ACCOUNT"] = self.account
        return env

    # ================================================================== model helpers
    def _bump(self) -> int:
        self.rv += 1
        return self.rv

    def _emit(self, kind: str, typ: str, obj: dict) -> None:
        self.events.append((int(obj["metadata"]["resourceVersion"]), kind, typ, obj))

    def _pod_event(self, pod: Pod, typ: str) -> None:
        pod.resource_version = self._bump()
        self._emit("pods", typ, self.pod_json(pod))

    def _js_event(self, js: JobSetState, typ: str) -> None:
        js.resource_version = self._bump()
        self._emit("jobsets", typ, self.jobset_json(js))

    def _suffix(self) -> str:
        return "".join(self._rng.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(5))

    def add_jobset(self, spec: JobSetSpec | dict) -> JobSetState:
        """Create a JobSet (and its pods, Pending for spec.pending_seconds)."""
        if isinstance(spec, dict):
            spec = JobSetSpec.from_dict(spec)
        with self.lock:
            tr = Trainer(**{"process_count": spec.slices * spec.hosts, **spec.trainer})
            js = JobSetState(
                spec=spec,
                uid=str(uuid.uuid4()),
                created_ns=_now_ns(),
                trainer=tr,
                interval=1.0 / spec.rate if spec.rate > 0 else math.inf,
            )
            self.jobsets[(spec.namespace, spec.name)] = js
            self.truth_index.setdefault(spec.name, [])
            self._js_event(js, "ADDED")
            self._create_pods(js, spec.pending_seconds)
            return js

    def _create_pods(self, js: JobSetState, pending_seconds: float) -> None:
        spec = js.spec
        js.pods = []
        js.state = "pending"
        js.pending_until = time.monotonic() + pending_seconds
        now = _now_ns()
        for ji in range(spec.slices):
            job_name = f"{spec.name}-{spec.replicated_job}-{ji}"
            for ci in range(spec.hosts):
                gi = ji * spec.hosts + ci
                name = f"{job_name}-{ci}-{self._suffix()}"
                labels = {
                    "jobset.sigs.k8s.io/jobset-name": spec.name,
                    "jobset.sigs.k8s.io/replicatedjob-name": spec.replicated_job,
                    "jobset.sigs.k8s.io/job-index": str(ji),
                    "jobset.sigs.k8s.io/job-global-index": str(ji),
                    "jobset.sigs.k8s.io/restart-attempt": str(js.restart_attempt),
                    "jobset.sigs.k8s.io/replicatedjob-replicas": str(spec.slices),
                    "batch.kubernetes.io/job-completion-index": str(ci),
                    "batch.kubernetes.io/job-name": job_name,
                    "job-name": job_name,
                    "batch.kubernetes.io/controller-uid": str(uuid.UUID(int=self._rng.getrandbits(128))),
                }
                pod = Pod(
                    name=name,
                    namespace=spec.namespace,
                    uid=str(uuid.uuid4()),
                    labels=labels,
                    jobset=spec.name,
                    job_name=job_name,
                    created_ns=now,
                    node=f"gke-tpu-{spec.name[:12]}-{gi:02d}-{self._suffix()}",
                    process_index=gi,
                )
                pod.instances.append(ContainerInstance(0, self._new_log()))
                self.pods[(pod.namespace, name)] = pod
                js.pods.append(name)
                self._pod_event(pod, "ADDED")

    def _new_log(self) -> ContainerLog:
        return ContainerLog(self.scenario.log_max_size, self.scenario.log_max_files)

    def _js_pods(self, js: JobSetState) -> list[Pod]:
        return [p for n in js.pods if (p := self.pods.get((js.spec.namespace, n)))]

    def _process0(self, js: JobSetState) -> Pod | None:
        for p in self._js_pods(js):
            if p.process_index == 0:
                return p
        return None

    def _start_pods(self, js: JobSetState) -> None:
        now = _now_ns()
        js.incarnation += 1
        js.state = "running"
        js.next_step_at = time.monotonic() + js.interval
        for p in self._js_pods(js):
            p.phase = "Running"
            p.start_ns = p.start_ns or now
            inst = p.current
            inst.state, inst.reason, inst.started_ns = "running", "", now
            self._write_startup(js, p)
            self._pod_event(p, "MODIFIED")
        self._js_event(js, "MODIFIED")

    def _write_startup(self, js: JobSetState, p: Pod) -> None:
        log = p.current.log
        at = datetime.now(UTC)
        if p.process_index == 0:
            restore = js.resume_from if js.incarnation > 1 else None
            for line in js.trainer.startup_lines(restore_from=restore, at=at):
                log.write(line)
            js.next_step = js.resume_from + 1 if js.incarnation > 1 else 1
        else:
            other = Trainer(**{**js.spec.trainer, "process_index": p.process_index,
                               "process_count": js.spec.slices * js.spec.hosts})
            for line in other.startup_lines(at=at)[:2]:
                log.write(line)

    def _write_step(self, js: JobSetState, step: int) -> None:
        at = datetime.now(UTC)
        for p in self._js_pods(js):
            inst = p.current
            if inst.state != "running" or p.deletion_ns is not None:
                continue
            log = inst.log
            if p.process_index == 0:
                lines = js.trainer.step_lines(step, js.incarnation, at=at)
                ts = _now_ns()
                for line in lines:
                    kind = None
                    if "LOSS-PARTS" in line:
                        kind = "loss"
                    elif "REQUIRED_RBF" in line:
                        kind = "rbf"
                    # the step's tagged burst shares one kubelet timestamp
                    e = log.write(line, ts_ns=ts if kind or "completed step" in line else None,
                                  key=(js.incarnation, step, kind) if kind else None)
                    if kind == "loss":
                        self.truth_index[js.spec.name].append(((js.incarnation, step), p, inst, e))
            else:
                # other pods print only noise and their per-pod completed step
                other = self._other_trainer(js, p.process_index)
                for line in other.step_lines(step, js.incarnation, at=at, record=False):
                    log.write(line)
        js.last_step = step

    def _other_trainer(self, js: JobSetState, index: int) -> Trainer:
        cache = js.__dict__.setdefault("_others", {})
        if index not in cache:
            cache[index] = Trainer(**{**js.spec.trainer, "process_index": index,
                                      "process_count": js.spec.slices * js.spec.hosts})
        return cache[index]

    def _finish(self, js: JobSetState) -> None:
        js.state = "done"
        now = _now_ns()
        for p in self._js_pods(js):
            inst = p.current
            if inst.state == "running":
                inst.state, inst.reason, inst.finished_ns, inst.exit_code = "terminated", "Completed", now, 0
                inst.log.terminated = True
                p.phase = "Succeeded"
                self._pod_event(p, "MODIFIED")
        self._js_event(js, "MODIFIED")

    # ================================================================== driver
    async def _driver(self) -> None:
        while not self._closing:
            await asyncio.sleep(POLL / 2)
            try:
                with self.lock:
                    self._tick()
            except Exception:  # pragma: no cover - keep the sim alive, surface in logs
                import traceback

                traceback.print_exc()

    def _tick(self) -> None:
        mono = time.monotonic()
        elapsed = mono - self._started_mono
        for f in list(self._pending_faults):
            if f.at is not None and elapsed >= f.at:
                self._pending_faults.remove(f)
                self.apply_fault(f)
        now_ns = _now_ns()
        for p in list(self.pods.values()):
            if p.deletion_ns is not None and now_ns >= p.deletion_ns:
                del self.pods[(p.namespace, p.name)]
                p.resource_version = self._bump()
                self._emit("pods", "DELETED", self.pod_json(p))
        for js in list(self.jobsets.values()):
            if js.state == "pending" and mono >= js.pending_until:
                self._start_pods(js)
            if js.state != "running":
                continue
            n = 0
            while js.state == "running" and mono >= js.next_step_at and mono >= js.stalled_until and n < 50:
                step = js.next_step
                if step > js.trainer.steps:
                    self._finish(js)
                    break
                self._write_step(js, step)
                js.next_step += 1
                js.next_step_at = max(js.next_step_at + js.interval, mono - js.interval)
                n += 1
                for f in list(self._pending_faults):
                    if f.at_step == step and (f.jobset in (None, js.spec.name)):
                        self._pending_faults.remove(f)
                        self.apply_fault(f)
                if js.state == "running" and js.next_step > js.trainer.steps:
                    self._finish(js)
            for p in self._js_pods(js):
                for inst in p.instances:
                    inst.log.maybe_rotate()

    # ================================================================== faults (public API)
    def _js(self, jobset: str | None) -> JobSetState:
        if jobset is None:
            return next(iter(self.jobsets.values()))
        for (_ns, name), js in self.jobsets.items():
            if name == jobset:
                return js
        raise KeyError(f"no JobSet {jobset!r}")

    def apply_fault(self, f: FaultSpec) -> None:
        """Apply one scenario fault now (see docs/simcluster.md for the actions)."""
        a, kw = f.action, dict(f.params)
        if a == "rotate":
            self.rotate(f.jobset, **kw)
        elif a == "restart_jobset":
            self.restart_jobset(f.jobset, **kw)
        elif a == "restart_container":
            self.restart_container(f.jobset, **kw)
        elif a == "auth_lapse":
            self.auth_lapse(**kw)
        elif a == "fail_next":
            self.fail_next(**kw)
        elif a == "eof_streams":
            self.eof_streams()
        elif a == "stall":
            self.stall(f.jobset, **kw)
        elif a == "set_rate":
            self.set_rate(f.jobset, **kw)
        elif a == "deny":
            self.deny(**kw)
        elif a == "corrupt_pods":
            self.corrupt_pods(**kw)
        elif a == "write_lines":
            self.write_lines(f.jobset, **kw)
        else:
            raise ValueError(f"unknown fault action {a!r}")

    def write_lines(self, jobset: str | None = None, lines: list[str] = ()) -> None:
        """Process 0 prints these lines as they are (hostile input: values no store can hold,
        NUL, absurd steps), each with the kubelet's timestamp of now."""
        with self.lock:
            p = self._process0(self._js(jobset))
            if p is not None and p.current.state == "running":
                for line in lines:
                    p.current.log.write(line)

    def rotate(self, jobset: str | None = None, pod: str | None = None, all_pods: bool = False) -> None:
        """Rotate the current log file of process 0 (or `pod`, or every pod): open follow
        streams go silent without EOF; later reads serve only the new current file."""
        with self.lock:
            js = self._js(jobset)
            if pod is not None:
                targets = [self.pods[(js.spec.namespace, pod)]]
            elif all_pods:
                targets = self._js_pods(js)
            else:
                targets = [p for p in [self._process0(js)] if p]
            for p in targets:
                p.current.log.rotate()

    def restart_jobset(self, jobset: str | None = None, pending_seconds: float | None = None,
                       grace_seconds: float | None = None) -> None:
        """Preempt: old pods get a deletionTimestamp (logs readable for the grace period, then
        DELETED), new pods with new names and restart-attempt + 1 are ADDED (Pending for
        pending_seconds), and the trainer resumes from its last checkpoint."""
        with self.lock:
            js = self._js(jobset)
            grace = self.scenario.grace_seconds if grace_seconds is None else grace_seconds
            pend = self.scenario.restart_pending_seconds if pending_seconds is None else pending_seconds
            now = _now_ns()
            p0 = self._process0(js)
            if p0 is not None and p0.current.state == "running":
                for line in js.trainer.preemption_lines():
                    p0.current.log.write(line)
            for p in self._js_pods(js):
                inst = p.current
                if inst.state == "running":
                    inst.state, inst.reason, inst.finished_ns, inst.exit_code = "terminated", "Error", now, 137
                inst.log.terminated = True
                p.deletion_ns = now + int(grace * 1e9)
                p.grace_seconds = int(math.ceil(grace))
                self._pod_event(p, "MODIFIED")
            js.resume_from = js.trainer.last_checkpoint(js.last_step) if js.state != "pending" else js.resume_from
            js.restart_attempt += 1
            self._create_pods(js, pend)
            self._js_event(js, "MODIFIED")

    def restart_container(self, jobset: str | None = None, pod: str | None = None,
                          container: str = CONTAINER) -> None:
        """Restart a container in place (default: process 0's): restartCount + 1, the old
        output is served with previous=true; process 0's trainer resumes from its checkpoint."""
        with self.lock:
            js = self._js(jobset)
            p = self.pods[(js.spec.namespace, pod)] if pod else self._process0(js)
            if p is None:
                raise KeyError("no such pod")
            old = p.current
            now = _now_ns()
            if p.process_index == 0 and old.state == "running":
                for line in js.trainer.preemption_lines():
                    old.log.write(line)
            old.state, old.reason, old.finished_ns, old.exit_code = "terminated", "Error", now, 1
            old.log.terminated = True
            new = ContainerInstance(old.restart_count + 1, self._new_log(), "running", "", now)
            p.instances.append(new)
            if len(p.instances) > 2:  # kubelet keeps only the last dead container
                p.instances = p.instances[-2:]
            if p.process_index == 0 and js.state == "running":
                js.resume_from = js.trainer.last_checkpoint(js.last_step)
                js.incarnation += 1
                self._write_startup(js, p)
                js.next_step_at = time.monotonic() + js.interval
            elif js.state == "running":
                self._write_startup(js, p)
            self._pod_event(p, "MODIFIED")

    def auth_lapse(self, seconds: float) -> None:
        """For `seconds`: the exec plugin fails like gke-gcloud-auth-plugin and the server
        answers 401 to every request."""
        with self.lock:
            self._lapse_until = time.time() + seconds
            (self.state_dir / "lapse_until").write_text(repr(self._lapse_until))

    def fail_next(self, n: int = 1, code: int = 503, path: str | None = "/pods") -> None:
        """The next `n` requests whose path contains `path` (None = any) fail with `code`."""
        with self.lock:
            self._fail_queue.extend([(code, path)] * n)

    def deny(self, seconds: float | None = None, user: str | None = None) -> None:
        """For `seconds` (None: from now on) pod list and watch requests get 403 Forbidden with
        the Status body RBAC gives a service account without the Role (deploy/rbac.yaml)."""
        with self.lock:
            self._deny_until = math.inf if seconds is None else time.time() + float(seconds)
            self._deny_user = user or f"system:serviceaccount:{self.scenario.namespace}:steptail"

    def corrupt_pods(self, seconds: float = 5.0) -> None:
        """For `seconds` pods served by list and watch carry a creationTimestamp that is not
        RFC 3339: the kubernetes Python client cannot deserialize them (kubectl's tables and
        single-pod reads stay intact)."""
        with self.lock:
            self._corrupt_until = time.time() + float(seconds)

    def eof_streams(self) -> None:
        """End every open follow/watch stream cleanly (like an idle timeout or apiserver restart)."""
        with self.lock:
            self._eof_gen += 1

    def stall(self, jobset: str | None = None, seconds: float = 5.0) -> None:
        """The trainer writes nothing for `seconds` (pods keep running)."""
        with self.lock:
            js = self._js(jobset)
            js.stalled_until = time.monotonic() + seconds

    def set_rate(self, jobset: str | None = None, steps_per_second: float = 1.0) -> None:
        with self.lock:
            js = self._js(jobset)
            js.interval = 1.0 / steps_per_second if steps_per_second > 0 else math.inf
            js.next_step_at = time.monotonic() + min(js.interval, 3600)

    # ================================================================== ground truth / queries
    def process0(self, jobset: str | None = None) -> str | None:
        with self.lock:
            p = self._process0(self._js(jobset))
            return p.name if p else None

    def pod_names(self, jobset: str | None = None) -> list[str]:
        with self.lock:
            return [p.name for p in self._js_pods(self._js(jobset))]

    def jobset_state(self, jobset: str | None = None) -> JobSetState:
        return self._js(jobset)

    def last_step(self, jobset: str | None = None) -> int:
        with self.lock:
            return self._js(jobset).last_step

    def wait_step(self, step: int, jobset: str | None = None, timeout: float = 20.0,
                  incarnation: int | None = None) -> None:
        """Block (bounded) until the trainer wrote `step` (in `incarnation` if given)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                js = self._js(jobset)
                if js.last_step >= step and (incarnation is None or js.incarnation >= incarnation):
                    if incarnation is None or any(
                        k == (incarnation, step) for k, *_ in self.truth_index[js.spec.name]
                    ):
                        return
                if js.state == "done" and incarnation is None:
                    return
            time.sleep(0.01)
        raise TimeoutError(f"step {step} not reached within {timeout}s")

    def wait_done(self, jobset: str | None = None, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if self._js(jobset).state == "done":
                    return
            time.sleep(0.01)
        raise TimeoutError("JobSet did not finish")

    def truth(self, jobset: str | None = None) -> list[StepTruth]:
        """Every (incarnation, step) process 0 wrote, in order, with where it went and whether
        the logs endpoint can still serve it."""
        with self.lock:
            js = self._js(jobset)
            out = []
            emitted = {(e.incarnation, e.step): e for e in js.trainer.truth}
            for (inc, step), p, inst, entry in self.truth_index[js.spec.name]:
                e = emitted.get((inc, step))
                live = (p.namespace, p.name) in self.pods
                reachable = live and (inst is p.current or inst is p.previous)
                rotated = entry.file_gen != inst.log.gen
                out.append(
                    StepTruth(
                        incarnation=inc,
                        step=step,
                        ce=e.ce if e else float("nan"),
                        rbf_max=e.rbf_max if e else None,
                        pod=p.name,
                        pod_uid=p.uid,
                        container=CONTAINER,
                        restart_count=inst.restart_count,
                        timestamp=entry.ts,
                        loss_parts=e.loss_parts if e else "",
                        retrievable=reachable and not rotated,
                        rotated=rotated,
                        served=entry.served,
                        rotated_unread=rotated and not entry.served,
                    )
                )
            return out

    def log_lines(self, pod: str, namespace: str | None = None, previous: bool = False,
                  current_file_only: bool = True) -> list[tuple[str, str]]:
        """(timestamp, text) of a container instance's log as stored (for comparisons)."""
        with self.lock:
            p = self.pods[(namespace or self.scenario.namespace, pod)]
            inst = p.previous if previous else p.current
            if inst is None:
                return []
            log = inst.log
            start = log.cur_start if current_file_only else log.base
            return [(e.ts, e.text) for i in range(start, log.end) if (e := log.get(i))]

    # ================================================================== JSON objects
    def pod_json(self, p: Pod) -> dict:
        def ts(ns):
            return kube.rfc3339(ns) if ns else None

        inst = p.current
        state: dict[str, Any]
        if inst.state == "running":
            state = {"running": {"startedAt": ts(inst.started_ns)}}
        elif inst.state == "terminated":
            state = {"terminated": {"exitCode": inst.exit_code, "reason": inst.reason,
                                    "startedAt": ts(inst.started_ns), "finishedAt": ts(inst.finished_ns),
                                    "containerID": inst.container_id}}
        else:
            state = {"waiting": {"reason": inst.reason}}
        cs = {
            "name": CONTAINER,
            "state": state,
            "lastState": {},
            "ready": inst.state == "running" and p.deletion_ns is None,
            "restartCount": inst.restart_count,
            "image": IMAGE,
            "imageID": IMAGE + "@sha256:" + "0" * 64,
            "started": inst.state == "running",
        }
        if inst.state != "waiting":
            cs["containerID"] = inst.container_id
        prev = p.previous
        if prev is not None:
            cs["lastState"] = {"terminated": {"exitCode": prev.exit_code, "reason": prev.reason,
                                              "startedAt": ts(prev.started_ns),
                                              "finishedAt": ts(prev.finished_ns),
                                              "containerID": prev.container_id}}
        ready = "True" if cs["ready"] else "False"
        meta: dict[str, Any] = {
            "name": p.name,
            "generateName": p.name[:-5],
            "namespace": p.namespace,
            "uid": p.uid,
            "resourceVersion": str(p.resource_version),
            "creationTimestamp": ts(p.created_ns),
            "labels": dict(p.labels),
            "annotations": {
                "jobset.sigs.k8s.io/jobset-name": p.jobset,
                "batch.kubernetes.io/job-completion-index": p.labels["batch.kubernetes.io/job-completion-index"],
            },
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": p.job_name,
                                 "uid": p.labels["batch.kubernetes.io/controller-uid"],
                                 "controller": True, "blockOwnerDeletion": True}],
        }
        if p.deletion_ns is not None:
            meta["deletionTimestamp"] = ts(p.deletion_ns)
            meta["deletionGracePeriodSeconds"] = p.grace_seconds
        status: dict[str, Any] = {
            "phase": p.phase,
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": ts(p.created_ns)},
                {"type": "Initialized", "status": "True", "lastTransitionTime": ts(p.created_ns)},
                {"type": "ContainersReady", "status": ready, "lastTransitionTime": ts(p.start_ns or p.created_ns)},
                {"type": "Ready", "status": ready, "lastTransitionTime": ts(p.start_ns or p.created_ns)},
            ],
            "hostIP": f"10.0.{p.process_index // 250}.{p.process_index % 250 + 2}",
            "podIP": f"10.8.{p.process_index // 250}.{p.process_index % 250 + 2}",
            "qosClass": "Guaranteed",
            "containerStatuses": [cs],
        }
        if p.start_ns:
            status["startTime"] = ts(p.start_ns)
        return {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": meta,
            "spec": {
                "containers": [{"name": CONTAINER, "image": IMAGE,
                                "command": ["python3", "-m", "maxtext.trainers.post_train.sft.train_sft"],
                                "resources": {"limits": {"google.com/tpu": "4"}}}],
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 30,
                "nodeName": p.node,
                "subdomain": p.jobset,
                "hostname": p.name[:-6],
                "schedulerName": "default-scheduler",
                "nodeSelector": {"cloud.google.com/gke-tpu-topology": "4x4x8",
                                 "cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice"},
            },
            "status": status,
        }

    def jobset_json(self, js: JobSetState) -> dict:
        spec = js.spec
        return {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {
                "name": spec.name,
                "namespace": spec.namespace,
                "uid": js.uid,
                "resourceVersion": str(js.resource_version),
                "creationTimestamp": kube.rfc3339(js.created_ns),
                "labels": {"kueue.x-k8s.io/queue-name": "tpu-queue"},
            },
            "spec": {
                "replicatedJobs": [{"name": spec.replicated_job, "replicas": spec.slices,
                                    "template": {"spec": {"parallelism": spec.hosts,
                                                          "completions": spec.hosts,
                                                          "completionMode": "Indexed"}}}],
                "failurePolicy": {"maxRestarts": 100},
            },
            "status": {
                "restarts": js.restart_attempt,
                "terminalState": "Completed" if js.state == "done" else None,
                "replicatedJobsStatus": [{"name": spec.replicated_job,
                                          "ready": spec.slices if js.state == "running" else 0,
                                          "active": spec.slices if js.state != "done" else 0,
                                          "succeeded": spec.slices if js.state == "done" else 0,
                                          "failed": 0, "suspended": 0}],
            },
        }

    # ================================================================== HTTP
    @web.middleware
    async def _middleware(self, request: web.Request, handler):
        path = request.path
        if path in ("/healthz", "/livez", "/readyz"):
            return web.Response(text="ok")
        auth = request.headers.get("Authorization", "")
        with self.lock:
            lapsed = time.time() < self._lapse_until
            fail = None
            if not (auth == f"Bearer {self.token}") or lapsed:
                fail = 401
            elif self._fail_queue:
                code, sub = self._fail_queue[0]
                if sub is None or sub in path:
                    self._fail_queue.pop(0)
                    fail = code
        if fail == 401:
            resp = self._status(401, "Unauthorized")
        elif fail is not None:
            msg = {500: "an error on the server (\"unknown\") has prevented the request from succeeding",
                   503: "the server is currently unable to handle the request",
                   }.get(fail, f"simulated failure {fail}")
            resp = self._status(fail, msg)
        else:
            try:
                resp = await handler(request)
            except web.HTTPException as e:
                resp = e
        with self.lock:
            self.requests.append((request.method, str(request.rel_url), resp.status))
            if len(self.requests) > 10000:
                del self.requests[:5000]
        return resp

    @staticmethod
    def _status(code: int, message: str, reason: str | None = None, details: dict | None = None) -> web.Response:
        return web.json_response(kube.status_body(code, message, reason, details), status=code)

    def _routes(self, app: web.Application) -> None:
        g = app.router.add_get
        g("/version", self.h_version)
        g("/api", self.h_api)
        g("/apis", self.h_apis)
        g("/api/v1", self.h_api_v1)
        g("/apis/jobset.x-k8s.io", self.h_jobset_group)
        g("/apis/jobset.x-k8s.io/v1alpha2", self.h_jobset_v1alpha2)
        g("/api/v1/namespaces", self.h_namespaces)
        g("/api/v1/namespaces/{ns}", self.h_namespace)
        g("/api/v1/pods", self.h_pods)
        g("/api/v1/namespaces/{ns}/pods", self.h_pods)
        g("/api/v1/namespaces/{ns}/pods/{name}", self.h_pod)
        g("/api/v1/namespaces/{ns}/pods/{name}/log", self.h_log)
        g("/apis/jobset.x-k8s.io/v1alpha2/jobsets", self.h_jobsets)
        g("/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets", self.h_jobsets)
        g("/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets/{name}", self.h_jobset)
        app.router.add_route("*", "/{tail:.*}", self.h_notfound)

    async def h_notfound(self, request: web.Request) -> web.Response:
        if request.method != "GET":
            return self._status(405, f"the server does not allow this method on the requested resource "
                                     f"(simulated cluster is read-only: {request.method})", "MethodNotAllowed")
        return self._status(404, "the server could not find the requested resource")

    async def h_version(self, request):
        return web.json_response({
            "major": "1", "minor": "32", "gitVersion": "v1.32.2-gke.1182003",
            "gitCommit": "0" * 40, "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
            "goVersion": "go1.23.6", "compiler": "gc", "platform": "linux/amd64"})

    async def h_api(self, request):
        return web.json_response({"kind": "APIVersions", "versions": ["v1"],
                                  "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0",
                                                                  "serverAddress": f"{self.host}:{self.port}"}]})

    _JS_GROUP = {"name": "jobset.x-k8s.io",
                 "versions": [{"groupVersion": "jobset.x-k8s.io/v1alpha2", "version": "v1alpha2"}],
                 "preferredVersion": {"groupVersion": "jobset.x-k8s.io/v1alpha2", "version": "v1alpha2"}}

    async def h_apis(self, request):
        return web.json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": [self._JS_GROUP]})

    async def h_jobset_group(self, request):
        return web.json_response({"kind": "APIGroup", "apiVersion": "v1", **self._JS_GROUP})

    async def h_api_v1(self, request):
        ro = ["get", "list", "watch"]
        return web.json_response({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
            {"name": "namespaces", "singularName": "namespace", "namespaced": False, "kind": "Namespace",
             "verbs": ["get", "list"], "shortNames": ["ns"]},
            {"name": "pods", "singularName": "pod", "namespaced": True, "kind": "Pod", "verbs": ro,
             "shortNames": ["po"], "categories": ["all"]},
            {"name": "pods/log", "singularName": "", "namespaced": True, "kind": "Pod", "verbs": ["get"]},
            {"name": "pods/status", "singularName": "", "namespaced": True, "kind": "Pod", "verbs": ["get"]},
        ]})

    async def h_jobset_v1alpha2(self, request):
        return web.json_response({"kind": "APIResourceList", "apiVersion": "v1",
                                  "groupVersion": "jobset.x-k8s.io/v1alpha2", "resources": [
                                      {"name": "jobsets", "singularName": "jobset", "namespaced": True,
                                       "kind": "JobSet", "verbs": ["get", "list", "watch"]},
                                      {"name": "jobsets/status", "singularName": "", "namespaced": True,
                                       "kind": "JobSet", "verbs": ["get"]}]})

    def _ns_json(self, name: str) -> dict:
        return {"kind": "Namespace", "apiVersion": "v1",
                "metadata": {"name": name, "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
                             "resourceVersion": "1", "creationTimestamp": "2026-01-01T00:00:00Z"},
                "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}

    def _namespace_names(self) -> list[str]:
        return sorted({"default", "kube-system", self.scenario.namespace}
                      | {ns for ns, _ in self.jobsets})

    async def h_namespaces(self, request):
        return web.json_response({"kind": "NamespaceList", "apiVersion": "v1",
                                  "metadata": {"resourceVersion": str(self.rv)},
                                  "items": [self._ns_json(n) for n in self._namespace_names()]})

    async def h_namespace(self, request):
        ns = request.match_info["ns"]
        if ns not in self._namespace_names():
            return self._status(404, f'namespaces "{ns}" not found', details={"name": ns, "kind": "namespaces"})
        return web.json_response(self._ns_json(ns))

    # ---------------------------------------------------------------- pods & jobsets
    @staticmethod
    def _wants_table(request) -> bool:
        return "as=Table" in request.headers.get("Accept", "")

    def _pod_table(self, pods: list[dict], rv: int) -> dict:
        now = time.time()
        rows = []
        for o in pods:
            cs = o["status"]["containerStatuses"][0]
            st = o["status"]["phase"]
            if "waiting" in cs["state"]:
                st = cs["state"]["waiting"]["reason"]
            elif "terminated" in cs["state"]:
                st = cs["state"]["terminated"]["reason"]
            if o["metadata"].get("deletionTimestamp"):
                st = "Terminating"
            created = kube.parse_rfc3339_ns(o["metadata"]["creationTimestamp"]) / 1e9
            age = max(0, int(now - created))
            rows.append({"cells": [o["metadata"]["name"], f"{int(cs['ready'])}/1", st, cs["restartCount"],
                                   f"{age}s" if age < 120 else f"{age // 60}m",
                                   o["status"].get("podIP", "<none>"), o["spec"]["nodeName"]],
                         "object": o})
        cols = [("Name", "string", "name"), ("Ready", "string", ""), ("Status", "string", ""),
                ("Restarts", "integer", ""), ("Age", "string", ""), ("IP", "string", ""),
                ("Node", "string", "")]
        return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": str(rv)},
                "columnDefinitions": [{"name": n, "type": t, "format": f, "description": n,
                                       "priority": 0 if i < 5 else 1}
                                      for i, (n, t, f) in enumerate(cols)],
                "rows": rows}

    def _js_table(self, items: list[dict], rv: int) -> dict:
        rows = [{"cells": [o["metadata"]["name"], o["status"]["restarts"],
                           o["status"].get("terminalState") or "", o["metadata"]["creationTimestamp"]],
                 "object": o} for o in items]
        cols = ["Name", "Restarts", "TerminalState", "Created"]
        return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": str(rv)},
                "columnDefinitions": [{"name": c, "type": "integer" if c == "Restarts" else "string",
                                       "format": "name" if c == "Name" else "", "description": c,
                                       "priority": 0} for c in cols],
                "rows": rows}

    async def h_pods(self, request: web.Request):
        return await self._list_or_watch(request, "pods")

    async def h_jobsets(self, request: web.Request):
        return await self._list_or_watch(request, "jobsets")

    def _snapshot(self, kind: str, ns: str | None) -> list[dict]:
        if kind == "pods":
            objs = [self.pod_json(p) for p in self.pods.values() if ns is None or p.namespace == ns]
        else:
            objs = [self.jobset_json(j) for j in self.jobsets.values() if ns is None or j.spec.namespace == ns]
        return sorted(objs, key=lambda o: (o["metadata"]["namespace"], o["metadata"]["name"]))

    def _denied(self, request: web.Request, kind: str) -> web.Response | None:
        with self.lock:
            if kind != "pods" or time.time() >= self._deny_until:
                return None
            user = self._deny_user
        verb = "watch" if request.query.get("watch") in ("true", "1", "True") else "list"
        ns = request.match_info.get("ns")
        where = f'in the namespace "{ns}"' if ns else "at the cluster scope"
        return self._status(403, f'pods is forbidden: User "{user}" cannot {verb} resource "pods" in API group "" '
                                 f"{where}", details={"kind": "pods"})

    def _served(self, o: dict) -> dict:
        """A pod as list/watch serve it: during corrupt_pods, with a timestamp no client parses."""
        if time.time() >= self._corrupt_until or o.get("kind") != "Pod":
            return o
        return {**o, "metadata": {**o["metadata"], "creationTimestamp": "not-a-timestamp"}}

    async def _list_or_watch(self, request: web.Request, kind: str):
        if (denied := self._denied(request, kind)) is not None:
            return denied
        q = request.query
        ns = request.match_info.get("ns")
        try:
            lsel = kube.parse_selector(q.get("labelSelector"))
            fsel = kube.parse_field_selector(q.get("fieldSelector"))
        except ValueError as e:
            return self._status(400, str(e))

        def match(o):
            return (ns is None or o["metadata"]["namespace"] == ns) and lsel(o["metadata"].get("labels", {})) \
                and fsel(o)

        if q.get("watch") in ("true", "1", "True"):
            return await self._watch(request, kind, match)
        with self.lock:
            items = [o for o in self._snapshot(kind, ns) if match(o)]
            rv = self.rv
        if self._wants_table(request):
            return web.json_response(self._pod_table(items, rv) if kind == "pods" else self._js_table(items, rv))
        list_kind = "PodList" if kind == "pods" else "JobSetList"
        api = "v1" if kind == "pods" else "jobset.x-k8s.io/v1alpha2"
        return web.json_response({"kind": list_kind, "apiVersion": api,
                                  "metadata": {"resourceVersion": str(rv)}, "items": [self._served(o) for o in items]})

    async def _watch(self, request: web.Request, kind: str, match) -> web.StreamResponse:
        q = request.query
        rv_param = q.get("resourceVersion", "")
        timeout = float(q.get("timeoutSeconds") or self.scenario.watch_timeout_seconds)
        deadline = time.monotonic() + timeout
        with self.lock:
            if rv_param in ("", "0"):
                initial = [("ADDED", o) for o in self._snapshot(kind, request.match_info.get("ns")) if match(o)]
                since = self.rv
            else:
                try:
                    since = int(rv_param)
                except ValueError:
                    return self._status(400, f"invalid resourceVersion {rv_param!r}")
                initial = []
            eof_gen = self._eof_gen
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        table = self._wants_table(request)
        first = [True]

        def encode(typ: str, o: dict) -> bytes:
            if table:  # kubectl get -w: each event carries a one-row Table
                rv = int(o["metadata"]["resourceVersion"])
                o = self._pod_table([o], rv) if kind == "pods" else self._js_table([o], rv)
                if not first[0]:
                    o["columnDefinitions"] = []
                first[0] = False
            else:
                o = self._served(o)
            return json.dumps({"type": typ, "object": o}).encode() + b"\n"

        try:
            for typ, o in initial:
                await resp.write(encode(typ, o))
            idx = 0
            while time.monotonic() < deadline and not self._closing:
                with self.lock:
                    if self._eof_gen != eof_gen:
                        break
                    # events are appended in rv order
                    while idx < len(self.events) and self.events[idx][0] <= since:
                        idx += 1
                    new = self.events[idx:]
                    idx = len(self.events)
                for erv, k, typ, o in new:
                    since = erv
                    if k == kind and match(o):
                        await resp.write(encode(typ, o))
                await asyncio.sleep(POLL * 2)
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        return resp

    async def h_pod(self, request: web.Request):
        ns, name = request.match_info["ns"], request.match_info["name"]
        with self.lock:
            p = self.pods.get((ns, name))
            obj = self.pod_json(p) if p else None
        if obj is None:
            return self._status(404, f'pods "{name}" not found', details={"name": name, "kind": "pods"})
        if self._wants_table(request):
            return web.json_response(self._pod_table([obj], self.rv))
        return web.json_response(obj)

    async def h_jobset(self, request: web.Request):
        ns, name = request.match_info["ns"], request.match_info["name"]
        with self.lock:
            js = self.jobsets.get((ns, name))
            obj = self.jobset_json(js) if js else None
        if obj is None:
            return self._status(404, f'jobsets.jobset.x-k8s.io "{name}" not found',
                                details={"name": name, "group": "jobset.x-k8s.io", "kind": "jobsets"})
        if self._wants_table(request):
            return web.json_response(self._js_table([obj], self.rv))
        return web.json_response(obj)

    # ---------------------------------------------------------------- logs
    async def h_log(self, request: web.Request):
        ns, name = request.match_info["ns"], request.match_info["name"]
        q = request.query

        def flag(k):
            return q.get(k, "false").lower() in ("true", "1")

        follow, timestamps, previous = flag("follow"), flag("timestamps"), flag("previous")
        container = q.get("container") or CONTAINER
        try:
            since_ns = None
            if q.get("sinceTime"):
                since_ns = kube.parse_rfc3339_ns(q["sinceTime"])
            if q.get("sinceSeconds"):
                s = int(q["sinceSeconds"])
                if s < 1:
                    return self._status(400, "sinceSeconds must be greater than 0")
                since_ns = _now_ns() - s * 1_000_000_000
            tail = int(q["tailLines"]) if q.get("tailLines") else None
            limit = int(q["limitBytes"]) if q.get("limitBytes") else None
        except ValueError as e:
            return self._status(400, f"invalid log options: {e}")
        with self.lock:
            p = self.pods.get((ns, name))
            if p is None:
                return self._status(404, f'pods "{name}" not found', details={"name": name, "kind": "pods"})
            if container != CONTAINER:
                return self._status(400, f"container {container} is not valid for pod {name}")
            if previous:
                inst = p.previous
                if inst is None:
                    return self._status(400, f'previous terminated container "{container}" in pod "{name}" not found')
            else:
                inst = p.current
                if inst.state == "waiting":
                    return self._status(400, f'container "{container}" in pod "{name}" is waiting to start: '
                                             f"{inst.reason}")
            log = inst.log
            gen = log.gen
            start = log.cur_start
            end_now = log.end
            if tail is not None:
                start = max(start, end_now - tail)
            eof_gen = self._eof_gen
        follow = follow and not previous
        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/plain"})
        if follow:
            resp.enable_chunked_encoding()
        await resp.prepare(request)
        sent = 0
        pos = start
        try:
            while True:
                with self.lock:
                    stop = self._closing or self._eof_gen != eof_gen
                    fend = log.file_end(gen)
                    chunk = []
                    while pos < fend:
                        e = log.get(pos)
                        pos += 1
                        if e is None or (since_ns is not None and e.ts_ns < since_ns):
                            continue
                        data = (f"{e.ts} {e.text}\n" if timestamps else f"{e.text}\n").encode("utf-8", "replace")
                        if limit is not None and sent + len(data) > limit:
                            data = data[: limit - sent]
                        chunk.append(data)
                        sent += len(data)
                        e.served = True
                        if limit is not None and sent >= limit:
                            stop = True
                            break
                    rotated_away = gen != log.gen and pos >= fend  # our file is no longer current
                    done = log.terminated and gen == log.gen and pos >= log.end
                if chunk:
                    await resp.write(b"".join(chunk))
                if stop or not follow or done:
                    break
                if rotated_away:
                    # kubernetes #115701: the stream stays open but never sends again
                    while not self._closing and self._eof_gen == eof_gen:
                        if request.transport is None or request.transport.is_closing():
                            break
                        await asyncio.sleep(POLL * 5)
                    break
                if request.transport is None or request.transport.is_closing():
                    break
                await asyncio.sleep(POLL)
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        return resp


def run_in_thread(scenario: Scenario | dict | None = None, **kw) -> SimCluster:
    """Start a simulator on a background thread; stop it with ``sim.stop_thread()``."""
    return SimCluster(scenario, **kw).start_in_thread()
