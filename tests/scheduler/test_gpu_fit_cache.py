"""gpu_fit's per-request row cache answers exactly what core.fit.check answers, through allocations,
releases, health changes and more shapes than it keeps."""

from __future__ import annotations

import random

import numpy as np

from gpupool.core.fit import check
from gpupool.core.model import GPU, Allocation, GPUGrant, GPURequest, Node, PodRequest
from gpupool.core.state import ClusterState
from gpupool.scheduler.framework.plugins.gpu_fit import FitRows


def _state() -> ClusterState:
    nodes = [Node(f"n{i:02d}", 16_000, 64_000,
                  tuple(GPU(f"n{i:02d}-g{j}", j, "A100" if i % 3 else "T4", 40_960) for j in range(1 + i % 4)))
             for i in range(24)]
    return ClusterState(nodes)


def _requests() -> list[PodRequest]:
    out = []
    for k, (count, milli, mem) in enumerate([(1, 300, 8192), (1, 1000, None), (2, 500, None), (1, 100, 1024),
                                             (3, 1000, None), (1, 700, 30_000)]):
        out.append(PodRequest(f"r{k}", 500 * (k + 1), 1024 * (k + 1), GPURequest(count, milli, mem)))
    out.append(PodRequest("t4", 100, 100, GPURequest(1, 200, None, models=frozenset({"T4"}))))
    out.append(PodRequest("bad", 100, 100, GPURequest(1, 5000, None)))  # core's BAD_REQUEST path
    return out


def _same(rows: FitRows, state: ClusterState, pod: PodRequest, idx: np.ndarray) -> None:
    want, got = check(state, pod, idx), rows.check(pod, idx)
    assert np.array_equal(want.code, got.code) and np.array_equal(want.gpu_fit, got.gpu_fit)
    assert np.array_equal(want.nodes, got.nodes)


def test_cached_rows_follow_every_change_of_the_state():
    rng = random.Random(7)
    state = _state()
    rows = FitRows(state, max_shapes=3)  # fewer than the shapes asked: entries are evicted and rebuilt
    requests = _requests()
    held: list[str] = []
    for step in range(300):
        idx = np.array(sorted(rng.sample(range(len(state)), rng.randint(1, len(state)))), dtype=np.int64)
        _same(rows, state, rng.choice(requests), idx)
        action = rng.random()
        if action < 0.5:
            i = rng.randrange(len(state))
            node = state.nodes[i]
            j = rng.randrange(len(node.gpus))
            milli = rng.choice([100, 300, 500])
            pod = PodRequest(f"p{step}", 100, 100, GPURequest(1, milli, 1024))
            grant = GPUGrant(node.gpus[j].uuid, j, milli, 1024)
            if state.allocate(pod, Allocation(pod.key, node.name, (grant,))) is None:
                held.append(pod.key)
        elif action < 0.8 and held:
            state.release(held.pop(rng.randrange(len(held))))
        elif action < 0.9:
            i = rng.randrange(len(state))
            state.set_gpu_health(state.nodes[i].name, 0, rng.random() < 0.5)
    # A returned Fit is the caller's: writing into it does not touch the cache.
    pod = requests[0]
    idx = np.arange(len(state), dtype=np.int64)
    first = rows.check(pod, idx)
    first.gpu_fit[:] = False
    first.code[:] = 99
    _same(rows, state, pod, idx)


def test_a_node_set_without_reasons_rejects_the_same_nodes():
    from gpupool.scheduler.framework.cycle import NodeSet
    from gpupool.scheduler.framework.status import Code

    index = {f"n{i}": i for i in range(6)}
    names = ["n0", "x", "n2", "n3", "n5"]
    kept, bare = NodeSet(names, index), NodeSet(names, index, reasons=False)
    for nodes in (kept, bare):
        bad = nodes.nodes() < 0
        nodes.reject(bad, ["unknown"] if nodes.reasons else [], Code.UNSCHEDULABLE_AND_UNRESOLVABLE)
        bad = nodes.nodes() % 2 == 1
        nodes.reject(bad, ["odd"] * int(bad.sum()) if nodes.reasons else [], Code.UNSCHEDULABLE)
    assert kept.alive_names() == bare.alive_names() == ["n0", "n2"]
    assert kept.failed == {"n3": "odd", "n5": "odd"} and kept.unresolvable == {"x": "unknown"}
    assert not bare.failed and not bare.unresolvable
