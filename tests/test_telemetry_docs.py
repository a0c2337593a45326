"""docs/telemetry.md is generated from semconv and its spec table, complete and current.

What emitted telemetry really looks like is checked against the same spec elsewhere:
tests/instrumentation/test_documented_telemetry.py (a gateway's spans and metrics) and
tests/exporters/test_documented_gpu.py (the GPU collector and its OTel instruments).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from stagelens import semconv
from stagelens import semconv_spec as spec
from stagelens.views import telemetry_docs as td

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "telemetry.md"
SOURCES = ("stagelens", "instrumentation", "exporters", "dashboards", "examples")

_HEAD = re.compile(r"^(Histogram|Counter|Gauge)(?: \{([^}]*)\})?:")


class TestGeneratedFile:
    """The committed reference and the generator."""

    def test_regenerating_is_byte_identical(self, tmp_path: Path) -> None:
        """Two runs of the generator write the committed file, byte for byte."""
        first, second = tmp_path / "a.md", tmp_path / "b.md"
        assert td.main(["--out", str(first)]) == 0
        assert td.main(["--out", str(second)]) == 0
        assert first.read_bytes() == second.read_bytes() == DOC.read_bytes()

    def test_header_says_how_to_regenerate(self) -> None:
        """The file's head names the command that rewrites it."""
        head = DOC.read_text().split("##", 1)[0]
        assert "python -m stagelens.views.telemetry_docs --out docs/telemetry.md" in head
        assert "make generate" in head

    def test_every_name_constant_appears(self) -> None:
        """Every metric name (and every other semconv constant) is in the reference."""
        text = DOC.read_text()
        metrics = td.metric_constants()
        assert len(metrics) >= 30
        for name, value in {**metrics, **td.constants()}.items():
            assert f"`{value}`" in text, name

    def test_readme_links_the_reference(self) -> None:
        """The README points at docs/telemetry.md for the names."""
        assert "(docs/telemetry.md)" in (ROOT / "README.md").read_text()


class TestSpecTable:
    """Every metric, instrument and attribute constant has a spec, and the specs agree."""

    def test_no_constant_lacks_a_spec(self) -> None:
        """missing_specs() finds nothing in today's semconv."""
        assert td.missing_specs() == []

    def test_a_new_metric_without_spec_is_caught(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A metric constant added without a MetricSpec fails the check and the generator."""
        monkeypatch.setattr(semconv, "WIDGETS", "stagelens_widgets_total", raising=False)
        assert td.missing_specs() == [
            "metric WIDGETS = 'stagelens_widgets_total' has no spec in semconv_spec"
        ]
        assert td.main([]) == 1
        assert "WIDGETS" in capsys.readouterr().err

    def test_a_new_attribute_without_spec_is_caught(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """An attribute constant (dotted value) added without an AttributeSpec is named."""
        monkeypatch.setattr(semconv, "ATTR_WIDGET", "stagelens.widget", raising=False)
        assert any("ATTR_WIDGET" in p for p in td.missing_specs())

    def test_new_label_values_are_picked_up(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A COMPONENT_* constant appears among the component values without other edits."""
        monkeypatch.setattr(semconv, "COMPONENT_WIDGET", "widget", raising=False)
        assert td.value_constants()["COMPONENT_WIDGET"] == (semconv.LABEL_COMPONENT, "widget")
        assert "| `component` | `widget` |" in td.render()

    def test_docstring_heads_agree_with_the_specs(self) -> None:
        """Where a metric's docstring starts ``Kind {labels}:``, kind and labels match."""
        docs = td.constant_docs()
        by_name = {m.name: m for m in spec.METRICS}
        checked = 0
        for const, value in td.metric_constants().items():
            head = _HEAD.match(docs.get(const, ""))
            if head is None:
                continue
            m = by_name[value]
            labels = tuple(x.strip() for x in (head.group(2) or "").split(",") if x.strip())
            assert (head.group(1).lower(), labels) == (m.kind, m.labels), const
            checked += 1
        assert checked >= 30

    def test_units_agree_with_names(self) -> None:
        """A base-unit suffix in a metric name is the spec's unit, and the other way round."""
        base = ("seconds", "bytes", "watts", "joules", "celsius", "hertz", "ratio")
        for m in spec.METRICS:
            stem = m.name.removesuffix("_total")
            suffix = next((u for u in base if stem.endswith(f"_{u}")), None)
            assert suffix == (m.unit if m.unit in base else None), m.name
            assert m.name.endswith("_total") == (m.kind == "counter"), m.name

    def test_otel_equivalents_translate_to_the_prometheus_names(self) -> None:
        """The plugin's OTel names give their Prometheus twin by the OTel->Prometheus rules."""
        suffix = {"s": "_seconds", "1": ""}
        for o in spec.OTEL_METRICS:
            if o.emitted_by != spec.VLLM_PLUGIN:
                continue
            name = o.name.replace(".", "_") + suffix.get(o.unit, "")
            name += "_total" if o.kind == "counter" else ""
            assert name == o.prometheus


def _literal_components() -> set[str]:
    """String literals passed as the component of ``report_error`` or ``telemetry_errors``."""
    found: set[str] = set()
    for folder in SOURCES:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not isinstance(node, ast.Call) or not node.args:
                    continue
                func, first = node.func, node.args[0]
                if not isinstance(func, ast.Attribute) or not isinstance(first, ast.Constant):
                    continue
                owner = func.value
                errors = isinstance(owner, ast.Attribute) and owner.attr == "telemetry_errors"
                if func.attr == "report_error" or (func.attr == "get" and errors):
                    found.add(str(first.value))
    return found


def test_component_values_used_in_code_are_documented() -> None:
    """Every component value spelled as a literal in the code is a documented COMPONENT_*."""
    documented = {v for k, (key, v) in td.value_constants().items() if key == "component"}
    literals = _literal_components()
    assert literals, "the scan found no report_error call: it no longer reads the code"
    assert literals <= documented, sorted(literals - documented)
