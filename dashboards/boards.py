"""The three dashboards (Run, REQUIRED_RBF, Fleet), built with grafana-foundation-sdk."""

from __future__ import annotations

import itertools

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import heatmap, table, timeseries, xychart
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import xychart as xym

from steptail.dashboards import queries as q
from steptail.dashboards.sqlquery import (
    DATASOURCE_INPUT,
    DATASOURCE_NAME,
    DATASOURCE_PLUGIN_NAME,
    DATASOURCE_TYPE,
    DATASOURCE_VARIABLE,
    SqlDataquery,
    SqlQuery,
    datasource_ref,
)

TAGS = ["steptail"]
RUN_UID, RBF_UID, FLEET_UID = "steptail-run", "steptail-rbf", "steptail-fleet"
GRAFANA_VERSION = "11.6.0"  # the SDK line: schemaVersion 41, xychart v2


# -- variables and annotations ----------------------------------------------------------
def datasource_variable() -> db.DatasourceVariable:
    """Every query reads `${datasource}`. Its default works both ways a dashboard arrives:
    a UI import writes the chosen datasource's uid over `${DS_STEPTAIL}` (see __inputs);
    file or API provisioning substitutes nothing, so the value matches no datasource and
    Grafana selects the option whose name is `text`: the provisioned datasource."""
    return (
        db.DatasourceVariable(DATASOURCE_VARIABLE).label("Data source").type(DATASOURCE_TYPE)
        .current(dm.VariableOption(selected=True, text=DATASOURCE_NAME,
                                   value=f"${{{DATASOURCE_INPUT}}}"))
        .multi(False).include_all(False)
    )


def namespace_variable() -> db.QueryVariable:
    return (
        db.QueryVariable("namespace").label("Namespace").datasource(datasource_ref())
        .query(q.VAR_NAMESPACE).multi(True).include_all(True)
        .current(dm.VariableOption(selected=True, text="All", value="$__all"))
        .refresh(dm.VariableRefresh.ON_DASHBOARD_LOAD).sort(dm.VariableSort.ALPHABETICAL_ASC)
    )


def run_variable() -> db.QueryVariable:
    return (
        db.QueryVariable("run").label("Run").datasource(datasource_ref())
        .query(q.VAR_RUN).multi(True).include_all(False)
        .refresh(dm.VariableRefresh.ON_DASHBOARD_LOAD)
    )


def points_variable() -> db.CustomVariable:
    """Points per series in the by-step panels (queries.POINTS_VARIABLE): their width in
    buckets; "every step" (0) is the raw series, one click away."""
    default = str(q.POINTS_DEFAULT)
    return (
        db.CustomVariable(q.POINTS_VARIABLE).label("Points per series")
        .values(f"{default},4000,every step : 0").allow_custom_value(False)  # goes into SQL
        .current(dm.VariableOption(selected=True, text=default, value=default))
    )


class SqlAnnotationQuery(dm.AnnotationQuery):
    """An annotation whose target is a SQL query (the SDK types only Grafana's built-in one)."""

    target: SqlDataquery | None  # type: ignore[assignment]


class SqlAnnotation(cogbuilder.Builder[dm.AnnotationQuery]):
    def __init__(self, name: str, sql: str, color: str) -> None:
        target = SqlQuery(sql).format("table").ref_id("Anno").build()
        self._internal = SqlAnnotationQuery(
            name=name, datasource=datasource_ref(), enable=True, hide=False, icon_color=color,
        )
        self._internal.target = target

    def build(self) -> dm.AnnotationQuery:
        return self._internal


def findings_annotation() -> SqlAnnotation:
    return SqlAnnotation("Findings", q.FINDINGS_ANNOTATIONS, "red")


# -- panels -------------------------------------------------------------------------
def _legend() -> cb.VizLegendOptions:
    return (cb.VizLegendOptions().show_legend(True).display_mode(cm.LegendDisplayMode.LIST)
            .placement(cm.LegendPlacement.BOTTOM))


def _tooltip() -> cb.VizTooltipOptions:
    return cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING)


def _step_xy(title: str, sql: str, y: str, unit: str, ids) -> xychart.Panel:
    """y against step, one line per run incarnation (the query's `series` column)."""
    return (
        xychart.Panel().id(next(ids)).title(title).datasource(datasource_ref())
        .with_target(SqlQuery(sql).format("table").ref_id("A"))
        # One frame per series value: xychart draws each frame as its own line.
        .with_transformation(dm.DataTransformerConfig(
            id_val="partitionByValues", options={"fields": ["series"], "keepFields": False}))
        # xychart v2 (Grafana 11): auto mapping, x by name, every other number field is y.
        .mapping(xym.SeriesMapping.AUTO)
        .series([xychart.XYSeriesConfig().x(xychart.XychartXYSeriesConfigX().matcher(
            xychart.MatcherConfig().id("byName").options("step")))])
        .show(xym.XYShowMode.LINES).legend(_legend()).tooltip(_tooltip())
        .unit(unit).axis_label(y)
        .height(10).span(24)
    )


def _over_time(title: str, sql: str, unit: str, ids, span: int = 12) -> timeseries.Panel:
    return (
        timeseries.Panel().id(next(ids)).title(title).datasource(datasource_ref())
        .with_target(SqlQuery(sql).format("time_series").ref_id("A"))
        .unit(unit).span_nulls(False).line_width(1).legend(_legend()).tooltip(_tooltip())
        .height(8).span(span)
    )


