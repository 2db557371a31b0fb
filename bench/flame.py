"""Summarize py-spy ``--format raw`` (collapsed stacks) into inclusive and self time per function.

``python -m bench.flame FILE [--top N] [--match TEXT]``: the functions whose frames are on the
most sampled stacks (inclusive: counted once per stack), and those most often at the top (self).
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

_LINE = re.compile(r"^(?P<stack>.*) (?P<count>\d+)$")
_FRAME_LINE = re.compile(r":\d+\)$")
_ROOT_FRAMES = (
    "multiprocessing/",
    "asyncio/runners.py",
    "asyncio/base_events.py",
    "(<string>)",
    "hypercorn/asyncio/run.py",
)


def _function(frame: str) -> str:
    """``func (file.py:12)`` -> ``func (file.py)``: aggregate a function over its lines."""
    return _FRAME_LINE.sub(")", frame)


def _package(frame: str) -> str:
    """``func (hypercorn/protocol/h11.py:12)`` -> ``hypercorn``; the stdlib's asyncio stays asyncio."""
    inside = frame.rpartition(" (")[2].rstrip(")")
    if inside.startswith("<"):
        return inside.partition(">")[0] + ">"
    return inside.split("/", 1)[0].split(".py", 1)[0].split(":", 1)[0] or "?"


def _boilerplate(function: str) -> bool:
    """The process and event-loop frames at the root of every stack."""
    return any(part in function for part in _ROOT_FRAMES)


def summarize(text: str) -> tuple[int, Counter[str], Counter[str], Counter[str]]:
    """Samples, inclusive and self counts per function, and self counts per top-level package."""
    total = 0
    inclusive: Counter[str] = Counter()
    exclusive: Counter[str] = Counter()
    packages: Counter[str] = Counter()
    for line in text.splitlines():
        found = _LINE.match(line.strip())
        if not found:
            continue
        count = int(found["count"])
        frames = [_function(f) for f in found["stack"].split(";")]
        total += count
        for name in set(frames):
            inclusive[name] += count
        exclusive[frames[-1]] += count
        packages[_package(frames[-1])] += count
    return total, inclusive, exclusive, packages


def render(path: Path, top: int = 30, match: str = "") -> str:
    total, inclusive, exclusive, packages = summarize(path.read_text(errors="replace"))
    if not total:
        return f"{path.name}: no samples"
    lines = [f"{path.name}: {total} samples", "", "self %      package (where the CPU is spent)"]
    lines += [f"{100 * c / total:10.1f}  {n}" for n, c in packages.most_common(top)]
    lines += ["", "inclusive %  function (coroutine stacks are cut at each resumption: a lower bound)"]
    shown = [(n, c) for n, c in inclusive.most_common() if match in n and not _boilerplate(n)][:top]
    lines += [f"{100 * c / total:10.1f}  {n}" for n, c in shown]
    lines += ["", "self %      function"]
    lines += [f"{100 * c / total:10.1f}  {n}" for n, c in exclusive.most_common(top)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("file", type=Path)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--match", default="", help="only functions whose frame contains this text")
    args = parser.parse_args()
    print(render(args.file, args.top, args.match))


if __name__ == "__main__":
    main()
