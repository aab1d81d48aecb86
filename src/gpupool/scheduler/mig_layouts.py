"""The MIG-mode GPUs the scheduler places MIG pods on, per node.

Each node's MIG GPUs are what its agent last reported (inventory `mig: true` and `mig_instances`), with
the instances that pods in the ledger hold or are about to get laid over them (their grant's `mig`): the
agent reports an instance only after Allocate carved it, so without the overlay two pods of one
scheduling burst would get the same slices. Claims follow the ledger (assume, confirm, forget, release),
so a pod that ends gives its slices back even before the agent says so; an instance the agent still
reports as used stays used.

`MigState` is the mig_placement plugin's own state (the layouts, and which GPU slots of the ledger's
ClusterState are in MIG mode), kept beside the ledger as a LedgerView the plugin attaches.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from gpupool.api.inventory import InventoryDoc
from gpupool.core.mig_placement import MigGPU, MigInstance
from gpupool.core.model import GPUGrant
from gpupool.core.state import BoolArray, ClusterState
from gpupool.scheduler.ledger import Ledger

# Inventories of nodes without MIG GPUs (nearly all) are not decoded a second time.


def mig_gpus(doc: InventoryDoc) -> dict[str, MigGPU]:
    """GPU UUID -> the MIG-mode GPU and its reported instances, from a node's decoded inventory."""
    return {
        g.uuid: MigGPU(g.model, tuple(sorted(MigInstance(i.profile, i.start, i.used) for i in g.mig_instances)))
        for g in doc.gpus
        if g.mig
    }


@dataclass(slots=True)
class MigLayouts:
    """Node name -> its MIG GPUs (UUID -> reported instances); the claims of the ledger's pods; the
    profiles they hold (the observed MIG demand)."""

    nodes: dict[str, dict[str, MigGPU]] = field(default_factory=dict)
    asked: Counter[str] = field(default_factory=Counter)
    _claims: dict[str, tuple[str, tuple[GPUGrant, ...]]] = field(default_factory=dict)  # uid -> (node, grants)
    _by_node: dict[str, set[str]] = field(default_factory=dict)  # node -> uids with a claim there

    def set_node(self, node: str, gpus: Mapping[str, MigGPU]) -> None:
        if gpus:
            self.nodes[node] = dict(gpus)
        else:
            self.nodes.pop(node, None)

    def replace_nodes(self, nodes: Iterable[tuple[str, Mapping[str, MigGPU]]]) -> None:
        self.nodes = {}
        for name, gpus in nodes:
            self.set_node(name, gpus)

    def claim(self, uid: str, node: str, grants: Iterable[GPUGrant]) -> None:
        """A pod holds (or is about to get) the MIG instances its grants name."""
        mig = tuple(g for g in grants if g.mig is not None)
        if not mig:
            return
        self.unclaim(uid)
        self._claims[uid] = (node, mig)
        self._by_node.setdefault(node, set()).add(uid)
        self.asked.update(g.mig.profile for g in mig if g.mig is not None)

    def unclaim(self, uid: str) -> None:
        found = self._claims.pop(uid, None)
        if found is None:
            return
        node, grants = found
        uids = self._by_node.get(node)
        if uids is not None:
            uids.discard(uid)
            if not uids:
                del self._by_node[node]
        self.asked.subtract(g.mig.profile for g in grants if g.mig is not None)
        self.asked += Counter()  # drop profiles no pod holds any more

    def clear_claims(self) -> None:
        self._claims.clear()
        self._by_node.clear()
        self.asked.clear()

    def gpus(self, node: str) -> dict[str, MigGPU]:
        """The node's MIG GPUs as placement must see them: the report with every claim laid over it."""
        reported = self.nodes.get(node)
        if not reported:
            return {}
        uids = self._by_node.get(node)
        if not uids:
            return reported
        out = dict(reported)
        for uid in sorted(uids):
            for g in self._claims[uid][1]:
                gpu = out.get(g.uuid)
                if gpu is not None and g.mig is not None:
                    out[g.uuid] = gpu.with_claim(g.mig.profile, g.mig.start)
        return out


class MigState:
    """The MIG layouts over the ledger's nodes and claims (gpupool.scheduler.ledger.LedgerView), with
    `gpu` ([node, GPU slot] of the ledger's ClusterState: in MIG mode) and `node` (has a GPU in MIG mode)."""

    def __init__(self) -> None:
        self.layouts = MigLayouts()
        self.gpu: BoolArray = np.zeros((0, 1), dtype=bool)
        self.node: BoolArray = np.zeros(0, dtype=bool)
        # node -> (the inventory read, its MIG GPUs): an unchanged inventory is not walked again
        self._read: dict[str, tuple[InventoryDoc, dict[str, MigGPU]]] = {}

    def nodes_changed(self, state: ClusterState, inventories: Mapping[str, InventoryDoc]) -> None:
        read: dict[str, tuple[InventoryDoc, dict[str, MigGPU]]] = {}
        for name, doc in inventories.items():
            cached = self._read.get(name)
            read[name] = cached if cached is not None and cached[0] is doc else (doc, mig_gpus(doc))
        self._read = read
        self.layouts.replace_nodes((name, gpus) for name, (_, gpus) in read.items())
        self.layouts.clear_claims()  # the ledger reports its entries again
        self.gpu = np.zeros((len(state), state.width), dtype=bool)
        for name, gpus in self.layouts.nodes.items():
            i = state.index[name]
            for j, card in enumerate(state.nodes[i].gpus):
                self.gpu[i, j] = card.uuid in gpus
        self.node = np.asarray(self.gpu.any(axis=1), dtype=bool)

    def entry_changed(self, ledger: Ledger, uid: str) -> None:
        entry = ledger.entries.get(uid)
        if entry is None:
            self.layouts.unclaim(uid)
        else:
            self.layouts.claim(uid, entry.allocation.node, entry.allocation.grants)
