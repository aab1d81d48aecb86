"""gpupool's DRA driver on the node: the kubelet plugin (registration and the DRA gRPC service, v1 and
v1beta1), claim preparation through CDI, its checkpoint, and the node's ResourceSlice (gpupool.api.dra).

Prepare (kubelet, before a pod's containers start): the claim is read from the API (kubelet passes only
namespace, name and UID; the UID must match, the allocation must be there), its results for our driver and
this node become one share per GPU (`claim_shares`), and the share is given to the container exactly like
a device-plugin grant (gpupool.agent.isolation.grant: the same checks and the same isolation strategies), except that
the answer is a CDI device `gpu.gpupool.io/claim=<claim UID>` whose spec file (in `cdi_dir`, read by the
container runtime) carries the environment and mounts: for `hook`, the library and the claim's limits file
read-only, its accounting directory read-write, so the claim's share holds whatever the container's
environment says. The answer is checkpointed before it is returned: a repeated prepare (kubelet restarted,
a timeout) gets the same answer, also from a restarted agent, without reading the claim again.

Unprepare (after the pod's containers are gone): the CDI spec, the claim's hook directory and its checkpoint
entry go. Unknown claims are already unprepared (idempotent).

Crashes: the checkpoint (gpupool.agent.state.checkpoint's node-state format, kind `claims`) records a claim as
`PrepareStarted` before prepare's first side effect on the node (MIG instance, hook directory and limits file,
remote directory, CDI spec) and as `PrepareCompleted`, with its answer, only after the last, before kubelet
gets the answer; unprepare records `UnprepareStarted` before it removes anything and drops the entry after. A
restarted agent (`recover`, before it serves) rolls a started prepare back (kubelet never got its answer and
asks again) and finishes a started unprepare (kubelet decided it), then sweeps CDI specs and claim directories
no entry owns (gpupool.agent.state.node_state). So after any crash a claim is either prepared whole or not at all,
and is never prepared twice.

The ResourceSlice is published when it changes (GPU health, node validation, discovery) and checked every
`dra_resync_s`, because kubelet deletes a driver's slices at its own start and 30 s after the driver's
socket went away; an unhealthy GPU or a node failing validation stays in the slice with a NoSchedule taint,
so claims already prepared keep their devices and new claims avoid them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from gpupool.agent.config import AgentConfig
from gpupool.agent.devices.discovery import DeviceInfo
from gpupool.agent.devices.mig import MigError, MigManager
from gpupool.agent.devices.partitions import PartitionMigBackend, vendor_partition_grant
from gpupool.agent.devices.table import DeviceTable
from gpupool.agent.devices.vendor import Partition
from gpupool.agent.dra.cdi import cdi_path, cdi_spec, write_cdi
from gpupool.agent.dra.claims import (
    CHECKPOINT_FILE,
    PREPARE_STARTED,
    UNPREPARE_STARTED,
    ClaimRef,
    Outcome,
    Pending,
    PreparedClaim,
    PreparedDevice,
    claims_legacy,
    decode_claims,
    partition_grant,
)
from gpupool.agent.dra.slices import SlicePublishing
from gpupool.agent.isolation.base import GrantRequest, Isolation, Prepared, Refused
from gpupool.agent.isolation.grant import CLAIM_CONTAINER, ContainerGrant, answer, grant_request, share_grant
from gpupool.agent.isolation.remote import (
    REMOTE_SOCKET,
    RemoteClient,
    RemoteIsolation,
    remote_claim_dir,
    write_address,
)
from gpupool.agent.isolation.vendors import NO_VENDOR_DEVICES, VendorDevices, request_vendor, vendor_part
from gpupool.agent.port import AgentCluster
from gpupool.agent.remote.client import remote_address
from gpupool.agent.state.checkpoint import KIND_CLAIMS, CheckpointError, read_state, untrusted, write_state
from gpupool.agent.state.hookdir import claim_dir
from gpupool.agent.state.node_state import sweep_claims
from gpupool.api.allocation import AllocationDoc, GrantDoc
from gpupool.api.counted import counted_allocation
from gpupool.api.dra import (
    ATTR_REMOTE_SERVER,
    CDI_KIND,
    REMOTE_ISOLATION,
    ClaimError,
    ClaimShares,
    claim_shares,
    counted_claim,
    device_index,
    device_name,
    share_milli,
)
from gpupool.api.isolation import IsolationMode
from gpupool.api.moves import GpuRef, Move, served_from
from gpupool.cluster.port import NotFound
from gpupool.core.model import Allocation, GPUGrant, Node, PodRequest
from gpupool.core.state import ClusterState
from gpupool.core.vendors import NVIDIA

log = logging.getLogger("gpupool.agent.dra")

# The steps of prepare and unprepare after which `DraDriver.step` runs (tests inject crashes there); for
# isolation mig, STEP_CARVED (gpupool.agent.isolation.base) follows the node's side of the grant.
STEP_PREPARE_STARTED, STEP_NODE_PREPARED, STEP_CDI_WRITTEN, STEP_PREPARE_COMPLETED = (
    "prepare-started", "node-prepared", "cdi-written", "prepare-completed")
STEP_UNPREPARE_STARTED, STEP_CDI_REMOVED, STEP_DIR_REMOVED, STEP_UNPREPARE_COMPLETED = (
    "unprepare-started", "cdi-removed", "dir-removed", "unprepare-completed")

Obj = dict[str, Any]


class DraDriver(SlicePublishing):
    """Prepares and unprepares this node's claims; publishes the node's ResourceSlice."""

    def __init__(self, config: AgentConfig, table: DeviceTable, cluster: AgentCluster,
                 strategies: Mapping[str, Isolation], wall_clock: Callable[[], float] = time.time,
                 mig: MigManager | None = None, lock: asyncio.Lock | None = None,
                 vendors: VendorDevices = NO_VENDOR_DEVICES) -> None:
        self.config = config
        self.table = table
        self.cluster = cluster
        self.strategies = strategies
        self.wall_clock = wall_clock
        self.mig = mig  # carves the MIG partitions claims are prepared on (None: no GPU in MIG mode)
        self.vendors = vendors  # the node's vendor object: what a container gets for a non-NVIDIA card
        self.path = config.checkpoint_path / CHECKPOINT_FILE
        self.prepared: dict[str, PreparedClaim] = {}  # completed: what kubelet was answered
        self.pending: dict[str, Pending] = {}  # started and not completed (only between start and `recover`)
        self.step: Callable[[str], None] = lambda step: None  # after each step of prepare/unprepare (tests)
        # prepares and unprepares one at a time (the checkpoint is one file); the agent passes the lock its
        # housekeeping holds, so a MIG instance is never carved and reaped at once
        self._lock = lock or asyncio.Lock()
        self._taint_since: dict[tuple[str, str], str] = {}  # (GPU UUID, key) -> timeAdded, stable across publishes
        self.remote: RemoteClient | None = None  # isolation remote for pods here (None: such claims are refused)
        # the address of this node's GPU server while it serves ("": none or down), published on shared GPUs
        self.remote_server: Callable[[], str] = lambda: ""
        # the moves of remote shares by claim UID (gpupool.api.moves; the agent's MovesBook): where the
        # prepared remote claims' server files point
        self.moves: Callable[[], Mapping[str, Move]] = lambda: {}
        self.prepare_count = 0  # claims prepared (answered from the checkpoint: not counted)
        self.prepare_seconds = 0.0  # their total time, from the claim's read to the checkpoint's write
        self.prepare_errors = 0

    # --- checkpoint ---------------------------------------------------------------------------------------
    def load(self) -> None:
        """Read the checkpoint (none: nothing prepared). Raises CheckpointError when it cannot be trusted
        (gpupool.agent.state.checkpoint says why the agent then does not start)."""
        entries = read_state(self.path, KIND_CLAIMS, self.config.node_name, claims_legacy)
        try:
            self.prepared, self.pending = decode_claims(entries)
        except CheckpointError as e:
            raise untrusted(self.path, str(e)) from None

    def _save(self, prepared: dict[str, PreparedClaim], pending: dict[str, Pending] | None = None) -> None:
        pending = self.pending if pending is None else pending
        entries = [c.to_json() for c in prepared.values()] + [p.to_json() for p in pending.values()]
        write_state(self.path, KIND_CLAIMS, self.config.node_name, sorted(entries, key=lambda e: str(e["uid"])))
        self.prepared, self.pending = prepared, pending

    def _begin(self, pending: Pending) -> None:
        """Record that a prepare or unprepare of the claim starts (before its first side effect)."""
        prepared = {u: c for u, c in self.prepared.items() if u != pending.ref.uid}
        self._save(prepared, {**self.pending, pending.ref.uid: pending})

    def _end(self, uid: str, prepared: PreparedClaim | None) -> None:
        """Record the claim prepared (`prepared`) or gone (None), ending what `_begin` recorded."""
        rest = {u: c for u, c in self.prepared.items() if u != uid}
        self._save(rest if prepared is None else {**rest, uid: prepared},
                   {u: p for u, p in self.pending.items() if u != uid})

    def _undo(self, uid: str) -> None:
        """Remove what prepare makes on the node for the claim: its CDI spec first (the runtime finds no device
        whose files are gone), its directory (limits file, accounting, remote files), its MIG instance (idle
        from now: reused by the next claim of its profile, or reaped). Idempotent."""
        with contextlib.suppress(ValueError):  # not a UID: nothing of it can be on disk
            cdi_path(self.config.cdi_dir, uid).unlink(missing_ok=True)
            self.step(STEP_CDI_REMOVED)
            shutil.rmtree(claim_dir(self.config.hook_root, uid), ignore_errors=True)
            self.step(STEP_DIR_REMOVED)
        if self.mig is not None and self.mig.holder(uid) is not None:
            self.mig.release(uid)  # one half made when the agent stopped: the start's MIG reconciliation decides

    async def recover(self) -> list[str]:
        """At start, before serving: roll back the prepares a crash interrupted (kubelet never got their
        answer; it asks again and gets a whole new prepare), finish the unprepares it interrupted (kubelet
        decided those), then remove the CDI specs and claim directories no prepared claim owns
        (gpupool.agent.state.node_state.sweep_claims). Returns what it did, one line each (the agent logs them)."""
        async with self._lock:
            done = []
            for uid, p in sorted(self.pending.items()):
                await asyncio.to_thread(self._undo, uid)
                what = "prepare rolled back" if p.state == PREPARE_STARTED else "unprepare finished"
                done.append(f"claim {p.ref.label} ({uid}): {what} (interrupted by a stop of the agent)")
            if self.pending:
                await asyncio.to_thread(self._save, dict(self.prepared), {})
            swept = await asyncio.to_thread(sweep_claims, self.config.cdi_dir, self.config.hook_root,
                                            set(self.prepared))
            done += [f"removed the CDI spec of claim {u}, which no prepared claim owns" for u in swept.cdi_specs]
            done += [f"removed the hook directory of claim {u}, which no prepared claim owns" for u in swept.claim_dirs]
            done += [f"removed {t}, left by an interrupted write" for t in swept.temporary]
            return done

    # --- prepare ------------------------------------------------------------------------------------------
    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, Outcome]:
        async with self._lock:
            out = {}
            for c in claims:
                cached = c.uid in self.prepared
                started = time.monotonic()
                out[c.uid] = outcome = await self._prepare_one(c)
                if outcome.claim is None:
                    self.prepare_errors += 1
                elif not cached:
                    self.prepare_count += 1
                    self.prepare_seconds += time.monotonic() - started
            return out

    async def _prepare_one(self, ref: ClaimRef) -> Outcome:
        done = self.prepared.get(ref.uid)
        if done is not None:  # kubelet asks again: the same answer, without reading the claim again
            return Outcome(done)
        try:
            claim = await self.cluster.get_claim(ref.namespace, ref.name)
        except NotFound:
            return Outcome(error=f"claim {ref.label} not found")
        except Exception as e:  # transport or API trouble: kubelet retries the claim
            return Outcome(error=f"cannot read claim {ref.label}: {e}")
        uid = str((claim.get("metadata") or {}).get("uid", ""))
        if uid != ref.uid:
            return Outcome(error=f"claim {ref.label} is now another object (UID {uid}, kubelet asked for {ref.uid})")
        try:
            shares = claim_shares(claim)
        except ClaimError as e:
            return Outcome(error=str(e))
        if shares.isolation == REMOTE_ISOLATION:
            return await self._prepare_remote(ref, shares)
        mine = [s for s in shares.devices if s.pool == self.config.node_name]
        if len(mine) != len(shares.devices):
            return Outcome(error=f"claim {ref.label} is allocated devices of other nodes' pools; node "
                                 f"{self.config.node_name} serves only its own")
        label = f"{ref.label} (claim)"
        if self.table.withheld is not None:
            return Outcome(error=f"node {self.config.node_name} holds its GPUs back: {self.table.withheld}")
        by_index = {d.index: d for d in self.table.known.values()}
        grants: list[GrantDoc] = []
        for s in mine:
            dev = by_index.get(s.index)
            if dev is None:
                return Outcome(error=f"claim {ref.label}: node {self.config.node_name} has no GPU {s.device}")
            if s.mig is not None:
                partition = partition_grant(dev, s.mig) if dev.vendor == NVIDIA else vendor_partition_grant(dev, s.mig)
                if isinstance(partition, str):
                    return Outcome(error=f"claim {ref.label}: {s.device}: {partition}")
                grants.append(partition)
                continue
            grant = share_grant(dev, s, shares)
            if isinstance(grant, str):
                return Outcome(error=grant)
            grants.append(grant)
        if self.config.device_plugin_with_dra:
            crowded = await self._crowded(claim, ref)
            if crowded is not None:
                return Outcome(error=crowded)
        devices: tuple[PreparedDevice, ...] = tuple(
            PreparedDevice(s.request, s.pool, s.device, s.share_id) for s in mine)
        started = await self._started(ref)
        if started is not None:
            return started
        cdi_ids: tuple[str, ...] = ()
        if grants:
            made = await self._grant(ref, shares.isolation, grants, label)
            if isinstance(made, Refused):
                return await self._rolled_back(ref, made.reason)
            cdi_ids = made
        prepared = PreparedClaim(ref.uid, ref.namespace, ref.name, shares.isolation, devices, cdi_ids,
                                 tuple((g.uuid, g.memory_mib, g.cores) for g in grants))
        return await self._checkpoint(ref, prepared)

    async def _started(self, ref: ClaimRef) -> Outcome | None:
        """Record PrepareStarted before the first side effect; an Outcome when it cannot be written."""
        try:
            await asyncio.to_thread(self._begin, Pending(ref, PREPARE_STARTED))
        except OSError as e:
            return Outcome(error=f"cannot checkpoint claim {ref.label}: {e}")
        self.step(STEP_PREPARE_STARTED)
        return None

    async def _rolled_back(self, ref: ClaimRef, error: str) -> Outcome:
        """A prepare that failed after it started: what it made goes, and so does its record (a record that
        cannot be removed now is rolled back at the next start); kubelet retries the claim."""
        try:
            await asyncio.to_thread(self._undo, ref.uid)
            await asyncio.to_thread(self._end, ref.uid, None)
        except OSError as e:
            log.warning("claim %s: cannot roll back its failed prepare now (the next start does): %s", ref.label, e)
        return Outcome(error=error)

    async def _crowded(self, claim: Obj, ref: ClaimRef) -> str | None:
        """Why this node's GPUs cannot hold the claim beside what they already hold, None when they can.

        With the device plugin beside the driver, pods and claims share the GPUs. gpupool's scheduler places
        both forms against one ledger, but a claim kube-scheduler's own allocator placed (a CEL selector,
        placement off, the webhook down) was weighed against other claims only: the slice offers the whole
        GPU. So the node checks it against the shares the API says its pods hold (their allocation
        annotations, api.counted) and the claims prepared here, with the scheduler's own capacity rule
        (core.state). A refused prepare is retried by kubelet while the pod waits with the reason, where
        an over-committed GPU would give two tenants memory that is not there."""
        gpus = tuple(d.to_gpu() for d in sorted(self.table.known.values(), key=lambda d: d.index))
        state = ClusterState([Node(self.config.node_name, cpu_milli=0, memory_mib=0, gpus=gpus)])
        try:
            pods = await self.cluster.list_pods_on_node(self.config.node_name)
        except Exception as e:  # transport or API trouble: kubelet retries the claim
            return f"claim {ref.label}: cannot read the pods of node {self.config.node_name}: {e}"
        # The GPU shares alone: the node's CPU and memory are kube-scheduler's (the state has none).
        held = [(c.uid, c.allocation) for c in map(counted_allocation, pods) if c is not None]
        index = {g.uuid: g.index for g in gpus}
        for p in self.prepared.values():
            grants = tuple(GPUGrant(uuid, index[uuid], share_milli(cores), memory)
                           for uuid, memory, cores in p.shares if uuid in index)
            if grants:
                held.append((p.uid, Allocation(pod=p.uid, node=self.config.node_name, grants=grants)))
        for key, allocation in held:  # what is already there; a conflict among them is the scheduler's to report
            state.allocate(PodRequest(key=key), allocation)
        for c in counted_claim(claim, state):
            refused = state.allocate(PodRequest(key=c.uid), c.allocation)
            if refused is not None:
                return (f"claim {ref.label}: {refused} beside what this node's pods and prepared claims hold "
                        "(a GPU is never over-committed; the claim waits until they free it)")
        return None

    async def _checkpoint(self, ref: ClaimRef, prepared: PreparedClaim) -> Outcome:
        try:
            await asyncio.to_thread(self._end, ref.uid, prepared)
        except OSError as e:
            return await self._rolled_back(ref, f"cannot checkpoint claim {ref.label}: {e}")
        self.step(STEP_PREPARE_COMPLETED)
        log.info("prepared claim %s: %s (%s)", ref.label,
                 ", ".join(f"{d.pool}/{d.device}" for d in prepared.devices) or "no devices", prepared.isolation)
        return Outcome(prepared)

    async def _prepare_remote(self, ref: ClaimRef, shares: ClaimShares) -> Outcome:
        """A remote share: no GPU of this node; the strategy of isolation remote (gpupool.agent.isolation.remote)
        gives the container the forwarding library as libcuda.so.1 and the claim's remote directory: its token
        (derived here from the cluster's key: the tenant never chooses it) and the address of the server the
        share is served from (`_served_address`)."""
        label = ref.label
        if len(shares.devices) != 1:
            return Outcome(error=f"claim {label}: isolation remote serves one GPU share per claim; it is "
                                 f"allocated {len(shares.devices)} devices")
        s = shares.devices[0]
        strategy = RemoteIsolation(self.config, self.remote)
        doc = AllocationDoc(version=1, pod_uid=ref.uid, node=self.config.node_name, policy="dra",
                            isolation=REMOTE_ISOLATION, gpus=[])
        request = GrantRequest(doc, CLAIM_CONTAINER, (), {}, self.config, label, claim=True)
        refused = strategy.check(request)
        if refused is not None:
            return Outcome(error=refused.reason)
        device = PreparedDevice(s.request, s.pool, s.device, s.share_id)
        try:
            address = await self._served_address(ref.uid, device)
        except Exception as e:  # transport or API trouble: kubelet retries the claim
            return Outcome(error=f"claim {label}: cannot read the ResourceSlice of the share's server: {e}")
        if isinstance(address, Refused):
            return Outcome(error=f"claim {label}: {address.reason}")
        request = replace(request, remote_server=address, remote_socket=self._socket_mounted(device))
        mode = strategy.grant(request, Prepared())
        if isinstance(mode, Refused):
            return Outcome(error=mode.reason)
        grant = ContainerGrant(envs=mode.envs, mounts=mode.mounts)
        started = await self._started(ref)
        if started is not None:
            return started
        made = await strategy.prepare(request)  # the node's side: the claim's token and server files
        if isinstance(made, Refused):
            return await self._rolled_back(ref, made.reason)
        self.step(STEP_NODE_PREPARED)
        try:
            await asyncio.to_thread(write_cdi, self.config.cdi_dir, ref.uid, cdi_spec(ref.uid, grant))
        except OSError as e:
            return await self._rolled_back(
                ref, f"cannot write the remote directory or CDI spec of claim {label}: {e}")
        self.step(STEP_CDI_WRITTEN)
        # no local GPU: no shares for the watchdog, nothing of this node's GPUs counted as used
        return await self._checkpoint(ref, PreparedClaim(
            ref.uid, ref.namespace, ref.name, REMOTE_ISOLATION, (device,), (f"{CDI_KIND}={ref.uid}",)))

    def _socket_mounted(self, placed: PreparedDevice) -> bool:
        """Whether a remote claim's containers get this node's unix socket: their share was placed here."""
        return placed.pool == self.config.node_name and self.remote is not None and self.remote.socket is not None

    async def _served_address(self, uid: str, placed: PreparedDevice) -> str | Refused:
        """The address new client processes of the claim dial: where its share is served from now
        (gpupool.api.moves.served_from: the allocation's GPU, or a move's source or target); the unix socket
        while that is this node and the socket is mounted, else that node's TCP server from its slice."""
        index = device_index(placed.device)
        if index is None:
            return Refused(f"device {placed.device} of pool {placed.pool} is not a GPU of gpupool's")
        where = served_from(self.moves().get(uid), GpuRef(placed.pool, index))
        if where.node == self.config.node_name and self._socket_mounted(placed):
            return f"unix:{REMOTE_SOCKET}"
        address = await remote_address(self.cluster, where.node, device_name(where.index))
        if address is None:
            return Refused(f"device {device_name(where.index)} of pool {where.node} has no GPU server (no valid "
                           f"attribute {ATTR_REMOTE_SERVER} in its ResourceSlice: its node serves no remote shares, "
                           "or its server is down)")
        return address

    async def follow_moves(self) -> None:
        """Point every prepared remote claim's server file at where its share is served from now (called when
        a move changes). A server that cannot be found leaves the file as it is (logged): the share's old
        server still answers, or moves its clients."""
        async with self._lock:
            for c in list(self.prepared.values()):
                if c.isolation != REMOTE_ISOLATION or len(c.devices) != 1:
                    continue
                try:
                    address = await self._served_address(c.uid, c.devices[0])
                    if isinstance(address, Refused):
                        log.warning("claim %s: server address not updated: %s", c.label, address.reason)
                        continue
                    if await asyncio.to_thread(write_address, remote_claim_dir(self.config.hook_root, c.uid),
                                               address):
                        log.info("claim %s: new client processes connect to %s", c.label, address)
                except Exception as e:  # API or disk trouble: the next change of a move tries again
                    log.warning("claim %s: server address not updated: %s", c.label, e)

    async def _grant(self, ref: ClaimRef, isolation: str, grants: list[GrantDoc],
                     label: str) -> tuple[str, ...] | Refused:
        doc = AllocationDoc(version=1, pod_uid=ref.uid, node=self.config.node_name, policy="dra",
                            isolation=isolation, gpus=grants)
        devices: dict[str, DeviceInfo] = dict(self.table.known)
        found = grant_request(doc, CLAIM_CONTAINER, devices, self.table.unhealthy(), self.config, label,
                              self.strategies, claim=True)
        if isinstance(found, Refused):
            return found
        strategy, request = found
        made = await strategy.prepare(request)  # the node's side: MIG instance carved, hook directory and limits
        if isinstance(made, Refused):
            return made
        if made.step is not None:
            self.step(made.step)
        self.step(STEP_NODE_PREPARED)
        grant = answer(strategy, request, made, self.vendors)
        if isinstance(grant, Refused):
            return grant
        if isolation == IsolationMode.MIG:
            grant = await asyncio.to_thread(self._partition_devices, request, grant)
            if isinstance(grant, Refused):
                return grant
        try:
            await asyncio.to_thread(write_cdi, self.config.cdi_dir, ref.uid, cdi_spec(ref.uid, grant))
        except OSError as e:
            return Refused(f"cannot write the CDI spec of claim {ref.label}: {e}", retry=True)
        self.step(STEP_CDI_WRITTEN)
        return (f"{CDI_KIND}={ref.uid}", *grant.cdi_devices)

    def _partition_devices(self, request: GrantRequest, grant: ContainerGrant) -> ContainerGrant | Refused:
        """An AMD partition's or Ascend vNPU's container gets that partition's devices and environment (the
        vendor's ContainerDevices for it: its render node, its /dev/vdavinci<id>), not the whole card's that the
        common answer holds. NVIDIA's MIG answer is left as it is."""
        vendor = request_vendor(request)
        if isinstance(vendor, Refused) or vendor == NVIDIA:
            return grant if not isinstance(vendor, Refused) else vendor
        backend = self.mig.backend if self.mig is not None else None
        if not isinstance(backend, PartitionMigBackend):
            return Refused(f"claim {request.pod_label}: node {self.config.node_name} carves no {vendor} partitions")
        found: dict[str, Partition] = {}
        for g in request.gpus:
            try:
                partition = backend.partition(g.uuid, g.mig.start) if g.mig is not None else None
            except MigError as e:
                return Refused(f"claim {request.pod_label}: the partitions of card {g.uuid}: {e}", retry=True)
            if partition is None:
                return Refused(f"claim {request.pod_label}: card {g.uuid} shows no partition at "
                               f"{g.mig.start if g.mig is not None else '?'}", retry=True)
            found[g.uuid] = partition
        whole = vendor_part(request, vendor, self.vendors)
        part = vendor_part(request, vendor, self.vendors, found)
        if isinstance(whole, Refused):
            return whole
        if isinstance(part, Refused):
            return part
        envs = {k: v for k, v in grant.envs.items() if k not in whole.envs}
        return replace(grant, envs={**envs, **part.envs}, devices=part.devices)

    # --- unprepare ----------------------------------------------------------------------------------------
    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """Per claim UID, "" when it is unprepared (or never was), else what failed (kubelet retries)."""
        async with self._lock:
            out = {}
            for c in claims:
                try:
                    await asyncio.to_thread(self._unprepare_one, c)
                    out[c.uid] = ""
                except OSError as e:
                    out[c.uid] = f"cannot unprepare claim {c.label}: {e}"
            return out

    def _unprepare_one(self, ref: ClaimRef) -> None:
        """UnprepareStarted first (a claim the checkpoint knows), then the node's side, then the entry goes: a
        crash in between is finished by the next start (`recover`)."""
        uid = ref.uid
        known = self.prepared.get(uid)
        if known is not None or uid in self.pending:
            self._begin(Pending(known.ref if known is not None else ref, UNPREPARE_STARTED, known))
            self.step(STEP_UNPREPARE_STARTED)
        self._undo(uid)
        if known is not None or uid in self.pending:
            self._end(uid, None)
            self.step(STEP_UNPREPARE_COMPLETED)
            log.info("unprepared claim %s", uid)
