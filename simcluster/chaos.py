"""Seeded random fault schedules for the simulated cluster (issue 19: find what nobody scheduled).

`draw_schedule(seed, ...)` draws, from `random.Random(seed)` only, a scenario dict the simulator
runs as it is (`scenario_of`): 1-12 JobSets at 0.5-500 lines/s and overlapping faults of every
kind the simulator knows. A seed reproduces its schedule exactly; `format_schedule` prints it
one fault a line so a failing seed can be read and replayed (`steptail simcluster --chaos SEED`).

What is not a simulator fault travels under the `chaos` key (`collector`): when `follow`
starts (late: after a rotation or a restart) and, with replicas, what happens to them
(SIGKILL and back, SIGSTOP/SIGCONT, their database sessions terminated, a rolling restart).

A kind is drawn only when `scenario.ACTIONS` has its action, so a schedule never names an
action the simulator refuses; database outages (`db_outage`) need a PostgreSQL store behind
the simulator's DbProxy (chaos_run.py gives it one; on SQLite they are left out).
"""

from __future__ import annotations

import json
import math
import random
import threading
import time

from steptail.simcluster.scenario import ACTIONS

LINES_PER_STEP = 7.0  # process 0 prints ~7 lines a step (2-6 noise, LOSS-PARTS, completed, RBF)


def _u(r: random.Random, lo: float, hi: float) -> float:
    return round(r.uniform(lo, hi), 2)


# ---- one drawer per fault kind: (rng, time, jobset) -> fault dicts (some kinds are a combo)
def _rotation_hang(r, t, js):
    return [{"at": t, "action": "rotate", "jobset": js}]


def _double_rotation(r, t, js):
    # a second rotation before the hung follower re-opens: the first rotated file's unread lines are gone
    return [{"at": t, "action": "rotate", "jobset": js}, {"at": round(t + _u(r, 0.05, 0.5), 2),
                                                          "action": "rotate", "jobset": js}]


def _eof(r, t, js):
    # a clean end (idle timeout), now and then a reset connection (no final chunk)
    return [{"at": t, "action": "eof_streams", **({"abort": True} if r.random() < 0.3 else {})}]


def _server_errors(r, t, js):
    return [{"at": t, "action": "fail_next", "n": r.randint(1, 6), "code": r.choice([500, 502, 503]),
             "path": r.choice(["/log", "/pods", None])}]


def _auth_lapse(r, t, js):
    return [{"at": t, "action": "auth_lapse", "seconds": _u(r, 0.5, 6.0)}]


def _deny(r, t, js):
    return [{"at": t, "action": "deny", "seconds": _u(r, 1.0, 8.0)}]


def _watch_corrupt(r, t, js):
    return [{"at": t, "action": "corrupt_pods", "seconds": _u(r, 0.5, 4.0)}]


def _restart_short(r, t, js):
    return [{"at": t, "action": "restart_jobset", "jobset": js, "grace_seconds": _u(r, 0.3, 2.0),
             "pending_seconds": _u(r, 0.2, 1.5)}]


def _restart_long(r, t, js):
    return [{"at": t, "action": "restart_jobset", "jobset": js, "grace_seconds": _u(r, 8.0, 30.0),
             "pending_seconds": _u(r, 0.2, 3.0)}]


def _container_restart(r, t, js):
    return [{"at": t, "action": "restart_container", "jobset": js}]


def _pod_deleted(r, t, js):
    # `kubectl delete pod` of process 0; the JobSet controller answers with a restart
    grace = 0.0 if r.random() < 0.5 else _u(r, 0.5, 5.0)
    return [{"at": t, "action": "delete_pod", "jobset": js, "grace_seconds": grace},
            {"at": round(t + _u(r, 0.1, 1.0), 2), "action": "restart_jobset", "jobset": js,
             "grace_seconds": _u(r, 0.3, 3.0), "pending_seconds": _u(r, 0.2, 1.5)}]


