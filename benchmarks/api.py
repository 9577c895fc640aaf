"""Load on `steptail serve`'s API: 50 concurrent clients on mixed routes and on one run's
/steps, and one client walking a 20,000-step run in pages of 1,000 (whole steps, then
`fields=ce`, then whole steps with only each page's head decoded: the server's share), over a
real socket.

    .venv/bin/python benchmarks/api.py --json [--store sqlite|postgresql|both] [--seconds 10]
        [--code /tmp/api-before --code .] [--rounds 3]

The store holds the five sample runs of tests/samples and one 20,000-step run (COPY on
PostgreSQL, a scratch database dropped afterwards; executemany on SQLite). The server runs
as a process of its own, from each `--code` checkout in turn (default: this one), round
after round on the same store, so that before and after are measured alike; each figure is
the median of the rounds. Latencies in ms: p50 and p99 per request, the walk's total."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from steptail.storage.db import open_store  # noqa: E402
from steptail.storage.scratch import scratch_database  # noqa: E402

PG_ADMIN = os.environ.get("STEPTAIL_BENCH_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
SAMPLES = ROOT / "tests" / "samples"
SAMPLE_RUNS = ("clean-300", "cp4-lb-nan", "resume-from-zero", "resume-gap", "resume-mismatch")
BIG, BIG_STEPS, PAGE = "run-000", 20_000, 1000
T0_NS, STEP_NS = 1_795_000_000 * 10**9, 12 * 10**9  # 2026-11-18, a step every 12 s
STEPS_RUN = "clean-300"  # (b): a ~300-step run's /steps
# The packages of pyproject's package-dir: a checkout runs without installing it.
PACKAGES = ("parsers", "runs", "storage", "dashboards", "collector", "simcluster")
SERVER = """
import asyncio, sys
from steptail.http.server import serve
from steptail.storage.db import open_store

async def main():
    store = open_store(sys.argv[1])
    await serve(store, "127.0.0.1", 0, None, started=lambda url: print(url, flush=True))

