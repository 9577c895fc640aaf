"""The chaos oracle: what a follower recorded, judged against the simulator's truth (issue 19).

`judge(observation, store)` is the one verdict the tests and benchmarks/chaos.py share. It
reads the store only through steptail.storage's read functions and holds it to:

- every step servable for >= SERVABLE_SECONDS while the collector ran is recorded, exactly
  once, in the incarnation the trainer printed it in ("missed" otherwise);
- every step not recorded that was servable at some moment while a collector ran lies inside a
  recorded stream gap of its pod (by its stamp, or by log order: between the steps recorded
  either side of it) AND a gap finding, or after its incarnation's last recorded
  step under an unread_tail finding of that incarnation, or in a restart attempt the collector
  never saw a pod of, under that attempt's stream gap and an unread_tail finding ("lost unflagged" otherwise; "lost unseen":
  gone before any collector could look, and "unread at end": written less than 5 s before the
  collector stopped and still served, are counted, no offence);
- no trainer (incarnation, step) recorded twice ("duplicated"), no store incarnation the trainer
  did not start (a fork, or rows of two trainer incarnations in one: "false incarnations");
- no critical finding the truth does not contain ("false critical");
- with replicas: no pod followed by two accounts at once, every run whose owner was killed,
  stopped or cut off followed again within TAKEOVER_SECONDS of some replica running while the
  API served logs (all of them stopped at once, or an API outage: none can take anything over).
  A replica resumed after a freeze (SIGSTOP) has RESUME_GRACE to close the streams it held
  before its runs were taken over: only its own process can close them, and it learns of the
  loss at its first look after resuming.

Store rows are matched to the trainer's (incarnation, step) by the z_loss each printed (random
per incarnation and step; the kubelet stamp as a fallback), never by incarnation number: the
store may number incarnations differently (a late start) and stamps may go back.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace

from steptail.parsers.timestamps import parse_rfc3339
from steptail.runs.stream_gap import unseen_attempt_stream
from steptail.storage.db import Store
from steptail.storage.reads import iter_loss_parts, list_findings, stream_gaps

SERVABLE_SECONDS = 5.0
TAKEOVER_SECONDS = 10.0
RESUME_GRACE = 1.0  # a replica resumed from a freeze: one look (0.5 s) and a reconnect
GAP_KINDS = ("gap", "head_gap")
UNREAD_TAIL = "unread_tail"  # the lost tail of a deleted pod: after its last step read (_in_unread_tail)
COUNTS = ("servable", "recorded", "lost_flagged", "lost_unseen", "unread_at_end", "lost_unflagged", "missed", "duplicated",
          "false_incarnations", "false_critical", "double_follow", "slow_takeover")

_GOOD = ("servable", "recorded", "lost_flagged", "lost_unseen", "unread_at_end")  # counted, not offences


@dataclass
class Observation:
    """Everything a chaos run saw, in wall-clock seconds (time.time()): the schedule, the
    simulator's truth per JobSet at the end, when the collector ran, store row counts sampled
    while it ran, and (replicas) the pods/log requests and the moments owners were lost."""

    schedule: dict
    truths: dict[str, list]  # jobset -> [StepTruth]
    started: float  # the simulator's start (the schedule's `at` 0)
    collector: list[tuple[float, float]]  # spans when a collector was running
    samples: list[tuple[float, dict[str, int]]] = field(default_factory=list)  # (t, run -> rows)
    # (jobset, incarnation, step) -> [(from, to|None)] the API could serve its LOSS-PARTS line
    # (sim.truth.servable)
    servable: dict[tuple[str, int, int], list[tuple[float, float | None]]] = field(default_factory=dict)
    written: dict[tuple[str, int, int], float] = field(default_factory=dict)  # true wall time of the write
    unavailable: list[tuple[float, float]] = field(default_factory=list)  # API outages (auth lapses)
    log_reads: list = field(default_factory=list)  # api.LogRead
    owner_lost: list[tuple[float, str]] = field(default_factory=list)  # (t, account of the replica)
    running: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # account -> spans not stopped
    resumed: dict[str, list[float]] = field(default_factory=dict)  # account -> when it was resumed (SIGCONT)
    ended: float = 0.0
    # jobset -> [(written, first served or None, servable until or None)] of every process-0 line,
    # in seconds (sim.truth.servable): when the follower read again after a fault
    reads: dict[str, list[tuple[float, float | None, float | None]]] = field(default_factory=dict)
    # when each queued burst of refusals (fail_next, in the order fired) had its last one
    # answered, in seconds (None: never all answered): such a fault ends then, not when fired
    burst_ends: list[float | None] = field(default_factory=list)


@dataclass
class Verdict:
    seed: int
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTS, 0))
    worst_recovery: float = 0.0  # seconds from a fault's end to rows flowing again
    worst_read_recovery: float = 0.0  # seconds from a fault's end to the next line read (read_recovery)
    worst_unrecorded: float = 0.0  # longest a step never recorded was servable while following
    offending: list[str] = field(default_factory=list)  # one line per offence (the first few per kind)

    @property
    def ok(self) -> bool:
        return not any(self.counts[k] for k in COUNTS if k not in _GOOD)

    def line(self) -> str:
        c = self.counts
        bad = [f"{k}={c[k]}" for k in COUNTS if k not in _GOOD and c[k]]
        return (f"seed {self.seed}: {'PASS' if self.ok else 'FAIL'} servable={c['servable']} "
                f"recorded={c['recorded']} lost_flagged={c['lost_flagged']} lost_unseen={c['lost_unseen']} "
                f"recovery={self.worst_recovery:.1f}s read_recovery={self.worst_read_recovery:.1f}s "
                f"worst_unrecorded={self.worst_unrecorded:.1f}s" + (" " + " ".join(bad) if bad else ""))

    def offend(self, kind: str, text: str) -> None:
        self.counts[kind] += 1
        if sum(o.startswith(kind + ":") for o in self.offending) < 5:
            self.offending.append(f"{kind}: {text}")


def judge(obs: Observation, store: Store) -> Verdict:
    v = Verdict(obs.schedule["chaos"]["seed"])
    obs = replace(obs, collector=_union(obs.collector))
    for js, truth in sorted(obs.truths.items()):
        _judge_run(obs, store, js, truth, v)  # follow --all names each run after its JobSet
    v.worst_recovery = worst_recovery(obs)
    v.worst_read_recovery = worst_read_recovery(obs)
    if obs.log_reads:
        _judge_replicas(obs, v)
    return v


def _ns(ts: str) -> int:
    return parse_rfc3339(ts)


def _overlap(a: tuple[float, float], spans: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(a[1], e) - max(a[0], s)) for s, e in spans)


def servable_window(obs: Observation, js: str, t) -> list[tuple[float, float]] | None:
    """When the API could serve this step's LOSS-PARTS line, in seconds (the simulator's line
    truth, `sim.truth.servable`), less the API outages; None when the truth has no such line."""
    spans = obs.servable.get((js, t.incarnation, t.step))
    if spans is None:
        return None
    return _minus([(a, obs.ended if b is None else b) for a, b in spans], obs.unavailable)


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Overlapping spans merged: two replicas running at once are one collector running."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _minus(spans: list[tuple[float, float]], holes: list[tuple[float, float]]) -> list[tuple[float, float]]:
    for hs, he in holes:
        out = []
        for a, b in spans:
            if he <= a or hs >= b:
                out.append((a, b))
                continue
            if a < hs:
                out.append((a, hs))
            if he < b:
                out.append((he, b))
        spans = out
    return spans


def _overlap_all(spans: list[tuple[float, float]], collector: list[tuple[float, float]]) -> float:
    return sum(_overlap(s, collector) for s in spans)


def _z_loss(value) -> str | None:
    """z_loss as the trainer prints it (6 decimals of mantissa): random per (incarnation,
    step), so it tells which incarnation printed a stored row whatever its stamp."""
    try:
        return f"{float(value):.6e}"
    except (TypeError, ValueError):
        return None


def _printed_z_loss(loss_parts: str) -> str | None:
    for word in loss_parts.split():
        if word.startswith("z_loss="):
            return _z_loss(word.removeprefix("z_loss="))
    return None


def _judge_run(obs: Observation, store: Store, run: str, truth: list, v: Verdict) -> None:
    by_z = {(t.step, _printed_z_loss(t.loss_parts)): t for t in truth}
    by_ts = {(t.step, _ns(t.timestamp)): t for t in truth}
    rows = list(iter_loss_parts(store, run))
    # store incarnation -> trainer incarnations of its rows; trainer key -> store rows
    seen: dict[tuple[int, int], list[int]] = defaultdict(list)
    incs: dict[int, Counter] = defaultdict(Counter)
    unmatched: list[tuple] = []
    for inc, step, ts_ns, _ce, _raw, parts in rows:
        t = by_z.get((step, _z_loss((parts or {}).get("z_loss")))) or by_ts.get((step, ts_ns))
        if t is None:
            unmatched.append((inc, step, ts_ns))
            continue
        seen[(t.incarnation, t.step)].append(inc)
        incs[inc][t.incarnation] += 1
    mapping: dict[int, int] = {}  # store incarnation -> trainer incarnation
    claimed: dict[int, int] = {}
    for inc in sorted(incs):
        trainer_inc = incs[inc].most_common(1)[0][0]
        mapping[inc] = trainer_inc
        if trainer_inc in claimed:
            v.offend("false_incarnations", f"{run}: store incarnation {inc} repeats trainer incarnation "
                     f"{trainer_inc} (already store incarnation {claimed[trainer_inc]}): rows {dict(incs[inc])}")
        elif len(incs[inc]) > 1:
            v.offend("false_incarnations", f"{run}: store incarnation {inc} holds the rows of trainer "
                     f"incarnations {dict(incs[inc])} (a restart not recognized)")
        claimed.setdefault(trainer_inc, inc)
    for inc, step, ts_ns in unmatched:
        v.offend("false_incarnations", f"{run}: stored step {step} (incarnation {inc}, ts {ts_ns}) "
                 "that process 0 never wrote")
    back = {ti: si for si, ti in mapping.items() if claimed.get(ti) == si}
    last_recorded: dict[int, int] = {}  # store incarnation -> its highest recorded step
    for inc, step, *_ in rows:
        last_recorded[inc] = max(step, last_recorded.get(inc, step))
    gaps = stream_gaps(store, run)
    findings = list_findings(store, run)  # run, kind, incarnation, first_step, last_step, detail, severity, ns
    def right_of(t) -> list[int]:
        return [si for si in seen.get((t.incarnation, t.step), [])
                if mapping.get(si) == t.incarnation and back.get(t.incarnation) == si]

    bridges = _bridging(truth, right_of)
    for t in truth:
        key = (t.incarnation, t.step)
        got = seen.get(key, [])
        right = right_of(t)
        if len(got) > 1:
            v.offend("duplicated", f"{run}: trainer incarnation {t.incarnation} step {t.step} recorded "
                     f"{len(got)} times (store incarnations {got})")
        window = servable_window(obs, run, t)
        must = window is not None and _overlap_all(window, obs.collector) >= SERVABLE_SECONDS
        v.counts["servable"] += must
        if right:
            v.counts["recorded"] += 1
            continue
        if window is not None:  # servable while following, yet not recorded: how long at worst
            v.worst_unrecorded = max(v.worst_unrecorded, _overlap_all(window, obs.collector))
        if window is not None and _overlap_all(window, obs.collector) <= 0:
            v.counts["lost_unseen"] += 1  # gone before any collector could have read it
            continue
        if not must and any(b is None for _, b in obs.servable.get((run, t.incarnation, t.step), [])):
            v.counts["unread_at_end"] += 1  # still served when the collector stopped: not lost yet
            continue
        if must:
            v.offend("missed", f"{run}: incarnation {t.incarnation} step {t.step} (pod {t.pod}, ts "
                     f"{t.timestamp}) servable >= {SERVABLE_SECONDS:g} s while following, not recorded")
        lo, hi = bridges[id(t)]
        in_stream_gap = any(s.startswith(t.pod_uid + "/") and (
            a < _ns(t.timestamp) and (b is None or _ns(t.timestamp) <= b)  # by its stamp
            or (lo is None or lo <= a) and (hi is None or (b is not None and b <= hi)))  # by log order
            for s, a, b, _ in gaps) or _stepped_back_pair(gaps, t.pod_uid, lo, hi) \
            or any(s == unseen_attempt_stream(t.attempt) for s, *_ in gaps)  # its pod never seen
        target = back.get(t.incarnation)
        in_finding = any(f[1] in GAP_KINDS and f[3] <= t.step <= f[4] and (target is None or f[2] == target)
                         for f in findings) or _in_unread_tail(t.step, target, last_recorded, findings)
        if in_stream_gap and in_finding:
            v.counts["lost_flagged"] += 1
        else:
            v.offend("lost_unflagged", f"{run}: incarnation {t.incarnation} step {t.step} (pod {t.pod}, "
                     f"ts {t.timestamp}, rotated={t.rotated}, served={t.served}) lost; stream gap: "
                     f"{in_stream_gap}, gap finding: {in_finding}")
    justified = _justified_critical(obs.schedule, truth)
    for f in findings:
        if f[6] == "critical" and f[1] not in justified:
            v.offend("false_critical", f"{run}: {f[1]} incarnation {f[2]} steps {f[3]}-{f[4]}: {f[5][:160]}")


_TWO_WINDOWS = "two windows of stamps"  # collector.live.follower._stepped_back


def _stepped_back_pair(gaps: list, pod_uid: str, lo: int | None, hi: int | None) -> bool:
    """By log order, across a node clock stepped back: the collector records such a hole as two
    windows of stamps with one reason, the first from the last line read before it (at or after
    `lo`, the step recorded before), the second up to the first line read after it (at or
    before `hi`). A line stamped by a clock between two steps back lies in neither window, yet
    in the hole the pair bridges (chaos seed 1015)."""
    mine = [(a, b, why) for s, a, b, why in gaps if s.startswith(pod_uid + "/") and _TWO_WINDOWS in why]
    return any(why1 == why2 and b2 is not None and b2 < a1 and (lo is None or lo <= a1) and (hi is None or b2 <= hi)
               for a1, _, why1 in mine for _, b2, why2 in mine)


def _bridging(truth: list, right_of) -> dict[int, tuple[int | None, int | None]]:
    """For each step (by id): the stamps of the nearest steps recorded before and after it in
    its pod's log (None: none). A stream gap between them is a hole in the reading where the
    step was: it flags the step even when a node clock stepped back put its stamp outside the
    gap's window (the stamps of the lines either side of the hole)."""
    out: dict[int, tuple[int | None, int | None]] = {}
    by_pod: dict[str, list] = defaultdict(list)
    for t in truth:  # in write order
        by_pod[t.pod_uid].append(t)
    for steps in by_pod.values():
        prev: int | None = None
        for t in steps:
            out[id(t)] = (prev, None)
            if right_of(t):
                prev = _ns(t.timestamp)
        nxt: int | None = None
        for t in reversed(steps):
            out[id(t)] = (out[id(t)][0], nxt)
            if right_of(t):
                nxt = _ns(t.timestamp)
    return out


