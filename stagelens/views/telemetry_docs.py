"""Generate ``docs/telemetry.md``, the reference of every name stagelens emits.

    python -m stagelens.views.telemetry_docs --out docs/telemetry.md     (or: make generate)

Why generated: the names live in ``stagelens/semconv.py`` (value and meaning, in each
constant's docstring) and their shape in ``stagelens/semconv_spec.py`` (kind, unit, labels,
attributes, emitter). Writing the reference by hand would let it drift from both;
``make drift`` fails when the committed file differs from a fresh run.

Completeness is by convention (see ``semconv_spec``): every constant lands in some section,
and ``missing_specs()`` names a metric, instrument or attribute constant without its spec
(the generator refuses to write then; ``tests/test_telemetry_docs.py`` fails).
"""

from __future__ import annotations

import argparse
import ast
import inspect
import itertools
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Final

from stagelens import semconv, semconv_foreign, semconv_otel
from stagelens import semconv_spec as spec
from stagelens.stages import Stage

PROMETHEUS_PREFIX: Final = "stagelens_"
"""A constant whose value starts with this names a Prometheus metric."""

_KIND_PREFIX: Final = re.compile(
    r"^(?:OTel )?(?:histogram|counter|gauge|up-down counter)\b[^:.]*:\s*", re.IGNORECASE
)
"""The ``Histogram {stage, model}: `` / ``OTel gauge, unit ``1``: `` head of a docstring,
which the reference shows in columns of its own."""


def constants() -> dict[str, str]:
    """Every public string constant of ``semconv``, by name, in definition order."""
    return {
        name: value
        for name, value in vars(semconv).items()
        if name.isupper() and not name.startswith("_") and isinstance(value, str)
    }


SOURCES: Final = (semconv, semconv_foreign, semconv_otel)
"""``semconv`` and the modules whose names it re-exports: where the constants are written."""


def constant_docs() -> dict[str, str]:
    """Each constant's docstring (the string right after its assignment), as one line."""
    body = [node for module in SOURCES for node in ast.parse(inspect.getsource(module)).body]
    docs: dict[str, str] = {}
    for node, after in itertools.pairwise(body):
        target: ast.expr | None = None
        if isinstance(node, ast.AnnAssign):
            target = node.target
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if not isinstance(target, ast.Name) or not isinstance(after, ast.Expr):
            continue
        text = after.value.value if isinstance(after.value, ast.Constant) else None
        if isinstance(text, str):
            docs[target.id] = " ".join(inspect.cleandoc(text).split())
    return docs


def metric_constants() -> dict[str, str]:
    """Constants naming a Prometheus metric (value starts with ``stagelens_``; the prefix
    itself and the ``OTEL_TRACES_SAMPLER`` value ``stagelens_tail`` name none)."""
    return {
        k: v
        for k, v in constants().items()
        if v.startswith(PROMETHEUS_PREFIX)
        and v not in (semconv.METRIC_PREFIX, semconv.TRACES_SAMPLER_TAIL)
    }


def otel_metric_constants() -> dict[str, str]:
    """Constants naming an OpenTelemetry instrument (``HW_*`` / ``OTEL_*``, dotted value)."""
    return {k: v for k, v in constants().items() if k.startswith(("HW_", "OTEL_")) and "." in v}


def attribute_constants() -> dict[str, str]:
    """Constants naming an attribute key: any other dotted value."""
    instruments = otel_metric_constants()
    return {
        k: v
        for k, v in constants().items()
        if "." in v and k not in instruments and not v.startswith(PROMETHEUS_PREFIX)
    }


def label_constants() -> dict[str, str]:
    """Constants naming a Prometheus label (``LABEL_*``)."""
    return {k: v for k, v in constants().items() if k.startswith("LABEL_")}


def value_constants() -> dict[str, tuple[str, str]]:
    """Constants naming a fixed label or attribute value: name -> (key, value)."""
    keys = set(attribute_constants()) | set(label_constants()) | set(metric_constants())
    found: dict[str, tuple[str, str]] = {}
    for name, value in constants().items():
        for prefix, key in spec.VALUE_PREFIXES.items():
            if name.startswith(prefix) and name not in keys:
                found[name] = (key, value)
                break
    return found


