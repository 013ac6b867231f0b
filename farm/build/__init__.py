"""A build: its compile units, the one assembly of an artifact from them, and the local executor."""