def _in_unread_tail(step: int, target: int | None, last_recorded: dict[int, int], findings: list) -> bool:
    """A step lost after the last recorded step of its incarnation, which an unread_tail
    finding of that incarnation flags: the tail of a pod deleted before its log was read to
    the end (unknown by number; the caller also asks for the stream gap that covers it). An
    incarnation never recorded (target None) is flagged by any unread_tail finding."""
    if target is not None and step <= last_recorded.get(target, 0):
        return False
    return any(f[1] == UNREAD_TAIL and (target is None or (f[2] == target and step > f[3])) for f in findings)


def _justified_critical(schedule: dict, truth: list) -> set[str]:
    """Critical kinds the truth holds: refused credentials while an auth lapse or denial was
    scheduled; a restart from step 1 after the run had gone further (no checkpoint yet)."""
    kinds = set()
    if any(f["action"] in ("auth_lapse", "deny") for f in schedule["faults"]):
        kinds.add("auth_failure")
    first: dict[int, int] = {}
    for t in truth:
        first.setdefault(t.incarnation, t.step)
    if any(inc > 1 and step == 1 for inc, step in first.items()):
        kinds.add("resume_from_zero")
    return kinds


def worst_recovery(obs: Observation) -> float:
    """Longest wait, after a fault ended while following, until the store gained rows of the
    run again; counted only where the trainer wrote a step afterwards that was then recorded,
    from the fault's end or, when no step was written yet, from the first one written after it
    that had to be recorded (a trainer quiet for 40 s after a fault is not 40 s of recovery: seed 1185), in seconds
    the API refused no log read (_readable)."""
    if not obs.samples:
        return 0.0
    worst, refusals = 0.0, _refusals(obs)
    for te, run in _ended_while_following(obs):
        before = _count_at(obs.samples, te, run)
        later = [w for t in obs.truths.get(run, [])
                 if (w := obs.written.get((run, t.incarnation, t.step), _ns(t.timestamp) / 1e9)) > te
                 and _must_be_read(obs, (run, t.incarnation, t.step))]
        if not later or max(_count_at(obs.samples, math.inf, run), 0) <= before:
            continue
        grown = next((t for t, c in obs.samples if t >= te and c.get(run, 0) > before), None)
        if grown is not None:
            worst = max(worst, _readable(refusals, min(max(te, min(later)), grown), grown))
    return worst


