"""`steptail demo`, shortened: it records, flags and tells where the data is; its arm
(qwen3-cp4: context parallelism 4 with load balancing on) departs from its control (qwen3-cp1)
in the stored CE as the simulated bug says; it writes its two charts; and every command it
prints runs as printed in a new shell without the virtualenv on PATH."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import sqlalchemy as sa

pytestmark = pytest.mark.timeout(180)
BIN = Path(sys.executable).parent  # the virtualenv's bin (not resolved: its python is a link)


def test_demo_records_flags_and_points_at_its_data(tmp_path):
    from steptail.commands.demo import ARM, CONTROL, QWEN_SEED
    from steptail.simcluster.trainer import Trainer
    from steptail.storage.db import open_store
    from steptail.storage.parquet import read_table

    out = tmp_path / "demo"
    r = subprocess.run([sys.executable, "-c", "from steptail.cli import main; main()", "demo", "--dir", str(out),
                        "--seconds", "12", "--json"], capture_output=True, text=True, timeout=150)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert (out / "steptail.db").exists() and report["db"] == str(out / "steptail.db")
    runs = {x["run"]: x for x in report["runs"]}
    assert set(runs) == {"olmo3-sft", ARM, CONTROL}
    olmo, qwen, control = runs["olmo3-sft"], runs[ARM], runs[CONTROL]
    assert olmo["incarnations"] == 2 and olmo["reconnects"] >= 1  # JobSet restart, hang, EOF
    assert any(f["kind"] == "auth" for f in olmo["failures"] + qwen["failures"])
    assert qwen["steps_lost_to_rotation"] and qwen["stream_gaps"]
    kinds = {f["kind"]: f for f in qwen["findings"]}
    assert {"gap", "rule:load_balance", "nonfinite_ce", "step1_ce_gate"} <= set(kinds)
    gate = kinds["step1_ce_gate"]  # against the HF reference the demo wrote: +0.39, critical
    assert gate["severity"] == "critical" and "+0.390000" in gate["detail"]
    assert not {"step1_ce_gate", "rule:load_balance"} & {f["kind"] for f in control["findings"]}
    lp = read_table(out / "parquet", "loss_parts", "olmo3-sft")
    assert lp.num_rows == olmo["steps_recorded"] > 0

    # the story, in the stored CE: the arm sits above its control by the simulated bug's
    # error (+0.39 at step 1, growing); the control is its seed's correct curve
    store = open_store(str(out / "steptail.db"), create=False)
    try:
        with store.engine.connect() as conn:
            def ce(run):
                return dict(conn.execute(sa.text("SELECT step, ce FROM loss_parts WHERE run = :r AND ce IS NOT NULL"),
                                         {"r": run}).all())
            arm, ctl, olmo_ce = ce(ARM), ce(CONTROL), ce("olmo3-sft")
    finally:
        store.dispose()
    right = Trainer(seed=QWEN_SEED)
    bug = Trainer(seed=QWEN_SEED, context_parallelism=4, load_balance=True)
    assert ctl == {s: right.base_ce(s) for s in range(1, 221)}
    common = sorted(set(arm) & set(ctl))
    assert len(common) > 100 and 1 in common and 90 not in arm  # step 90 is the NaN
    for s in common:
        assert arm[s] - ctl[s] == pytest.approx(bug.load_balance_error(s), abs=2e-6)
    assert arm[1] - ctl[1] == pytest.approx(0.39, abs=2e-6) and arm[common[-1]] - ctl[common[-1]] > 0.7
    # another seed, another curve: its first 49 steps recorded (a busy machine can cost it some
    # of steps 1-49, flagged below: a CI run kept 20 of them)
    head = sorted(s for s in olmo_ce if s in ctl)[:49]
    assert len(head) > 20 and any(abs(olmo_ce[s] - ctl[s]) > 0.005 for s in head)
    # a busy machine can make the demo's faults cost olmo3-sft some of its first steps: never silently
    gap_steps = {s for f in olmo["findings"] if f["kind"] in ("gap", "head_gap") for s in range(f["first_step"], f["last_step"] + 1)}
    assert set(range(1, 50)) - set(olmo_ce) <= gap_steps, (sorted(set(range(1, 50)) - set(olmo_ce)), olmo["findings"])
    c = report["comparison"]
    assert (c["arm"], c["control"], c["first_divergent_step"]) == (ARM, CONTROL, 1)
    assert c["delta_at_first_divergent_step"] == pytest.approx(0.39, abs=2e-6)
    assert [ch["path"] for ch in report["charts"]] == [str(out / "qwen3-cp4-vs-qwen3-cp1.png"),
                                                       str(out / "olmo3-sft-ce.png")]
    for chart in report["charts"]:
        assert Path(chart["path"]).read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def fresh_shell_env(home: Path) -> dict:
    """What a new terminal has: no virtualenv on PATH or activated, no steptail settings."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("STEPTAIL_", "VIRTUAL_ENV", "PYTHON", "KUBECONFIG", "CLOUDSDK_"))}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and Path(p).resolve() != BIN.resolve())
    env["HOME"] = str(home)
    return env