def _silence(r, t, js):
    return [{"at": t, "action": "stall", "jobset": js, "seconds": _u(r, 1.0, 10.0)}]


def _flood(r, t, js):
    return [{"at": t, "action": "flood", "jobset": js, "bytes": r.choice(["64Ki", "512Ki", "2Mi"])}]


def _rate_change(r, t, js, rates=(0.5, 500.0)):
    return [{"at": t, "action": "set_rate", "jobset": js, "steps_per_second": round(_steps_per_second(r, *rates), 3)}]


def _headless_restart(r, t, js):
    # a trainer restart whose start-up lines (and restore line) rotate away before anyone reads them
    action = r.choice(["restart_container", "restart_jobset"])
    return [{"at": t, "action": action, "jobset": js, "head_rotated": r.choice([0, 0, 1, 5])}]


def _slow_api(r, t, js):
    return [{"at": t, "action": "slow_api", "seconds": _u(r, 1.0, 8.0), "delay": _u(r, 0.2, 3.0),
             "path": r.choice(["/log", "/pods", None])}]


def _hang_api(r, t, js):
    return [{"at": t, "action": "hang_api", "seconds": _u(r, 0.5, 6.0), "path": r.choice(["/log", "/pods", None]),
             "streams": r.random() < 0.5}]


def _watch_gone(r, t, js):
    return [{"at": t, "action": "watch_gone", "mode": r.choice(["expired", "drop"])}]


def _db_outage(r, t, js):
    # the store goes away (refused, or a blackhole: connects hang), live sessions reset or
    # stalled; seconds 0: a database restart
    seconds = 0.0 if r.random() < 0.3 else _u(r, 1.0, 12.0)
    return [{"at": t, "action": "db_outage", "seconds": seconds, "mode": r.choice(["refuse", "blackhole"]),
             "existing": r.choice(["close", "close", "stall"])}]


def _stamp_skew(r, t, js):
    # containerd stamps stdout and stderr apart: LOSS-PARTS a few µs before the line before it
    return [{"at": t, "action": "stamp_skew", "jobset": js, "micros": r.choice([1, 5, 100, 5000]),
             "every": r.choice([1, 3, 20]), "steps": r.randint(5, 100)}]


def _clock_step(r, t, js):
    # NTP steps the node clock, mostly back (seconds or an hour), now and then forward
    return [{"at": t, "action": "clock_step", "jobset": js,
             "seconds": r.choices([-0.5, -2.0, -30.0, -3601.0, 7200.0], [2, 3, 1, 2, 1])[0]}]


# ---- issue 33: the combinations the simulator never drew, found by an independent one
def _slow_rotations(r, t, js):
    # every answer seconds late for a window, rotations seconds apart inside it: a re-read
    # that costs two slow round trips in series comes after the next rotation
    seconds = _u(r, 4.0, 8.0)
    out = [{"at": t, "action": "slow_api", "seconds": seconds, "delay": _u(r, 1.0, 3.0),
            "path": r.choice([None, None, "/log", "/pods"])}]
    at = t + _u(r, 0.2, 1.5)
    for _ in range(r.randint(2, 3)):
        out.append({"at": round(at, 2), "action": "rotate", "jobset": js})
        at += _u(r, 1.5, 5.0)
    return out


def _auth_then_5xx(r, t, js):
    # credentials refused for a while, then, as they come back, a burst of 5xx (an apiserver
    # restarting behind the load balancer): the follower's own back-off must not outlast it
    lapse = _u(r, 1.0, 5.0)
    return [{"at": t, "action": "auth_lapse", "seconds": lapse},
            {"at": round(t + lapse + _u(r, 0.0, 0.3), 2), "action": "fail_next", "n": r.randint(2, 6),
             "code": r.choice([500, 502, 503]), "path": r.choice([None, "/pods", "/log"])}]


