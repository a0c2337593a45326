"""Settings helpers: the one parser of on/off environment switches."""

from __future__ import annotations

import pytest

from stagelens.config import env_flag


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("1", True),
        ("true", True),
        (" TRUE ", True),
        ("yes", True),
        ("On", True),
        ("0", False),
        ("false", False),
        ("No", False),
        ("off", False),
        ("", None),
        ("maybe", None),
    ],
)
def test_env_flag_reads_the_same_words_everywhere(monkeypatch, raw, expected) -> None:
    """Each accepted spelling turns a switch on or off; anything else leaves the default."""
    monkeypatch.setenv("STAGELENS_TEST_FLAG", raw)
    assert env_flag("STAGELENS_TEST_FLAG") is expected
    fallback = expected if expected is not None else True
    assert env_flag("STAGELENS_TEST_FLAG", True) is fallback


def test_env_flag_unset_is_the_default(monkeypatch) -> None:
    """An unset switch is its default."""
    monkeypatch.delenv("STAGELENS_TEST_FLAG", raising=False)
    assert env_flag("STAGELENS_TEST_FLAG", False) is False
    assert env_flag("STAGELENS_TEST_FLAG") is None


def test_the_itl_threshold_must_be_an_itl_bucket_boundary() -> None:
    """The ITL SLO threshold defaults to 100 ms and is refused when no ITL bucket ends
    there (the histogram could not be read against it)."""
    from stagelens.config import load_settings
    from stagelens.errors import ConfigurationError
    from stagelens.metrics.buckets import INTER_TOKEN_LATENCY_BUCKETS

    assert load_settings().itl_slo_threshold_seconds == 0.1
    assert load_settings(itl_slo_threshold_seconds=0.05).itl_slo_threshold_seconds == 0.05
    assert 0.11 not in INTER_TOKEN_LATENCY_BUCKETS
    with pytest.raises(ConfigurationError, match="itl_slo_threshold_seconds"):
        load_settings(itl_slo_threshold_seconds=0.11)


class TestPromptSizeClasses:
    """The prompt-size classes and their TTFT thresholds (issue 26)."""

    def test_the_defaults(self) -> None:
        """<= 1k keeps the 0.5 s default; <= 8k 1 s, <= 32k 2.5 s, more 5 s; unknown last."""
        from stagelens.config import load_settings, prompt_size_classes

        assert prompt_size_classes(load_settings()) == (
            ("1024", 0.5),
            ("8192", 1.0),
            ("32768", 2.5),
            ("+Inf", 5.0),
            ("unknown", 0.5),
        )

    @pytest.mark.parametrize(
        ("tokens", "expected"),
        [
            (1, ("1024", 0.5)),
            (1024, ("1024", 0.5)),  # a bound is its own class's largest prompt
            (1025, ("8192", 1.0)),
            (32768, ("32768", 2.5)),
            (32769, ("+Inf", 5.0)),
            (10**9, ("+Inf", 5.0)),
            (None, ("unknown", 0.5)),
        ],
    )
    def test_a_request_is_classed_by_the_smallest_bound_at_or_above(self, tokens, expected) -> None:
        """The smallest bound >= the input tokens, ``+Inf`` above the last."""
        from stagelens.config import PromptSizeClasses, load_settings

        assert PromptSizeClasses(load_settings()).of(tokens) == expected

    def test_the_environment_gives_bounds_comma_separated_and_thresholds_as_json(
        self, monkeypatch
    ) -> None:
        """``STAGELENS_PROMPT_SIZE_BOUNDS=2048, 16384`` and JSON thresholds; the default
        thresholds of classes the bounds no longer make are dropped."""
        from stagelens.config import load_settings, prompt_size_classes

        monkeypatch.setenv("STAGELENS_PROMPT_SIZE_BOUNDS", "2048, 16384")
        assert prompt_size_classes(load_settings()) == (
            ("2048", 0.5),
            ("16384", 0.5),
            ("+Inf", 5.0),
            ("unknown", 0.5),
        )
        monkeypatch.setenv("STAGELENS_TTFT_SLO_THRESHOLDS_SECONDS", '{"16384": 2.5}')
        settings = load_settings()
        assert dict(prompt_size_classes(settings))["16384"] == 2.5
        assert dict(prompt_size_classes(settings))["+Inf"] == 0.5  # set: only what it names
        assert load_settings(settings, ttft_slo_threshold_seconds=1.0).prompt_size_bounds == (
            2048,
            16384,
        )

    def test_overriding_the_bounds_keeps_the_default_thresholds_valid(self) -> None:
        """Settings rebuilt with other bounds re-derive the default thresholds."""
        from stagelens.config import load_settings, prompt_size_classes

        classes = prompt_size_classes(load_settings(load_settings(), prompt_size_bounds=(4096,)))
        assert classes == (("4096", 0.5), ("+Inf", 5.0), ("unknown", 0.5))

    @pytest.mark.parametrize(
        ("overrides", "named"),
        [
            ({"prompt_size_bounds": (8192, 1024)}, "1024 after 8192"),
            ({"prompt_size_bounds": (0, 1024)}, "got 0 after 0"),
            ({"prompt_size_bounds": (1024, 1024)}, "1024 after 1024"),
            ({"prompt_size_bounds": "1k,8k"}, "'1k,8k'"),
            ({"prompt_size_bounds": tuple(range(1, 12))}, "at most 10"),
            ({"ttft_slo_thresholds_seconds": {"4096": 1.0}}, "'4096'"),
            ({"ttft_slo_thresholds_seconds": {"8192": 1.1}}, "['8192'] = 1.1"),
            ({"itl_stall_threshold_seconds": 0}, "itl_stall_threshold_seconds"),
            ({"client_left_bad_after_seconds": -1}, "client_left_bad_after_seconds"),
        ],
    )
    def test_a_bad_value_is_refused_naming_it(self, overrides, named) -> None:
        """Refused at start-up with a ConfigurationError that names the bad value."""
        from stagelens.config import load_settings
        from stagelens.errors import ConfigurationError

        with pytest.raises(ConfigurationError) as raised:
            load_settings(**overrides)
        assert named in str(raised.value)

    def test_a_threshold_may_be_the_configured_default_edge(self) -> None:
        """The TTFT buckets gain ``ttft_slo_threshold_seconds`` as an edge: a class may use
        it too, though it is not one of the standard edges."""
        from stagelens.config import load_settings
        from stagelens.metrics.buckets import TTFT_BUCKETS

        assert 0.3 not in TTFT_BUCKETS
        settings = load_settings(
            ttft_slo_threshold_seconds=0.3, ttft_slo_thresholds_seconds={"1024": 0.3}
        )
        assert settings.ttft_slo_thresholds_seconds == {"1024": 0.3}


def test_stall_and_client_left_defaults() -> None:
    """A 1 s freeze is a stall; a client gone after 10 s counts against availability."""
    from stagelens.config import load_settings

    settings = load_settings()
    assert settings.itl_stall_threshold_seconds == 1.0
    assert settings.client_left_bad_after_seconds == 10.0
