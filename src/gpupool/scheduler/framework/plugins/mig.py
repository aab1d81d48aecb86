"""Filter and Score `mig_placement`: for pods with isolation `mig`, the MIG instance each node could give.

The pod's profile is `gpupool.io/mig-profile` checked against the GPU's model, else the smallest profile
that holds its memory and cores (gpupool.core.mig_request). A node passes when one of its MIG GPUs has an
idle instance of that profile or free slices at an allowed start for a new one; the score is the growth
of the best GPU's slice fragmentation against the observed profile mix (gpupool.core.mig_placement), so
the node that spoils least future demand wins. The choice per node (GPU, profile, start) is left in
`cycle.data["mig_placement"]` for Reserve to record.

The node's MIG GPUs and their instances come from a `MigLayouts` object that whoever reads node
inventories keeps up to date (`set_node`). Not registered in the default profile yet: the ledger keeps no
MIG layouts and the webhook still refuses `mig` (docs/mig-mps.md).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from gpupool.core.mig import mig_model
from gpupool.core.mig_placement import MigChoice, MigGPU, choose, observed_demand
from gpupool.core.mig_request import ProfileRefusal, profile_by_name, smallest_profile
from gpupool.core.model import MILLI_PER_GPU
from gpupool.core.state import IntArray
from gpupool.scheduler.framework.cycle import CycleState, NodeSet
from gpupool.scheduler.framework.interface import Handle, NodeScores
from gpupool.scheduler.framework.status import Code

ANN_MIG_PROFILE = "gpupool.io/mig-profile"
SCORE_PER_SLICE = 1000.0  # one memory slice of fragmentation outweighs any share-based policy score


class Args(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


@dataclass(slots=True)
class MigLayouts:
    """Node name -> its MIG-mode GPUs (UUID -> instances), and the profiles MIG pods asked for."""

    nodes: dict[str, dict[str, MigGPU]] = field(default_factory=dict)
    asked: Counter[str] = field(default_factory=Counter)

    def set_node(self, node: str, gpus: dict[str, MigGPU]) -> None:
        self.nodes[node] = dict(gpus)


@dataclass(frozen=True, slots=True)
class NodeChoice:
    gpu_uuid: str
    choice: MigChoice


class MigPlacement:
    name: ClassVar[str] = "mig_placement"
    gpu_only: ClassVar[bool] = True

    def __init__(self, handle: Handle, args: Args, layouts: MigLayouts | None = None) -> None:
        self.handle = handle
        self.layouts = layouts if layouts is not None else MigLayouts()

    @staticmethod
    def _wants_mig(cycle: CycleState) -> bool:
        return cycle.parsed is not None and cycle.parsed.isolation == "mig" and cycle.request is not None

    def _profile(self, cycle: CycleState, model: str) -> str | ProfileRefusal:
        annotations = (cycle.pod.get("metadata") or {}).get("annotations") or {}
        named = annotations.get(ANN_MIG_PROFILE)
        if named:
            found = profile_by_name(model, str(named))
        else:
            assert cycle.request is not None
            g = cycle.request.gpu
            if g.whole:
                found = smallest_profile(model, cores_percent=100)
            else:
                found = smallest_profile(model, g.memory_mib, g.milli / 10 if g.milli < MILLI_PER_GPU else None)
        return found if isinstance(found, ProfileRefusal) else found.name

    def filter(self, cycle: CycleState, nodes: NodeSet) -> None:
        if not self._wants_mig(cycle):
            return
        state = self.handle.ledger.state
        demand = observed_demand(self.layouts.asked.elements())
        chosen: dict[int, NodeChoice] = {}
        idx = nodes.nodes()
        bad = np.zeros(len(idx), dtype=bool)
        reasons: list[str] = []
        for k, i in enumerate(idx.tolist()):
            name = state.nodes[i].name if i >= 0 else ""
            gpus = self.layouts.nodes.get(name, {})
            best: NodeChoice | None = None
            why = "no GPU in MIG mode"
            for uuid, gpu in sorted(gpus.items()):
                if mig_model(gpu.model) is None:
                    continue
                profile = self._profile(cycle, gpu.model)
                if isinstance(profile, ProfileRefusal):
                    why = profile.reason
                    continue
                c = choose([gpu], profile, demand or {profile: 1.0})
                if not isinstance(c, MigChoice):
                    why = c.reason
                    continue
                if best is None or c.fragment_delta < best.choice.fragment_delta:
                    best = NodeChoice(uuid, c)
            if best is None:
                bad[k] = True
                reasons.append(why)
            else:
                chosen[i] = best
        cycle.data[self.name] = chosen
        nodes.reject(bad, reasons, Code.UNSCHEDULABLE)

    def score(self, cycle: CycleState, nodes: IntArray) -> NodeScores:
        chosen: dict[int, NodeChoice] | None = cycle.data.get(self.name)
        if not self._wants_mig(cycle) or chosen is None:
            return NodeScores()
        values = np.array([-SCORE_PER_SLICE * chosen[i].choice.fragment_delta if i in chosen else -np.inf
                           for i in nodes.tolist()], dtype=np.float64)
        return NodeScores(values=values)
