"""Log output of `follow`: text for a terminal, or one JSON object per line for a
Deployment's logs (Cloud Logging reads `severity`, `time` and `message`, and keeps the other
fields: run, source, state, kind, reason of collector.notify.health's state changes)."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

TEXT = "%(asctime)s %(name)s %(levelname)s %(message)s"
FIELDS = ("run", "source", "state", "kind", "reason")
_SEVERITY = {logging.DEBUG: "DEBUG", logging.INFO: "INFO", logging.WARNING: "WARNING",
             logging.ERROR: "ERROR", logging.CRITICAL: "CRITICAL"}


def json_line(severity: str, logger: str, message: str, created: float | None = None, **fields) -> str:
    when = datetime.now(UTC) if created is None else datetime.fromtimestamp(created, UTC)
    out = {"severity": severity, "time": when.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
           "logger": logger, "message": message}
    out.update((k, v) for k, v in fields.items() if v is not None)
    return json.dumps(out, ensure_ascii=False, default=str)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = {k: record.__dict__.get(k) for k in FIELDS}
        if record.exc_info:
            fields["exception"] = self.formatException(record.exc_info)
        return json_line(_SEVERITY.get(record.levelno, record.levelname), record.name, record.getMessage(),
                         record.created, **fields)


def configure(fmt: str = "text") -> None:
    """Everything steptail logs to stderr in `fmt` (text | json), at WARNING and above, plus
    the INFO line of a failure that cleared and of runs moving between replicas. The HTTP libraries' own retry warnings are
    dropped: the failure they retry is one state-change line of ours."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    logging.getLogger("steptail.health").setLevel(logging.INFO)
    logging.getLogger("steptail.replicas").setLevel(logging.INFO)
    logging.getLogger("urllib3").setLevel(logging.ERROR)


def json_enabled() -> bool:
    return any(isinstance(h.formatter, JsonFormatter) for h in logging.getLogger().handlers)
