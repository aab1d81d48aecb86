"""gpupool's DRA driver contract: its names, the ResourceSlice it publishes per node, and how a claim's
allocation reads back as shares (docs/claims.md).

Pure (no I/O): the agent's kubelet plugin (gpupool.agent.dra.driver) publishes `resource_slice` and prepares what
`claim_shares` reads; the chart's DeviceClasses select these devices by the names below.

Devices: one per GPU, `gpu-<index>`, shared by several claims (`allowMultipleAllocations`), with two
consumable capacities:
- `memory`: the GPU's memory; a claim that asks for none takes all of it (the request policy's default),
  so a plain claim is a whole GPU;
- `cores`: percent of the GPU's compute, 0..100; a claim that asks for none takes 0 (a memory-only share,
  which competes for compute without a cap, like a `gpupool.io/gpu-memory`-only pod).

A GPU in MIG mode is published instead as its MIG partitions (KEP-4815 partitionable devices): one device
per profile and start slot, `gpu-<index>-<profile>-<start>` (e.g. `gpu-0-3g40gb-4`), each held by one claim
and consuming counters of the GPU's counter set (one per memory slice, the compute slices, the media
engines), so that the allocator can only hand out partitions that form a valid MIG layout (core.mig); the
agent carves the instance when the claim is prepared. Counter sets live in their own ResourceSlices (the
API keeps devices and counters apart), so a node's pool may span several slices. An AMD or Ascend card in
partition mode is published the same way with its vendor's geometry (`vendor_partition_devices`: one device
per AMD mode and first XCC, `gpu-0-cpx-nps4-3`, or per vNPU template and index, `gpu-0-vir08-2`).

Isolation comes from the DeviceClass's opaque config only (`FromClass`, written by the admin): a claim's
own config (`FromClaim`) is the tenant's and never chooses it, or a tenant could ask for `none` and lift
its caps.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from gpupool.api.counted import Counted
from gpupool.api.isolation import IsolationMode
from gpupool.api.quantity import QuantityError, gpu_memory_mib, parse_quantity
from gpupool.core.geometry import vendor_model, vendor_share
from gpupool.core.mig import MigModel, MigProfile, mig_model
from gpupool.core.mig_request import grant_share
from gpupool.core.model import MILLI_PER_GPU, Allocation, GPUGrant, GPURequest, MigSlot, PodRequest
from gpupool.core.partitions import PartitionModel, PartitionProfile
from gpupool.core.state import ClusterState
from gpupool.core.vendors import PARTITION_XCP

if TYPE_CHECKING:
    from gpupool.api.moves import Move

log = logging.getLogger(__name__)

DRIVER = "gpu.gpupool.io"  # the driver name in ResourceSlices, claims' results and the kubelet registration
CDI_VENDOR = DRIVER
CDI_CLASS = "claim"
CDI_KIND = f"{CDI_VENDOR}/{CDI_CLASS}"  # one CDI device per prepared claim, named by the claim's UID
CONFIG_API_VERSION = f"{DRIVER}/v1"
CONFIG_KIND = "GpuConfig"
CAPACITY_MEMORY = "memory"
CAPACITY_CORES = "cores"
TAINT_UNHEALTHY = f"{DRIVER}/unhealthy"  # the GPU failed a health check (NoSchedule: new claims avoid it)
TAINT_NOT_READY = f"{DRIVER}/not-validated"  # the node failed validation (gpupool.agent.state.validation)
DRA_ISOLATIONS = tuple(m.value for m in (IsolationMode.HOOK, IsolationMode.MPS, IsolationMode.NONE, IsolationMode.MIG,
                                          IsolationMode.REMOTE))
DEFAULT_ISOLATION = IsolationMode.HOOK.value
MIG_ISOLATION = IsolationMode.MIG.value  # served only by MIG partitions, which are served by nothing else
# The share runs in the GPU server of the GPU's node (docs/remote.md); the pod may run on another node, whose
# agent mounts the forwarding library, the server's address and the claim's token (docs/claims.md, Remote).
REMOTE_ISOLATION = IsolationMode.REMOTE.value
ATTR_REMOTE_SERVER = "remoteServer"  # device attribute: the GPU server's address (tcp:HOST:PORT); absent: none
TYPE_GPU, TYPE_MIG = "gpu", "mig"  # the `type` attribute the chart's classes select on
# The API's limits: 64 devices in a slice once any device has taints or consumes counters (ours may do
# both), 8 counter sets in a slice.
MAX_DEVICES_PER_SLICE = 64
MAX_COUNTER_SETS_PER_SLICE = 8
MAX_GPUS_PER_NODE = 128

_DEVICE = re.compile(r"^gpu-(\d{1,3})$")
_MIG_DEVICE = re.compile(r"^gpu-(\d{1,3})-(\d{1,2})g(\d{1,4})gb(me)?-(\d{1,2})$")
_MIG_PROFILE = re.compile(r"^(\d{1,2})g\.(\d{1,4})gb(\+me)?$")
# AMD partition modes ("CPX/NPS4": gpu-0-cpx-nps4-2) and Ascend vNPU templates ("vir02_1c": gpu-0-vir02-1c-3)
_VENDOR_PROFILE = re.compile(r"^([SDQC]PX)/(NPS\d)$|^vir(\d{2})(?:_(\d)c)?(?:_(\d{1,3})g)?$")
_VENDOR_DEVICE = re.compile(
    r"^gpu-(\d{1,3})-(?:([sdqc]px)-(nps\d)|vir(\d{2})(?:-(\d)c)?(?:-(\d{1,3})g)?)-(\d{1,2})$")

Obj = dict[str, Any]


def device_name(index: int) -> str:
    return f"gpu-{index}"


def device_index(name: str) -> int | None:
    """The GPU index of one of our shared GPU devices, None for any other name (MIG partitions included)."""
    m = _DEVICE.match(name)
    return int(m.group(1)) if m else None


def mig_device_name(index: int, profile: str, start: int) -> str:
    """A hardware partition's device name (a DNS label: the profile's dot, plus, slash and underscore go):
    a MIG instance's (`gpu-1-3g40gb-4`), an AMD partition's (`gpu-0-cpx-nps4-2`), a vNPU's (`gpu-0-vir08-1`)."""
    m = _MIG_PROFILE.match(profile)
    if m is not None:
        return f"gpu-{index}-{m.group(1)}g{m.group(2)}gb{'me' if m.group(3) else ''}-{start}"
    v = _VENDOR_PROFILE.match(profile)
    if v is None:
        raise ValueError(f"partition profile {profile!r} has no device name")
    if v.group(1):
        return f"gpu-{index}-{v.group(1).lower()}-{v.group(2).lower()}-{start}"
    return (f"gpu-{index}-vir{v.group(3)}{f'-{v.group(4)}c' if v.group(4) else ''}"
            f"{f'-{v.group(5)}g' if v.group(5) else ''}-{start}")


