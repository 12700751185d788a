"""Extender latency at scale: ``python -m benchmarks.latency`` (see :mod:`benchmarks.latency.cli`)."""
