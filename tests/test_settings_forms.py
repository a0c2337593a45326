"""Settings as operators write them: lists comma-separated, maps ``key=value,key=value``
(OpenTelemetry's own forms), or JSON; and a refusal that names the variable, what it got
and the form it takes, never a pydantic traceback."""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stagelens.config import Settings, load_settings
from stagelens.env_values import parse_list, parse_map
from stagelens.errors import ConfigurationError
from stagelens.settings_forms import example, kind

LIST_FIELDS = ("tenants", "models", "excluded_paths")
MAP_FIELDS = ("daily_budgets_usd", "stage_budgets_seconds")


@contextmanager
def environment(**variables: str):
    """``os.environ`` with only these ``STAGELENS_*`` variables (every other removed)."""
    kept = {k: v for k, v in os.environ.items() if not k.upper().startswith("STAGELENS_")}
    with mock.patch.dict(os.environ, {**kept, **variables}, clear=True):
        yield


def from_env(**variables: str) -> Settings:
    with environment(**variables):
        return load_settings()


def same(*settings: Settings) -> bool:
    """The same values (where they came from aside)."""
    return all(s.model_dump() == settings[0].model_dump() for s in settings)


_SAFE_CHAR = st.characters(codec="utf-8", exclude_characters=",=\x00", exclude_categories=["Cs"])
SAFE = st.text(_SAFE_CHAR, min_size=1, max_size=12).filter(
    lambda s: s == s.strip() and s[0] not in "[{"
)
"""A safe string: no comma or '=', no white space at either end, not opening JSON."""


class TestTheForms:
    """The comma form, the ``key=value`` form and JSON give the same settings."""

    @settings(max_examples=100, deadline=None)
    @given(st.sampled_from(LIST_FIELDS), st.lists(SAFE, max_size=6))
    def test_a_list_comma_separated_or_json_is_one_list(self, field, items) -> None:
        """Any list of safe strings: ``a,b`` and ``["a","b"]`` in the variable, and the
        comma form as a keyword, are the same settings."""
        variable = f"STAGELENS_{field.upper()}"
        comma = from_env(**{variable: ",".join(items)})
        spaced = from_env(**{variable: " , ".join(items)})
        as_json = from_env(**{variable: json.dumps(items)})
        with environment():
            keyword = load_settings(**{field: ",".join(items)})
        assert getattr(comma, field) == tuple(items)
        assert same(comma, spaced, as_json, keyword)

    @settings(max_examples=100, deadline=None)
    @given(
        st.sampled_from(MAP_FIELDS),
        st.dictionaries(SAFE, st.floats(min_value=0, max_value=1e9, allow_nan=False), max_size=6),
    )
    def test_a_map_as_pairs_or_json_is_one_map(self, field, entries) -> None:
        """Any map of safe strings to budgets: ``k=v,k2=v2`` (spaced or not) and
        ``{"k": v}`` in the variable, and the pairs as a keyword, are the same settings."""
        variable = f"STAGELENS_{field.upper()}"
        text = ",".join(f"{k}={v!r}" for k, v in entries.items())
        pairs = from_env(**{variable: text})
        spaced = from_env(**{variable: " , ".join(f"{k} = {v!r}" for k, v in entries.items())})
        as_json = from_env(**{variable: json.dumps(entries)})
        with environment():
            keyword = load_settings(**{field: text})
        assert getattr(pairs, field) == entries
        assert same(pairs, spaced, as_json, keyword)

    @settings(max_examples=50, deadline=None)
    @given(st.lists(st.integers(1, 10**7), min_size=1, max_size=10, unique=True))
    def test_prompt_size_bounds_comma_separated_or_json(self, bounds) -> None:
        """Integer lists too: ``1024,8192`` and ``[1024, 8192]``."""
        bounds = sorted(bounds)
        comma = from_env(STAGELENS_PROMPT_SIZE_BOUNDS=",".join(map(str, bounds)))
        as_json = from_env(STAGELENS_PROMPT_SIZE_BOUNDS=json.dumps(bounds))
        assert comma.prompt_size_bounds == tuple(bounds) == as_json.prompt_size_bounds

    @pytest.mark.parametrize(
        ("text", "items"),
        [
            ("", []),
            ("a,,b,", ["a", "b"]),
            ("  a  ,b ", ["a", "b"]),
            ('["a", " b ", 3]', ["a", "b", 3]),
            ("[]", []),
        ],
    )
    def test_list_edges(self, text, items) -> None:
        """Empty items are skipped, items trimmed; JSON keeps its numbers."""
        assert parse_list(text) == items

    @pytest.mark.parametrize(
        ("text", "entries"),
        [
            ("", {}),
            ("a=1, b = 2 ,", {"a": "1", "b": "2"}),
            ("+Inf=5.0", {"+Inf": "5.0"}),
            ("url=http://x/?q=1", {"url": "http://x/?q=1"}),
            ('{"a": 1, " b ": " 2 "}', {"a": 1, "b": "2"}),
        ],
    )
    def test_map_edges(self, text, entries) -> None:
        """A value may hold '=' (only the first splits); keys and values are trimmed."""
        assert parse_map(text) == entries

    @pytest.mark.parametrize(
        ("text", "reason"),
        [
            ("acme", "'acme' is no key=value pair"),
            ("=1", "has no key"),
            ("a=1,a=2", "'a' is given twice"),
            ('{"a": 1, "a": 2}', "'a' is given twice"),
            ('{"a": 1', "not valid JSON"),
        ],
    )
    def test_a_bad_map_says_why(self, text, reason) -> None:
        """What is wrong, in words."""
        with pytest.raises(ValueError, match=reason):
            parse_map(text)

    def test_every_list_and_map_setting_reads_the_forms(self) -> None:
        """Each list or map field takes the forms (pydantic-settings' own JSON decoding,
        which raised its SettingsError on ``a,b``, is off for every one of them)."""
        for name, field in Settings.model_fields.items():
            if kind(field) in ("list", "map"):
                assert "NoDecode" in repr(field.metadata), name

    def test_every_example_is_a_valid_value(self) -> None:
        """Each setting's documented example, set alone in its variable, is accepted."""
        for name, field in Settings.model_fields.items():
            assert example(field), f"{name} has no example"
            from_env(**{f"STAGELENS_{name.upper()}": example(field)})


