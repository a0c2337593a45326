"""Set up as operators do: the issue's table, row by row, through ``configure()``; unknown
``STAGELENS_*`` variables reported once (an error under ``STAGELENS_STRICT=1``); and
``stagelens config``."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from stagelens import configure, semconv, settings_env
from stagelens.cli import main
from stagelens.config import Settings
from stagelens.errors import ConfigurationError
from stagelens.settings_forms import variable
from tests.test_settings_forms import environment

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _nothing_reported_yet(monkeypatch) -> None:
    """Each test starts as a fresh process would: no unknown variable reported yet."""
    monkeypatch.setattr(settings_env, "_reported", set())


def _configure(**keywords):
    return configure(
        span_exporters=[], registry=CollectorRegistry(), set_global=False, gpu=False, **keywords
    )


class TestTheTableThroughConfigure:
    """Each row of the operators' table, through ``stagelens.configure()``."""

    @pytest.mark.parametrize(
        ("variable", "value", "field", "expected"),
        [
            ("STAGELENS_TENANTS", "acme,globex", "tenants", ("acme", "globex")),
            ("STAGELENS_MODELS", "tiny,big", "models", ("tiny", "big")),
            ("STAGELENS_EXCLUDED_PATHS", "/health,/ready", "excluded_paths", ("/health", "/ready")),
            (
                "STAGELENS_DAILY_BUDGETS_USD",
                "acme=100,globex=50",
                "daily_budgets_usd",
                {"acme": 100.0, "globex": 50.0},
            ),
        ],
    )
    def test_the_comma_forms_apply(self, variable, value, field, expected, caplog) -> None:
        """The value as an operator writes it is the setting; nothing is warned."""
        with environment(**{variable: value}), caplog.at_level(logging.WARNING):
            telemetry = _configure()
        try:
            assert getattr(telemetry.settings, field) == expected
            assert telemetry.settings.sources[field] == "environment"
        finally:
            telemetry.shutdown()
        assert "STAGELENS" not in caplog.text

    def test_the_budgets_reach_the_metrics(self) -> None:
        """``acme=100,globex=50``: ``stagelens_budget_usd{tenant, window="1d"}`` reads
        100 and 50 on the registry ``/metrics`` serves."""
        registry = CollectorRegistry()
        with environment(STAGELENS_DAILY_BUDGETS_USD="acme=100, globex=50"):
            telemetry = configure(span_exporters=[], registry=registry, set_global=False, gpu=False)
        try:
            for tenant, usd in (("acme", 100.0), ("globex", 50.0)):
                labels = {semconv.LABEL_TENANT: tenant, semconv.LABEL_WINDOW: "1d"}
                assert registry.get_sample_value(semconv.BUDGET_USD, labels) == usd
        finally:
            telemetry.shutdown()

    def test_a_typo_is_reported_once_with_the_name_meant(self, caplog) -> None:
        """``STAGELENS_TENANT=acme``: one warning naming it and ``STAGELENS_TENANTS``,
        however often ``configure()`` runs in the process."""
        with environment(STAGELENS_TENANT="acme"), caplog.at_level(logging.WARNING):
            for _ in range(2):
                _configure().shutdown()
        warned = [r.getMessage() for r in caplog.records if "STAGELENS_TENANT " in r.getMessage()]
        assert len(warned) == 1, warned
        assert "did you mean STAGELENS_TENANTS?" in warned[0]
        assert "acme" not in warned[0]  # the name, never the value (it may be a secret)

    def test_strict_refuses_a_typo(self) -> None:
        """``STAGELENS_STRICT=1``: ConfigurationError naming the variable and the fix."""
        with (
            environment(STAGELENS_TENANT="acme", STAGELENS_STRICT="1"),
            pytest.raises(ConfigurationError) as raised,
        ):
            _configure()
        assert "STAGELENS_TENANT is no stagelens variable" in str(raised.value)
        assert "STAGELENS_TENANTS" in str(raised.value)
        assert "STAGELENS_STRICT" in str(raised.value)

    def test_strict_as_a_keyword(self) -> None:
        """``configure(strict=True)`` does the same."""
        with (
            environment(STAGELENS_MODLES="tiny"),
            pytest.raises(ConfigurationError, match="MODELS"),
        ):
            _configure(strict=True)

    def test_lower_case_variables_are_read_and_checked_alike(self, caplog) -> None:
        """pydantic-settings reads ``stagelens_tenants`` as ``STAGELENS_TENANTS``; a
        lower-case typo is reported alike."""
        with (
            environment(stagelens_tenants="acme", stagelens_tenant="x"),
            caplog.at_level(logging.WARNING),
        ):
            telemetry = _configure()
        telemetry.shutdown()
        assert telemetry.settings.tenants == ("acme",)
        assert "stagelens_tenant is no stagelens variable" in caplog.text

    @pytest.mark.parametrize(
        ("variable", "value", "said"),
        [
            ("STAGELENS_MAX_TENANTS", "lots", "expected an integer"),
            ("STAGELENS_PROMPT_SIZE_BOUNDS", "1024,512", "got 512 after 1024"),
        ],
    )
    def test_a_bad_value_is_refused_naming_it(self, variable, value, said) -> None:
        """The rows that were right stay right, with the expected form added."""
        with environment(**{variable: value}), pytest.raises(ConfigurationError) as raised:
            _configure()
        assert f"{variable}={value!r}" in str(raised.value)
        assert said in str(raised.value)


