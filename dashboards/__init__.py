"""stagelens.dashboards."""
