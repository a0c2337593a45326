"""Price table, cost arithmetic, tenant bounding and settings validation."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

import stagelens
from stagelens import PriceTable, Settings, Usage
from stagelens.config import load_settings
from stagelens.errors import ConfigurationError
from stagelens.pricing import DEFAULT_PRICE
from stagelens.tenants import TenantLimiter, key_fingerprint


class TestPriceTable:
    """Cost from a YAML price table."""

    def test_default_output_costs_four_times_input(self) -> None:
        """The documented default: output 4x input, cached input half of input."""
        assert DEFAULT_PRICE.output == 4 * DEFAULT_PRICE.input
        assert DEFAULT_PRICE.cached_input == DEFAULT_PRICE.input / 2

    def test_cached_input_is_billed_at_its_own_rate_once(self, tmp_path) -> None:
        """Cached tokens are part of input: billed at the cached rate, never twice."""
        path = tmp_path / "prices.yaml"
        path.write_text(
            "models:\n  tiny: {input: 2.0, output: 8.0, cached_input: 0.2}\n"
            '  "*": {input: 1.0, output: 1.0}\n'
        )
        table = PriceTable.load(path)
        usage = Usage(input_tokens=1000, output_tokens=100, cached_input_tokens=600)
        assert table.cost("tiny", usage) == pytest.approx((400 * 2.0 + 600 * 0.2 + 100 * 8.0) / 1e6)
        # unknown model: fallback row; cached_input defaults to the input rate
        assert table.cost("other", usage) == pytest.approx((1000 * 1.0 + 100 * 1.0) / 1e6)

    def test_cache_writes_are_billed_at_their_own_rate_once(self, tmp_path) -> None:
        """Tokens written to the prompt cache are part of input: billed at ``cache_write``
        (the input rate when the table does not set it), never twice, and never more of
        them than the input not read from the cache."""
        path = tmp_path / "prices.yaml"
        path.write_text(
            "models:\n  claude: {input: 3.0, output: 15.0, cached_input: 0.3, cache_write: 3.75}\n"
            '  "*": {input: 1.0, output: 1.0}\n'
        )
        table = PriceTable.load(path)
        usage = Usage(
            input_tokens=1000,
            output_tokens=10,
            cached_input_tokens=600,
            cache_write_input_tokens=300,
        )
        expected = (100 * 3.0 + 300 * 3.75 + 600 * 0.3 + 10 * 15.0) / 1e6
        assert table.cost("claude", usage) == pytest.approx(expected)
        assert table.cost("other", usage) == pytest.approx((1000 * 1.0 + 10 * 1.0) / 1e6)
        hostile = Usage(input_tokens=10, cached_input_tokens=4, cache_write_input_tokens=50)
        assert table.cost("claude", hostile) == pytest.approx((4 * 0.3 + 6 * 3.75) / 1e6)

    def test_cached_more_than_input_never_goes_negative(self) -> None:
        """A server reporting cached > input does not produce a negative cost."""
        usage = Usage(input_tokens=10, output_tokens=0, cached_input_tokens=50)
        assert usage.uncached_input_tokens == 0
        assert PriceTable.default().cost("m", usage) >= 0

    @pytest.mark.parametrize(
        "text",
        [
            "not: [valid",
            "models: 3",
            "models:\n  m: {input: 1}",
            "models:\n  m: {input: -1, output: 1}",
            "models:\n  m: {input: 1, output: 1, bogus: 2}",
            "models:\n  m: {input: 1, output: 1, cache_write: -1}",
        ],
    )
    def test_bad_tables_fail_with_a_clear_error(self, tmp_path, text) -> None:
        """Invalid YAML or entries raise ConfigurationError naming the problem."""
        path = tmp_path / "p.yaml"
        path.write_text(text)
        with pytest.raises(ConfigurationError):
            PriceTable.load(path)

    def test_missing_file_is_a_configuration_error(self, tmp_path) -> None:
        """A price table path that does not exist fails at construction."""
        with pytest.raises(ConfigurationError, match="cannot read"):
            PriceTable.load(tmp_path / "nope.yaml")


class TestTenants:
    """The tenant label is bounded."""

    def test_configured_tenants_keep_their_name_others_are_other(self) -> None:
        """Only configured tenants get their own label value."""
        limiter = TenantLimiter(["acme", "globex"], max_tenants=5)
        assert [limiter.label(t) for t in ("acme", "globex", "initech", None)] == [
            "acme",
            "globex",
            "other",
            "other",
        ]

    def test_first_n_seen_without_configuration(self) -> None:
        """With none configured, the first N distinct tenants are admitted, then `other`."""
        limiter = TenantLimiter(max_tenants=3)
        labels = [limiter.label(f"t{i}") for i in range(100)]
        assert labels[:3] == ["t0", "t1", "t2"]
        assert set(labels[3:]) == {"other"}
        assert limiter.label("t1") == "t1"

    def test_budgeted_tenants_always_keep_their_name(self) -> None:
        """A tenant with a daily budget is never folded into `other`: not when an allow-list
        leaves it out, not when the first-come places are taken."""
        listed = TenantLimiter(["acme"], max_tenants=5, budgeted=["globex"])
        assert [listed.label(t) for t in ("acme", "globex", "initech")] == [
            "acme",
            "globex",
            "other",
        ]
        first_come = TenantLimiter(max_tenants=2, budgeted=["globex"])
        labels = [first_come.label(t) for t in ("t0", "t1", "t2", "globex")]
        assert labels == ["t0", "other", "other", "globex"]

    def test_telemetry_admits_the_tenants_it_has_budgets_for(self) -> None:
        """configure(): STAGELENS_DAILY_BUDGETS_USD's tenants are labelled by name beside
        STAGELENS_TENANTS (the cost alerts compare each with its own budget)."""
        telemetry = stagelens.configure(
            registry=CollectorRegistry(),
            set_global=False,
            tenants=("acme",),
            daily_budgets_usd={"globex": 5.0},
        )
        try:
            assert telemetry.tenants.label("globex") == "globex"
            assert telemetry.tenants.label("initech") == "other"
        finally:
            telemetry.shutdown()

    def test_key_fingerprint_hides_the_key(self) -> None:
        """A key fingerprint is short, stable and does not contain the key."""
        fp = key_fingerprint("sk-secret-123")
        assert fp == key_fingerprint("sk-secret-123")
        assert "secret" not in fp
        assert len(fp) == 12


class TestModels:
    """The model label is bounded to served models."""

    def test_configured_models_keep_their_name_others_are_other(self) -> None:
        from stagelens.model_labels import ModelLabels

        labels = ModelLabels(["tiny", "big"], max_models=5, default="unknown")
        got = [labels.label(m, served=True) for m in ("tiny", "big", "new", "unknown")]
        assert got == ["tiny", "big", "other", "unknown"]

    def test_first_n_served_without_configuration(self) -> None:
        """Only a successful answer admits a name; the default never takes a slot."""
        from stagelens.model_labels import ModelLabels

        labels = ModelLabels(max_models=2, default="unknown")
        assert labels.label("typo", served=False) == "other"
        assert labels.label("unknown", served=False) == "unknown"
        assert [labels.label(f"m{i}", served=True) for i in range(5)] == [
            "m0",
            "m1",
            "other",
            "other",
            "other",
        ]
        assert labels.label("typo", served=True) == "other"  # no room left
        assert labels.label("m1", served=False) == "m1"  # admitted: errors keep the name


class TestSettings:
    """Settings validate at construction."""

    def test_defaults(self) -> None:
        """Default TTFT threshold and stage budgets per the contract."""
        s = Settings()
        assert s.ttft_slo_threshold_seconds == 0.5
        assert s.stage_budgets_seconds["billing"] == 0.001
        assert s.capture_message_content is False

    def test_env_is_read(self, monkeypatch) -> None:
        """STAGELENS_* variables configure the settings (JSON for maps)."""
        monkeypatch.setenv("STAGELENS_TTFT_SLO_THRESHOLD_SECONDS", "0.3")
        monkeypatch.setenv("STAGELENS_DAILY_BUDGETS_USD", '{"acme": 12.5}')
        s = load_settings()
        assert s.ttft_slo_threshold_seconds == 0.3
        assert s.daily_budgets_usd == {"acme": 12.5}

    @pytest.mark.parametrize(
        "overrides",
        [
            {"ttft_slo_threshold_seconds": 0},
            {"daily_budgets_usd": {"a": -1.0}},
            {"tenants": ("a", "b", "c"), "max_tenants": 2},
            {"models": ("a", "b", "c"), "max_models": 2},
            {"no_such_setting": 1},
        ],
    )
    def test_invalid_settings_raise_configuration_error(self, overrides) -> None:
        """Bad values fail loudly at start-up, as ConfigurationError."""
        with pytest.raises(ConfigurationError):
            load_settings(**overrides)


def test_derive_records_where_the_original_records() -> None:
    """A derived Telemetry shares the tracer provider, registries and instruments, with its
    own settings and prices; a bad override fails loudly."""
    from stagelens.pricing import Price
    from stagelens.testing import capture_telemetry

    with capture_telemetry() as cap:
        prices = PriceTable({"tiny": Price(input=2.0, output=8.0, cached_input=1.0)})
        derived = cap.telemetry.derive(prices=prices, models=("tiny",), max_tenants=3)
        assert derived.registry is cap.telemetry.registry
        assert derived.instruments is cap.telemetry.instruments
        assert derived.tracer_provider is cap.telemetry.tracer_provider
        assert derived.prices is prices
        assert derived.settings.models == ("tiny",)
        assert derived.settings.max_tenants == 3
        assert derived.models.label("other-model", served=True) == "other"
        assert cap.telemetry.settings.models == ()  # the original is unchanged
        assert cap.telemetry.derive().prices is cap.telemetry.prices
        with pytest.raises(ConfigurationError):
            cap.telemetry.derive(models=("a", "b"), max_models=1)
