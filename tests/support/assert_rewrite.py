"""The test modules' asserts rewritten once, by the xdist controller, for all of its workers.

pytest rewrites the asserts of every test module (and of the conftest and the plugins it names)
in each process that imports them, and keeps the result in ``__pycache__`` only where bytecode
may be written. On a fresh checkout the workers all start at once and none finds a cached
rewrite, and under ``PYTHONDONTWRITEBYTECODE`` (set in the image the suite runs in here) none is
ever kept: every worker rewrote and compiled all of them, at the same time as the others, some
2.5 s of CPU each while the run starts. pytest reads a cached rewrite even when it may not write
one, so the controller writes them once, with pytest's own rewriter, while the workers start
(in a thread: the controller only waits for them meanwhile), in the order they import them. A
worker reads those written by the time it gets there, checked against the source's mtime and
size as pytest always does, and rewrites any other itself.

This uses pytest's internal rewrite functions (pytest is pinned in constraints.txt). Should they
move, or a file not rewrite, nothing is written and the workers rewrite for themselves, as
before.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from pathlib import Path

import pytest


def rewrite_for_workers(config: pytest.Config, tests: Path, plugins: Iterable[str]) -> int:
    """Write pytest's rewritten bytecode of the run's test modules (those under the paths it was
    given), of the conftest files under ``tests`` and of the ``plugins`` there, where none is up
    to date; the number written."""
    try:
        from _pytest.assertion.rewrite import (
            PYC_TAIL,
            _read_pyc,
            _rewrite_test,
            _write_pyc,
            assertstate_key,
            get_cache_dir,
            try_makedirs,
        )
    except ImportError:
        return 0
    state = config.stash.get(assertstate_key, None)
    if state is None:  # --assert=plain: nothing is rewritten
        return 0
    patterns = config.getini("python_files")
    given = [config.invocation_params.dir / arg.split("::")[0] for arg in config.args]
    modules = [path for arg in given for path in (sorted(arg.rglob("*.py")) if arg.is_dir() else [arg])]
    # What a worker imports first comes first: the conftest files and plugins as it starts, then
    # the test modules in the order it collects them.
    files = sorted(tests.rglob("conftest.py"))
    files += [tests.parent.joinpath(*name.split(".")).with_suffix(".py") for name in plugins]
    files += [path for path in modules if any(fnmatch.fnmatch(path.name, pattern) for pattern in patterns)]
    written = 0
    for source in files:
        cache_dir = get_cache_dir(source)
        pyc = cache_dir / (source.name[:-3] + PYC_TAIL)
        if _read_pyc(source, pyc, state.trace) is not None:
            continue
        try:
            source_stat, code = _rewrite_test(source, config)
        except (OSError, SyntaxError, ValueError):
            continue  # the worker that imports it reports the problem
        if try_makedirs(cache_dir) and _write_pyc(state, code, source_stat, pyc):
            written += 1
    return written