def _must_be_read(obs: Observation, key: tuple[str, int, int]) -> bool:
    """Whether the API served the step's line long enough that it must be recorded
    (SERVABLE_SECONDS; not a head rotated away as it was written); unknown: yes."""
    spans = obs.servable.get(key)
    return spans is None or any(b is None or b - a >= SERVABLE_SECONDS for a, b in spans)


def _ended_while_following(obs: Observation):
    """(when, JobSet) for every fault that ended while the collector ran, once per JobSet it hit."""
    names = [j["name"] for j in obs.schedule["jobsets"]]
    for _, te, f in _fault_spans(obs):
        if any(s <= te < e for s, e in obs.collector):
            for js in ([f["jobset"]] if f.get("jobset") else names):
                yield te, js


def _fault_spans(obs: Observation) -> list[tuple[float, float, dict]]:
    """(start, end, fault) in seconds: a queue of refusals lasts until its last one was answered
    (a 429's Retry-After spaces them out; sim.truth), the rest as scheduled."""
    from steptail.simcluster.chaos import fault_windows

    out = []
    bursts = iter(obs.burst_ends)
    for start, end, f in fault_windows(obs.schedule):
        ts, te = obs.started + start, obs.started + end
        if f["action"] == "fail_next":
            answered = next(bursts, te)
            te = max(te, obs.ended if answered is None else answered)
        out.append((ts, te, f))
    return out


