"""The README is true as written: its shell examples run, in order, in a scratch directory
holding the files they name (sample logs under the README's names, a reference CE, token
files in $HOME), with `steptail` the venv's CLI; its Python examples run after the shell
lines before them. Lines that need a cluster, Grafana or a webhook (or take minutes) are
listed in NOT_RUN with the reason. The routes and metric names it documents are the code's."""

from __future__ import annotations

import gzip
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from steptail.storage.db import open_store

README = Path(__file__).resolve().parents[1] / "README.md"
STEPTAIL = Path(sys.executable).parent / "steptail"
SAMPLES = Path(__file__).resolve().parent / "samples"

# A line starting with one of these is not run; the reason is printed with -rs / on failure.
NOT_RUN = {
    "make ": "builds a fresh virtualenv, then runs the whole suite or the 80 s demo",
    "steptail follow ": "needs a Kubernetes cluster (tests/test_follow_cli.py follows the simulated one)",
    "steptail archive ": "needs a Kubernetes cluster (tests/test_archive.py archives the simulated one)",
    "steptail reparse ": "needs the raw log of a followed run (tests/test_raw_log.py reparses one)",
    "steptail dashboards provision ": "needs Grafana (tests/test_dashboards_provision.py fakes one)",
    "steptail simcluster ": "serves a simulated cluster until stopped (tests/test_sim_kubectl.py)",
    "steptail demo": "runs for about 80 s (tests/test_demo.py runs a short one)",
    ".venv/bin/python benchmarks/": "benchmarks run for minutes",
}
# Servers run until stopped: each is started, must answer /healthz, and is stopped.
SERVERS = ("steptail serve",)
# Documented exit codes other than 0 that mean "ran as intended" (1: something flagged).
FLAGGING = {"check", "compare"}
TIMEOUT = 120

_FENCE = re.compile(r"^([ \t]*)```[ \t]*(sh|bash|shell|python)[ \t]*\n(.*?)^[ \t]*```", re.M | re.S)
_AT_COMMAND = re.compile(r"(^|[|;&(][ \t]*)steptail(?=\s|$)")


def examples(text: str) -> list[tuple[str, str]]:
    """("sh", one command line) and ("python", one block), in the README's order."""
    out = []
    for indent, lang, body in _FENCE.findall(text):
        lines = [line[len(indent):] if line.startswith(indent) else line.lstrip() for line in body.splitlines()]
        if lang == "python":
            out.append(("python", "\n".join(lines) + "\n"))
            continue
        joined = re.sub(r"[ \t]*\\\n[ \t]*", " ", "\n".join(lines))  # continuation lines
        for line in joined.splitlines():
            line = line.strip().removeprefix("$ ")
            if line and not line.startswith("#"):
                out.append(("sh", line))
    return out


def not_run_reason(line: str) -> str | None:
    return next((why for start, why in NOT_RUN.items() if line.startswith(start)), None)


def first_step_ce(log: Path) -> float:
    match = re.search(r"LOSS-PARTS step=1 ce=(\S+)", log.read_text())
    assert match, log
    return float(match[1])


def stage(work: Path, home: Path) -> None:
    """The files the README's examples name."""
    saved = work / "saved"
    saved.mkdir()
    with gzip.open(saved / "olmo3-sft-a-0.log.gz", "wb") as fh:
        fh.write((SAMPLES / "resume-gap.log").read_bytes())
    (work / "base").mkdir()
    shutil.copy(SAMPLES / "clean-300.log", work / "base" / "olmo3-sft-base-0.log")
    (work / "hf_step1.json").write_text(json.dumps({"1": first_step_ce(SAMPLES / "resume-gap.log")}))
    for name in (".grafana-token", ".steptail-token"):
        (home / name).write_text("readme-example-token\n")
        (home / name).chmod(0o600)


def shell_line(line: str) -> str:
    return _AT_COMMAND.sub(lambda m: m[1] + shlex.quote(str(STEPTAIL)), line)


def acceptable_codes(line: str) -> set[int]:
    words = shlex.split(line, comments=True)
    return {0, 1} if len(words) > 1 and words[1] in FLAGGING else {0}


