"""The JobSet controller, Kueue and kubelet of the simulator: a queued Workload is admitted,
pods go Pending → Running, the trainer's lines go into their container logs at the JobSet's
rate, runs finish (the Workload Finished), logs rotate by size, and the workload faults
(preemption, container restart, rotation, stall, rate, injected lines, another image, suspend,
a failed JobSet deleted later) happen. Every method runs under ClusterState.lock."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from steptail.simcluster.objects import JobSetState, Pod, StampSkew
from steptail.simcluster.state import ClusterState
from steptail.simcluster.trainer import Trainer

MAX_STEPS_PER_TICK = 50  # a late tick catches up, but in bounded bursts


def _node_time(at: datetime, p: Pod) -> datetime:
    """`at` on the pod's node clock (what its process prints in absl prefixes)."""
    return at + timedelta(microseconds=p.clock_offset_ns // 1000) if p.clock_offset_ns else at


class Controller:
    def __init__(self, state: ClusterState, on_step: Callable[[JobSetState, int], None]) -> None:
        self.state = state
        self.on_step = on_step  # right after a step was written: fires `at_step` faults

    def tick(self, mono: float) -> None:
        st = self.state
        st.delete_expired_pods(time.time_ns())
        for js in list(st.jobsets.values()):
            if js.reap_at is not None and mono >= js.reap_at:
                st.delete_jobset(js)
                continue
            if js.state == "queued" and mono >= js.queued_until:
                self.admit(js)
            if js.state == "pending" and mono >= js.pending_until:
                self._start_pods(js)
            if js.state != "running":
                continue
            n = 0
            while js.state == "running" and mono >= js.next_step_at and mono >= js.stalled_until \
                    and n < MAX_STEPS_PER_TICK:
                step = js.next_step
                if step > js.trainer.steps:
                    self._finish(js)
                    break
                self._write_step(js, step)
                js.next_step += 1
                js.next_step_at = max(js.next_step_at + js.interval, mono - js.interval)
                n += 1
                self.on_step(js, step)
                if js.state == "running" and js.next_step > js.trainer.steps:
                    self._finish(js)
            for p in st.jobset_pods(js):
                for inst in p.instances:
                    inst.log.maybe_rotate()

    # ---- the run
    def admit(self, js: JobSetState) -> None:
        """Kueue reserves quota and admits the Workload, then unsuspends the JobSet (spec.suspend
        false unless the user set it), whose controller creates the pods."""
        st = self.state
        now = time.time_ns()
        if js.workload is not None:
            js.workload.admitted_ns = now
            st.workload_event(js, "MODIFIED")
        js.resumed_ns = now
        if not js.suspend:  # spec.suspend: true (Kueue's) -> false
            js.generation += 1
        st.create_pods(js, js.spec.pending_seconds)
        st.jobset_event(js, "MODIFIED")

    def _start_pods(self, js: JobSetState) -> None:
        now = time.time_ns()
        js.incarnation += 1
        js.state = "running"
        js.next_step_at = time.monotonic() + js.interval
        for p in self.state.jobset_pods(js):
            p.phase = "Running"
            p.start_ns = p.start_ns or now
            inst = p.current
            inst.state, inst.reason, inst.started_ns = "running", "", now
            self._write_startup(js, p)
            self.state.pod_event(p, "MODIFIED")
        self.state.jobset_event(js, "MODIFIED")

    def _write_startup(self, js: JobSetState, p: Pod) -> None:
        log = p.current.log
        at = datetime.now(UTC)
        if p.process_index == 0:
            log.incarnation = js.incarnation
            restore = js.resume_from if js.incarnation > 1 else None
            for line in js.trainer.startup_lines(restore_from=restore, at=_node_time(at, p)):
                log.write(line)
            js.next_step = js.resume_from + 1 if js.incarnation > 1 else 1
            self._maybe_rotate_head(js, p, 0)
        else:
            other = Trainer(**{**js.spec.trainer, "process_index": p.process_index,
                               "process_count": js.spec.slices * js.spec.hosts})
            for line in other.startup_lines(at=_node_time(at, p))[:2]:
                log.write(line)

    def _write_step(self, js: JobSetState, step: int) -> None:
        at = datetime.now(UTC)
        for p in self.state.jobset_pods(js):
            inst = p.current
            if inst.state != "running" or p.deletion_ns is not None:
                continue
            log = inst.log
            p_at = _node_time(at, p)
            if p.process_index == 0:
                lines = js.trainer.step_lines(step, js.incarnation, at=p_at)
                truth = self.state.truth_index[js.spec.name]
                ts = time.time_ns()
                skew_us = js.skew.take() if js.skew is not None else None
                for line in lines:
                    kind = None
                    if "LOSS-PARTS" in line:
                        kind = "loss"
                    elif "REQUIRED_RBF" in line:
                        kind = "rbf"
                    key = (js.incarnation, step, kind) if kind else None
                    if kind == "loss" and skew_us is not None:
                        # stdout and stderr are stamped separately: this line lands before the last one
                        before = log.last_ts or time.time_ns() + log.clock_offset_ns
                        e = log.write(line, key=key, stamp_ns=before - skew_us * 1000)
                    else:
                        # the step's tagged burst shares one kubelet timestamp
                        e = log.write(line, ts_ns=ts if kind or "completed step" in line else None, key=key)
                    if kind == "loss":
                        truth.append(((js.incarnation, step), p, inst, e))
                self._maybe_rotate_head(js, p, step - (js.resume_from if js.incarnation > 1 else 0))
            else:
                # other pods print only noise and their per-pod completed step
                other = self._other_trainer(js, p.process_index)
                for line in other.step_lines(step, js.incarnation, at=p_at, record=False):
                    log.write(line)
        js.last_step = step

    @staticmethod
    def _maybe_rotate_head(js: JobSetState, p: Pod, written: int) -> None:
        """`head_rotated: N`: once the new incarnation's process 0 wrote its start-up lines and N
        steps, its log rotates, so a follower that was not already reading lost that head."""
        if js.head_rotate_after is not None and written >= js.head_rotate_after:
            js.head_rotate_after = None
            p.current.log.rotate()

    @staticmethod
    def _other_trainer(js: JobSetState, index: int) -> Trainer:
        cache = js.other_trainers
        if index not in cache:
            cache[index] = Trainer(**{**js.spec.trainer, "process_index": index,
                                      "process_count": js.spec.slices * js.spec.hosts})
        return cache[index]

    def _finish(self, js: JobSetState) -> None:
        js.state = "done"
        now = time.time_ns()
        js.finished_ns = now
        for p in self.state.jobset_pods(js):
            inst = p.current
            if inst.state == "running":
                inst.state, inst.reason, inst.finished_ns, inst.exit_code = "terminated", "Completed", now, 0
                inst.log.terminated = True
                p.phase = "Succeeded"
                self.state.pod_event(p, "MODIFIED")
        self.state.jobset_event(js, "MODIFIED")
        self._workload_finished(js, now, "Succeeded", "jobset completed successfully")

    def _workload_finished(self, js: JobSetState, now: int, reason: str, message: str) -> None:
        """Kueue copies the JobSet's Completed or Failed condition into a Finished condition."""
        w = js.workload
        if w is not None and w.finished_ns is None:
            w.finished_ns, w.finished_reason, w.finished_message = now, reason, message
            self.state.workload_event(js, "MODIFIED")

    # ---- the runbook's faults: another image, suspend, a failed JobSet
    def set_image(self, js: JobSetState, image: str) -> None:
        """The JobSet's pod template gets `image`: pods created from now on (the next JobSet
        restart) run it; pods already created keep theirs, a container restarted in place too."""
        if not isinstance(image, str) or not image.strip():
            raise ValueError(f"set_image needs an image, got {image!r}")
        js.image = image
        js.generation += 1
        self.state.jobset_event(js, "MODIFIED")

    def suspend(self, js: JobSetState) -> None:
        """spec.suspend: true on an admitted JobSet: its Workload stays admitted and active and
        its pods keep running (the runbook's point: stop a run by deactivating the Workload)."""
        if js.suspend:
            return
        js.suspend = True
        js.generation += 1
        self.state.jobset_event(js, "MODIFIED")

    def fail_jobset(self, js: JobSetState, reap_after: float) -> None:
        """Every pod of the JobSet fails (its container exits 1, reason Error; logs stay
        readable), the JobSet gets a Failed condition and terminalState Failed, its Workload a
        Finished condition, and `reap_after` seconds later the JobSet is deleted with its
        Workload and pods (state.delete_jobset)."""
        if js.state in ("done", "failed"):
            raise ValueError(f"JobSet {js.spec.name} already finished ({js.state})")
        st = self.state
        now = time.time_ns()
        for p in st.jobset_pods(js):
            inst = p.current
            if inst.state == "terminated" and p.phase == "Failed":
                continue
            inst.state, inst.reason, inst.finished_ns, inst.exit_code = "terminated", "Error", now, 1
            inst.log.terminated = True
            p.phase = "Failed"
            st.pod_event(p, "MODIFIED")
        js.state = "failed"
        js.finished_ns = now
        js.reap_at = time.monotonic() + max(0.0, float(reap_after))
        st.jobset_event(js, "MODIFIED")
        self._workload_finished(js, now, "Failed", "jobset failed due to one or more job failures")

    # ---- workload faults
    def write_lines(self, js: JobSetState, lines: list[str]) -> None:
        p = self.state.process0(js)
        if p is not None and p.current.state == "running":
            for line in lines:
                p.current.log.write(line)

    def repeat_lines(self, js: JobSetState, lines: int, age: float) -> int:
        """Process 0's log serves again a block of `lines` lines it held `age` seconds ago (the
        oldest it has when it is younger): the same stamps and text, appended to the current
        file. Kept out of the truth (copies, not lines written). Returns how many."""
        p = self.state.process0(js)
        if p is None or p.current.state != "running":
            return 0
        log = p.current.log
        mine = [e for lg, e in self.state.journal.get(js.spec.name, []) if lg is log]
        if not mine:
            return 0
        since = time.time_ns() - int(age * 1e9)
        first = next((i for i, e in enumerate(mine) if e.wall_ns >= since), len(mine) - 1)
        first = max(0, min(first, len(mine) - lines))
        block = mine[first:first + lines]
        for e in block:
            log.write(e.text, stamp_ns=e.ts_ns, journal=False)
        return len(block)

    def _targets(self, js: JobSetState, pod: str | None, all_pods: bool) -> list[Pod]:
        if pod is not None:
            return [self.state.pods[(js.spec.namespace, pod)]]
        if all_pods:
            return self.state.jobset_pods(js)
        return [p for p in [self.state.process0(js)] if p]

    def rotate(self, js: JobSetState, pod: str | None, all_pods: bool) -> None:
        """Rotate the log of running containers only, as kubelet does (pkg/kubelet/logs/
        container_log_manager.go rotateLogs skips every container not CONTAINER_RUNNING: an
        exited one writes nothing more, so its log stays whole and served)."""
        for p in self._targets(js, pod, all_pods):
            if p.current.state == "running":
                p.current.log.rotate()

    def flood(self, js: JobSetState, n_bytes: int, pod: str | None, all_pods: bool) -> None:
        """Running containers print `n_bytes` of compiler debug output at once."""
        at = datetime.now(UTC)
        for p in self._targets(js, pod, all_pods):
            inst = p.current
            if inst.state != "running":
                continue
            trainer = js.trainer if p.process_index == 0 else self._other_trainer(js, p.process_index)
            inst.log.floods += 1
            for line in trainer.verbose_lines(n_bytes, at, burst=inst.log.floods):
                inst.log.write(line, journal=False)  # no record in it: kept out of the truth's memory

    def restart_jobset(self, js: JobSetState, pending_seconds: float, grace_seconds: float,
                       head_rotated: int | None = None) -> None:
        if js.state in ("queued", "failed"):
            raise ValueError(f"JobSet {js.spec.name} is {js.state}: nothing to restart")
        st = self.state
        js.head_rotate_after = head_rotated
        now = time.time_ns()
        p0 = st.process0(js)
        if p0 is not None and p0.current.state == "running":
            for line in js.trainer.preemption_lines():
                p0.current.log.write(line)
        for p in st.jobset_pods(js):
            inst = p.current
            if inst.state == "running":
                inst.state, inst.reason, inst.finished_ns, inst.exit_code = "terminated", "Error", now, 137
                p.phase = "Failed"  # restartPolicy Never: a container killed by its deletion fails the pod
            inst.log.terminated = True
            p.deletion_ns = now + int(grace_seconds * 1e9)
            p.grace_seconds = int(math.ceil(grace_seconds))
            st.pod_event(p, "MODIFIED")
        js.resume_from = js.trainer.last_checkpoint(js.last_step) if js.state != "pending" else js.resume_from
        js.restart_attempt += 1
        st.create_pods(js, pending_seconds)
        st.jobset_event(js, "MODIFIED")

    def restart_container(self, js: JobSetState, pod: str | None, head_rotated: int | None = None) -> None:
        if js.state == "failed":
            raise ValueError(f"JobSet {js.spec.name} failed: its containers are not restarted (restartPolicy Never)")
        p = self.state.pods[(js.spec.namespace, pod)] if pod else self.state.process0(js)
        if p is None:
            raise KeyError("no such pod")
        if p.process_index == 0:
            js.head_rotate_after = head_rotated
        old = p.current
        now = time.time_ns()
        if p.process_index == 0 and old.state == "running":
            for line in js.trainer.preemption_lines():
                old.log.write(line)
        old.state, old.reason, old.finished_ns, old.exit_code = "terminated", "Error", now, 1
        old.log.terminated = True
        new = self.state.new_instance(p, old.restart_count + 1, state="running", reason="", started_ns=now)
        p.instances.append(new)
        if len(p.instances) > 2:  # kubelet keeps only the last dead container
            for gone in p.instances[:-2]:
                gone.log.gone_ns = now
            p.instances = p.instances[-2:]
        if p.process_index == 0 and js.state == "running":
            js.resume_from = js.trainer.last_checkpoint(js.last_step)
            js.incarnation += 1
            self._write_startup(js, p)
            js.next_step_at = time.monotonic() + js.interval
        elif js.state == "running":
            self._write_startup(js, p)
        self.state.pod_event(p, "MODIFIED")

    def delete_pod(self, namespace: str, name: str, grace_seconds: float) -> None:
        """`kubectl delete pod`: deletionTimestamp now + grace (its log readable until then),
        then DELETED and 404; with 0 at once."""
        st = self.state
        p = st.pods[(namespace, name)]
        now = time.time_ns()
        inst = p.current
        if inst.state == "running":
            inst.state, inst.reason, inst.finished_ns, inst.exit_code = "terminated", "Error", now, 137
            p.phase = "Failed"
        inst.log.terminated = True
        p.deletion_ns = now + int(grace_seconds * 1e9)
        p.grace_seconds = int(math.ceil(grace_seconds))
        st.pod_event(p, "MODIFIED")
        st.delete_expired_pods(now)

    def clock_step(self, js: JobSetState, seconds: float, pod: str | None) -> None:
        """Process 0's (or `pod`'s) node clock steps by `seconds` from now on (NTP): every later
        stamp, and the trainer's own absl times, are offset; a step back makes stamps go back."""
        delta = int(seconds * 1e9)
        for p in self._targets(js, pod, False):
            p.clock_offset_ns += delta
            for inst in p.instances:
                inst.log.clock_step(delta)

    @staticmethod
    def stamp_skew(js: JobSetState, micros: int, every: int, steps: int | None) -> None:
        js.skew = StampSkew(int(micros), max(1, int(every)), None if steps is None else int(steps))

    @staticmethod
    def stall(js: JobSetState, seconds: float) -> None:
        js.stalled_until = time.monotonic() + seconds

    @staticmethod
    def set_rate(js: JobSetState, steps_per_second: float) -> None:
        js.interval = 1.0 / steps_per_second if steps_per_second > 0 else math.inf
        js.next_step_at = time.monotonic() + min(js.interval, 3600)