# faults during which the API answers no log read of ours (a slow answer is still an answer)
_REFUSING = ("auth_lapse", "fail_next", "throttle", "hang_api")


# A follow read's path and query: a fault's `path` matches a request it is a part of, so "/pods"
# refuses log reads as much as "/log" does (a look at the newest line, `tailLines`, is not a read).
LOG_READ = "/api/v1/namespaces/ns/pods/pod/log?container=c&follow=true&sinceTime=t&timestamps=true"


def blocks_log_reads(path: str | None) -> bool:
    """Whether a fault on requests whose path and query contain `path` refuses log reads."""
    return path is None or path in LOG_READ


def _refusals(obs: Observation) -> list[tuple[float, float]]:
    return [(s, e) for s, e, f in _fault_spans(obs) if f["action"] in _REFUSING and blocks_log_reads(f.get("path"))]


def _readable(refusals: list[tuple[float, float]], a: float, b: float) -> float:
    """Seconds of [a, b] in which the API refused no log read: what a recovery is measured in
    (a fault that ends while, or just before, the API refuses every read cannot be recovered
    from until it answers again)."""
    cut, end = 0.0, a
    for s, e in sorted(refusals):
        s, e = max(s, end), min(e, b)
        if e > s:
            cut += e - s
            end = e
    return max(0.0, b - a - cut)


