"""Shared test fixtures: where ../shared lives, and the captured kube-scheduler bodies."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared_paths import ROOT, SHARED, WIRE  # noqa: F401 - ROOT/SHARED re-exported for fixtures


def wire_body(mode: str, name: str) -> dict:
    """One captured request body, e.g. wire_body("node-cache", "01-filter")."""
    return json.loads((WIRE / mode / f"{name}.json").read_text())


@pytest.fixture
def wire():
    if not WIRE.exists():
        pytest.fail(f"captured wire bodies missing at {WIRE}: tests need ../shared/wire")
    return wire_body
