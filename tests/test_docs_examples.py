"""The README and docs/ run as written. Convention for an example in README.md or docs/*.md:

- A ```console block is a shell session, and it is run. A line starting with `$ ` is a
  command; a command ending in `\\` goes on with the next line, and lines starting with `> `
  right after it are its continuation (a heredoc's body, as a shell's PS2 prompt shows it).
  Any other line is output shown to the reader, not checked.
- A command exits 0, unless its line says otherwise in a trailing comment: `# exit 1` (e.g.
  `check` when it flags). A command ending in `&` runs in the background; the block's leftover
  processes are stopped when the block ends.
- A ```console block is not run when the line just before its fence is
  `<!-- not run: REASON -->` (it needs a real cluster, Grafana, a registry, or minutes).
  Keep them few.
- A ```python block is run (with the venv's python) only when the line just before its fence
  is `<!-- run -->`; others are listings.
- ```sh/```bash/```shell blocks are not allowed in the files this test owns (README.md and the
  reference pages): every shell example is either run or says why not.

Each file's examples run in order, as one reader would type them, in a fresh folder of its
own (a fresh store, ./steptail.db) holding what a checkout holds after `make demo`: `tests/`
and `deploy/` (links to the repository's), `.venv` (a link to this interpreter's environment)
and `steptail-demo/` (made once per session by a short `steptail demo --seconds 8`), with
`$HOME` empty and no `STEPTAIL_*`/`KUBECONFIG` in the environment. `serve`'s port 9464 is
replaced by a free port, so that a steptail already serving on this machine is never hit."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OWNED = ["README.md", "docs/cli.md", "docs/follow.md", "docs/metrics.md", "docs/data.md", "docs/deploy.md",
         "docs/grafana.md"]
DOCUMENTS = ["README.md"] + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))
TIMEOUT = 180  # one block, or one python example
SERVE_PORT = "9464"

_FENCE = re.compile(r"^```[ \t]*(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
_MARK = re.compile(r"<!--\s*(run|not run:\s*(.+?))\s*-->\s*$")
_EXIT = re.compile(r"\s#\s*exit\s+(\d+)\b")


class Block:
    def __init__(self, lang: str, body: str, marker: str | None, line: int) -> None:
        self.lang, self.body, self.marker, self.line = lang, body, marker, line

    @property
    def not_run(self) -> str | None:
        if self.marker and self.marker.startswith("not run"):
            return self.marker.split(":", 1)[1].strip() or "?"
        return None


def blocks(text: str) -> list[Block]:
    out = []
    for m in _FENCE.finditer(text):
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = _MARK.search(before)
        out.append(Block(m[1], m[2], mark[1] if mark else None, text.count("\n", 0, m.start()) + 1))
    return out


def commands(body: str) -> list[tuple[str, int]]:
    """(command, expected exit status) of a console block, in order."""
    out: list[list] = []
    open_line = False  # the last command ended in a backslash
    for line in body.splitlines():
        if open_line:
            out[-1][0] += "\n" + line
        elif line.startswith("$ "):
            out.append([line[2:], None])
        elif line.startswith("> ") or line == ">":
            if not out:
                raise ValueError(f"continuation before any command: {line!r}")
            out[-1][0] += "\n" + line[2:]
        else:
            continue  # output shown to the reader
        open_line = line.endswith("\\")
    result = []
    for command, _ in out:
        first = command.split("\n", 1)[0]
        m = _EXIT.search(first)
        result.append((command, int(m[1]) if m else 0))
    return result


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def script(cmds: list[tuple[str, int]], port: int) -> str:
    """One bash script: each command, then a check of its exit status."""
    lines = ["set -u"]
    for i, (command, expected) in enumerate(cmds):
        command = command.replace(SERVE_PORT, str(port))
        lines.append(command)
        if command.rstrip().endswith("&"):
            continue
        lines.append(f"rc=$?; if [ $rc -ne {expected} ]; then echo \"@@ command {i} exited $rc, "
                     f"documented {expected}\" >&2; exit 97; fi")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="session")
def demo_store(tmp_path_factory) -> Path:
    """steptail-demo/ as `make demo` leaves it (olmo3-sft and qwen3-cp4), shortened to 8 s."""
    out = tmp_path_factory.mktemp("docs-demo") / "steptail-demo"
    r = subprocess.run([str(Path(sys.executable).parent / "steptail"), "demo", "--dir", str(out), "--seconds", "8",
                        "--no-view"], capture_output=True, text=True, timeout=120, env=clean_env(out.parent))
    assert r.returncode == 0, r.stderr[-2000:]
    return out


def clean_env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("STEPTAIL_", "GRAFANA_", "KUBECONFIG", "CLOUDSDK_", "VIRTUAL_ENV"))}
    env["HOME"] = str(home)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if not p.endswith("/.venv/bin"))
    return env


def folder(tmp_path: Path, demo: Path | None) -> tuple[Path, dict]:
    work, home = tmp_path / "checkout", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    (work / "tests").symlink_to(ROOT / "tests")
    (work / "deploy").symlink_to(ROOT / "deploy")
    (work / ".venv").symlink_to(Path(sys.prefix))
    if demo is not None:
        shutil.copytree(demo, work / "steptail-demo")
    return work, clean_env(home)


def run_block(cmds: list[tuple[str, int]], work: Path, env: dict) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(["bash", "-c", script(cmds, free_port())], cwd=work, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # what the block left running in the background
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("document", DOCUMENTS)
def test_examples_run_as_written(document, tmp_path, request):
    text = (ROOT / document).read_text()
    found = blocks(text)
    runnable = [b for b in found if (b.lang == "console" and not b.not_run) or (b.lang == "python" and b.marker == "run")]
    if not runnable:
        pytest.skip(f"{document}: no runnable example")
    demo = request.getfixturevalue("demo_store") if "steptail-demo" in text else None
    work, env = folder(tmp_path, demo)
    for block in runnable:
        where = f"{document}:{block.line}"
        if block.lang == "python":
            r = subprocess.run([sys.executable, "-c", block.body], cwd=work, env=env, capture_output=True, text=True,
                               timeout=TIMEOUT)
            assert r.returncode == 0, f"{where}: python block exited {r.returncode}\n{r.stderr[-2000:]}"
            continue
        cmds = commands(block.body)
        assert cmds, f"{where}: a console block without a `$ ` command"
        r = run_block(cmds, work, env)
        failed = re.search(r"@@ command (\d+) exited (\d+), documented (\d+)", r.stderr)
        if failed:
            command = cmds[int(failed[1])][0]
            pytest.fail(f"{where}: `{command}` exited {failed[2]}, documented {failed[3]}\n"
                        f"{r.stderr[:failed.start()][-2000:]}")
        assert r.returncode == 0, f"{where}: block exited {r.returncode}\n{r.stderr[-2000:]}"


@pytest.mark.parametrize("document", OWNED)
def test_every_shell_example_is_run_or_says_why_not(document):
    path = ROOT / document
    assert path.is_file(), document
    found = blocks(path.read_text())
    shell = [b.line for b in found if b.lang in ("sh", "bash", "shell", "zsh")]
    assert not shell, f"{document}: shell blocks at lines {shell}: make them ```console (run) or mark them"
    for b in found:
        if b.lang == "console" and not b.not_run:
            assert commands(b.body), f"{document}:{b.line}: a console block without a `$ ` command"


def test_not_run_blocks_are_few():
    skipped = [(d, b.line, b.not_run) for d in OWNED for b in blocks((ROOT / d).read_text())
               if b.lang == "console" and b.not_run]
    ran = [b for d in OWNED for b in blocks((ROOT / d).read_text()) if b.lang == "console" and not b.not_run]
    assert len(skipped) <= len(ran), skipped


def test_the_convention_is_read_as_documented():
    text = ("x\n```console\n$ steptail runs   # shown\nRUN  SOURCE\n$ steptail check r   # exit 1: flagged\n"
            "$ steptail follow --a \\\n    --b c\n$ cat > f <<'EOF'\n> a: 1\n> EOF\n```\n"
            "<!-- not run: needs a cluster -->\n```console\n$ kubectl get pods\n```\n"
            "<!-- run -->\n```python\nimport steptail\n```\n```python\nx\n```\n")
    found = blocks(text)
    assert [(b.lang, b.not_run, b.marker) for b in found] == [
        ("console", None, None), ("console", "needs a cluster", "not run: needs a cluster"),
        ("python", None, "run"), ("python", None, None)]
    assert commands(found[0].body) == [("steptail runs   # shown", 0), ("steptail check r   # exit 1: flagged", 1),
                                       ("steptail follow --a \\\n    --b c", 0), ("cat > f <<'EOF'\na: 1\nEOF", 0)]
    assert "9999" in script([("curl localhost:9464/x", 0)], 9999)


def test_documented_routes_are_the_servers(tmp_path):
    from steptail.http.app import make_app
    from steptail.storage.db import open_store

    store = open_store(str(tmp_path / "s.db"))
    try:
        routes = {r.resource.canonical for r in make_app(store).router.routes()}
    finally:
        store.dispose()
    # docs/cli.md "serve in detail"; the page at / and its routes may be in docs/page.md
    text = "".join(p.read_text() for p in (ROOT / "docs" / "cli.md", ROOT / "docs" / "page.md") if p.exists())
    for route in routes:
        documented = route.replace("{run}", "<run>")
        assert re.search(rf"`{re.escape(documented)}[`?]", text), f"route {documented} not in docs/cli.md"


def test_documented_metrics_are_the_exposed_ones(tmp_path):
    """docs/metrics.md's tables name every metric `follow` and `serve` export, as scraped."""
    from prometheus_client import generate_latest

    from steptail.collector.notify.metrics import Metrics
    from steptail.http.metrics import StoreCollector
    from steptail.storage.db import open_store

    names = set()
    for line in generate_latest(Metrics().registry).decode().splitlines():
        if line.startswith("# TYPE "):
            names.add(line.split()[2])  # a counter's name as scraped, with _total
    store = open_store(str(tmp_path / "s.db"))
    try:
        names |= {family.name for family in StoreCollector(store).collect()}
    finally:
        store.dispose()
    text = (ROOT / "docs" / "metrics.md").read_text()
    tabled = set(re.findall(r"^\| `(steptail_\w+)` \|", text, re.M))
    missing = sorted(n for n in names if n not in tabled)
    assert not missing, f"metrics not in a docs/metrics.md table: {missing}"


def test_every_option_of_every_command_is_in_the_cli_reference():
    import click

    from steptail.cli import main as cli

    text = (ROOT / "docs" / "cli.md").read_text()
    ctx = click.Context(cli)
    missing = []
    for name in cli.list_commands(ctx):
        command = cli.get_command(ctx, name)
        subs = command.commands.values() if isinstance(command, click.Group) else [command]
        for sub in subs:
            heading = re.search(rf"^### `{re.escape(name if sub is command else f'{name} {sub.name}')}[ `]", text, re.M)
            if heading is None:
                missing.append(f"{name} {'' if sub is command else sub.name}".strip())
                continue
            section = text[heading.end():].split("\n### ", 1)[0]
            missing += [f"{name} {opt}" for p in sub.params if isinstance(p, click.Option)
                        for opt in p.opts if opt.startswith("--") and opt != "--help" and f"`{opt}`" not in section]
    assert not missing, f"not in docs/cli.md's options: {missing}"