def worst_read_recovery(obs: Observation) -> float:
    """Longest wait, after a fault ended while following, until the API served a line of the
    JobSet again (sim.truth: a line's first response), counted from the fault's end or, when
    no line was waiting then, from the write of the first line that came after it, in seconds
    the API refused no log read (_readable), and only while a line was waiting: lines rotated
    away unread before the next ones were written leave a span with nothing to read (seed 44,
    replicated: 12.2 s counted where 2.3 s had a line waiting, its owner SIGKILLed). Faults
    after which nothing more was read are left to the lost-step counts."""
    worst, refusals = 0.0, _refusals(obs)
    for te, js in _ended_while_following(obs):
        lines = obs.reads.get(js, [])
        read = [r for _, r, _ in lines if r is not None and r > te]
        # waiting: servable at te and unread then, or written after it
        waiting = [(w, r, until) for w, r, until in lines
                   if (r is None or r > te) and (until is None or until > te)]
        if read and waiting:
            first = min(read)
            spans = [(max(te, w), min(first, *(t for t in (r, until) if t is not None))) for w, r, until in waiting]
            worst = max(worst, sum(_readable(refusals, a, b) for a, b in _union([sp for sp in spans if sp[1] > sp[0]])))
    return worst


def _count_at(samples: list[tuple[float, dict[str, int]]], t: float, run: str) -> int:
    last = 0
    for ts, counts in samples:
        if ts > t:
            break
        last = counts.get(run, 0)
    return last


