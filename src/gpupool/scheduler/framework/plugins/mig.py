"""PreFilter / Filter / Score `mig_placement`: MIG-mode GPUs serve pods with isolation `mig`, and only them.

AMD and Ascend cards in partition mode (their agent reports them `mig: true` with their partitions, as it does
MIG GPUs) are placed on the same way with their vendor's geometry (gpupool.core.geometry decides which;
gpupool.core.partitions.choose and fragmentation): the profile is the one named ("CPX/NPS4", "vir08") or the
smallest holding the request (gpupool.core.mig_request.vendor_profile_for), and the grant holds the
partition's share of the card (gpupool.core.geometry.vendor_share).

For a pod with isolation `mig`, the profile on each MIG GPU is `gpupool.io/mig-profile` checked against the
GPU's model, else the smallest profile that holds its memory and cores (gpupool.core.mig_request.profile_for).
A node passes when one of its MIG GPUs (among those gpu_fit left: model, UUIDs, health) has an idle
instance of that profile or free slices at an allowed start for a new one; the score is the growth of the
best GPU's slice fragmentation against the observed profile mix (gpupool.core.mig_placement), so the node
that spoils least future demand wins. The choice per node (GPU, profile, start) is left in
`cycle.data["mig_placement"]`, and `mig_allocation` turns it into the grant Reserve records
(`cycle.placed`): the profile's compute and memory (gpupool.core.mig_request.grant_share) and
`mig: {profile, start}`.

For every other pod, MIG-mode GPUs are taken out of the GPUs gpu_fit offered (a MIG GPU has no shares to
give: its slices belong to instances), and a node left without enough GPUs fails with the reason.

The layouts are this plugin's own state (gpupool.scheduler.mig_layouts.MigState: the agents' reports with
the ledger's MIG grants laid over them, following the ledger as a view it attaches), so two pods of one
burst never get the same slices.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from gpupool.api.isolation import IsolationMode
from gpupool.api.names import ANN_ISOLATION, ANN_MIG_PROFILE
from gpupool.core.geometry import vendor_model, vendor_share
from gpupool.core.mig import mig_model
from gpupool.core.mig_placement import MigChoice, MigGPU, MigRefusal, choose, observed_demand
from gpupool.core.mig_request import ProfileRefusal, grant_share, profile_for, vendor_profile_for
from gpupool.core.model import Allocation, GPUGrant, GPURequest, MigSlot
from gpupool.core.partitions import PartitionCard, PartitionModel
from gpupool.core.partitions import choose as choose_partition
from gpupool.core.state import IntArray
from gpupool.scheduler.framework.cycle import CycleState, NodeSet
from gpupool.scheduler.framework.interface import Handle, NodeScores
from gpupool.scheduler.framework.status import SUCCESS, Code, Status
from gpupool.scheduler.mig_layouts import MigLayouts, MigState

__all__ = ["ANN_MIG_PROFILE", "Args", "MigLayouts", "MigPlacement", "MigState", "NodeChoice", "mig_allocation"]

SCORE_PER_SLICE = 1000.0  # one memory slice of fragmentation outweighs any share-based policy score
NAME = "mig_placement"


class Args(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


@dataclass(frozen=True, slots=True)
class NodeChoice:
    gpu_uuid: str
    gpu_index: int
    model: str
    choice: MigChoice
    memory_mib: int = 0  # the card's memory as its agent reports it (an AMD/Ascend partition's share is of it)


def wants_mig(cycle: CycleState) -> bool:
    return cycle.parsed is not None and cycle.parsed.isolation == IsolationMode.MIG and cycle.request is not None


def _named(cycle: CycleState) -> str | None:
    if cycle.claim is not None:  # a claim names its profile by the one selector gpupool reads (api.dra.claim_asks)
        return cycle.claim.ask.mig_profile
    annotations = (cycle.pod.get("metadata") or {}).get("annotations") or {}
    named = str(annotations.get(ANN_MIG_PROFILE, "")).strip()
    return named or None


def mig_allocation(cycle: CycleState, node_index: int, node: str) -> Allocation | None:
    """The grant Reserve records for a MIG pod on `node`: the instance Filter chose there (None: none)."""
    chosen: dict[int, NodeChoice] = cycle.data.get(NAME) or {}
    c = chosen.get(node_index)
    vendor = vendor_model(c.model) if c is not None else None
    if c is not None and vendor is not None and cycle.request is not None:  # an AMD partition, an Ascend vNPU
        part = vendor.profile(c.choice.option.profile)
        if part is None:
            return None
        milli, memory = vendor_share(vendor, part, c.memory_mib)
        grant = GPUGrant(c.gpu_uuid, c.gpu_index, milli, memory, MigSlot(part.name, c.choice.option.start))
        return Allocation(pod=cycle.request.key, node=node, grants=(grant,),
                          policy=cycle.policy.name if cycle.policy is not None else "")
    model = mig_model(c.model) if c is not None else None
    profile = model.profile(c.choice.option.profile) if c is not None and model is not None else None
    if c is None or model is None or profile is None or cycle.request is None:
        return None
    milli, memory = grant_share(model, profile)
    grant = GPUGrant(c.gpu_uuid, c.gpu_index, milli, memory, MigSlot(profile.name, c.choice.option.start))
    return Allocation(pod=cycle.request.key, node=node, grants=(grant,),
                      policy=cycle.policy.name if cycle.policy is not None else "")


def _vendor_choice(vendor: PartitionModel, gpu: MigGPU, memory_mib: int, asked: GPURequest, named: str | None,
                   demand: Mapping[str, float]) -> MigChoice | MigRefusal | ProfileRefusal:
    """The partition for the request on one AMD or Ascend card in partition mode, by that vendor's geometry
    (gpupool.core.partitions.choose): the profile the request names or the smallest that holds it, and the
    idle partition or new start whose choice grows the card's fragmentation least under the observed demand
    of this vendor's profiles. An AMD card whose partitions in use are of another mode has no option."""
    profile = vendor_profile_for(vendor, asked, named, memory_mib)
    if isinstance(profile, ProfileRefusal):
        return profile
    own = {k: v for k, v in demand.items() if vendor.profile(k) is not None}
    return choose_partition([PartitionCard(gpu.model, gpu.instances)], profile.name, own or {profile.name: 1.0})


