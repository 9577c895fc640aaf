"""Tables on a real terminal (issue 24): `runs`, `steps`, `check` and `follow`'s live view
run on a pty of 100 columns (rich finds its width there, as on a user's terminal: COLUMNS
is not set), their output drawn by a small terminal emulator. No cell wraps: each row is
one line, each run name whole on its line, nothing wider than the terminal; log lines print
above the live view, never inside it; the auth plugin's own message reaches the error on a
terminal too."""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time

import pytest
from sim_fixtures import make_simcluster  # noqa: F401
from test_follow_support import scenario

pytestmark = pytest.mark.timeout(240)
CLI = [sys.executable, "-c", "from steptail.cli import main; main()"]
COLS = 100
# Run names as long as real ones: each must stay whole on its line.
LONG = "olmo3-sft-v5p-256-cp4-lb-seed-1234"  # cp4-lb-nan.log: findings with long details, no timestamps
GAP = "qwen3-30b-a3b-sft-resume-gap"  # resume-gap.log: two incarnations, kubelet timestamps, a gap
SHORT = "mini"
AGE = r"\d+[smhdy]\S* ago|in \d+[smhdy]\S*"  # ahead of the clock too: the samples are dated
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR|CRITICAL) steptail\.")


# ---- a terminal ------------------------------------------------------------------------------

class Screen:
    """The VT100 subset rich writes: text (wrapping at the right margin: `wrapped` holds the
    lines that went on on the next one), CR, LF, cursor up/down/column, erase in line and
    below; colours ignored. Its height is unbounded: nothing scrolls away."""

    CONTROL = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])|\x1b\][^\x07]*\x07|\x1b[()][A-Z0-9]|\x1b[=>]")

    def __init__(self, cols: int) -> None:
        self.cols, self.rows, self.row, self.col = cols, [[]], 0, 0
        self.wrap_next = False  # the cursor sits past the last column: the next character wraps
        self.wrapped: set[int] = set()

    def feed(self, text: str) -> Screen:
        pos = 0
        for m in self.CONTROL.finditer(text):
            self._text(text[pos:m.start()])
            pos = m.end()
            if m.group(2) is None:
                continue
            n = int(m.group(1)) if m.group(1).isdigit() else None
            op = m.group(2)
            if op in "ABG":
                self.wrap_next = False
                if op == "A":
                    self.row = max(0, self.row - (n or 1))
                elif op == "B":
                    self.row += n or 1
                else:
                    self.col = (n or 1) - 1
            elif op == "K":
                line = self._line()
                if (n or 0) == 2:
                    line.clear()
                elif (n or 0) == 0:
                    del line[self.col:]
            elif op == "J" and (n or 0) in (0, 2, 3):
                del self.rows[self.row + 1:]
                del self._line()[self.col:]
        self._text(text[pos:])
        return self

    def _line(self) -> list[str]:
        while len(self.rows) <= self.row:
            self.rows.append([])
        return self.rows[self.row]

    def _text(self, text: str) -> None:
        for ch in text:
            if ch == "\n":
                self.row, self.wrap_next = self.row + 1, False
            elif ch == "\r":
                self.col, self.wrap_next = 0, False
            elif ch >= " ":
                if self.wrap_next:
                    self.wrapped.add(self.row)
                    self.row, self.col, self.wrap_next = self.row + 1, 0, False
                line = self._line()
                line.extend(" " * (self.col - len(line)))
                if self.col < len(line):
                    line[self.col] = ch
                else:
                    line.append(ch)
                self.col += 1
                self.wrap_next = self.col >= self.cols

    def lines(self) -> list[str]:
        return ["".join(r).rstrip() for r in self.rows]


