"""Filter `mps_ready`: a pod with isolation `mps` that shares a GPU goes only to GPUs whose MPS control
daemon is up.

An MPS share is enforced by the GPU's MPS daemon (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and the pinned memory
limit are applied by the server), and the node agent refuses Allocate for it where it runs no daemon for
that GPU or the daemon is down (docs/agent.md). Each GPU's daemon state is in its node's inventory
(`gpupool.api.inventory.GPUDoc.mps`: "up", "down", or "" where the agent runs none). This plugin keeps such
pods off the other GPUs, so they wait pending with the reason instead of failing admission on the node.
A pod that takes whole GPUs gets no MPS settings and needs no daemon; other isolations are not concerned.

Like shares_per_gpu it narrows `cycle.gpu_ok` (the GPUs gpu_fit offered) to the GPUs with a daemon up, so
the policy's GPU choice and Reserve see only those, and rejects the nodes left with fewer GPUs than the pod
asks for. The daemon states are this plugin's own (`MpsStates`), read from the inventories the ledger
decodes once per node change.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from gpupool.api.inventory import InventoryDoc
from gpupool.api.isolation import IsolationMode
from gpupool.core.state import ClusterState
from gpupool.scheduler.framework.cycle import CycleState, NodeSet
from gpupool.scheduler.framework.interface import Handle
from gpupool.scheduler.framework.status import Code
from gpupool.scheduler.ledger import Ledger

MPS_UP = "up"


class Args(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def wants_mps_daemon(cycle: CycleState) -> bool:
    """The pod shares GPUs under isolation mps (whole GPUs get no MPS settings, docs/agent.md)."""
    return (cycle.parsed is not None and cycle.parsed.isolation == IsolationMode.MPS and cycle.request is not None
            and not cycle.request.gpu.whole)


def _state_words(state: str) -> str:
    return "MPS daemon down" if state == "down" else "no MPS daemon (the node's agent runs none)"


class MpsStates:
    """Node name -> GPU UUID -> its MPS daemon's state as the inventory reports it ("", "up", "down"); a
    view of the ledger's nodes (gpupool.scheduler.ledger.LedgerView)."""

    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, str]] = {}

    def nodes_changed(self, state: ClusterState, inventories: Mapping[str, InventoryDoc]) -> None:
        self.nodes = {name: {g.uuid: str(g.mps) for g in doc.gpus} for name, doc in inventories.items()}

    def entry_changed(self, ledger: Ledger, uid: str) -> None:
        pass  # daemon states do not depend on the pods


class MpsReady:
    name: ClassVar[str] = "mps_ready"
    gpu_only: ClassVar[bool] = True

    def __init__(self, handle: Handle, args: Args) -> None:
        self.handle = handle
        self.states = MpsStates()
        handle.ledger.attach(self.states)

    def _states(self, node: str) -> dict[str, str]:
        return self.states.nodes.get(node, {})

    def filter(self, cycle: CycleState, nodes: NodeSet) -> None:
        if not wants_mps_daemon(cycle):
            return
        assert cycle.request is not None
        count = cycle.request.gpu.count
        state = self.handle.ledger.state
        gpu_ok = cycle.gpu_ok
        idx = nodes.nodes()
        bad = np.zeros(len(idx), dtype=bool)
        reasons: list[str] = []
        for k, i in enumerate(idx.tolist()):
            if i < 0:
                continue  # not a gpupool node: gpu_node says why
            node = state.nodes[i]
            states = self._states(node.name)
            offered = [j for j in range(len(node.gpus)) if gpu_ok is None or gpu_ok[i, j]]
            missing = [j for j in offered if states.get(node.gpus[j].uuid, "") != MPS_UP]
            if not missing:
                continue
            why = "; ".join(
                f"GPU {', '.join(str(j) for j in js)}: {_state_words(s)}"
                for s in ("", "down")
                if (js := [j for j in missing if states.get(node.gpus[j].uuid, "") == s]))
            if gpu_ok is not None:
                gpu_ok[i, missing] = False
                cycle.narrowed[i] = why
            left = len(offered) - len(missing)
            if left < count:
                bad[k] = True
                reasons.append(f"isolation mps needs {count} GPU(s) with a running MPS daemon, {left} fit ({why})")
        nodes.reject(bad, reasons, Code.UNSCHEDULABLE)
