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
