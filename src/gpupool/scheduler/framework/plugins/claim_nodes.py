"""Filter `claim_nodes` (the claim profile, before `gpu_fit`): a DRA claim goes only to nodes that publish
gpupool's devices of its kind and that its pod may run on.

The devices are those of the newest ResourceSlices without a NoSchedule/NoExecute taint, of the claim's
kind (`cycle.claim.gpus`, read by the claim allocator): shared GPUs for a share, GPUs in MIG mode for a MIG
partition, shared GPUs with a GPU server for a remote share. The pod may run on the node: its nodeSelector
and required node affinity, the node's NoSchedule/NoExecute taints (gpupool.scheduler.node_rules). A remote
share's GPU node is not where its pod runs: `remote_tiers` checks the pod's node instead.

For a pod kube-scheduler applies these rules before it asks the extender, and offers only the nodes that
pass; for a claim nobody does before its allocation pins the pod to the node. So the others fail first, as
UNSCHEDULABLE_AND_UNRESOLVABLE: no PostFilter may evict pods there to make room (kube-scheduler would then
refuse the pod there for ever).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from gpupool.api.dra import REMOTE_ISOLATION
from gpupool.core.state import BoolArray
from gpupool.scheduler.framework.cycle import CycleState, NodeSet
from gpupool.scheduler.framework.interface import Handle
from gpupool.scheduler.framework.status import Code
from gpupool.scheduler.node_rules import MAY_RUN, MayRunCache

NO_DEVICE = "no untainted device of gpupool's DRA driver here for this claim"
NOT_HERE = f"the pod may not run here ({MAY_RUN})"


class Args(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ClaimNodes:
    name: ClassVar[str] = "claim_nodes"
    gpu_only: ClassVar[bool] = True

    def __init__(self, handle: Handle, args: Args) -> None:
        self.handle = handle
        self.may_run = MayRunCache()  # may_run's answers, per pod shape and node version
        self._has: tuple[Mapping[str, frozenset[int]], list[str], BoolArray] | None = None

    def has_devices(self, gpus: Mapping[str, frozenset[int]], names: list[str]) -> BoolArray:
        """Whether each of `names` has devices in `gpus`, kept for the same devices (one mapping per
        allocation pass and kind) and names: most claims ask it of every node with devices."""
        kept = self._has
        if kept is not None and kept[0] is gpus and kept[1] == names:
            return kept[2]
        has = np.fromiter(map(gpus.__contains__, names), dtype=bool, count=len(names))
        has.flags.writeable = False
        self._has = (gpus, list(names), has)
        return has

    def filter(self, cycle: CycleState, nodes: NodeSet) -> None:
        claim = cycle.claim
        if claim is None:
            return
        names = nodes.alive_names()
        has = self.has_devices(claim.gpus, names)
        bad = ~has
        if claim.isolation != REMOTE_ISOLATION:
            ledger = self.handle.ledger
            if has.all():
                bad |= ~self.may_run.allowed(cycle.pod, names, ledger.node_objs, ledger.node_versions,
                                             ledger.node_serial)
            else:
                where = np.flatnonzero(has)
                allowed = self.may_run.allowed(cycle.pod, [names[k] for k in where.tolist()], ledger.node_objs,
                                               ledger.node_versions, ledger.node_serial)
                bad[where[~allowed]] = True
        if bad.any():
            reasons = [NOT_HERE if has[k] else NO_DEVICE for k in np.flatnonzero(bad).tolist()]
            nodes.reject(bad, reasons, Code.UNSCHEDULABLE_AND_UNRESOLVABLE)
