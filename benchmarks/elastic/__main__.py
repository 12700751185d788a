"""``python -m benchmarks.elastic`` (see :mod:`benchmarks.elastic.cli`)."""
from ..entry import NOT_WRITTEN, run_command
from .cli import main

run_command(main, "python -m benchmarks.elastic", NOT_WRITTEN)
