"""Filter `shares_per_gpu`: no GPU is shared by more pods than its node promises.

A node's inventory says how many pods may share one of its GPUs (`split`, the device-plugin slots per GPU;
docs/concepts.md: at most splitCount pods share one GPU), and an MPS control daemon serves at most 48
clients per GPU (gpupool.api.counted.MPS_CLIENTS_PER_GPU). Core counts compute and memory, not pods,
so a GPU full of memory-only shares (1/1000 of the compute each) would take pod after pod. The ledger
counts pods per GPU; this plugin hides the GPUs at their limit from the pod: for the nodes where such a
GPU was among the fitting ones it checks the pod again (gpupool.core.fit.check) with a derived request
whose `exclude_uuids` adds those GPUs, so core decides what is left. Nodes left without room are
UNSCHEDULABLE with core's reason plus which GPUs are at their limit (the pending message shows it); the
others keep only the GPUs below it (`cycle.gpu_ok`), which the policy's GPU choice then honours.
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from gpupool.api.counted import MPS_CLIENTS_PER_GPU
from gpupool.api.isolation import IsolationMode
from gpupool.core.fit import NO_GPU_SHARE, OK, Fit, check
from gpupool.scheduler.framework.cycle import CycleState, NodeSet
from gpupool.scheduler.framework.interface import Handle
from gpupool.scheduler.framework.status import Code


class Args(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SharesPerGPU:
    name: ClassVar[str] = "shares_per_gpu"
    gpu_only: ClassVar[bool] = True

    def __init__(self, handle: Handle, args: Args) -> None:
        self.handle = handle

    def filter(self, cycle: CycleState, nodes: NodeSet) -> None:
        ledger = self.handle.ledger
        request = cycle.request
        if not ledger.full_gpus or request is None or cycle.fit_nodes is None:
            return  # no GPU is at its limit: nothing to hide (the common case costs nothing)
        mps = cycle.parsed is not None and cycle.parsed.isolation == IsolationMode.MPS
        idx = nodes.nodes()
        near = np.flatnonzero(ledger.node_full[idx] > 0)  # nodes with a GPU at a limit: usually few
        if not len(near):
            return
        gpu_ok = cycle.gpu_ok
        assert gpu_ok is not None
        full = ledger.full(idx[near], mps)
        hit = (gpu_ok[idx[near]] & full).any(axis=1)
        if not hit.any():
            return
        full = full[hit]
        hit_pos = near[hit]
        hit_idx = idx[hit_pos]
        state = ledger.state
        hidden = {int(i): [int(j) for j in np.flatnonzero(full[k])] for k, i in enumerate(hit_idx)}
        uuids = {state.nodes[i].gpus[j].uuid for i, js in hidden.items() for j in js}
        derived = replace(request, gpu=replace(request.gpu, exclude_uuids=request.gpu.exclude_uuids | uuids))
        fit = check(state, derived, hit_idx)
        gpu_ok[hit_idx] = fit.gpu_fit
        why = {i: self._why(i, js, mps) for i, js in hidden.items()}
        cycle.narrowed.update(why)
        failed = np.flatnonzero(fit.code != OK)
        if not len(failed):
            return
        # Core's words for "not enough GPUs with room" (its code for the derived request says "no GPU of an
        # allowed model", which would mislead), then which GPUs are at their limit.
        as_share = Fit(fit.nodes, np.full(len(fit.nodes), NO_GPU_SHARE, dtype=np.int64), fit.gpu_fit)
        reasons = [f"{as_share.reason(int(k), request)} ({why[int(hit_idx[k])]})" for k in failed.tolist()]
        bad = np.zeros(len(idx), dtype=bool)
        bad[hit_pos[failed]] = True
        nodes.reject(bad, reasons, Code.UNSCHEDULABLE)

    def _why(self, node: int, gpus: list[int], mps: bool) -> str:
        ledger = self.handle.ledger
        split = int(ledger.split[node])
        listed = ", ".join(str(j) for j in gpus[:8]) + (", ..." if len(gpus) > 8 else "")
        text = f"GPU {listed} already shared by {split} pods each, the limit of this node (inventory split {split})"
        if mps and any(int(ledger.mps_sharers[node, j]) >= MPS_CLIENTS_PER_GPU for j in gpus):
            text = (f"GPU {listed} already at its limit of {min(split, MPS_CLIENTS_PER_GPU)} pods "
                    f"(inventory split {split}, {MPS_CLIENTS_PER_GPU} MPS clients per GPU)")
        return text
