"""Shared fixtures: each real server the suite needs lives in a plugin under tests/support/.

How the suite is shared out over pytest-xdist workers (see docs/testing.md):

* One worker more than ``-n auto`` would start on its own: much of the suite waits on timers,
  sockets and subprocesses, and the extra worker runs tests in those waits.
* Tests marked ``slow`` (seconds each) run first, so no worker is left with one at the end
  while the others have finished.
"""

from __future__ import annotations

import os

import pytest
from xdist import plugin as xdist_plugin

pytest_plugins = [
    "tests.support.redis_fixtures",
    "tests.support.gateway_fixtures",
    "tests.support.facilitator_fixtures",
    "tests.support.solana_fixtures",
    "tests.support.paid_fixtures",
]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: takes seconds; run before the rest (tests/conftest.py)")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # set by hand: xdist's own hook takes it as it is
    return int(xdist_plugin.pytest_xdist_auto_num_workers(config)) + 1


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
