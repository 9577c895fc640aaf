"""How commands print data, with kubectl's and sqlite-utils' habits.

`-o table` (the default) is a rich table on a terminal and, when stdout is piped, plain
aligned columns: never cut, never wrapped, one line per row, so grep, awk and sort work.
On a terminal no cell wraps either: each row is one line at the terminal's width (see
fit_table): long cells are cut with an ellipsis, the columns that name a row (`keep`) stay
whole, columns that still do not fit are left out (said under the table), and times are
ages (`3m ago`). The full values are a pipe away (`| cat`, `-o json`, `-o csv`).
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
from rich import box
from rich.cells import cell_len
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from steptail.jsonsafe import strict

FORMATS = ("table", "wide", "json", "csv", "ndjson")
MACHINE_FORMATS = ("json", "csv", "ndjson")
EMPTY = "-"  # an empty cell in plain columns: every row keeps its number of fields


CUT_TO = 10  # on a terminal, the width a column may be cut to unless it says otherwise


@dataclass(frozen=True)
class Column:
    header: str
    value: str | Callable[[dict], object]  # a key of the row, or a function of it
    wide: bool = False  # shown by `-o wide` only
    style: Callable[[dict], str | None] | None = None  # on a terminal only
    # On a terminal (fit_table): a row's name stays whole and is never left out (keep);
    # another column may be cut to min_width with an ellipsis, then left out (the highest
    # `drop` first, then from the right).
    keep: bool = False
    min_width: int | None = CUT_TO  # None: never cut (a number), only left out
    drop: int = 0
    age: bool = False  # an RFC 3339 time: its age on a terminal (`3m ago`), the time itself when piped
    short: str | None = None  # the header on a terminal, where width is scarce (piped: `header`)

    @property
    def title(self) -> str:
        return self.short or self.header

    def text(self, row: dict) -> str:
        value = row.get(self.value) if isinstance(self.value, str) else self.value(row)
        if value is None:
            return ""
        if isinstance(value, (dict, list)):
            return json.dumps(strict(value), allow_nan=False)
        # one line per row, whatever a value holds
        return str(value).replace("\r", " ").replace("\n", " ")

    def cell(self, row: dict, now_ns: int | None = None) -> str:
        """The text of a terminal's cell: text(), a time as its age."""
        text = self.text(row)
        return age(text, now_ns) if self.age and text else text


def age(timestamp: str, now_ns: int | None = None) -> str:
    """`45s ago`, `3m12s ago`, `5h5m ago`, `3d4h ago` (kubectl's AGE, with `ago`); a time
    ahead of the clock: `in 3m`. A value that is not an RFC 3339 time stays as it is."""
    import time

    from steptail.parsers.timestamps import parse_rfc3339

    try:
        then = parse_rfc3339(timestamp)
    except ValueError:
        return timestamp
    seconds = ((time.time_ns() if now_ns is None else now_ns) - then) / 1e9
    if -1 < seconds < 0:  # clocks a little apart
        seconds = 0.0
    text = duration(abs(seconds))
    return f"{text} ago" if seconds >= 0 else f"in {text}"


def duration(seconds: float) -> str:
    """kubectl's short duration: 45s, 3m12s, 25m, 125m, 5h5m, 10h, 3d4h, 12d, 2y30d, 9y."""
    s = int(seconds)
    m, h, d = s // 60, s // 3600, s // 86400
    if s < 120:
        return f"{s}s"
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    if h < 24 * 8:
        return f"{d}d{h % 24}h" if h % 24 else f"{d}d"
    if d < 365 * 2:
        return f"{d}d"
    y = d // 365
    return f"{y}y{d % 365}d" if y < 8 and d % 365 else f"{y}y"


@dataclass
class Fit:
    """fit_table's answer: the columns shown, each one's width, those left out."""

    columns: list[Column]
    widths: list[int | None]  # None: rich shares out the width (only `keep` columns, still too wide)
    left_out: list[Column]

    def note(self, more: str = "a wider terminal, or | cat") -> str | None:
        if not self.left_out:
            return None
        names = [c.title for c in self.left_out]
        listed = ", ".join(names) if len(names) <= 4 else f"{', '.join(names[:3])} … {names[-1]}"
        count = f"{len(names)} columns" if len(names) > 1 else "1 column"
        return f"{count} not shown at this width ({more}): {listed}"


def _frame(n: int, compact: bool) -> int:
    """Cells of a row that are no column's: a boxed table's left edge and each column's padding
    and right rule; a compact one's two spaces between columns."""
    return max(0, 2 * n - 2) if compact else 1 + 3 * n


