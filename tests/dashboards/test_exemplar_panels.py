"""Exemplars in Grafana: the panels ask for them exactly where the gateway's exposition
carries them, and the provisioned Prometheus data source links their trace id to a tracing
data source provisioned beside it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics

from stagelens.config import Settings
from stagelens.metrics.record import ExemplarRef, PhaseTimes, RequestRecord, StageTimes
from stagelens.telemetry import recording_for

ROOT = Path(__file__).resolve().parents[2]
DATASOURCES = ROOT / "deploy" / "grafana" / "provisioning" / "datasources" / "stagelens.yaml"
_BUCKET = re.compile(r"\b(stagelens_[a-z_]+)_bucket\b")
_DRAWS_EXEMPLARS = ("timeseries", "heatmap")
_EXEMPLAR_LINE = re.compile(r"^(\w+)_bucket\{[^}]*\} \S+ # \{([^}]*)\}")


def _carried() -> tuple[set[str], set[str]]:
    """(histograms whose buckets carry an exemplar, the exemplar's label names), read from
    the OpenMetrics text of a registry fed one sampled request that touched every gateway
    histogram: stages, engine phases, TTFT and inter-token gaps (and a non-streamed one)."""
    registry = CollectorRegistry()
    fold = recording_for(registry, Settings()).fold
    streamed = RequestRecord(
        model="m",
        code="200",
        duration=1.2,
        ttft=0.3,
        gaps=[0.02, 0.03],
        stages=StageTimes([("tokenizer", 0.002), ("inference", 1.1)]),
        phases=PhaseTimes([("queue", 0.01), ("prefill", 0.05), ("decode", 0.9)]),
        rejected_by=None,
        billing=None,
        exemplar=ExemplarRef(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, 1e9),
    )
    fold.submit(streamed)
    # And a non-streamed answer, whose whole-answer histogram carries exemplars too.
    fold.submit(streamed._replace(ttft=2.0, gaps=[], streamed=False))
    histograms: set[str] = set()
    labels: set[str] = set()
    for line in openmetrics(registry).decode().splitlines():
        found = _EXEMPLAR_LINE.match(line)
        if found is not None:
            histograms.add(found.group(1))
            labels |= {pair.split("=", 1)[0] for pair in found.group(2).split(",")}
    return histograms, labels


def _latency_targets() -> list[tuple[str, str, dict[str, Any]]]:
    """(dashboard, panel title, target) of every query that reads a histogram's buckets on
    a panel that can draw exemplars (time series and heatmaps; a table shows none)."""
    found = []
    for path in sorted((ROOT / "dashboards").glob("*.json")):
        if path.name.endswith(".gnet.json"):
            continue
        board = json.loads(path.read_text(encoding="utf-8"))
        for panel in board["panels"]:
            if panel["type"] not in _DRAWS_EXEMPLARS:
                continue
            for target in panel.get("targets", []):
                if _BUCKET.search(target.get("expr", "")):
                    found.append((path.name, panel["title"], target))
    return found


class TestPanels:
    """Which latency queries ask Prometheus for exemplars."""

    def test_panels_ask_for_exemplars_exactly_where_the_exposition_carries_them(self) -> None:
        """Every chart's query on the buckets of a histogram that carries exemplars asks
        for them, and no query on a histogram that carries none does (it would draw
        nothing)."""
        carried, _ = _carried()
        assert carried, "the exposition carries no exemplar"
        asked, not_asked = set(), set()
        for board, title, target in _latency_targets():
            metrics = set(_BUCKET.findall(target["expr"]))
            if target.get("exemplar"):
                asked |= metrics
                assert metrics <= carried, (board, title, metrics - carried)
            else:
                not_asked |= metrics
        assert asked == carried
        assert not not_asked & carried, not_asked & carried


class TestProvisioning:
    """The provisioned data sources turn an exemplar into a link to its trace."""

    def test_exemplar_trace_id_links_to_a_provisioned_tracing_data_source(self) -> None:
        """The Prometheus data source names the exemplar label the exposition carries as a
        trace id, and the data source it points to is provisioned as Tempo or Jaeger."""
        _, labels = _carried()
        sources = yaml.safe_load(DATASOURCES.read_text(encoding="utf-8"))["datasources"]
        by_uid = {s["uid"]: s for s in sources}
        prometheus = next(s for s in sources if s["type"] == "prometheus")
        destinations = prometheus["jsonData"]["exemplarTraceIdDestinations"]
        assert destinations
        for destination in destinations:
            assert destination["name"] in labels
            assert "trace" in destination["name"]
            assert by_uid[destination["datasourceUid"]]["type"] in ("tempo", "jaeger")
