"""ClusterState copies for what-ifs (node_copy, copy) and regrant: a copy changes independently of its
source, and a refused regrant changes nothing."""

from __future__ import annotations

from gpupool.core.model import GPU, Allocation, GPUGrant, Node, PodRequest
from gpupool.core.state import ClusterState

NODES = [Node("a", 8000, 32768, (GPU("a0", 0, "T4", 16384),)),
         Node("b", 8000, 32768, (GPU("b0", 0, "T4", 16384), GPU("b1", 1, "T4", 16384)))]


def grant(uuid: str, index: int, milli: int) -> tuple[GPUGrant, ...]:
    return (GPUGrant(uuid, index, milli, 1024),)


def test_a_node_copy_holds_that_nodes_pods_and_changes_apart_from_the_source() -> None:
    state = ClusterState(NODES)
    assert state.allocate(PodRequest("p", 1000, 2048), Allocation("p", "b", grant("b1", 1, 600))) is None
    assert state.allocate(PodRequest("q", 500, 512), Allocation("q", "a", grant("a0", 0, 300))) is None
    copy = state.node_copy(state.index["b"])
    assert list(copy.held) == ["p"] and copy.index == {"b": 0}
    assert copy.gpu_milli_free.tolist() == [[1000, 400]] and int(copy.cpu_free[0]) == 7000
    copy.release("p")
    again = copy.copy()
    assert again.allocate(PodRequest("r", 0, 0), Allocation("r", "b", grant("b0", 0, 1000))) is None
    assert copy.gpu_milli_free.tolist() == [[1000, 1000]]  # the copy of the copy changed alone
    assert state.gpu_milli_free[state.index["b"]].tolist() == [1000, 400] and "p" in state.held
    assert int(state.cpu_free[state.index["b"]]) == 7000


def test_regrant_replaces_a_grant_or_changes_nothing() -> None:
    state = ClusterState(NODES)
    assert state.allocate(PodRequest("p", 1000, 2048), Allocation("p", "b", grant("b0", 0, 600))) is None
    assert state.allocate(PodRequest("q", 0, 0), Allocation("q", "b", grant("b0", 0, 400))) is None
    assert state.regrant("p", Allocation("p", "b", grant("b0", 0, 700))) is not None  # 1000 - 400 < 700
    assert state.held["p"].allocation.grants[0].milli == 600 and int(state.gpu_milli_free[1, 0]) == 0
    assert state.regrant("p", Allocation("p", "b", grant("b0", 0, 200))) is None
    assert int(state.gpu_milli_free[1, 0]) == 400 and int(state.cpu_free[1]) == 7000  # CPU kept as held
    assert state.regrant("nobody", Allocation("nobody", "b", grant("b0", 0, 1))) == "pod nobody holds nothing"


def test_fits_without_answers_on_a_copy_and_leaves_the_state_alone() -> None:
    from gpupool.core.fit import fits_without
    from gpupool.core.model import GPURequest

    state = ClusterState(NODES)
    p, q = PodRequest("p", 1000, 2048), PodRequest("q", 0, 0)
    assert state.allocate(p, Allocation("p", "b", grant("b0", 0, 600))) is None
    assert state.allocate(q, Allocation("q", "b", grant("b1", 1, 700))) is None
    r = PodRequest("r", 0, 0)
    assert state.allocate(r, Allocation("r", "a", grant("a0", 0, 700))) is None
    before = (state.gpu_milli_free.tolist(), state.cpu_free.tolist(), dict(state.held), state.node_version.tolist())
    wants = PodRequest("w", 0, 0, GPURequest(count=1, milli=500, memory_mib=1024))
    # b0 has 400 free, b1 300: half a GPU fits only once one of their holders is gone.
    assert not fits_without(state, wants, state.index["b"], [])
    assert fits_without(state, wants, state.index["b"], [p])
    assert fits_without(state, wants, state.index["b"], [q])
    assert not fits_without(state, wants, state.index["a"], [p])  # p holds nothing on a: a0 keeps 300 free
    assert fits_without(state, wants, state.index["a"], [r])
    after = (state.gpu_milli_free.tolist(), state.cpu_free.tolist(), dict(state.held), state.node_version.tolist())
    assert after == before  # versions too: the fit caches key on them
