"""/api/runs/<run>/export: the run's export bundle as a zip, made in the export lane and streamed;
a client that stops reading is let go."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import zipfile
from pathlib import Path

from aiohttp import web

from steptail.http.answers import ApiError
from steptail.http.keys import EXPORTS, STORE
from steptail.http.requests import known_run
from steptail.storage.db import Store

WRITE_TIMEOUT = 60.0  # one chunk of an export to a client that stopped reading


def _bundle(store: Store, run: str, work: Path) -> Path:
    """Export RUN into WORK and zip it (files at the archive's top, under RUN/)."""
    from steptail.storage.export import check_export_name, export_run

    check_export_name(run)  # a stored name ('../x') must not steer the paths below
    folder = work / run
    export_run(store, run, folder)
    archive = work / f"{run}.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):  # raw/ and archive/ nest
            zf.write(path, f"{run}/{path.relative_to(folder).as_posix()}")
    return archive


async def export(request: web.Request) -> web.StreamResponse:
    from steptail.storage.export import ExportError

    run = await known_run(request)
    work = Path(tempfile.mkdtemp(prefix="steptail-export-"))
    try:
        try:
            job = request.app[EXPORTS].submit(_bundle, request.app[STORE], run, work)
            try:
                archive = await asyncio.wrap_future(job)
            except asyncio.CancelledError:  # the client left; the thread may still be writing
                job.add_done_callback(lambda _job: shutil.rmtree(work, True))
                raise
        except ExportError as exc:  # e.g. a name another writer stored ('../x')
            raise ApiError(400, str(exc)) from None
        resp = web.StreamResponse(headers={
            "Content-Type": "application/zip",
            "Content-Disposition": f'attachment; filename="{run}.zip"',
            "Content-Length": str(archive.stat().st_size),
        })
        await resp.prepare(request)
        with archive.open("rb") as fh:
            while chunk := await asyncio.to_thread(fh.read, 1 << 20):
                try:
                    await asyncio.wait_for(resp.write(chunk), WRITE_TIMEOUT)
                except TimeoutError:  # the client stopped reading: let its descriptor go
                    if request.transport is not None:
                        request.transport.abort()
                    raise ConnectionResetError("client stopped reading") from None
        await resp.write_eof()
        return resp
    finally:
        await asyncio.to_thread(shutil.rmtree, work, True)
