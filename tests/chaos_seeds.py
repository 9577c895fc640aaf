"""The chaos seeds the suite runs (tests/test_chaos.py), and the regression seeds: each seed
that found a defect stays here with the defect named, so it is replayed forever.

A seed's schedule is `draw_schedule(seed, **SHORT, **extra)`; print it with
`python -c "from steptail.simcluster.chaos import *; print(format_schedule(draw_schedule(SEED, ...)))"`
or serve it with `steptail simcluster --chaos SEED --chaos-duration 5`."""

from steptail.simcluster.chaos import ISSUE19_KINDS, ISSUE33_KINDS, MISSING_FIELDS

# short schedules at high line rates: each seed runs in ~10-15 s wall
SHORT = {"duration": 5.0, "rates": (70.0, 500.0), "jobsets": (1, 3), "faults_per_second": 0.8}
# the seeds of issue 19 keep the schedules they were found with (issue 33 added kinds after)
I19 = {"kinds": ISSUE19_KINDS}

# (seed, extra draw_schedule arguments); late starts among them (after a rotation, a restart)
SEEDS = [
    (101, I19), (102, I19), (103, I19), (104, I19), (105, I19), (106, I19), (107, I19), (108, I19),
    (109, I19), (110, I19),
    (111, {**I19, "late": "rotation"}),
    (112, {**I19, "late": "restart"}),
    (113, {"kinds": ["stamp_skew", "clock_step", "rotation_hang"]}),
    (114, {"kinds": ["restart_short", "restart_long", "container_restart", "headless_restart", "pod_deleted"]}),
]

# 2 replicas on PostgreSQL under SIGKILL / SIGSTOP / session kills / a rolling restart
REPLICATED = (201, {"duration": 14.0, "rates": (40.0, 200.0), "jobsets": (4, 6), "replicas": 2,
                    "faults_per_second": 0.4, **I19})

# What each fixed seed found on the code of 2026-12-01 (issue 19 items 1-7, or new: A, B, C).
# Shown with a failing seed's verdict; a seed that passes again keeps its entry as history.
FOUND = {
    101: "A: a container restarted in place before follow reached its pod: the current container "
         "recorded as incarnation 1 and again as 2 (100 steps twice), the previous one never read, "
         "unflagged (timing-dependent: passes on an idle machine)",
    102: "1: five 503 on pod lists, then undeserializable pods: discovery backs off past the run "
         "(follow started late, after a restart): nothing recorded",
    103: "4: the head rotated away before the first read is a stream gap but no gap finding; "
         "5: stamp_skew (LOSS-PARTS 5 ms before the line before it) drops servable steps",
    105: "B: a restart whose start-up lines rotated away (head_rotated) is merged into the previous "
         "incarnation; 1: after an auth lapse + hang, servable steps missed; 4: head; then (s105) the "
         "restart's replay from checkpoint 41 (step 42) unread, in no head gap; then (CI, under load) a restart "
         "before the first save (period 41) whose step 1 rotated away: its head taken to start after the last "
         "step read, step 1 in no gap finding",
    106: "4: head lost to rotation, no gap finding; B: head-rotated restart merged; 1: missed after an auth lapse; "
         "then (s105) a restart's replay from a checkpoint below the previous container's last step, "
         "unread, in no head gap; --previous read first with its head rotated away: no stream gap; then (CI, "
         "under load) the reader fell behind, steps 41-195 rotated away, the pod pre-empted: its last read served "
         "the pre-emption notice alone, a stream gap with no step after it and no finding",
    109: "4: head lost to a double rotation: stream gap, no gap finding",
    110: "1: 500 x5 on pod lists as follow starts (late, after a restart): backs off past the run; "
         "lost steps of the new pod without a stream gap",
    111: "4: follow started after a rotation: steps from 195 on only, stream gap but no gap finding; "
         "1 (discovery): six 500s on the first pod lists retried for 7.75 s (2 s cap): process 0 first "
         "read after its log file rotated, steps 199-205 missed (under load only)",
    112: "A: follow started after an in-place container restart: previous and current containers "
         "merged into one incarnation, served steps 53-57 dropped, unflagged",
    114: "4 and C: restarts and pod deletions in a row: heads and unread tails of deleted pods are "
         "stream gaps without a gap finding",
    201: "B: replicas, a JobSet restart during a rolling restart merged into incarnation 1; "
         "2: steps servable >= 5 s missed across the rolling restart's handovers",
}

