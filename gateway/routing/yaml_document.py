"""One YAML parse gives both the data and the node tree whose marks locate every key.

libyaml's loader is used when PyYAML was built with it (its wheels are): it reads the route
table about ten times faster than the pure-Python one, which matters because every worker and
every ``check`` reads the table at start-up.
"""

from __future__ import annotations

from typing import Any

import yaml

SafeLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def parse(text: str) -> tuple[Any, yaml.Node | None]:
    """The document's data and its root node (``None, None`` for an empty document).

    Raises :class:`yaml.YAMLError` on a syntax error, with ``problem_mark`` set, worded by the
    pure-Python parser whichever loader read the text: it also names what it found instead.
    """
    try:
        return _parse(text, SafeLoader)
    except yaml.YAMLError:
        if SafeLoader is yaml.SafeLoader:
            raise
        _parse(text, yaml.SafeLoader)  # raises the same problem in its own words
        raise


def _parse(text: str, loader_class: type[yaml.SafeLoader]) -> tuple[Any, yaml.Node | None]:
    loader = loader_class(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, None
        return loader.construct_document(node), node
    finally:
        loader.dispose()