def fit(columns: list[Column], cells: list[list[str]], width: int, compact: bool = False) -> Fit:
    """Widths that put each row on one line of `width` cells: every column as wide as its
    widest cell or header; over the width, the widest of the columns that may be cut are cut
    (down to their min_width at most); still over, columns are left out
    (highest `drop` first, then the rightmost), never a `keep` one; with only those left and
    still over, rich cuts them evenly (with an ellipsis)."""
    natural = [max([cell_len(c.title), *(cell_len(r[i]) for r in cells)], default=1) or 1
               for i, c in enumerate(columns)]
    floor = [n if c.keep or c.min_width is None else min(n, c.min_width)
             for c, n in zip(columns, natural, strict=True)]
    shown = list(range(len(columns)))
    order = sorted((i for i, c in enumerate(columns) if not c.keep), key=lambda i: (-columns[i].drop, -i))
    left_out: list[int] = []
    while True:
        room = width - _frame(len(shown), compact)
        widths = _cut({i: natural[i] for i in shown}, {i: floor[i] for i in shown}, room)
        if widths is not None:
            break
        if not order:  # the columns kept whole alone are too wide: rich cuts them evenly
            return Fit([columns[i] for i in shown], [None] * len(shown),
                       [columns[i] for i in sorted(left_out)])
        gone = order.pop(0)
        shown.remove(gone)
        left_out.append(gone)
    return Fit([columns[i] for i in shown], [widths[i] for i in shown], [columns[i] for i in sorted(left_out)])


def _cut(natural: dict[int, int], floor: dict[int, int], room: int) -> dict[int, int] | None:
    """`natural` cut down to `room` in all, each no lower than its floor, the widest first
    (every cut column ends as wide as the others, short cells stay whole); None if it cannot be."""
    if sum(natural.values()) <= room:
        return dict(natural)
    if sum(floor.values()) > room:
        return None
    lo, hi = 0, max(natural.values())  # the widest a cut column may be: the largest that fits
    while lo < hi:
        level = (lo + hi + 1) // 2
        if sum(max(floor[i], min(natural[i], level)) for i in natural) <= room:
            lo = level
        else:
            hi = level - 1
    widths = {i: max(floor[i], min(natural[i], lo)) for i in natural}
    spare = room - sum(widths.values())
    for i in natural:  # what is left (less than one cell per column) to the leftmost cut ones
        if spare and widths[i] < natural[i]:
            widths[i] += 1
            spare -= 1
    return widths


def fit_table(columns: list[Column], rows: list[dict], width: int, *, title: str | None = None,
              caption: Text | None = None, now_ns: int | None = None, compact: bool = False,
              more: str = "a wider terminal, or | cat") -> Table | Group:
    """A rich table of `rows` whose every row is one line of at most `width` cells (see fit):
    no cell wraps, a cut one ends in an ellipsis. Under it: `caption`, and a note naming the
    columns left out, and where to see them (`more`). compact: no box, two spaces between
    columns (kubectl's look)."""
    cells = [[c.cell(row, now_ns) for c in columns] for row in rows]
    laid = fit(columns, cells, width, compact)
    note = laid.note(more)
    notes = [n for n in (caption, None if note is None else Text(note, style="dim")) if n is not None]
    style = {"box": box.SIMPLE_HEAD, "show_edge": False, "pad_edge": False, "collapse_padding": True} \
        if compact else {}
    # as wide as its title where the terminal allows (a run's name in it stays whole)
    table = Table(title=title, expand=False, min_width=min(cell_len(title or ""), width) or None, **style)
    index = {id(c): i for i, c in enumerate(columns)}
    for c, w in zip(laid.columns, laid.widths, strict=True):
        table.add_column(c.title, width=w, no_wrap=True, overflow="ellipsis", min_width=None if w is None else 1)
    for row, texts in zip(rows, cells, strict=True):
        table.add_row(*(Text(texts[index[id(c)]], style=(c.style(row) if c.style else None) or "")
                        for c in laid.columns))
    return Group(table, *notes) if notes else table


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
    def data(self, document, records: Iterable[dict] | None = None, fields: list[str] | None = None) -> None:
        """`document` for -o json; `records` (default: the document's items, or the document
        itself as one record) for -o csv and -o ndjson; `fields`: the CSV header (default: the
        records' keys in order of appearance), printed even with no record."""
        if records is None:
            records = document if isinstance(document, list) else [document]
        if self.format == "json":
            self._write(_json(document) + "\n")
        elif self.format == "ndjson":
            for record in records:
                self._write(_json(record) + "\n")
        elif self.format == "csv":
            self._write_csv(list(records), fields)
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
        self.print(fit_table(shown, rows, self.console.width, title=title), soft_wrap=False)

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

    def _write_csv(self, records: list[dict], fields: list[str] | None = None) -> None:
        header: dict[str, None] = dict.fromkeys(fields or ())
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
