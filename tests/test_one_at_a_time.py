"""tests/one_at_a_time.py: two holders (each in its own process, as xdist workers are) never
overlap; the second waits for the first to end."""

import multiprocessing as mp
import time

from one_at_a_time import one_at_a_time


def _hold(folder, seconds, log, name):
    with one_at_a_time(folder):
        log.put((name, "in", time.monotonic()))
        time.sleep(seconds)
        log.put((name, "out", time.monotonic()))


def test_two_holders_never_overlap(tmp_path):
    ctx = mp.get_context("fork")
    log = ctx.Queue()
    holders = [ctx.Process(target=_hold, args=(tmp_path, 0.4, log, f"h{i}")) for i in range(2)]
    for p in holders:
        p.start()
    for p in holders:
        p.join(20)
    spans: dict[str, list[float]] = {}
    for name, what, at in (log.get(timeout=20) for _ in range(4)):
        spans.setdefault(name, [0.0, 0.0])[what == "out"] = at
    (a_in, a_out), (b_in, b_out) = sorted(spans.values())
    assert a_out <= b_in  # the second went in only once the first was out
