"""The `steptail` command line. Subcommands live in steptail.commands.<name> and load lazily,
so `steptail --help` stays fast and one broken command cannot take the others down."""

from __future__ import annotations

import importlib
import importlib.util
import sys

import click

# name -> module under steptail.commands (module exposes `command`).
COMMANDS = {
    "ingest": "ingest",
    "runs": "runs",
    "steps": "steps",
    "check": "check",
    "compare": "compare",
    "follow": "follow",
    "demo": "demo",
    "simcluster": "simcluster",
    "export": "export",
    "dashboards": "dashboards",
    "serve": "serve",
    "compact": "compact",
    "archive": "archive",
    "reparse": "reparse",
    "lint": "lint",
    "lake": "lake",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(n for n, m in COMMANDS.items() if _exists(m))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        module = COMMANDS.get(name)
        if module is None or not _exists(module):
            return None
        return importlib.import_module(f"steptail.commands.{module}").command

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except Exception as exc:
            # The store failed after it was opened (a damaged page, a lost server): one line,
            # exit 2, like a store that cannot be opened at all.
            db_errors = sys.modules.get("sqlalchemy.exc")  # loaded by any command that has a store
            if db_errors is None or not isinstance(exc, db_errors.DBAPIError):
                raise
            from steptail.commands._common import fail

            reason = str(exc.orig or exc).strip().splitlines() or [type(exc).__name__]
            fail(f"the database failed: {reason[0]}")


def _exists(module: str) -> bool:
    return importlib.util.find_spec(f"steptail.commands.{module}") is not None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="steptail")
def main() -> None:
    """Per-step loss telemetry for TPU post-training runs.

    Follows the log of JAX process 0 of each JobSet, records every LOSS-PARTS and
    REQUIRED_RBF step (SQLite by default, PostgreSQL with --db), and flags missing steps
    and CE divergence.
    """
