"""How commands print data, with kubectl's and sqlite-utils' habits.

`-o table` (the default) is a rich table on a terminal and, when stdout is piped, plain
aligned columns: never cut, never wrapped, one line per row, so grep, awk and sort work.
`-o wide` adds the columns a command keeps for it. `-o json` is the command's JSON document
(what `--json` prints), `-o csv` and `-o ndjson` its records: one per row or per line."""

from __future__ import annotations

import csv
import functools
import json
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from steptail.jsonsafe import strict

FORMATS = ("table", "wide", "json", "csv", "ndjson")
MACHINE_FORMATS = ("json", "csv", "ndjson")
EMPTY = "-"  # an empty cell in plain columns: every row keeps its number of fields


@dataclass(frozen=True)
class Column:
    header: str
    value: str | Callable[[dict], object]  # a key of the row, or a function of it
    wide: bool = False  # shown by `-o wide` only
    style: Callable[[dict], str | None] | None = None  # on a terminal only

    def text(self, row: dict) -> str:
        value = row.get(self.value) if isinstance(self.value, str) else self.value(row)
        if value is None:
            return ""
        if isinstance(value, (dict, list)):
            return json.dumps(strict(value), allow_nan=False)
        # one line per row, whatever a value holds
        return str(value).replace("\r", " ").replace("\n", " ")


class Output:
    """Where a command's data goes, in the format chosen by -o (see output_option)."""

    def __init__(self, fmt: str = "table", console: Console | None = None) -> None:
        self.format = fmt
        self.console = console or Console()
        self.closed = False  # the reader of a pipe went away

    @property
    def machine(self) -> bool:
        return self.format in MACHINE_FORMATS

    @property
    def piped(self) -> bool:
        return not self.console.is_terminal

    # -- for programs ---------------------------------------------------------------------------
    def data(self, document, records: Iterable[dict] | None = None) -> None:
        """`document` for -o json; `records` (default: the document's items, or the document
        itself as one record) for -o csv and -o ndjson."""
        if records is None:
            records = document if isinstance(document, list) else [document]
        if self.format == "json":
            self._write(_json(document) + "\n")
        elif self.format == "ndjson":
            for record in records:
                self._write(_json(record) + "\n")
        elif self.format == "csv":
            self._write_csv(list(records))
        else:
            raise ValueError(f"not a data format: {self.format}")

    def event(self, record: dict) -> None:
        """One NDJSON line, flushed at once (a live stream read by jq)."""
        self._write(_json(record) + "\n", flush=True)

    # -- for people -----------------------------------------------------------------------------
    def table(self, columns: list[Column], rows: Iterable[dict], title: str | None = None) -> None:
        shown = [c for c in columns if self.format == "wide" or not c.wide]
        rows = list(rows)
        if self.piped:
            self._plain(shown, rows)
            return
        table = Table(title=title, expand=False)
        for c in shown:
            table.add_column(c.header, overflow="fold")
        for row in rows:
            table.add_row(*(Text(c.text(row), style=(c.style(row) if c.style else None) or "") for c in shown))
        self.console.print(table)

    def line(self, text: str = "", markup: bool = True) -> None:
        """Prose around the data: never wrapped, so a path or a command stays whole when piped."""
        self.print(text, markup=markup)

    def print(self, *objects, **kwargs) -> None:
        """Console.print, unwrapped unless asked: code written for a Console keeps working."""
        if self.closed:
            return
        kwargs.setdefault("soft_wrap", True)
        kwargs.setdefault("highlight", False)
        try:
            self.console.print(*objects, **kwargs)
        except BrokenPipeError:
            self._reader_gone()

    # -- writing --------------------------------------------------------------------------------
    def _plain(self, columns: list[Column], rows: list[dict]) -> None:
        cells = [[c.header.upper() for c in columns]]
        cells += [[c.text(row) or EMPTY for c in columns] for row in rows]
        widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
        self._write("".join("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() + "\n"
                            for r in cells))

    def _write_csv(self, records: list[dict]) -> None:
        header: dict[str, None] = {}
        for r in records:
            header.update(dict.fromkeys(r))
        lines = _Lines()
        out = csv.writer(lines)
        out.writerow(list(header))
        for r in records:
            out.writerow([_csv_cell(r.get(k)) for k in header])
        self._write("".join(lines.parts))

    def _write(self, text: str, flush: bool = False) -> None:
        if self.closed:
            return
        try:
            sys.stdout.write(text)
            if flush:
                sys.stdout.flush()
        except BrokenPipeError:
            self._reader_gone()

    def _reader_gone(self) -> None:
        """`steptail steps r | head`: the rest is not wanted, and is no error."""
        self.closed = True
        try:  # later writes and the interpreter's final flush go nowhere instead of failing
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except (OSError, ValueError):  # no real file descriptor (a test runner's capture)
            pass


class _Lines:
    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, text: str) -> None:
        self.parts.append(text)


def _json(value) -> str:
    return json.dumps(strict(value), allow_nan=False)


def _csv_cell(value) -> str:
    """None as an empty cell, nested values as JSON, numbers exactly (repr of a float)."""
    value = strict(value)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, allow_nan=False)
    return repr(value) if isinstance(value, float) else str(value)


def output_option(csv_flag: bool = False):
    """`-o/--output table|wide|json|csv|ndjson`, with `--json` kept as `-o json` (and, with
    csv_flag, `--csv` as `-o csv`). The command gets `output`, an Output."""

    def decorate(fn):
        @functools.wraps(fn)
        def command(*args, output_format, json_alias, csv_alias=False, **kwargs):
            aliases = [f for f, given in (("json", json_alias), ("csv", csv_alias)) if given]
            chosen = set(aliases) | ({output_format} if output_format else set())
            if len(chosen) > 1:
                from steptail.commands._common import fail

                fail(f"choose one output format, not {' and '.join(sorted(chosen))}")
            return fn(*args, output=Output(chosen.pop() if chosen else "table"), **kwargs)

        if csv_flag:
            command = click.option("--csv", "csv_alias", is_flag=True, help="Same as -o csv.")(command)
        command = click.option("--json", "json_alias", is_flag=True, help="Same as -o json.")(command)
        return click.option(
            "-o", "--output", "output_format", type=click.Choice(FORMATS), metavar="FORMAT",
            help="table (default; plain columns when piped), wide (more columns), json, csv or ndjson.",
        )(command)

    return decorate