def follow_spans(log_reads: list, until: float, follow_only: bool = True) -> dict[str, list[tuple[float, float, str]]]:
    """pod -> [(start, end, account)] of every follow stream (end: `until` for an open one);
    with `follow_only` False, every log read (a finished pod's last lines come by a plain read)."""
    out: dict[str, list[tuple[float, float, str]]] = {}
    for r in log_reads:
        if r.follow or not follow_only:
            out.setdefault(r.pod, []).append((r.start, r.end if r.end is not None else until, r.user))
    return out


def _clip(spans: dict[str, list[tuple[float, float, str]]], running: dict[str, list[tuple[float, float]]]):
    """Each stream cut to the times its replica ran: a SIGSTOPped replica's stream stays open at
    the server but reads nothing (its taking over by another replica is what must happen)."""
    out: dict[str, list[tuple[float, float, str]]] = {}
    for pod, ss in spans.items():
        for s, e, u in ss:
            for rs, re in running.get(u, [(s, e)]):
                if min(e, re) > max(s, rs):
                    out.setdefault(pod, []).append((max(s, rs), min(e, re), u))
    return out


def _after_resume(obs: Observation) -> dict[str, list[tuple[float, float]]]:
    """The running spans, each one that began with a resume shortened by RESUME_GRACE."""
    out = {}
    for account, spans in obs.running.items():
        resumed = obs.resumed.get(account, [])
        out[account] = [(a + RESUME_GRACE if any(abs(a - t) < 0.05 for t in resumed) else a, b)
                        for a, b in spans]
        out[account] = [(a, b) for a, b in out[account] if b > a]
    return out


