"""The page's first draw against a run's length: time from opening `/?run=NAME` to the CE chart
drawn, and the bytes it fetched, for runs of 300, 20,000 and 200,000 steps, in headless
Chromium driven as tests/test_page.py drives it (DevTools protocol).

    .venv/bin/python benchmarks/page.py --json [--code /tmp/page-before --code .] [--rounds 3]
        [--store sqlite|postgresql]

Each run: one incarnation, every step with its REQUIRED_RBF probe (48 layers, as the issue's
20,459-step run), a 41-step gap and a NaN in the middle. The server runs as a process of its
own from each `--code` checkout in turn (benchmarks/api.py's way), over the same store, round
after round; each figure is the median of the rounds. `first_draw_ms`: navigation to the
first CE trace in the DOM; `api_bytes`: the JSON bodies fetched until then (plotly.min.js is
the same for every run and is left out: `static_bytes`)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from api import _code_path, _start  # noqa: E402

from steptail.storage.db import open_store  # noqa: E402
from steptail.storage.scratch import scratch_database  # noqa: E402

PG_ADMIN = os.environ.get("STEPTAIL_BENCH_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
LENGTHS = (300, 20_000, 200_000)
LAYERS = 48
T0_NS, STEP_NS = 1_795_000_000 * 10**9, 12 * 10**9
CHROMIUM = "/usr/bin/chromium"
DRAWN = "!!document.querySelector('#ce-chart .scatterlayer .trace')"
BYTES = """JSON.stringify(performance.getEntriesByType('resource').map(
  e => [e.name, e.encodedBodySize, e.transferSize]))"""


def _rows(run: str, steps: int):
    now = time.time_ns()
    gap = range(steps // 2, steps // 2 + 41)
    loss, rbf = [], []
    for s in range(1, steps + 1):
        if s in gap:
            continue
        ce = float("nan") if s == steps // 3 else 4.0 - 2.0 * s / steps + 0.05 * ((s * 7919) % 13) / 13
        raw = "nan" if ce != ce else f"{ce:.6f}"
        layers = [round(1.0 + ((s * 7 + k * 13) % 100) / 40, 4) for k in range(LAYERS)]
        loss.append((run, 1, s, T0_NS + s * STEP_NS, None if ce != ce else ce, raw,
                     '{"z_loss":0.0001,"moe_lb":0.0124,"weights":1048576}'))
        rbf.append((run, 1, s, T0_NS + s * STEP_NS + 1000, max(layers), json.dumps(layers), "first_phase"))
    return ([(run, f"js-{run}", "bench", now, now)], [(run, 1, T0_NS, True, 1, steps)], loss, rbf)


_TABLES = (("runs", "run, jobset, namespace, created_ns, updated_ns"),
           ("incarnations", "run, incarnation, started_ns, saw_start, first_step, last_step"),
           ("loss_parts", "run, incarnation, step, ts_ns, ce, ce_raw, parts"),
           ("required_rbf", "run, incarnation, step, ts_ns, max, per_layer, program"))


def _load(url: str) -> None:
    """COPY on PostgreSQL, executemany on SQLite; then loss_summary, as a commit keeps it."""
    from steptail.storage.summary import after_write

    store = open_store(url)
    try:
        raw = store.engine.raw_connection()
        try:
            cur = raw.cursor()
            for steps in LENGTHS:
                for (table, cols), rows in zip(_TABLES, _rows(f"run-{steps}", steps), strict=True):
                    if store.is_sqlite:
                        marks = ", ".join("?" * len(rows[0]))
                        cur.executemany(f"INSERT INTO {table} ({cols}) VALUES ({marks})", rows)
                        continue
                    with cur.copy(f"COPY {table} ({cols}) FROM STDIN") as cp:
                        for row in rows:
                            cp.write_row(row)
            raw.commit()
            cur.execute("ANALYZE")
            raw.commit()
        finally:
            raw.close()
        with store.engine.begin() as conn:  # the whole run as one write: 0 rows before it
            after_write(conn, [((f"run-{n}", 1, 1, n), 0) for n in LENGTHS])
    finally:
        store.dispose()


def _chromium(profile: str):
    proc = subprocess.Popen(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
         "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--mute-audio", "--hide-scrollbars",
         "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0", f"--user-data-dir={profile}",
         "--window-size=1280,900", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    active = Path(profile) / "DevToolsActivePort"
    for _ in range(600):
        if active.exists() and len(active.read_text().splitlines()) >= 2:
            return proc, int(active.read_text().split()[0])
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("chromium did not start")


async def _first_draw(port: int, base: str, run: str) -> dict:
    from test_page import tab

    async with tab(port) as page:
        url = f"{base}/?run={run}"
        await page.send("Page.navigate", url="about:blank")  # nothing of the last run's DOM left
        await page.until("location.href === 'about:blank'")
        t = time.perf_counter()
        await page.send("Page.navigate", url=url)
        while not await page.eval(f"location.href === {json.dumps(url)} && {DRAWN}"):
            await asyncio.sleep(0.02)
        ms = (time.perf_counter() - t) * 1000
        entries = json.loads(await page.eval(BYTES))
        errors = [e for e in page.errors if "favicon.ico" not in e]
        if errors:
            raise SystemExit(f"{run}: page errors {errors}")
    api = sum(size for name, size, _ in entries if "/api/" in name)
    static = sum(size for name, size, _ in entries if "/static/" in name)
    return {"first_draw_ms": round(ms), "api_bytes": api, "static_bytes": static,
            "requests": sum("/api/" in name for name, _, _ in entries)}


async def _bench(url: str, codes: list[Path], rounds: int, tmp: Path) -> dict:
    paths = {code: None if code == ROOT else _code_path(code, tmp) for code in codes}
    results: dict[Path, dict[int, list[dict]]] = {code: {n: [] for n in LENGTHS} for code in codes}
    profile = tempfile.mkdtemp(prefix="steptail-bench-chromium-", dir=tmp)
    proc, port = _chromium(profile)
    try:
        for _ in range(rounds):
            for code in codes:  # alternating: a busier minute of the machine falls on each alike
                server, base = await _start(url, paths[code])
                try:
                    # plotly.min.js into the browser's cache, and its compiled code into V8's (kept from
                    # the second load on: the first loads of a fresh profile take a second longer)
                    for _ in range(3):
                        await _first_draw(port, base, f"run-{LENGTHS[0]}")
                    for n in LENGTHS:
                        results[code][n].append(await _first_draw(port, base, f"run-{n}"))
                finally:
                    server.terminate()
                    await server.wait()
    finally:
        proc.terminate()
        proc.wait()
    out = {}
    for code, by_len in results.items():
        out[str(code)] = {str(n): {k: round(statistics.median(r[k] for r in rs)) for k in rs[0]}
                          for n, rs in by_len.items()}
        small = out[str(code)][str(LENGTHS[0])]["first_draw_ms"]
        out[str(code)]["ratio_200k_to_300"] = round(out[str(code)][str(LENGTHS[-1])]["first_draw_ms"] / small, 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", choices=("sqlite", "postgresql"), default="sqlite")
    ap.add_argument("--rounds", type=int, default=3, help="of each --code, alternating")
    ap.add_argument("--code", type=Path, action="append",
                    help="a checkout whose server and page to measure (repeat to compare; default: this one)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    codes = [c.resolve() for c in (args.code or [ROOT])]
    with tempfile.TemporaryDirectory(prefix="steptail-bench-page-") as tmp:
        tmp = Path(tmp)
        t = time.perf_counter()
        if args.store == "sqlite":
            url = f"sqlite:///{tmp / 'page.db'}"
            _load(url)
            result = {"load_seconds": round(time.perf_counter() - t, 1)} | asyncio.run(_bench(url, codes, args.rounds, tmp))
        else:
            with scratch_database(PG_ADMIN, "steptail_bench") as url:
                _load(url)
                result = {"load_seconds": round(time.perf_counter() - t, 1)} | asyncio.run(
                    _bench(url, codes, args.rounds, tmp))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for code, figures in result.items():
            print(code, figures)


if __name__ == "__main__":
    main()
