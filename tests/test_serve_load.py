"""`serve` under export load (issue 20, item 2): eight concurrent exports of a big run once held
every thread of the default pool and /healthz timed out behind them (a kubelet probe has 1 s).
Over real HTTP to a server process: /healthz and /livez answer within a probe's 1 s timeout
all along, other reads keep their own lane, and beyond the export lane's queue limit a request
is a 503 with a JSON body and Retry-After — never a wait without end."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import sys
import time
import zipfile
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_poison_lines import ingest_file, startup, step_lines, write

from steptail.storage.db import open_store

pytestmark = pytest.mark.timeout(240)
ROOT = Path(__file__).resolve().parent.parent
STEPS = 20_000  # a bundle of it takes seconds of CPU: exports overlap whatever the machine's speed
WORKERS, QUEUE, RETRY_AFTER = 2, 2, 7
EXPORTS = max(8, min(32, (os.cpu_count() or 1) + 4) + 2)  # more than the default pool's threads
PROBE_TIMEOUT = aiohttp.ClientTimeout(total=1.0)  # a kubelet probe's
SERVER = """
import asyncio, sys
from steptail.http.server import serve
from steptail.storage.db import open_store

async def main():
    store = open_store(sys.argv[1])
    lane = tuple(int(x) for x in sys.argv[2].split(","))
    await serve(store, "127.0.0.1", 0, None, started=lambda url: print(url, flush=True), export_lane=lane)