class TestTheDeclaredVariables:
    """Every ``STAGELENS_*`` name the project reads or documents is declared: a setting or
    one of ``OTHER_VARIABLES``; and every declared one is read by some code."""

    CODE = ("stagelens", "instrumentation", "exporters", "dashboards", "examples", "scripts")
    DECLARATION = ROOT / "stagelens" / "settings_env.py"
    """Where the other variables are declared (and a typo shown): not evidence of a reader."""
    TYPOS = frozenset({"STAGELENS_TENANT", "STAGELENS_VLLM_TRACE"})
    """The misspellings the docs and the vLLM plugin show as examples of what is reported."""

    @staticmethod
    def _named_in(paths) -> set[str]:
        pattern = re.compile(r"\bSTAGELENS_[A-Z0-9_]*[A-Z0-9]\b")
        return {name for path in paths for name in pattern.findall(path.read_text())}

    def _code(self) -> list[Path]:
        files = [p for d in self.CODE for p in (ROOT / d).rglob("*.py")]
        files += [*(ROOT / "benchmarks").glob("*.py"), *(ROOT / "scripts").glob("*.sh")]
        files += [ROOT / "tests" / "conftest.py"]
        return [p for p in files if p != self.DECLARATION]

    def _docs(self) -> list[Path]:
        files = [*(ROOT / "docs").rglob("*.md"), *(ROOT / "examples").rglob("*.md")]
        return [*files, *(ROOT / "deploy").rglob("*.yaml"), ROOT / "README.md"]

    def test_every_name_read_or_documented_is_known(self) -> None:
        """A variable read or documented anywhere is known, so that setting it is never
        reported as a typo."""
        named = self._named_in(self._code()) | self._named_in(self._docs())
        assert named - settings_env.known_variables() - self.TYPOS == set()

    def test_every_other_variable_is_read_by_some_code(self) -> None:
        """A declared variable that no code reads any more would hide a typo of it."""
        others = {v.name for v in settings_env.OTHER_VARIABLES}
        assert others - self._named_in(self._code()) == set()

    def test_no_other_variable_shadows_a_setting(self) -> None:
        """The two lists are apart."""
        settings = {variable(name) for name in Settings.model_fields}
        assert settings.isdisjoint(v.name for v in settings_env.OTHER_VARIABLES)


