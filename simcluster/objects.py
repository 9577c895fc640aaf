"""The simulated objects: JobSets, their Kueue Workloads, their pods, and each pod's container
instances (the running one and the one before a restart, whose output `previous=true` serves)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from steptail.simcluster.logs import ContainerLog
from steptail.simcluster.scenario import DEFAULT_IMAGE, JobSetSpec
from steptail.simcluster.trainer import Trainer

CONTAINER = "jax-tpu"  # the single container of every pod
IMAGE = DEFAULT_IMAGE  # the trainer's image unless the scenario names another


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
    process_index: int  # JAX process index; 0 is the one whose output is followed
    # the JobSet's pod template ({"metadata": …, "spec": …}) when this pod was created: its image,
    # args, node selector and volumes stay those (set_image changes only later pods)
    template: dict = field(default_factory=dict, repr=False)
    phase: str = "Pending"
    resource_version: int = 0
    deletion_ns: int | None = None  # set while terminating; DELETED when reached
    grace_seconds: int = 0
    start_ns: int | None = None
    instances: list[ContainerInstance] = field(default_factory=list)  # at most [previous, current]
    clock_offset_ns: int = 0  # its node's clock minus true time (clock_step); kept across container restarts

    @property
    def current(self) -> ContainerInstance:
        return self.instances[-1]

    @property
    def previous(self) -> ContainerInstance | None:
        return self.instances[-2] if len(self.instances) >= 2 else None


@dataclass
class StampSkew:
    """`stamp_skew`: every `every`-th of the next `left` steps (None: the rest of the run),
    process 0's LOSS-PARTS line is stamped `micros` µs before the line written just before it."""

    micros: int
    every: int = 1
    left: int | None = None
    seen: int = 0

    def take(self) -> int | None:
        """The skew of the step being written (µs), None when this step is not skewed."""
        if self.left is not None:
            if self.left <= 0:
                return None
            self.left -= 1
        self.seen += 1
        return self.micros if self.seen % self.every == 0 else None


@dataclass
class Workload:
    """The Kueue Workload of a JobSet (kueue.x-k8s.io/v1beta1): created with the JobSet, quota
    reserved and admitted when the JobSet may run, Finished when it completed or failed."""

    name: str  # jobset-<name>-<5 hex>, as Kueue names it
    uid: str
    created_ns: int
    queue: str  # spec.queueName (the LocalQueue)
    cluster_queue: str  # status.admission.clusterQueue
    pod_sets: list[dict] = field(default_factory=list, repr=False)  # spec.podSets as created
    resource_version: int = 0
    admitted_ns: int | None = None  # QuotaReserved and Admitted True from then on
    finished_ns: int | None = None
    finished_reason: str = ""  # Succeeded | Failed
    finished_message: str = ""
    deletion_ns: int | None = None  # set when garbage-collected with its JobSet


@dataclass
class JobSetState:
    spec: JobSetSpec
    uid: str
    created_ns: int
    trainer: Trainer  # process 0's trainer, which also records the ground truth
    restart_attempt: int = 0
    incarnation: int = 0  # trainer runs so far (JobSet or process-0 container restarts)
    state: str = "pending"  # queued (Workload not admitted, no pods) | pending | running | done | failed
    pending_until: float = 0.0  # time.monotonic()
    next_step: int = 1
    next_step_at: float = 0.0  # time.monotonic()
    interval: float = 0.02  # seconds per step
    stalled_until: float = 0.0
    resume_from: int = 0  # checkpoint step the next incarnation restores
    last_step: int = 0
    pods: list[str] = field(default_factory=list)  # names of the current pods
    resource_version: int = 0
    other_trainers: dict[int, Trainer] = field(default_factory=dict, repr=False)  # noise of processes > 0
    skew: StampSkew | None = None  # stamp_skew fault in force
    head_rotate_after: int | None = None  # rotate process 0's log after this many steps of the next incarnation
    # the live JobSet object (spec.suspend and the trainer's image may change after creation)
    image: str = ""  # the pod template's image now (set_image); "" until add_jobset
    suspend: bool = False  # spec.suspend as the user set it (suspend fault)
    generation: int = 1  # metadata.generation: +1 per spec change
    queued_until: float = 0.0  # time.monotonic() when a queued Workload is admitted
    resumed_ns: int | None = None  # when Kueue admitted it and unsuspended the JobSet
    finished_ns: int | None = None  # Completed or Failed condition's time
    reap_at: float | None = None  # time.monotonic() when a failed JobSet is deleted (fail_jobset)
    deleted: bool = False  # deleted (DELETED sent); kept only for the ground truth
    workload: Workload | None = None  # None without a queue label: Kueue does not manage it
