"""House panel defaults for the stagelens dashboards (in the style of red-method's common.py).

Why one module: every panel must use the ``$datasource`` variable, carry a unit, use a
modern panel type, and (stat, gauge) carry thresholds of its own: Grafana's default
thresholds (green, red at 80) turn a healthy "requests in range" red and a breached SLI
green. Building panels only through these helpers makes that true by construction; the
lint test in tests/dashboards checks the generated JSON anyway.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from grafana_foundation_sdk.builders import bargauge, heatmap, prometheus, stat, table, timeseries
from grafana_foundation_sdk.builders import common as common_builder
from grafana_foundation_sdk.builders import dashboard as dashboard_builder
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import DashboardLink as DashboardLinkModel
from grafana_foundation_sdk.models.dashboard import (
    DashboardLinkType,
    DataSourceRef,
    DataTransformerConfig,
    DynamicConfigValue,
    Threshold,
    ThresholdsMode,
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

Steps = Sequence[tuple[float | None, str]]
"""Threshold steps: (value, colour), the first value ``None`` (minus infinity)."""

NEUTRAL: Final[Steps] = ((None, "text"),)
"""One neutral colour: a count or a price is neither good nor bad."""

_REF_IDS: Final = "ABCDEFGHIJKLMNOP"


def _target(
    expr: str, legend: str, ref: str, *, instant: bool = False, exemplar: bool = False
) -> prometheus.Dataquery:
    query = (
        prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DATASOURCE)
    )
    if instant:
        query = query.instant().format(PromQueryFormat.TABLE)
    if exemplar:
        query = query.exemplar(True)
    return query


def thresholds(steps: Steps) -> dashboard_builder.ThresholdsConfig:
    """Absolute threshold steps, in the order given."""
    return (
        dashboard_builder.ThresholdsConfig()
        .mode(ThresholdsMode.ABSOLUTE)
        .steps([Threshold(value=value, color=color) for value, color in steps])
    )


def good_above(limit: float) -> Steps:
    """Red below ``limit``, green at or above it (an SLI, budget left)."""
    return ((None, "red"), (limit, "green"))


def bad_above(limit: float, warn: float | None = None) -> Steps:
    """Green below ``limit`` (yellow from ``warn``), red at or above it (a burn, a spend)."""
    steps: list[tuple[float | None, str]] = [(None, "green")]
    if warn is not None:
        steps.append((warn, "yellow"))
    steps.append((limit, "red"))
    return steps


def timeseries_panel(
    title: str,
    unit: str,
    queries: Sequence[Query],
    *,
    description: str = "",
    stacked: bool = False,
    width: int = 12,
    height: int = 8,
    threshold_lines: Steps | None = None,
    unstacked_refs: Sequence[str] = (),
    exemplars: bool = False,
    exemplar_refs: Sequence[str] = (),
    links: Sequence[tuple[str, str]] = (),
) -> timeseries.Panel:
    """A line chart with the house style; ``stacked`` for shares of a whole.

    ``threshold_lines`` draws the steps as dashed lines (an SLO objective, a budget);
    ``unstacked_refs`` names queries drawn as a dashed line over a stacked chart (the total
    the stack is compared with); ``exemplars`` asks Prometheus for exemplars on every query
    (for latency histograms that carry them), ``exemplar_refs`` on the queries named only
    (a chart mixing a histogram that carries exemplars with one that carries none);
    ``links`` are (title, url) panel links (the runbook section of the alert the panel
    shows).
    """
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
    if threshold_lines is not None:
        panel = panel.thresholds(thresholds(threshold_lines)).thresholds_style(
            common_builder.GraphThresholdsStyleConfig().mode(common.GraphThresholdsStyleMode.DASHED)
        )
    for ref in unstacked_refs:
        panel = panel.override_by_query(
            ref,
            [
                DynamicConfigValue(id_val="custom.stacking", value={"mode": "none"}),
                DynamicConfigValue(id_val="custom.fillOpacity", value=0),
                DynamicConfigValue(id_val="custom.lineWidth", value=2),
                DynamicConfigValue(
                    id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]}
                ),
            ],
        )
    for ref, (expr, legend) in zip(_REF_IDS, queries, strict=False):
        asks = exemplars or ref in exemplar_refs
        panel = panel.with_target(_target(expr, legend, ref, exemplar=asks))
    if links:
        panel = panel.links(panel_links(links))
    return panel


def panel_links(
    links: Sequence[tuple[str, str]],
) -> list[Builder[DashboardLinkModel]]:
    """Panel links that open in a new tab: an on-call reading a panel reaches its runbook."""
    built: list[Builder[DashboardLinkModel]] = [
        dashboard_builder.DashboardLink(title)
        .type(DashboardLinkType.LINK)
        .url(url)
        .target_blank(True)
        for title, url in links
    ]
    return built


def stat_panel(
    title: str,
    unit: str,
    queries: Sequence[Query],
    *,
    steps: Steps,
    description: str = "",
    width: int = 6,
    decimals: int | None = None,
    links: Sequence[tuple[str, str]] = (),
) -> stat.Panel:
    """The value of instant queries (one per series), coloured by ``steps``."""
    panel = (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(width)
        .height(6)
        .thresholds(thresholds(steps))
        .color_mode(common.BigValueColorMode.VALUE)
        .graph_mode(common.BigValueGraphMode.NONE)
        .reduce_options(common_builder.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )
    if decimals is not None:
        panel = panel.decimals(decimals)
    for ref, (expr, legend) in zip(_REF_IDS, queries, strict=False):
        panel = panel.with_target(_target(expr, legend, ref, instant=True))
    if links:
        panel = panel.links(panel_links(links))
    return panel


def bargauge_panel(
    title: str,
    unit: str,
    queries: Sequence[Query],
    *,
    steps: Steps,
    maximum: float,
    description: str = "",
    width: int = 12,
) -> bargauge.Panel:
    """Horizontal bars from 0 to ``maximum`` (spend against its cap), coloured by ``steps``."""
    panel = (
        bargauge.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(width)
        .height(8)
        .min(0)
        .max(maximum)
        .thresholds(thresholds(steps))
        .display_mode(common.BarGaugeDisplayMode.GRADIENT)
        .reduce_options(common_builder.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )
    for ref, (expr, legend) in zip(_REF_IDS, queries, strict=False):
        panel = panel.with_target(_target(expr, legend, ref, instant=True))
    return panel


HEATMAP_MIN_INTERVAL: Final = "1m"
"""A heatmap's cells: each is the increase over ``$__interval`` (the step), never shorter
than this, so a cell holds several scrapes and no two cells count one observation twice
(``increase[$__rate_interval]`` at a step shorter than the window did)."""


def heatmap_panel(
    title: str, unit: str, expr: str, *, description: str = "", exemplars: bool = False
) -> heatmap.Panel:
    """A heatmap of pre-bucketed Prometheus histogram increases, one cell per step."""
    return (
        heatmap.Panel()
        .title(title)
        .interval(HEATMAP_MIN_INTERVAL)
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
            .exemplar(exemplars)
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