class TestRefusals:
    """A bad value raises ConfigurationError naming the variable, what it got, why, and
    the expected form with an example."""

    @pytest.mark.parametrize(
        ("variable", "value", "said"),
        [
            ("STAGELENS_MAX_TENANTS", "lots", ["an integer", "e.g. STAGELENS_MAX_TENANTS=50"]),
            ("STAGELENS_PROMPT_SIZE_BOUNDS", "1024,512", ["512 after 1024"]),
            ("STAGELENS_PROMPT_SIZE_BOUNDS", "1k,8k", ["item 1 '1k'", "item 2 '8k'"]),
            (
                "STAGELENS_DAILY_BUDGETS_USD",
                "acme=lots",
                ["acme='lots'", "valid number", "e.g. STAGELENS_DAILY_BUDGETS_USD=acme=100"],
            ),
            ("STAGELENS_DAILY_BUDGETS_USD", "acme", ["'acme' is no key=value pair"]),
            ("STAGELENS_DAILY_BUDGETS_USD", "acme=-1", ["budgets must be >= 0"]),
            ("STAGELENS_TENANTS", '["acme",', ["not valid JSON", "a JSON array"]),
            ("STAGELENS_GENAI_METRICS", "maybe", ["1/true/yes/on or 0/false/no/off"]),
            ("STAGELENS_SPAN_QUEUE_SIZE", "0", ["greater than or equal to 1", ">= 1"]),
        ],
    )
    def test_a_bad_variable(self, variable, value, said) -> None:
        """Named with its value; the reason and the expected form follow."""
        with environment(**{variable: value}), pytest.raises(ConfigurationError) as raised:
            load_settings()
        message = str(raised.value)
        assert f"{variable}={value!r}" in message
        for part in said:
            assert part in message
        assert "pydantic" not in message
        assert raised.value.__cause__ is None
        assert raised.value.__suppress_context__

    def test_a_value_refused_for_another_names_both_variables(self) -> None:
        """Three tenants under a cap of two: both variables, with their values."""
        with (
            environment(STAGELENS_TENANTS="a,b,c", STAGELENS_MAX_TENANTS="2"),
            pytest.raises(ConfigurationError) as raised,
        ):
            load_settings()
        assert "3 tenants configured but max_tenants=2" in str(raised.value)
        assert "STAGELENS_TENANTS='a,b,c'; STAGELENS_MAX_TENANTS='2'" in str(raised.value)

    def test_a_keyword_is_named_as_a_keyword(self) -> None:
        """``configure(max_tenants="lots")``: the keyword and its value."""
        with environment(), pytest.raises(ConfigurationError, match="max_tenants='lots'"):
            load_settings(max_tenants="lots")

    def test_an_unknown_keyword_names_the_nearest_setting(self) -> None:
        """``configure(tenant=...)``: no such setting, did you mean ``tenants``."""
        with environment(), pytest.raises(ConfigurationError) as raised:
            load_settings(tenant=("acme",))
        assert "tenant=('acme',): no such setting; did you mean tenants?" in str(raised.value)

    def test_every_bad_value_is_listed(self) -> None:
        """Two bad variables: one line each."""
        with (
            environment(STAGELENS_MAX_TENANTS="x", STAGELENS_TAIL_SLOW_SECONDS="-1"),
            pytest.raises(ConfigurationError) as raised,
        ):
            load_settings()
        lines = str(raised.value).splitlines()
        assert lines[0] == "invalid stagelens settings:"
        assert [line.split("=")[0] for line in lines[1:]] == [
            "- STAGELENS_MAX_TENANTS",
            "- STAGELENS_TAIL_SLOW_SECONDS",
        ]


class TestSources:
    """Where each value came from: default, environment or keyword."""

    def test_each_source(self) -> None:
        """A keyword wins over its variable and says so; a variable, a default, and a
        default read from OpenTelemetry's content-capture variable."""
        with environment(
            STAGELENS_TENANTS="acme",
            STAGELENS_MODELS="tiny",
            OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="true",
        ):
            settings = load_settings(models=("big",))
        assert settings.models == ("big",)
        sources: dict[str, Any] = dict(settings.sources)
        assert sources["tenants"] == "environment"
        assert sources["models"] == "keyword"
        assert sources["max_tenants"] == "default"
        assert sources["capture_message_content"] == "environment"
        assert settings.capture_message_content is True

    def test_overrides_keep_the_other_sources(self) -> None:
        """``Telemetry.derive``'s overrides are keywords; the rest keep where they came
        from."""
        with environment(STAGELENS_TENANTS="acme"):
            base = load_settings()
            derived = load_settings(base, max_models=3)
        assert derived.sources["tenants"] == "environment"
        assert derived.sources["max_models"] == "keyword"
        assert derived.sources["models"] == "default"
