"""Every form a span takes in stagelens, from the request path to the OTLP wire.

The map, with the transitions, is in docs/architecture.md ("A span's life").
"""
