"""Prometheus alert rules as code, from the metrics `follow` exports (steptail.collector.notify.metrics),
beside the Grafana ones (dashboards.alerts, which read SQL): missing steps, a stalled run, a
follower or discovery down, no collector scraped at all, an auth failure.

Rendered as a plain rules file (Prometheus `rule_files:`) and as a PrometheusRule
(prometheus-operator, kube-prometheus-stack): the same groups in both.

Every counter a rule takes `increase()` of exists at 0 from the run's start, so the first
increment (usually the only one: one gap, one auth lapse) is an increase. Expressions match
series on all their labels (`and` without `on`), so with several replicas a run's series are
compared within the one collector that follows it."""

from __future__ import annotations

from dataclasses import dataclass

import yaml

GROUP = "steptail"
GROUP_INTERVAL = "1m"
STALL_AFTER_S = 15 * 60  # no new step for this long: longer than any checkpoint save or eval pause
RULES_FILE = "steptail.rules.yaml"
PROMETHEUS_RULE_FILE = "prometheusrule.yaml"


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    for_: str
    severity: str
    summary: str
    description: str


def alerts(stall_after_s: int = STALL_AFTER_S) -> tuple[Alert, ...]:
    return (
        Alert("SteptailMissingSteps", "increase(steptail_missing_steps_total[10m]) > 0", "0m", "critical",
              "{{ $labels.run }}: steps missing from process 0's log",
              "Steps of {{ $labels.run }} are missing from the log (a gap or head gap finding); "
              "`steptail check {{ $labels.run }}` names them."),
        # Stalled: the run's newest step is old while its follower works and process 0 has
        # not completed. Old by the step's own (kubelet) time: a follower reading what was
        # logged while nobody followed sees it as old, briefly (hence `for`).
        Alert("SteptailStall",
              f"time() - steptail_last_step_timestamp_seconds > {stall_after_s}"
              " and steptail_follower_up == 1 and steptail_run_done == 0",
              "5m", "warning",
              "{{ $labels.run }}: no new step for {{ $value | humanizeDuration }}",
              f"{{{{ $labels.run }}}} has logged no step for over {stall_after_s // 60} minutes while "
              "its follower works and process 0 has not completed."),
        Alert("SteptailFollowerDown", "steptail_follower_up == 0", "5m", "warning",
              "{{ $labels.run }}: its log cannot be read or stored",
              "The follower of {{ $labels.run }} (kubectl, the Kubernetes API or the store) has been "
              "failing for 5 minutes; steptail_errors_total says why."),
        Alert("SteptailDiscoveryDown", "steptail_discovery_up == 0", "5m", "warning",
              "steptail cannot list or watch process-0 pods",
              "Pod discovery has been failing for 5 minutes: restarts and new JobSets go unseen."),
        Alert("SteptailCollectorAbsent", "absent(steptail_discovery_up)", "10m", "critical",
              "no steptail collector is scraped",
              "No `steptail follow` has been scraped for 10 minutes: no run is followed."),
        # The collector's health, not a run's finding (docs/verdicts.md): a lapse of seconds that
        # recovered lost nothing and pages nobody; refused for 2 minutes, the collector is blind.
        Alert("SteptailAuthFailure", 'steptail_collector_events_open{kind="auth_failure"} > 0',
              "2m", "critical",
              "steptail: credentials refused for {{ $value }} open collector"
              " {{ if eq $value 1.0 }}event{{ else }}events{{ end }}",
              "The cluster has refused steptail's credentials or permissions (401/403) for 2 minutes: "
              "check the account (CLOUDSDK_CORE_ACCOUNT) and deploy/rbac.yaml; "
              "steptail_errors_total says which source."),
    )


def rule(a: Alert) -> dict:
    return {"alert": a.name, "expr": a.expr, "for": a.for_, "labels": {"severity": a.severity},
            "annotations": {"summary": a.summary, "description": a.description}}


def rule_groups(stall_after_s: int = STALL_AFTER_S) -> dict:
    """The plain rules file's document (`groups:`)."""
    return {"groups": [{"name": GROUP, "interval": GROUP_INTERVAL,
                        "rules": [rule(a) for a in alerts(stall_after_s)]}]}


def prometheus_rule(stall_after_s: int = STALL_AFTER_S) -> dict:
    """The same groups as a monitoring.coreos.com/v1 PrometheusRule (kube-prometheus-stack
    selects rules by label: add its `release` label if its ruleSelector asks for one)."""
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": {"name": "steptail", "labels": {"app.kubernetes.io/name": "steptail"}},
            "spec": rule_groups(stall_after_s)}


def rule_files() -> dict[str, str]:
    """What `dashboards render` writes under DIR (dashboards.render writes them): path -> YAML."""
    return {f"prometheus/{name}": yaml.safe_dump(data, sort_keys=False, width=1000, allow_unicode=True)
            for name, data in ((RULES_FILE, rule_groups()), (PROMETHEUS_RULE_FILE, prometheus_rule()))}
