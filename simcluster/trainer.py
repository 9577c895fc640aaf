"""A pure, deterministic generator of MaxText/tunix trainer output (process 0 and others).

Everything here is a function of the constructor arguments and (step, incarnation):
no I/O, no wall clock unless you pass ``at=``. The CE of a step is a function of
(seed, step) only, so a replay after a checkpoint restore prints the same CE unless
``replay_ce_offset`` is set (a broken restore), and runs of one seed print the same curve
whatever their ``context_parallelism``, as a correct mesh change must.

One exception, the simulated effect of the runbook's trap: ``context_parallelism > 1`` with
``load_balance=True`` (MaxText's ``context_parallel_load_balance``) prints a wrong CE, above
the correct curve of its seed by :meth:`Trainer.load_balance_error`: at step 1 what dense
Olmo 3 7B showed (+0.39 at cp4, +1.98 at cp8; other cp on the power law through those two),
growing linearly with the step to twice that by step ``1 + LB_DRIFT_STEPS`` (a model trained
on misplaced tokens drifts further from the right loss). The same cp with load balancing off
prints its seed's correct CE, so a cp1 run of the seed is its control.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

ANSI_GREEN = "\x1b[32m"
ANSI_RESET = "\x1b[0m"
THREAD_ID = 140233
DEFAULT_START = datetime(2026, 11, 30, 4, 0, 0, tzinfo=UTC)
N_LAYERS = 16
# context_parallel_load_balance=True at ici_context_parallelism>1: step-1 CE error measured on
# dense Olmo 3 7B (the runbook's Traps), and the steps over which the error doubles
LB_STEP1_ERROR = {4: 0.39, 8: 1.98}
LB_DRIFT_STEPS = 200


@dataclass
class EmittedStep:
    """Ground truth for one step as the trainer printed it."""

    incarnation: int
    step: int
    ce: float  # nan when injected
    loss_parts: str  # the LOSS-PARTS message (without absl prefix)
    rbf_max: float | None  # None when REQUIRED_RBF was dropped
    rbf_line: str | None
    tunix_loss: float
    checkpoint_saved: bool = False
    extra: dict = field(default_factory=dict)


def absl_prefix(at: datetime, file_line: str, severity: str = "I") -> str:
    """`I1130 04:00:11.726981 140233 train_sft.py:301] `"""
    return f"{severity}{at:%m%d %H:%M:%S}.{at.microsecond:06d} {THREAD_ID} {file_line}] "


class Trainer:
    def __init__(
        self,
        *,
        run_name: str = "olmo3-7b-sft",
        steps: int = 300,
        seed: int = 0,
        process_index: int = 0,
        process_count: int = 32,
        context_parallelism: int = 1,
        load_balance: bool = False,
        checkpoint_period: int = 50,
        nan_steps=(),
        no_rbf_steps=(),
        replay_ce_offset: float = 0.0,
        step_seconds: float = 12.0,
        start_time: datetime = DEFAULT_START,
    ) -> None:
        self.run_name = run_name
        self.steps = steps
        self.seed = seed
        self.process_index = process_index
        self.process_count = process_count
        self.context_parallelism = context_parallelism
        self.load_balance = load_balance
        self.checkpoint_period = checkpoint_period
        self.nan_steps = frozenset(int(s) for s in nan_steps)
        self.no_rbf_steps = frozenset(int(s) for s in no_rbf_steps)
        self.replay_ce_offset = replay_ce_offset
        self.step_seconds = step_seconds
        self.start_time = start_time
        # ground truth: every step printed, in order (process 0 only)
        self.truth: list[EmittedStep] = []
        # highest step printed by each incarnation (to know what is a replay)
        self.high_water: dict[int, int] = {}

    # ---- helpers -------------------------------------------------------------------------
    def _rng(self, *key) -> random.Random:
        return random.Random(":".join(str(k) for k in (self.seed, self.process_index, *key)))

    def _at(self, step: int, at: datetime | None) -> datetime:
        if at is not None:
            return at
        return self.start_time + timedelta(seconds=self.step_seconds * max(step, 0))

    def is_replay(self, step: int, incarnation: int) -> bool:
        return any(inc < incarnation and hw >= step for inc, hw in self.high_water.items())

    def last_checkpoint(self, upto_step: int) -> int:
        """Highest checkpoint step <= upto_step (0 when none)."""
        if self.checkpoint_period <= 0:
            return 0
        return (upto_step // self.checkpoint_period) * self.checkpoint_period

    # ---- values --------------------------------------------------------------------------
    def base_ce(self, step: int) -> float:
        r = random.Random(f"ce:{self.seed}:{step}")  # independent of process_index
        smooth = 3.8 - 1.25 * (1.0 - math.exp(-step / 180.0))
        return round(smooth + r.gauss(0.0, 0.008), 6)

    def load_balance_error(self, step: int) -> float:
        """How far the printed CE sits above base_ce: 0 unless context_parallelism > 1 with
        load_balance on (the module docstring says why)."""
        cp = self.context_parallelism
        if cp <= 1 or not self.load_balance:
            return 0.0
        at_step1 = LB_STEP1_ERROR.get(cp)
        if at_step1 is None:  # the power law through the two measurements
            at_step1 = LB_STEP1_ERROR[4] * (cp / 4) ** math.log2(LB_STEP1_ERROR[8] / LB_STEP1_ERROR[4])
        return at_step1 * (1.0 + max(step - 1, 0) / LB_DRIFT_STEPS)

    def ce(self, step: int, incarnation: int = 1) -> float:
        if step in self.nan_steps:
            return float("nan")
        ce = self.base_ce(step)
        if error := self.load_balance_error(step):
            ce = round(ce + error, 6)
        if self.replay_ce_offset and self.is_replay(step, incarnation):
            ce = round(ce + self.replay_ce_offset, 6)
        return ce

    def rbf(self, step: int) -> list[float]:
        r = random.Random(f"rbf:{self.seed}:{step}")
        return [round(r.uniform(1.0, 1.4), 4) for _ in range(N_LAYERS)]

    # ---- output --------------------------------------------------------------------------
    def startup_lines(self, restore_from: int | None = None, at: datetime | None = None) -> list[str]:
        t = at or self.start_time
        us = timedelta(microseconds=2143)
        lines = []

        def add(file_line: str, msg: str) -> None:
            nonlocal t
            lines.append(absl_prefix(t, file_line) + msg)
            t = t + us

        add("max_utils.py:273", "Attempting to initialize the jax distributed system...")
        add(
            "max_utils.py:290",
            f"Jax distributed system initialized! process_index={self.process_index} "
            f"process_count={self.process_count}",
        )
        params = [
            ("run_name", self.run_name),
            ("ici_context_parallelism", self.context_parallelism),
            ("context_parallel_load_balance", self.load_balance),
            ("ici_fsdp_parallelism", -1),
            ("steps", self.steps),
            ("checkpoint_period", self.checkpoint_period),
            ("per_device_batch_size", 1),
        ]
        for name, value in params:
            add("pyconfig.py:584", f"Config param {name}: {value}")
        if restore_from is not None and restore_from > 0:
            add("checkpointing.py:613", f"Restoring checkpoint from step {restore_from}.")
        return lines

    def preemption_lines(self) -> list[str]:
        return [
            "Traceback (most recent call last):",
            '  File "/app/train_sft.py", line 301, in train_loop',
            "jax.errors.JaxRuntimeError: UNAVAILABLE: TPU host preempted",
        ]

    def _noise(self, step: int, incarnation: int, at: datetime) -> list[str]:
        r = self._rng("noise", incarnation, step)
        pool = [
            lambda: f"{ANSI_GREEN}INFO{ANSI_RESET} tunix.sft.peft_trainer: train step done",
            lambda: "2026-11-30 04:00:00.000000: W external/xla/xla/service/gpu/some_pass.cc:123] "
            "Skipping fusion (benign)",
            lambda: absl_prefix(at, "maxtext_utils.py:1210") + "Memstats: After params initialized:",
            lambda: absl_prefix(at, "maxtext_utils.py:1216")
            + f"\tUsing (GB) 11.61 / 31.25 (37.152000%) on TPU_{self.process_index % 4}"
            f"(process={self.process_index},(0,0,0,0))",
            lambda: absl_prefix(at, "checkpoint_manager.py:1490")
            + f"[process={self.process_index}][thread=MainThread] Found 0 checkpoint steps in "
            "gs://ai2-olmo-dev/post-training/ckpt/run",
            lambda: absl_prefix(at, "grain_pool.py:420", "E")
            + f"Grain worker {r.randint(0, 7)} is slow to respond (retrying)",
            lambda: '  File "/app/src/maxtext/trainers/post_train/sft/train_sft.py", line 212, in <module>',
            lambda: absl_prefix(at, "data_loader.py:88")
            + "Loaded batch of 256 examples (packed 1048576 tokens)",
            lambda: absl_prefix(at, "goodput.py:77") + f"Goodput recorder: step time {self.step_seconds:.1f} s",
            lambda: absl_prefix(at, "xla_bridge.py:906", "W")
            + "Platform 'tpu' is experimental and not all JAX functionality may be correctly supported!",
        ]
        return [r.choice(pool)() for _ in range(r.randint(2, 6))]

    def verbose_lines(self, n_bytes: int, at: datetime, burst: int = 0) -> list[str]:
        """At least `n_bytes` of XLA compiler debug output (what a `--vmodule`/HLO dump prints
        to stderr): long lines, varied enough to compress like real logs, none a record."""
        r = self._rng("verbose", burst)
        head = absl_prefix(at, "hlo_pass_pipeline.cc:412")
        out, size, i = [], 0, 0
        while size < n_bytes:
            rows, cols, line_no = r.randint(1, 8192), r.randint(1, 8192), r.randint(20, 2400)
            line = (f"{head}HLO after fusion #{i}: %fusion.{r.randint(0, 1 << 20)} = bf16[{rows},{cols}]"
                    f"{{1,0:T(8,128)(2,1)}} fusion(bf16[{rows},{cols}] %param.{r.randint(0, 4096)}, "
                    f"f32[{cols}] %convert.{r.randint(0, 1 << 16)}), kind=kLoop, "
                    f"calls=%fused_computation.{r.randint(0, 1 << 16)}, metadata={{op_type=\"dot_general\" "
                    f"op_name=\"jit(train_step)/jvp(Transformer)/decoder/layers_{r.randint(0, 63)}/"
                    f"self_attention/query/dot_general\" source_file=\"/app/src/maxtext/layers/attentions.py\" "
                    f"source_line={line_no}}}, backend_config={{\"flag_configs\":[],\"scoped_memory_configs\":[],"
                    f"\"used_scoped_memory_configs\":[{{\"memory_space\":\"1\",\"size\":\"{r.randint(0, 1 << 24)}\"}}]}}"
                    f" cost={r.random():.6f} bytes_accessed={r.randint(0, 1 << 32)} hash={r.getrandbits(64):016x}")
            out.append(line)
            size += len(line) + 1
            i += 1
        return out

    def _completed(self, step: int, loss: float, r: random.Random, at: datetime) -> str:
        loss_s = "nan" if math.isnan(loss) else f"{loss:.3f}"
        return absl_prefix(at, "metric_logger.py:210") + (
            f"completed step: {step}, seconds: {self.step_seconds + r.uniform(-0.2, 0.3):.3f}, "
            f"TFLOP/s/device: {r.uniform(178.0, 182.5):.3f}, "
            f"Tokens/s/device: {r.uniform(3950.0, 4050.0):.3f}, total_weights: 1048576, loss: {loss_s}"
        )

    def step_lines(
        self, step: int, incarnation: int = 1, at: datetime | None = None, record: bool = True
    ) -> list[str]:
        """Everything printed for one step (noise, LOSS-PARTS, completed step, REQUIRED_RBF,
        checkpoint save). For process_index != 0 only noise and a per-pod `completed step`.
        With ``record`` (default) the step is appended to :attr:`truth`."""
        at = self._at(step, at)
        r = self._rng("step", incarnation, step)
        lines = self._noise(step, incarnation, at)
        if self.process_index != 0:
            pod_loss = self.base_ce(step) * 1.37 + r.uniform(-0.05, 0.05)
            lines.append(self._completed(step, pod_loss, r, at))
            if record:
                self.high_water[incarnation] = max(self.high_water.get(incarnation, 0), step)
            return lines
        ce = self.ce(step, incarnation)
        z_loss = r.uniform(1.15e-4, 1.32e-4)
        moe_lb = 0.0124
        if math.isnan(ce):
            total = tunix = float("nan")
            parts = (
                f"LOSS-PARTS step={step} ce=nan z_loss={z_loss:.6e} moe_lb={moe_lb:.6f} "
                f"total=nan tunix_loss=nan weights=1048576"
            )
        else:
            total = ce + z_loss + moe_lb
            tunix = total * 1.368 + r.uniform(-0.003, 0.003)
            parts = (
                f"LOSS-PARTS step={step} ce={ce:.6f} z_loss={z_loss:.6e} moe_lb={moe_lb:.6f} "
                f"total={total:.6f} tunix_loss={tunix:.6f} weights=1048576"
            )
        lines.append(absl_prefix(at, "train_sft.py:301") + parts)
        lines.append(self._completed(step, tunix, r, at))
        rbf_line = None
        rbf_max = None
        if step not in self.no_rbf_steps:
            per = self.rbf(step)
            rbf_max = max(per)
            program = "first_phase" if step <= 2 else "normal"
            rbf_line = (
                f"REQUIRED_RBF step={step} max={rbf_max:.4f} "
                f"per_layer=[{','.join(f'{v:.4f}' for v in per)}] program={program}"
            )
            lines.append(absl_prefix(at, "train.py:1333") + rbf_line)
        saved = self.checkpoint_period > 0 and step % self.checkpoint_period == 0
        if saved:
            lines.append(absl_prefix(at, "checkpointing.py:401") + f"Saved a checkpoint at step {step}.")
        if record:
            self.truth.append(
                EmittedStep(
                    incarnation=incarnation,
                    step=step,
                    ce=ce,
                    loss_parts=parts,
                    rbf_max=rbf_max,
                    rbf_line=rbf_line,
                    tunix_loss=tunix,
                    checkpoint_saved=saved,
                )
            )
            self.high_water[incarnation] = max(self.high_water.get(incarnation, 0), step)
        return lines

    def run_lines(self, until: int | None = None) -> list[str]:
        """Convenience: a whole fault-free incarnation 1 (start-up + steps 1..until)."""
        out = self.startup_lines()
        for s in range(1, (until or self.steps) + 1):
            out.extend(self.step_lines(s, 1))
        return out
