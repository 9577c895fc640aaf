"""Stall detection knows the checkpoint phase: the step after a save is judged against the
saves' own duration learned from the run (docs/verdicts.md), the same whether the rows come
one at a time or in blocks (the engine's steady path)."""

from __future__ import annotations

import random

import pytest

from steptail.parsers import format_ns
from steptail.runs.detectors import FindingEngine
from steptail.runs.findings import STALL
from steptail.runs.model import RunModel

T0 = 1_796_011_200 * 10**9


def saving_log(hung_at: int | None = None, steps: int = 400) -> list[bytes]:
    """10 s steps, a save every 20 steps that takes 35 s more (45 s to the next step: over
    3 x the median step time), and the save at `hung_at` taking 400 s."""
    out, t = [], T0
    for step in range(1, steps + 1):
        t += 10 * 10**9
        if step > 1 and (step - 1) % 20 == 0:
            t += (400 if step - 1 == hung_at else 35) * 10**9
        out.append(f"{format_ns(t)} I1130 train.py:1] LOSS-PARTS step={step} ce=2.5 z_loss=1e-04 total=2.5\n")
        if step % 20 == 0:
            out.append(f"{format_ns(t + 10**9)} I1130 ckpt.py:1] Saved a checkpoint at step {step}.\n")
    return [line.encode() for line in out]


def stalls(lines: list[bytes], cuts: set[int]) -> list[tuple]:
    model, engine = RunModel("r"), FindingEngine("r", clock=lambda: 0)
    found = []
    for i, line in enumerate(lines):
        model.feed(line)
        if i in cuts:
            found += engine.observe(model.take())
    found += engine.observe(model.take()) + engine.finish()
    return sorted((f.first_step, f.detail) for f in found if f.kind == STALL)


def test_ordinary_saves_are_no_stall():
    assert stalls(saving_log(), set()) == []


@pytest.mark.parametrize("seed", [1, 2])
def test_a_hung_save_is_a_stall_however_the_rows_come(seed):
    lines = saving_log(hung_at=200)
    whole = stalls(lines, set())
    assert [s for s, _ in whole] == [201]
    assert "which saved a checkpoint" in whole[0][1] and "came 410 s after step 200" in whole[0][1]
    rng = random.Random(seed)
    assert stalls(lines, {i for i in range(len(lines)) if rng.random() < 0.02}) == whole
    assert stalls(lines, set(range(len(lines)))) == whole  # one row at a time


def test_a_slow_ordinary_step_is_still_a_stall():
    lines = saving_log()
    at = next(i for i, line in enumerate(lines) if b"step=150 " in line)
    ts, rest = lines[at].split(b" ", 1)
    from steptail.parsers.fast import line_ts

    late = line_ts(lines[at]) + 60 * 10**9
    lines = lines[:at] + [format_ns(late).encode() + b" " + rest] + [
        format_ns(line_ts(line) + 60 * 10**9).encode() + b" " + line.split(b" ", 1)[1] for line in lines[at + 1:]]
    assert [s for s, _ in stalls(lines, set())] == [150]


def test_live_the_wait_after_a_save_line_is_the_saves_own():
    lines = [line for line in saving_log(steps=40)]  # ends with step 40 and its save line
    model, engine = RunModel("r"), FindingEngine("r", clock=lambda: 0)
    for line in lines:
        model.feed(line)
    assert engine.observe(model.take()) == []
    sec = 10**9
    assert engine.tick(60 * sec) == []  # over 3 x 10 s, under 3 x the 45 s a save took before
    [f] = engine.tick(140 * sec)
    assert (f.kind, f.first_step) == (STALL, 41)
