"""Output conventions (-o table|wide|json|csv|ndjson) of the data commands, read through a
pipe as a script would: machine formats parse back to `--json`'s data; piped tables are plain
aligned columns, one line per row, never cut; `follow -o ndjson` streams as the run goes."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import select
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_follow_support import recorded, scenario

pytestmark = pytest.mark.timeout(180)
STEPTAIL = str(Path(sys.executable).with_name("steptail"))
BOX_DRAWING = set("─━│┃┌┏┐┓└┗┘┛├┣┤┫┬┳┴┻┼╋╭╮╯╰═║╇╈┡┩")


def steptail(*args: str, account: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("STEPTAIL_DB", "CLOUDSDK_CORE_ACCOUNT", "COLUMNS")}
    if account:
        env["CLOUDSDK_CORE_ACCOUNT"] = account
    # stdout a pipe, as for a script: never a terminal
    proc = subprocess.run([STEPTAIL, *args], capture_output=True, text=True, env=env, timeout=timeout)
    assert proc.returncode in (0, 1), proc.stderr
    return proc


def csv_matches(text: str, records: list[dict]) -> None:
    """CSV cells read back as the JSON values: empty is null, nested values are JSON, numbers exact."""
    table = list(csv.DictReader(io.StringIO(text)))
    assert len(table) == len(records)
    for row, record in zip(table, records, strict=True):
        assert list(row) == list(record)
        for key, value in record.items():
            cell = row[key]
            if value is None:
                assert cell == "", key
            elif isinstance(value, str):
                assert cell == value, key
            else:
                assert json.loads(cell) == value, key


def ndjson(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def plain_table(text: str) -> list[str]:
    assert not BOX_DRAWING & set(text) and "…" not in text, text
    return text.splitlines()


@pytest.fixture
def runs_ingested(db_url, samples):
    """cp and cp2: the same log (findings with long details, a NaN step) under two names."""
    for run in ("cp", "cp2"):
        steptail("ingest", str(samples / "cp4-lb-nan.log"), "--run", run, "--db", db_url)
    return db_url


def flat_steps(records: list[dict]) -> list[dict]:
    """`steps --json` records as `steps -o csv` has them: each loss part and each REQUIRED_RBF
    layer a column (parts after ce_raw, then rbf_max, rbf_program, the layers)."""
    keys = list(dict.fromkeys(k for r in records for k in r["parts"]))
    layers = max(len(r["rbf_per_layer"] or []) for r in records)
    out = []
    for r in records:
        row = {k: r[k] for k in ("incarnation", "step", "ts", "ce", "ce_raw")}
        row |= {k: r["parts"].get(k) for k in keys}
        row |= {"rbf_max": r["rbf_max"], "rbf_program": r["rbf_program"]}
        per_layer = r["rbf_per_layer"] or []
        row |= {f"rbf_layer_{i}": per_layer[i] if i < len(per_layer) else None for i in range(layers)}
        out.append(row)
    return out


@pytest.mark.parametrize("command, records_of", [
    (("runs",), lambda doc: doc),
    (("steps", "cp"), lambda doc: doc),
    (("check", "cp"), lambda doc: doc["findings"]),
    (("compare", "cp", "cp2"), lambda doc: doc["steps"]),
])
def test_formats_parse_back_to_the_json_data(runs_ingested, command, records_of):
    db = runs_ingested
    reference = steptail(*command, "--db", db, "--json")
    doc = json.loads(reference.stdout)
    records = records_of(doc)
    assert records, doc
    assert steptail(*command, "--db", db, "-o", "json").stdout == reference.stdout
    assert ndjson(steptail(*command, "--db", db, "-o", "ndjson").stdout) == records
    # CSV: the same records, but steps' nested parts and layers are columns of their own
    csv_matches(steptail(*command, "--db", db, "-o", "csv").stdout,
                flat_steps(records) if command[0] == "steps" else records)

    lines = plain_table(steptail(*command, "--db", db).stdout)
    assert len(lines[0].split()) >= 4 and lines[0] == lines[0].upper()  # the header
    rows = lines[1:1 + len(records)]
    assert len(rows) == len(records)
    if command[0] == "check":  # each finding on its one line, its long detail whole
        assert max(len(f["detail"]) for f in records) > 100
        for line, finding in zip(rows, records, strict=True):
            assert finding["kind"] in line and line.endswith(finding["detail"])
    else:  # each record's first field starts its line
        first = {"runs": "run", "steps": "incarnation", "compare": "step"}[command[0]]
        assert [line.split()[0] for line in rows] == [str(r[first]) for r in records]
    if command[0] in ("runs", "steps"):
        assert len(lines) == 1 + len(records)  # nothing but the table


def test_wide_adds_columns_and_one_format_at_a_time(runs_ingested):
    db = runs_ingested
    narrow = plain_table(steptail("runs", "--db", db).stdout)[0].split()
    wide = plain_table(steptail("runs", "--db", db, "-o", "wide").stdout)[0].split()
    assert wide[:len(narrow)] == narrow and "UPDATED" in wide
    steps_csv = steptail("steps", "cp", "--db", db, "--csv").stdout
    assert steps_csv == steptail("steps", "cp", "--db", db, "-o", "csv").stdout
    env = {k: v for k, v in os.environ.items() if k != "STEPTAIL_DB"}
    proc = subprocess.run([STEPTAIL, "runs", "--db", db, "--json", "-o", "csv"], capture_output=True, text=True,
                          env=env, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == ["steptail: error: choose one output format, not csv and json"]


def test_steps_wide_and_csv_have_a_column_per_part_and_layer_named_as_the_python_api(runs_ingested):
    from steptail.api import open as open_store

    db = runs_ingested
    records = json.loads(steptail("steps", "cp", "--db", db, "--json").stdout)
    with open_store(db) as st:
        frame = st.steps("cp")
    parts = list(frame.columns[5:])  # the API's: incarnation, step, ts, ce, ce_raw, then one per part
    # in the order the store gives the keys: as logged (SQLite), JSONB's (PostgreSQL)
    assert sorted(parts) == ["moe_lb", "total", "tunix_loss", "weights", "z_loss"], parts
    layers = [f"rbf_layer_{i}" for i in range(len(records[0]["rbf_per_layer"]))]
    header = ["incarnation", "step", "ts", "ce", "ce_raw", *parts, "rbf_max", "rbf_program", *layers]

    table = list(csv.reader(io.StringIO(steptail("steps", "cp", "--db", db, "-o", "csv").stdout)))
    assert table[0] == header  # one column per part and per layer, in a stable order
    assert len(table) == 1 + len(records)
    assert not any(cell.startswith(("{", "[")) for row in table[1:] for cell in row)  # nothing nested
    for row, record, (_, api) in zip(table[1:], records, frame.iterrows(), strict=True):
        cells = dict(zip(header, row, strict=True))
        for key in parts:  # the NaN step's non-finite values as the words JSON keeps
            assert cells[key] == str(record["parts"][key]) and _same(float(cells[key]), api[key]), key
        assert [float(cells[c]) for c in layers] == record["rbf_per_layer"]

    wide = plain_table(steptail("steps", "cp", "--db", db, "-o", "wide").stdout)
    names = wide[0].split()
    assert names[names.index("CE") + 1:][:2] == ["RBF", "MAX"]  # the table's own columns first
    assert [n.lower() for n in names[-len(parts) - len(layers):]] == parts + layers
    assert len(wide) == 1 + len(records)
    assert all(len(line.split()) == len(names) - 1 for line in wide[1:])  # "RBF MAX": one column, two words
    first = wide[1].split()
    assert first[-len(layers):] == [str(v) for v in records[0]["rbf_per_layer"]]
    assert first[-len(layers) - len(parts):-len(layers)] == [str(records[0]["parts"][k]) for k in parts]


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def test_ingest_summary_formats(db_url, samples):
    sample = str(samples / "resume-gap.log")

    def ingest(run: str, *fmt: str) -> str:
        return steptail("ingest", sample, "--run", run, "--db", db_url, *fmt).stdout

    doc = json.loads(ingest("a", "--json"))
    assert json.loads(ingest("b", "-o", "json")) == doc | {"run": "b"}
    assert ndjson(ingest("c", "-o", "ndjson")) == [doc | {"run": "c"}]
    csv_matches(ingest("d", "-o", "csv"), [doc | {"run": "d"}])
    line = plain_table(ingest("e"))[0]
    assert line.startswith("e: ") and f"{doc['loss_parts']} LOSS-PARTS" in line

    # `| head -1`: the reader leaves early (the rows fill more than a pipe's buffer); no error
    env = {k: v for k, v in os.environ.items() if k != "STEPTAIL_DB"}
    proc = subprocess.Popen([STEPTAIL, "steps", "a", "--db", db_url, "-o", "wide"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    assert proc.stdout.readline().startswith(b"INC ")
    proc.stdout.close()
    assert proc.wait(timeout=60) == 0 and proc.stderr.read() == b""


def test_demo_report_keeps_paths_and_commands_whole_when_piped(tmp_path):
    from rich.console import Console

    from steptail.commands.demo import _print, suggestions
    from steptail.output import Output

    db = str(tmp_path / ("a directory with a long name " * 3) / "steptail.db")
    finding = {"kind": "gap", "incarnation": 1, "first_step": 5, "last_step": 9, "severity": "warning",
               "detail": "steps 5-9 missing " * 10}
    report = {"db": db, "parquet": db + ".parquet", "runs": [
        {"run": "r", "state": "done", "steps_recorded": 9, "steps_written_by_trainer": 9, "incarnations": 1,
         "reconnects": 0, "steps_lost_to_rotation": [], "failures": [], "stream_gaps": [], "findings": [finding]}],
        **suggestions(db, 9464)}
    piped = io.StringIO()
    _print(Output("table", Console(file=piped, width=80)), report)
    lines = piped.getvalue().splitlines()
    assert any(line.rstrip().endswith(finding["detail"].strip()) for line in lines)
    commands = [line.removeprefix("try:").removeprefix("page:").strip() for line in lines if "steptail " in line]
    assert commands == [*report["try"], report["serve"]]  # each whole, on one line
    assert [shlex.split(c)[1] for c in commands] == ["runs", "steps", "check", "compare", "serve"]
    assert all(shlex.split(c)[shlex.split(c).index("--db") + 1] == db for c in commands)


def _follow(sim, db: str, *extra: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("STEPTAIL_DB", "COLUMNS")}
    env["CLOUDSDK_CORE_ACCOUNT"] = sim.account
    return subprocess.Popen([STEPTAIL, "follow", "--jobset", "olmo3-sft", "--run", "r", "-n", "default",
                             "--kubeconfig", str(sim.kubeconfig_path), "--db", db, "--silence", "1",
                             "--until-done", *extra], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_follow_ndjson_streams_steps_as_the_run_goes(make_simcluster, tmp_path):
    total = 160
    # about 16 s of steps: a follow that starts slowly on a loaded machine still meets the
    # trainer mid-run (at 4 s, CI once saw the whole log arrive before the first step was read)
    sim = make_simcluster(scenario(rate=10))
    db = str(tmp_path / "f.db")
    proc = _follow(sim, db, "-o", "ndjson")
    lines: list[bytes] = []
    first_step_seen_live = None
    buffer = b""
    deadline = time.monotonic() + 90
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 0.2)
            if not ready:
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            buffer += chunk
            *complete, buffer = buffer.split(b"\n")
            for line in complete:
                lines.append(line)
                if first_step_seen_live is None and json.loads(line)["event"] == "step":
                    # read while the collector still runs and the trainer has steps to go
                    first_step_seen_live = proc.poll() is None and len(recorded(db, "r")) < total
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = proc.stderr.read().decode()
    assert proc.returncode == 0, stderr
    assert buffer == b"" and first_step_seen_live, lines[:3]
    events = [json.loads(line) for line in lines]  # every line is one JSON object
    kinds = {e["event"] for e in events}
    assert {"step", "rbf", "state", "summary"} <= kinds, kinds
    assert events[-1]["event"] == "summary" and events[-1]["runs"][0]["state"] == "done"
    assert [e["state"] for e in events if e["event"] == "state"][-1] == "done"

    # step (and REQUIRED_RBF) events are the stored rows, as `steps --json` reads them back
    stored = json.loads(steptail("steps", "r", "--db", db, "--json").stdout)
    assert len(stored) == total
    steps = [e for e in events if e["event"] == "step"]
    assert {e["run"] for e in steps} == {"r"}
    steps = [{k: v for k, v in e.items() if k not in ("event", "run")} for e in steps]
    loss_fields = ("incarnation", "step", "ts", "ce", "ce_raw", "parts")
    assert steps == [{k: r[k] for k in loss_fields} for r in stored]
    rbf = {(e["incarnation"], e["step"]): e for e in events if e["event"] == "rbf"}
    assert rbf and all(rbf[(r["incarnation"], r["step"])]["rbf_max"] == r["rbf_max"]
                       for r in stored if r["rbf_max"] is not None)

    # the run is done: following it again gives the same summary in each format
    reference = _follow(sim, db, "--json").communicate(timeout=60)[0].decode()
    doc = json.loads(reference)
    assert doc["runs"][0]["state"] == "done"
    again = json.loads(_follow(sim, db, "-o", "json").communicate(timeout=60)[0])
    assert again == doc
    csv_matches(_follow(sim, db, "-o", "csv").communicate(timeout=60)[0].decode(), doc["runs"])
