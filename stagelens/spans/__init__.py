"""Every form a span takes in stagelens, from the request path to the OTLP wire.

The request path only records; spans are built and encoded off it. Which form a span has
depends on its trace's sampling decision:

- **Sampled at its start** (a sampled parent, the ratio, or any sampler but the tail
  sampler keeping it): each span is a ``RecordedSpan`` (``recorded``), plain data made by
  the ``DeferredTracer`` (``tracer``). Ending it puts it on the provider's bounded queue
  (``provider``); the export worker encodes batches to OTLP/protobuf (``otlp_encode``) or
  hands SDK ``ReadableSpan`` views to any other exporter.
- **Sampled out at its start** (not the tail sampler): a ``NonRecordingSpan``; nothing is
  recorded and nothing exported.
- **Undecided** (``OTEL_TRACES_SAMPLER=stagelens_tail``): the root is a ``RecordedSpan``
  holding the trace's ``PendingTrace`` (``pending``), which holds every span that ends
  before the decision:

  - a stage that nothing asked the span of: a ``StageClock`` tuple, its start on the
    ``perf_counter`` clock;
  - a stage whose span something needs (a child span, its context): a ``DeferredSpan``,
    named to the tracer as the stage open in its context (``stages``) instead of being
    made current;
  - the upstream call: no span at all until something asks, then a ``DeferredSpan``; held
    as itself (a ``HeldSpan``) when it ends.

  The middleware decides at the request's end (``PendingTrace.settle``). Kept: the held
  spans are built into ``RecordedSpan`` objects (``build``: a ``StageClock`` first put on
  the wall clock as a ``StageRecord``, a ``HeldSpan`` made into its ``DeferredSpan``) and
  queued as above, and later ones go straight on. Dropped: they are discarded unbuilt.

``stagelens.tail_sampling`` holds the sampler and the rules that decide; docs/architecture.md
draws the forms and their transitions.
"""
