"""`steptail serve`: health, Prometheus metrics and the JSON API over the store."""

from __future__ import annotations

import asyncio
import ipaddress
import signal
from pathlib import Path

import click

from steptail.commands._common import db_option, fail, read_secret, store_or_exit

TOKEN_ENV = "STEPTAIL_SERVE_TOKEN"


def read_token(token_file: Path | None) -> str | None:
    """--token-file, else $STEPTAIL_SERVE_TOKEN; None: no token (only sensible on 127.0.0.1)."""
    return read_secret(token_file, (TOKEN_ENV,))


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost; anything else (0.0.0.0, a name, an interface) is reachable
    from elsewhere."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help=f"Address to bind. Any other than loopback needs a token (--token-file or ${TOKEN_ENV}).")
@click.option("--port", default=9464, show_default=True, type=click.IntRange(0, 65535),
              help="Port (0: any free port, printed at start).")
@click.option("--token-file", type=click.Path(dir_okay=False, path_type=Path),
              help=f"File holding the bearer token clients must send (else ${TOKEN_ENV}).")
@db_option
def command(host: str, port: int, token_file: Path | None, db: str | None) -> None:
    """Serve the live page at / (runs, CE with gaps, NaNs, restores and findings), /healthz,
    /livez, /metrics and the JSON API /api/… (read-only).

    \b
    Examples:
      steptail serve --db steptail-demo/steptail.db        # then open http://127.0.0.1:9464/
      steptail serve --port 0 --db postgresql+psycopg://…   # any free port, printed at start"""
    from steptail.http.server import serve

    token = read_token(token_file)
    if token is None and not is_loopback(host):
        fail(f"--host {host} is reachable from other machines: give a token (--token-file or ${TOKEN_ENV})")
    store = store_or_exit(db, create=False)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)

        def started(url: str) -> None:
            auth = "bearer token required" if token else "no token: loopback only"
            click.echo(f"steptail: serving {store.describe()} on {url} ({auth})", err=True)

        await serve(store, host, port, token, started=started, stop=stop)

    try:
        asyncio.run(main())
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
    finally:
        store.dispose()
