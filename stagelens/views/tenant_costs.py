"""The report's tenant table: per (model, tenant), the price table's cost beside the engine
time the tenant's requests were attributed (``stagelens_engine_seconds_total``).

Why both: the price table says what a tenant is billed, the engine time what its requests
cost the engines (their share of each engine step, by the tokens they computed in it), and
a tenant can be cheap by one and dear by the other (long prompts that miss the prefix
cache, answers decoded alone at night). Read from one gateway's ``/metrics``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from stagelens import semconv as sc

__all__ = ["TenantCost", "render_tenant_costs", "tenant_costs"]


@dataclass(frozen=True)
class TenantCost:
    """One (model, tenant): output tokens, price-table USD, attributed engine seconds."""

    model: str
    tenant: str
    output_tokens: float
    cost_usd: float
    engine_seconds: float | None
    """None when the engine reported no figure (no stagelens middleware in vLLM)."""


def tenant_costs(text: str) -> list[TenantCost]:
    """Every (model, tenant) with tokens, cost or engine time, most engine time first."""
    output: dict[tuple[str, str], float] = defaultdict(float)
    cost: dict[tuple[str, str], float] = defaultdict(float)
    engine: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            key = (labels.get(sc.LABEL_MODEL, ""), labels.get(sc.LABEL_TENANT, ""))
            if sample.name == sc.TOKENS and labels.get(sc.LABEL_TYPE) == sc.TOKEN_TYPE_OUTPUT:
                output[key] += sample.value
            elif sample.name == sc.COST_USD:
                cost[key] += sample.value
            elif sample.name == sc.ENGINE_SECONDS:
                engine[key] = engine.get(key, 0.0) + sample.value
    keys = set(output) | set(cost) | set(engine)
    rows = [
        TenantCost(m, t, output.get((m, t), 0.0), cost.get((m, t), 0.0), engine.get((m, t)))
        for m, t in keys
    ]
    return sorted(rows, key=lambda r: (-(r.engine_seconds or 0.0), -r.cost_usd, r.model, r.tenant))


def render_tenant_costs(text: str) -> list[str]:
    """The table's lines (none when no tenant was billed)."""
    rows = tenant_costs(text)
    if not rows:
        return []
    total = sum(r.engine_seconds or 0.0 for r in rows)
    lines = [
        f"{'model':20s} {'tenant':16s} {'output':>10s} {'cost USD':>10s} "
        f"{'engine s':>10s} {'share':>7s} {'ms/1k out':>10s}",
        "-" * 89,
    ]
    for r in rows:
        if r.engine_seconds is None:
            engine = share = per = "-"
        else:
            engine = f"{r.engine_seconds:.3f}"
            share = f"{r.engine_seconds / total * 100:.1f}%" if total else "-"
            per = f"{r.engine_seconds / r.output_tokens * 1e6:.1f}" if r.output_tokens else "-"
        lines.append(
            f"{r.model[:20]:20s} {r.tenant[:16]:16s} {r.output_tokens:10.0f} "
            f"{r.cost_usd:10.4f} {engine:>10s} {share:>7s} {per:>10s}"
        )
    lines.append("engine s = the tenant's share of the engines' time (each step split by the")
    lines.append("tokens each request computed in it); '-' where vLLM sent no figure")
    return lines