def on_terminal(argv: list[str], env: dict | None = None, timeout: float = 120) -> tuple[int, str]:
    """Run `argv` with stdin, stdout and stderr on a pty of COLS x 50: (exit code, what it wrote)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, COLS, 0, 0))
    env = {k: v for k, v in (os.environ if env is None else env).items()
           if k not in ("COLUMNS", "LINES", "FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE",
                        "STEPTAIL_DB")}
    env["TERM"] = "xterm-256color"
    env["PYTHONFAULTHANDLER"] = "1"  # a fatal signal (one CI run saw SIGABRT at exit) shows every thread's stack
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True)
    os.close(slave)
    out = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while True:
            assert time.monotonic() < deadline, f"{argv[3:]} did not end: {out.decode(errors='replace')[-2000:]}"
            if not select.select([master], [], [], 0.2)[0]:
                if proc.poll() is not None and not select.select([master], [], [], 1.0)[0]:
                    break
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every writer of the pty is gone
                break
            if not chunk:
                break
            out += chunk
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        os.close(master)
    return proc.returncode, out.decode(errors="replace")


class Drawn(list):
    """The lines of the screen; `wrapped`: those the terminal had to wrap (wider than it)."""

    wrapped: set[int]

    def logical(self) -> list[tuple[int, str]]:
        """(first screen line, text) of each line as written, the terminal's wraps undone."""
        out: list[tuple[int, str]] = []
        joining = False
        for i, line in enumerate(self):
            if joining:
                out[-1] = (out[-1][0], out[-1][1] + line)
            else:
                out.append((i, line))
            joining = i in self.wrapped
        return out

    def unwrapped(self, first: int, last: int) -> None:
        """Lines first..last (a table) each fit on the terminal's line."""
        assert not self.wrapped & set(range(first, last + 1)), "\n".join(self)


def screen(argv: list[str], env: dict | None = None, codes=(0,)) -> Drawn:
    code, text = on_terminal(argv, env)
    assert code in codes, text
    drawn = Screen(COLS).feed(text)
    lines = Drawn(drawn.lines())
    lines.wrapped = drawn.wrapped
    assert all(len(line) <= COLS for line in lines)
    return lines


def piped(*args: str) -> str:
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.stdout


def rows_of(lines: Drawn) -> list[str]:
    """A boxed table's rows: the lines between its header rule (┡) and its bottom (└); the
    table, top to bottom, none of its lines wrapped by the terminal."""
    top = next(i for i, line in enumerate(lines) if line.startswith("┏"))
    start = next(i for i, line in enumerate(lines) if line.startswith("┡"))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("└"))
    lines.unwrapped(top, end)
    rows = lines[start + 1:end]
    assert all(r.startswith("│") and r.endswith("│") for r in rows), rows
    return rows


