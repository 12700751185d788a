"""Where ``../shared`` lives, for test modules that need the path itself.

A module of its own rather than ``from conftest import SHARED``: ``tests/integration/`` has a
``conftest.py`` too, and both are imported as the module ``conftest``, so which one such an import
got depended on collection order (the full suite failed to collect when the integration folder's
was loaded last).
"""
from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("STOWAGE_SHARED", ROOT.parent / "shared"))
WIRE = SHARED / "wire"