def mig_device(name: str) -> tuple[int, MigSlot] | None:
    """(GPU index, profile and start) of one of our partition names (MIG, AMD, vNPU), None for any other name."""
    m = _MIG_DEVICE.match(name)
    if m is not None:
        return int(m.group(1)), MigSlot(f"{m.group(2)}g.{m.group(3)}gb{'+me' if m.group(4) else ''}",
                                        int(m.group(5)))
    v = _VENDOR_DEVICE.match(name)
    if v is None:
        return None
    if v.group(2):
        profile = f"{v.group(2).upper()}/{v.group(3).upper()}"
    else:
        profile = f"vir{v.group(4)}{f'_{v.group(5)}c' if v.group(5) else ''}{f'_{v.group(6)}g' if v.group(6) else ''}"
    return int(v.group(1)), MigSlot(profile, int(v.group(7)))


def counter_set_name(index: int) -> str:
    return f"gpu-{index}-mig"


@dataclass(frozen=True, slots=True)
class SliceDevice:
    """One GPU as the ResourceSlice shows it."""

    index: int
    uuid: str
    model: str
    memory_mib: int
    compute_capability: str = ""  # "9.0"
    numa_node: int = -1
    nvlink_peers: tuple[int, ...] = ()
    mig_capable: bool = False
    taints: tuple[tuple[str, str, str], ...] = ()  # (key, value, timeAdded), effect NoSchedule
    mig_mode: bool = False  # in MIG mode: published as its MIG partitions (a model gpupool knows the geometry of)
    remote_server: str = ""  # the node's GPU server (tcp:HOST:PORT) serving remote shares of it; "": none
    # An AMD card's mode while a partition of it is held ("CPX/NPS4"; "": none held): only that mode's
    # partitions are published then, since a card is in one mode at a time and counters cannot say so.
    mode_in_use: str = ""

    @property
    def mig(self) -> MigModel | None:
        """The geometry its partitions follow, None when it is published as one shared device."""
        return mig_model(self.model) if self.mig_mode else None


def _version(text: str) -> str | None:
    """A driver or CUDA version as the semantic version DRA's `version` attributes need ("9.0" -> "9.0.0")."""
    parts = re.findall(r"\d+", text)[:3]
    if not parts:
        return None
    parts += ["0"] * (3 - len(parts))
    return ".".join(str(int(p)) for p in parts)


def _attributes(d: SliceDevice, driver_version: str) -> Obj:
    attrs: Obj = {
        "type": {"string": TYPE_GPU},
        "uuid": {"string": d.uuid},
        "index": {"int": d.index},
        "model": {"string": d.model[:64]},
        "migCapable": {"bool": d.mig_capable},
    }
    cc = _version(d.compute_capability)
    if cc is not None:
        attrs["computeCapability"] = {"version": cc}
    dv = _version(driver_version)
    if dv is not None:
        attrs["driverVersion"] = {"version": dv}
    if d.numa_node >= 0:
        attrs["numaNode"] = {"int": d.numa_node}
    if d.nvlink_peers:
        attrs["nvlinkPeers"] = {"string": ",".join(map(str, sorted(d.nvlink_peers)))[:64]}
    if d.remote_server:
        attrs[ATTR_REMOTE_SERVER] = {"string": d.remote_server[:64]}
    return attrs