def serve_address(line: str) -> tuple[str, int]:
    from steptail.commands.serve import command as serve_command

    defaults = {p.name: p.default for p in serve_command.params}
    words = shlex.split(line, comments=True)
    host = words[words.index("--host") + 1] if "--host" in words else defaults["host"]
    port = int(words[words.index("--port") + 1]) if "--port" in words else defaults["port"]
    return {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host), port


def run_server(line: str, work: Path, env: dict) -> str | None:
    """None when the server answered /healthz; else what went wrong."""
    host, port = serve_address(line)
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}/healthz"
    proc = subprocess.Popen(["bash", "-c", "exec " + shell_line(line)], cwd=work, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return f"exited {proc.returncode}: {proc.stderr.read().strip()[-500:]}"
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    if resp.status == 200:
                        return None
            except OSError:
                time.sleep(0.2)
        return f"no answer from {url} within 30 s"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.mark.timeout(900)
def test_every_readme_example_runs_as_written(tmp_path):
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    stage(work, home)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STEPTAIL_", "GRAFANA_"))}
    env["HOME"] = str(home)
    ran, skipped, failures = [], [], []
    for lang, example in examples(README.read_text()):
        if lang == "python":
            r = subprocess.run([sys.executable, "-c", example], cwd=work, env=env, capture_output=True,
                               text=True, timeout=TIMEOUT)
            ran.append("python block")
            if r.returncode != 0:
                failures.append(f"python block exited {r.returncode}:\n{example}{r.stderr.strip()[-1500:]}")
            continue
        reason = not_run_reason(example)
        if reason is not None:
            skipped.append(f"{example}  [{reason}]")
            continue
        ran.append(example)
        if example.startswith(SERVERS):
            problem = run_server(example, work, env)
            if problem:
                failures.append(f"{example}\n  {problem}")
            continue
        r = subprocess.run(["bash", "-c", shell_line(example)], cwd=work, env=env, capture_output=True,
                           text=True, timeout=TIMEOUT)
        if r.returncode not in acceptable_codes(example):
            failures.append(f"{example}\n  exit {r.returncode}: {(r.stderr or r.stdout).strip()[-1500:]}")
    print("ran:\n  " + "\n  ".join(ran) + "\nnot run:\n  " + "\n  ".join(skipped))
    assert not failures, "README examples that fail as written:\n" + "\n".join(failures)
    # the examples' results are where the README says
    assert (work / "ledger" / "olmo3-sft-a" / "manifest.json").is_file()
    assert (work / "a-vs-base.png").is_file() and any((work / "parquet").iterdir())
    assert len(ran) >= 10


def test_extraction_joins_continuations_and_keeps_order():
    text = ("x\n```sh\n# a comment\nsteptail runs   # trailing\nsteptail follow --a \\\n    --b c\n```\n"
            "  ```python\n  import steptail\n  ```\n```bash\n$ steptail check r\n```\n")
    assert examples(text) == [("sh", "steptail runs   # trailing"), ("sh", "steptail follow --a --b c"),
                              ("python", "import steptail\n"), ("sh", "steptail check r")]
    assert not_run_reason("steptail follow --a --b c") and not not_run_reason("steptail runs")
    assert shell_line("steptail runs --db postgresql://steptail@db/steptail | steptail x").count(
        str(STEPTAIL)) == 2


def test_documented_routes_are_the_servers(tmp_path):
    from steptail.serve import make_app

    store = open_store(str(tmp_path / "s.db"))
    try:
        routes = {r.resource.canonical for r in make_app(store).router.routes()}
    finally:
        store.dispose()
    text = README.read_text()
    for route in routes:
        documented = route.replace("{run}", "<run>")
        assert re.search(rf"`{re.escape(documented)}[`?]", text), f"route {documented} not in README"


def test_documented_metrics_are_the_exposed_ones(tmp_path):
    from prometheus_client import generate_latest

    from steptail.collector.notify.metrics import Metrics
    from steptail.serve import StoreCollector

    names = set()
    for line in generate_latest(Metrics().registry).decode().splitlines():
        if line.startswith("# TYPE "):
            names.add(line.split()[2])  # a counter's name as scraped, with _total
    store = open_store(str(tmp_path / "s.db"))
    try:
        names |= {family.name for family in StoreCollector(store).collect()}
    finally:
        store.dispose()
    text = README.read_text()
    missing = sorted(n for n in names if f"`{n}`" not in text)
    assert not missing, f"metrics not named in README: {missing}"
