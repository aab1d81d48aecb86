"""Filter `claim_devices`: a claim is offered only its devices among the GPUs gpu_fit found, with the other
GPUs named in the node's reason; the devices' matrix it keeps follows a new set of devices (the next pass's
slices) and a rebuilt ledger state (node rows that moved)."""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any, cast

import numpy as np

from gpupool.api.dra import DRIVER, ClaimAsk
from gpupool.core.model import GPURequest, PodRequest
from gpupool.demo.embedded import node_objects
from gpupool.scheduler.framework.cycle import ClaimInCycle, CycleState, NodeSet, Phase
from gpupool.scheduler.framework.interface import Handle
from gpupool.scheduler.framework.plugins.claim_devices import NOT_ITS_DEVICE, Args, ClaimDevices
from gpupool.scheduler.ledger import Ledger
from tests.scheduler.conftest import small_scenario


def ledger(nodes: int) -> Ledger:
    """gpu-0000.. with two GPUs each (the ledger's rows in name order)."""
    return Ledger(node_objects(small_scenario(nodes=nodes, gpus=2)))


def run(plugin: ClaimDevices, book: Ledger, gpus: Mapping[str, frozenset[int]], count: int = 1
        ) -> tuple[list[str], dict[str, str], dict[str, list[int]]]:
    """One Filter over every node of `book`, gpu_fit having found every GPU: the nodes left, the reasons of
    those rejected, and each node's GPUs still offered."""
    state = book.state
    names = sorted(state.index)
    cycle = CycleState(pod={}, phase=Phase.CLAIM, uid="u", key="ns/p", now=0.0)
    cycle.claim = ClaimInCycle("c", "ns/c", ClaimAsk("gpu", DRIVER, count, 1024, 10), "hook", (), gpus,
                               frozenset(names))
    cycle.request = PodRequest(key="ns/p", gpu=GPURequest(count=count, milli=100, memory_mib=1024))
    rows = np.ones((len(names), state.width), dtype=bool)
    cycle.set_fit(np.arange(len(names), dtype=np.int64), rows, (len(names), state.width))
    nodes = NodeSet(names, state.index)
    plugin.filter(cycle, nodes)
    gpu_ok = cycle.gpu_ok
    assert gpu_ok is not None
    offered = {n: np.flatnonzero(gpu_ok[state.index[n]]).tolist() for n in names}
    return nodes.alive_names(), dict(nodes.failed), offered


def plugin(book: Ledger) -> ClaimDevices:
    return ClaimDevices(cast(Handle, SimpleNamespace(ledger=book)), Args())


def test_only_the_claims_devices_are_offered_and_a_node_without_enough_fails_with_the_reason() -> None:
    book = ledger(2)
    p = plugin(book)
    gpus = {"gpu-0000": frozenset({1}), "gpu-0001": frozenset({0, 1})}
    alive, failed, offered = run(p, book, gpus)
    assert alive == ["gpu-0000", "gpu-0001"] and failed == {}
    assert offered == {"gpu-0000": [1], "gpu-0001": [0, 1]}
    alive, failed, _ = run(p, book, gpus, count=2)
    assert alive == ["gpu-0001"]
    assert failed == {"gpu-0000": f"needs 2 GPU(s), 1 of its devices fit (GPU 0: {NOT_ITS_DEVICE})"}


def test_the_devices_of_the_next_pass_are_read_afresh() -> None:
    """A new devices mapping (as each allocation pass reads the slices anew): without the mapping in the
    matrix's key, the second answer would repeat the first."""
    book = ledger(2)
    p = plugin(book)
    _, _, offered = run(p, book, {"gpu-0000": frozenset({0}), "gpu-0001": frozenset({0, 1})})
    assert offered == {"gpu-0000": [0], "gpu-0001": [0, 1]}
    _, _, offered = run(p, book, {"gpu-0000": frozenset({0, 1}), "gpu-0001": frozenset({1})})
    assert offered == {"gpu-0000": [0, 1], "gpu-0001": [1]}


def test_a_rebuilt_ledger_state_moves_the_rows() -> None:
    """gpu-0001 leaves and a node that sorts first joins: as many rows as before, but gpu-0000's moves down
    by one. With the same devices mapping the matrix must be made again for the new rows (kept, it would
    offer gpu-0000's device to the new node and gpu-0001's to gpu-0000)."""
    book = ledger(2)
    p = plugin(book)
    gpus = {"gpu-0000": frozenset({0}), "gpu-0001": frozenset({1})}
    _, _, offered = run(p, book, gpus)
    assert offered == {"gpu-0000": [0], "gpu-0001": [1]}
    first: dict[str, Any] = node_objects(small_scenario(nodes=1, gpus=2))[0]
    first["metadata"]["name"] = "a-gpu"
    book.apply_node("DELETED", book.node_objs["gpu-0001"])
    book.apply_node("ADDED", first)
    assert book.state.index == {"a-gpu": 0, "gpu-0000": 1}
    _, failed, offered = run(p, book, gpus)
    assert offered == {"a-gpu": [], "gpu-0000": [0]}
    assert failed == {"a-gpu": f"needs 1 GPU(s), 0 of its devices fit (GPU 0, 1: {NOT_ITS_DEVICE})"}