def missing_specs() -> list[str]:
    """Metric, instrument and attribute constants without a spec, and specs naming none."""
    problems: list[str] = []
    pairs = (
        ("metric", metric_constants(), {m.name for m in spec.METRICS}),
        ("OTel instrument", otel_metric_constants(), {m.name for m in spec.OTEL_METRICS}),
        ("attribute", attribute_constants(), {a.key for a in spec.ATTRIBUTES}),
    )
    for what, named, specified in pairs:
        for name, value in named.items():
            if value not in specified:
                problems.append(f"{what} {name} = {value!r} has no spec in semconv_spec")
        for value in sorted(specified - set(named.values())):
            problems.append(f"{what} spec {value!r} names no semconv constant")
    labels = set(label_constants().values())
    for m in spec.METRICS:
        problems += [f"{m.name}: label {x!r} is no LABEL_*" for x in m.labels if x not in labels]
    keys = set(attribute_constants().values()) | labels
    for s in spec.SPANS:
        problems += [f"span {s.name}: {x!r} is no attribute" for x in s.attributes if x not in keys]
    for o in spec.OTEL_METRICS:
        problems += [f"{o.name}: {x!r} is no attribute" for x in o.attributes if x not in keys]
    return problems


def meaning(doc: str) -> str:
    """A docstring without its ``Kind {labels}:`` head, capitalised, in Markdown."""
    text = _KIND_PREFIX.sub("", doc, count=1)
    return _md(text[:1].upper() + text[1:])


def _md(text: str) -> str:
    """reStructuredText literals to Markdown; pipes escaped for table cells."""
    return text.replace("``", "`").replace("|", "\\|")


def _code(items: Iterable[str]) -> str:
    return ", ".join(f"`{x}`" for x in items) or "-"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return [*lines, ""]


_HEADER: Final = """\
# Telemetry reference

*Generated from [`stagelens/semconv.py`](../stagelens/semconv.py) (names and meanings) and
[`stagelens/semconv_spec.py`](../stagelens/semconv_spec.py) (kinds, units, labels,
attributes). Do not edit by hand: regenerate with `make generate` (that is,
`python -m stagelens.views.telemetry_docs --out docs/telemetry.md`); `make drift` fails when this
file differs from a fresh run.*

Every name below is a `Final` constant of `stagelens/semconv.py`, its one definition (the
OpenTelemetry and foreign names are written in `semconv_otel.py` and `semconv_foreign.py`,
which it re-exports).
Dashboards, alert rules and users' queries depend on these names: a change to one is listed
in the [CHANGELOG](../CHANGELOG.md).
"""


def _metrics(docs: dict[str, str]) -> list[str]:
    const = {v: k for k, v in metric_constants().items()}
    rows = [
        (
            f"`{m.name}`",
            m.kind,
            m.unit,
            _code(m.labels),
            ", ".join(m.emitted_by),
            meaning(docs.get(const[m.name], "")),
        )
        for m in spec.METRICS
    ]
    return [
        "## Prometheus metrics",
        "",
        "Base units, `_total` on counters; a histogram is exposed as `_bucket`, `_sum` and",
        "`_count` series. Label meanings and values: [Labels](#labels).",
        "",
        *_table(("metric", "type", "unit", "labels", "emitted by", "meaning"), rows),
    ]


def _fixed_values() -> dict[str, list[tuple[str, str]]]:
    """Key -> [(value, constant name or ``""``)] for labels and attributes with fixed values."""
    values: dict[str, list[tuple[str, str]]] = {semconv.LABEL_STAGE: [(s.value, "") for s in Stage]}
    for name, (key, value) in value_constants().items():
        values.setdefault(key, []).append((value, name))
    return values


def _labels(docs: dict[str, str]) -> list[str]:
    values = _fixed_values()
    first_use = [label for m in spec.METRICS for label in m.labels]
    labels = label_constants()
    rows = []
    for name, label in sorted(labels.items(), key=lambda kv: _position(first_use, kv[1])):
        used = [m.name for m in spec.METRICS if label in m.labels]
        fixed = [v for v, _ in values.get(label, [])]
        rows.append((f"`{label}`", meaning(docs.get(name, "")), _code(fixed), _code(used)))
    return [
        "## Labels",
        "",
        *_table(("label", "meaning", "fixed values", "on metrics"), rows),
    ]


def _position(items: list[str], item: str) -> int:
    """Index of ``item``'s first occurrence, or past the end (unused items sort last)."""
    return items.index(item) if item in items else len(items)


def _values(docs: dict[str, str]) -> list[str]:
    rows = []
    for key, pairs in _fixed_values().items():
        for index, (value, name) in enumerate(pairs, start=1):
            text = meaning(docs.get(name, "")) if name else f"canonical stage {index} of 7"
            rows.append((f"`{key}`", f"`{value}`", text))
    return [
        "## Fixed label and attribute values",
        "",
        "Values a label or attribute takes from a fixed set (others are free: model and",
        "tenant names within their bounds, status codes, GPU identities).",
        "",
        *_table(("label or attribute", "value", "meaning"), rows),
    ]


