"""Shared fixtures: each real server the suite needs lives in a plugin under tests/support/.

How the suite is shared out over pytest-xdist workers (see docs/testing.md):

* One worker more than ``-n auto`` would start on its own: much of the suite waits on timers,
  sockets and subprocesses, and the extra worker runs tests in those waits.
* Tests marked ``slow`` (seconds each) run first, so no worker is left with one at the end
  while the others have finished. Each worker starts on a block of the list of its own
  (``--dist worksteal``; an idle worker then takes the end of a busy one's block), so the slow
  modules are dealt out over the blocks' starts: all at the start of the first block, one
  worker ran them one after another and the others took the last of them late in the run.
* The controller rewrites the test modules' asserts once for all workers, while they start
  (``tests/support/assert_rewrite.py``).
* What collection built (every module, item and parameter) is frozen out of the garbage
  collector's reach: it lives for the whole run. And the collector runs less often than by
  default: each collection of the oldest generation walks every object the tests keep alive.
"""

from __future__ import annotations

import gc
import itertools
import os
import threading
from pathlib import Path

import pytest
from xdist import plugin as xdist_plugin

from tests.support.assert_rewrite import rewrite_for_workers
from tests.support.cli_fork import stop_server

pytest_plugins = [
    "tests.support.redis_fixtures",
    "tests.support.gateway_fixtures",
    "tests.support.facilitator_fixtures",
    "tests.support.solana_fixtures",
    "tests.support.paid_fixtures",
    "tests.support.postgres_server",
    "tests.support.adversarial_credit",
    "tests.support.ledger_served",
]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: takes seconds; run before the rest (tests/conftest.py)")


_rewriting: list[threading.Thread] = []


def pytest_sessionstart(session: pytest.Session) -> None:
    """In the xdist controller: the workers' asserts rewritten in a thread while they start (the
    controller itself only waits for them meanwhile)."""
    if session.config.pluginmanager.has_plugin("dsession"):
        args = (session.config, Path(__file__).parent, pytest_plugins)
        _rewriting.append(threading.Thread(target=rewrite_for_workers, args=args, daemon=True))
        _rewriting[-1].start()


def pytest_sessionfinish() -> None:
    for thread in _rewriting:
        thread.join()
    stop_server()  # the CLI's fork server (tests/support/cli_fork.py), if this process started it


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """Two workers more than cores (``--maxprocesses`` caps it): most of the suite waits on
    timers, sockets and processes, and the extra workers run tests in those waits."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # set by hand: xdist's own hook takes it as it is
    return int(xdist_plugin.pytest_xdist_auto_num_workers(config)) + 2


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    rest = iter([item for item in items if item.get_closest_marker("slow") is None])
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    starts: list[list[pytest.Item]] = [[] for _ in range(workers)]
    by_module = itertools.groupby(slow, key=lambda item: item.nodeid.split("::")[0])
    for n, (_, module) in enumerate(by_module):  # a module's tests stay together (its fixtures)
        starts[n % workers].extend(module)
    ordered: list[pytest.Item] = []
    for n, start in enumerate(starts):
        # The size of each worker's first block, as xdist's worksteal scheduler deals them.
        size = (len(items) - len(ordered)) // (workers - n)
        ordered += start + list(itertools.islice(rest, max(0, size - len(start))))
    items[:] = ordered + list(rest)


GC_THRESHOLD = 10_000
"""Allocations between two collections of the youngest generation (CPython's default: 700)."""


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Every full collection of the cyclic garbage collector walks every object still alive; in a
    worker, what collection built is most of them, and it lives until the worker exits. Frozen, it
    is left out of every later collection (those took 6 to 10 s of each worker's CPU a run). The
    session's servers, chains and strategies stay alive too: with the youngest generation
    collected every 10,000 allocations instead of 700, the oldest is walked some ten to twenty
    times a run instead of fifty or sixty (1 to 2.5 s less CPU per worker)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])
