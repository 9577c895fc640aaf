"""Goodput (docs/goodput.md) from a log with known timing and from the samples, on both stores."""

from __future__ import annotations

import asyncio
import json
import math

import aiohttp
import pytest
from click.testing import CliRunner
from goodput_logs import EXPECTED, EXPECTED_INCARNATIONS, EXPECTED_RESTARTS, bursty_log, timed_log

import steptail
from steptail.cli import main
from steptail.collector.offline.files import open_source
from steptail.collector.offline.ingest import ingest
from steptail.http.server import serve
from steptail.storage.goodput import run_goodput
from steptail.storage.reads import UnknownRun

KEYS = {"run", "wall_s", "productive_s", "replayed_s", "recovery_s", "checkpoint_s", "other_s", "goodput",
        "restarts", "incarnations"}


def ingest_text(store, run: str, path, text: str) -> None:
    path.write_text(text)
    src = open_source(str(path))
    try:
        ingest(store, run, [src])
    finally:
        src.close()


def close(got, want) -> bool:
    return got is not None and math.isclose(got, want, rel_tol=0.01, abs_tol=1e-6)


def test_every_figure_is_what_the_stamps_give(store, tmp_path):
    ingest_text(store, "timed", tmp_path / "timed.log", timed_log())
    g = run_goodput(store, "timed")
    for key, want in EXPECTED.items():
        assert close(g[key], want), (key, g[key], want)
    assert len(g["restarts"]) == 2
    for got, want in zip(g["restarts"], EXPECTED_RESTARTS, strict=True):
        assert got["incarnation"] == want["incarnation"]
        assert got["queued_s"] is None  # pod states are seen live only
        for key in ("recovery_s", "down_s", "startup_s", "compile_s"):
            assert close(got[key], want[key]), (got, key)
    assert [i["incarnation"] for i in g["incarnations"]] == [1, 2, 3]
    for got, want in zip(g["incarnations"], EXPECTED_INCARNATIONS, strict=True):
        for key, value in want.items():
            assert close(got[key], value), (got, key)


def test_a_log_without_stamps_has_no_wall_time(store, tmp_path):
    unstamped = "\n".join(line.split(" ", 1)[1] for line in timed_log().splitlines()) + "\n"
    ingest_text(store, "unstamped", tmp_path / "u.log", unstamped)
    g = run_goodput(store, "unstamped")
    assert g["wall_s"] is None and g["goodput"] is None and g["other_s"] is None
    assert g["incarnations"][2]["median_step_s"] == pytest.approx(20.0)


def test_the_samples_account_for_their_wall_time(store, samples):
    for name in ("clean-300", "resume-gap", "resume-mismatch", "resume-from-zero"):
        src = open_source(str(samples / f"{name}.log"))
        try:
            ingest(store, name, [src])
        finally:
            src.close()
        g = run_goodput(store, name)
        parts = g["productive_s"] + g["replayed_s"] + g["recovery_s"] + g["checkpoint_s"] + g["other_s"]
        assert parts == pytest.approx(g["wall_s"])
        assert 0.6 < g["goodput"] <= 1.0
        assert (g["replayed_s"] > 0) == (name != "clean-300")
        assert len(g["restarts"]) == len(g["incarnations"]) - 1


def test_an_unknown_run_is_refused(store):
    with pytest.raises(UnknownRun):
        run_goodput(store, "nope")


def test_cli_api_export_and_pandas_give_the_same_figures(store, db_url, tmp_path):
    ingest_text(store, "timed", tmp_path / "timed.log", timed_log())
    want = run_goodput(store, "timed")
    r = CliRunner().invoke(main, ["goodput", "timed", "--db", db_url, "-o", "json"], catch_exceptions=False)
    assert r.exit_code == 0
    got = json.loads(r.output)
    assert set(got) == KEYS and got == json.loads(json.dumps(want))
    assert {"incarnation", "median_step_s", "step_s_mad", "tokens_per_s_device", "tflops_per_device"} <= \
        set(got["incarnations"][0])
    assert {"incarnation", "recovery_s", "queued_s", "startup_s", "compile_s"} <= set(got["restarts"][0])
    r = CliRunner().invoke(main, ["goodput", "timed", "--db", db_url], catch_exceptions=False)
    assert r.exit_code == 0 and "goodput 76.3%" in r.output and "replayed" in r.output
    r = CliRunner().invoke(main, ["goodput", "nope", "--db", db_url])
    assert r.exit_code == 2 and "no run 'nope'" in r.output

    body = asyncio.run(_http(store, ["/api/runs/timed/goodput", "/api/runs/nope/goodput"]))
    assert body[0][0] == 200 and json.loads(body[0][1]) == json.loads(json.dumps(want))
    assert body[1][0] == 404

    with steptail.open(db_url) as st:
        frame = st.goodput("timed")
        manifest = st.export("timed", tmp_path / "ledger")
    assert list(frame["median_step_s"]) == pytest.approx([10.0, 10.0, 20.0])
    assert frame.attrs["goodput"]["productive_s"] == pytest.approx(EXPECTED["productive_s"], rel=0.01)
    assert manifest["goodput"]["wall_s"] == pytest.approx(EXPECTED["wall_s"], rel=0.01)
    saved = json.loads((tmp_path / "ledger" / "manifest.json").read_text())
    assert saved["goodput"]["replayed_s"] == pytest.approx(EXPECTED["replayed_s"], rel=0.01)


