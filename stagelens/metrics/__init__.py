"""The metrics side of stagelens: a finished request's record, the fold, and the sinks.

Like vLLM's ``v1/metrics`` keeps its stats, loggers and Prometheus apart, each part here
owns one job:

- ``record``: ``RequestRecord`` (one finished request) and ``LoneRecord`` (an observation
  made outside any instrumented request), plain data the capture side submits;
- ``fold``: the queue of records, handed in batches to every sink;
- ``prometheus``: the Prometheus sink, writing the ``stagelens_*`` series of one registry,
  with ``instruments`` (each metric created once per registry from its declaration in
  ``stagelens.semconv_spec``), ``series`` (label children bound once) and ``buckets``
  (every histogram's boundaries);
- ``genai``: the GenAI sink, the OpenTelemetry histograms of the GenAI semantic
  conventions (opt-in; its OTLP pipeline is wired by ``stagelens.exporters``).

Neither sink knows the other; both read the same batches.
"""
