"""stagelens.exporters."""