asyncio.run(main())
"""


# -- the store -----------------------------------------------------------------------------
def _ingest_samples(store) -> None:
    from steptail.collector.offline.files import open_source
    from steptail.collector.offline.ingest import ingest

    for name in SAMPLE_RUNS:
        src = open_source(str(SAMPLES / f"{name}.log"))
        try:
            ingest(store, name, [src])
        finally:
            src.close()


def _big_rows(steps: int):
    """(runs, incarnations, loss_parts, required_rbf) rows of the 20,000-step run: every step
    with its REQUIRED_RBF probe, 16 layers."""
    now = time.time_ns()
    loss, rbf = [], []
    for s in range(1, steps + 1):
        ce = 4.0 - 2.0 * s / steps
        layers = [1.0 + ((s * 7 + k * 13) % 100) / 40 for k in range(16)]
        loss.append((BIG, 1, s, T0_NS + s * STEP_NS, ce, f"{ce:.6f}",
                     '{"z_loss":0.0001,"moe_lb":0.0124,"weights":1048576}'))
        rbf.append((BIG, 1, s, T0_NS + s * STEP_NS + 1000, max(layers), json.dumps(layers), "first_phase"))
    return ([(BIG, "js-000", "bench", now, now)], [(BIG, 1, T0_NS, True, 1, steps)], loss, rbf)


_TABLES = (("runs", "run, jobset, namespace, created_ns, updated_ns"),
           ("incarnations", "run, incarnation, started_ns, saw_start, first_step, last_step"),
           ("loss_parts", "run, incarnation, step, ts_ns, ce, ce_raw, parts"),
           ("required_rbf", "run, incarnation, step, ts_ns, max, per_layer, program"))


def _load_big(store, steps: int) -> None:
    """COPY on PostgreSQL, executemany on SQLite."""
    raw = store.engine.raw_connection()
    try:
        cur = raw.cursor()
        for (table, cols), rows in zip(_TABLES, _big_rows(steps), strict=True):
            if store.is_sqlite:
                cur.executemany(f"INSERT INTO {table} ({cols}) VALUES ({', '.join('?' * len(rows[0]))})", rows)
                continue
            with cur.copy(f"COPY {table} ({cols}) FROM STDIN") as cp:
                for row in rows:
                    cp.write_row(row)
        raw.commit()
        cur.execute("ANALYZE")
        raw.commit()
    finally:
        raw.close()


def _load(store) -> None:
    _ingest_samples(store)
    _load_big(store, BIG_STEPS)


# -- the server ----------------------------------------------------------------------------
def _code_path(code: Path, tmp: Path) -> str:
    """A PYTHONPATH entry importing `steptail` from the checkout `code` (its package-dir
    layout, as pyproject.toml maps it, made of symlinks)."""
    pkg = tmp / f"code-{code.name}-{len(list(tmp.glob('code-*')))}" / "steptail"
    pkg.mkdir(parents=True, exist_ok=True)
    for entry in (code / "steptail").iterdir():
        (pkg / entry.name).symlink_to(entry)
    for name in PACKAGES:
        (pkg / name).symlink_to(code / name)
    return str(pkg.parent)


async def _start(url: str, pythonpath: str | None):
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", SERVER, url, env=env, cwd="/",
                                                stdout=asyncio.subprocess.PIPE)
    base = (await asyncio.wait_for(proc.stdout.readline(), 120)).decode().strip()
    if not base.startswith("http://"):
        raise SystemExit(f"server did not start: {base!r}")
    return proc, base


# -- the load ------------------------------------------------------------------------------
async def _load_test(http, paths: list[str], clients: int, seconds: float) -> dict:
    """`clients` loops over `paths` (each from its own offset) for `seconds`."""
    times: list[float] = []
    errors = 0
    end = time.perf_counter() + seconds

    async def client(k: int) -> None:
        nonlocal errors
        i = k
        while time.perf_counter() < end:
            t = time.perf_counter()
            async with http.get(paths[i % len(paths)]) as resp:
                await resp.read()
                errors += resp.status != 200
            times.append((time.perf_counter() - t) * 1000)
            i += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(client(k) for k in range(clients)))
    took = time.perf_counter() - t0
    times.sort()
    return {"p50_ms": round(times[len(times) // 2], 2), "p99_ms": round(times[int(len(times) * 0.99)], 2),
            "req_per_s": round(len(times) / took, 1), "requests": len(times), "errors": errors}


async def _walk(http, run: str, fields: str | None = None, parse: bool = True) -> tuple[float, int]:
    """(ms, rows) of one walk. parse=False: each page's body is read whole but only its head
    (count, next) is parsed, so the figure is the server's and the socket's, not the client's
    decoding of 20,000 steps (about 100 ms of orjson alone for whole steps)."""
    path, rows = f"/api/runs/{run}/steps?limit={PAGE}" + (f"&fields={fields}" if fields else ""), 0
    t = time.perf_counter()
    while path:
        async with http.get(path) as resp:
            body = await resp.read()
        # the client's parse counts as little as it can: orjson
        page = orjson.loads(body) if parse else orjson.loads(body[: body.index(b',"steps":')] + b"}")
        rows += page["count"]
        path = page["next"]
    return (time.perf_counter() - t) * 1000, rows


async def _measure(base: str, args) -> dict:
    import aiohttp

    mixed = ["/api/runs", "/healthz", "/metrics"] + [
        f"/api/runs/{r}/{what}" for r in SAMPLE_RUNS for what in ("steps", "findings")]
    connector = aiohttp.TCPConnector(limit=args.clients)
    async with aiohttp.ClientSession(base, connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as http:
        await _walk(http, BIG)  # warm-up: plans, caches, connections
        await _load_test(http, mixed, args.clients, 1.0)
        walks = [await _walk(http, BIG) for _ in range(args.walks)]
        assert all(rows == BIG_STEPS for _, rows in walks), walks
        ms = [w for w, _ in walks]
        # step and CE only (a server that knows no `fields` answers whole steps)
        ce_walks = [await _walk(http, BIG, "ce") for _ in range(args.walks)]
        assert all(rows == BIG_STEPS for _, rows in ce_walks), ce_walks
        ce_ms = [w for w, _ in ce_walks]
        served = [await _walk(http, BIG, parse=False) for _ in range(args.walks)]
        assert all(rows == BIG_STEPS for _, rows in served), served
        served_ms = [w for w, _ in served]
        return {
            "mixed": await _load_test(http, mixed, args.clients, args.seconds),
            "steps_300": await _load_test(http, [f"/api/runs/{STEPS_RUN}/steps"], args.clients, args.seconds),
            "walk_20k_ms": {"median": round(statistics.median(ms), 1), "min": round(min(ms), 1)},
            "walk_20k_ce_ms": {"median": round(statistics.median(ce_ms), 1), "min": round(min(ce_ms), 1)},
            # whole steps, bodies read but not decoded: what the server and the socket take
            "walk_20k_unparsed_ms": {"median": round(statistics.median(served_ms), 1),
                                     "min": round(min(served_ms), 1)},
        }


def _median_of(rounds: list[dict]) -> dict:
    """Each figure's median over the rounds (nested dicts of numbers)."""
    first = rounds[0]
    if not isinstance(first, dict):
        return round(statistics.median(rounds), 2)
    return {k: _median_of([r[k] for r in rounds]) for k in first}


