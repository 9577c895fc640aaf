"""The Prometheus alert rules (dashboards/prometheus.py) with the real promtool: `check rules`
on what `steptail dashboards render` writes, `test rules` with series that fire each alert and
series that must not, and every metric a rule reads is one `follow` exports."""

from __future__ import annotations

import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from steptail.collector.live.follower import RunStatus
from steptail.collector.notify.metrics import Metrics
from steptail.dashboards import prometheus

STEPTAIL = str(Path(sys.executable).parent / "steptail")


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:  # CI installs it (.ci/run): missing is a failure, never a skip
        pytest.fail("promtool not found: apt-get install prometheus (Debian's package; .ci/run installs it)")
    return path


def run_promtool(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), *args], input=stdin, capture_output=True, timeout=60)


@pytest.fixture
def rendered(tmp_path) -> Path:
    """What `steptail dashboards render --out DIR` writes, through the command itself."""
    out = tmp_path / "out"
    proc = subprocess.run([STEPTAIL, "dashboards", "render", "--out", str(out)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    printed = set(proc.stdout.split())
    for name in (prometheus.RULES_FILE, prometheus.PROMETHEUS_RULE_FILE):
        assert str(out / "prometheus" / name) in printed
    return out / "prometheus"


def test_rendered_rules_pass_promtool_check(rendered):
    rules = rendered / prometheus.RULES_FILE
    proc = run_promtool("check", "rules", str(rules))
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()
    assert b"SUCCESS: 6 rules found" in proc.stdout
    for path in (rules, rendered / prometheus.PROMETHEUS_RULE_FILE):
        assert stat.S_IMODE(path.stat().st_mode) == 0o644  # Prometheus or a ConfigMap reads as another user
    names = [r["alert"] for r in yaml.safe_load(rules.read_text())["groups"][0]["rules"]]
    assert names == ["SteptailMissingSteps", "SteptailStall", "SteptailFollowerDown", "SteptailDiscoveryDown",
                     "SteptailCollectorAbsent", "SteptailAuthFailure"]


def test_promtool_check_rules_can_fail(tmp_path):
    """The check is a real one: a broken expression is refused."""
    bad = prometheus.rule_groups()
    bad["groups"][0]["rules"][0]["expr"] = "increase(steptail_missing_steps_total[10m] > 0"
    path = tmp_path / "bad.rules.yaml"
    path.write_text(yaml.safe_dump(bad))
    assert run_promtool("check", "rules", str(path)).returncode != 0


def test_prometheus_rule_holds_the_same_groups(rendered, tmp_path):
    doc = yaml.safe_load((rendered / prometheus.PROMETHEUS_RULE_FILE).read_text())
    assert doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["kind"] == "PrometheusRule"
    assert doc["metadata"]["name"] == "steptail"
    assert doc["spec"] == yaml.safe_load((rendered / prometheus.RULES_FILE).read_text())
    spec = tmp_path / "spec.yaml"  # the operator loads spec as a rules file: promtool must take it too
    spec.write_text(yaml.safe_dump(doc["spec"]))
    proc = run_promtool("check", "rules", str(spec))
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()


def test_rules_read_only_metrics_follow_exports():
    metrics = Metrics()
    metrics.run_started("r", RunStatus("r", "j"))
    metrics.step("r", 1, 0)
    exposed = {line.split()[2] for line in metrics.render().decode().splitlines() if line.startswith("# TYPE ")}
    used = {name for a in prometheus.alerts() for name in re.findall(r"steptail_[a-z_]+", a.expr)}
    assert used and used <= exposed, used - exposed


def _description(name: str, **labels) -> str:
    text = next(a.description for a in prometheus.alerts() if a.name == name)
    for key, value in labels.items():
        text = text.replace(f"{{{{ $labels.{key} }}}}", value)
    return text


def _firing(name: str, summary: str, severity: str, **labels) -> dict:
    return {"exp_labels": {**labels, "severity": severity},
            "exp_annotations": {"summary": summary, "description": _description(name, **labels)}}


def unit_tests() -> dict:
    """promtool's unit-test file: one minute a sample, times in minutes from 0 (time() is the
    evaluation time in seconds, so a last step stamped 0 is `time()` seconds old)."""
    fleet = [  # a collector that works: discovery up all along
        {"series": "steptail_discovery_up", "values": "1x40"},
        # missing steps: counted from 0 at the run's start, the one gap at minute 3 -> fires
        {"series": 'steptail_missing_steps_total{run="gappy"}', "values": "0 0 0 4x37"},
        {"series": 'steptail_missing_steps_total{run="clean"}', "values": "0x40"},
        # what the issue was about: a counter that first appears at its first increment has
        # no increase() — the alert stays silent (hence the series at 0 from the start)
        {"series": 'steptail_missing_steps_total{run="late"}', "values": "_ _ _ 4x37"},
        # stall: steps stopped at 0 while the follower works and process 0 runs -> fires
        {"series": 'steptail_last_step_timestamp_seconds{run="stalled"}', "values": "0x40"},
        {"series": 'steptail_follower_up{run="stalled"}', "values": "1x40"},
        {"series": 'steptail_run_done{run="stalled"}', "values": "0x40"},
        # a step a minute: never stalled
        {"series": 'steptail_last_step_timestamp_seconds{run="steady"}', "values": "0+60x40"},
        {"series": 'steptail_follower_up{run="steady"}', "values": "1x40"},
        {"series": 'steptail_run_done{run="steady"}', "values": "0x40"},
        # finished: its last step ages, it is no stall
        {"series": 'steptail_last_step_timestamp_seconds{run="finished"}', "values": "0x40"},
        {"series": 'steptail_follower_up{run="finished"}', "values": "1x40"},
        {"series": 'steptail_run_done{run="finished"}', "values": "1x40"},
        # its follower fails: no stall (nobody can tell), follower down instead
        {"series": 'steptail_last_step_timestamp_seconds{run="blind"}', "values": "0x40"},
        {"series": 'steptail_follower_up{run="blind"}', "values": "0x40"},
        {"series": 'steptail_run_done{run="blind"}', "values": "0x40"},
        # auth: credentials refused from minute 2 to minute 6 (an open auth_failure collector
        # event); the errors counters alone (a lapse that cleared within seconds) page nobody
        {"series": 'steptail_collector_events_open{kind="auth_failure"}', "values": "0 0 1 1 1 1 1 0x33"},
        {"series": 'steptail_collector_events_open{kind="stream_failure"}', "values": "1x40"},
        {"series": 'steptail_errors_total{run="steady",source="follower",reason="auth"}', "values": "0 0 1x38"},
        {"series": 'steptail_errors_total{run="",source="discovery",reason="forbidden"}', "values": "0 0 0 1x37"},
    ]
    missing = _firing("SteptailMissingSteps", "gappy: steps missing from process 0's log", "critical", run="gappy")
    auth = _firing("SteptailAuthFailure", "steptail: credentials refused for 1 open collector event", "critical",
                   kind="auth_failure")
    return {
        "rule_files": [prometheus.RULES_FILE],
        "evaluation_interval": "1m",
        "tests": [
            {"interval": "1m", "input_series": fleet, "alert_rule_test": [
                {"eval_time": "5m", "alertname": "SteptailMissingSteps", "exp_alerts": [missing]},
                {"eval_time": "30m", "alertname": "SteptailMissingSteps", "exp_alerts": []},  # 10 min window passed
                # stalled: over 900 s from 16m, for 5m -> pending at 18m, firing from 21m
                {"eval_time": "18m", "alertname": "SteptailStall", "exp_alerts": []},
                {"eval_time": "25m", "alertname": "SteptailStall", "exp_alerts": [
                    _firing("SteptailStall", "stalled: no new step for 25m 0s", "warning", run="stalled")]},
                {"eval_time": "4m", "alertname": "SteptailFollowerDown", "exp_alerts": []},
                {"eval_time": "6m", "alertname": "SteptailFollowerDown", "exp_alerts": [
                    _firing("SteptailFollowerDown", "blind: its log cannot be read or stored", "warning",
                            run="blind")]},
                {"eval_time": "3m", "alertname": "SteptailAuthFailure", "exp_alerts": []},  # pending
                {"eval_time": "5m", "alertname": "SteptailAuthFailure", "exp_alerts": [auth]},
                {"eval_time": "1m", "alertname": "SteptailAuthFailure", "exp_alerts": []},
                {"eval_time": "20m", "alertname": "SteptailAuthFailure", "exp_alerts": []},
                {"eval_time": "20m", "alertname": "SteptailDiscoveryDown", "exp_alerts": []},
                {"eval_time": "20m", "alertname": "SteptailCollectorAbsent", "exp_alerts": []},
            ]},
            # a lapse of seconds, cleared by the next scrape: health that recovered, no page
            {"interval": "1m", "input_series": [
                {"series": 'steptail_collector_events_open{kind="auth_failure"}', "values": "0 1 0x18"}],
             "alert_rule_test": [
                {"eval_time": "2m", "alertname": "SteptailAuthFailure", "exp_alerts": []},
                {"eval_time": "4m", "alertname": "SteptailAuthFailure", "exp_alerts": []},
            ]},
            {"interval": "1m", "input_series": [{"series": "steptail_discovery_up", "values": "0x20"}],
             "alert_rule_test": [
                {"eval_time": "4m", "alertname": "SteptailDiscoveryDown", "exp_alerts": []},
                {"eval_time": "6m", "alertname": "SteptailDiscoveryDown", "exp_alerts": [
                    _firing("SteptailDiscoveryDown", "steptail cannot list or watch process-0 pods", "warning")]},
            ]},
            {"interval": "1m", "input_series": [{"series": "up", "values": "1x20"}],  # no collector at all
             "alert_rule_test": [
                {"eval_time": "9m", "alertname": "SteptailCollectorAbsent", "exp_alerts": []},
                {"eval_time": "11m", "alertname": "SteptailCollectorAbsent", "exp_alerts": [
                    _firing("SteptailCollectorAbsent", "no steptail collector is scraped", "critical")]},
            ]},
        ],
    }


def test_rules_fire_on_what_they_should_and_only_that(rendered):
    tests = rendered / "steptail.rules.test.yaml"
    tests.write_text(yaml.safe_dump(unit_tests(), sort_keys=False))
    proc = run_promtool("test", "rules", str(tests))
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()
    assert b"SUCCESS" in proc.stdout


def test_promtool_test_rules_can_fail(rendered):
    """The unit test is a real one: an alert expected where the rules raise none fails it."""
    doc = unit_tests()
    case = doc["tests"][0]["alert_rule_test"][1]  # missing steps at 30m: none
    case["exp_alerts"] = [_firing("SteptailMissingSteps", "gappy: steps missing from process 0's log", "critical",
                                  run="gappy")]
    tests = rendered / "failing.test.yaml"
    tests.write_text(yaml.safe_dump(doc, sort_keys=False))
    assert run_promtool("test", "rules", str(tests)).returncode != 0
