"""The `farm` command line and its helpers (progress display, benchmarking)."""
