"""`steptail dashboards render|provision`: Grafana dashboards and alert rules as code."""

from __future__ import annotations

from pathlib import Path

import click

from steptail.commands._common import db_option, fail, json_option, print_json, read_secret

TOKEN_ENV = ("STEPTAIL_GRAFANA_TOKEN", "GRAFANA_TOKEN")


@click.group("dashboards")
def command() -> None:
    """Render or provision the Grafana dashboards and alert rules."""


@command.command("render")
@click.option("--out", "out", required=True, type=click.Path(path_type=Path),
              help="Directory for dashboards/*.json and alert-rules/*.json.")
@json_option
def render_cmd(out: Path, as_json: bool) -> None:
    """Write the dashboard and alert-rule JSON to DIR."""
    from dashboards.render import render

    if out.exists() and not out.is_dir():
        fail(f"{out} is not a directory")
    try:
        paths = render(out)
    except OSError as exc:
        fail(f"cannot write to {out}: {exc.strerror or exc}")
    if as_json:
        print_json({"written": [str(p) for p in paths]})
    else:
        for p in paths:
            click.echo(str(p))


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
@json_option
def provision_cmd(url: str, token_file: Path | None, db: str | None, skip_datasource: bool,
                  as_json: bool) -> None:
    """Create or update the datasource, folder, dashboards and alert rules (idempotent).

    The datasource points at the PostgreSQL store given by --db / $STEPTAIL_DB."""
    from dashboards.provision import ProvisionError, provision
    from storage.db import StoreError, resolve_url

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
    if as_json:
        print_json(report.as_dict())
    else:
        for verb in ("created", "updated", "unchanged"):
            for name in getattr(report, verb):
                click.echo(f"{verb:9} {name}")
