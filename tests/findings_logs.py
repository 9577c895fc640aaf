"""Helpers for the findings tests (no tests here): small real-shaped logs built line by line,
fed through the real run model, into the engine or into a store."""

from __future__ import annotations

from pathlib import Path

from steptail.parsers import format_ns
from steptail.runs.detectors import FindingEngine
from steptail.runs.model import RunModel
from steptail.storage.sql import SqlSink

T0 = 1_796_011_200_000_000_000  # 2026-11-30T04:00:00Z
SEC = 1_000_000_000


class LogBuilder:
    """Process-0 lines with kubelet timestamps: start-up, config, steps, restores."""

    def __init__(self, step_seconds: float = 12.0, t0: int = T0) -> None:
        self.step_ns = int(step_seconds * SEC)
        self.t = t0
        self.lines: list[bytes] = []

    def add(self, msg: str, advance_ns: int = 1000) -> LogBuilder:
        self.t += advance_ns
        self.lines.append(f"{format_ns(self.t)} {msg}\n".encode())
        return self

    def start(self, process_count: int = 32, restore: int | None = None, **config) -> LogBuilder:
        self.add("I1130 max_utils.py:273] Attempting to initialize the jax distributed system...")
        self.add(f"I1130 max_utils.py:290] Jax distributed system initialized! process_index=0 "
                 f"process_count={process_count}")
        for name, value in config.items():
            self.add(f"I1130 pyconfig.py:584] Config param {name}: {value}")
        if restore is not None:
            self.add(f"I1130 checkpointing.py:613] Restoring checkpoint from step {restore}.")
        return self

    def step(self, step: int, ce: float | str, rbf: bool = True, after_s: float | None = None) -> LogBuilder:
        self.t += self.step_ns if after_s is None else int(after_s * SEC)
        self.add(f"I1130 train_sft.py:301] LOSS-PARTS step={step} ce={ce} z_loss=1.2e-04 total=3.9", 0)
        if rbf:
            self.add(f"I1130 train.py:1333] REQUIRED_RBF step={step} max=1.2500 per_layer=[1.0,1.25] program=normal")
        return self

    def steps(self, lo: int, hi: int, ce=lambda s: 3.8 - s * 1e-3, skip=(), no_rbf=()) -> LogBuilder:
        for s in range(lo, hi + 1):
            if s in skip:
                self.t += self.step_ns
                continue
            self.step(s, f"{ce(s):.6f}", rbf=s not in no_rbf)
        return self


def sample_lines(path: Path) -> list[bytes]:
    with open(path, "rb") as f:
        return list(f)


def feed_engine(run: str, lines: list[bytes], every: int = 1, finish: bool = True, **kwargs):
    """The live path: the run model's batches, taken every `every` lines, into one engine.
    Returns (engine, [new findings per batch])."""
    model, engine, outputs = RunModel(run), FindingEngine(run, **kwargs), []
    for i, line in enumerate(lines, 1):
        model.feed(line)
        if i % every == 0:
            outputs.append(engine.observe(model.take()))
    outputs.append(engine.observe(model.take()))
    if finish:
        outputs.append(engine.finish())
    return engine, outputs


def store_lines(store, run: str, lines: list[bytes]) -> None:
    """Write lines through the run model and the SQL sink, as `ingest` does."""
    sink, model = SqlSink(store), RunModel(run)
    for line in lines:
        model.feed(line)
    with store.engine.begin() as conn:
        sink.ensure_run(conn, run)
        sink.write(conn, run, model.take())


def keys(findings) -> set[tuple]:
    return {(f.kind, f.incarnation, f.first_step, f.last_step) for f in findings}
