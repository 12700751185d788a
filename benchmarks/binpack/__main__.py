"""Entry point: ``python -m benchmarks.binpack --help``."""
import sys

from .cli import main

sys.exit(main())
