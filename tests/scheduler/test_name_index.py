"""NameIndex: the ledger positions of a request's node names, remembered per name list and index dict."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.scheduler.framework.cycle import NameIndex, NodeSet, Offered
from gpupool.scheduler.framework.status import Code


def test_the_same_names_in_new_strings_get_the_remembered_arrays():
    index = {"n0": 0, "n1": 1, "n2": 2}
    names = NameIndex()
    first = names.lookup(["n2", "x", "n0"], index)
    # Built anew, as each request body's names are: equal, not identical.
    again = names.lookup(["".join(["n", "2"]), "x", "n0"], index)
    assert again is first
    assert first.index.tolist() == [2, -1, 0]
    assert first.names.tolist() == ["n2", "x", "n0"]


def test_a_new_index_dict_or_other_names_are_looked_up_again():
    names = NameIndex(keep=2)
    old = {"n0": 0, "n1": 1}
    new = {"n1": 0, "n0": 1}  # the ledger rebuilt its state: same names, other rows
    a = names.lookup(["n0", "n1"], old)
    b = names.lookup(["n0", "n1"], new)
    assert b is not a and b.index.tolist() == [1, 0] and a.index.tolist() == [0, 1]
    c = names.lookup(["n1"], old)
    assert c.index.tolist() == [1]
    # keep=2: the first entry was dropped, so asking again builds it again (with the same answer).
    again = names.lookup(["n0", "n1"], old)
    assert again is not a and again.index.tolist() == [0, 1]


def test_remembered_arrays_cannot_be_altered_by_a_caller():
    found = NameIndex().lookup(["n0", "n1"], {"n0": 0, "n1": 1})
    with pytest.raises(ValueError):
        found.index[0] = 7
    with pytest.raises(ValueError):
        found.names[0] = "n9"


@given(st.lists(st.sampled_from(["a", "b", "c", "d", "zz"]), max_size=12), st.lists(st.booleans(), max_size=12))
def test_a_node_set_from_the_index_answers_as_one_from_the_dict(names, drop):
    index = {"a": 0, "b": 1, "c": 2, "d": 3}
    cached = NameIndex()
    cached.lookup(list(names), index)
    from_cache = NodeSet(names, cached.lookup(list(names), index))
    direct = NodeSet(names, index)
    bad = np.array([(drop[k] if k < len(drop) else False) for k in range(len(names))], dtype=bool)
    for nodes in (from_cache, direct):
        nodes.reject(bad, ["dropped"] * int(bad.sum()), Code.UNSCHEDULABLE)
    assert from_cache.alive_names() == direct.alive_names() == [n for n, b in zip(names, bad, strict=True) if not b]
    assert from_cache.failed == direct.failed == {n: "dropped" for n, b in zip(names, bad, strict=True) if b}
    assert from_cache.nodes().tolist() == [index.get(n, -1) for n, b in zip(names, bad, strict=True) if not b]
    assert Offered.of(names, index).index.tolist() == [index.get(n, -1) for n in names]