def _log_503s(r, t, js):
    # 5-6 consecutive 503 on pods/log (kubelet unreachable through the apiserver's proxy) just
    # as the follower must open a new stream: its stream ended, its file rotated, or its pod
    # was replaced (the new one read while the old one drains)
    then = round(t + 0.05, 2)
    cause = r.choice(["eof", "rotate", "restart"])
    if cause == "eof":
        after = [{"at": then, "action": "eof_streams"}]
    elif cause == "rotate":
        after = [{"at": then, "action": "rotate", "jobset": js}]
    else:
        after = [{"at": then, "action": "restart_jobset", "jobset": js, "grace_seconds": _u(r, 3.0, 10.0),
                  "pending_seconds": _u(r, 0.2, 1.0)}]
    return [{"at": t, "action": "fail_next", "n": r.randint(5, 6), "code": 503, "path": "/log"}, *after]


def _throttled(r, t, js):
    # API Priority and Fairness: 429 with Retry-After: 1 (client-go waits and retries by itself)
    # for 1-12 s, however often one asks (a queue of n refusals made a client that asks less
    # often wait longer: the server's load does not follow one client's pace)
    return [{"at": t, "action": "throttle", "seconds": float(r.randint(1, 12)), "retry_after": 1,
             "path": r.choice([None, "/pods", "/log"])}]


def _old_repeat(r, t, js):
    # a block of old lines served again, unchanged: ~10 s old or ~10 min old (the oldest there is)
    return [{"at": t, "action": "repeat_lines", "jobset": js, "lines": r.choice([20, 40, 40, 80]),
             "age": r.choice([10.0, 10.0, 600.0])}]


def _clock_back_rotation(r, t, js):
    # NTP steps the node clock back (~20 s or ~1 h), then the log rotates
    out = [{"at": t, "action": "clock_step", "jobset": js, "seconds": r.choice([-20.0, -3600.0])},
           {"at": round(t + _u(r, 0.5, 3.0), 2), "action": "rotate", "jobset": js}]
    if r.random() < 0.5:
        out.append({"at": round(out[-1]["at"] + _u(r, 3.0, 6.0), 2), "action": "rotate", "jobset": js})
    return out


def _checkpoint_pause(r, t, js):
    # a steady stream (~40 lines/s) pauses 1 s (a checkpoint save), then rotates twice 5 s apart
    out = []
    if r.random() < 0.5:
        out.append({"at": round(max(0.0, t - 2.0), 2), "action": "set_rate", "jobset": js,
                    "steps_per_second": round(40.0 / LINES_PER_STEP, 3)})
    out.append({"at": t, "action": "stall", "jobset": js, "seconds": 1.0})
    first = round(t + 1.0 + _u(r, 0.5, 3.0), 2)
    return out + [{"at": first, "action": "rotate", "jobset": js},
                  {"at": round(first + 5.0, 2), "action": "rotate", "jobset": js}]


