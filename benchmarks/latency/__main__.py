"""``python -m benchmarks.latency`` (see :mod:`benchmarks.latency.cli`)."""
import sys

from .cli import main

sys.exit(main())