def _taints(d: SliceDevice) -> list[Obj]:
    return [{"key": k, "value": v[:63], "effect": "NoSchedule", "timeAdded": added} for k, v, added in d.taints[:4]]


def slice_device(d: SliceDevice, driver_version: str) -> Obj:
    """The GPU as one device that several claims share."""
    memory = f"{d.memory_mib}Mi"
    device: Obj = {
        "name": device_name(d.index),
        "attributes": _attributes(d, driver_version),
        "allowMultipleAllocations": True,
        "capacity": {
            CAPACITY_MEMORY: {"value": memory, "requestPolicy": {
                "default": memory, "validRange": {"min": "1Mi", "max": memory, "step": "1Mi"}}},
            CAPACITY_CORES: {"value": "100", "requestPolicy": {
                "default": "0", "validRange": {"min": "0", "max": "100", "step": "1"}}},
        },
    }
    if d.taints:
        device["taints"] = _taints(d)
    return device


def _mig_counters(model: MigModel) -> dict[str, int]:
    """The GPU's counters: each memory slice once, its compute slices, its one set of media engines (the
    `+me` profiles). A set of partitions whose consumption fits is exactly a valid MIG layout (placements
    at allowed starts, no shared slice, compute within the GPU's, one `+me`): tests/api/test_dra.py checks
    this against core.mig for every model."""
    counters = {f"memory-slice-{k}": 1 for k in range(model.memory_slices)}
    counters["compute-slices"] = model.compute_slices
    counters["media"] = 1
    return counters


def _consumes(model: MigModel, profile: MigProfile, start: int) -> dict[str, int]:
    used = {f"memory-slice-{k}": 1 for k in range(start, start + profile.memory_slices)}
    used["compute-slices"] = profile.compute_slices
    if profile.media:
        used["media"] = 1
    return used


