"""House panel defaults for the stagelens dashboards (in the style of red-method's common.py).

Why one module: every panel must use the ``$datasource`` variable, carry a unit and use a
modern panel type; building them only through these helpers makes that true by construction,
and the lint test in tests/dashboards checks the generated JSON anyway.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from grafana_foundation_sdk.builders import bargauge, heatmap, prometheus, stat, table, timeseries
from grafana_foundation_sdk.builders import common as common_builder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DataSourceRef,
    DataTransformerConfig,
    DynamicConfigValue,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

DATASOURCE_VAR: Final = "datasource"
"""Name of the Prometheus datasource template variable every panel uses."""
DATASOURCE: Final = DataSourceRef(type_val="prometheus", uid=f"${{{DATASOURCE_VAR}}}")
RATE: Final = "$__rate_interval"
"""Rate window: Grafana's ``$__rate_interval`` (at least four scrape intervals)."""

ROW_ORDER_LEGEND: Final = "row order"
"""Legend of a table's hidden row-order query (see ``table_panel``)."""

Query = tuple[str, str]
"""(PromQL expression, legend format)."""

_REF_IDS: Final = "ABCDEFGHIJKLMNOP"


def _target(expr: str, legend: str, ref: str, *, instant: bool = False) -> prometheus.Dataquery:
    query = (
        prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DATASOURCE)
    )
    if instant:
        query = query.instant().format(PromQueryFormat.TABLE)
    return query


def timeseries_panel(
    title: str,
    unit: str,
    queries: Sequence[Query],
    *,
    description: str = "",
    stacked: bool = False,
    width: int = 12,
    height: int = 8,
) -> timeseries.Panel:
    """A line chart with the house style; ``stacked`` for shares of a whole."""
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(width)
        .height(height)
        .line_width(1)
        .fill_opacity(30 if stacked else 10)
        .show_points(common.VisibilityMode.NEVER)
        .draw_style(common.GraphDrawStyle.LINE)
        .gradient_mode(common.GraphGradientMode.OPACITY)
        .span_nulls(False)
        .legend(
            common_builder.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        .tooltip(
            common_builder.VizTooltipOptions()
            .mode(common.TooltipDisplayMode.MULTI)
            .sort(common.SortOrder.DESCENDING)
        )
    )
    if stacked:
        panel = panel.stacking(common_builder.StackingConfig().mode(common.StackingMode.NORMAL))
    for ref, (expr, legend) in zip(_REF_IDS, queries, strict=False):
        panel = panel.with_target(_target(expr, legend, ref))
    return panel


def stat_panel(
    title: str, unit: str, queries: Sequence[Query], *, description: str = "", width: int = 6
) -> stat.Panel:
    """A single-number panel showing the last value."""
    panel = (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(width)
        .height(6)
        .reduce_options(common_builder.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )
    for ref, (expr, legend) in zip(_REF_IDS, queries, strict=False):
        panel = panel.with_target(_target(expr, legend, ref))
    return panel


def bargauge_panel(
    title: str, unit: str, queries: Sequence[Query], *, description: str = "", width: int = 12
) -> bargauge.Panel:
    """Horizontal bars, e.g. spend against budget per tenant."""
    panel = (
        bargauge.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(width)
        .height(8)
        .min(0)
        .display_mode(common.BarGaugeDisplayMode.GRADIENT)
        .reduce_options(common_builder.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )
    for ref, (expr, legend) in zip(_REF_IDS, queries, strict=False):
        panel = panel.with_target(_target(expr, legend, ref))
    return panel


def heatmap_panel(title: str, unit: str, expr: str, *, description: str = "") -> heatmap.Panel:
    """A heatmap of pre-bucketed Prometheus histogram increases."""
    return (
        heatmap.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(12)
        .height(8)
        .calculate(False)
        .y_axis(heatmap.YAxisConfig().unit(unit))
        .with_target(
            prometheus.Dataquery()
            .expr(expr)
            .legend_format("{{le}}")
            .ref_id("A")
            .format(PromQueryFormat.HEATMAP)
            .datasource(DATASOURCE)
        )
    )


def table_panel(
    title: str,
    unit: str,
    queries: Sequence[Query],
    *,
    join_field: str,
    description: str = "",
    width: int = 24,
    unit_overrides: dict[str, str] | None = None,
    row_order: str | None = None,
) -> table.Panel:
    """Instant queries merged into one row per ``join_field`` value (the budget table).

    Grafana's merge keeps rows in the order Prometheus returns them, which is no order a
    reader expects; ``row_order`` is an extra, hidden instant query giving each row its
    position (smallest first), applied with a ``sortBy`` transformation before it is hidden.
    """
    refs = list(zip(_REF_IDS, queries, strict=False))
    sort_field = f"Value #{_REF_IDS[len(refs)]}" if row_order is not None else None
    transformations = [DataTransformerConfig(id_val="merge", options={})]
    if sort_field is not None:
        transformations.append(
            DataTransformerConfig(
                id_val="sortBy", options={"fields": {}, "sort": [{"field": sort_field}]}
            )
        )
    hidden = {"Time": True, **({sort_field: True} if sort_field is not None else {})}
    transformations.append(
        DataTransformerConfig(
            id_val="organize",
            options={
                "excludeByName": hidden,
                "indexByName": {join_field: 0},
                "renameByName": {f"Value #{ref}": legend for ref, (_, legend) in refs},
            },
        )
    )
    panel = (
        table.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(width)
        .height(9)
    )
    for transformation in transformations:
        panel = panel.with_transformation(transformation)
    for field, field_unit in sorted((unit_overrides or {}).items()):
        panel = panel.override_by_name(field, [DynamicConfigValue(id_val="unit", value=field_unit)])
    for ref, (expr, legend) in refs:
        panel = panel.with_target(_target(expr, legend, ref, instant=True))
    if row_order is not None:
        panel = panel.with_target(
            _target(row_order, ROW_ORDER_LEGEND, _REF_IDS[len(refs)], instant=True)
        )
    return panel