KINDS = {  # kind -> (weight, drawer, needs a simulator action)
    "rotation_hang": (3, _rotation_hang, "rotate"),
    "double_rotation": (2, _double_rotation, "rotate"),
    "eof": (2, _eof, "eof_streams"),
    "server_errors": (3, _server_errors, "fail_next"),
    "auth_lapse": (2, _auth_lapse, "auth_lapse"),
    "deny": (1, _deny, "deny"),
    "watch_corrupt": (1, _watch_corrupt, "corrupt_pods"),
    "restart_short": (2, _restart_short, "restart_jobset"),
    "restart_long": (1, _restart_long, "restart_jobset"),
    "container_restart": (2, _container_restart, "restart_container"),
    "pod_deleted": (1, _pod_deleted, "delete_pod"),
    "silence": (2, _silence, "stall"),
    "flood": (1, _flood, "flood"),
    "rate_change": (1, _rate_change, "set_rate"),
    "headless_restart": (1, _headless_restart, "restart_container"),
    "stamp_skew": (2, _stamp_skew, "stamp_skew"),
    "clock_step": (2, _clock_step, "clock_step"),
    "slow_api": (1, _slow_api, "slow_api"),
    "hang_api": (1, _hang_api, "hang_api"),
    "watch_gone": (2, _watch_gone, "watch_gone"),
    "db_outage": (2, _db_outage, "db_outage"),
    # issue 33 (appended: the kinds above keep their order, so ISSUE19_KINDS draws as before)
    "slow_rotations": (3, _slow_rotations, "slow_api"),
    "auth_then_5xx": (2, _auth_then_5xx, "auth_lapse"),
    "log_503s": (2, _log_503s, "fail_next"),
    "throttled": (1, _throttled, "throttle"),
    "old_repeat": (2, _old_repeat, "repeat_lines"),
    "clock_back_rotation": (2, _clock_back_rotation, "clock_step"),
    "checkpoint_pause": (2, _checkpoint_pause, "stall"),
}
# The kinds of issue 19, before issue 33's: a seed found with them reproduces its schedule
# when drawn with kinds=ISSUE19_KINDS (regression seeds of that time pin it).
ISSUE19_KINDS = ["rotation_hang", "double_rotation", "eof", "server_errors", "auth_lapse", "deny",
                 "watch_corrupt", "restart_short", "restart_long", "container_restart", "pod_deleted",
                 "silence", "flood", "rate_change", "headless_restart", "stamp_skew", "clock_step",
                 "slow_api", "hang_api", "watch_gone", "db_outage"]
ISSUE33_KINDS = ["slow_rotations", "auth_then_5xx", "log_503s", "throttled", "old_repeat",
                 "clock_back_rotation", "checkpoint_pause"]
# Not a timed fault: a JobSet object without optional fields (scenario `omit`), drawn after
# the faults (so it leaves their draws alone) unless `kinds` leaves it out.
MISSING_FIELDS = "missing_fields"
OMIT_CHOICES = [["image"], ["annotations"], ["annotations", "status"], ["status"], ["nodeSelector"],
                ["image", "annotations", "args", "resources", "volumes"]]
DB_KINDS = frozenset({"db_outage"})  # need a database server behind a proxy: not on SQLite


def available_kinds() -> list[str]:
    """The kinds this simulator can run (its ACTIONS), in a fixed order (reproducible draws)."""
    return [k for k, (_, _, action) in KINDS.items() if action in ACTIONS]


def _steps_per_second(r: random.Random, lo_lines: float, hi_lines: float) -> float:
    """Log-uniform line rate in [lo, hi] lines/s, as trainer steps/s."""
    lines = math.exp(r.uniform(math.log(lo_lines), math.log(hi_lines)))
    return lines / LINES_PER_STEP