asyncio.run(main())
"""


@pytest.fixture(scope="module")
def big_db(tmp_path_factory) -> Path:
    """A SQLite store holding one run of STEPS steps, ingested once for the module."""
    folder = tmp_path_factory.mktemp("load")
    log = write(folder / "big.log", startup() + [ln for n in range(1, STEPS + 1) for ln in step_lines(n)])
    store = open_store(str(folder / "big.db"))
    try:
        result = ingest_file(store, "big", log)
        assert result.loss_parts == STEPS
    finally:
        store.dispose()
    log.unlink()
    return folder / "big.db"


async def _server(db: Path, tmp: Path):
    """The server process (its temporary files under `tmp`) and its URL."""
    tmp.mkdir()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SERVER, str(db), f"{WORKERS},{QUEUE},{RETRY_AFTER}", cwd=ROOT,
        env={**os.environ, "TMPDIR": str(tmp)}, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    url = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode().strip()
    assert url.startswith("http://127.0.0.1:"), url
    return proc, url


async def _probe(http: aiohttp.ClientSession, url: str) -> tuple[int | str, float]:
    t0 = time.monotonic()
    try:
        async with http.get(url, timeout=PROBE_TIMEOUT) as resp:
            body = await resp.read()
            return (resp.status if resp.status != 200 else json.loads(body)["status"]), time.monotonic() - t0
    except TimeoutError:
        return "timeout", time.monotonic() - t0


async def test_healthz_answers_under_export_load_and_the_queue_limit_is_a_503(big_db, tmp_path):
    proc, url = await _server(big_db, tmp_path / "tmp")
    try:
        async with aiohttp.ClientSession(url, timeout=aiohttp.ClientTimeout(total=200)) as http:
            async def export():
                async with http.get("/api/runs/big/export") as resp:
                    return resp.status, dict(resp.headers), await resp.read()

            exports = [asyncio.create_task(export()) for _ in range(EXPORTS)]
            probes: list[tuple[str, int | str, float]] = []
            reads: list[int] = []

            async def probe():  # as a kubelet does: on its own clock, whatever else is asked
                while not all(t.done() for t in exports):
                    for path in ("/healthz", "/livez"):
                        status, took = await _probe(http, path)
                        probes.append((path, status, took))
                    await asyncio.sleep(0.2)

            async def read():  # the read lane is not the export's
                while not all(t.done() for t in exports):
                    async with http.get("/api/runs/big/steps?limit=10", timeout=PROBE_TIMEOUT) as resp:
                        reads.append(resp.status)
                    await asyncio.sleep(0.2)

            await asyncio.gather(probe(), read())
            results = [t.result() for t in exports]
            async with http.get("/metrics") as resp:
                scraped = {(m.name, m.labels.get("lane")): m.value for fam in
                           text_string_to_metric_families((await resp.read()).decode()) for m in fam.samples}
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert len(probes) >= 10 and len(reads) >= 5, probes  # the exports lasted seconds: probed all along
    assert [p for p in probes if p[1] not in ("ok", "alive")] == [], probes
    assert set(reads) == {200}

    done = [r for r in results if r[0] == 200]
    busy = [r for r in results if r[0] == 503]
    # All arrived while the first were still bundling: the lane took WORKERS + QUEUE.
    assert (len(done), len(busy)) == (WORKERS + QUEUE, EXPORTS - WORKERS - QUEUE), [r[0] for r in results]
    for _, _headers, body in done:
        with zipfile.ZipFile(io.BytesIO(body)) as zf:
            assert json.loads(zf.read("big/manifest.json"))["counts"]["loss_parts"] == STEPS
    for _, headers, body in busy:
        assert headers["Content-Type"].startswith("application/json") and headers["Retry-After"] == str(RETRY_AFTER)
        error = json.loads(body)
        assert error["status"] == 503 and error["error"].startswith("busy: ") and "export" in error["error"]
    refused = EXPORTS - WORKERS - QUEUE
    assert scraped[("steptail_serve_refused_total", "export")] == refused
    assert scraped[("steptail_serve_refused_total", "read")] == 0
    assert scraped[("steptail_serve_lane_pending", "export")] == 0
    assert err.decode().count("export lane full") == 1  # one line for the whole burst
    assert list((tmp_path / "tmp").iterdir()) == []  # every bundle's folder removed, refused ones made none
    assert b"Traceback" not in err, err.decode()[-2000:]


# -- a store outage: /healthz says so within a probe or two, one line when it starts and clears ------------
class TcpProxy:
    """127.0.0.1:<port> -> the PostgreSQL server; cut() drops it and every connection (an
    outage for this client only: the shared server itself is never touched)."""

    def __init__(self, host: str, port: int) -> None:
        self.target, self.port, self.server, self.open = (host, port), 0, None, []

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._pipe, "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _pipe(self, reader, writer) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self.open += [writer, up_writer]

        async def copy(src, dst):
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except ConnectionError:
                pass
            finally:
                dst.close()

        await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))

    async def cut(self) -> None:
        self.server.close()
        for w in self.open:
            w.transport.abort()
        self.open.clear()
        await self.server.wait_closed()


async def _health_until(http, want: int, within: float) -> list[tuple]:
    seen, deadline = [], time.monotonic() + within
    while time.monotonic() < deadline:
        t0 = time.monotonic()
        async with http.get("/healthz", timeout=PROBE_TIMEOUT) as resp:
            seen.append((resp.status, json.loads(await resp.read()), time.monotonic() - t0))
        if resp.status == want:
            return seen
        await asyncio.sleep(0.1)
    raise AssertionError(f"/healthz never answered {want}: {seen[-3:]}")


async def test_healthz_follows_a_store_outage_with_one_line_each_way(caplog):
    import sqlalchemy as sa
    from store_fixtures import PG_ADMIN

    from steptail.http.server import serve
    from steptail.storage.scratch import scratch_database

    caplog.set_level("INFO", logger="steptail.serve")
    with scratch_database(PG_ADMIN, "steptail_test") as direct:
        open_store(direct).dispose()  # migrated
        url = sa.make_url(direct)
        proxy = TcpProxy(url.host or "127.0.0.1", url.port or 5432)
        await proxy.start()
        # in a thread: the proxy runs on this loop
        store = await asyncio.to_thread(open_store, url.set(port=proxy.port).render_as_string(hide_password=False))
        urls, stop = [], asyncio.Event()
        task = asyncio.create_task(serve(store, "127.0.0.1", 0, None, started=urls.append, stop=stop,
                                         probe_interval=0.2))
        try:
            while not urls:
                await asyncio.sleep(0.01)
            async with aiohttp.ClientSession(urls[0]) as http:
                assert (await _health_until(http, 200, 5))[-1][:2] == (200, {"status": "ok"})
                await proxy.cut()
                down = await _health_until(http, 503, 10)
                assert down[-1][1] == {"status": "unavailable", "store": "unreachable"}
                async with http.get("/livez", timeout=PROBE_TIMEOUT) as resp:  # alive all the same
                    assert resp.status == 200
                await proxy.start()  # the same port again
                up = await _health_until(http, 200, 30)
                assert all(took < 1.0 for *_, took in down + up)  # every answer within a probe's timeout
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)
            store.dispose()
            await proxy.cut()
    said = [r.getMessage() for r in caplog.records if r.name == "steptail.serve"]
    assert said.count("store unreachable") == 1 and said.count("store reachable again") == 1, said


async def test_a_lane_counts_a_job_until_its_thread_is_done_even_when_the_client_left():
    import threading

    from steptail.http.answers import ApiError
    from steptail.http.lanes import Lane

    lane, gate = Lane("export", 1, 1, 3), threading.Event()
    try:
        first = asyncio.create_task(lane.run(gate.wait))
        second = asyncio.create_task(lane.run(lambda: "second"))
        await asyncio.sleep(0.05)
        with pytest.raises(ApiError) as busy:
            await lane.run(lambda: "third")
        assert busy.value.status == 503 and busy.value.headers == {"Retry-After": "3"}
        first.cancel()  # its client hung up: the thread still runs, the lane stays full
        await asyncio.sleep(0.05)
        with pytest.raises(ApiError):
            await lane.run(lambda: "fourth")
        second.cancel()  # still waiting: dropped, and its place freed
        await asyncio.sleep(0.05)
        assert lane.pending == 1 and lane.refused == 2
        gate.set()
        for _ in range(100):
            if lane.pending == 0:
                break
            await asyncio.sleep(0.01)
        assert await lane.run(lambda: "fifth") == "fifth"
    finally:
        gate.set()
        lane.shutdown()
