"""Options and error handling shared by the commands."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import NoReturn

import click

from steptail.jsonsafe import strict
from steptail.storage.db import Store, StoreError, open_store

db_option = click.option(
    "--db",
    metavar="URL",
    envvar="STEPTAIL_DB",
    help="SQLAlchemy URL or SQLite path. Default: $STEPTAIL_DB, else ./steptail.db.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


def fail(message: str, code: int = 2) -> NoReturn:
    """One line on stderr (a JSON object under `--log-format json`), then exit (2: bad input
    or unusable store)."""
    from steptail import logs

    line = f"steptail: error: {message}"
    click.echo(logs.json_line("ERROR", "steptail", line) if logs.json_enabled() else line, err=True)
    sys.exit(code)


def warn(message: str) -> None:
    """One line on stderr, as fail() prints it, without exiting."""
    from steptail import logs

    line = f"steptail: warning: {message}"
    click.echo(logs.json_line("WARNING", "steptail", line) if logs.json_enabled() else line, err=True)


def count(n: int, word: str, many: str | None = None) -> str:
    """A number and its noun, singular for one: `1 step`, `2 steps`."""
    return f"{n} {word if n == 1 else many or word + 's'}"


def store_or_exit(db: str | None, *, create: bool = True) -> Store:
    try:
        return open_store(db, create=create)
    except StoreError as exc:
        fail(str(exc))


def print_json(data) -> None:
    """Strict JSON (non-finite numbers become null)."""
    click.echo(json.dumps(strict(data), indent=None, allow_nan=False))


def read_secret(token_file: Path | None, env_names: tuple[str, ...]) -> str | None:
    """A token from --token-file, else the first set variable of env_names (never argv)."""
    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except OSError as exc:
            fail(f"cannot read token file {token_file}: {exc.strerror or exc}")
        if not token:
            fail(f"token file {token_file} is empty")
        return token
    for name in env_names:
        if os.environ.get(name, "").strip():
            return os.environ[name].strip()
    return None