async def _http(store, paths: list[str]) -> list[tuple[int, bytes]]:
    urls, stop = [], asyncio.Event()
    task = asyncio.create_task(serve(store, "127.0.0.1", 0, None, started=urls.append, stop=stop))
    for _ in range(500):
        if urls or task.done():
            break
        await asyncio.sleep(0.01)
    out = []
    try:
        async with aiohttp.ClientSession(urls[0]) as http:
            for path in paths:
                async with http.get(path) as resp:
                    out.append((resp.status, await resp.read()))
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
    return out


def test_seconds_beyond_the_stamps_count_the_stamps(store, tmp_path):
    """A trainer whose clock is not the kubelet's (the simulator's prints 12 s for 0.3 s steps):
    no step outlasts the lines around it, so goodput stays what the stamps give."""
    inflated = timed_log().replace("seconds: 10.000", "seconds: 40.000").replace("seconds: 20.000", "seconds: 80.000")
    ingest_text(store, "inflated", tmp_path / "inflated.log", inflated)
    g = run_goodput(store, "inflated")
    for key in ("wall_s", "productive_s", "replayed_s", "recovery_s", "checkpoint_s", "goodput"):
        assert close(g[key], EXPECTED[key]), (key, g[key])
    assert [i["median_step_s"] for i in g["incarnations"]] == pytest.approx([10.0, 10.0, 20.0], rel=0.01)


@pytest.mark.parametrize("burst", [1, 3, 5])
def test_steps_stamped_in_bursts_count_their_seconds(store, tmp_path, burst):
    """Lines that reach the kubelet a few steps at a time (one stamp, microseconds apart) are
    each a 10 s step, as their `seconds` say: the cap is the interval from the line before the
    burst, shared by its steps, not each line's ~0 s own interval (a burst of k counted 1 step)."""
    ingest_text(store, f"burst{burst}", tmp_path / "burst.log", bursty_log(burst))
    g = run_goodput(store, f"burst{burst}")
    # 60 steps each; the first of each is compilation, counted at the median: 10 s a step
    assert close(g["productive_s"], 1200.0), g["productive_s"]
    assert [i["median_step_s"] for i in g["incarnations"]] == pytest.approx([10.0, 10.0])


def test_a_burst_across_a_block_edge_counts_its_seconds(store, tmp_path):
    """Goodput is kept in blocks of 256 steps: a burst that goes on across an edge (steps
    253-259 in bursts of 7) keeps the line before it as its anchor in the next block too, so
    the `seconds` of its steps there are not capped at their microsecond intervals."""
    ingest_text(store, "edge", tmp_path / "edge.log", bursty_log(7, steps=300))
    g = run_goodput(store, "edge")
    assert close(g["productive_s"], 3600.0), g["productive_s"]  # 360 steps of 10 s


def test_metrics_gauges_and_their_cache(store, tmp_path):
    from steptail.http.metrics import StoreCollector
    from steptail.storage.goodput import GoodputCache

    ingest_text(store, "timed", tmp_path / "timed.log", timed_log())
    families = {f.name: f for f in StoreCollector(store, recent_days=3650).collect()}
    [g] = families["steptail_run_goodput"].samples
    assert g.labels == {"run": "timed"} and close(g.value, EXPECTED["goodput"])
    [m] = families["steptail_run_median_step_seconds"].samples
    assert close(m.value, 20.0)  # the latest incarnation's

    now = [0.0]
    cache = GoodputCache(store, every_s=60, clock=lambda: now[0])
    first = cache.get("timed", (1, 1))
    assert cache.get("timed", (1, 1)) is first  # unchanged rows: not computed again
    now[0] = 30.0
    assert cache.get("timed", (2, 2)) is first  # changed, but computed 30 s ago: kept
    now[0] = 61.0
    again = cache.get("timed", (2, 2))
    assert again is not first and again == first
    cache.keep(set())
    assert cache.get("timed", (2, 2)) is not again  # forgotten: computed afresh
