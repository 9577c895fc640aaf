"""Block states computed from columns (runs.goodput_columns, what a commit recomputes) are
exactly runs.goodput.block_state's, block after block: bursts, stamps going back, steps lost,
saves, later incarnations' cuts, values on a rounding tie of the histograms' 4 figures. And a
bulk commit that takes its rows from the batch rather than reading them back stores what the
full recomputation gives, also when the store refused one of them."""

from __future__ import annotations

from unittest.mock import patch

import pytest
from goodput_logs import stored_and_full
from hypothesis import given, settings
from hypothesis import strategies as st

from steptail.parsers import format_ns
from steptail.runs import goodput as gp
from steptail.runs import goodput_columns as gc
from steptail.runs.model import RunModel
from steptail.runs.rows import POD_METRICS
from steptail.storage.sql import SqlSink

T0 = 1_796_011_200 * 10**9
# values on and beside the edges of 4 significant figures (ties, powers of ten, zero's sign)
AWKWARD = [float("inf"), float("-inf"), float("nan"), 12345.0, 1234.5, 0.5, 999.95, 9999.5, 9999.4, 10000.0, 1e-20, 1e30, -3.25, 0.0, -0.0, 0.001,
           123.45, 4000.5, 180.05, 9.9995, 10.0005, 1e-18, 2.5e24]
VALUE = st.one_of(st.none(), st.sampled_from(AWKWARD),
                  st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False),
                  st.integers(0, 20_000).map(lambda n: n / 1000))


@st.composite
def incarnation(draw):
    n = draw(st.integers(1, 90))
    step = draw(st.integers(-20, 40))
    ts = T0 + draw(st.integers(0, 10**12))
    rows = []
    for _ in range(n):
        step += draw(st.sampled_from([1, 1, 1, 2, 7, 40]))
        # bursts (under 1 ms), ordinary steps, stamps going back
        ts += draw(st.sampled_from([0, 1_000, 999_999, 1_000_000, 10**9, 10**10, -5_000, -10**9]))
        rows.append((step, ts, draw(VALUE), draw(VALUE), draw(VALUE)))
    steps = [r[0] for r in rows]
    first = draw(st.sampled_from([steps[0], steps[0] - 3]))
    saves = set(draw(st.lists(st.sampled_from(steps + [s - 1 for s in steps]), max_size=6)))
    cuts = draw(st.lists(st.integers(steps[0] - 5, steps[-1] + 5), max_size=4))
    prev = draw(st.one_of(st.none(), st.just((steps[0] - 1, rows[0][1] - 10**9)),
                          st.just((steps[0] - 2, rows[0][1] - 500, steps[0] - 9, rows[0][1] - 10**10)),
                          st.just((steps[0] - 1, rows[0][1] - 10, None, None))))
    started = draw(st.one_of(st.none(), st.just(rows[0][1] - 3 * 10**9), st.just(rows[0][1] + 10**9)))
    return rows, prev, first, started, saves, cuts


@given(incarnation())
@settings(max_examples=300)
def test_columns_give_block_states_exactly(case):
    rows, prev, first, started, saves, cuts = case
    with patch.object(gp, "BLOCK", 16):
        want = gc._one_by_one(rows, prev, first, started, saves, cuts)
        assert gc.block_states(rows, prev, first, started, saves, cuts) == want


@given(st.lists(st.tuples(st.integers(0, 3), st.one_of(st.sampled_from(AWKWARD),
                                                        st.floats(-1e30, 1e30, allow_nan=False))).filter(lambda v: v[1] == v[1] and abs(v[1]) != float('inf')),
                max_size=300))
@settings(max_examples=300)
def test_histograms_count_what_q_gives_in_first_seen_order(values):
    import numpy as np

    values.sort(key=lambda v: v[0])  # rows run block by block
    got = gc._hists(np.array([v for _, v in values], dtype=np.float64),
                    np.array([b for b, _ in values], dtype=np.int64), 4)
    for b in range(4):
        want = gp._hist([v for k, v in values if k == b])
        assert list(got[b].items()) == list(want.items())


