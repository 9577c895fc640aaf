"""tests/machine_share.py: an `alone` test runs with no other test beside it, and a waiting one
is not starved by tests that keep starting (each in its own process, as xdist workers are)."""

import multiprocessing as mp
import time

from machine_share import machine_share


def _hold(folder, alone, seconds, log, name):
    with machine_share(folder, alone):
        log.put((name, "in", time.monotonic()))
        time.sleep(seconds)
        log.put((name, "out", time.monotonic()))


def _spans(log, n):
    events = [log.get(timeout=20) for _ in range(n)]
    spans = {}
    for name, what, at in events:
        spans.setdefault(name, [0.0, 0.0])[what == "out"] = at
    return spans


def test_an_alone_holder_excludes_every_other_test(tmp_path):
    ctx = mp.get_context("fork")
    log = ctx.Queue()
    shared = [ctx.Process(target=_hold, args=(tmp_path, False, 0.6, log, f"s{i}")) for i in range(2)]
    for p in shared:
        p.start()
    time.sleep(0.2)  # both shared holders in
    alone = ctx.Process(target=_hold, args=(tmp_path, True, 0.5, log, "alone"))
    alone.start()
    time.sleep(0.1)
    late = ctx.Process(target=_hold, args=(tmp_path, False, 0.1, log, "late"))  # starts while alone waits
    late.start()
    for p in [*shared, alone, late]:
        p.join(20)
    spans = _spans(log, 8)
    a_in, a_out = spans["alone"]
    assert spans["s0"][0] < spans["s1"][1] and spans["s1"][0] < spans["s0"][1]  # shared: together
    for name in ("s0", "s1"):
        assert spans[name][1] <= a_in  # alone waited for the running ones to end
    assert spans["late"][0] >= a_out  # and the one that asked after it waited for it