def _otel(docs: dict[str, str]) -> list[str]:
    const = {v: k for k, v in otel_metric_constants().items()}
    prom = {v: k for k, v in metric_constants().items()}
    rows = []
    for m in spec.OTEL_METRICS:
        doc = docs.get(const[m.name], "")
        text = meaning(doc)
        if m.prometheus is not None and not _KIND_PREFIX.match(doc):
            text = meaning(docs.get(prom[m.prometheus], ""))
        same = f"`{m.prometheus}`" if m.prometheus else "-"
        row = (f"`{m.name}`", m.kind, f"`{m.unit}`", _code(m.attributes), m.emitted_by, same)
        rows.append((*row, text))
    header = ("instrument", "kind", "unit", "attributes", "emitted by", "Prometheus", "meaning")
    return [
        "## OpenTelemetry metrics",
        "",
        "The GPU readings as `hw.*` instruments (`configure(meter_provider=...)`), the vLLM",
        "plugin's metrics over OTLP (`STAGELENS_VLLM_OTLP_METRICS=1`) and the gateway's GenAI",
        "histograms (`STAGELENS_GENAI_METRICS=1`, semantic conventions v1.41.0, with their",
        "bucket advice; `gen_ai.system` becomes `gen_ai.provider.name` with",
        "`OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental`). Units are UCUM; the",
        "Prometheus column names the series with the same reading, where there is one.",
        "",
        *_table(header, rows),
    ]


def _span_doc(s: spec.SpanSpec, docs: dict[str, str]) -> str:
    if s.doc:
        return _md(s.doc)
    names = [k for k, v in constants().items() if k.startswith("SPAN_") and v == s.name]
    return meaning(docs.get(names[0], "")) if names else ""


def _spans(docs: dict[str, str]) -> list[str]:
    rows = [
        (
            f"`{s.name}`",
            s.kind,
            s.parent,
            ", ".join(s.emitted_by),
            _span_doc(s, docs),
            _code(s.attributes),
        )
        for s in spec.SPANS
    ]
    return [
        "## Spans",
        "",
        "One trace per request. `{key}` in a name stands for that attribute's value.",
        "",
        *_table(("span name", "kind", "parent", "emitted by", "meaning", "attributes"), rows),
    ]


def _attributes(docs: dict[str, str]) -> list[str]:
    const = {v: k for k, v in attribute_constants().items()}
    rows = []
    for a in spec.ATTRIBUTES:
        on = [f"`{s.name}`" for s in spec.SPANS if a.key in s.attributes]
        emitters = {m.emitted_by for m in spec.OTEL_METRICS if a.key in m.attributes}
        on += [f"OTel {e} metrics" for e in sorted(emitters)]
        text = meaning(docs.get(const[a.key], ""))
        rows.append((f"`{a.key}`", a.type, f"`{a.unit}`" if a.unit else "-", text, ", ".join(on)))
    return [
        "## Attributes",
        "",
        *_table(("attribute", "type", "unit", "meaning", "on"), rows),
    ]


def _named(title: str, intro: str, names: dict[str, str], docs: dict[str, str]) -> list[str]:
    rows = [(f"`{v}`", f"`{k}`", meaning(docs.get(k, ""))) for k, v in names.items()]
    return [f"## {title}", "", intro, "", *_table(("name", "constant", "meaning"), rows)]


def render() -> str:
    """The whole reference, as Markdown (deterministic: definition order of ``semconv``)."""
    docs = constant_docs()
    every = constants()
    foreign = {k: v for k, v in every.items() if k.startswith(("VLLM_", "DCGM_"))}
    alerts = {k: v for k, v in every.items() if k.startswith("ALERT_")}
    spans = {k for k in every if k.startswith("SPAN_")}
    covered = (
        set(metric_constants())
        | set(otel_metric_constants())
        | set(attribute_constants())
        | set(label_constants())
        | set(value_constants())
        | set(foreign)
        | set(alerts)
        | spans
    )
    other = {k: v for k, v in every.items() if k not in covered}
    lines = [
        _HEADER,
        *_metrics(docs),
        *_labels(docs),
        *_values(docs),
        *_otel(docs),
        *_spans(docs),
        *_attributes(docs),
        *_named(
            "Alerts",
            "Alert names of the generated rules; each has a section in "
            "[`alerts/runbook.md`](../alerts/runbook.md).",
            alerts,
            docs,
        ),
        *_named(
            "Metrics of other exporters the dashboards read",
            "Fallbacks the dashboards query when stagelens' own series are absent.",
            foreign,
            docs,
        ),
        *_named("Other names", "Scope, header, environment and unit names.", other, docs),
    ]
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Write the reference to ``--out`` (stdout without it); 1 when a spec is missing."""
    parser = argparse.ArgumentParser(prog="python -m stagelens.views.telemetry_docs")
    parser.add_argument("--out", type=Path, default=None, help="file to write")
    args = parser.parse_args(argv)
    problems = missing_specs()
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    text = render()
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
