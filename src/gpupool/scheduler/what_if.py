"""Would the pod fit on this node if these pods were gone? gpupool.core.fit.fits_without on the ledger's own
state, the pods named by UID (the ledger keys allocations by UID). Reclaim and the preempt verb ask it; no
await happens in between, so no other decision ever sees the state without them."""

from __future__ import annotations

from collections.abc import Iterable

from gpupool.core.fit import fits_without as core_fits_without
from gpupool.core.model import PodRequest
from gpupool.scheduler.ledger import Ledger


def fits_without(ledger: Ledger, request: PodRequest, node: str, gone: Iterable[str]) -> bool:
    """Does `request` fit on `node` once the ledger entries of the pod UIDs in `gone` are released?"""
    i = ledger.state.index.get(node)
    if i is None:
        return False
    return core_fits_without(ledger.state, request, i, [ledger.entries[u].request for u in set(gone)
                                                          if u in ledger.entries])