async def _bench_store(url: str, codes: list[Path], args, tmp: Path) -> dict:
    paths = {code: None if code == ROOT else _code_path(code, tmp) for code in codes}
    results: dict[Path, list[dict]] = {code: [] for code in codes}
    for _ in range(args.rounds):
        for code in codes:  # alternating: a busier minute of the machine falls on each alike
            proc, base = await _start(url, paths[code])
            try:
                results[code].append(await _measure(base, args))
            finally:
                proc.terminate()
                await proc.wait()
    return {str(code): _median_of(r) | {"rounds": len(r)} for code, r in results.items()}


def _run(store_kind: str, codes: list[Path], args) -> dict:
    with tempfile.TemporaryDirectory(prefix="steptail-bench-api-") as tmp:
        tmp = Path(tmp)
        if store_kind == "sqlite":
            return _loaded_and_measured(f"sqlite:///{tmp / 'api.db'}", codes, args, tmp)
        with scratch_database(PG_ADMIN, "steptail_bench") as url:
            return _loaded_and_measured(url, codes, args, tmp)


def _loaded_and_measured(url: str, codes: list[Path], args, tmp: Path) -> dict:
    store = open_store(url)
    try:
        t = time.perf_counter()
        _load(store)
        load_s = time.perf_counter() - t
    finally:
        store.dispose()
    return {"load_seconds": round(load_s, 1)} | asyncio.run(_bench_store(url, codes, args, tmp))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", choices=("sqlite", "postgresql", "both"), default="both")
    ap.add_argument("--seconds", type=float, default=10.0, help="of each load test")
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--walks", type=int, default=5, help="walks of the 20k-step run per round")
    ap.add_argument("--rounds", type=int, default=1, help="of each --code, alternating")
    ap.add_argument("--code", type=Path, action="append",
                    help="a checkout whose server to measure (repeat to compare; default: this one)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    codes = [c.resolve() for c in (args.code or [ROOT])]
    kinds = ("sqlite", "postgresql") if args.store == "both" else (args.store,)
    result = {kind: _run(kind, codes, args) for kind in kinds}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for kind, by_code in result.items():
            for code, figures in by_code.items():
                print(f"{kind} {code}: {figures}")


if __name__ == "__main__":
    main()
