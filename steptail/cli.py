"""The `steptail` command line. Subcommands live in steptail.commands.<name> and load lazily,
so `steptail --help` stays fast and one broken command cannot take the others down."""

from __future__ import annotations

import importlib
import importlib.util
import sys

import click

# name -> (module under steptail.commands exposing `command`, its line in `steptail --help`).
# The lines are here, not read from the commands, so that the listing imports none of them
# (all sixteen took 2.3 s: SQLAlchemy, pyarrow, the kubernetes client...).
COMMANDS = {
    "ingest": ("ingest", "Ingest saved pod logs of JAX process 0 into the store"),
    "runs": ("runs", "List the recorded runs: source, incarnations, steps, last CE"),
    "steps": ("steps", "Show a run's recorded steps: CE, loss parts, REQUIRED_RBF"),
    "check": ("check", "Check a run: gaps, stalls, non-finite CE, the runbook's gates"),
    "compare": ("compare", "Compare the CE of an arm with its control, step by step"),
    "goodput": ("goodput", "Where a run's time went: goodput, recovery, step time"),
    "mesh": ("mesh", "The measured mesh table: step time and goodput per slice and mesh"),
    "follow": ("follow", "Follow JAX process 0 of JobSets live, through every fault"),
    "demo": ("demo", "Follow a simulated cluster's faulty runs and report the findings"),
    "simcluster": ("simcluster", "Run a simulated GKE cluster with TPU JobSets and faults"),
    "export": ("export", "Export a run for the experiment ledger (Parquet, manifest, plot)"),
    "dashboards": ("dashboards", "Render or provision the Grafana dashboards and alert rules"),
    "serve": ("serve", "Serve the live page, /metrics and the JSON API (read-only)"),
    "compact": ("compact", "Compact a run's Parquet files into one per table"),
    "archive": ("archive", "Save every pod log of a JobSet before it is deleted"),
    "reparse": ("reparse", "Rebuild a run's rows from the raw log segments follow kept"),
    "lint": ("lint", "Check JobSet YAML against the runbook's rules before submitting"),
    "lake": ("lake", "The Iceberg lake: catch its tables up from SQL, find orphans"),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(n for n, (m, _) in COMMANDS.items() if _exists(m))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        module, summary = COMMANDS.get(name, (None, None))
        if module is None or not _exists(module):
            return None
        command = importlib.import_module(f"steptail.commands.{module}").command
        command.short_help = summary
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The listing from COMMANDS' lines, without importing a command."""
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

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
