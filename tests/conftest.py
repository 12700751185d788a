"""Shared test fixtures: where ../shared lives, and the captured kube-scheduler bodies."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(__import__("os").environ.get("STOWAGE_SHARED", ROOT.parent / "shared"))
WIRE = SHARED / "wire"


def wire_body(mode: str, name: str) -> dict:
    """One captured request body, e.g. wire_body("node-cache", "01-filter")."""
    return json.loads((WIRE / mode / f"{name}.json").read_text())


@pytest.fixture
def wire():
    if not WIRE.exists():
        pytest.fail(f"captured wire bodies missing at {WIRE}: tests need ../shared/wire")
    return wire_body
