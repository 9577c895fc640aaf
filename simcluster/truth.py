"""Ground truth for tests: every step process 0 wrote, where it went, and whether the logs
endpoint can still serve it (a follower is judged against this)."""

from __future__ import annotations

from dataclasses import dataclass

from steptail.simcluster.objects import CONTAINER, JobSetState
from steptail.simcluster.state import ClusterState


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
            )
        )
    return out


def wrote_step(state: ClusterState, js: JobSetState, incarnation: int, step: int) -> bool:
    return any(k == (incarnation, step) for k, *_ in state.truth_index[js.spec.name])