def mig_devices(d: SliceDevice, model: MigModel, driver_version: str) -> list[Obj]:
    """The GPU's MIG partitions, one device per profile and allowed start. Within a profile the highest
    start comes first: kube-scheduler's allocator takes the first device that fits, and filling from the
    top keeps slice 0, where the 4g and 7g profiles must start, free longest."""
    out = []
    base = {k: v for k, v in _attributes(d, driver_version).items() if k != "migCapable"}
    for p in model.profiles:
        milli, memory = grant_share(model, p)
        for start in sorted(p.starts, reverse=True):
            device: Obj = {
                "name": mig_device_name(d.index, p.name, start),
                "attributes": {**base, "type": {"string": TYPE_MIG}, "profile": {"string": p.name},
                               "migStart": {"int": start}},
                "capacity": {CAPACITY_MEMORY: {"value": f"{memory}Mi"}, CAPACITY_CORES: {"value": str(milli // 10)}},
                "consumesCounters": [{"counterSet": counter_set_name(d.index), "counters": {
                    k: {"value": str(v)} for k, v in _consumes(model, p, start).items()}}],
            }
            if d.taints:
                device["taints"] = _taints(d)
            out.append(device)
    return out


def _vendor_counters(model: PartitionModel) -> dict[str, int]:
    """An AMD or Ascend card's counters. AMD: one per XCC. Ascend: its AI Cores and one per vNPU index, and on
    the 310P its AI CPUs and its vGroups in halves (a vir01 takes half of one, any other template a whole one:
    so two vir01 share a vGroup and its 2 AI Cores, and an odd vir01 count leaves the other half unusable, as
    gpupool.core.partitions plans it). A set of Ascend vNPUs whose consumption fits is exactly a valid layout;
    on AMD the counters hold the XCC geometry but not the card's one mode at a time (no counters can: the
    modes' partitions overlap in every way), which gpupool's allocator and the agent hold instead, and the
    slice narrows to the card's mode while a partition of it is held (`SliceDevice.mode_in_use`)
    (tests/api/test_dra_vendor_partitions.py checks both against core.partitions)."""
    if model.kind == PARTITION_XCP:
        return {f"xcc-{k}": 1 for k in range(model.slots)}
    counters = {"aicore": model.compute_units}
    counters.update({f"vnpu-{k}": 1 for k in range(model.max_partitions)})
    if model.ai_cpus:
        counters["aicpu"] = model.ai_cpus
    if model.vgroups:
        counters["vgroup-halves"] = 2 * model.vgroups
    return counters


def _vendor_consumes(model: PartitionModel, profile: PartitionProfile, start: int) -> dict[str, int]:
    if model.kind == PARTITION_XCP:
        return {f"xcc-{k}": 1 for k in range(start, start + profile.slots)}
    used = {"aicore": profile.compute_units, f"vnpu-{start}": 1}
    if model.ai_cpus:
        used["aicpu"] = profile.ai_cpus
    if model.vgroups:
        used["vgroup-halves"] = 1 if profile.compute_units < 2 else 2
    return used


def vendor_partition_devices(d: SliceDevice, model: PartitionModel, driver_version: str) -> list[Obj]:
    """An AMD or Ascend card in partition mode as its partitions: one device per profile and start (AMD: its
    allowed first XCCs; Ascend: every vNPU index), type `mig` like a MIG partition (the MIG class serves
    them: isolation mig is every vendor's hardware partition), with `profile`, `migStart` and `vendor`."""
    out = []
    base = {k: v for k, v in _attributes(d, driver_version).items() if k != "migCapable"}
    for p in model.profiles:
        if model.kind == PARTITION_XCP and d.mode_in_use and p.name != d.mode_in_use:
            continue  # the card's mode is fixed while a partition of it is held
        milli, memory = vendor_share(model, p, d.memory_mib)
        starts = p.starts if model.kind == PARTITION_XCP else tuple(range(model.max_partitions))
        for start in starts:
            device: Obj = {
                "name": mig_device_name(d.index, p.name, start),
                "attributes": {**base, "type": {"string": TYPE_MIG}, "profile": {"string": p.name},
                               "migStart": {"int": start}, "vendor": {"string": model.vendor}},
                "capacity": {CAPACITY_MEMORY: {"value": f"{memory}Mi"}, CAPACITY_CORES: {"value": str(milli // 10)}},
                "consumesCounters": [{"counterSet": counter_set_name(d.index), "counters": {
                    k: {"value": str(v)} for k, v in _vendor_consumes(model, p, start).items()}}],
            }
            if d.taints:
                device["taints"] = _taints(d)
            out.append(device)
    return out


def resource_slices(node: str, node_uid: str, devices: Sequence[SliceDevice], driver_version: str,
                    generation: int) -> list[Obj]:
    """The node's pool (named after the node), every slice owned by its Node so they go with it: the
    devices (at most MAX_DEVICES_PER_SLICE a slice), then the MIG GPUs' counter sets in slices of their own.
    The first slice is named `slice_name(node)`, the others get `-1`, `-2`, ... after it."""
    if len(devices) > MAX_GPUS_PER_NODE:
        raise ValueError(f"{len(devices)} GPUs on node {node}: gpupool publishes at most {MAX_GPUS_PER_NODE}")
    entries: list[Obj] = []
    counter_sets: list[Obj] = []
    for d in devices:
        model = d.mig
        vendor = vendor_model(d.model) if d.mig_mode and model is None else None
        if vendor is not None:
            entries += vendor_partition_devices(d, vendor, driver_version)
            counter_sets.append({"name": counter_set_name(d.index), "counters": {
                k: {"value": str(v)} for k, v in _vendor_counters(vendor).items()}})
        elif model is None:
            entries.append(slice_device(d, driver_version))
        else:
            entries += mig_devices(d, model, driver_version)
            counter_sets.append({"name": counter_set_name(d.index), "counters": {
                k: {"value": str(v)} for k, v in _mig_counters(model).items()}})
    parts: list[Obj] = [{"devices": entries[i:i + MAX_DEVICES_PER_SLICE]}
                        for i in range(0, len(entries), MAX_DEVICES_PER_SLICE)] or [{"devices": []}]
    parts += [{"sharedCounters": counter_sets[i:i + MAX_COUNTER_SETS_PER_SLICE]}
              for i in range(0, len(counter_sets), MAX_COUNTER_SETS_PER_SLICE)]
    base = slice_name(node)
    return [{
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {
            "name": base if k == 0 else f"{base}-{k}",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid,
                                 "controller": True}],
        },
        "spec": {"driver": DRIVER, "nodeName": node,
                 "pool": {"name": node, "generation": generation, "resourceSliceCount": len(parts)}, **part},
    } for k, part in enumerate(parts)]


def slice_name(node: str) -> str:
    # node names are DNS subdomains (≤253); the slice's name must be one too
    return f"{node[:230]}-{DRIVER}".replace("_", "-").lower()


# --- reading a claim's allocation ----------------------------------------------------------------------------


class ClaimError(ValueError):
    """The claim cannot be served as allocated; the message names the claim and what is wrong."""


@dataclass(frozen=True, slots=True)
class DeviceShare:
    """One device of a claim's allocation that is ours, with what the claim consumes of it."""

    request: str
    pool: str
    device: str
    index: int
    memory_mib: int | None  # None: the whole GPU's memory (no consumedCapacity: an older allocator)
    cores: int | None  # None: whole GPU; 0: no compute reserved
    share_id: str | None = None
    mig: MigSlot | None = None  # a MIG partition (memory and cores are then its profile's: None here)


@dataclass(frozen=True, slots=True)
class ClaimShares:
    namespace: str
    name: str
    uid: str
    isolation: str
    devices: tuple[DeviceShare, ...] = field(default_factory=tuple)
    oversubscription: Fraction = Fraction(1)  # the class's memory oversubscription factor (1: none)

    def oversub_mib(self, memory_mib: int) -> int:
        return oversub_mib(memory_mib, self.oversubscription)

    @property
    def label(self) -> str:
        return f"{self.namespace}/{self.name}"


def oversub_mib(memory_mib: int, factor: Fraction) -> int:
    """MiB beyond a share of `memory_mib` that a class's oversubscription `factor` lets it allocate from
    host memory (rounded down)."""
    return int(memory_mib * (factor - 1))


def _class_isolation(configs: Sequence[Mapping[str, Any]], request: str, label: str) -> str | None:
    """The isolation a DeviceClass config of our driver names for `request` (None: none names it)."""
    found = None
    for c in configs:
        opaque = c.get("opaque") or {}
        if c.get("source") != "FromClass" or opaque.get("driver") != DRIVER:
            continue
        requests = c.get("requests") or []
        if requests and request not in requests and request.split("/")[0] not in requests:
            continue
        params = opaque.get("parameters") or {}
        iso = params.get("isolation") if isinstance(params, Mapping) else None
        if iso not in DRA_ISOLATIONS:
            raise ClaimError(f"claim {label}: its DeviceClass config names isolation {iso!r} (use "
                             f"{', '.join(DRA_ISOLATIONS)})")
        found = str(iso)
    return found


# The interception library spills what exceeds the cap to managed memory: in the container (hook), or in the
# GPU server's worker on the GPU's node (remote). MPS, MIG and none have no library in the way.
OVERSUBSCRIBED_ISOLATIONS = (IsolationMode.HOOK.value, REMOTE_ISOLATION)
OVERSUBSCRIPTION = "memoryOversubscription"  # GpuConfig parameter of a class: "1.5" lets a share allocate 1.5x
MAX_OVERSUBSCRIPTION = Fraction(4)


def class_oversubscription(configs: Sequence[Mapping[str, Any]], label: str) -> Fraction:
    """The memory oversubscription the class configs of our driver (source FromClass, or a DeviceClass's
    own config) grant: a factor from 1 (none) to MAX_OVERSUBSCRIPTION. A claim's own config never counts."""
    found = Fraction(1)
    for c in configs:
        opaque = c.get("opaque") or {}
        params = opaque.get("parameters") or {}
        if c.get("source", "FromClass") != "FromClass" or opaque.get("driver") != DRIVER \
                or not isinstance(params, Mapping) or OVERSUBSCRIPTION not in params:
            continue
        raw = params[OVERSUBSCRIPTION]
        try:
            factor = Fraction(str(raw))
        except (ValueError, ZeroDivisionError):
            factor = Fraction(0)
        if not 1 <= factor <= MAX_OVERSUBSCRIPTION or isinstance(raw, bool):
            raise ClaimError(f"claim {label}: its DeviceClass config names {OVERSUBSCRIPTION} {raw!r} (a factor "
                             f"from 1 to {MAX_OVERSUBSCRIPTION}, as a string such as \"1.5\")")
        found = factor
    return found


def _consumed(result: Mapping[str, Any], label: str) -> tuple[int | None, int | None]:
    consumed = result.get("consumedCapacity") or {}
    memory = cores = None
    try:
        if CAPACITY_MEMORY in consumed:
            memory = gpu_memory_mib(consumed[CAPACITY_MEMORY], f"consumedCapacity.{CAPACITY_MEMORY}")
        if CAPACITY_CORES in consumed:
            amount, _ = parse_quantity(consumed[CAPACITY_CORES], f"consumedCapacity.{CAPACITY_CORES}")
            if amount.denominator != 1 or not 0 <= amount <= 100:
                raise QuantityError(f"consumedCapacity.{CAPACITY_CORES}={consumed[CAPACITY_CORES]!r} is not a "
                                    "whole percent 0..100")
            cores = int(amount)
    except QuantityError as e:
        raise ClaimError(f"claim {label}: device {result.get('device')!r}: {e}") from None
    return memory, cores


def claim_shares(claim: Mapping[str, Any], driver: str = DRIVER) -> ClaimShares:
    """What an allocated claim holds of our devices. Raises ClaimError when it is not allocated or names
    devices we never publish; the isolation is the class's (one per claim: a container sees one library)."""
    meta = claim.get("metadata") or {}
    label = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimError(f"claim {label} is not allocated")
    devices_part = allocation.get("devices") or {}
    configs = devices_part.get("config") or []
    shares: list[DeviceShare] = []
    isolations: set[str] = set()
    for r in devices_part.get("results") or []:
        if r.get("driver") != driver:
            continue
        name = str(r.get("device", ""))
        partition = mig_device(name)
        index = device_index(name) if partition is None else partition[0]
        if index is None:
            raise ClaimError(f"claim {label}: device {name!r} is not one gpupool publishes")
        if r.get("adminAccess"):
            raise ClaimError(f"claim {label}: admin access to {name} is not served (it would bypass the shares)")
        request = str(r.get("request", ""))
        isolation = _class_isolation(configs, request, label) or DEFAULT_ISOLATION
        if (partition is not None) != (isolation == MIG_ISOLATION):
            raise ClaimError(f"claim {label}: device {name} with isolation {isolation}: MIG partitions are served "
                             "only by isolation mig, and isolation mig only by MIG partitions (check the "
                             "DeviceClass's selector)")
        isolations.add(isolation)
        if partition is not None:
            shares.append(DeviceShare(request, str(r.get("pool", "")), name, index, None, None, r.get("shareID"),
                                      partition[1]))
            continue
        memory, cores = _consumed(r, label)
        shares.append(DeviceShare(request, str(r.get("pool", "")), name, index, memory, cores, r.get("shareID")))
    if len(isolations) > 1:
        raise ClaimError(f"claim {label} mixes isolations {', '.join(sorted(isolations))}; one claim is served "
                         "by one isolation")
    isolation = isolations.pop() if isolations else DEFAULT_ISOLATION
    factor = class_oversubscription(configs, label)
    if factor != 1 and isolation not in OVERSUBSCRIBED_ISOLATIONS:
        raise ClaimError(f"claim {label}: {OVERSUBSCRIPTION} is served by isolations "
                         f"{' and '.join(OVERSUBSCRIBED_ISOLATIONS)} only (its class gives {isolation})")
    return ClaimShares(str(meta.get("namespace", "")), str(meta.get("name", "")), str(meta.get("uid", "")),
                       isolation, tuple(shares), factor)


def remote_token(key: bytes, claim_uid: str) -> str:
    """The token a remote claim's client presents to the GPU server: HMAC-SHA256 of the claim's UID under the
    cluster's remote key (a Secret only the agents mount). The GPU node's agent and the pod node's agent each
    derive it on their own, so no secret travels through an API object a tenant can read."""
    return hmac.new(key, claim_uid.encode(), hashlib.sha256).hexdigest()


# --- claims in the ledger -----------------------------------------------------------------------------------

CLAIM_CONTAINERS = "(claim)"  # what the pool views show where a pod would name its GPU containers
# The ledger key of the second GPU a remote share is counted on while it moves (`ready`: both hold it). Claim
# UIDs are UUIDs, so no other entry can have it.
MOVING_SUFFIX = "/moving"


def counted_claim(claim: Mapping[str, Any], state: ClusterState, move: Move | None = None) -> tuple[Counted, ...]:
    """The capacity an allocated claim holds on our devices, in the same terms as a pod's (so the scheduler's
    ledger, its recomputation from API objects, the queues and the pool views count both forms alike): one
    `Counted`, or none when it holds none. The claim names GPUs by index; `state` gives their UUIDs and sizes.
    A memory-only share (0 cores) counts 1 milli, as a memory-only pod does.

    A remote share with a move (`move`, its entry of gpupool.api.moves) counts on the GPUs that hold it
    (`holding`): its allocation's GPU until a move starts, then the move's source, the target too while
    `ready`. The GPU it is served from keeps the claim's UID; the other one, counted only while the share
    travels, is keyed `uid + MOVING_SUFFIX`."""
    # imported when used: gpupool.api.moves reads device names from this module
    from gpupool.api.moves import GpuRef, holding, served_from

    meta = claim.get("metadata") or {}
    uid = str(meta.get("uid", ""))
    if not (claim.get("status") or {}).get("allocation"):
        return ()
    try:
        shares = claim_shares(claim)
    except ClaimError as e:
        log.warning("%s", e)
        return ()
    if not shares.devices:
        return ()
    nodes = {s.pool for s in shares.devices}
    if len(nodes) != 1:
        log.warning("claim %s holds devices of several pools (%s); not counted", shares.label, ", ".join(sorted(nodes)))
        return ()
    node = nodes.pop()
    if move is not None and (shares.isolation != REMOTE_ISOLATION or len(shares.devices) != 1):
        # only a one-GPU remote share is served by a GPU server that can hand it over (gpupool migrate refuses
        # others); an entry for anything else moves nothing
        log.warning("claim %s: its move entry is ignored (not a one-GPU remote share)", shares.label)
        move = None
    if move is None:
        return (_counted_on(shares, uid, node, shares.devices, state),)
    placed = GpuRef(node, shares.devices[0].index)
    served = served_from(move, placed)
    return tuple(_counted_on(shares, uid if ref == served else uid + MOVING_SUFFIX, ref.node,
                             [replace(shares.devices[0], index=ref.index)], state)
                 for ref in dict.fromkeys(holding(move, placed)))  # a GPU counts a share once


def share_milli(cores: float | None) -> int:
    """The compute a claim's share holds on a GPU, in milli-GPUs: its `cores` percent (None: the whole GPU);
    a memory-only share (0 cores) counts 1 milli, as a memory-only pod does, so that it still takes a place
    on the GPU."""
    return MILLI_PER_GPU if cores is None else max(1, round(cores * 10))


def _counted_on(shares: ClaimShares, uid: str, node: str, devices: Sequence[DeviceShare],
                state: ClusterState) -> Counted:
    """`devices` of the claim counted on `node` under `uid`."""
    grants = []
    for s in devices:
        gpu = state.gpu_at(node, s.index)
        uuid, card_mib = (gpu.uuid, gpu.memory_mib) if gpu is not None else ("", 0)  # unknown: stranded
        milli = share_milli(s.cores)
        memory = card_mib if s.memory_mib is None else s.memory_mib
        if s.mig is not None:  # a partition holds its profile's share, as a device-plugin MIG pod does
            model = mig_model(gpu.model) if gpu is not None else None
            profile = model.profile(s.mig.profile) if model is not None else None
            vendor = vendor_model(gpu.model) if gpu is not None and model is None else None
            part = vendor.profile(s.mig.profile) if vendor is not None else None
            if model is not None and profile is not None:
                milli, memory = grant_share(model, profile)
            elif vendor is not None and part is not None and gpu is not None:  # AMD partition, Ascend vNPU
                milli, memory = vendor_share(vendor, part, gpu.memory_mib)
        grants.append(GPUGrant(uuid=uuid, index=s.index, milli=milli, memory_mib=memory, mig=s.mig))
    first = grants[0]
    # the guaranteed share on the GPUs; what oversubscription may add lives in the node's memory
    request = PodRequest(key=uid, memory_mib=sum(shares.oversub_mib(g.memory_mib) for g in grants),
                         gpu=GPURequest(count=len(grants), milli=first.milli, memory_mib=first.memory_mib))
    allocation = Allocation(pod=uid, node=node, grants=tuple(grants), policy="dra")
    mps = shares.isolation == IsolationMode.MPS
    return Counted(uid, shares.label, request, allocation, mps, containers=CLAIM_CONTAINERS, claim=True)


# --- gpupool as the allocator of its classes' claims (gpupool.scheduler.claims) -------------------------------

# The scheduling gate the webhook puts on pods whose claims gpupool places; the scheduler removes it once
# it has allocated them (or found nothing of its own to allocate).
SCHEDULING_GATE = f"{DRIVER}/allocate"
DELETE_PROTECTION = "resource.kubernetes.io/delete-protection"  # the finalizer an allocator puts on a claim


def class_isolation(device_class: Mapping[str, Any]) -> str | None:
    """The isolation one of gpupool's DeviceClasses gives (its opaque config), None for any other class."""
    for c in (device_class.get("spec") or {}).get("config") or []:
        opaque = c.get("opaque") or {}
        params = opaque.get("parameters") or {}
        if opaque.get("driver") == DRIVER and isinstance(params, Mapping) and params.get("isolation") in DRA_ISOLATIONS:
            return str(params["isolation"])
    return None


@dataclass(frozen=True, slots=True)
class ClaimAsk:
    """What one request of a claim asks of gpupool's devices, in the terms placement uses."""

    request: str
    device_class: str
    count: int
    memory_mib: int | None  # None: the request policy's default, the whole GPU's memory
    cores: int  # 0: none reserved (a memory-only share)
    mig_profile: str | None = None  # a MIG partition of this profile (the MIG class), instead of a share


class NotOurs(ValueError):
    """The claim asks for something gpupool's allocator does not decide (kube-scheduler's allocator does)."""


def claim_asks(claim: Mapping[str, Any], gpupool_classes: Mapping[str, str]) -> list[ClaimAsk]:
    """The requests of an unallocated claim, when every one is a plain ask of one of gpupool's classes
    (`gpupool_classes`: class name -> isolation), or one partition of the MIG class whose profile the one
    selector gpupool reads names. Raises NotOurs, saying why, for anything else: other classes, other CEL
    selectors (evaluated only by kube-scheduler), constraints, prioritized lists, `All`, admin access; such
    claims are left to kube-scheduler's allocator."""
    label = f"{(claim.get('metadata') or {}).get('namespace', '')}/{(claim.get('metadata') or {}).get('name', '')}"
    devices = (claim.get("spec") or {}).get("devices") or {}
    if devices.get("constraints") or devices.get("config"):
        raise NotOurs(f"claim {label} has constraints or its own config")
    asks = []
    for r in devices.get("requests") or []:
        exactly = r.get("exactly")
        if not exactly:
            raise NotOurs(f"claim {label}: request {r.get('name')!r} is a prioritized list")
        cls = str(exactly.get("deviceClassName", ""))
        if cls not in gpupool_classes:
            raise NotOurs(f"claim {label}: class {cls!r} is not one of gpupool's")
        if gpupool_classes[cls] == MIG_ISOLATION:
            asks.append(_mig_ask(r, exactly, cls, label))
            continue
        if exactly.get("selectors") or exactly.get("adminAccess") or exactly.get("tolerations") \
                or exactly.get("allocationMode", "ExactCount") != "ExactCount":
            raise NotOurs(f"claim {label}: request {r.get('name')!r} has selectors, tolerations, admin access "
                          "or allocation mode All")
        wanted = (exactly.get("capacity") or {}).get("requests") or {}
        try:
            memory = gpu_memory_mib(wanted[CAPACITY_MEMORY], CAPACITY_MEMORY) if CAPACITY_MEMORY in wanted else None
            cores_q = parse_quantity(wanted[CAPACITY_CORES], CAPACITY_CORES)[0] if CAPACITY_CORES in wanted else 0
        except QuantityError as e:
            raise NotOurs(f"claim {label}: {e}") from None
        # the slice's request policy: whole MiB, whole percent (the allocator rounds up to the next step)
        cores = int(-(-cores_q // 1))
        if not 0 <= cores <= 100 or (memory is not None and memory <= 0):
            raise NotOurs(f"claim {label}: request {r.get('name')!r} asks for more than one GPU has")
        asks.append(ClaimAsk(str(r.get("name", "")), cls, int(exactly.get("count", 1)), memory, cores))
    if not asks:
        raise NotOurs(f"claim {label} requests nothing")
    return asks


# The one selector gpupool reads itself: a MIG claim naming its profile. Any other CEL is kube-scheduler's.
_PROFILE_SELECTOR = re.compile(r'^\s*device\.attributes\["' + re.escape(DRIVER) +
                               r'"\]\.profile\s*==\s*"(\d{1,2}g\.\d{1,4}gb(?:\+me)?|[SDQC]PX/NPS\d|vir\d{2}(?:_\dc)?)"'
                               r'\s*$')


def _mig_ask(request: Mapping[str, Any], exactly: Mapping[str, Any], cls: str, label: str) -> ClaimAsk:
    """A request of the MIG class that gpupool places: one partition of a profile named by the selector
    `device.attributes["gpu.gpupool.io"].profile == "<profile>"` and nothing else."""
    selectors = exactly.get("selectors") or []
    found = _PROFILE_SELECTOR.match(str(((selectors[0] if len(selectors) == 1 else {}).get("cel") or {})
                                        .get("expression", "")))
    if found is None or exactly.get("adminAccess") or exactly.get("tolerations") or exactly.get("capacity") \
            or exactly.get("allocationMode", "ExactCount") != "ExactCount" or int(exactly.get("count", 1)) != 1:
        raise NotOurs(f"claim {label}: request {request.get('name')!r} of the MIG class is not one partition of a "
                      "profile named by the one selector gpupool reads")
    return ClaimAsk(str(request.get("name", "")), cls, 1, None, 0, mig_profile=found.group(1))


@dataclass(frozen=True, slots=True)
class Placed:
    """One device gpupool allocated to a request: a share (with what it consumes and its share ID) or a MIG
    partition (neither: the device is the claim's alone)."""

    ask: ClaimAsk
    device: str
    memory_mib: int | None = None
    cores: int | None = None
    share_id: str | None = None


def allocation_status(node: str, devices: Sequence[Placed],
                      class_configs: Mapping[str, Sequence[Mapping[str, Any]]], pod_node: str | None = None) -> Obj:
    """status.allocation for a claim gpupool allocated `devices` on `node`; each request gets its class's
    config (source FromClass), as kube-scheduler copies it. The claim's pods may run only on `pod_node`
    (default: `node`; another node for a remote share, whose devices stay the GPU node's)."""
    results: list[Obj] = []
    for d in devices:
        result: Obj = {"request": d.ask.request, "driver": DRIVER, "pool": node, "device": d.device}
        if d.share_id is not None:
            result["shareID"] = d.share_id
            result["consumedCapacity"] = {CAPACITY_MEMORY: f"{d.memory_mib}Mi", CAPACITY_CORES: str(d.cores)}
        results.append(result)
    configs = []
    for ask in {d.ask.request: d.ask for d in devices}.values():
        configs += [{"source": "FromClass", "requests": [ask.request], "opaque": dict(c["opaque"])}
                    for c in class_configs.get(ask.device_class, ()) if c.get("opaque")]
    return {"devices": {"results": results, "config": configs},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [pod_node or node]}]}]}}


# --- device-plugin manifests served through claims (the webhook's `dra` namespace policy) ---------------------

# the chart's classes (and mig.gpu.gpupool.io for MIG partitions, which a device-plugin manifest never becomes)
CLASS_OF_ISOLATION = {IsolationMode.HOOK.value: DRIVER, IsolationMode.MPS.value: f"mps.{DRIVER}",
                      IsolationMode.NONE.value: f"whole.{DRIVER}"}
TEMPLATE_CLAIM = "gpupool"  # the pod's resourceClaims entry (and container claim) the webhook writes
_TEMPLATE = re.compile(r"^gpupool-(hook|mps|none)-(\d{1,2})x(whole|\d{1,7}mi)-(\d{1,3})c$")


def template_name(isolation: str, count: int, memory_mib: int | None, cores: int) -> str:
    """The ResourceClaimTemplate the webhook points a translated pod at: its name says all it asks, so the
    scheduler can make it on first use (`template_for`) and every pod of the same shape shares it."""
    memory = "whole" if memory_mib is None else f"{memory_mib}mi"
    return f"gpupool-{isolation}-{count}x{memory}-{cores}c"


def template_for(name: str, namespace: str) -> Obj | None:
    """The ResourceClaimTemplate a `template_name` stands for, None for any other name (or an impossible
    share: the webhook never writes one, a tenant may)."""
    m = _TEMPLATE.match(name)
    if m is None:
        return None
    isolation, count, memory, cores = m.group(1), int(m.group(2)), m.group(3), int(m.group(4))
    whole = memory == "whole" and cores == 100
    if not (1 <= count <= 16 and 0 <= cores <= 100) or (isolation == IsolationMode.NONE and not whole):
        return None
    capacity: dict[str, str] = {CAPACITY_CORES: str(cores)}
    if memory != "whole":
        capacity[CAPACITY_MEMORY] = memory.replace("mi", "Mi")
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/managed-by": "gpupool"}},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": CLASS_OF_ISOLATION[isolation], "count": count,
            "capacity": {"requests": capacity}}}]}}},
    }
