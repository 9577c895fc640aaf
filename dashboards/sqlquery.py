"""Typed query model for Grafana's PostgreSQL datasource.

grafana-foundation-sdk ships no PostgreSQL query type, so this is the SDK's own extension
point: a `cogvariants.Dataquery` model with a builder, registered with the cog runtime so
that dashboards read back with `Dashboard.from_json` keep typed queries."""

from __future__ import annotations

import typing

from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import runtime as cogruntime
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.models.dashboard import DataSourceRef

DATASOURCE_TYPE = "grafana-postgresql-datasource"
DATASOURCE_PLUGIN_NAME = "PostgreSQL"
# The datasource `dashboards provision` and the rendered provisioning YAML create.
DATASOURCE_UID = "steptail-pg"
DATASOURCE_NAME = "steptail PostgreSQL"
# Dashboards reference the datasource through this template variable, never by uid.
DATASOURCE_VARIABLE = "datasource"
# The `__inputs` entry a UI import asks for (Grafana's export format).
DATASOURCE_INPUT = "DS_STEPTAIL"

Format = typing.Literal["table", "time_series"]


def datasource_ref() -> DataSourceRef:
    """What panels, targets, annotations and query variables reference: the variable."""
    return DataSourceRef(type_val=DATASOURCE_TYPE, uid=f"${{{DATASOURCE_VARIABLE}}}")


def provisioned_ref() -> DataSourceRef:
    """What alert rules reference: rules take no template variables, so the provisioned uid."""
    return DataSourceRef(type_val=DATASOURCE_TYPE, uid=DATASOURCE_UID)


class SqlDataquery(cogvariants.Dataquery):
    def __init__(self, raw_sql: str = "", format_val: Format = "table", ref_id: str = "",
                 datasource: DataSourceRef | None = None, hide: bool | None = None) -> None:
        self.raw_sql = raw_sql
        self.format_val = format_val
        self.ref_id = ref_id
        self.datasource = datasource
        self.hide = hide

    def to_json(self) -> dict[str, object]:
        payload: dict[str, object] = {
            "refId": self.ref_id,
            "rawSql": self.raw_sql,
            "format": self.format_val,
            "rawQuery": True,
            "editorMode": "code",
        }
        if self.datasource is not None:
            payload["datasource"] = self.datasource
        if self.hide is not None:
            payload["hide"] = self.hide
        return payload

    @classmethod
    def from_json(cls, data: dict[str, typing.Any]) -> SqlDataquery:
        ds = data.get("datasource")
        return cls(
            raw_sql=data.get("rawSql", ""),
            format_val=data.get("format", "table"),
            ref_id=data.get("refId", ""),
            datasource=DataSourceRef.from_json(ds) if isinstance(ds, dict) else None,
            hide=data.get("hide"),
        )


class SqlQuery(cogbuilder.Builder[SqlDataquery]):
    """`SqlQuery(sql).format("time_series").ref_id("A")` (datasource: the variable)"""

    def __init__(self, raw_sql: str, datasource: DataSourceRef | None = None) -> None:
        self._internal = SqlDataquery(raw_sql=raw_sql, datasource=datasource or datasource_ref())

    def build(self) -> SqlDataquery:
        return self._internal

    def format(self, format_val: Format) -> typing.Self:
        self._internal.format_val = format_val
        return self

    def ref_id(self, ref_id: str) -> typing.Self:
        self._internal.ref_id = ref_id
        return self


def register() -> None:
    """Teach the SDK's runtime to read our queries back as SqlDataquery."""
    for identifier in (DATASOURCE_TYPE, "postgres"):
        cogruntime.Runtime().register_dataquery_variant(
            cogruntime.DataqueryConfig(identifier=identifier, from_json_hook=SqlDataquery.from_json)
        )


register()
