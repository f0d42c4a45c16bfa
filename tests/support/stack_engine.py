"""Moved to bench.harness.stack_engine (benchmarks start their engines the same way); kept for the tests' imports."""

from bench.harness.stack_engine import TEST_ENV, rendered_engine

__all__ = ["TEST_ENV", "rendered_engine"]
