"""The chaos seeds the suite runs (tests/test_chaos.py), and the regression seeds: each seed
that found a defect stays here with the defect named, so it is replayed forever.

A seed's schedule is `draw_schedule(seed, **SHORT, **extra)`; print it with
`python -c "from steptail.simcluster.chaos import *; print(format_schedule(draw_schedule(SEED, ...)))"`
or serve it with `steptail simcluster --chaos SEED --chaos-duration 5`."""

# short schedules at high line rates: each seed runs in ~10-15 s wall
SHORT = {"duration": 5.0, "rates": (70.0, 500.0), "jobsets": (1, 3), "faults_per_second": 0.8}

# (seed, extra draw_schedule arguments); late starts among them (after a rotation, a restart)
SEEDS = [
    (101, {}), (102, {}), (103, {}), (104, {}), (105, {}), (106, {}), (107, {}), (108, {}),
    (109, {}), (110, {}),
    (111, {"late": "rotation"}),
    (112, {"late": "restart"}),
    (113, {"kinds": ["stamp_skew", "clock_step", "rotation_hang"]}),
    (114, {"kinds": ["restart_short", "restart_long", "container_restart", "headless_restart", "pod_deleted"]}),
]

# 2 replicas on PostgreSQL under SIGKILL / SIGSTOP / session kills / a rolling restart
REPLICATED = (201, {"duration": 14.0, "rates": (40.0, 200.0), "jobsets": (4, 6), "replicas": 2,
                    "faults_per_second": 0.4})

# seed -> (draw_schedule arguments, the defect it found: issue 19 item, or a new one)
REGRESSIONS: dict[int, tuple[dict, str]] = {}
