"""Backends: each renders the loop IR for its kind of device, compiles it, and loads what it built."""
