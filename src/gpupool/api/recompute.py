"""The allocation view derived from API objects alone: which pods hold which GPU shares, and what is over
capacity, over its spec or over a GPU's pod limit. The scheduler's ledger is checked against it (its debug
view and the tests); nothing here keeps state."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpupool.api.counted import (
    DEFAULT_SPLIT,
    MPS_CLIENTS_PER_GPU,
    Counted,
    beyond_spec,
    counted_allocation,
)
from gpupool.api.dra import counted_claim
from gpupool.api.moves import Move
from gpupool.api.node_objects import inventory_split, nodes_from_objects
from gpupool.core.state import ClusterState


@dataclass(slots=True)
class Recomputed:
    """The allocation view derived from API objects only."""

    allocations: dict[str, Counted] = field(default_factory=dict)
    overcommitted: dict[str, str] = field(default_factory=dict)  # uid -> why the API view is over capacity
    # what is free where once all of the above is taken
    state: ClusterState = field(default_factory=lambda: ClusterState([]))


def recompute(node_objs: Iterable[Mapping[str, Any]], pod_objs: Iterable[Mapping[str, Any]],
              claim_objs: Iterable[Mapping[str, Any]] = (), moves: Mapping[str, Move] | None = None) -> Recomputed:
    """Pods first, then DRA claims (gpupool.api.dra.counted_claim), as the ledger counts them; a remote share
    with an entry in `moves` (claim UID -> its move, gpupool.api.moves.read_moves) on the GPUs holding it."""
    node_objs = list(node_objs)
    nodes, _ = nodes_from_objects(node_objs)
    splits = {str((o.get("metadata") or {}).get("name", "")): inventory_split(o) for o in node_objs}
    state = ClusterState(nodes)
    out = Recomputed(state=state)
    moves = moves or {}
    pods_on: dict[str, list[str]] = {}  # GPU uuid -> pods holding a share of it
    mps_on: dict[str, list[str]] = {}

    counted = [counted_allocation(pod) for pod in pod_objs]
    claims = [c for claim in claim_objs
              for c in counted_claim(claim, state, moves.get(str((claim.get("metadata") or {}).get("uid", ""))))]
    for c in [*counted, *claims]:
        if c is None:
            continue
        out.allocations[c.uid] = c
        i = state.index.get(c.allocation.node)
        # a claim's share is what the allocator put in the claim: there is no pod spec to hold it to
        unasked = beyond_spec(c, state.nodes[i]) if i is not None and not c.claim else None
        refused = state.allocate(c.request, c.allocation)
        if refused is not None:
            out.overcommitted[c.uid] = f"{c.key}: {refused}"
        elif unasked is not None:
            out.overcommitted[c.uid] = unasked
        for g in c.allocation.grants:
            pods_on.setdefault(g.uuid, []).append(c.key)
            if c.mps:
                mps_on.setdefault(g.uuid, []).append(c.key)
    for n in nodes:
        split = splits.get(n.name, DEFAULT_SPLIT)
        for gpu in n.gpus:
            held, clients = pods_on.get(gpu.uuid, []), mps_on.get(gpu.uuid, [])
            if len(held) > split:
                out.overcommitted[f"{gpu.uuid}/split"] = (
                    f"GPU {gpu.index} of {n.name} is shared by {len(held)} pods, over its limit of {split} (split)")
            if len(clients) > MPS_CLIENTS_PER_GPU:
                out.overcommitted[f"{gpu.uuid}/mps"] = (
                    f"GPU {gpu.index} of {n.name} serves {len(clients)} MPS clients, over the limit of "
                    f"{MPS_CLIENTS_PER_GPU}")
    return out
