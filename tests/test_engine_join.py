"""The request id that carries the tenant to the engine, and the value that carries the
engine time back (``stagelens.engine_join``): both sides read what the other wrote, and any
other text is refused without an exception."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from stagelens import engine_join as ej


@given(
    trace=st.integers(1, 2**128 - 1),
    span=st.integers(1, 2**64 - 1),
    tenant=st.none() | st.text(min_size=1, max_size=40),
    prefix=st.sampled_from(["", "chatcmpl-", "cmpl-", "resp_"]),
    suffix=st.sampled_from(["", "-1a2b3c4d", "-0-7f"]),
)
def test_the_plugin_reads_back_the_key_and_tenant_inside_vllms_id(
    trace, span, tenant, prefix, suffix
):
    """vLLM wraps the header in its own prefix and suffix: the key and the tenant (any text,
    percent-encoded on the way) come back unchanged, and the key names the trace."""
    minted = ej.minted_id(trace, span, tenant)
    key = f"{trace:032x}-{span:016x}"
    carried = tenant if tenant and len(ej.encode_tenant(tenant)) <= ej.TENANT_MAX else None
    assert ej.read_id(prefix + minted + suffix) == (key, carried)
    assert ej.trace_of(key) == (trace, span)


def test_an_id_for_an_unrecorded_trace_names_no_trace():
    """``0...0-<random>`` is a key for the answer, never a trace to join spans to."""
    key, tenant = ej.read_id(ej.minted_id(0, 0xABC, "acme-corp")) or ("", None)
    assert tenant == "acme-corp"
    assert ej.trace_of(key) is None


def test_the_tenant_is_encoded_so_that_vllms_suffix_does_not_join_it():
    """A ``-`` in the tenant is encoded: vLLM's ``-<hex>`` suffix never reads as tenant."""
    minted = ej.minted_id(1, 2, "team-a")
    assert "~team%2Da" in minted
    assert ej.read_id(f"chatcmpl-{minted}-deadbeef") == (f"{1:032x}-{2:016x}", "team-a")


@given(text=st.text(max_size=200) | st.none())
def test_any_text_reads_as_an_id_or_none(text):
    """Untrusted ids (any client may send any X-Request-Id) never raise."""
    found = ej.read_id(text)
    assert found is None or (len(found[0]) == 49 and found[0][32] == "-")


@given(seconds=st.floats(0, 1e7), gpus=st.integers(0, 9999))
def test_the_value_reads_back(seconds, gpus):
    """The header value and the SSE comment give back what was written (to the nanosecond)."""
    assert ej.read_engine_value(ej.engine_value(seconds, gpus)) == (
        float(f"{seconds:.9f}"),
        gpus,
    )
    comment = ej.engine_comment(seconds, gpus)
    assert comment.endswith(b"\n\n")
    assert ej.read_engine_comment(comment) == (float(f"{seconds:.9f}"), gpus)


@given(raw=st.binary(max_size=120) | st.text(max_size=120))
def test_any_value_reads_as_a_value_or_none(raw):
    """A header or comment from anywhere never raises, and a value read is finite, >= 0."""
    for found in (
        ej.read_engine_value(raw),
        ej.read_engine_comment(raw if isinstance(raw, bytes) else raw.encode()),
    ):
        assert found is None or (found[0] >= 0 and found[1] >= 0)


def test_other_comments_and_values_are_refused():
    """A keep-alive comment, a negative or missing figure, are not the value."""
    assert ej.read_engine_comment(b": keep-alive\n\n") is None
    assert ej.read_engine_value("seconds=-1; gpus=1") is None
    assert ej.read_engine_value("seconds=nan; gpus=1") is None
    assert ej.read_engine_value("gpus=1") is None
