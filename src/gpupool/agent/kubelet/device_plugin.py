"""The kubelet device plugin (v1beta1) servicer for resource gpupool.io/gpu, and its registration.

All handlers are `async def` on grpc.aio (mixing sync handlers with streaming in the aio server has
known hang reports). Allocate is served one call at a time: each call decides from the checkpoint as the
previous call left it (whether it repeats an answer, which GPU container of a pod comes next), so two
interleaved calls must not both decide from the same state.

Kubelet calls Allocate once per container asking for gpupool.io/gpu (init containers first). Each call,
step by step (gpupool.agent.identify says how the pod and its container are found):
1. list the pods bound to this node (a field selector: never the whole cluster's pods; the Node object is
   neither read nor written: identification needs only the pods and the checkpoint);
2. identify the pod (the only candidate) and which of its GPU containers the call is for; a repeat of an
   earlier call is answered from the checkpoint, byte for byte;
3. build that container's answer and write it to the checkpoint (atomically, keyed by pod UID and
   container) — from here on the answer is fixed;
then, only when this was the pod's last GPU container:
4. write the `gpupool.io/allocated` marker on the pod (conditional on its resourceVersion): it tells the
   scheduler the pod no longer waits, so the node may take its next GPU pod, and it takes the pod out of
   the candidates of later calls;
and 5. return the answer. Until its last GPU container is served the pod has no marker: it still waits, so
the scheduler binds no other GPU pod to the node in between (and one bound anyway past the scheduler's
timeout with the same device count makes the calls ambiguous: refused, never guessed).
A crash between any two steps leaves a state the restarted agent completes (`recover`): a checkpointed pod
that is still alive and has every GPU container served gets its marker, and kubelet asking again gets the
same answer. Before step 3 nothing was written for that container, so kubelet's retry starts over.

A card in partition mode serves its partitions only, whatever its vendor (`partition_rule`, the one place that
says so): an NVIDIA GPU in MIG mode keeps its slots offered, since this plugin carves MIG instances for
isolation-mig pods, but refuses any other grant of it; an AMD or Ascend card in partition mode is not offered at
all (its slots Unhealthy, its grants refused), since its partitions are carved for DRA claims only. The slots
come back when the card is whole again (its last partition destroyed): ListAndWatch looks every second.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import grpc

from gpupool.agent.config import AgentConfig
from gpupool.agent.devices.discovery import DeviceInfo
from gpupool.agent.devices.mig import MODE_SWITCH_LABEL, MigError, MigManager, mode_switch_allowed
from gpupool.agent.devices.mps import MpsSupervisor
from gpupool.agent.devices.partitions import PartitionMigBackend
from gpupool.agent.devices.slots import preferred, slot_gpu
from gpupool.agent.devices.table import DeviceTable
from gpupool.agent.identify import (
    Again,
    Repeat,
    Unidentified,
    allocated_marker,
    by_container,
    gpu_containers,
    identify,
    is_alive_on,
    is_candidate,
    which_container,
)
from gpupool.agent.isolation.base import STEP_CARVED, Isolation, Refused, mode_of
from gpupool.agent.isolation.grant import ContainerGrant, grant_request
from gpupool.agent.isolation.grant import answer as grant_answer
from gpupool.agent.isolation.strategies import node_strategies
from gpupool.agent.isolation.vendors import NO_VENDOR_DEVICES, VendorDevices, served_modes
from gpupool.agent.kubelet.kubelet_checkpoint import recorded_containers
from gpupool.agent.port import AgentCluster
from gpupool.agent.proto import deviceplugin_v1beta1_pb2 as pb
from gpupool.agent.proto import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from gpupool.agent.state.checkpoint import Checkpoint, Served
from gpupool.agent.state.hookdir import cores_mode_of
from gpupool.api.allocation import AllocationError, decode_allocation
from gpupool.api.isolation import IsolationMode
from gpupool.api.names import ANN_ALLOCATED, ANN_ALLOCATION
from gpupool.api.times import format_time
from gpupool.cluster.port import ApiError, Conflict
from gpupool.core.geometry import vendor_model
from gpupool.core.vendors import NVIDIA

log = logging.getLogger("gpupool.agent.plugin")

API_VERSION = "v1beta1"
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
# The steps of an Allocate after which `step` hooks run (tests inject crashes there).
STEP_READ, STEP_CHECKPOINTED, STEP_MARKED = "read", "checkpointed", "marked"
# STEP_CARVED (gpupool.agent.isolation.base): isolation mig, the pod's MIG instance exists (before the checkpoint)
__all__ = ["STEP_CARVED", "STEP_CHECKPOINTED", "STEP_MARKED", "STEP_READ", "DevicePluginService", "PluginServer",
           "register"]
Obj = dict[str, Any]


def _no_step(step: str) -> None:
    pass


class AllocateStats:
    def __init__(self) -> None:
        self.served = 0
        self.refused = 0
        self.last_refusal = ""


class DevicePluginService(pb_grpc.DevicePluginServicer):
    def __init__(
        self,
        config: AgentConfig,
        table: DeviceTable,
        cluster: AgentCluster,
        wall_clock: Callable[[], float] = time.time,
        checkpoint: Checkpoint | None = None,
        step: Callable[[str], None] = _no_step,
        mps: MpsSupervisor | None = None,
        mig: MigManager | None = None,
        changed: Callable[[], None] = lambda: None,
        isolation: Mapping[str, Isolation] | None = None,
        vendors: VendorDevices = NO_VENDOR_DEVICES,
    ) -> None:
        self.config = config
        self.table = table
        self.cluster = cluster
        self.wall_clock = wall_clock
        self.checkpoint = checkpoint or Checkpoint(config.checkpoint_path, config.node_name)
        self.step = step  # called after each step of Allocate: a crash injected there is a crash between steps
        self.mps = mps  # the node's MPS daemons, when the agent runs them (None: MPS is not gpupool's to run)
        self.mig = mig  # the node's MIG manager, when a GPU is in MIG mode (None: isolation mig is refused)
        self.changed = changed  # called when the inventory should be published again (a MIG instance changed)
        self.vendors = vendors  # the node's vendor object: what a container gets for a non-NVIDIA card
        self.mig_reconciled = False
        # one strategy per isolation mode: Allocate, the watchdog and the inventory ask them, never the name
        self.isolation: Mapping[str, Isolation] = isolation or node_strategies(
            config, mps, mig, lambda: self.mig_reconciled, changed)
        self.stats = AllocateStats()
        # One at a time: Allocate, DRA prepare and unprepare, housekeeping (the MIG manager is not shared
        # between two threads, and nothing is released while something is being served).
        self.allocate_lock = asyncio.Lock()
        # UIDs of the DRA claims prepared on the node (set where the agent is a DRA driver): they hold what
        # they were given (a MIG instance) as long as they are prepared, as pods do while on the node.
        self.claims: Callable[[], Collection[str]] = lambda: ()
        self._stopping = asyncio.Event()

    def stop_streams(self) -> None:
        self._stopping.set()

    # --- options and device list --------------------------------------------------------------------------
    async def GetDevicePluginOptions(
        self, request: pb.Empty, context: grpc.aio.ServicerContext
    ) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    def withheld(self) -> dict[str, str]:
        """Cards this plugin offers nothing of, and why (`partition_rule`: AMD / Ascend cards in partition mode)."""
        out = {}
        for d in self.table.known.values():
            why = partition_rule(d, None, self.mig, self.config)
            if why is not None:
                out[d.uuid] = why
        return out

    def device_list(self) -> pb.ListAndWatchResponse:
        devices = []
        withheld = self.withheld()
        for s in self.table.slots():
            topology = pb.TopologyInfo(nodes=[pb.NUMANode(ID=s.numa_node)]) if s.numa_node >= 0 else None
            healthy = s.healthy and s.uuid not in withheld
            devices.append(pb.Device(ID=s.id, health=HEALTHY if healthy else UNHEALTHY, topology=topology))
        return pb.ListAndWatchResponse(devices=devices)

    async def ListAndWatch(
        self, request: pb.Empty, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        seen = self.table.version
        sent = self.device_list()
        yield sent
        while not self._stopping.is_set():
            version = await self.table.wait_changed(seen, timeout=1.0)
            # A card's partitions change without the table knowing (a DRA claim carved one, the reaping
            # destroyed the last): the list is compared every second as well.
            now = self.device_list()
            if version != seen or now != sent:
                seen, sent = version, now
                yield now

    async def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: grpc.aio.ServicerContext
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()

    # --- preferred allocation -----------------------------------------------------------------------------
    async def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: grpc.aio.ServicerContext
    ) -> pb.PreferredAllocationResponse:
        """Prefer slots on the GPUs the scheduler granted to the only pod waiting on this node for an
        Allocate of that many devices (none, or several: no preference). Never fails: an error here would
        fail the pod's admission, and the preference is only cosmetic (kubelet's records)."""
        pods = await self._pods_for_preference()
        responses = []
        for req in request.container_requests:
            gpu_order = self._granted_gpus(pods, req.allocation_size)
            ids = preferred(
                list(req.available_deviceIDs), list(req.must_include_deviceIDs), req.allocation_size, gpu_order
            )
            responses.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return pb.PreferredAllocationResponse(container_responses=responses)

    async def _pods_for_preference(self) -> list[Obj]:
        try:
            return await self.cluster.list_pods_on_node(self.config.node_name)
        except Exception as e:  # API errors and transport errors alike: a preference must never fail admission
            log.info("no preference (cannot list the pods of node %s): %s", self.config.node_name, e)
            return []

    def _granted_gpus(self, pods: list[Obj], size: int) -> list[str]:
        try:
            # the same candidates as Allocate's (kubelet has not called it yet: no repeat counts)
            waiting = [p for p in pods if is_candidate(p, self.config.node_name, size)]
            if len(waiting) != 1:
                return []
            (pod,) = waiting
            meta = pod.get("metadata") or {}
            text = (meta.get("annotations") or {}).get(ANN_ALLOCATION)
            if not text:
                return []
            doc = decode_allocation(text)
            containers = gpu_containers(pod)  # prefer the GPUs of the container kubelet asks for next
            served = by_container(containers, self.checkpoint.for_pod(str(meta.get("uid", ""))))
            nxt = next((c for c in containers if c.name not in served), None)
            return [g.uuid for g in (doc.container_gpus(nxt.name) if nxt is not None else doc.gpus)]
        except AllocationError as e:
            log.info("no preference (cannot read the waiting pod's allocation): %s", e)
            return []
        except Exception:  # a preference must never fail the pod's admission
            log.exception("no preference: unexpected error")
            return []

    # --- allocate -----------------------------------------------------------------------------------------
    async def Allocate(self, request: pb.AllocateRequest, context: grpc.aio.ServicerContext) -> pb.AllocateResponse:
        if len(request.container_requests) != 1:
            await self._refuse(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                "expected one container request per Allocate (kubelet sends one), "
                f"got {len(request.container_requests)}",
            )
        ids = list(request.container_requests[0].devices_ids)
        unknown = [d for d in ids if not self._is_slot(d)]
        if unknown or not ids:
            what = f"unknown device IDs {unknown}" if unknown else "no device IDs"
            await self._refuse(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{what}: this plugin serves {self.config.resource_name} slots named <GPU UUID>::<n> "
                f"for the GPUs of node {self.config.node_name}",
            )
        async with self.allocate_lock:
            try:
                outcome = await self._allocate(ids)
            except Exception as e:  # a bug must still answer kubelet with a reason, and keep serving
                log.exception("Allocate failed unexpectedly")
                outcome = grpc.StatusCode.INTERNAL, f"internal error while allocating {ids}: {e!r}"
        if isinstance(outcome, tuple):
            code, reason = outcome
            await self._refuse(context, code, reason)
            raise AssertionError("unreachable")  # _refuse aborts
        self.stats.served += 1
        return pb.AllocateResponse(container_responses=[outcome])

    def _is_slot(self, device_id: str) -> bool:
        uuid = slot_gpu(device_id)
        return uuid in self.table.known and int(device_id.rpartition("::")[2]) < self.config.split

    async def _refuse(self, context: grpc.aio.ServicerContext, code: grpc.StatusCode, reason: str) -> None:
        self.stats.refused += 1
        self.stats.last_refusal = reason
        log.warning("Allocate refused: %s", reason)
        await context.abort(code, f"gpupool agent on {self.config.node_name}: {reason}")

    async def _read(self) -> list[Obj]:
        """The pods bound to this node: all identification needs from the API (never the Node object)."""
        return await self.cluster.list_pods_on_node(self.config.node_name)

    async def _allocate(self, ids: list[str]) -> pb.ContainerAllocateResponse | tuple[grpc.StatusCode, str]:
        node_name = self.config.node_name
        try:
            pods = await self._read()
        except Exception as e:  # API error or transport failure: the same answer for kubelet
            return grpc.StatusCode.UNAVAILABLE, f"cannot list the pods of node {node_name}: {e!r}"
        self.step(STEP_READ)
        answered = {e.pod_uid for e in self.checkpoint.for_devices(ids)}
        who = identify(pods, node_name, len(ids), answered)
        if isinstance(who, Unidentified):
            return grpc.StatusCode.FAILED_PRECONDITION, who.reason
        pod = next(p for p in pods if (p.get("metadata") or {}).get("uid") == who.uid)
        label = f"{who.namespace}/{who.name}"
        containers = gpu_containers(pod)
        served = by_container(containers, self.checkpoint.for_pod(who.uid))
        which = which_container(
            label,
            containers,
            {n: e.devices for n, e in served.items()},
            ids,
            lambda: recorded_containers(self.config.device_plugin_dir, who.uid, self.config.resource_name),
        )
        if isinstance(which, Unidentified):
            return grpc.StatusCode.FAILED_PRECONDITION, which.reason
        if isinstance(which, Again):
            entry = served[which.container]
            if len(served) == len(containers):  # every GPU container served: finish what a crash left
                await self._complete(who.uid, list(served.values()), pod)
            log.info("allocated %s to pod %s again (a repeated call): the same answer", ",".join(ids), entry.label)
            again: pb.ContainerAllocateResponse = pb.ContainerAllocateResponse.FromString(entry.response)
            return again
        if isinstance(who, Repeat):  # only its checkpointed answers may be given again
            return grpc.StatusCode.FAILED_PRECONDITION, (
                f"container {which.container.name} of pod {label} has no answer in the checkpoint, but the pod "
                f"is no longer waiting for an Allocate (Running, or {ANN_ALLOCATED} set) or its "
                f"{ANN_ALLOCATION} no longer passes the checks; not serving a new container"
            )
        container = which.container.name
        granted = len(who.allocation.container_gpus(container))
        if granted != len(ids):
            return grpc.StatusCode.FAILED_PRECONDITION, (
                f"kubelet asks for {len(ids)} device(s) for container {container} of pod {label}, which was "
                f"granted {granted} GPU(s)"
            )
        mode = mode_of(who.allocation, self.config.isolation)
        for g in who.allocation.container_gpus(container):
            dev = self.table.known.get(g.uuid)
            why = partition_rule(dev, mode, self.mig, self.config) if dev is not None else None
            if why is not None:
                return grpc.StatusCode.FAILED_PRECONDITION, f"pod {label} was granted {why}"
        found = grant_request(
            who.allocation, container, self.table.known, self.table.unhealthy(), self.config, label,
            self.isolation, cores_mode_of(pods, who.uid), len(containers), pods,
        )
        if isinstance(found, Refused):
            return _refusal(found)
        strategy, request = found
        prepared = await strategy.prepare(request)  # the node's side first: MIG carved, hook directory made
        if isinstance(prepared, Refused):
            return _refusal(prepared)
        if prepared.step is not None:
            self.step(prepared.step)
        grant = grant_answer(strategy, request, prepared, self.vendors)
        if isinstance(grant, Refused):
            return _refusal(grant)
        response = _to_proto(grant)
        now = format_time(self.wall_clock())
        answer = response.SerializeToString(deterministic=True)
        entry = Served(who.uid, who.namespace, who.name, tuple(sorted(ids)), answer, now, container)
        keep = {uid for p in pods if is_alive_on(p, node_name) and (uid := (p.get("metadata") or {}).get("uid"))}
        try:
            await asyncio.to_thread(self.checkpoint.record, entry, keep)
        except OSError as e:
            return grpc.StatusCode.UNAVAILABLE, f"cannot write the checkpoint {self.checkpoint.path}: {e}"
        self.step(STEP_CHECKPOINTED)
        served[container] = entry
        if len(served) == len(containers):  # the pod's last GPU container: mark it (the scheduler's cue)
            devices = [d for e in served.values() for d in e.devices]
            marker = allocated_marker(node_name, devices, now)
            problem = await self._mark_served(who.uid, who.namespace, who.name, devices, marker, who.resource_version)
            if problem is not None:
                return grpc.StatusCode.UNAVAILABLE, f"cannot record the allocation on pod {label}: {problem}"
            self.step(STEP_MARKED)
        # other vendors' cards have no NVIDIA_VISIBLE_DEVICES: the granted cards then
        log.info("allocated %s to %s: %s", ",".join(ids), entry.label,
                 grant.envs.get("NVIDIA_VISIBLE_DEVICES") or ",".join(g.uuid for g in request.gpus))
        return response

    async def housekeeping(self, reconcile: bool = False) -> bool:
        """Every isolation strategy releases what it holds for pods that no longer need it (hook
        directories of pods gone from the node, MIG instances of pods finished or gone). Where there is a
        MIG manager, first reconcile it with the node's pods (`reconcile`, at start) and switch idle GPUs
        to MIG mode where the node's label allows it, and afterwards destroy the instances idle long
        enough. True when the MIG state changed (the inventory is then published again). Under the
        Allocate lock: nothing is released while a pod is being served, and the MIG manager is not shared
        between two threads."""
        mig = self.mig
        async with self.allocate_lock:
            try:
                pods = await self.cluster.list_pods_on_node(self.config.node_name)
            except Exception as e:  # the API being away: try again next round
                log.warning("housekeeping: cannot list the pods of node %s: %s", self.config.node_name, e)
                return False
            alive = {uid for p in pods if is_alive_on(p, self.config.node_name) and (uid := p["metadata"].get("uid"))}
            claims = frozenset(self.claims())
            before = _mig_state(mig) if mig is not None else []
            switched = await self._switch_mig_mode(mig) if mig is not None else []
            try:
                if mig is not None and (reconcile or not self.mig_reconciled):
                    records = _mig_records(self.checkpoint)
                    report = await asyncio.to_thread(mig.reconcile,
                                                     {uid: records.get(uid) for uid in alive | claims})
                    self.mig_reconciled = True
                    if report.finished or report.adopted or report.lost or report.destroyed or report.kept_in_use:
                        log.info("MIG reconciled: %s", report)
                for strategy in self.isolation.values():
                    await strategy.release(pods, self.config.node_name, claims)
                if mig is not None:
                    report = await asyncio.to_thread(mig.reap)
                    if report.destroyed or report.kept_in_use:
                        log.info("MIG idle instances: destroyed %s, kept (in use) %s", report.destroyed,
                                 report.kept_in_use)
            except (MigError, OSError) as e:
                log.warning("housekeeping on node %s failed: %s", self.config.node_name, e)
            return bool(switched) or (mig is not None and _mig_state(mig) != before)

    async def _switch_mig_mode(self, mig: MigManager) -> list[str]:
        """The node's label (read on every pass, so the admin can set or remove it at any time) decides
        whether idle GPUs are switched to MIG mode; busy ones are logged and tried again next pass."""
        try:
            node = await self.cluster.get_node(self.config.node_name)
        except Exception as e:  # the API being away: keep the last answer until the next pass
            log.warning("MIG mode: cannot read node %s: %s", self.config.node_name, e)
        else:
            mig.allow_mode_switch = mode_switch_allowed((node.get("metadata") or {}).get("labels") or {})
        try:
            switched, refused = await asyncio.to_thread(mig.switch_idle_gpus)
        except MigError as e:
            log.warning("MIG mode switch on node %s failed: %s", self.config.node_name, e)
            return []
        for gpu in switched:
            log.info("MIG mode switched on for %s (node label %s)", gpu, MODE_SWITCH_LABEL)
        for why in refused:
            log.info("MIG mode not switched: %s", why.reason)
        return switched

    async def recover(self) -> None:
        """Complete what a previous run of the agent left half done: every checkpointed pod that is still
        alive on this node and had all its GPU containers served gets its marker (until then the scheduler
        counts it as waiting, and it stays a candidate of later calls); entries of pods gone or finished
        are dropped. A pod with GPU containers still to serve is left as it is (kubelet calls for them).
        Other pods are never written."""
        async with self.allocate_lock:
            try:
                pods = await self._read()
            except Exception as e:  # the API being down must not stop the agent; a repeat completes later
                log.warning("could not complete the checkpoint of node %s at start: %s", self.config.node_name, e)
                return
            alive = {
                uid: p for p in pods if is_alive_on(p, self.config.node_name) and (uid := p["metadata"].get("uid"))
            }
            try:
                await asyncio.to_thread(self.checkpoint.prune, set(alive))
            except OSError as e:
                log.warning("could not rewrite the checkpoint %s: %s", self.checkpoint.path, e)
            for uid in sorted(self.checkpoint.pods() & set(alive)):
                containers = gpu_containers(alive[uid])
                served = by_container(containers, self.checkpoint.for_pod(uid))
                if len(served) == len(containers):
                    await self._complete(uid, list(served.values()), alive[uid])

    async def _complete(self, uid: str, served: list[Served], pod: Obj) -> None:
        """Step 4 for a pod whose every GPU container has its answer fixed in the checkpoint, unless it is
        marked already; a failure is logged (the answers stand, and the next repeat or restart tries again)."""
        meta = pod.get("metadata") or {}
        label = f"{meta.get('namespace', 'default')}/{meta.get('name', '?')}"
        if ANN_ALLOCATED not in (meta.get("annotations") or {}):
            devices = [d for e in served for d in e.devices]
            marker = allocated_marker(self.config.node_name, devices, max(e.time for e in served))
            namespace, name = served[0].namespace, served[0].name
            problem = await self._mark_served(uid, namespace, name, devices, marker, meta.get("resourceVersion"))
            if problem is not None:
                log.warning("could not mark pod %s as served: %s", label, problem)

    async def _mark_served(
        self, uid: str, namespace: str, name: str, devices: list[str], marker: str, resource_version: str | None
    ) -> str | None:
        """Write `gpupool.io/allocated` on the pod we identified, conditional on its resourceVersion, so a
        pod deleted and re-created under the same name in between is never marked. A 409 from an unrelated
        update (status) is re-read and retried while it is still the same, unserved pod."""
        rv = resource_version
        for _ in range(5):
            try:
                await self.cluster.patch_pod_annotations(namespace, name, {ANN_ALLOCATED: marker}, rv)
                return None
            except Conflict:
                try:
                    pod = await self.cluster.get_pod(namespace, name)
                except ApiError as e:
                    return str(e)
                meta = pod.get("metadata") or {}
                if meta.get("uid") != uid:
                    return f"the pod was replaced by another with uid {meta.get('uid')}"
                if ANN_ALLOCATED in (meta.get("annotations") or {}):
                    return _already_marked(meta["annotations"][ANN_ALLOCATED], devices)
                rv = meta.get("resourceVersion")
            except ApiError as e:
                return str(e)
        return "the pod kept changing (repeated conflicts)"


def in_partition_mode(dev: DeviceInfo, mig: MigManager | None) -> bool:
    """Whether card `dev` serves its partitions only: an NVIDIA GPU in MIG mode, a card the node's MIG manager
    holds partitions of (MIG instances, AMD partitions, Ascend vNPUs; idle ones too, until reaped), or an AMD /
    Ascend card of a partitionable model where the node's label lets the agent partition idle cards (the DRA
    driver publishes such a card as its partitions: gpupool.agent.devices.partitions). Read from the manager's
    records, not the vendor's library: ListAndWatch asks every second, and the manager calls the library
    from other threads under the Allocate lock."""
    if dev.mig_enabled:
        return True
    if mig is None:
        return False
    if any(e.gpu == dev.uuid for e in tuple(mig.entries)):
        return True
    backend = mig.backend
    return isinstance(backend, PartitionMigBackend) and backend.partition_mode and vendor_model(dev.model) is not None


def partition_rule(dev: DeviceInfo, mode: str | None, mig: MigManager | None, config: AgentConfig) -> str | None:
    """The device plugin's one rule for a card in partition mode, every vendor: it is handed out only as one of
    its partitions, and only where this plugin serves that vendor's partitions to pods (NVIDIA's MIG; AMD and
    Ascend partitions are carved for DRA claims only, gpupool.agent.isolation.vendors.served_modes). Returns why
    a pod of isolation `mode` (None: any pod, what ListAndWatch asks) cannot have `dev`; None when it can."""
    if not in_partition_mode(dev, mig):
        return None
    if dev.vendor != NVIDIA and IsolationMode.MIG not in served_modes(dev.vendor, config):
        return (f"{dev.vendor} card {dev.uuid}, which is in partition mode (its partitions are carved for DRA "
                "claims only): the device plugin hands it out neither whole nor shared until its last partition "
                "is destroyed")
    if mode is None or mode == IsolationMode.MIG:
        return None
    return (f"GPU {dev.uuid} under isolation {mode}, but the GPU is in MIG mode: it serves MIG instances "
            "(isolation mig) only")


def _refusal(refused: Refused) -> tuple[grpc.StatusCode, str]:
    """A refusal worth a retry (a daemon restarting, the node not reconciled yet) is UNAVAILABLE."""
    return (grpc.StatusCode.UNAVAILABLE if refused.retry else grpc.StatusCode.FAILED_PRECONDITION), refused.reason


def _mig_state(mig: MigManager) -> list[tuple[str, str, int, str, str | None, str | None]]:
    return sorted((e.gpu, e.profile, e.start, e.state, e.pod, e.uuid) for e in mig.entries)


def _mig_records(checkpoint: Checkpoint) -> dict[str, str]:
    """Pod UID -> the MIG device its checkpointed answer names (what a restarted MIG manager reconciles with)."""
    out: dict[str, str] = {}
    for e in checkpoint.entries.values():
        answer = pb.ContainerAllocateResponse.FromString(e.response)
        cdi = [c.name.partition("=")[2] for c in answer.cdi_devices]
        for device in [*answer.envs.get("NVIDIA_VISIBLE_DEVICES", "").split(","), *cdi]:
            if device.startswith("MIG-"):
                out[e.pod_uid] = device
    return out


def _already_marked(text: str, devices: list[str]) -> str | None:
    """None when the marker on the pod names these very devices (written by an earlier, interrupted run)."""
    try:
        marked = json.loads(text).get("devices")
    except (ValueError, AttributeError):
        marked = None
    if isinstance(marked, list) and {str(d) for d in marked} == set(devices):
        return None
    return "the pod was already served by another Allocate"


def _to_proto(grant: ContainerGrant) -> pb.ContainerAllocateResponse:
    return pb.ContainerAllocateResponse(
        envs=grant.envs,
        mounts=[
            pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in grant.mounts
        ],
        # non-NVIDIA cards' device nodes (none on NVIDIA: the answer stays what it was)
        devices=[pb.DeviceSpec(container_path=d.container_path, host_path=d.host_path, permissions=d.permissions)
                 for d in grant.devices],
        annotations=grant.annotations,
        cdi_devices=[pb.CDIDevice(name=n) for n in grant.cdi_devices],
    )


class PluginServer:
    """The grpc.aio server on the plugin's unix socket; restartable (kubelet deletes the socket)."""

    def __init__(self, service: DevicePluginService, socket_path: Path) -> None:
        self.service = service
        self.socket_path = socket_path
        self._server: grpc.aio.Server | None = None
        self.starts = 0

    async def start(self) -> None:
        await self.stop(grace=None)  # a restart follows a kubelet restart: its calls are dead already
        self.socket_path.unlink(missing_ok=True)  # a stale socket from a previous run blocks the bind
        server = grpc.aio.server()
        pb_grpc.add_DevicePluginServicer_to_server(self.service, server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        await server.start()
        self._server = server
        self.starts += 1

    async def stop(self, grace: float | None = 0.2) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(grace)

    def socket_ok(self) -> bool:
        return self._server is not None and self.socket_path.exists()


async def register(config: AgentConfig, timeout_s: float = 5.0) -> None:
    """Call kubelet's Registration.Register; raises grpc.aio.AioRpcError when kubelet refuses."""
    target = f"unix://{config.kubelet_socket_path}"
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.RegistrationStub(channel)
        await stub.Register(
            pb.RegisterRequest(
                version=API_VERSION,
                endpoint=config.socket_name,
                resource_name=config.resource_name,
                options=pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True),
            ),
            timeout=timeout_s,
        )
