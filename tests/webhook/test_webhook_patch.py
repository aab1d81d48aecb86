"""JSON Patch building: pointer escaping (RFC 6901) and patches that reproduce the working copy."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import jsonpointer
from hypothesis import given
from hypothesis import strategies as st

from gpupool.webhook.patch import Patcher, escape_token, pointer


def test_escaping_examples() -> None:
    assert escape_token("gpupool.io/gpu-memory") == "gpupool.io~1gpu-memory"
    assert escape_token("a~b") == "a~0b"
    # `~1` in a key is a literal tilde-one, not a slash: it must become ~01, never be read back as "/".
    assert escape_token("x~1/y") == "x~01~1y"
    assert pointer("metadata", "annotations", "gpupool.io/isolation") == "/metadata/annotations/gpupool.io~1isolation"


@given(st.text())
def test_pointer_resolves_to_the_key(key: str) -> None:
    doc = {"metadata": {"annotations": {key: "v"}}}
    assert jsonpointer.resolve_pointer(doc, pointer("metadata", "annotations", key)) == "v"


keys = st.sampled_from(["a", "b/c", "d~e", "gpupool.io/gpu", "~1", ""])
paths = st.lists(keys, min_size=1, max_size=4).map(tuple)


def test_a_later_set_below_a_created_parent_leaves_the_recorded_add_alone() -> None:
    # The first set creates /a as {"a": {"a": 0}}; the later ones change the working copy below it. Had the
    # recorded add shared that object, it would have become {"a": 0} and the replace of /a/a/a would fail.
    work: dict[str, Any] = {}
    patcher = Patcher(work)
    patcher.set(("a", "a", "a"), 0)
    patcher.set(("a", "a", "a"), 1)
    patcher.set(("a", "a"), 0)
    assert patcher.ops == [
        {"op": "add", "path": "/a", "value": {"a": {"a": 0}}},
        {"op": "replace", "path": "/a/a/a", "value": 1},
        {"op": "replace", "path": "/a/a", "value": 0},
    ]
    assert jsonpatch.apply_patch({}, patcher.ops) == work == {"a": {"a": 0}}


@given(
    base=st.recursive(
        st.dictionaries(keys, st.integers(), max_size=3),
        lambda inner: st.dictionaries(keys, inner, max_size=3),
        max_leaves=8,
    ),
    changes=st.lists(st.tuples(paths, st.integers()), max_size=6),
)
def test_recorded_ops_reproduce_the_working_copy(
    base: dict[str, Any], changes: list[tuple[tuple[str, ...], int]]
) -> None:
    original = copy.deepcopy(base)
    work = copy.deepcopy(base)
    patcher = Patcher(work)
    for path, value in changes:
        # Only set paths whose parents are objects (a pod's fields are); skip those crossing a leaf.
        node: Any = work
        ok = True
        for token in path[:-1]:
            if not isinstance(node, dict):
                ok = False
                break
            node = node.get(token, {})
        if ok and isinstance(node, dict):
            patcher.set(path, value)
    assert jsonpatch.apply_patch(original, patcher.ops) == work
    # Setting what is already there records nothing.
    before = len(patcher.ops)
    for path, value in changes:
        node = work
        try:
            for token in path:
                node = node[token]
        except (KeyError, TypeError):
            continue
        if node == value:
            patcher.set(path, value)
    assert len(patcher.ops) == before
