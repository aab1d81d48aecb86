"""Isolation `mig`: the MIG device the MIG manager (gpupool.agent.devices.mig) carved for the pod; on an AMD or
Ascend node the same manager carves the claim's partition or vNPU (gpupool.agent.devices.partitions), and the
DRA driver hands out that partition's own devices (gpupool.agent.dra.driver)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from gpupool.agent.config import AgentConfig
from gpupool.agent.devices.mig import MigError, MigManager, MigRefused, mig_inventory_fields
from gpupool.agent.identify import is_alive_on
from gpupool.agent.isolation.base import STEP_CARVED, GrantRequest, ModeGrant, Prepared, Refused
from gpupool.api.isolation import IsolationMode
from gpupool.api.names import ANN_ALLOCATION


class MigIsolation:
    """`mig`: the container sees the MIG device the MIG manager carved for the pod's planned instance; no
    interception library and no MPS (MIG is hardware isolation)."""

    name = IsolationMode.MIG
    second_line = False

    def __init__(self, config: AgentConfig, manager: MigManager | None, reconciled: Callable[[], bool],
                 changed: Callable[[], None]) -> None:
        self.config = config
        self.manager = manager
        self.reconciled = reconciled  # whether the manager was reconciled with the node's pods since start
        self.changed = changed  # the inventory should be published again (an instance was carved)

    def check(self, request: GrantRequest) -> Refused | None:
        return None  # what is missing is only known when carving (prepare) or answering (grant)

    async def prepare(self, request: GrantRequest) -> Prepared | Refused:
        """Carve the pod's planned instance now (or find the one it already holds when kubelet asks again).
        Done before the checkpoint: a crash after it leaves an instance the pod holds, which the retry gets
        again and the pod's deletion releases."""
        label = request.pod_label
        if self.manager is None:
            return Refused(
                f"pod {label} asks for isolation mig, but the agent on {self.config.node_name} manages no MIG "
                "devices (no GPU of the node is in MIG mode)"
            )
        if request.gpu_containers != 1 or len(request.gpus) != 1:
            return Refused(
                f"pod {label}: isolation mig serves one MIG instance per pod (one GPU container asking for one "
                f"GPU); it has {request.gpu_containers} GPU container(s) and this one was granted "
                f"{len(request.gpus)} GPU(s)"
            )
        g = request.gpus[0]
        if g.mig is None:
            return Refused(f"pod {label}: its {ANN_ALLOCATION} names no MIG instance (profile, start) for GPU {g.uuid}")
        if not self.reconciled():
            return Refused(f"pod {label}: the MIG state of node {self.config.node_name} is not reconciled yet "
                           "(API unreachable at start?); retry", retry=True)
        try:
            got = await asyncio.to_thread(self.manager.ensure, request.doc.pod_uid, g.uuid, g.mig.profile,
                                          g.mig.start)
        except (MigError, OSError) as e:
            return Refused(f"pod {label}: the MIG manager failed on GPU {g.uuid}: {e}", retry=True)
        if isinstance(got, MigRefused):
            return Refused(got.reason)
        self.changed()
        return Prepared(visible={g.uuid: got.uuid}, step=STEP_CARVED)

    def grant(self, request: GrantRequest, prepared: Prepared) -> ModeGrant | Refused:
        missing = [g.uuid for g in request.gpus if g.mig is None or g.uuid not in prepared.visible]
        if missing:
            return Refused(f"pod {request.pod_label}: isolation mig, but no MIG device for GPU(s) {', '.join(missing)}")
        return ModeGrant(
            envs={"GPUPOOL_MIG_PROFILE": ",".join(g.mig.profile for g in request.gpus if g.mig is not None)},
            visible=tuple(prepared.visible[g.uuid] for g in request.gpus),
        )

    async def release(self, pods: Sequence[Mapping[str, Any]], node: str, claims: Collection[str] = ()) -> None:
        """The instances of pods gone, finished or being deleted go back to the pool (idle, destroyed later
        by reap, which keeps an instance NVML reports in use)."""
        manager = self.manager
        if manager is None:
            return
        alive = {str(p["metadata"].get("uid")) for p in pods if is_alive_on(dict(p), node) and p.get("metadata")}
        alive |= set(claims)  # a claim's instance goes back when the claim is unprepared (gpupool.agent.dra.driver)
        for uid in sorted({e.pod for e in manager.entries if e.pod is not None} - alive):
            await asyncio.to_thread(manager.release, uid)

    def inventory_fields(self) -> dict[str, dict[str, Any]]:
        return dict(mig_inventory_fields(self.manager)) if self.manager is not None else {}
