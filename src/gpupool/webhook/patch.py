"""RFC 6902 JSON Patch operations, built while the same change is applied to a working copy.

The webhook must answer with a patch, but it also has to validate the pod *as it will be* after the
patch. Recording each change once, in both forms, keeps the two from drifting apart.
"""

from __future__ import annotations

import copy
from typing import Any


def escape_token(token: str) -> str:
    """Escape one JSON Pointer reference token (RFC 6901): `~` becomes `~0` first, then `/` becomes `~1`.

    The order matters: escaping `/` first would turn `a/b` into `a~1b` and then into `a~01b`.
    """
    return token.replace("~", "~0").replace("/", "~1")


def pointer(*tokens: str | int) -> str:
    return "".join("/" + escape_token(str(t)) for t in tokens)


class Patcher:
    """Applies `set` operations to `doc` (a working copy the caller owns) and records them as JSON Patch.

    `set` adds the missing parent objects itself, because an `add` below a missing member fails on the
    API server (e.g. `/metadata/annotations/x` when the pod has no annotations at all).
    """

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self.ops: list[dict[str, Any]] = []

    def set(self, path: tuple[str | int, ...], value: Any) -> None:
        parent: Any = self.doc
        for depth, token in enumerate(path[:-1]):
            child = parent[int(token)] if isinstance(parent, list) else parent.get(token)
            if child is None:
                # Create the rest of the path in one `add` of a nested object.
                nested: Any = value
                for key in reversed(path[depth + 1 :]):
                    nested = {str(key): nested}
                # The op keeps its own copy: later `set`s change the working copy in place, and must
                # not reach back into a value already recorded (the patch would replay them twice).
                self.ops.append({"op": "add", "path": pointer(*path[: depth + 1]), "value": copy.deepcopy(nested)})
                parent[token] = nested
                return
            parent = child
        last = path[-1]
        if isinstance(parent, dict) and last in parent and parent[last] == value:
            return  # no-op: keep the patch minimal
        op = "replace" if isinstance(parent, dict) and last in parent else "add"
        self.ops.append({"op": op, "path": pointer(*path), "value": value})
        parent[last] = value
