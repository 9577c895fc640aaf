"""One log format everywhere (issue 24): `--log-format json` is one JSON object per line
whose fields are top-level keys (a finding's run, kind, incarnation, steps and detail, never
a JSON string inside `message`), at CRITICAL for a critical finding and WARNING for a
warning one; the text format is `time LEVEL logger run=… kind=… message`. Checked on the
records the alerter logs, and on `follow`'s stderr against the simulated cluster."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
import subprocess
import sys

import pytest
from sim_fixtures import make_simcluster  # noqa: F401
from test_follow_support import findings, scenario

from steptail import logs
from steptail.collector.notify.alerts import Alerter
from steptail.collector.notify.health import Health, Repeats
from steptail.runs.findings import Finding

pytestmark = pytest.mark.timeout(180)
CLI = [sys.executable, "-c", "from steptail.cli import main; main()"]
DETECTED = 1_796_011_200_000_000_000  # 2026-11-30T04:00:00Z
TIME = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
FINDING_FIELDS = ("event", "id", "run", "kind", "incarnation", "first_step", "last_step", "detail", "detected_at")


@pytest.fixture
def stderr(monkeypatch, caplog):
    """`configure(fmt)` as follow does, its lines read back; caplog keeps the records. The
    root logger is put back afterwards."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level, {n: logging.getLogger(n).level for n in
                                            ("steptail.health", "steptail.replicas", "steptail.alerts",
                                             "urllib3")})
    # a repeat an earlier test left pending would be summed up here, as a line of its own
    for name in ("steptail.follow", "steptail.health"):
        for f in logging.getLogger(name).filters:
            if isinstance(f, Repeats):
                f.reset()
    out = io.StringIO()

    def configure(fmt: str) -> io.StringIO:
        monkeypatch.setattr(sys, "stderr", out)  # the handler writes to sys.stderr as it is at each record
        logs.configure(fmt)
        root.addHandler(caplog.handler)
        return out

    yield configure
    root.handlers[:], root.level = saved[0], saved[1]
    for name, level in saved[2].items():
        logging.getLogger(name).setLevel(level)


def publish(*found: Finding) -> None:
    asyncio.run(Alerter().publish(found))


CRITICAL_ONE = Finding("nonfinite_ce", "olmo3-sft-a", 2, 77, 77, "ce is not finite (nan) at step 77", "critical",
                       DETECTED)
WARNING_ONE = Finding("gap", "olmo3-sft-a", 1, 60, 63, "steps 60–63 missing between step 59 and step 64",
                      "warning", DETECTED)


def test_a_finding_is_one_json_object_with_its_fields_at_the_top_level(stderr, caplog):
    out = stderr("json")
    publish(CRITICAL_ONE, WARNING_ONE)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2, lines
    critical, warning = (json.loads(line) for line in lines)
    for doc, f in ((critical, CRITICAL_ONE), (warning, WARNING_ONE)):
        assert doc["logger"] == "steptail.alerts"
        assert re.fullmatch(TIME, doc["time"]), doc
        assert doc["event"] == "finding" and doc["id"] == f"{f.run}/{f.kind}/{f.incarnation}/{f.first_step}"
        assert doc["run"] == f.run and doc["kind"] == f.kind
        assert doc["incarnation"] == f.incarnation and isinstance(doc["incarnation"], int)
        assert doc["first_step"] == f.first_step and doc["last_step"] == f.last_step
        assert doc["detail"] == f.detail and doc["message"] == f.detail  # readable, no JSON inside
        assert doc["detected_at"] == "2026-11-30T04:00:00Z"
        assert set(FINDING_FIELDS) <= set(doc)
    # the level is the finding's severity: what Cloud Logging reads as `severity`
    assert critical["severity"] == "CRITICAL" and warning["severity"] == "WARNING"
    records = [r for r in caplog.records if r.name == "steptail.alerts"]
    assert [r.levelname for r in records] == ["CRITICAL", "WARNING"]
    assert [(r.run, r.kind, r.severity) for r in records] == [
        ("olmo3-sft-a", "nonfinite_ce", "critical"), ("olmo3-sft-a", "gap", "warning")]
    assert all(r.getMessage() == r.detail for r in records)


