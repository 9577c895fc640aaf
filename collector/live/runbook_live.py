"""The runbook's rules on the live JobSets (`follow`): the same policy and CEL rules as `lint`
(runs/runbook.py), evaluated on each followed JobSet as the API serves it, its process-0
pods, its Kueue Workload and its neighbours' start times; each broken rule a finding of the
run (kind `rule:<name>`), stored, alerted and counted like every other finding (handed to the
run's Detectors, committed with its next batch).

Also the runbook's "delete your own failed JobSet only after saving its pod logs": a JobSet
that fails is archived (`follow --archive DIR`: the `archive` hook) before anyone deletes it,
and one deleted with its logs unsaved is a finding (`logs_not_saved`).

Evaluated when something changed: a JobSet's signature (its resourceVersion, its Workload's
state, its process-0 pods, its neighbours) is compared with the last one evaluated, so a
quiet fleet costs a dictionary lookup per JobSet and pass."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime

from steptail.collector.cluster.discovery import Discovery, PodInfo
from steptail.collector.cluster.jobsets import OWN_FAILURES, ClusterObjects, jobset_failed
from steptail.runs import manifest
from steptail.runs.findings import (
    CRITICAL,
    INFO,
    LOAD_BALANCE_RULE,
    LOGS_NOT_SAVED,
    NO_INCARNATION,
    NO_STEP,
    WARNING,
    Finding,
    rule_kind,
)
from steptail.runs.rule_text import cite
from steptail.runs.runbook import Policy, RuleFinding, evaluate
from steptail.storage.db import Store
from steptail.storage.run_files import ARCHIVE_MANIFEST, run_files

log = logging.getLogger("steptail.follow")
INTERVAL = 1.0  # seconds between passes when nothing wakes it sooner
STAGGER = {"hosts": 32, "seconds": 600}  # defaults of the policy's settings.stagger
# Every rule at once not evaluable (the JobSet cannot be read): one info finding, not one a rule.
RULES_NOT_EVALUABLE = rule_kind("runbook")


@dataclass
class RunTarget:
    """What the monitor needs of one run followed here (collector.live.supervisor fills it)."""

    run: str
    jobset: str
    detectors: object  # collector.live.detect.Detectors
    follower: object  # collector.live.follower.RunFollower (its model: pod -> incarnation)


@dataclass
class _State:
    signature: tuple | None = None
    raised: set = field(default_factory=set)  # (rule, incarnation, detail) handed out
    pods: dict[str, int] = field(default_factory=dict)  # pod name -> incarnation, as the model opened them
    failed: bool = False
    archived: bool = False
    archiving: asyncio.Task | None = None
    deleted: bool = False
    ran: bool = False  # process-0 pods were seen: from then on they, not the templates, are checked
    unreadable: str = ""  # why the JobSet could not be read, as last said (not evaluable)


class RunbookLive:
    def __init__(self, policy: Policy, objects: ClusterObjects, discovery: Discovery,
                 targets: Callable[[], dict[str, RunTarget]], store: Store, *,
                 archive: Callable[[str, str], Awaitable[bool]] | None = None, metrics=None) -> None:
        self.policy, self.objects, self.discovery, self.targets = policy, objects, discovery, targets
        self.store, self.archive, self.metrics = store, archive, metrics
        self.states: dict[str, _State] = {}  # by JobSet
        self.wake = asyncio.Event()
        self.evaluations = 0  # JobSets evaluated (their signature changed)
        self.passes = 0
        self._host_counts: dict[tuple, int] = {}
        stagger = policy.settings.get("stagger") if isinstance(policy.settings.get("stagger"), dict) else {}
        self.big_hosts = int(stagger.get("hosts", STAGGER["hosts"]))
        self.window_ns = int(float(stagger.get("seconds", STAGGER["seconds"])) * 1e9)
        objects.on_change = self._changed

    async def close(self) -> None:
        """Archives still running at shutdown are cancelled (their finished files stay, the
        manifest says what is complete; `archive` resumes them)."""
        tasks = [st.archiving for st in self.states.values() if st.archiving is not None and not st.archiving.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def _changed(self, kind: str, jobset: str, deleted: bool) -> None:
        if kind == "jobsets" and deleted:
            self._deleted(jobset)
        self.wake.set()

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            try:
                self.check_all()
            except Exception as exc:  # noqa: BLE001 - a rule bug costs rules, never the following
                log.warning("runbook rules on the live JobSets: %s", exc)
            self.wake.clear()
            try:
                async with asyncio.timeout(INTERVAL):  # not wait_for: on 3.11 it can swallow a cancel
                    await self.wake.wait()
            except TimeoutError:
                pass

    # -- one pass ----------------------------------------------------------------------------
    def ready(self) -> bool:
        """Both lists read (or the Workloads' failing for good: no Kueue, no RBAC): before that a
        rule would be judged without what the other list holds, and the first message stays."""
        o = self.objects
        if not o.listed["jobsets"]:
            return False
        failing = o.health["workloads"].failing
        return o.listed["workloads"] or (failing is not None and failing[0] in OWN_FAILURES)

    def check_all(self) -> int:
        """Evaluate every followed JobSet whose signature changed; returns how many were."""
        if not self.ready():
            self._not_readable()
            return 0
        self.passes += 1
        targets = self.targets()
        starts = self._starts()
        n = 0
        for jobset, target in targets.items():
            state = self.states.setdefault(jobset, _State())
            self._learn_pods(target, state)
            obj = self.objects.jobsets.get(jobset)
            if obj is None:  # not listed (yet, or the role lacks jobsets): pod rules wait for it
                continue
            if jobset_failed(obj) and not state.failed:
                state.failed = True
                self._failed(jobset, target, state)
            pods = [p for p in self.discovery.process0(jobset) if not p.deleting]
            workload = self.objects.workload_of(jobset)
            facts = self._facts(jobset, obj, workload, starts)
            signature = (obj["metadata"].get("resourceVersion"), workload, tuple((p.uid, p.image) for p in pods),
                         tuple(sorted(state.pods.items())), repr(facts.get("stagger")))
            if signature == state.signature:
                continue
            state.signature = signature
            n += 1
            # once its pods ran, between a restart's old pods and new ones too, the pods speak
            state.ran = state.ran or bool(pods) or bool(state.pods)
            try:
                found = evaluate(self.policy, obj, [p.view for p in pods], facts, live=True)
            except Exception as exc:  # noqa: BLE001 - an object the views cannot read: said once per change
                log.warning("%s: runbook rules not checked on JobSet %s (resourceVersion %s): cannot read it "
                            "(%s: %s)", target.run, jobset, signature[0], type(exc).__name__, str(exc)[:200])
                continue
            self._raise(target, state, found, state.ran)
            if target.follower is not None:
                target.follower.set_hosts(self._hosts(obj) or None)
        self.evaluations += n
        return n

    def _not_readable(self) -> None:
        """The JobSets cannot be listed for good (RBAC denies them, no JobSet CRD): every rule
        is not evaluable on each followed run, said once per reason (info, never a breach)."""
        failing = self.objects.health["jobsets"].failing
        if failing is None or failing[0] not in OWN_FAILURES:
            return  # not yet listed, or a passing fault: the rules wait for the list
        why = f"the JobSet (the collector cannot list jobsets: {failing[0]})"
        for jobset, target in self.targets().items():
            state = self.states.setdefault(jobset, _State())
            if state.unreadable == why:
                continue
            state.unreadable = why
            target.detectors.cluster_findings([Finding(
                RULES_NOT_EVALUABLE, target.run, NO_INCARNATION, NO_STEP, NO_STEP,
                f"not evaluable: {why} missing; the runbook's rules were not checked on JobSet {jobset}",
                INFO, time.time_ns())])

    def _learn_pods(self, target: RunTarget, state: _State) -> None:
        """pod -> incarnation, from the model's current incarnation as it moves on."""
        model = getattr(target.follower, "model", None)
        cur = getattr(model, "current", None)
        if cur is not None and cur.pod and cur.pod not in state.pods:
            state.pods[cur.pod] = cur.number

    def _facts(self, jobset: str, obj: dict, workload, starts: dict[str, int]) -> dict:
        facts: dict = {"live": True}  # a rule's `requires` may ask for what only live tells (the Workload)
        if workload is not None:
            facts["workload"] = {"name": workload.name, "admitted": workload.admitted,
                                 "active": workload.active, "finished": workload.finished}
        mine = starts.get(jobset)
        if mine is not None and self._hosts(obj) >= self.big_hosts:
            # the JobSet that started second, within the window, is the one that did not wait
            before = [(mine - t, other) for other, t in starts.items()
                      if other != jobset and t <= mine and mine - t < self.window_ns
                      and self._hosts(self.objects.jobsets.get(other)) >= self.big_hosts]
            if before:
                gap, other = min(before)
                facts["stagger"] = {"neighbour": other, "seconds": int(gap // 10**9),
                                    "window": int(self.window_ns // 10**9)}
        return facts

    def _hosts(self, obj: dict | None) -> int:
        """The JobSet's host count, computed once per resourceVersion (each pass asks it of
        every neighbour)."""
        if obj is None:
            return 0
        meta = obj["metadata"]
        key = (meta.get("name"), meta.get("resourceVersion"))
        if key not in self._host_counts:
            if len(self._host_counts) > 4 * max(len(self.objects.jobsets), 64):
                self._host_counts.clear()  # deleted and changed JobSets' counts go
            try:
                self._host_counts[key] = manifest.shape(manifest.templates(obj))["hosts"]
            except Exception:  # noqa: BLE001 - a JobSet the views cannot read is not a big slice
                self._host_counts[key] = 0
        return self._host_counts[key]

    def _starts(self) -> dict[str, int]:
        """When each JobSet's pods last started loading: its newest process-0 pod's creation."""
        out: dict[str, int] = {}
        for p in list(self.discovery.pods.values()):
            t = _created_ns(p)
            if p.jobset and t is not None and not p.deleting:
                out[p.jobset] = max(out.get(p.jobset, 0), t)
        return out

    def _raise(self, target: RunTarget, state: _State, found: list[RuleFinding], live: bool) -> None:
        """One finding per (rule, incarnation). A rule on the JobSet itself: incarnation 0 (the
        run as submitted). A rule on pods: once process-0 pods run (`live`), theirs only, each
        at the incarnation that pod's lines opened (a pod not read yet: the next one the model
        will open), raised once per message; before any pod runs, the templates', at 0."""
        grouped: dict[tuple[str, int], list[RuleFinding]] = {}
        said = {(r, d) for r, _, d in state.raised}
        model = getattr(target.follower, "model", None)
        upcoming = (getattr(model, "count", 0) or 0) + 1
        for rf in found:
            inc = NO_INCARNATION
            on_pod = rf.path.startswith("pods/")
            if on_pod:
                inc = state.pods.get(rf.path[len("pods/"):].split(".", 1)[0], upcoming)
            elif live and self._scope(rf.rule) != "jobset":
                continue  # the pods running say what runs; the template may have changed since
            if (rf.rule, inc, rf.message) in state.raised or (on_pod and (rf.rule, rf.message) in said):
                continue
            said.add((rf.rule, rf.message))
            grouped.setdefault((rf.rule, inc), []).append(rf)
        now = time.time_ns()
        out = []
        for (rule, inc), rfs in grouped.items():
            if rule_kind(rule) == LOAD_BALANCE_RULE:  # one finding with the config lines': cite where
                top = max(rfs, key=lambda rf: _rank(rf.severity))
                detail = cite(top.message, list(dict.fromkeys(_seen_in(rf.path) for rf in rfs
                                                              if rf.severity == top.severity)))
            else:
                detail = "; ".join(dict.fromkeys(f"{rf.message} ({rf.path})" if rf.path else rf.message
                                                 for rf in rfs))
            for rf in rfs:
                state.raised.add((rule, inc, rf.message))
            out.append(Finding(rule_kind(rule), target.run, inc, NO_STEP, NO_STEP, detail[:2000],
                               max((rf.severity for rf in rfs), key=_rank), now))
        if out:
            target.detectors.cluster_findings(out)

    def _scope(self, rule: str) -> str:
        try:
            return self.policy.rule(rule).scope
        except StopIteration:
            return "jobset"

    # -- failed JobSets: logs saved before deletion ------------------------------------------
    def _failed(self, jobset: str, target: RunTarget, state: _State) -> None:
        if self.archive is None:
            log.warning("%s: JobSet %s failed; save its pod logs before deleting it "
                        "(steptail archive --jobset %s, or follow --archive DIR)", target.run, jobset, jobset)
            return
        log.warning("%s: JobSet %s failed: archiving its pod logs before anyone deletes it", target.run, jobset)
        state.archiving = asyncio.get_running_loop().create_task(self._archive(jobset, target, state))

    async def _archive(self, jobset: str, target: RunTarget, state: _State) -> None:
        try:
            state.archived = await self.archive(jobset, target.run)
        except Exception as exc:  # noqa: BLE001 - said, and the deletion check still runs
            log.error("%s: archiving failed JobSet %s: %s", target.run, jobset, exc)

    def _deleted(self, jobset: str) -> None:
        state = self.states.get(jobset)
        target = self.targets().get(jobset)
        if state is None or target is None or state.deleted or not state.failed:
            return
        state.deleted = True
        if state.archived or self._archived_in_store(target.run):
            return
        detail = (f"failed JobSet {jobset} was deleted before its pod logs were saved"
                  + (" (the archive was still running)" if state.archiving is not None and not state.archiving.done()
                     else "") + ": save them first (steptail archive, or follow --archive DIR)")
        target.detectors.cluster_findings([Finding(LOGS_NOT_SAVED, target.run, NO_INCARNATION, NO_STEP, NO_STEP,
                                                   detail, WARNING, time.time_ns())])

    def _archived_in_store(self, run: str) -> bool:
        try:
            with self.store.engine.connect() as conn:
                return bool(run_files(conn, run, ARCHIVE_MANIFEST))
        except Exception as exc:  # noqa: BLE001 - unknown: say it is not saved rather than guess
            log.debug("archive record of %s: %s", run, exc)
            return False


def _rank(severity: str) -> int:
    return {INFO: 0, WARNING: 1, CRITICAL: 2}.get(severity, 1)


def _seen_in(path: str) -> str:
    """Where a rule was seen, as a finding cites it: a live pod's or the JobSet's trainer args."""
    if path.startswith("pods/"):
        return f"the trainer args of pod {path[len('pods/'):].split('.', 1)[0]}"
    return f"the JobSet's trainer args ({path})" if path else "the JobSet's trainer args"


def _created_ns(p: PodInfo) -> int | None:
    """PodInfo.created is the client's datetime as text (`2026-12-02 07:00:00+00:00`)."""
    try:
        t = datetime.fromisoformat(p.created) if p.created else None
    except ValueError:
        return None
    return None if t is None or t.tzinfo is None else int(t.timestamp()) * 10**9
