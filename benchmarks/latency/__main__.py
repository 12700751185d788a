"""``python -m benchmarks.latency`` (see :mod:`benchmarks.latency.cli`)."""
from ..entry import NOT_WRITTEN, run_command
from .cli import main

run_command(main, "python -m benchmarks.latency", NOT_WRITTEN)
