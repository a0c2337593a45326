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
    from stagelens.buckets import INTER_TOKEN_LATENCY_BUCKETS
    from stagelens.config import load_settings
    from stagelens.errors import ConfigurationError

    assert load_settings().itl_slo_threshold_seconds == 0.1
    assert load_settings(itl_slo_threshold_seconds=0.05).itl_slo_threshold_seconds == 0.05
    assert 0.11 not in INTER_TOKEN_LATENCY_BUCKETS
    with pytest.raises(ConfigurationError, match="itl_slo_threshold_seconds"):
        load_settings(itl_slo_threshold_seconds=0.11)