def draw_schedule(seed: int, *, duration: float = 10.0, rates: tuple[float, float] = (0.5, 500.0),
                  jobsets: tuple[int, int] = (1, 12), replicas: int = 0, faults_per_second: float = 0.5,
                  late: str | None = None, kinds: list[str] | None = None, hosts: int = 1,
                  database: bool = True) -> dict:
    """A scenario dict (plus its `chaos` key, see the module doc) drawn from `seed` alone.

    duration: seconds of training the schedule spans (the trainers are sized to end near it);
    rates: (lo, hi) lines/s of process 0, log-uniform per JobSet; jobsets: (lo, hi) how many;
    replicas: 0 = one follower, else 2-3 `follow --all` replicas with their own faults;
    faults_per_second: mean fault density; late: None (drawn), "rotation" or "restart" forces
    `follow` to start after that fault, "no" forces a start at 0; kinds: restrict the kinds;
    database: False leaves out database outages (a SQLite store has no server to lose)."""
    r = random.Random(seed)
    names = [f"chaos-{i:02d}" for i in range(r.randint(*jobsets))]
    specs = []
    for name in names:
        sps = _steps_per_second(r, *rates)
        steps = max(8, round(sps * duration))
        specs.append({"name": name, "hosts": hosts, "rate": round(sps, 3),
                      "trainer": {"steps": steps, "seed": r.randint(0, 999),
                                  "checkpoint_period": max(2, round(steps / r.choice([3, 5, 8, 12])))}})
    scenario = {
        "namespace": "default", "seed": seed,
        "log_max_size": r.choice(["16Ki", "64Ki", "256Ki", "10Mi"]), "log_max_files": r.randint(2, 5),
        "grace_seconds": _u(r, 1.0, 10.0), "restart_pending_seconds": _u(r, 0.2, 2.0),
        "jobsets": specs,
    }
    pool = [k for k in (available_kinds() if kinds is None else kinds)
            if k in available_kinds() and (database or k not in DB_KINDS)]
    weights = [KINDS[k][0] for k in pool]
    faults: list[dict] = []
    for _ in range(_poisson(r, faults_per_second * duration) if pool else 0):
        kind = r.choices(pool, weights)[0]
        t = _u(r, 0.3, duration * 0.85)
        js = r.choice(names)
        drawn = _rate_change(r, t, js, rates) if kind == "rate_change" else KINDS[kind][1](r, t, js)
        faults += [{**f, "kind": kind} for f in drawn]
    # when follow starts: mostly at once; sometimes late, after a rotation or a restart
    mode = late or r.choices(["no", "rotation", "restart"], [6, 1, 1])[0]
    follow_at = 0.0
    if mode != "no":
        t = _u(r, 1.0, max(1.5, duration * 0.3))
        js = names[0]
        drawer = _double_rotation if mode == "rotation" else _restart_short
        faults += [{**f, "kind": f"before_follow_{mode}"} for f in drawer(r, t, js)]
        follow_at = round(t + _u(r, 0.5, 2.0), 2)
    faults.sort(key=lambda f: f["at"])
    collector = {"follow_at": follow_at, "late": mode, "replicas": replicas,
                 "events": _replica_events(r, duration, replicas, follow_at) if replicas else []}
    scenario["faults"] = faults
    scenario["chaos"] = {"seed": seed, "duration": duration, "collector": collector}
    if kinds is None or MISSING_FIELDS in kinds:  # drawn last: the draws above stay as they were
        for spec in specs:
            if r.random() < 0.3:
                spec["omit"] = list(r.choice(OMIT_CHOICES))
    return scenario


def _replica_events(r: random.Random, duration: float, replicas: int, start: float) -> list[dict]:
    """SIGKILL (back after a while, as a container restarts), SIGSTOP/SIGCONT (a hung replica),
    its database sessions terminated, and at most one rolling restart (chaos_run.Rollout: as the
    Deployment rolls, each successor ready before the replica it replaces stops)."""
    events = []
    for _ in range(max(1, _poisson(r, duration / 12))):
        kind = r.choices(["kill", "stop", "terminate_sessions", "rolling_restart"], [3, 2, 2, 1])[0]
        at = _u(r, start + 3.0, start + max(4.0, duration * 0.7))
        ev = {"at": at, "event": kind, "replica": r.randrange(replicas)}
        if kind == "kill":
            ev["back_after"] = _u(r, 1.0, 5.0)
        elif kind == "stop":
            ev["seconds"] = _u(r, 2.0, 15.0)
        events.append(ev)
    if sum(e["event"] == "rolling_restart" for e in events) > 1:
        first = next(e for e in events if e["event"] == "rolling_restart")
        events = [e for e in events if e["event"] != "rolling_restart" or e is first]
    return sorted(events, key=lambda e: e["at"])


def _poisson(r: random.Random, mean: float) -> int:
    """Knuth's method: small means only (a schedule's fault count)."""
    limit, k, p = math.exp(-mean), 0, r.random()
    while p > limit:
        k += 1
        p *= r.random()
    return k