class MigPlacement:
    name: ClassVar[str] = NAME
    gpu_only: ClassVar[bool] = True

    def __init__(self, handle: Handle, args: Args, state: MigState | None = None) -> None:
        self.handle = handle
        if state is None:
            state = MigState()
            handle.ledger.attach(state)
        self.state = state

    @property
    def layouts(self) -> MigLayouts:
        return self.state.layouts

    def pre_filter(self, cycle: CycleState) -> Status:
        """A pod that names its profile and gives no share asks for that instance, not for a whole GPU's
        free capacity: gpu_fit then only checks that a GPU is eligible (model, UUIDs, health, a sliver
        of room) and the slice geometry decides. Any other MIG request is at most its profile on every
        model (the profile is chosen to hold it), so gpu_fit's check stays a true necessary condition."""
        if wants_mig(cycle):
            cycle.placed = {}  # Reserve takes the instance Filter chooses, never the policy's GPUs
        if wants_mig(cycle) and _named(cycle) and cycle.request is not None and cycle.request.gpu.whole:
            cycle.request = replace(cycle.request, gpu=replace(cycle.request.gpu, milli=1))
        return SUCCESS

    def _near(self, idx: IntArray) -> IntArray:
        """Positions in `idx` of the nodes with a GPU in MIG mode (usually few)."""
        near: IntArray = np.flatnonzero(self.state.node[np.where(idx >= 0, idx, 0)] & (idx >= 0))
        return near

    def filter(self, cycle: CycleState, nodes: NodeSet) -> None:
        if not self.layouts.nodes or cycle.request is None:
            if wants_mig(cycle):
                nodes.reject_all("no GPU in MIG mode", Code.UNSCHEDULABLE)
            return  # no MIG GPU anywhere: nothing to hide (the common case costs nothing)
        if wants_mig(cycle):
            self._filter_mig(cycle, nodes)
        else:
            self._hide_mig(cycle, nodes)

    def _hide_mig(self, cycle: CycleState, nodes: NodeSet) -> None:
        assert cycle.request is not None
        idx = nodes.nodes()
        near = self._near(idx)
        gpu_ok = cycle.gpu_ok
        if not len(near) or gpu_ok is None:
            return
        mig_gpu = self.state.gpu
        bad = np.zeros(len(idx), dtype=bool)
        reasons = []
        for k in near.tolist():
            i = int(idx[k])
            mig = mig_gpu[i]
            if not (gpu_ok[i] & mig).any():
                continue
            listed = ", ".join(str(j) for j in np.flatnonzero(mig).tolist())
            why = f"GPU {listed} in MIG mode serve only pods with {ANN_ISOLATION}: mig"
            gpu_ok[i] &= ~mig
            cycle.narrowed[i] = why
            left = int(gpu_ok[i].sum())
            if left < cycle.request.gpu.count:
                bad[k] = True
                reasons.append(f"needs {cycle.request.gpu.count} GPU(s), {left} without MIG mode fit ({why})")
        nodes.reject(bad, reasons, Code.UNSCHEDULABLE)

    def _filter_mig(self, cycle: CycleState, nodes: NodeSet) -> None:
        assert cycle.parsed is not None and cycle.parsed.request is not None
        asked = cycle.parsed.request.gpu  # the pod's own share (cycle.request may be pre_filter's)
        named = _named(cycle)
        state = self.handle.ledger.state
        gpu_ok = cycle.gpu_ok
        layouts = self.layouts
        demand = observed_demand(layouts.asked.elements())
        idx = nodes.nodes()
        chosen: dict[int, NodeChoice] = {}
        bad = np.ones(len(idx), dtype=bool)
        why_not: dict[int, str] = {}  # position -> reason, for the MIG nodes that fail
        for k in self._near(idx).tolist():
            i = int(idx[k])
            node = state.nodes[i]
            mig_gpus = layouts.gpus(node.name)
            best: NodeChoice | None = None
            why = "no GPU in MIG mode"
            for j, card in enumerate(node.gpus):
                gpu = mig_gpus.get(card.uuid)
                if gpu is None:
                    continue
                if gpu_ok is not None and not gpu_ok[i, j]:
                    why = f"MIG GPU {j} is not offered to this pod (model, UUIDs, health or room)"
                    continue
                vendor = vendor_model(gpu.model)
                if vendor is not None:
                    c = _vendor_choice(vendor, gpu, card.memory_mib, asked, named, demand)
                else:
                    profile = profile_for(gpu.model, asked, named)
                    if isinstance(profile, ProfileRefusal):
                        why = profile.reason
                        continue
                    c = choose([gpu], profile.name, demand or {profile.name: 1.0})
                if not isinstance(c, MigChoice):
                    why = c.reason
                    continue
                if best is None or c.fragment_delta < best.choice.fragment_delta:
                    best = NodeChoice(card.uuid, j, gpu.model, c, card.memory_mib)
            if best is None:
                why_not[k] = why
                continue
            bad[k] = False
            chosen[i] = best
            if gpu_ok is not None:  # the policy and Reserve see the chosen GPU only
                row = gpu_ok[i]
                keep = bool(row[best.gpu_index])
                row[:] = False
                row[best.gpu_index] = keep
                cycle.narrowed[i] = f"MIG instance {best.choice.option.profile}@{best.choice.option.start}"
        cycle.data[self.name] = chosen
        cycle.placed = {i: a for i in chosen if (a := mig_allocation(cycle, i, state.nodes[i].name)) is not None}
        nodes.reject(bad, [why_not.get(k, "no GPU in MIG mode") for k in np.flatnonzero(bad).tolist()],
                     Code.UNSCHEDULABLE)

    def score(self, cycle: CycleState, nodes: IntArray) -> NodeScores:
        chosen: dict[int, NodeChoice] | None = cycle.data.get(self.name)
        if not wants_mig(cycle) or chosen is None:
            return NodeScores()
        values = np.array([-SCORE_PER_SLICE * chosen[i].choice.fragment_delta if i in chosen else -np.inf
                           for i in nodes.tolist()], dtype=np.float64)
        return NodeScores(values=values)
