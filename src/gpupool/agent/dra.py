"""gpupool's DRA driver on the node: the kubelet plugin (registration and the DRA gRPC service, v1 and
v1beta1), claim preparation through CDI, its checkpoint, and the node's ResourceSlice (gpupool.api.dra).

Prepare (kubelet, before a pod's containers start): the claim is read from the API (kubelet passes only
namespace, name and UID; the UID must match, the allocation must be there), its results for our driver and
this node become one share per GPU (`claim_shares`), and the share is given to the container exactly like
a device-plugin grant (gpupool.agent.grant: the same checks and the same isolation strategies), except that
the answer is a CDI device `gpu.gpupool.io/claim=<claim UID>` whose spec file (in `cdi_dir`, read by the
container runtime) carries the environment and mounts: for `hook`, the library and the claim's limits file
read-only, its accounting directory read-write, so the claim's share holds whatever the container's
environment says. The answer is checkpointed before it is returned: a repeated prepare (kubelet restarted,
a timeout) gets the same answer, also from a restarted agent, without reading the claim again.

Unprepare (after the pod's containers are gone): the CDI spec, the claim's hook directory and its checkpoint
entry go. Unknown claims are already unprepared (idempotent).

Crashes: the checkpoint (gpupool.agent.checkpoint's node-state format, kind `claims`) records a claim as
`PrepareStarted` before prepare's first side effect on the node (MIG instance, hook directory and limits file,
remote directory, CDI spec) and as `PrepareCompleted`, with its answer, only after the last, before kubelet
gets the answer; unprepare records `UnprepareStarted` before it removes anything and drops the entry after. A
restarted agent (`recover`, before it serves) rolls a started prepare back (kubelet never got its answer and
asks again) and finishes a started unprepare (kubelet decided it), then sweeps CDI specs and claim directories
no entry owns (gpupool.agent.node_state). So after any crash a claim is either prepared whole or not at all,
and is never prepared twice.

The ResourceSlice is published when it changes (GPU health, node validation, discovery) and checked every
`dra_resync_s`, because kubelet deletes a driver's slices at its own start and 30 s after the driver's
socket went away; an unhealthy GPU or a node failing validation stays in the slice with a NoSchedule taint,
so claims already prepared keep their devices and new claims avoid them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from gpupool.agent.checkpoint import KIND_CLAIMS, CheckpointError, read_state, untrusted, write_atomically, write_state
from gpupool.agent.config import AgentConfig
from gpupool.agent.devices import DeviceInfo
from gpupool.agent.grant import ContainerGrant, answer, grant_request
from gpupool.agent.hookdir import claim_dir
from gpupool.agent.isolation import Isolation, MountSpec, Refused
from gpupool.agent.mig import MigManager
from gpupool.agent.node_state import sweep_claims
from gpupool.agent.port import AgentCluster
from gpupool.agent.proto import dra_v1_pb2 as v1
from gpupool.agent.proto import dra_v1_pb2_grpc as v1_grpc
from gpupool.agent.proto import dra_v1beta1_pb2 as v1beta1
from gpupool.agent.proto import dra_v1beta1_pb2_grpc as v1beta1_grpc
from gpupool.agent.proto import pluginregistration_v1_pb2 as reg
from gpupool.agent.proto import pluginregistration_v1_pb2_grpc as reg_grpc
from gpupool.agent.table import DeviceTable
from gpupool.api.allocation import AllocationDoc, GrantDoc, MigGrantDoc
from gpupool.api.counted import counted_allocation
from gpupool.api.dra import (
    ATTR_REMOTE_SERVER,
    CDI_KIND,
    DRIVER,
    REMOTE_ISOLATION,
    TAINT_NOT_READY,
    TAINT_UNHEALTHY,
    ClaimError,
    ClaimShares,
    DeviceShare,
    SliceDevice,
    claim_shares,
    counted_claim,
    device_index,
    device_name,
    remote_token,
    resource_slices,
    share_milli,
    slice_name,
)
from gpupool.api.moves import GpuRef, Move, served_from
from gpupool.api.times import format_time
from gpupool.cluster.port import NotFound
from gpupool.core.mig import mig_model
from gpupool.core.mig_request import grant_share
from gpupool.core.model import Allocation, GPUGrant, MigSlot, Node, PodRequest
from gpupool.core.state import ClusterState

log = logging.getLogger("gpupool.agent.dra")

CHECKPOINT_FILE = "dra-claims.json"
# The states of a claim's checkpoint entry (NVIDIA's DRA driver names them the same way).
PREPARE_STARTED, PREPARE_COMPLETED, UNPREPARE_STARTED = "PrepareStarted", "PrepareCompleted", "UnprepareStarted"
STATES = (PREPARE_STARTED, PREPARE_COMPLETED, UNPREPARE_STARTED)
# The steps of prepare and unprepare after which `DraDriver.step` runs (tests inject crashes there); for
# isolation mig, STEP_CARVED (gpupool.agent.isolation) follows the node's side of the grant.
STEP_PREPARE_STARTED, STEP_NODE_PREPARED, STEP_CDI_WRITTEN, STEP_PREPARE_COMPLETED = (
    "prepare-started", "node-prepared", "cdi-written", "prepare-completed")
STEP_UNPREPARE_STARTED, STEP_CDI_REMOVED, STEP_DIR_REMOVED, STEP_UNPREPARE_COMPLETED = (
    "unprepare-started", "cdi-removed", "dir-removed", "unprepare-completed")
CDI_VERSION = "0.6.0"  # env, mounts and device nodes: all this spec uses
CLAIM_CONTAINER = "claim"  # the grant's container name: one share per claim, whatever container uses it
SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")  # kubelet takes the first it knows
_LABEL_VALUE = re.compile(r"[^A-Za-z0-9_.-]+")
# Isolation remote, in the container (docs/remote.md): the forwarding library is the container's libcuda.so.1;
# the claim's token and its server's address are files of one directory, mounted whole (read-only) so that
# the address the agent rewrites when the share moves (temporary file, rename) is seen by running containers
# (a file mount would keep the old inode); on the GPU's own node the server's unix socket.
REMOTE_LIBRARY_DIR = "/usr/lib/gpupool/remote"
REMOTE_LIBRARY = f"{REMOTE_LIBRARY_DIR}/libcuda.so.1"
REMOTE_CLAIM_DIR = "/run/gpupool/remote/claim"
REMOTE_TOKEN = f"{REMOTE_CLAIM_DIR}/token"
REMOTE_SERVER_FILE = f"{REMOTE_CLAIM_DIR}/server"
REMOTE_SOCKET_DIR = "/run/gpupool/remote/socket"  # the node's unix-socket server's directory (remote.py)
REMOTE_SOCKET = f"{REMOTE_SOCKET_DIR}/server.sock"
CLAIM_REMOTE_DIR = "remote"  # in the claim's directory (claim_dir) on the pod's node: `token` and `server`
# what a slice may name as a server: the address becomes a container's environment, so nothing but this
_REMOTE_ADDRESS = re.compile(r"^tcp:[A-Za-z0-9.:\[\]-]{1,56}:\d{1,5}$")

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str

    @property
    def label(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    request: str
    pool: str
    device: str
    share_id: str | None = None


@dataclass(frozen=True, slots=True)
class PreparedClaim:
    """What prepare answered for one claim (the checkpoint's entry)."""

    uid: str
    namespace: str
    name: str
    isolation: str
    devices: tuple[PreparedDevice, ...]
    cdi_ids: tuple[str, ...]
    shares: tuple[tuple[str, int, float], ...] = ()  # (GPU UUID, memory MiB, cores %) granted: the watchdog's

    @property
    def label(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def ref(self) -> ClaimRef:
        return ClaimRef(self.namespace, self.name, self.uid)

    def to_json(self, state: str = PREPARE_COMPLETED) -> dict[str, Any]:
        return {**asdict(self), "state": state}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> PreparedClaim:
        return PreparedClaim(
            str(data["uid"]), str(data["namespace"]), str(data["name"]), str(data["isolation"]),
            tuple(PreparedDevice(str(d["request"]), str(d["pool"]), str(d["device"]), d.get("share_id"))
                  for d in data["devices"]),
            tuple(str(c) for c in data["cdi_ids"]),
            tuple((str(u), int(m), float(c)) for u, m, c in data.get("shares") or ()),
        )


@dataclass(frozen=True, slots=True)
class Pending:
    """A prepare or unprepare of a claim that started and has not completed (the checkpoint's record of it)."""

    ref: ClaimRef
    state: str  # PREPARE_STARTED or UNPREPARE_STARTED
    claim: PreparedClaim | None = None  # what an unprepare undoes

    def to_json(self) -> dict[str, Any]:
        if self.claim is not None:
            return self.claim.to_json(self.state)
        return {"uid": self.ref.uid, "namespace": self.ref.namespace, "name": self.ref.name, "state": self.state}


def claims_legacy(doc: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """dra-claims.json version 1: {"version": 1, "node", "claims": [PreparedClaim fields]}, no checksum; every
    claim in it was prepared (it had no other state)."""
    if "format" in doc or doc.get("version") != 1:
        return None
    claims = doc.get("claims")
    if not isinstance(claims, list) or not all(isinstance(c, dict) for c in claims):
        raise CheckpointError("claims is not a list of objects")
    return [{**c, "state": PREPARE_COMPLETED} for c in claims]


def decode_claims(entries: list[dict[str, Any]]) -> tuple[dict[str, PreparedClaim], dict[str, Pending]]:
    """The prepared claims and the started operations of a checkpoint's entries; CheckpointError for a bad one."""
    prepared: dict[str, PreparedClaim] = {}
    pending: dict[str, Pending] = {}
    for e in entries:
        try:
            state = e["state"]
            if state not in STATES:
                raise ValueError(f"unknown state {state!r}")
            ref = ClaimRef(str(e["namespace"]), str(e["name"]), str(e["uid"]))
            if ref.uid in prepared or ref.uid in pending:
                raise ValueError("a second entry of the claim")
            if state == PREPARE_COMPLETED:
                prepared[ref.uid] = PreparedClaim.from_json(e)
            elif state == UNPREPARE_STARTED and "isolation" in e:
                pending[ref.uid] = Pending(ref, state, PreparedClaim.from_json(e))
            else:
                pending[ref.uid] = Pending(ref, state)
        except (KeyError, TypeError, ValueError) as err:
            raise CheckpointError(f"bad entry {str(e)[:200]!r}: {err!r}") from None
    return prepared, pending


@dataclass(frozen=True, slots=True)
class Outcome:
    """One claim's answer: its devices, or why it could not be prepared (kubelet retries it)."""

    claim: PreparedClaim | None = None
    error: str = ""


# --- CDI ---------------------------------------------------------------------------------------------------


def cdi_spec(uid: str, grant: ContainerGrant) -> Obj:
    """The CDI spec of one claim: one device named by the claim's UID whose edits are the grant's."""
    mounts = [{"hostPath": m.host_path, "containerPath": m.container_path, "type": "bind",
               "options": ["bind", "ro" if m.read_only else "rw", "nosuid", "nodev"]} for m in grant.mounts]
    edits: Obj = {"env": [f"{k}={v}" for k, v in sorted(grant.envs.items())]}
    if mounts:
        edits["mounts"] = mounts
    return {"cdiVersion": CDI_VERSION, "kind": CDI_KIND, "devices": [{"name": uid, "containerEdits": edits}]}


def cdi_path(cdi_dir: Path, uid: str) -> Path:
    return cdi_dir / f"{DRIVER}-claim_{uid}.json"


def remote_claim_dir(hook_root: Path, uid: str) -> Path:
    """The host directory mounted at REMOTE_CLAIM_DIR in a remote claim's containers; ValueError for a bad UID."""
    return claim_dir(hook_root, uid) / CLAIM_REMOTE_DIR


def _write_public(path: Path, text: str) -> None:
    """One file of the claim's remote directory (its token, its server's address), readable by any user of the
    container (its processes may run as any user): the directory is mounted into this claim's containers
    only. Written whole and renamed, so a process starting while it changes reads the old or the new line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(0o755)
    write_atomically(path, text.encode())
    path.chmod(0o644)


def _write_address(directory: Path, address: str) -> bool:
    """The claim's server file says `address` (one line); True when it changed."""
    path = directory / "server"
    with contextlib.suppress(OSError):
        if path.read_text() == address + "\n":
            return False
    _write_public(path, address + "\n")
    return True


def _write_cdi(cdi_dir: Path, uid: str, spec: Obj) -> None:
    cdi_dir.mkdir(parents=True, exist_ok=True)
    write_atomically(cdi_path(cdi_dir, uid), json.dumps(spec, indent=1).encode())
    cdi_path(cdi_dir, uid).chmod(0o644)  # the runtime reads it (root, but not necessarily as the agent)


def share_grant(dev: DeviceInfo, s: DeviceShare, shares: ClaimShares) -> GrantDoc | str:
    """The grant of a claim's share `s` of the shared GPU `dev` (not a MIG partition), or why it cannot be
    one: what a `hook` claim's container is held to here, and what a remote share's server holds it to."""
    label = shares.label
    if dev.mig_enabled:
        return f"claim {label}: GPU {s.device} is in MIG mode; it serves MIG partitions only"
    memory = dev.memory_mib if s.memory_mib is None else s.memory_mib
    # 0 cores consumed: a memory-only share, which competes for compute without a cap (100)
    cores = 100 if not s.cores else s.cores
    if shares.isolation == "none" and (memory < dev.memory_mib or cores < 100):
        return (f"claim {label}: its class gives isolation none, which serves whole GPUs only, but it holds "
                f"{memory} MiB and {cores} % of {s.device}; nothing would hold it to that share")
    return GrantDoc(uuid=dev.uuid, index=dev.index, memory_mib=memory, cores=cores,
                    oversub_mib=shares.oversub_mib(memory) or None)


@dataclass(frozen=True, slots=True)
class RemoteClient:
    """What the agent needs to prepare claims of isolation remote for pods of this node."""

    key: bytes | None  # the cluster's remote key (None: not configured: such claims are refused)
    library: Path  # the forwarding library on the host, mounted as the container's libcuda.so.1
    socket: Path | None = None  # this node's GPU server's unix socket (None: this node serves no remote shares)


def _slice_device(obj: Mapping[str, Any] | None, device: str) -> Mapping[str, Any] | None:
    for d in ((obj or {}).get("spec") or {}).get("devices") or []:
        if d.get("name") == device:
            return dict(d)
    return None


async def remote_address(cluster: AgentCluster, pool: str, device: str) -> str | None:
    """The GPU server a pool's device is served by: attribute remoteServer of the device in the pool's slices
    (its node's agent writes them while its TCP server listens); None when there is none or it is not a
    tcp:HOST:PORT (it becomes a file containers read and a move's target: nothing else may pass)."""
    first = await cluster.get_slice(slice_name(pool))
    found = _slice_device(first, device)
    count = int((((first or {}).get("spec") or {}).get("pool") or {}).get("resourceSliceCount", 1) or 1)
    for k in range(1, min(count, 64)):  # bounded: a pool of at most MAX_GPUS_PER_NODE devices
        if found is not None:
            break
        found = _slice_device(await cluster.get_slice(f"{slice_name(pool)}-{k}"), device)
    attr = ((found or {}).get("attributes") or {}).get(ATTR_REMOTE_SERVER) or {}
    address = attr.get("string") if isinstance(attr, Mapping) else None
    return address if isinstance(address, str) and _REMOTE_ADDRESS.match(address) else None


# --- the driver -------------------------------------------------------------------------------------------


class DraDriver:
    """Prepares and unprepares this node's claims; publishes the node's ResourceSlice."""

    def __init__(self, config: AgentConfig, table: DeviceTable, cluster: AgentCluster,
                 strategies: Mapping[str, Isolation], wall_clock: Callable[[], float] = time.time,
                 mig: MigManager | None = None, lock: asyncio.Lock | None = None) -> None:
        self.config = config
        self.table = table
        self.cluster = cluster
        self.strategies = strategies
        self.wall_clock = wall_clock
        self.mig = mig  # carves the MIG partitions claims are prepared on (None: no GPU in MIG mode)
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
        (gpupool.agent.checkpoint says why the agent then does not start)."""
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
        (gpupool.agent.node_state.sweep_claims). Returns what it did, one line each (the agent logs them)."""
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
                partition = _partition(dev, s.mig)
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
        """A remote share: no GPU of this node; the container gets the forwarding library as libcuda.so.1 and
        the claim's remote directory: its token (derived here from the cluster's key: the tenant never
        chooses it) and the address of the server the share is served from (`_served_address`)."""
        label = ref.label
        if len(shares.devices) != 1:
            return Outcome(error=f"claim {label}: isolation remote serves one GPU share per claim; it is "
                                 f"allocated {len(shares.devices)} devices")
        s = shares.devices[0]
        remote = self.remote
        if remote is None or remote.key is None:
            return Outcome(error=f"claim {label}: isolation remote, but the agent on {self.config.node_name} has "
                                 "no remote key (agent setting remote_key_file; chart value dra.remote.enabled)")
        device = PreparedDevice(s.request, s.pool, s.device, s.share_id)
        try:
            address = await self._served_address(ref.uid, device)
        except Exception as e:  # transport or API trouble: kubelet retries the claim
            return Outcome(error=f"claim {label}: cannot read the ResourceSlice of the share's server: {e}")
        if isinstance(address, Refused):
            return Outcome(error=f"claim {label}: {address.reason}")
        envs = {"LD_LIBRARY_PATH": REMOTE_LIBRARY_DIR, "GPUPOOL_REMOTE_TOKEN_FILE": REMOTE_TOKEN,
                "GPUPOOL_REMOTE_SERVER_FILE": REMOTE_SERVER_FILE, "GPUPOOL_ISOLATION": REMOTE_ISOLATION}
        try:
            directory = remote_claim_dir(self.config.hook_root, ref.uid)
        except ValueError as e:
            return Outcome(error=f"claim {label}: {e}")
        mounts = [MountSpec(REMOTE_LIBRARY, str(remote.library), read_only=True),
                  MountSpec(REMOTE_CLAIM_DIR, str(directory), read_only=True)]
        if remote.socket is not None and self._socket_mounted(device):
            # the GPU is here: its server's unix socket, so the data never leaves the node
            mounts.append(MountSpec(REMOTE_SOCKET_DIR, str(remote.socket.parent), read_only=True))
        grant = ContainerGrant(envs=envs, mounts=mounts)
        started = await self._started(ref)
        if started is not None:
            return started
        try:
            await asyncio.to_thread(_write_public, directory / "token", remote_token(remote.key, ref.uid))
            await asyncio.to_thread(_write_address, directory, address)
            self.step(STEP_NODE_PREPARED)
            await asyncio.to_thread(_write_cdi, self.config.cdi_dir, ref.uid, cdi_spec(ref.uid, grant))
            self.step(STEP_CDI_WRITTEN)
        except OSError as e:
            return await self._rolled_back(
                ref, f"cannot write the remote directory or CDI spec of claim {label}: {e}")
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
                    if await asyncio.to_thread(_write_address, remote_claim_dir(self.config.hook_root, c.uid),
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
        grant = answer(strategy, request, made)
        if isinstance(grant, Refused):
            return grant
        try:
            await asyncio.to_thread(_write_cdi, self.config.cdi_dir, ref.uid, cdi_spec(ref.uid, grant))
        except OSError as e:
            return Refused(f"cannot write the CDI spec of claim {ref.label}: {e}", retry=True)
        self.step(STEP_CDI_WRITTEN)
        return (f"{CDI_KIND}={ref.uid}", *grant.cdi_devices)

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

    # --- the ResourceSlice --------------------------------------------------------------------------------
    def _taints(self, device: DeviceInfo, now: str) -> tuple[tuple[str, str, str], ...]:
        """The device's taints, each with the time it was first seen (kept while it lasts, so an unchanged
        slice compares equal and is not rewritten; a new fault gets a new time)."""
        wanted = []
        fault = self.table.tracker.faults.get(device.uuid)
        if fault is not None:
            wanted.append((TAINT_UNHEALTHY, _label_value(fault.reason)))
        if self.table.withheld is not None:
            wanted.append((TAINT_NOT_READY, _label_value(self.table.withheld)))
        for key in (TAINT_UNHEALTHY, TAINT_NOT_READY):
            if all(k != key for k, _ in wanted):
                self._taint_since.pop((device.uuid, key), None)
        return tuple((k, v, self._taint_since.setdefault((device.uuid, k), now)) for k, v in wanted)

    def slice_devices(self) -> list[SliceDevice]:
        now = format_time(self.wall_clock())
        known = sorted(self.table.known.values(), key=lambda d: d.index)
        server = self.remote_server()  # shared GPUs only: a remote share is never a MIG partition
        return [SliceDevice(d.index, d.uuid, d.model, d.memory_mib, d.compute_capability, d.numa_node,
                            d.nvlink_peers, mig_model(d.model) is not None, self._taints(d, now),
                            mig_mode=(mig := d.mig_enabled and self.mig is not None),
                            remote_server="" if mig else server)
                for d in known]

    async def publish(self, node_uid: str) -> bool:
        """Write the node's ResourceSlices when they differ from what the API holds (all of them, with the
        next generation: consumers read a pool only from slices of its newest generation); slices the pool
        no longer needs are deleted. True when written."""
        node = self.config.node_name
        wanted = resource_slices(node, node_uid, self.slice_devices(), self.table.discovered.driver_version, 0)
        first = await self.cluster.get_slice(wanted[0]["metadata"]["name"])
        pool = ((first or {}).get("spec") or {}).get("pool") or {}
        had = int(pool.get("resourceSliceCount", 0) or 0)
        existing = [first] + [await self.cluster.get_slice(w["metadata"]["name"]) for w in wanted[1:]]
        pairs = list(zip(existing, wanted, strict=True))
        if had == len(wanted) and all(e is not None and _content(e) == _content(w) for e, w in pairs):
            return False
        generation = max(int((((e or {}).get("spec") or {}).get("pool") or {}).get("generation", 0))
                         for e in existing) + 1
        for e, w in pairs:
            w["spec"]["pool"]["generation"] = generation
            if e is None:
                await self.cluster.create_slice(w)
            else:
                await self.cluster.patch_slice(w["metadata"]["name"], {"spec": {k: w["spec"].get(k) for k in (
                    "pool", "devices", "sharedCounters")}}, str((e.get("metadata") or {}).get("resourceVersion", "")))
        for k in range(len(wanted), had):  # an older generation had more slices (a GPU left MIG mode)
            with contextlib.suppress(NotFound):
                await self.cluster.delete_slice(f"{wanted[0]['metadata']['name']}-{k}")
        log.info("published %d ResourceSlice(s) of node %s (generation %d, %d GPU(s))", len(wanted), node,
                 generation, len(self.table.known))
        return True


def _content(obj: Mapping[str, Any]) -> tuple[Any, Any]:
    spec = obj.get("spec") or {}
    return spec.get("devices") or [], spec.get("sharedCounters") or []


def _partition(dev: DeviceInfo, slot: MigSlot) -> GrantDoc | str:
    """The grant of a MIG partition of `dev`, or why the GPU cannot serve it."""
    model = mig_model(dev.model)
    profile = model.profile(slot.profile) if model is not None else None
    if not dev.mig_enabled or model is None:
        return "the GPU is not in MIG mode"
    if profile is None or slot.start not in profile.starts:
        return f"{dev.model} has no MIG profile {slot.profile} at slice {slot.start}"
    milli, memory = grant_share(model, profile)
    return GrantDoc(uuid=dev.uuid, index=dev.index, memory_mib=memory, cores=milli / 10,
                    mig=MigGrantDoc(profile=slot.profile, start=slot.start))


def _label_value(text: str) -> str:
    """A taint value (a label value: 63 characters of [A-Za-z0-9_.-], alphanumeric at both ends)."""
    value = _LABEL_VALUE.sub("-", text)[:63].strip("-_.")
    return value or "true"


# --- gRPC: registration and the DRA service ---------------------------------------------------------------


def _refs(claims: Sequence[Any]) -> list[ClaimRef]:
    return [ClaimRef(c.namespace, c.name, c.uid) for c in claims]


class _Registration(reg_grpc.RegistrationServicer):
    def __init__(self, server: DraServer) -> None:
        self.server = server

    async def GetInfo(self, request: reg.InfoRequest, context: grpc.aio.ServicerContext) -> reg.PluginInfo:
        return reg.PluginInfo(type="DRAPlugin", name=DRIVER, endpoint=str(self.server.service_socket),
                              supported_versions=list(SERVICES))

    async def NotifyRegistrationStatus(self, request: reg.RegistrationStatus,
                                       context: grpc.aio.ServicerContext) -> reg.RegistrationStatusResponse:
        self.server.registered = request.plugin_registered
        if request.plugin_registered:
            self.server.registrations += 1
            log.info("kubelet registered DRA driver %s", DRIVER)
        else:
            log.error("kubelet refused DRA driver %s: %s", DRIVER, request.error)
        return reg.RegistrationStatusResponse()


def _prepare_reply(pb: Any, outcomes: Mapping[str, Outcome], share_ids: bool) -> Any:
    """NodePrepareResourcesResponse of the proto module `pb` (v1 or v1beta1; share IDs exist in v1 only)."""
    reply = pb.NodePrepareResourcesResponse()
    for uid, o in outcomes.items():
        if o.claim is None:
            reply.claims[uid].error = o.error
            continue
        reply.claims[uid].devices.extend(
            pb.Device(request_names=[d.request], pool_name=d.pool, device_name=d.device,
                      cdi_device_ids=list(o.claim.cdi_ids),
                      **({"share_id": d.share_id} if share_ids and d.share_id else {}))
            for d in o.claim.devices)
    return reply


def _unprepare_reply(pb: Any, errors: Mapping[str, str]) -> Any:
    reply = pb.NodeUnprepareResourcesResponse()
    for uid, error in errors.items():
        reply.claims[uid].error = error
    return reply


class _ServiceV1(v1_grpc.DRAPluginServicer):
    def __init__(self, driver: DraDriver) -> None:
        self.driver = driver

    async def NodePrepareResources(self, request: v1.NodePrepareResourcesRequest,
                                   context: grpc.aio.ServicerContext) -> v1.NodePrepareResourcesResponse:
        reply: v1.NodePrepareResourcesResponse = _prepare_reply(v1, await self.driver.prepare(_refs(request.claims)),
                                                                 share_ids=True)
        return reply

    async def NodeUnprepareResources(self, request: v1.NodeUnprepareResourcesRequest,
                                     context: grpc.aio.ServicerContext) -> v1.NodeUnprepareResourcesResponse:
        reply: v1.NodeUnprepareResourcesResponse = _unprepare_reply(
            v1, await self.driver.unprepare(_refs(request.claims)))
        return reply


class _ServiceV1beta1(v1beta1_grpc.DRAPluginServicer):
    """The same service for kubelets that speak only v1beta1 (no share IDs there)."""

    def __init__(self, driver: DraDriver) -> None:
        self.driver = driver

    async def NodePrepareResources(self, request: v1beta1.NodePrepareResourcesRequest,
                                   context: grpc.aio.ServicerContext) -> v1beta1.NodePrepareResourcesResponse:
        reply: v1beta1.NodePrepareResourcesResponse = _prepare_reply(
            v1beta1, await self.driver.prepare(_refs(request.claims)), share_ids=False)
        return reply

    async def NodeUnprepareResources(self, request: v1beta1.NodeUnprepareResourcesRequest,
                                     context: grpc.aio.ServicerContext) -> v1beta1.NodeUnprepareResourcesResponse:
        reply: v1beta1.NodeUnprepareResourcesResponse = _unprepare_reply(
            v1beta1, await self.driver.unprepare(_refs(request.claims)))
        return reply


@dataclass
class DraServer:
    """The kubelet plugin's two unix sockets: registration in plugins_registry (kubelet watches it) and the
    DRA service under plugins/<driver>/. Removing the registration socket deregisters the driver."""

    driver: DraDriver
    kubelet_root: Path
    registered: bool = False
    registrations: int = 0
    _server: grpc.aio.Server | None = field(default=None, repr=False)

    @property
    def registration_socket(self) -> Path:
        return self.kubelet_root / "plugins_registry" / f"{DRIVER}-reg.sock"

    @property
    def service_socket(self) -> Path:
        return self.kubelet_root / "plugins" / DRIVER / "dra.sock"

    async def start(self) -> None:
        for path in (self.registration_socket, self.service_socket):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.unlink(missing_ok=True)  # a stale socket of an earlier run
        server = grpc.aio.server()
        reg_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        v1_grpc.add_DRAPluginServicer_to_server(_ServiceV1(self.driver), server)
        v1beta1_grpc.add_DRAPluginServicer_to_server(_ServiceV1beta1(self.driver), server)
        # the service socket first: kubelet dials it as soon as it sees the registration socket
        server.add_insecure_port(f"unix://{self.service_socket}")
        server.add_insecure_port(f"unix://{self.registration_socket}")
        await server.start()
        self._server = server

    async def stop(self, grace: float | None = 0.2) -> None:
        self.registration_socket.unlink(missing_ok=True)
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(grace)
        self.service_socket.unlink(missing_ok=True)

    def sockets_ok(self) -> bool:
        return self.registration_socket.is_socket() and self.service_socket.is_socket()


class DraCollector(Collector):
    """gpupool_dra_* on the agent's /metrics (where the agent is a DRA driver)."""

    def __init__(self, driver: DraDriver) -> None:
        self.driver = driver

    def collect(self) -> Iterator[Any]:
        d = self.driver
        yield GaugeMetricFamily("gpupool_dra_claims_prepared", "Claims prepared on this node now",
                                value=len(d.prepared))
        summary = SummaryMetricFamily("gpupool_dra_prepare_seconds",
                                      "NodePrepareResources per claim: read, grant, CDI spec, checkpoint")
        summary.samples.extend([Sample("gpupool_dra_prepare_seconds_count", {}, d.prepare_count),
                                Sample("gpupool_dra_prepare_seconds_sum", {}, d.prepare_seconds)])
        yield summary
        yield CounterMetricFamily("gpupool_dra_prepare_errors", "Claims whose preparation failed (kubelet retries)",
                                  value=d.prepare_errors)
