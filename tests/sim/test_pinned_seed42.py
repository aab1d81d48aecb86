"""Seed 42 on the bundled `default` trace, pinned from the code before the speed work (commit f93e677,
through gpupool.core.placement.place): the fast replay must make the very same placements.

The digest is sha256 over "node:gpu,gpu;" (or "-;" for a failed pod) in submission order, as the
original loop printed it; the figures are what `gpupool simulate --seeds 42` reported for them."""

from __future__ import annotations

import hashlib
from functools import cache

import pytest

from gpupool.core.model import Node, PodRequest
from gpupool.sim.replay import ReplayLog, replay
from gpupool.sim.trace import NODES_FILE, TRACE_DIR, load_nodes, load_pods, resolve_trace

# policy: (digest prefix, failed pods, unallocated % at 100, at 130, fragmented % at 100)
PINNED = {
    "random": ("3c24fc2116207611", 2656, 13.740837016332023, 12.531376858254703, 13.508302870442526),
    "firstfit": ("37521ef2e474cb77", 2527, 5.566630568401337, 5.333855931017084, 5.536294015572285),
    "dotprod": ("0acfae25a5eba173", 2768, 9.025098050693686, 8.792323413309433, 8.982305226639959),
    "packing": ("e254d4b4a5d427f0", 2713, 8.2602880056196, 8.028458243511864, 8.18127540962247),
    "clustering": ("a88cbbb6a6f232ff", 2730, 8.47889714921267, 8.24706738710492, 8.290447250244144),
    "bestfit": ("315abe9fb7e47f96", 2629, 7.003365919334996, 6.77153615722726, 6.974341711137325),
    "fgd": ("47c57d207f63ff82", 2459, 4.55520107709421, 4.441207760575622, 4.525305687150624),
    "gpupool": ("9b0154881b5f65a0", 2407, 3.777190774454141, 3.6942663568408705, 3.74797548599956),
}
# A few single placements (submission index: node and GPUs) to read when the digest differs.
FIRST = {
    "random": {1: "openb-node-0659:1", 1000: "openb-node-0581:", 5000: "openb-node-0374:"},
    "firstfit": {1: "openb-node-1114:0", 1000: "openb-node-0465:", 5000: "openb-node-0702:"},
    "dotprod": {1: "openb-node-0083:0", 1000: "openb-node-0482:", 5000: "openb-node-0093:"},
    "packing": {1: "openb-node-1032:0", 1000: "openb-node-0366:", 5000: "openb-node-0416:"},
    "clustering": {1: "openb-node-1032:0", 1000: "openb-node-0366:", 5000: "openb-node-1101:"},
    "bestfit": {1: "openb-node-0083:0", 2: "openb-node-0914:0", 1000: "openb-node-0202:", 10000: "-"},
    "fgd": {0: "openb-node-1114:", 1: "openb-node-1114:0", 5000: "openb-node-1162:"},
    "gpupool": {0: "openb-node-0019:", 1000: "openb-node-1175:", 5000: "openb-node-0754:"},
}


@cache
def _inputs() -> tuple[list[Node], list[PodRequest]]:
    return load_nodes(TRACE_DIR / NODES_FILE), load_pods(resolve_trace("default"))


def placements(log: ReplayLog, nodes: list[Node]) -> list[str]:
    assert log.node is not None and log.gpus is not None
    out = []
    for i, mask in zip(log.node.tolist(), log.gpus.tolist(), strict=True):
        gpus = ",".join(str(j) for j in range(8) if mask >> j & 1)
        out.append("-" if i < 0 else f"{nodes[i].name}:{gpus}")
    return out


@pytest.mark.parametrize("policy", sorted(PINNED))
def test_seed_42_on_default_is_unchanged(policy: str) -> None:
    nodes, pods = _inputs()
    log = replay(nodes, pods, policy, 42)
    shown = placements(log, nodes)
    for k, where in FIRST[policy].items():
        assert shown[k] == where, k
    digest = hashlib.sha256("".join(s + ";" for s in shown).encode()).hexdigest()[:16]
    want = PINNED[policy]
    assert (digest, log.failed) == want[:2]
    assert 100 - log.allocated_at(100) == pytest.approx(want[2], abs=1e-9)
    assert 100 - log.allocated_at(130) == pytest.approx(want[3], abs=1e-9)
    assert log.frag_pct_at(100) == pytest.approx(want[4], abs=1e-9)
