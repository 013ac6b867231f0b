"""Tuning: GEMM variants timed on the CPU that runs them, and the database that remembers the winners."""