def _judge_replicas(obs: Observation, v: Verdict) -> None:
    spans = _clip(follow_spans(obs.log_reads, obs.ended), obs.running)
    reads = _clip(follow_spans(obs.log_reads, obs.ended, follow_only=False), obs.running)
    for pod, ss in _clip(follow_spans(obs.log_reads, obs.ended), _after_resume(obs)).items():
        ss = sorted(ss)
        for i, a in enumerate(ss):
            for b in ss[i + 1:]:
                if b[0] >= a[1]:
                    break
                if b[2] != a[2]:
                    v.offend("double_follow", f"pod {pod} followed by {a[2]} ({a[0]:.2f}-{a[1]:.2f}) and "
                             f"{b[2]} ({b[0]:.2f}-{b[1]:.2f}) at once")
    last_write: dict[str, float] = {}
    for js, ts in obs.truths.items():
        for t in ts:
            w = obs.written.get((js, t.incarnation, t.step), _ns(t.timestamp) / 1e9)
            last_write[t.pod] = max(last_write.get(t.pod, 0.0), w)
    for lost_at, account in obs.owner_lost:
        held = [pod for pod, ss in spans.items() if any(u == account and s <= lost_at < e for s, e, u in ss)]
        for pod in held:
            if last_write.get(pod, 0.0) < lost_at + TAKEOVER_SECONDS:
                continue  # the pod wrote nothing more worth a takeover
            # followed again: a read (any replica's, the resumed one's too; a stream, or a plain
            # read of a pod that ended meanwhile) after the loss
            again = [max(s, lost_at) for s, e, u in reads[pod] if e > lost_at + 0.5 or s > lost_at]
            # the clock runs only while some replica runs and the API serves logs: all stopped
            # or killed at once, or the API serving none (the outages servable windows leave
            # out), none can take anything over
            late = _running_time(obs.running, lost_at, min(again), obs.unavailable) if again else math.inf
            if late > TAKEOVER_SECONDS:
                v.offend("slow_takeover", f"pod {pod}: its owner {account} was lost at "
                         f"{lost_at - obs.started:.1f} s; followed again after {late:.1f} s"
                         + (f" of replicas running ({min(again) - lost_at:.1f} s in all)" if again else ""))


def _running_time(running: dict[str, list[tuple[float, float]]], t0: float, t1: float,
                  outages: list[tuple[float, float]] = ()) -> float:
    """Seconds between t0 and t1 during which at least one replica ran (not stopped or killed)
    and the API was not out (`outages`: it served no log to anyone)."""
    total, end = 0.0, t0
    clipped = [(max(a, t0), min(b, t1)) for spans in running.values() for a, b in spans]
    spans = _minus([(a, b) for a, b in clipped if b > a], list(outages))  # (a span after t1 adds nothing)
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def summarize(verdicts: list[Verdict]) -> dict:
    """The benchmark's table: each count summed, the worst recovery, the failing seeds."""
    total = dict.fromkeys(COUNTS, 0)
    for v in verdicts:
        for k in COUNTS:
            total[k] += v.counts[k]
    return {"seeds": len(verdicts), **total,
            "worst_recovery_s": round(max((v.worst_recovery for v in verdicts), default=0.0), 2),
            "worst_read_recovery_s": round(max((v.worst_read_recovery for v in verdicts), default=0.0), 2),
            "worst_unrecorded_s": round(max((v.worst_unrecorded for v in verdicts), default=0.0), 2),
            "failing_seeds": [v.seed for v in verdicts if not v.ok]}
