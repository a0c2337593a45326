"""stagelens.instrumentation."""
