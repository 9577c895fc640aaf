"""Log output of `follow` and `demo`, one format everywhere, on stderr:

- text (a terminal): `2026-12-02T06:00:00.123Z WARNING steptail.alerts run=olmo3-sft
  kind=gap steps 60–63 missing …`: the time (UTC), the level, the logger, the record's `run`
  and `kind` when it has them, the message;
- json (a Deployment's logs): one JSON object per line. Cloud Logging reads `severity` (the
  level), `time` and `message`; every field a record carries (`extra=`) is a top-level key:
  run, source, state, kind, reason of collector.notify.health's state changes; event
  ("finding"), id, run, kind, incarnation, first_step, last_step, detail, detected_at of a
  finding (collector.notify.alerts), whose level is its severity: CRITICAL or WARNING.

While `follow`'s live view runs, rich's Live redirects sys.stderr above the live region; the
handler writes to sys.stderr as it is at each record, so a log line is never drawn inside the
table (and when stderr is not the terminal, it goes to stderr itself)."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from datetime import UTC, datetime

TEXT_FIELDS = ("run", "kind")  # shown as key=value in the text format, before the message
RESERVED = ("severity", "time", "logger", "message")  # a record's field never replaces these
# Attributes every LogRecord has: anything else on a record came with `extra=`.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}
_SEVERITY = {logging.DEBUG: "DEBUG", logging.INFO: "INFO", logging.WARNING: "WARNING",
             logging.ERROR: "ERROR", logging.CRITICAL: "CRITICAL"}


def timestamp(created: float | None = None) -> str:
    """UTC with milliseconds and `Z`: 2026-12-02T06:00:00.123Z."""
    when = datetime.now(UTC) if created is None else datetime.fromtimestamp(created, UTC)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def json_line(severity: str, logger: str, message: str, created: float | None = None, **fields) -> str:
    out = {"severity": severity, "time": timestamp(created), "logger": logger, "message": message}
    out.update((k, v) for k, v in fields.items() if v is not None)
    return json.dumps(out, ensure_ascii=False, default=str)


def fields(record: logging.LogRecord) -> dict:
    """The fields a record was given with `extra=`, in their order."""
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        extra = {k: v for k, v in fields(record).items() if k not in RESERVED}  # a finding's severity: the level
        if record.exc_info:
            extra["exception"] = self.formatException(record.exc_info)
        return json_line(_SEVERITY.get(record.levelno, record.levelname), record.name, record.getMessage(),
                         record.created, **extra)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        extra = fields(record)
        tags = "".join(f" {k}={_text(extra[k])}" for k in TEXT_FIELDS if extra.get(k) not in (None, ""))
        line = f"{timestamp(record.created)} {record.levelname} {record.name}{tags} {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _text(value) -> str:
    text = str(value)
    return json.dumps(text, ensure_ascii=False) if not text or any(c.isspace() or c in '"=' for c in text) else text


class StderrHandler(logging.StreamHandler):
    """A StreamHandler on sys.stderr as it is at each record, not as it was when configured:
    rich's Live (the live view) swaps in a proxy that prints above the live region. When the
    real stderr is not a terminal (`2> follow.log`), the line goes there, not on the screen.
    On the screen a line is printed whole, the terminal wrapping it (the proxy alone would
    cut it in lines at the console's width)."""

    def __init__(self) -> None:
        super().__init__()

    def emit(self, record: logging.LogRecord) -> None:
        console = getattr(sys.stderr, "_FileProxy__console", None)  # rich's proxy: its Live's console
        if console is None or not _isatty(getattr(sys.stderr, "rich_proxied_file", None)):
            super().emit(record)
            return
        try:
            from rich.text import Text

            # Under the Live's lock for the whole print: rich takes it only to place the cursor,
            # and a refresh from its thread between that and this line's drawing of the view
            # (a view that grew a row) left a frame behind and overwrote a line (CI, 2026-12-06).
            lives = getattr(console, "_live_stack", None)
            lock = getattr(lives[0], "_lock", None) if lives else None
            with lock if lock is not None else contextlib.nullcontext():
                console.print(Text(self.format(record)), soft_wrap=True, highlight=False)
        except Exception:  # noqa: BLE001 - as StreamHandler.emit: a log line never raises
            self.handleError(record)

    @property
    def stream(self):
        err = sys.stderr
        real = getattr(err, "rich_proxied_file", None)
        if real is not None and not _isatty(real):
            return real
        return err

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler sets it; the property decides
        pass


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


def configure(fmt: str = "text") -> None:
    """Everything steptail logs to stderr in `fmt` (text | json), at WARNING and above, plus
    the INFO line of a failure that cleared, of runs moving between replicas and of an info
    finding (a rule not evaluable: noted, nothing to do). The HTTP
    libraries' own retry warnings are dropped: the failure they retry is one state-change
    line of ours. `follow` calls it first (--log-format); `demo` too, with text."""
    handler = StderrHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    logging.getLogger("steptail.health").setLevel(logging.INFO)
    logging.getLogger("steptail.replicas").setLevel(logging.INFO)
    logging.getLogger("steptail.alerts").setLevel(logging.INFO)
    logging.getLogger("urllib3").setLevel(logging.ERROR)


def json_enabled() -> bool:
    return any(isinstance(h.formatter, JsonFormatter) for h in logging.getLogger().handlers)
