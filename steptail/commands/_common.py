"""Options and error handling shared by the commands."""

from __future__ import annotations

import json
import math
import sys
from typing import NoReturn

import click

from storage.db import Store, StoreError, open_store

db_option = click.option(
    "--db",
    metavar="URL",
    envvar="STEPTAIL_DB",
    help="SQLAlchemy URL or SQLite path. Default: $STEPTAIL_DB, else ./steptail.db.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


def fail(message: str, code: int = 2) -> NoReturn:
    """One line on stderr, then exit (2: bad input or unusable store)."""
    click.echo(f"steptail: error: {message}", err=True)
    sys.exit(code)


def store_or_exit(db: str | None, *, create: bool = True) -> Store:
    try:
        return open_store(db, create=create)
    except StoreError as exc:
        fail(str(exc))


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def print_json(data) -> None:
    """Strict JSON (non-finite numbers become null)."""
    click.echo(json.dumps(_clean(data), indent=None, allow_nan=False))
