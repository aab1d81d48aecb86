"""Which vendor's devices a grant hands out, and which isolation modes a vendor's cards are served in (issue 40).

The one place a grant looks at `DeviceInfo.vendor`:
- NVIDIA cards: nothing here changes the answer (NVIDIA_VISIBLE_DEVICES or CDI names, as gpupool.agent.isolation
  .grant always gave them);
- any other vendor's cards: the container is handed the vendor's `ContainerDevices` (gpupool.agent.devices.vendor)
  for each granted card: its device nodes (DeviceSpecs in the device plugin's answer, deviceNodes in a claim's
  CDI spec, each at its `renames` path inside) and environment (ASCEND_VISIBLE_DEVICES, ...), and no
  NVIDIA_VISIBLE_DEVICES.

Where the devices come from (`devices_source`): with `backend: fake` the fake's own provider
(gpupool.agent.devices.fake.FakeContainerDevices: environment only, since a testbed host has no /dev/kfd or
/dev/davinci*); otherwise the vendor object `gpupool agent` built for its backend (AmdVendor, AscendVendor),
which it hands the Agent as `VendorDevices` and the Agent hands whatever builds answers (the device plugin, the
DRA driver). It is passed, not kept here, so two agents' objects in one process (tests) never see each other's.

Isolation modes per vendor (`served_modes`), what this agent does today:
- AMD: whole cards (none), and shares held by the HIP library (hook: libgpupool_hip.so preloaded, the same
  limits file as the CUDA library) where that library is installed on the node; without it hook shares are
  refused with the reason. Memory is capped as on NVIDIA. Compute shares are CU partitions: the agent gives each
  share of p % its own floor(p x CUs / 100) compute units of the card (gpupool.core.cu_masks) in cu_masks.v1
  beside limits.v1, and the library applies that mask to every HSA queue of the container. Hard for the CUs (two
  shares of a card never share one), soft for memory bandwidth and caches (still shared); not work-conserving
  (a pod cannot use another's idle CUs); one CU of granularity (0.33 % of an MI300X). `amd_cu_masks` below
  says which CUs and how the holders are known.
- Ascend: whole cards only. gpupool has no memory or compute limiter for CANN programs, so a hook or mps share
  of an Ascend card is refused (the scheduler and webhook never send one: this is the second line).
- No vendor but NVIDIA has MPS.
- Hardware partitions (isolation mig, every vendor's hardware-partition mode): AMD compute/memory partitions and
  Ascend vNPUs are carved for DRA claims of partition devices (the MIG class) by the node's MIG manager over the
  vendor's partition library (gpupool.agent.devices.partitions), and the container is handed that partition's
  devices (`vendor_part` with the partition). A device-plugin pod asking isolation mig of such a card is refused:
  its allocation is planned and answered as a whole card there (claims path only).
A whole card asked for in a mode the vendor has no use for (the agent's default `hook`, say) is served as a
whole card (isolation none): there is nothing to hold it to.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Protocol

from gpupool.agent.config import AgentConfig
from gpupool.agent.devices.discovery import DeviceInfo, DiscoveryError
from gpupool.agent.devices.fake import FakeContainerDevices
from gpupool.agent.devices.vendor import ContainerDevices, Partition
from gpupool.agent.isolation.base import DeviceNode, GrantRequest, Refused
from gpupool.agent.state.hookdir import (
    CU_MASKS_FILE,
    HIP_LIBRARY,
    POD_FILE,
    CuMask,
    claim_roots,
    hip_installed,
    hook_dirs,
    hook_paths,
    limits_dir,
    read_cu_masks,
    valid_uid,
)
from gpupool.api.counted import TERMINAL_PHASES
from gpupool.api.isolation import IsolationMode
from gpupool.core.cu_masks import CuShortage, choose_cus, geometry_for
from gpupool.core.vendors import AMD, ASCEND, ISOLATION_OF_VENDOR, NVIDIA, card_model


class ContainerDevicesSource(Protocol):
    """What a grant needs of a vendor: the devices and environment a container gets for one card."""

    def container_devices(self, device: DeviceInfo, partition: Partition | None = None) -> ContainerDevices: ...


# The agent's vendor objects by vendor name (one agent serves one backend: at most one entry).
VendorDevices = Mapping[str, ContainerDevicesSource]
NO_VENDOR_DEVICES: VendorDevices = MappingProxyType({})  # none: only a fake backend's cards get devices


def devices_source(config: AgentConfig, vendor: str, sources: VendorDevices) -> ContainerDevicesSource | None:
    """Who says what a container gets for a card of `vendor` on this node (None: nobody can)."""
    if config.backend == "fake":
        return FakeContainerDevices(vendor)
    return sources.get(vendor)


def request_vendor(request: GrantRequest) -> str | Refused:
    """The vendor of the container's cards; a container is handed one vendor's cards."""
    vendors = sorted({request.devices[g.uuid].vendor for g in request.gpus})
    if len(vendors) != 1:
        return Refused(f"pod {request.pod_label}: container {request.container} was granted cards of several "
                       f"vendors ({', '.join(vendors)}); a container is handed one vendor's cards")
    return vendors[0]


# --- modes ---------------------------------------------------------------------------------------------------
def served_modes(vendor: str, config: AgentConfig, claim: bool = False) -> frozenset[IsolationMode]:
    """The isolation modes this agent serves a non-NVIDIA vendor's cards in, for a DRA claim (`claim`) or a
    device-plugin pod (the module's docstring says why). What a vendor's cards can hold at all is the catalogue's
    (gpupool.core.vendors.ISOLATION_OF_VENDOR, the table the scheduler places by); this node narrows it: hook
    only where the vendor's library is installed (AMD: libgpupool_hip.so), partitions only for DRA claims."""
    modes = {IsolationMode(m) for m in ISOLATION_OF_VENDOR.get(vendor, frozenset({IsolationMode.NONE.value}))}
    if vendor == AMD and not hip_installed(config.hook_root):
        modes.discard(IsolationMode.HOOK)
    if not claim and vendor != NVIDIA:  # NVIDIA's device plugin carves MIG instances for pods itself
        modes.discard(IsolationMode.MIG)
    return frozenset(modes)


def _why_not(vendor: str, mode: str, config: AgentConfig) -> str:
    if mode == IsolationMode.MPS:
        return "MPS is NVIDIA's; no other vendor's cards have it"
    if mode == IsolationMode.MIG:
        return (f"{vendor} hardware partitions (compute partitions, vNPUs) are carved for DRA claims of partition "
                "devices only (the MIG class); a device-plugin pod is served whole cards")
    if mode == IsolationMode.HOOK and vendor == AMD:
        return (f"the HIP memory cap ({HIP_LIBRARY}) is not installed on node {config.node_name} (the package was "
                "built without it, or it could not be copied under the hook root); nothing would hold the share")
    if mode == IsolationMode.HOOK:
        return (f"gpupool has no memory or compute limiter for {vendor} cards; they are served whole"
                + (" or as vNPUs" if vendor == ASCEND else ""))
    return f"the {vendor} cards of this node are not served in it"


def vendor_mode(request: GrantRequest, mode: str) -> str | Refused:
    """The mode the container is served in on its vendor's cards: `mode` itself (always on NVIDIA), `none` for
    whole cards asked for in a mode the vendor has no use for, or why the share cannot be served."""
    vendor = request_vendor(request)
    if isinstance(vendor, Refused) or vendor == NVIDIA:
        return vendor if isinstance(vendor, Refused) else mode
    served = served_modes(vendor, request.config, request.claim)
    if mode in served:
        return mode
    if not request.shared() and mode in (IsolationMode.HOOK, IsolationMode.MPS):
        return IsolationMode.NONE
    return Refused(f"pod {request.pod_label}: isolation {mode} on {vendor} card(s) "
                   f"{', '.join(g.uuid for g in request.gpus)} of node {request.config.node_name} cannot be served: "
                   f"{_why_not(vendor, mode, request.config)}")


# --- devices ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class VendorPart:
    """What a non-NVIDIA container gets for its cards together."""

    envs: dict[str, str]
    devices: list[DeviceNode]


def merge_env(parts: Sequence[Mapping[str, str]]) -> dict[str, str]:
    """One value per variable: the cards' values comma-joined in the container's card order, each item once
    (ASCEND_VISIBLE_DEVICES 0 and 1 -> "0,1"; a flag every card sets, such as VIRTUAL, stays one item)."""
    items: dict[str, list[str]] = {}
    for env in parts:
        for key, value in env.items():
            seen = items.setdefault(key, [])
            seen += [v for v in value.split(",") if v not in seen]
    return {k: ",".join(v) for k, v in items.items()}


def vendor_part(request: GrantRequest, vendor: str, sources: VendorDevices,
                partitions: Mapping[str, Partition] | None = None) -> VendorPart | Refused:
    """The device nodes (each once, in card order) and environment of the container's `vendor` cards (as
    `sources` hands them out), or of the partition `partitions` names for a card (card UUID -> its partition)."""
    source = devices_source(request.config, vendor, sources)
    if source is None:
        return Refused(f"pod {request.pod_label}: the agent on {request.config.node_name} (backend "
                       f"{request.config.backend}) cannot hand out {vendor} cards' devices")
    nodes: dict[str, DeviceNode] = {}
    envs: list[Mapping[str, str]] = []
    for g in request.gpus:
        try:
            got = source.container_devices(request.devices[g.uuid], (partitions or {}).get(g.uuid))
        except DiscoveryError as e:  # the vendor library could not name the card's nodes now
            return Refused(f"pod {request.pod_label}: the devices of {vendor} card {g.uuid}: {e}", retry=True)
        for host in got.device_nodes:
            nodes.setdefault(host, DeviceNode(container_path=got.container_path(host), host_path=host))
        envs.append(got.env)
    return VendorPart(merge_env(envs), list(nodes.values()))


# --- AMD compute: CU masks ----------------------------------------------------------------------------------
# Which CUs a card's shares hold is what the cu_masks.v1 files of the hook directories on the node say: the agent
# keeps no other record of it. So an agent that restarts knows the holders from the same files its containers
# run under (the directories live under the hook root, which outlives the agent, like everything else a hook
# container is prepared with), and a share's CUs are free again once its directory is removed: with its pod
# (hookdir.remove_gone, at the next Allocate or the release sweep) or with its claim (the DRA driver's
# unprepare). One lock serialises choosing and writing, so two prepares cannot pick the same free CUs (the
# device plugin and the DRA driver already share the Allocate lock; this also holds for any other caller).
_CU_LOCK = threading.Lock()


class CuMaskProblem(Exception):
    """Why a share's CUs cannot be chosen or written; `retry` when the node may serve it shortly (holders leave)."""

    def __init__(self, reason: str, retry: bool = False) -> None:
        super().__init__(reason)
        self.reason, self.retry = reason, retry


def cu_lock() -> threading.Lock:
    """Held while a container's CUs are chosen and its cu_masks.v1 written (gpupool.agent.isolation.hook)."""
    return _CU_LOCK


def _directories(root: Path, live_pods: Collection[str] | None) -> list[Path]:
    """The hook directories that may hold CUs: every GPU container's of the pods in `live_pods` (of every pod
    with a directory when None), every claim's and every remote share's."""
    out: list[Path] = []
    with contextlib.suppress(FileNotFoundError):
        for entry in sorted(hook_paths(root).pods.iterdir()):
            if entry.is_dir() and valid_uid(entry.name) and (live_pods is None or entry.name in live_pods):
                out += hook_dirs(root, entry.name)
    for base in claim_roots(root):
        with contextlib.suppress(FileNotFoundError):
            out += [e for e in sorted(base.iterdir()) if e.is_dir() and valid_uid(e.name)]
    return out


def held_cus(root: Path, live_pods: Collection[str] | None, skip: Path | None = None) -> dict[str, set[int]]:
    """Per card UUID, the CUs the masks on the node hold (the directory `skip` left out: the one being
    prepared). A mask file that cannot be read is a CuMaskProblem naming it: its CUs are unknown, and guessing
    them free could hand them out twice."""
    held: dict[str, set[int]] = {}
    for directory in _directories(root, live_pods):
        if directory == skip or not (limits_dir(directory) / CU_MASKS_FILE).exists():
            continue
        for uuid, mask in masks_by_card(directory).items():
            held.setdefault(uuid, set()).update(mask.cus)
    return held


def masks_by_card(directory: Path) -> dict[str, CuMask]:
    """The masks of a hook directory's cu_masks.v1 by card UUID (its pod.json's GPUs, the same order); {}
    without the file; CuMaskProblem when it or pod.json cannot be read."""
    path = limits_dir(directory) / CU_MASKS_FILE
    try:
        masks = read_cu_masks(path)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise CuMaskProblem(f"the CU masks held on this node cannot be read ({path}: {e})", retry=True) from e
    try:
        info = json.loads((directory / POD_FILE).read_text())
    except (OSError, ValueError) as e:
        raise CuMaskProblem(f"which cards {path} masks is unknown ({directory / POD_FILE}: {e})", retry=True) from e
    gpus = [str(g) for g in info.get("gpus") or []] if isinstance(info, dict) else []
    if len(gpus) != len(masks):
        raise CuMaskProblem(f"{path} has {len(masks)} masks for the {len(gpus)} GPUs its {POD_FILE} names; "
                            "the CUs it holds are unknown", retry=True)
    return {uuid: mask for uuid, mask in zip(gpus, masks, strict=True) if mask is not None}


def card_cus(device: DeviceInfo) -> int:
    """The card's CUs: what discovery reported, else the catalogue's for its model (0: unknown)."""
    if device.sm_count > 0:
        return device.sm_count
    row = card_model(device.model)
    return row.compute_units if row is not None else 0


def live_pod_uids(request: GrantRequest) -> set[str] | None:
    """The pods whose directories' masks count: those the ledger counts (bound to the node, not terminal:
    gpupool.api.counted), and the pod being served. None for a DRA claim's prepare, which is not given the
    node's pods: every pod directory then counts, which can only hold more CUs than the ledger does, until the
    pods' clean-up removes the directories of those gone."""
    if request.claim:
        return None
    live = {request.doc.pod_uid}
    for pod in request.pods_on_node:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        if status.get("phase") not in TERMINAL_PHASES:
            live.add(str(meta.get("uid")))
    return live


# A memory-only share (gpupool.io/gpu-memory without gpu-cores) is granted 1 milli-GPU, 0.1 % (gpupool.api.pod):
# no compute slice of its own, it competes for compute. A mask of floor(0.1 % x CUs), one CU, would starve it, so
# it gets none and runs on every CU, beside the capped shares (whose CUs are exclusive among capped shares only).
MEMORY_ONLY_CORES = 0.1


def amd_cu_masks(request: GrantRequest, directory: Path) -> list[CuMask | None]:
    """The CU mask of each of the container's AMD cards, in its card order (limits.v1's): None for a card whose
    compute it is not held to (cores 100: the whole card's; a memory-only share), else its share's CUs
    (gpupool.core.cu_masks), none held by another directory's mask on the node. A mask the container's own
    directory already holds (a claim prepared again) is kept when it is still the share's size and overlaps no
    other holder: running processes applied it."""
    root = request.config.hook_root
    held = held_cus(root, live_pod_uids(request), skip=directory)
    own: dict[str, CuMask] = {}
    with contextlib.suppress(CuMaskProblem):  # an unreadable file of its own: chosen afresh and rewritten
        own = masks_by_card(directory)
    out: list[CuMask | None] = []
    for g in request.gpus:
        if g.cores >= 100 or g.cores <= MEMORY_ONLY_CORES:
            out.append(None)
            continue
        device = request.devices[g.uuid]
        cus = card_cus(device)
        if cus <= 0:
            raise CuMaskProblem(f"card {g.uuid} ({device.model}) reports no CU count and its model is not in "
                                "gpupool's catalogue, so its compute share cannot be held to a CU mask")
        others = held.get(g.uuid, set())
        geometry = geometry_for(device.model, cus)
        try:
            wanted = choose_cus(geometry, g.cores, others)
        except CuShortage as e:
            raise CuMaskProblem(f"card {g.uuid}: {e}", retry=True) from e
        kept = own.get(g.uuid)
        if kept is not None and kept.card_cus == cus and len(kept.cus) == len(wanted) and not kept.cus & others:
            wanted = kept.cus
        out.append(CuMask(cus, wanted))
    return out