# seed -> (draw_schedule arguments, the stores it runs on, the defect it found); seeds found
# outside the fixed set above, kept as regression cases
REGRESSIONS: dict[int, tuple[dict, tuple[str, ...], str]] = {
    5: ({"duration": 6.0, "rates": (70.0, 500.0), "jobsets": (1, 2), "late": "no", "kinds": ["db_outage"],
         "faults_per_second": 0.3}, ("postgresql",),
        "6: a 3 s database blackhole at 0.4 s: the ownership connection fails, the runs stop, what "
        "was read is dropped and re-read from the committed cursor after the log rotated: 350-450 "
        "steps lost (stream gaps without a gap finding: 4)"),
    1190: ({"duration": 20.0, "rates": (0.5, 50.0), "jobsets": (1, 12), "faults_per_second": 0.15, **I19},
           ("sqlite",),
           "benchmark seed (2026-12-01): a node clock stepped 2 h ahead and kept it; every line after it stayed "
           "a clock jump until the cursor's 256 were spent, then each was dropped as a bad line: steps 51-97 "
           "of chaos-01 missed, in no gap"),
}

# Fixed seeds that fail on the code of the day (106 again since 2026-12-07): run, shown as
# xfail with what they find, so a fix shows as XPASS; remove the entry when one lands.
STILL_FAILING: dict[int, str] = {
    106: "1: the last step of chaos-01 (incarnation 2, step 149), written during a 2.9 s auth lapse as "
         "its trainer ended, servable 7.6-8 s after it and never recorded, though the stream was re-read "
         "0.5 s after the lapse (a rotation gap, 94-148, flagged): CI on PostgreSQL under load and a "
         "fresh-clone run on SQLite alone (2026-12-07); passes when run by itself (timing-dependent)",
}

# Issue 33: seeds of the new kinds, failing on the code of 2026-12-04 (main 8a473e2) until the
# recovery and identity branches merge; what each lost then (SQLite).
# seed -> (draw_schedule arguments, stores, loss). ISSUE33_ARGS: all new kinds, dense (0.5 fault
# combos a second over 12 s, 1-2 JobSets at 40-200 lines/s); ONE_KIND: one kind, 1 JobSet, 15 s.
ISSUE33_ARGS = {"duration": 12.0, "rates": (40.0, 200.0), "jobsets": (1, 2), "faults_per_second": 0.5,
                "kinds": [*ISSUE33_KINDS, MISSING_FIELDS]}