def test_the_text_format_names_the_run_and_the_kind(stderr):
    out = stderr("text")
    publish(CRITICAL_ONE, WARNING_ONE)
    critical, warning = out.getvalue().splitlines()
    assert re.fullmatch(rf"{TIME} CRITICAL steptail\.alerts run=olmo3-sft-a kind=nonfinite_ce "
                        r"ce is not finite \(nan\) at step 77", critical), critical
    assert re.fullmatch(rf"{TIME} WARNING steptail\.alerts run=olmo3-sft-a kind=gap steps 60–63 missing "
                        r"between step 59 and step 64", warning), warning
    assert "{" not in critical + warning  # no JSON in a text line


def test_state_changes_and_errors_keep_their_fields(stderr):
    out = stderr("json")
    health = Health("stream", run="olmo3-sft-a")
    health.fail("auth", "exec credential plugin failed: ERROR: (gcloud.config.config-helper) lapsed")
    health.ok()
    logging.getLogger("steptail.follow").error("boom", exc_info=ValueError("bad"))
    failing, ok, error = (json.loads(line) for line in out.getvalue().splitlines())
    assert failing["severity"] == "WARNING" and failing["logger"] == "steptail.health"
    assert (failing["run"], failing["source"], failing["state"], failing["kind"]) == (
        "olmo3-sft-a", "stream", "failing", "auth")
    assert failing["reason"].endswith("lapsed") and failing["message"].startswith("olmo3-sft-a: stream failing")
    assert ok["severity"] == "INFO" and ok["state"] == "ok"
    assert error["severity"] == "ERROR" and error["message"] == "boom" and "ValueError: bad" in error["exception"]


def test_a_field_never_replaces_the_line_s_own_keys(stderr):
    out = stderr("json")
    logging.getLogger("steptail.x").warning("hello", extra={"severity": "critical", "logger": "x", "time": 0,
                                                            "run": "r"})
    doc = json.loads(out.getvalue())
    assert (doc["severity"], doc["logger"], doc["message"], doc["run"]) == ("WARNING", "steptail.x", "hello", "r")
    assert re.fullmatch(TIME, doc["time"])


def test_follow_logs_a_critical_finding_as_one_json_line(make_simcluster, tmp_path):  # noqa: F811
    sc = scenario(rate=40)
    sc["jobsets"][0]["trainer"]["nan_steps"] = [20]
    sim = make_simcluster(sc)
    db = str(tmp_path / "j.db")
    proc = subprocess.run([*CLI, "follow", "--jobset", "olmo3-sft", "--run", "r", "-n", "default", "--db", db,
                           "--kubeconfig", str(sim.kubeconfig_path), "--until-done", "--silence", "1", "--no-view",
                           "--log-format", "json", "--json"],
                          env=sim.env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stderr.splitlines()]  # every line is one JSON object
    assert all({"severity", "time", "logger", "message"} <= set(doc) for doc in lines)
    found = [doc for doc in lines if doc.get("event") == "finding"]
    nan = next(doc for doc in found if doc["kind"] == "nonfinite_ce")
    assert nan["severity"] == "CRITICAL" and nan["logger"] == "steptail.alerts"
    assert (nan["run"], nan["incarnation"], nan["first_step"], nan["last_step"]) == ("r", 1, 20, 20)
    assert nan["message"] == nan["detail"] and "not finite" in nan["detail"]
    assert ("nonfinite_ce", nan["detail"]) in findings(db, "r")  # the finding stored is the one logged
    assert all(doc["severity"] == doc["severity"].upper() for doc in found)
    assert not any(doc["message"].lstrip().startswith("{") for doc in lines)  # no JSON inside a message
