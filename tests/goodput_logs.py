"""A process-0 log with known timing, for the goodput tests: three incarnations, a queued gap,
replayed steps, checkpoint saves that cost time, profiler steps without `seconds`, ramp-up lines
without TFLOP/Tokens fields, and a slow third incarnation on another mesh.

Its figures (docs/goodput.md), worked out by hand from the stamps written below:"""

from __future__ import annotations

from datetime import UTC, datetime

T0_NS = 1_796_011_200_000_000_000  # 2026-11-30T04:00:00Z
EXPECTED = {
    "wall_s": 3275.001, "productive_s": 2500.0, "replayed_s": 300.0, "recovery_s": 395.0,
    "checkpoint_s": 35.0, "other_s": 45.001, "goodput": 2500.0 / 3275.001,
}
EXPECTED_RESTARTS = [
    {"incarnation": 2, "recovery_s": 360.0, "down_s": 300.0, "startup_s": 10.0, "compile_s": 50.0},
    {"incarnation": 3, "recovery_s": 35.0, "down_s": 30.0, "startup_s": 5.0, "compile_s": 0.0},
]
EXPECTED_INCARNATIONS = [
    {"incarnation": 1, "median_step_s": 10.0, "step_s_mad": 0.0, "tokens_per_s_device": 1000.0,
     "tflops_per_device": 100.0},
    {"incarnation": 2, "median_step_s": 10.0, "step_s_mad": 0.0, "tokens_per_s_device": 1000.0,
     "tflops_per_device": 100.0},
    {"incarnation": 3, "median_step_s": 20.0, "step_s_mad": 0.0, "tokens_per_s_device": 500.0,
     "tflops_per_device": 50.0},
]


def _line(t: float, msg: str, stamped: bool = True) -> str:
    ns = T0_NS + round(t * 1e9)
    d = datetime.fromtimestamp(ns / 1e9, UTC)
    glog = f"I{d:%m%d %H:%M:%S}.{d.microsecond:06d} 140233 train.py:1] {msg}"
    return f"{d:%Y-%m-%dT%H:%M:%S}.{ns % 10**9:09d}Z {glog}" if stamped else glog


def timed_log(fsdp3: int = 4, slow: float = 20.0) -> str:
    """The log's text; `fsdp3` is incarnation 3's ici_fsdp_parallelism (1 and 2 have 8) and
    `slow` its step time (1 and 2 step in 10 s)."""
    out: list[str] = []

    def start(t: float, fsdp: int) -> None:
        out.append(_line(t, "Attempting to initialize the jax distributed system..."))
        out.append(_line(t, "Jax distributed system initialized! process_index=0 process_count=32"))
        for name, value in (("ici_fsdp_parallelism", fsdp), ("per_device_batch_size", 1),
                            ("max_target_length", 4096), ("steps", 200)):
            out.append(_line(t, f"Config param {name}: {value}"))

    def step(t: float, n: int, seconds: float | None, tokens: float, tflops: float) -> None:
        out.append(_line(t, f"LOSS-PARTS step={n} ce=3.5 z_loss=1e-04 moe_lb=0.01 total=3.51 weights=1048576"))
        fields = [f"completed step: {n}"]
        if seconds is not None:
            fields.append(f"seconds: {seconds:.3f}")
        if not 2 <= n <= 5:  # ramp-up lines carry no throughput
            fields += [f"TFLOP/s/device: {tflops:.3f}", f"Tokens/s/device: {tokens:.3f}"]
        out.append(_line(t + 0.001, ", ".join(fields)))

    # incarnation 1: start at 0, step 1 (40 s: compilation) at 50, 10 s steps, a save at 50
    # costing 20 s, profiler steps 20-24 without seconds; dies after step 80 (at 860).
    start(0, 8)
    t = 50.0
    step(t, 1, 40.0, 1000, 100)
    for n in range(2, 81):
        t += 30 if n == 51 else 10
        step(t, n, None if 20 <= n <= 24 else 10.0, 1000, 100)
        if n == 50:
            out.append(_line(t + 5, "Saved a checkpoint at step 50."))
    # incarnation 2: queued 300 s, restores from 50, step 51 (60 s: 50 s compilation) 70 s after
    # its start; a save at 100 costing 15 s; a save at 150 is its last line.
    t = 860.001 + 300
    start(t, 8)
    out.append(_line(t, "Restoring checkpoint from step 50."))
    t += 70
    step(t, 51, 60.0, 1000, 100)
    for n in range(52, 151):
        t += 25 if n == 101 else 10
        step(t, n, 10.0, 1000, 100)
        if n == 100:
            out.append(_line(t + 5, "Saved a checkpoint at step 100."))
    out.append(_line(t + 5, "Saved a checkpoint at step 150."))
    # incarnation 3: 30 s down, restores from 150, on another mesh, `slow` s steps.
    t += 5 + 30
    start(t, fsdp3)
    out.append(_line(t, "Restoring checkpoint from step 150."))
    t += 25
    for n in range(151, 201):
        step(t, n, slow, 1000 * 10 / slow, 100 * 10 / slow)
        t += slow
    return "\n".join(out) + "\n"


def bursty_log(burst: int, seconds: bool = True, stalls: tuple[int, ...] = (), steps: int = 60) -> str:
    """Two incarnations of 10 s steps on one mesh: the first's `steps` lines reach the kubelet
    `burst` steps at a time (one stamp, microseconds apart, as a buffered stdout or a lagging
    pipe hands them over), the second's 60 as each step ends. `seconds`: `completed step` lines
    carry them; `stalls`: steps of the second whose lines come 60 s late (and every later one)."""
    out: list[str] = []
    for inc, (first, last) in enumerate(((1, steps), (steps + 1, steps + 60)), start=1):
        t0 = 0.0 if inc == 1 else 10.0 * steps + 100
        out.append(_line(t0, "Jax distributed system initialized! process_index=0 process_count=32"))
        out.append(_line(t0, "Config param ici_fsdp_parallelism: 8"))
        if inc == 2:
            out.append(_line(t0, f"Restoring checkpoint from step {steps}."))
        for n in range(first, last + 1):
            ends = t0 + 10 * (n - first + 1) + 60 * sum(1 for x in stalls if inc == 2 and x <= n)
            at = ends if inc == 2 else t0 + 10 * (-(-(n - first + 1) // burst) * burst) + 1e-5 * n
            out.append(_line(at, f"LOSS-PARTS step={n} ce=3.5 z_loss=1e-04 moe_lb=0.01 total=3.51 weights=1048576"))
            fields = [f"completed step: {n}"] + (["seconds: 10.000"] if seconds else [])
            out.append(_line(at + 1e-6, ", ".join(fields)))
    return "\n".join(out) + "\n"


def stored_and_full(store, run: str) -> tuple[dict, dict]:
    """(the run's figures as stored at commit, the full recomputation's), as JSON gives them back."""
    import json

    from steptail.storage.goodput import recompute_on, timing_on

    with store.engine.connect() as conn:
        return timing_on(conn, run).report(), json.loads(json.dumps(recompute_on(conn, run).report()))
