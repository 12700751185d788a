"""``python -m benchmarks.elastic`` (see :mod:`benchmarks.elastic.cli`)."""
import sys

from .cli import main

sys.exit(main())
