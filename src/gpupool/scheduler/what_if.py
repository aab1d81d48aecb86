"""What-ifs on a snapshot of the ledger: would the pod fit on this node if these pods were gone, or held
other grants? Reclaim, the preempt verb and squeeze planning ask them, many times per decision.

A `Snapshot` is copy-on-write by node: the first question about a node copies that node's row of the
ledger's ClusterState (ClusterState.node_copy, O(one node)), and every question works on a fresh copy of
that copy (ClusterState.copy). The live state is only ever read, so a question that raises halfway, or a second question
asked meanwhile, cannot leave the ledger changed (the old way, releasing and re-taking pods on the live
state, left it corrupted when anything failed in between, and bumped the versions the fit caches key on).

Like kube-scheduler's per-cycle snapshot, one serves one decision: it must be used before the next await.
Copying lazily is the same as copying everything at once only while the ledger does not change, so a
snapshot used after a change raises StaleSnapshot rather than mix two moments.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from gpupool.core.fit import OK, check
from gpupool.core.model import Allocation, PodRequest
from gpupool.core.state import ClusterState
from gpupool.scheduler.ledger import Ledger


class StaleSnapshot(RuntimeError):
    """The ledger changed after the snapshot was taken (it was kept across an await)."""


class Snapshot:
    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self._state = ledger.state
        self._version = ledger.state.version
        self._nodes: dict[str, ClusterState] = {}

    def _check_fresh(self) -> None:
        if self._ledger.state is not self._state or self._state.version != self._version:
            raise StaleSnapshot("the ledger changed since this snapshot was taken")

    def node(self, name: str) -> ClusterState | None:
        """A private copy of node `name` (a state of its own: index 0) as the ledger held it when the
        snapshot was taken, or None for a node the ledger does not have. A new copy per call."""
        base = self._nodes.get(name)
        if base is None:
            self._check_fresh()
            i = self._state.index.get(name)
            if i is None:
                return None
            base = self._nodes[name] = self._state.node_copy(i)
        return base.copy()

    def holds(self, uid: str) -> Allocation | None:
        """What pod `uid` holds in the ledger's state (None: nothing)."""
        self._check_fresh()
        held = self._state.held.get(uid)
        return None if held is None else held.allocation

    def fits(self, request: PodRequest, node: str, gone: Iterable[str] = (),
             regrants: Mapping[str, Allocation] | None = None) -> bool:
        """Would `request` fit on `node` once the pods `gone` (UIDs) released what they hold there and the
        pods of `regrants` held those grants instead (a regrant the node refuses is left out, as if not
        asked)?"""
        state = self.node(node)
        if state is None:
            return False
        for uid in gone:
            state.release(uid)
        for uid, allocation in (regrants or {}).items():
            if uid in state.held:
                state.regrant(uid, allocation)
        return bool(check(state, request, np.zeros(1, dtype=np.int64)).code[0] == OK)

    def takes(self, uid: str, allocation: Allocation) -> bool:
        """Would the ledger's state let pod `uid` hold `allocation` instead of what it holds now?"""
        held = self.holds(uid)
        state = None if held is None else self.node(held.node)  # another node's grant: refused there
        return state is not None and state.regrant(uid, allocation) is None


def fits_without(ledger: Ledger, request: PodRequest, node: str, gone: Iterable[str]) -> bool:
    """Does `request` fit on `node` once the ledger entries of the pod UIDs in `gone` are released? One
    question on a snapshot of its own."""
    return Snapshot(ledger).fits(request, node, gone)
