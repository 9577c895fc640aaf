"""`steptail dashboards render|provision`: Grafana dashboards and alert rules as code."""

from __future__ import annotations

from pathlib import Path

import click
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from steptail.commands._common import db_option, fail, read_secret
from steptail.dashboards.provisioning_files import (
    DEFAULT_DASHBOARDS_PATH,
    DEFAULT_DB_URL,
    PASSWORD_ENV,
)
from steptail.output import Column, Output, output_option

TOKEN_ENV = ("STEPTAIL_GRAFANA_TOKEN", "GRAFANA_TOKEN")
PROVISIONED = [Column("action", "action"), Column("name", "name")]


@click.group("dashboards")
def command() -> None:
    """Render or provision the Grafana dashboards and alert rules."""


@command.command("render")
@click.option("--out", "out", required=True, type=click.Path(path_type=Path),
              help="Directory to write (the layout above).")
@click.option("--datasource-url", default=DEFAULT_DB_URL, show_default=True, metavar="URL",
              help="The PostgreSQL store Grafana's provisioned datasource reads, as "
                   "postgresql://USER@HOST[:PORT]/DB[?sslmode=MODE]; no password: Grafana "
                   f"takes it from ${PASSWORD_ENV} in its own environment.")
@click.option("--dashboards-path", default=DEFAULT_DASHBOARDS_PATH, show_default=True,
              metavar="PATH",
              help="Where Grafana sees DIR/dashboards (the ConfigMap's mountPath): the "
                   "dashboard provider's options.path.")
@output_option()
def render_cmd(out: Path, datasource_url: str, dashboards_path: str, output: Output) -> None:
    """Write the dashboards, alert rules and Grafana provisioning files to DIR.

    \b
    DIR/dashboards/<uid>.json      dashboards (importable in the UI: __inputs)
    DIR/alert-rules/<uid>.json     alert rules, the HTTP API's format
    DIR/provisioning/dashboards/steptail.yaml    dashboard provider
    DIR/provisioning/datasources/steptail.yaml   PostgreSQL datasource
    DIR/provisioning/alerting/steptail.yaml      alert rules (file format)
    DIR/prometheus/                Prometheus rules file and PrometheusRule"""
    from steptail.dashboards.render import render

    if out.exists() and not out.is_dir():
        fail(f"{out} is not a directory")
    db = _datasource_db(datasource_url)
    try:
        paths = render(out, db, dashboards_path)
    except OSError as exc:
        fail(f"cannot write to {out}: {exc.strerror or exc}")
    written = [str(p) for p in paths]
    if output.machine:
        output.data({"written": written}, [{"path": p} for p in written])
    else:  # a path per line, also on a terminal: ready for xargs
        for p in written:
            click.echo(p)


def _datasource_db(url: str):
    from steptail.dashboards.provisioning_files import Database, SettingsError

    try:
        parsed = make_url(url)
    except ArgumentError:
        fail(f"--datasource-url: not a database URL: {url!r}")
    if parsed.password:  # never written to a file, never echoed back
        fail(f"--datasource-url must not hold a password: Grafana reads ${PASSWORD_ENV}")
    try:
        return Database.from_url(parsed)
    except SettingsError as exc:
        fail(f"--datasource-url: {exc}")


def read_token(token_file: Path | None) -> str | None:
    """--token-file, else $STEPTAIL_GRAFANA_TOKEN / $GRAFANA_TOKEN (never argv, never logged)."""
    return read_secret(token_file, TOKEN_ENV)


@command.command("provision")
@click.option("--url", required=True, envvar="GRAFANA_URL", help="Grafana base URL ($GRAFANA_URL).")
@click.option("--token-file", type=click.Path(dir_okay=False, path_type=Path),
              help="File holding the Grafana service-account token (else $GRAFANA_TOKEN).")
@db_option
@click.option("--skip-datasource", is_flag=True,
              help="Leave the datasource alone (it is managed elsewhere).")
@output_option()
def provision_cmd(url: str, token_file: Path | None, db: str | None, skip_datasource: bool,
                  output: Output) -> None:
    """Create or update the datasource, folder, dashboards and alert rules (idempotent).

    The datasource points at the PostgreSQL store given by --db / $STEPTAIL_DB."""
    from steptail.dashboards.provision import ProvisionError, provision
    from steptail.storage.db import StoreError, resolve_url

    token = read_token(token_file)
    db_url = None
    if not skip_datasource:
        try:
            db_url = resolve_url(db)
        except StoreError as exc:
            fail(str(exc))
    try:
        report = provision(url, token, db_url)
    except ProvisionError as exc:
        fail(str(exc))
    done = [{"action": verb, "name": name} for verb in ("created", "updated", "unchanged")
            for name in getattr(report, verb)]
    if output.machine:
        output.data(report.as_dict(), done)
    else:
        output.table(PROVISIONED, done)
