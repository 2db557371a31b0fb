"""Shared fixtures: each real server the suite needs lives in a plugin under tests/support/.

Tests marked ``slow`` (seconds each) run first, so that no pytest-xdist worker is left with one
at the end while the others have finished (see docs/testing.md).
"""

from __future__ import annotations

import pytest

pytest_plugins = [
    "tests.support.redis_fixtures",
    "tests.support.gateway_fixtures",
    "tests.support.facilitator_fixtures",
    "tests.support.solana_fixtures",
    "tests.support.paid_fixtures",
]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: takes seconds; run before the rest (tests/conftest.py)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