def _dashboard(uid: str, title: str, description: str) -> db.Dashboard:
    return (
        db.Dashboard(title).uid(uid).description(description).tags(TAGS)
        .editable().time("now-24h", "now").refresh("1m").timezone("utc")
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .with_variable(datasource_variable())  # first: the other variables query through it
    )


def run_dashboard() -> dm.Dashboard:
    ids = itertools.count(1)
    return (
        _dashboard(RUN_UID, "steptail / Run",
                   "Per-step CE of process 0, one series per run incarnation; findings as annotations.")
        .with_variable(namespace_variable()).with_variable(run_variable())
        .with_variable(points_variable())
        .annotation(findings_annotation())
        .with_panel(_step_xy("CE by step", q.CE_BY_STEP, "ce", "none", ids)
                    .description("LOSS-PARTS ce against step; a restore starts a new series. Each point"
                                 " is a bucket's lowest or highest CE (Points per series; 'every"
                                 " step' for the raw series); a NaN or missing steps break the line."))
        .with_panel(_over_time("CE over time", q.CE_OVER_TIME, "none", ids, span=24))
        .with_panel(_over_time("Step time (per-pod metrics)", q.STEP_SECONDS, "s", ids))
        .with_panel(_over_time("Tokens/s/device (per-pod metrics)", q.TOKENS_PER_S, "none", ids))
        .build()
    )


def rbf_dashboard() -> dm.Dashboard:
    ids = itertools.count(1)
    rbf_max = _step_xy("REQUIRED_RBF max by step", q.RBF_MAX_BY_STEP, "max", "none", ids)
    layers = (
        heatmap.Panel().id(next(ids)).title("REQUIRED_RBF per layer: $run")
        .datasource(datasource_ref())
        .with_target(SqlQuery(q.RBF_PER_LAYER).format("time_series").ref_id("A"))
        .calculate(False).repeat("run").repeat_direction("v")
        .scale_distribution(cb.ScaleDistributionConfig().type(cm.ScaleDistribution.LINEAR))
        .height(10).span(24)
    )
    return (
        _dashboard(RBF_UID, "steptail / REQUIRED_RBF",
                   "MoE ragged-buffer-factor probe: max per step and per layer.")
        .with_variable(namespace_variable()).with_variable(run_variable())
        .with_variable(points_variable())
        .annotation(findings_annotation())
        .with_panel(rbf_max)
        .with_panel(layers)
        .build()
    )


def fleet_dashboard() -> dm.Dashboard:
    ids = itertools.count(1)
    fleet = (
        table.Panel().id(next(ids)).title("Runs").datasource(datasource_ref()).show_header(True)
        .align(cm.FieldTextAlignment.AUTO).inspect(False)  # what Grafana fills in anyway
        .with_target(SqlQuery(q.FLEET).format("table").ref_id("A"))
        .override_by_name("seconds_since_last_step", [dm.DynamicConfigValue(id_val="unit", value="s")])
        .height(16).span(24)
    )
    seconds = [dm.DynamicConfigValue(id_val="unit", value="s")]
    goodput = (
        table.Panel().id(next(ids)).title("Goodput").datasource(datasource_ref()).show_header(True)
        .description("Per run that logged a step in the range: productive step time / wall time, and where"
                     " the rest went (replayed steps, recovery after restarts, checkpoint saves, other),"
                     " kept at each commit (docs/goodput.md); the latest incarnation's median step time.")
        .align(cm.FieldTextAlignment.AUTO).inspect(False)
        .with_target(SqlQuery(q.GOODPUT).format("table").ref_id("A"))
        .override_by_name("goodput", [dm.DynamicConfigValue(id_val="unit", value="percentunit"),
                                      dm.DynamicConfigValue(id_val="min", value=0),
                                      dm.DynamicConfigValue(id_val="max", value=1),
                                      dm.DynamicConfigValue(id_val="custom.cellOptions",
                                                            value={"type": "gauge", "mode": "basic"})])
        .override_by_regexp("_s$", seconds)
        .height(10).span(24)
    )
    return (
        _dashboard(FLEET_UID, "steptail / Fleet",
                   "The runs seen in the time range: state (live, stalled, ended, failed, ingested, unknown), "
                   "last step, seconds since it, reconnects, stream gaps, open findings; their goodput.")
        .with_variable(namespace_variable())
        .with_panel(fleet)
        .with_panel(goodput)
        .build()
    )


def all_dashboards() -> dict[str, dm.Dashboard]:
    return {RUN_UID: run_dashboard(), RBF_UID: rbf_dashboard(), FLEET_UID: fleet_dashboard()}


def export_format(board: dict) -> dict:
    """The plain dashboard JSON with Grafana's export header (`__inputs`, `__requires`), so
    that the UI's import asks for the PostgreSQL datasource to use."""
    panels = sorted({p["type"] for p in board.get("panels", [])})
    return {
        "__inputs": [{
            "name": DATASOURCE_INPUT, "label": DATASOURCE_NAME, "type": "datasource",
            "description": "the PostgreSQL store steptail writes",
            "pluginId": DATASOURCE_TYPE, "pluginName": DATASOURCE_PLUGIN_NAME,
        }],
        "__requires": [
            {"type": "grafana", "id": "grafana", "name": "Grafana", "version": GRAFANA_VERSION},
            {"type": "datasource", "id": DATASOURCE_TYPE, "name": DATASOURCE_PLUGIN_NAME,
             "version": "1.0.0"},
            *({"type": "panel", "id": t, "name": t, "version": ""} for t in panels),
        ],
        **board,
    }