# ---- using a schedule
def scenario_of(schedule: dict) -> dict:
    """The part the simulator runs: without the `chaos` key and the `kind` labels."""
    sc = {k: v for k, v in schedule.items() if k != "chaos"}
    sc["faults"] = [{k: v for k, v in f.items() if k != "kind"} for f in schedule["faults"]]
    return sc


def without_db_faults(schedule: dict) -> dict:
    """The schedule less its database outages (for a SQLite store: no server to lose)."""
    return {**schedule, "faults": [f for f in schedule["faults"] if f.get("kind") not in DB_KINDS]}


def collector_plan(schedule: dict) -> dict:
    return schedule["chaos"]["collector"]


def fault_windows(schedule: dict) -> list[tuple[float, float, dict]]:
    """(start, end) seconds after the start of each fault: a fault lasting `seconds` ends then,
    a restart when its grace (old pod) and pending (new pod) are over, the rest at once."""
    out = []
    for f in schedule["faults"]:
        end = f["at"] + float(f.get("seconds", 0.0) or 0.0)
        if f["action"] == "restart_jobset":
            end = f["at"] + float(f.get("pending_seconds", schedule.get("restart_pending_seconds", 2.0)))
        out.append((f["at"], end, f))
    return out


def format_schedule(schedule: dict) -> str:
    """The schedule, one fault a line, readable and replayable (`--chaos SEED` draws it again)."""
    ch = schedule["chaos"]
    col = ch["collector"]
    lines = [f"chaos seed {ch['seed']}: {len(schedule['jobsets'])} JobSets over {ch['duration']:g} s, "
             f"log_max_size {schedule['log_max_size']} x{schedule['log_max_files']}, "
             f"grace {schedule['grace_seconds']} s, pending {schedule['restart_pending_seconds']} s; "
             f"follow starts at {col['follow_at']:g} s ({col['late']})"
             + (f", {col['replicas']} replicas" if col["replicas"] else "")]
    for js in schedule["jobsets"]:
        lines.append(f"  jobset {js['name']}: {js['rate'] * LINES_PER_STEP:.1f} lines/s "
                     f"({js['rate']} steps/s), {js['trainer']['steps']} steps, "
                     f"checkpoint every {js['trainer']['checkpoint_period']}"
                     + (f", object without {', '.join(js['omit'])}" if js.get("omit") else ""))
    for f in schedule["faults"]:
        params = {k: v for k, v in f.items() if k not in ("at", "action", "kind")}
        lines.append(f"  t={f['at']:7.2f}s {f['kind']:<18} {f['action']} {json.dumps(params, sort_keys=True)}")
    for e in col["events"]:
        params = {k: v for k, v in e.items() if k not in ("at", "event")}
        lines.append(f"  t={e['at']:7.2f}s replica            {e['event']} {json.dumps(params, sort_keys=True)}")
    return "\n".join(lines)


class ChaosDriver:
    """Fires a schedule's faults on a running SimCluster at their `at`, counted from `t0`
    (time.monotonic()): the runner starts this clock once the follower is up, which the
    simulator's own scenario timeline (counted from its start) cannot do."""

    def __init__(self, sim, schedule: dict, t0: float) -> None:
        self.sim = sim
        self.faults = sorted(schedule["faults"], key=lambda f: f["at"])
        self.t0 = t0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-driver", daemon=True)

    def start(self) -> ChaosDriver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        from steptail.simcluster.scenario import FaultSpec

        for f in self.faults:
            if self._stop.wait(max(0.0, self.t0 + f["at"] - time.monotonic())):
                return
            try:
                self.sim.apply_fault(FaultSpec.from_dict({k: v for k, v in f.items() if k != "kind"}))
            except KeyError:  # its pod or JobSet is gone meanwhile (a restart's grace ended)
                pass
