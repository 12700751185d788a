"""Entry point: ``python -m benchmarks.binpack --help``."""
from ..entry import NOT_WRITTEN, run_command
from .cli import main

run_command(main, "python -m benchmarks.binpack", NOT_WRITTEN + "; with --runs DIR the seeds replayed so far are kept there and the same command resumes")