def printed(stdout: str) -> dict[str, list[str]]:
    """The data section's lines by label (`charts:`, `try:`, `page:`; a blank label goes on
    with the one above), each line's text after the label column."""
    all_lines = stdout.splitlines()
    rule = max(i for i, line in enumerate(all_lines) if re.fullmatch(r"\u2500+ data \u2500+", line.strip()))
    section = all_lines[rule + 1:]
    out: dict[str, list[str]] = {}
    label = None
    for line in section:
        head, text = line[:9].strip(), line[9:].strip()
        label = head or label
        out.setdefault(label, []).append(text)
    return out


def test_demo_prints_commands_that_run_in_a_new_shell(tmp_path):
    from PIL import Image

    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir()
    elsewhere.mkdir()
    env = fresh_shell_env(home)
    assert not any(Path(p).resolve() == BIN.resolve() for p in env["PATH"].split(os.pathsep))
    # as `make demo` runs it: .venv/bin/steptail, relative to the checkout
    checkout = BIN.parent.parent
    relative = Path(BIN.parent.name) / BIN.name / "steptail"
    out = tmp_path / "a demo dir"  # a space: the printed paths must be quoted
    r = subprocess.run([str(relative), "demo", "--dir", str(out), "--seconds", "12", "--no-view"],
                       cwd=checkout, env=env, capture_output=True, text=True, timeout=150)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = printed(r.stdout)
    assert r.stdout.rstrip().splitlines()[-2].startswith("page:")  # the page is the last word

    charts = [text.split("  (")[0] for text in lines["charts:"]]
    assert charts == [str(out / "qwen3-cp4-vs-qwen3-cp1.png"), str(out / "olmo3-sft-ce.png")]
    for chart in charts:
        with Image.open(chart) as img:
            img.load()
            assert img.format == "PNG" and img.size[0] >= 600

    def shell(command: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", command], cwd=elsewhere, env=env, capture_output=True, text=True,
                              timeout=120)

    tried = lines["try:"]
    assert [shlex.split(c)[1] for c in tried] == ["runs", "steps", "check", "compare"]
    for command in tried:
        assert Path(shlex.split(command)[0]).is_absolute(), command
        res = shell(command)
        verb = shlex.split(command)[1]
        if verb == "check":  # exit 1: it flags the arm (the runbook's rule, the step-1 gate)
            assert res.returncode == 1, (command, res.stderr)
            assert "rule:load_balance" in res.stdout and "by +0.390000" in res.stdout
        elif verb == "compare":  # exit 1: the arm diverges from its control
            assert res.returncode == 1, (command, res.stderr)
            assert "diverges at step 1" in res.stdout
        elif verb == "runs":
            assert res.returncode == 0, (command, res.stderr)
            assert {"olmo3-sft", "qwen3-cp4", "qwen3-cp1"} <= {line.split()[0] for line in res.stdout.splitlines()}
        else:  # steps: a row per recorded step, both incarnations
            assert res.returncode == 0, (command, res.stderr)
            rows = [line.split() for line in res.stdout.splitlines()[1:]]
            assert {row[0] for row in rows} == {"1", "2"} and len(rows) > 200

    serve, then = lines["page:"]
    url = then.removeprefix("then open ")
    assert url.startswith("http://127.0.0.1:") and url.endswith("/") and f"--port {url.split(':')[2][:-1]}" in serve
    proc = subprocess.Popen(["bash", "-c", serve], cwd=elsewhere, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.communicate()[1]
            try:
                with urllib.request.urlopen(url + "healthz", timeout=2) as resp:
                    assert resp.status == 200
                    break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline, "serve did not answer"
                time.sleep(0.2)
        with urllib.request.urlopen(url, timeout=5) as resp:  # the page
            assert resp.status == 200 and resp.headers.get_content_type() == "text/html"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    assert proc.returncode == 0, proc.stderr.read()
