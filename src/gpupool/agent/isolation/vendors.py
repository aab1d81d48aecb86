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
installed here once at start (`install_vendor`). It is installed rather than passed because the composition root
builds the strategies without the vendor; one agent process serves one backend, so one source per vendor name.

Isolation modes per vendor (`served_modes`), what this agent does today:
- AMD: whole cards (none), and shares held by the HIP memory cap (hook: libgpupool_hip.so preloaded, the same
  limits file as the CUDA library) where that library is installed on the node; without it hook shares are
  refused with the reason. Compute shares on AMD are not capped (the HIP library caps memory only).
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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from gpupool.agent.config import AgentConfig
from gpupool.agent.devices.discovery import DeviceInfo, DiscoveryError
from gpupool.agent.devices.fake import FakeContainerDevices
from gpupool.agent.devices.vendor import ContainerDevices, Partition
from gpupool.agent.isolation.base import DeviceNode, GrantRequest, Refused
from gpupool.agent.state.hookdir import HIP_LIBRARY, hip_installed
from gpupool.api.isolation import IsolationMode
from gpupool.core.vendors import AMD, ASCEND, NVIDIA


class ContainerDevicesSource(Protocol):
    """What a grant needs of a vendor: the devices and environment a container gets for one card."""

    def container_devices(self, device: DeviceInfo, partition: Partition | None = None) -> ContainerDevices: ...


_INSTALLED: dict[str, ContainerDevicesSource] = {}


def install_vendor(name: str, source: ContainerDevicesSource) -> None:
    """The agent's vendor (built by `gpupool agent` for backend amdsmi or dcmi) hands out its cards' devices."""
    _INSTALLED[name] = source


def uninstall_vendor(name: str) -> None:
    _INSTALLED.pop(name, None)


def devices_source(config: AgentConfig, vendor: str) -> ContainerDevicesSource | None:
    """Who says what a container gets for a card of `vendor` on this node (None: nobody can)."""
    if config.backend == "fake":
        return FakeContainerDevices(vendor)
    return _INSTALLED.get(vendor)


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
    device-plugin pod (the module's docstring says why)."""
    modes = {IsolationMode.NONE}
    if vendor == AMD and hip_installed(config.hook_root):
        modes.add(IsolationMode.HOOK)
    if claim and vendor in (AMD, ASCEND):
        modes.add(IsolationMode.MIG)
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


def vendor_part(request: GrantRequest, vendor: str,
                partitions: Mapping[str, Partition] | None = None) -> VendorPart | Refused:
    """The device nodes (each once, in card order) and environment of the container's `vendor` cards, or of
    the partition `partitions` names for a card (card UUID -> the partition carved for the container)."""
    source = devices_source(request.config, vendor)
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