def test_a_stamp_missing_takes_block_state_itself_and_a_value_not_finite_is_not_logged():
    rows = [(1, T0, 1.0, None, None), (2, None, 2.0, None, None), (3, T0 + 10**9, float("inf"), None, None)]
    assert gc.from_rows(rows) is None
    assert gc.block_states(rows, None, 1, None, set(), []) == gc._one_by_one(rows, None, 1, None, set(), [])
    odd = [(1, T0, float("nan"), 1.0, None), (2, T0 + 10**10, float("inf"), float("nan"), float("-inf")),
           (3, T0 + 2 * 10**10, 5.0, 2.0, 3.0)]
    plain = [(1, T0, None, 1.0, None), (2, T0 + 10**10, None, None, None), (3, T0 + 2 * 10**10, 5.0, 2.0, 3.0)]
    want = gc._one_by_one(plain, None, 1, T0 - 10**9, set(), [])
    assert gc._one_by_one(odd, None, 1, T0 - 10**9, set(), []) == want
    assert gc.block_states(odd, None, 1, T0 - 10**9, set(), []) == want


@pytest.mark.parametrize("refused", [False, True])
def test_a_bulk_commit_taken_from_the_batch_stores_the_full_recomputation(store, refused):
    """One batch of 300 steps after 40 committed one by one (a block's edge before the batch's
    span is read back, the rest taken from the batch); with a `completed step` row the store
    refuses (a total_weights beyond BIGINT), every row is read back instead."""
    model, sink = RunModel("bulk"), SqlSink(store)
    with store.engine.begin() as conn:
        sink.ensure_run(conn, "bulk")

    def line(step: int, ns: int) -> list[bytes]:
        glog = "I1130 00:00:00.000000 1 train.py:1]"
        return [f"{format_ns(T0 + ns)} {glog} LOSS-PARTS step={step} ce=2.5 z_loss=1e-04 moe_lb=0.01 total=2.51"
                f" weights=1048576\n".encode(),
                f"{format_ns(T0 + ns + 10**6)} {glog} completed step: {step}, seconds: {9.5 + step % 7 / 10:.3f},"
                f" TFLOP/s/device: {180 + step % 11}.5, Tokens/s/device: 4000.{step % 13},"
                " total_weights: 1048576, loss: 2.5\n".encode()]

    for step in range(1, 41):
        for raw in line(step, step * 10**10):
            model.feed(raw)
        with store.engine.begin() as conn:
            sink.write(conn, "bulk", model.take())
    for step in range(41, 341):
        for raw in line(step, step * 10**10 + (5 * 10**5 if step % 9 == 0 else 0)):
            model.feed(raw)
    model.settle()
    batch = model.take()
    if refused:  # step 200's `completed step` row: a total_weights beyond BIGINT, on both stores
        at = next(i for i, r in enumerate(batch.pod_metrics) if r[POD_METRICS.STEP] == 200)
        row = list(batch.pod_metrics[at])
        row[POD_METRICS.TOTAL_WEIGHTS] = 10**20
        batch.pod_metrics[at] = tuple(row)
    with store.engine.begin() as conn:
        sink.write(conn, "bulk", batch)
        assert bool(sink.take_refused()) == refused
    stored, full = stored_and_full(store, "bulk")
    assert stored == full
    assert stored["incarnations"][0]["steps"] == 340


def test_seconds_nan_or_inf_are_not_logged_and_crash_no_commit(store):
    """`seconds: nan` crashed the goodput state's commit on PostgreSQL (which keeps NaN;
    SQLite stores NULL): the batch, and so the ingest or the followed run, failed."""
    model, sink = RunModel("odd"), SqlSink(store)
    glog = "I1130 00:00:00.000000 1 train.py:1]"
    for step, secs in ((1, "inf"), (2, "nan"), (3, "10.0"), (4, "-inf")):
        ns = T0 + step * 10**10
        model.feed(f"{format_ns(ns)} {glog} LOSS-PARTS step={step} ce=2.5 total=2.5 weights=1\n".encode())
        model.feed(f"{format_ns(ns + 10**6)} {glog} completed step: {step}, seconds: {secs}, TFLOP/s/device: nan,"
                   f" Tokens/s/device: inf, total_weights: 1, loss: 2.5\n".encode())
    with store.engine.begin() as conn:
        sink.ensure_run(conn, "odd")
        sink.write(conn, "odd", model.take())
    stored, full = stored_and_full(store, "odd")
    assert stored == full
    inc = stored["incarnations"][0]
    assert inc["median_step_s"] == 10.0 and inc["tokens_per_s_device"] is None and inc["tflops_per_device"] is None
