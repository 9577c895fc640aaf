"""Ground truth for tests: every step process 0 wrote, where it went, and whether the logs
endpoint can still serve it (a follower is judged against this)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from steptail.simcluster.faults import ApiOutage
from steptail.simcluster.objects import CONTAINER, JobSetState
from steptail.simcluster.state import ClusterState

ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"


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
    attempt: int = 0  # its pod's JobSet restart attempt (jobset.sigs.k8s.io/restart-attempt)


def step_truths(state: ClusterState, js: JobSetState) -> list[StepTruth]:
    """Call under state.lock."""
    out = []
    emitted = {(e.incarnation, e.step): e for e in js.trainer.truth}
    for (inc, step), p, inst, entry in state.truth_index[js.spec.name]:
        e = emitted.get((inc, step))
        live = (p.namespace, p.name) in state.pods
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
                attempt=int(p.labels.get(ATTEMPT_LABEL, 0)),
            )
        )
    return out


def wrote_step(state: ClusterState, js: JobSetState, incarnation: int, step: int) -> bool:
    return any(k == (incarnation, step) for k, *_ in state.truth_index[js.spec.name])


@dataclass
class LineTruth:
    """One line a process-0 container wrote (flood output excepted), and when the logs API
    could serve it. Times are true wall-clock ns (time.time_ns()), not the node-clock stamp."""

    jobset: str
    pod: str
    pod_uid: str
    container: str
    restart_count: int
    incarnation: int  # the trainer incarnation that container ran (0: before any start-up line)
    seq: int  # global write order (every container of the cluster)
    wall_ns: int  # when it was written
    stamp_ns: int  # the kubelet stamp (node clock; may be before an earlier line's)
    stamp: str  # the same, RFC3339Nano as served with timestamps=true
    text: str
    kind: str | None  # "loss" (LOSS-PARTS) | "rbf" (REQUIRED_RBF) | None
    step: int | None  # for loss / rbf lines
    served: bool  # some API response included it
    served_ns: int | None  # when a response first included it (true wall-clock ns)
    file_gen: int  # which log file of its container holds it (0: the first; +1 each rotation)
    # [(from_ns, to_ns)]: from its write until its file stopped being the current one (only the
    # current file is served) or its container's log was gone (pod deleted, a second restart
    # dropped it); to_ns None while it is still servable. API outages are not cut out of it:
    # see Truth.unavailable().
    intervals: list[tuple[int, int | None]]


def line_truths(state: ClusterState, js: JobSetState) -> list[LineTruth]:
    """Call under state.lock. In write order."""
    out = []
    for log, e in state.journal.get(js.spec.name, []):
        p, inst = log.owner
        key = e.key or (None, None, None)
        out.append(LineTruth(
            jobset=js.spec.name, pod=p.name, pod_uid=p.uid, container=CONTAINER,
            restart_count=inst.restart_count, incarnation=key[0] or log.incarnation, seq=e.seq,
            wall_ns=e.wall_ns, stamp_ns=e.ts_ns, stamp=e.ts, text=e.text, kind=key[2], step=key[1],
            served=e.served, served_ns=e.served_ns, file_gen=e.file_gen, intervals=[(e.wall_ns, log.servable_until(e))],
        ))
    return out


@dataclass
class AppliedFault:
    """A scenario fault as the simulator applied it: when (true wall-clock ns), and its error
    if it could not be applied (then it had no effect)."""

    action: str
    jobset: str | None
    params: dict
    wall_ns: int
    at: float | None  # as scheduled: seconds after start ...
    at_step: int | None  # ... or right after this step
    error: str | None = None


class Truth:
    """`SimCluster.truth`: the ground truth as plain data, for tests and the chaos oracle.

    - ``truth(jobset)``: [StepTruth] — every (incarnation, step) process 0 wrote, in order.
    - ``truth.servable(jobset)``: [LineTruth] — every line process 0 wrote (flood output
      excepted), in write order, with the intervals the logs API could serve it.
    - ``truth.unavailable()``: [ApiOutage(kind, from_ns, to_ns, params)] — every API fault in
      the order applied (auth_lapse, deny, fail_next, corrupt_pods, slow_api, hang_api,
      eof_streams, watch_gone); to_ns None while in force (fail_next: until its last failure
      was answered). Not cut out of the lines' intervals: the oracle decides what they mean.
    - ``truth.db_outages()``: [dbproxy.Outage(mode, from_ns, to_ns)] of the DbProxy, if any.
    - ``truth.faults()``: [AppliedFault] — the scenario's faults in the order applied, when,
      and the error of one that could not be applied.
    Every method takes the state lock and returns copies."""

    def __init__(self, state: ClusterState, db_proxy=None) -> None:
        self.state = state
        self.db_proxy = db_proxy

    def __call__(self, jobset: str | None = None) -> list[StepTruth]:
        with self.state.lock:
            return step_truths(self.state, self.state.jobset(jobset))

    def servable(self, jobset: str | None = None) -> list[LineTruth]:
        with self.state.lock:
            return line_truths(self.state, self.state.jobset(jobset))

    def unavailable(self) -> list[ApiOutage]:
        with self.state.lock:
            return [replace(o, params=dict(o.params)) for o in self.state.faults.history]

    def db_outages(self) -> list:
        return [replace(o) for o in self.db_proxy.outages] if self.db_proxy is not None else []

    def faults(self) -> list[AppliedFault]:
        with self.state.lock:
            return [replace(f, params=dict(f.params)) for f in self.state.applied]