class TestConfigCommand:
    """``stagelens config``: every setting, its value, its source, its meaning."""

    def test_every_setting_with_its_value_and_source(self, capsys) -> None:
        """Environment, default and a default read from OpenTelemetry's variable; the
        meaning is the field's docstring; unknown variables listed with the nearest name."""
        with environment(
            STAGELENS_TENANTS="acme, globex",
            STAGELENS_TENANT="x",
            OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="true",
        ):
            assert main(["config"]) == 0
        out = capsys.readouterr().out
        for name in Settings.model_fields:
            assert f"\n{variable(name)}=" in out
        assert "STAGELENS_TENANTS=acme,globex  [environment]" in out
        assert "STAGELENS_MAX_TENANTS=20  [default]" in out
        assert (
            "STAGELENS_CAPTURE_MESSAGE_CONTENT=true  "
            "[environment (OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT)]"
        ) in out
        assert "Cap on distinct `tenant` label values (cardinality bound)." in out
        assert "did you mean STAGELENS_TENANTS?" in out
        assert "STAGELENS_GPU_COLLECTOR (unset)" in out

    def test_a_password_in_a_url_is_never_printed(self, capsys) -> None:
        """``STAGELENS_REDIS_URL=redis://:secret@host``: shown as ``***``, in text and JSON."""
        with environment(STAGELENS_REDIS_URL="redis://:s3cret@cache:6379/0"):
            assert main(["config"]) == 0
            assert main(["config", "--json"]) == 0
        out = capsys.readouterr().out
        assert "s3cret" not in out
        assert "STAGELENS_REDIS_URL=redis://:***@cache:6379/0" in out

    def test_json(self, capsys) -> None:
        """``--json``: the same rows for a program."""
        with environment(STAGELENS_DAILY_BUDGETS_USD='{"acme": 100}'):
            assert main(["config", "--json"]) == 0
        document = json.loads(capsys.readouterr().out)
        rows = {row["name"]: row for row in document["settings"]}
        assert set(rows) == set(Settings.model_fields)
        assert rows["daily_budgets_usd"]["value"] == "acme=100.0"
        assert rows["daily_budgets_usd"]["source"] == "environment"
        assert rows["daily_budgets_usd"]["example"] == "acme=100,globex=50"
        assert document["unknown_variables"] == []

    def test_a_bad_value_is_exit_2_with_the_reason(self, capsys) -> None:
        """What ``configure()`` refuses, ``stagelens config`` refuses, without traceback."""
        with environment(STAGELENS_MAX_TENANTS="lots"):
            assert main(["config"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("stagelens: error: invalid stagelens setting: ")
        assert "STAGELENS_MAX_TENANTS='lots'" in err
        assert "Traceback" not in err

    def test_strict_refuses_unknown_variables(self, capsys) -> None:
        """Under ``STAGELENS_STRICT=1`` an unknown variable is exit 2."""
        with environment(STAGELENS_STRICT="1", STAGELENS_EXCLUDED_PATH="/x"):
            assert main(["config"]) == 2
        assert "did you mean STAGELENS_EXCLUDED_PATHS?" in capsys.readouterr().err


class TestTheReference:
    """The settings section of ``docs/instrumenting.md`` is generated from the declaration."""

    PAGE = ROOT / "docs" / "instrumenting.md"

    def test_the_committed_section_is_fresh(self) -> None:
        """``make generate`` would change nothing (``make drift`` checks the same)."""
        from stagelens.views.settings_docs import updated

        page = self.PAGE.read_text(encoding="utf-8")
        assert updated(page) == page

    def test_every_setting_and_variable_has_a_row(self) -> None:
        """Each setting with its keyword, each other variable, each with its meaning."""
        from stagelens.views.settings_docs import render

        section = render()
        for name, field in Settings.model_fields.items():
            assert f"| `{variable(name)}`<br>`{name}` |" in section
            docstring = " ".join((field.description or "").split()).replace("``", "`")
            assert f"| {docstring} |" in section
        for other in settings_env.OTHER_VARIABLES:
            assert f"| `{other.name}` | {other.read_by} | {other.meaning} |" in section

    def test_defaults_are_never_read_from_the_environment(self) -> None:
        """The reference is the same whatever the generating shell holds."""
        from stagelens.views.settings_docs import render

        with environment():
            clean = render()
        with environment(
            STAGELENS_TENANTS="acme", OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="true"
        ):
            assert render() == clean

    def test_a_page_without_the_markers_is_refused(self, tmp_path) -> None:
        """``--update`` on a page without the section: exit 1, the page untouched."""
        from stagelens.views.settings_docs import main as generate

        page = tmp_path / "page.md"
        page.write_text("# no section\n")
        assert generate(["--update", str(page)]) == 1
        assert page.read_text() == "# no section\n"
