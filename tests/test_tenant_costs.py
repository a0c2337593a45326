"""The report's tenant table: engine seconds beside the price table's cost, read from the
gateway's own series (records folded by the gateway's sink, rendered by
prometheus-client)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from stagelens.config import Settings
from stagelens.metrics.record import BillingRecord, RequestRecord, StageTimes
from stagelens.telemetry import recording_for
from stagelens.views.report import render_table
from stagelens.views.tenant_costs import render_tenant_costs, tenant_costs


def _billed(tenant: str, output: int, cost: float, engine: float | None) -> RequestRecord:
    return RequestRecord(
        model="tiny",
        code="200",
        duration=0.5,
        ttft=None,
        gaps=[],
        stages=StageTimes([("inference", 0.4)]),
        phases=None,
        rejected_by=None,
        billing=BillingRecord(tenant, 100, output, 0, cost, 0, engine_seconds=engine),
    )


def _page(*records: RequestRecord) -> str:
    registry = CollectorRegistry()
    fold = recording_for(registry, Settings()).fold
    for record in records:
        fold.submit(record)
    return generate_latest(registry).decode()


def test_each_tenants_engine_time_stands_beside_its_cost() -> None:
    """Two requests of acme (0.3 s and 0.1 s of engine time) and one of globex (0.1 s):
    acme first, 80 % of the engine time; a tenant whose engine said nothing shows '-'."""
    page = _page(
        _billed("acme", 100, 0.002, 0.3),
        _billed("acme", 100, 0.002, 0.1),
        _billed("globex", 50, 0.001, 0.1),
        _billed("initech", 10, 0.0005, None),
    )
    rows = {(r.model, r.tenant): r for r in tenant_costs(page)}
    assert rows[("tiny", "acme")].engine_seconds == 0.4
    assert rows[("tiny", "acme")].cost_usd == 0.004
    assert rows[("tiny", "initech")].engine_seconds is None
    lines = render_tenant_costs(page)
    assert lines[2].split() == ["tiny", "acme", "200", "0.0040", "0.400", "80.0%", "2000.0"]
    assert lines[3].split()[:5] == ["tiny", "globex", "50", "0.0010", "0.100"]
    assert lines[4].split() == ["tiny", "initech", "10", "0.0005", "-", "-", "-"]
    assert "\n".join(lines) in render_table(page)


def test_without_billing_there_is_no_table() -> None:
    """A gateway that billed nothing shows no tenant table."""
    assert render_tenant_costs(_page()) == []