ONE_KIND = {"duration": 15.0, "rates": (40.0, 200.0), "jobsets": (1, 1), "faults_per_second": 0.25, "late": "no"}
# the benchmark's draw (benchmarks/chaos.py --duration 30, its other defaults)
BENCH30 = {"duration": 30.0, "rates": (0.5, 50.0), "jobsets": (1, 12), "faults_per_second": 0.15}
BENCH20 = {**BENCH30, "duration": 20.0}  # benchmarks/chaos.py --duration 20
ISSUE33: dict[int, tuple[dict, tuple[str, ...], str]] = {
    401: ({**ONE_KIND, "kinds": ["old_repeat"]}, ("sqlite", "postgresql"),
          "1: blocks of 20-80 lines ~10 s and ~10 min old served again: steps 1-12 recorded twice, 2 false "
          "incarnations, a false critical resume_from_zero, then 45 steps servable >= 5 s missed, unflagged"),
    402: ({**ONE_KIND, "kinds": ["clock_back_rotation"]}, ("sqlite",),
          "3: node clock stepped back 20 s and 1 h, then rotations: steps 97-100 lost in a stream gap "
          "with no gap finding"),
    403: ({**ONE_KIND, "kinds": ["log_503s"]}, ("sqlite",),
          "3: 5-6 consecutive 503 on pods/log as a stream must be reopened: 202 of 229 steps servable "
          ">= 5 s missed, 93 unflagged; no line read after the bursts until the run ended"),
    # found by the benchmark on 2026-12-04 (lead 7929433). 1001 since its fix: steps 47-50 (rotated
    # away 1.6 s into the hang, before any look could see it) are a flagged stream gap. Its 429s
    # were then nine queued refusals on /log, met only after the rotation, 1 s apart (Retry-After)
    # under the 2.3 s-slow API: ~10 s before a line. They are drawn as a 9 s throttle since (API
    # Priority and Fairness refuses for a span of time, not a count), which ends before the hang.
    1001: (BENCH30, ("sqlite",),
           "1: slow API over rotations with 429s queued on /log: the stream hung on a rotated file, the "
           "container exited, and each -f opened again was killed after 1 s of quiet before the API "
           "answered it, forever: steps 47-71 lost, unflagged (no stream gap, no gap finding)"),
    # found by the 200-seed benchmark of 2026-12-04 (main b0ebac1): the oracle's verdict, not the
    # collector's; it reads the two windows as one hole by log order since (oracle._stepped_back_pair)
    1015: (BENCH20, ("sqlite",),
           "1: the node clock stepped back 1 h, then 30 s more 0.2 s later, during 503s on /log, then "
           "a rotation: step 21 (stamped between the two steps) rotated away unread; a gap finding "
           "names steps 21-24, but the stream gaps' two windows of stamps (before the first step, "
           "after the last) leave out the stamps of the clock between the steps"),
    # found by the same run; fixed by opening the re-read with the look (collector.live.spare)
    1195: (BENCH20, ("sqlite",),
           "3: every pod and log request 2.06 s late for 7.7 s while 16 KiB logs rotate every few "
           "seconds: a rotation hang was seen after 2 s of quiet and a 2 s look, then read again in "
           "one 2 s request: steps 13-14 of chaos-03 and 14 of chaos-02, servable 5-6 s, rotated "
           "away first (flagged, not recorded)"),
    1007: (BENCH30, ("sqlite",),
           "1: an old block served again as the JobSet restarted held steps 30-37, once rotated away "
           "unread: a step going back, the next going on from it: taken for a replay, a false "
           "incarnation 2 (8 rows)"),
    # found by the 200-seed benchmark of 2026-12-06 (main 1ed9370); failed on cd61e26 too
    66: (BENCH20, ("sqlite",),
         "1: a JobSet restart whose new pod's head rotated away unread (incarnation 2 read from step "
         "30), then its oldest lines served again: its own start-up line, read after its steps, was "
         "taken for a restart: a false incarnation 3 with 29 rows, steps 31-35 filed there, 52-54 missed"),
    306: (ISSUE33_ARGS, ("sqlite",),
          "2: auth lapses then 5xx bursts, 503s on logs, a slow API over rotations: steps servable "
          ">= 5 s missed, 27.7 s from a fault's end to the next line read"),
    # found by the PostgreSQL benchmark of 2026-12-07 (seeds 160-199, main ab04c92); SQLite too.
    # Flagged since: the next pod's restart-attempt label tells of the attempt never seen
    # (collector.live.unseen_attempts), a stream gap and an unread_tail finding
    196: (BENCH20, ("sqlite",),
          "a JobSet restart attempt that lived and ended unseen: follow started after a restart (4.25 s) "
          "while 502s refused its pod lists; the new pod (attempt 1) wrote step 1 and was deleted (grace "
          "0) before a list succeeded, then the JobSet restarted again: attempt 1's step 1 lost with no "
          "stream gap (no uid was ever seen) and no finding; attempt 2 is recorded as incarnation 1"),
}