def whole_on_one_line(name: str, lines: list[str]) -> None:
    """`name` (a long one) is on exactly one line, whole: no line holds only a piece of it."""
    assert sum(name in line for line in lines) == 1, "\n".join(lines)
    head, tail = name[: len(name) // 2], name[len(name) // 2:]
    assert all(name in line for line in lines if head in line or tail in line), "\n".join(lines)


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> str:
    from store_fixtures import samples_dir

    path = str(tmp_path_factory.mktemp("terminal") / "t.db")
    for run, sample in ((LONG, "cp4-lb-nan.log"), (GAP, "resume-gap.log"), (SHORT, "cp4-lb-nan.log")):
        proc = subprocess.run([*CLI, "ingest", str(samples_dir() / sample), "--run", run, "--db", path],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
    return path


# ---- runs, steps, check ------------------------------------------------------------------------

@pytest.mark.parametrize("wide", [False, True])
def test_runs_one_line_per_run_names_whole(db, wide):
    lines = screen([*CLI, "runs", "--db", db, *(["-o", "wide"] if wide else [])])
    rows = rows_of(lines)
    assert len(rows) == 3
    for run in (LONG, GAP):
        whole_on_one_line(run, lines)
    for run in (LONG, GAP, SHORT):
        assert sum(f"│ {run} " in r for r in rows) == 1, rows
    gap_row = next(r for r in rows if GAP in r)
    assert re.search(AGE, gap_row), gap_row  # the last line's time as an age
    if wide:  # what does not fit is named under the table
        assert any(re.match(r"(1 column|[2-9] columns) not shown", line) for line in lines), lines
    # piped: the full values, as before
    out = piped("runs", "--db", db)
    assert "2026-11-30T05:26:06.532810134Z" in out and "ago" not in out


@pytest.mark.parametrize("wide", [False, True])
def test_steps_one_line_per_step(db, wide):
    records = json.loads(piped("steps", GAP, "--db", db, "--from", "55", "--to", "70", "--json"))
    lines = screen([*CLI, "steps", GAP, "--db", db, "--from", "55", "--to", "70", *(["-o", "wide"] if wide else [])])
    rows = rows_of(lines)
    assert len(rows) == len(records) == 12  # steps 60-63 missing
    for row, record in zip(rows, records, strict=True):
        cells = [c.strip() for c in row.strip("│").split("│")]
        assert cells[:2] == [str(record["incarnation"]), str(record["step"])]
        assert cells[3] == record["ce_raw"]  # the CE kept whole
        assert re.fullmatch(AGE, cells[2]), cells  # the time as an age
    if wide:
        header = next(line for line in lines if line.startswith("┃"))
        assert "z_loss" in header  # the parts' own columns, not one JSON blob
        assert "{" not in "".join(rows)
        assert any("not shown at this width" in line and "rbf_layer_" in line for line in lines)


def test_check_one_line_per_finding_detail_cut(db):
    doc = json.loads(piped("check", LONG, "--db", db, "--json"))
    lines = screen([*CLI, "check", LONG, "--db", db], codes=(1,))
    rows = rows_of(lines)
    assert len(rows) == len(doc["findings"]) == 3
    for row, finding in zip(rows, doc["findings"], strict=True):
        assert f" {finding['severity']} " in row and f" {finding['kind']} " in row
        detail = finding["detail"]
        cell = row.strip("│").split("│")[-1].strip()
        assert cell == detail or (cell.endswith("…") and detail.startswith(cell[:-1])), (cell, detail)
    assert any(line.startswith(f"run {LONG}") or line.strip() == f"run {LONG}" for line in lines)
    # piped: each detail whole (the longest is over 100 characters)
    out = piped("check", LONG, "--db", db)
    assert all(f["detail"] in out for f in doc["findings"])


# ---- follow's live view ------------------------------------------------------------------------

def test_live_view_rows_whole_and_log_lines_above_it(make_simcluster, tmp_path):  # noqa: F811
    run = "olmo3-sft-v5p-256-lr3e-5-seed-7"
    sc = scenario({"action": "auth_lapse", "at_step": 30, "seconds": 1.5},
                  {"action": "eof_streams", "at_step": 31}, rate=40)
    sc["jobsets"][0]["trainer"]["nan_steps"] = [20]  # a critical finding, logged while the view runs
    sim = make_simcluster(sc)
    lines = screen([*CLI, "follow", "--jobset", "olmo3-sft", "--run", run, "-n", "default",
                    "--db", str(tmp_path / "v.db"), "--kubeconfig", str(sim.kubeconfig_path),
                    "--until-done", "--silence", "1"], env=sim.env())
    text = "\n".join(lines)
    titles = [i for i, line in enumerate(lines) if line.strip() == "steptail follow"]
    assert len(titles) == 1, text  # one table: no frame left behind by a line drawn into it
    top = titles[0]
    header = lines[top + 1]
    assert header.startswith("run ") and "state" in header and "last step" in header, text
    assert set(lines[top + 2]) == {"─"}, text
    row = lines[top + 3]
    lines.unwrapped(top, top + 3)
    assert row.startswith(f"{run}  "), text  # the run's row: one line, its name whole
    whole_on_one_line(run, lines[top:top + 4])
    assert " done " in row and " 160 " in row, row
    logged = [(i, line) for i, line in lines.logical() if LOG_LINE.match(line)]
    assert logged and max(i for i, _ in logged) < top, text  # every log line above the table
    assert any(re.fullmatch(rf".* CRITICAL steptail\.alerts run={re.escape(run)} kind=nonfinite_ce "
                            r"ce is not finite \(nan\) at step 20", line) for _, line in logged), text
    assert not any(LOG_LINE.match(line) or "steptail.alerts" in line for line in lines[top:]), text
    assert "ERROR:steptail" not in text and '{"event"' not in text


# ---- the auth plugin's message on a terminal ---------------------------------------------------

def test_auth_lapse_on_a_terminal_shows_the_plugin_s_message(make_simcluster, tmp_path):  # noqa: F811
    sim = make_simcluster(scenario())
    sim.auth_lapse(120)  # the login lapsed: gke-gcloud-auth-plugin fails, with gcloud's message
    code, text = on_terminal([*CLI, "follow", "--jobset", "olmo3-sft", "--run", "r", "-n", "default",
                              "--db", str(tmp_path / "a.db"), "--kubeconfig", str(sim.kubeconfig_path),
                              "--give-up", "3"], env=sim.env())
    plain = Screen.CONTROL.sub("", text)
    assert code == 2, plain
    (error,) = [line for line in plain.splitlines() if line.startswith("steptail: error: ")]
    assert "ERROR: (gcloud.config.config-helper) There was a problem refreshing your current auth tokens: " \
           "Reauthentication failed" in error, error
    assert "NoneType" not in plain, plain
    assert "gcloud auth login" not in plain  # the plugin's stderr is captured, never drawn on the terminal


def test_api_client_keeps_the_plugin_s_message_when_stdout_and_stderr_are_a_terminal(make_simcluster):  # noqa: F811
    sim = make_simcluster(scenario())
    sim.auth_lapse(120)
    script = ("import sys\n"
              "from steptail.collector.cluster import kubeclient\n"
              "from steptail.collector.cluster.kubectl import KubeTarget\n"
              f"kubeclient.api_client(KubeTarget('default', {sim.account!r}, {str(sim.kubeconfig_path)!r}))\n"
              "assert sys.stdout.isatty() and sys.stderr.isatty()\n"
              "print('REASON', kubeclient.exec_failure())\n")
    code, text = on_terminal([sys.executable, "-c", script], env=sim.env())
    plain = Screen.CONTROL.sub("", text)
    assert code == 0, plain
    (reason,) = [line for line in plain.splitlines() if line.startswith("REASON ")]
    assert reason.startswith("REASON exec credential plugin failed: ERROR: (gcloud.config.config-helper) "), reason
    assert "Reauthentication failed" in reason and "NoneType" not in plain
    assert "gcloud auth login" not in plain, plain


# ---- the layout at any width -------------------------------------------------------------------

@pytest.mark.parametrize("width", [60, 80, 100, 132, 200])
def test_every_row_is_one_line_at_any_width(width):
    import io

    from rich.console import Console

    from steptail.collector.live.follower import RunStatus
    from steptail.commands.check import COLUMNS as CHECK
    from steptail.commands.runs import COLUMNS as RUNS
    from steptail.live_view import table
    from steptail.output import Output

    def drawn(render) -> list[str]:
        out = io.StringIO()
        console = Console(file=out, width=width, force_terminal=True, color_system=None)
        render(console)
        return out.getvalue().splitlines()

    runs = [{"run": LONG, "sources": ["kubernetes:post-training/" + LONG], "incarnations": 3, "steps": 12345,
             "last_step": 12000, "last_ce": 2.5, "last_ts": "2026-11-30T05:26:06.532810134Z", "bad_lines": 0,
             "jobset": LONG, "namespace": "post-training", "max_step": 12000, "updated": "2026-11-30T05:26:07Z"},
            {"run": SHORT, "sources": ["files"], "incarnations": 1, "steps": 5, "last_step": 5, "last_ce": None,
             "last_ts": None, "bad_lines": 2, "jobset": None, "namespace": None, "max_step": 5, "updated": None}]
    findings = [{"severity": "critical", "kind": "load_balance_rule", "incarnation": 1, "steps": "",
                 "detail": "ici_context_parallelism=4 with context_parallel_load_balance=True " * 3,
                 "detected_at": "2026-11-30T05:26:07Z"}]
    statuses = {LONG: RunStatus(LONG, "olmo3-sft", pod=f"{LONG}-slice-job-0-0-x7k2p", state="failing (auth)",
                                last_step=12000, last_ce=2.5, last_incarnation=3, step_seconds=1.25, lines=99999,
                                rows=24000, reconnects=12, gaps=1, failures=7, last_error="auth: " + "x" * 300)}
    for fmt, columns, rows in (("table", RUNS, runs), ("wide", RUNS, runs), ("wide", CHECK, findings)):
        lines = drawn(lambda console, f=fmt, c=columns, r=rows: Output(f, console).table(c, r))
        assert all(len(line) <= width for line in lines), "\n".join(lines)
        body = [line for line in lines if line.startswith("│")]
        assert len(body) == len(rows), "\n".join(lines)
        if width >= 80:  # the names whole where there is room for them
            assert all(row[columns[0].value] in line for row, line in zip(rows, body, strict=True)), lines
    lines = drawn(lambda console: console.print(table(statuses)))
    assert all(len(line) <= width for line in lines), "\n".join(lines)
    assert sum(LONG in line for line in lines) == (1 if width >= 80 else 0), "\n".join(lines)


def test_ages_are_kubectl_s():
    from steptail.output import age

    now = 1_796_011_200_000_000_000  # 2026-11-30T04:00:00Z
    assert [age(t, now) for t in ("2026-11-30T03:59:15Z", "2026-11-30T03:56:48.5Z", "2026-11-30T03:20:00Z",
                                  "2026-11-30T01:55:00Z", "2026-11-29T22:55:00Z", "2026-11-29T14:00:00Z",
                                  "2026-11-27T01:00:00Z", "2026-11-30T04:03:00Z", "not a time")] == [
        "45s ago", "3m11s ago", "40m ago", "125m ago", "5h5m ago", "14h ago", "3d3h ago", "in 3m", "not a time"]


# ---- log lines from other threads while the view redraws ---------------------------------------

THREADS_LOGGING = """
import logging, threading, time
from rich.console import Console
from rich.live import Live
from rich.text import Text
from steptail import logs

logs.configure("text")
log = logging.getLogger("steptail.health")
frames = [0]
THREADS, LINES = 4, 250

class Growing:  # a view whose height changes every frame, as the run table's does when a run comes
    def __rich_console__(self, console, options):
        frames[0] += 1
        yield Text("LIVE-TITLE")
        for i in range(1 + frames[0] % 3):
            yield Text(f"row {i}")

def talk(k):
    for i in range(LINES):
        log.warning("thread %d line %d", k, i)
        time.sleep(0.001)

with Live(Growing(), console=Console(stderr=True), refresh_per_second=200, transient=False):
    talkers = [threading.Thread(target=talk, args=(k,)) for k in range(THREADS)]
    for t in talkers:
        t.start()
    for t in talkers:
        t.join()
"""


def test_log_lines_from_threads_leave_no_frame_behind():
    """Lines logged from threads (pod discovery's health) while rich's refresh thread redraws a
    view that grows: rich placed the cursor under its lock but drew the view after it, so a
    refresh in between left a frame behind and overwrote lines (test_live_view_rows_whole_...
    failed so in CI, 2026-12-06: two tables). 8 of 8 runs of this failed before the fix."""
    code, text = on_terminal([sys.executable, "-c", THREADS_LOGGING])
    lines = Screen(COLS).feed(text).lines()
    assert code == 0, text
    assert sum("LIVE-TITLE" in line for line in lines) == 1, "\n".join(lines)
    logged = {line.split(" steptail.health ")[1] for line in lines if " WARNING steptail.health " in line}
    assert logged == {f"thread {k} line {i}" for k in range(4) for i in range(250)}
