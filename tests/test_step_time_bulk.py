"""A bulk batch's step times taken in numpy (runs/step_time.py IncTimes.pods) are exactly
what pod() gives row by row: bursts, stamps missing or going back, seconds missing or NaN,
saves, a first step, across batches."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from steptail.runs.step_time import BULK, IncTimes

T0 = 1_796_011_200 * 10**9
SECONDS = st.one_of(st.none(), st.just(math.nan), st.floats(0, 100, allow_nan=False), st.sampled_from([10.0, 9.999]))


@st.composite
def batches(draw):
    step, ts, rows = draw(st.integers(-5, 50)), T0, []
    for _ in range(draw(st.integers(1, 3 * BULK))):
        step += draw(st.sampled_from([1, 1, 1, 0, 2, 9, -3]))
        ts += draw(st.sampled_from([10**10, 10**10, 50, 50, 0, -50, 999_999, 1_000_000, -10**9]))
        rows.append((step, draw(SECONDS), None if draw(st.integers(0, 9)) == 0 else ts))
    cut = draw(st.sampled_from([0, 1, 2, 3, len(rows) // 2, len(rows)]))
    saves = set(draw(st.lists(st.sampled_from([r[0] for r in rows] + [0]), max_size=5)))
    return rows[:cut], rows[cut:], saves


def state(t: IncTimes) -> tuple:
    seconds = [("nan" if math.isnan(v) else v) for v in t.seconds]
    return seconds, t.has_seconds, t.first_pod, t.last_pod, t.pod_anchor


@given(batches())
@settings(max_examples=300)
def test_a_bulk_batch_gives_what_pod_gives_row_by_row(case):
    before, after, saves = case
    loop, bulk = IncTimes(), IncTimes()
    loop.saves, bulk.saves = set(saves), set(saves)
    for part in (before, after):
        for row in part:
            loop.pod(*row)
        if part:
            bulk.pods(*(list(c) for c in zip(*part, strict=True)))
    assert state(bulk) == state(loop)


def test_a_median_over_many_samples_is_statistics_median():
    """IncTimes.median takes numpy's median from BULK samples on: the same value as
    statistics.median (the middle one, or the mean of the two middle ones), odd and even."""
    import random
    from statistics import median

    from steptail.runs.step_time import BULK, DECIDE_AT, IncTimes

    rng = random.Random(7)
    for n in (BULK - 1, BULK, BULK + 1, 1000, 1001):
        t = IncTimes()
        t.has_seconds = True
        t.seconds.extend(rng.choice((1.0, 1e-9, 1e9)) * rng.random() for _ in range(n))
        assert t.median() == median(t.seconds) and t.median(DECIDE_AT) == median(t.seconds[:DECIDE_AT])
        assert t.has_median()

