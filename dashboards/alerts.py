"""Grafana unified-alerting rules: missing steps, stall, failed step-1 gate, divergence.

Each rule is query A (SQL, table format: one row per run, `run` becomes a label) and a
threshold B on A. The rules live in one folder and one rule group."""

from __future__ import annotations

from dataclasses import dataclass

from grafana_foundation_sdk.builders import alerting, expr
from grafana_foundation_sdk.models import alerting as am
from grafana_foundation_sdk.models.dashboard import DataSourceRef

from steptail.dashboards import queries as q
from steptail.dashboards.boards import FLEET_UID, RUN_UID
from steptail.dashboards.sqlquery import DATASOURCE_UID, SqlQuery, provisioned_ref

FOLDER_UID = "steptail"
FOLDER_TITLE = "steptail"
RULE_GROUP = "steptail"
GROUP_INTERVAL_S = 60
_EXPR = DataSourceRef(type_val="__expr__", uid="__expr__")


@dataclass(frozen=True)
class RuleSpec:
    uid: str
    title: str
    sql: str
    above: float  # fires when A > above
    for_: str
    severity: str
    summary: str
    dashboard: str = RUN_UID


SPECS = (
    RuleSpec("steptail-missing-steps", "steptail: missing steps", q.ALERT_MISSING_STEPS, 0,
             "0s", "critical",
             "{{ $labels.run }}: {{ $values.A }} steps missing from process 0's log (gap or head gap)"),
    RuleSpec("steptail-stall", "steptail: stalled run", q.ALERT_STALL, q.STALL_FACTOR, "5m",
             "warning",
             "{{ $labels.run }}: no new step for {{ $values.A }} median step times",
             FLEET_UID),
    RuleSpec("steptail-step1-gate", "steptail: failed step-1 CE gate", q.ALERT_STEP1_GATE, 0,
             "0s", "critical",
             "{{ $labels.run }}: step-1 CE differs from the HF reference (context parallelism)"),
    RuleSpec("steptail-divergence", "steptail: CE divergence", q.ALERT_DIVERGENCE, 0, "0s",
             "critical",
             "{{ $labels.run }}: CE diverged (arm vs control, replay mismatch or non-finite CE)"),
)


def build_rule(spec: RuleSpec) -> am.Rule:
    window = am.RelativeTimeRange(from_val=q.ALERT_WINDOW_S, to=0)
    query = (
        alerting.Query("A").datasource_uid(DATASOURCE_UID).relative_time_range(window)
        .model(SqlQuery(spec.sql, provisioned_ref()).format("table").ref_id("A"))
    )
    threshold = (
        alerting.Query("B").datasource_uid("__expr__")
        .model(
            expr.TypeThreshold().ref_id("B").expression("A").datasource(_EXPR).conditions([
                expr.ExprTypeThresholdConditions().evaluator(
                    expr.ExprTypeThresholdConditionsEvaluator().type("gt").params([spec.above]))
            ])
        )
    )
    return (
        alerting.Rule(spec.title).uid(spec.uid).folder_uid(FOLDER_UID).rule_group(RULE_GROUP)
        .with_query(query).with_query(threshold).condition("B")
        .for_val(spec.for_).no_data_state("OK").exec_err_state("Error").org_id(1)
        .labels({"service": "steptail", "severity": spec.severity})
        .annotations({"summary": spec.summary, "dashboard": f"/d/{spec.dashboard}"})
        .is_paused(False)
        .build()
    )


def all_rules() -> list[am.Rule]:
    return [build_rule(s) for s in SPECS]
