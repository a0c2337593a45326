"""Which shortcuts on the request path run as their plain twins (for measuring them).

Every shortcut on the request path has a plain twin beside it: the obvious code a newcomer
would write, which a property test proves equal to the shortcut on any input. A shortcut
stays only while it saves at least 1 % of a bare proxy's instructions per request, and
that is measured by running both in one benchmark
(``benchmarks/overhead_instructions.py --plain NAME``): ``STAGELENS_PLAIN`` names the
shortcuts a process runs plain (comma-separated, or ``all``). It is read once, when this
module is first imported, and each shortcut picks its implementation then (at import or
at construction), never per call. Unset, every shortcut runs. Not a setting for
production: the plain twins are correct, only slower.
"""

from __future__ import annotations

import os
from typing import Final

ENV: Final = "STAGELENS_PLAIN"
"""The environment variable naming the shortcuts run plain."""

SHORTCUTS: Final = {
    "reader_prefix": "a stream's content chunk matched by the bytes of an earlier one "
    "(instrumentation/_events.py, EventReader.read)",
    "reader_bytes": "a chunk that is one whole content event found without parsing it "
    "(instrumentation/_events.py, EventReader._read; it also teaches reader_prefix)",
    "output_bytes": "an output event found from its bytes (instrumentation/_sse.py "
    "output_fast, used by EventReader._read_events)",
    "series_storage": "histogram and counter children written through their value "
    "storage (stagelens/_compat.py histogram_storage, counter_storage)",
    "otlp_caches": "the encoded bytes of span names, attribute keys, lengths and recurring "
    "attribute pairs cached (stagelens/spans/otlp_encode.py)",
    "context_headers": "the current context and span read from the API's context variable "
    "(stagelens/_compat.py current_context_getter, span_key, suppression_keys), and the "
    "upstream call's headers read and written through httpx's entry list with traceparent "
    "formatted, not through the public APIs (instrumentation/_headers.py); one shortcut, "
    "measured as one",
    "bucket_runs": "a batch's values counted per touched bucket after one sort, not bisected "
    "one by one (stagelens/metrics/series.py FastHistogram.observe_many)",
    "agent_prefix": "an agent API's (Responses, Messages) output chunk matched by the bytes of "
    "an earlier one up to its value (instrumentation/_api_call.py, ApiCall.read)",
    "agent_names": "an agent API's chunk of one two-line event read from its lines' bytes, "
    "left unparsed when its name says nothing the reader uses, and a chunk of several "
    "split at its blank lines (instrumentation/_api_call.py, ApiCall._read_named)",
}
"""Every shortcut that has a switch, by name: what it does and where."""


def _chosen(raw: str) -> frozenset[str]:
    names = {name.strip() for name in raw.split(",") if name.strip()}
    if "all" in names:
        return frozenset(SHORTCUTS)
    unknown = names - SHORTCUTS.keys()
    if unknown:  # a typo would measure nothing, silently
        raise ValueError(
            f"{ENV}: unknown shortcut(s) {sorted(unknown)}; known: {sorted(SHORTCUTS)}"
        )
    return frozenset(names)


PLAIN: Final = _chosen(os.environ.get(ENV, ""))
"""The shortcuts this process runs as their plain twins."""


def plain(name: str) -> bool:
    """True when the shortcut ``name`` (a key of ``SHORTCUTS``) runs as its plain twin."""
    assert name in SHORTCUTS, name
    return name in PLAIN
