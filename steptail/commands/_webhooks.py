"""Webhook URLs for `follow`. They often carry a secret in their path or query, so besides
--alert-webhook (visible in `ps`) they can come from a file or the environment, and are
only ever shown redacted (scheme://host[:port])."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

import click

from steptail.commands._common import fail
from steptail.storage.outbox import redact

WEBHOOKS_ENV = "STEPTAIL_ALERT_WEBHOOKS"

webhook_file_option = click.option(
    "--alert-webhook-file", "webhook_file", type=click.Path(dir_okay=False, path_type=Path),
    help=f"File of webhook URLs, one per line (# comments); also ${WEBHOOKS_ENV} (whitespace-separated). "
         "Unlike --alert-webhook, not visible in `ps`.")


def read_webhooks(urls: tuple[str, ...] = (), webhook_file: Path | None = None,
                  environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """--alert-webhook URLs, then the file's, then $STEPTAIL_ALERT_WEBHOOKS', duplicates dropped.
    A missing file or a URL that is not http(s)://host exits 2 (one line, the URL redacted)."""
    found = list(urls)
    if webhook_file is not None:
        try:
            text = webhook_file.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            fail(f"cannot read webhook file {webhook_file}: {getattr(exc, 'strerror', None) or exc}")
        found += [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    found += (os.environ if environ is None else environ).get(WEBHOOKS_ENV, "").split()
    for url in found:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            fail(f"webhook {redact(url)} is not an http(s):// URL")
    return tuple(dict.fromkeys(found))
