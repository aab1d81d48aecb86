"""Would the pod fit on this node if these pods were gone? Asked of core on the ledger's own state: the pods'
allocations are taken out for the question and put back before it returns (no await in between, so no other
decision ever sees the state without them). Reclaim, priority preemption and the extender's preempt verb
ask it."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from gpupool.core.fit import OK, check
from gpupool.core.model import PodRequest
from gpupool.scheduler.ledger import Ledger


def fits_without(ledger: Ledger, request: PodRequest, node: str, gone: Iterable[str]) -> bool:
    """Does `request` fit on `node` once the ledger entries of the pod UIDs in `gone` are released?"""
    state = ledger.state
    i = state.index.get(node)
    if i is None:
        return False
    taken = [(uid, state.release(uid)) for uid in set(gone) if uid in ledger.entries]
    try:
        return bool(check(state, request, np.asarray([i], dtype=np.int64)).code[0] == OK)
    finally:
        for uid, allocation in taken:
            if allocation is not None:
                state.allocate(ledger.entries[uid].request, allocation)
