"""NVIDIA as one implementation of the vendor seam (gpupool.agent.devices.vendor; issue 40).

Nothing NVIDIA does changes here: discovery is the NVML backend (nvml.py; the fake backend where the agent
runs with `backend: fake`), partitions are MIG instances through the MIG driver the MIG manager already uses
(mig.py's MigBackend: NVML's mig_nvml.py, or fake_mig.py), and what a container is handed is what
gpupool.agent.isolation.grant always handed an NVIDIA container. That last part lives here, once:
`nvidia_visible` is the answer grant.py gives, and `NvidiaVendor.container_devices` is the same answer for one
card or one MIG instance, so the two cannot drift (tests/agent/devices/test_nvidia_vendor.py holds them
equal).

What an NVIDIA container is handed (the NVIDIA Container Toolkit picks the device nodes, so there are none
here):
- without CDI: NVIDIA_VISIBLE_DEVICES = the card's UUID, or the MIG device's `MIG-...` UUID for a MIG
  instance; several cards comma-joined in the container's card order;
- with CDI (`cdi: true` in the agent's settings): the CDI device `<cdi_kind>=<that UUID>` per card, and
  NVIDIA_VISIBLE_DEVICES=void, so an image default of `all` cannot widen the grant.

MIG as partitions (`MigPartitions`): the profiles are the card's MIG model's (gpupool.core.mig, smallest
first), a partition is a GPU instance with its full-size compute instance and is named by its MIG UUID; a GPU
instance whose compute instance is missing (half-made, or its compute instance destroyed by hand) is listed
as `gi:<id>` so its slices are not taken for free, and can be destroyed by that name. Creating is GPU
instance then compute instance (the GPU instance is removed again when the compute instance fails, so a
failed create leaves nothing behind), destroying is the reverse. NVML's answers map to PartitionError codes
one to one; NO_PERMISSION (an agent without the privilege to change MIG) reads NOT_SUPPORTED, and an answer
NVML gives no name to reads INVALID_ARGUMENT (as AMD's adapter does), the original kept in the message.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpupool.agent.devices.discovery import DeviceInfo, DiscoveryBackend
from gpupool.agent.devices.mig import BackendInstance, MigBackend, MigError
from gpupool.agent.devices.vendor import ContainerDevices, Partition, PartitionBackend, PartitionError
from gpupool.api.isolation import IsolationMode
from gpupool.core.mig import MigModel, MigProfile, mig_model
from gpupool.core.vendors import NVIDIA

VISIBLE_ENV = "NVIDIA_VISIBLE_DEVICES"
CDI_VOID = "void"  # the toolkit's "no device" value: with CDI the devices come from the CDI names alone
RESOURCE_NAME = "nvidia.com/gpu"
HALF_MADE_PREFIX = "gi:"  # the partition id of a GPU instance without its compute instance

# NVML answers a PartitionBackend caller can act on keep their name; the rest are folded (module docstring).
_PARTITION_CODES = frozenset({"IN_USE", "INSUFFICIENT_RESOURCES", "INVALID_ARGUMENT", "NOT_FOUND", "NOT_SUPPORTED"})
_FOLDED = {"NO_PERMISSION": "NOT_SUPPORTED"}


@dataclass(frozen=True, slots=True)
class NvidiaVisible:
    """What an NVIDIA container is handed for its devices together: NVIDIA_VISIBLE_DEVICES and, with CDI, the
    CDI device names (in the container's card order)."""

    env: dict[str, str]
    cdi_devices: list[str]


def nvidia_visible(visible: Sequence[str], cdi_kind: str | None) -> NvidiaVisible:
    """The NVIDIA part of a grant for the device IDs `visible` (card UUIDs or MIG UUIDs, in card order);
    `cdi_kind` None: the agent hands devices by environment, else by CDI names of that kind."""
    if cdi_kind is not None:
        return NvidiaVisible({VISIBLE_ENV: CDI_VOID}, [f"{cdi_kind}={u}" for u in visible])
    return NvidiaVisible({VISIBLE_ENV: ",".join(visible)}, [])


def _code(error: MigError) -> str:
    return error.code if error.code in _PARTITION_CODES else _FOLDED.get(error.code, "INVALID_ARGUMENT")


def partition_error(error: MigError) -> PartitionError:
    """The PartitionError a MIG driver's answer reads as (module docstring)."""
    code = _code(error)
    text = str(error).removeprefix(f"{error.code}: ")
    return PartitionError(code, text if code == error.code else f"NVML {error.code}: {text}")


class MigPartitions:
    """MIG instances as the seam's partitions (PartitionBackend) over a MIG driver (mig.py's MigBackend)."""

    def __init__(self, driver: MigBackend) -> None:
        self._driver = driver

    def _model(self, gpu_uuid: str) -> MigModel | None:
        try:
            return mig_model(self._driver.model(gpu_uuid))
        except MigError as e:
            raise partition_error(e) from None

    def _profile(self, gpu_uuid: str, name: str) -> tuple[MigModel, MigProfile]:
        model = self._model(gpu_uuid)
        if model is None:
            raise PartitionError("NOT_SUPPORTED", f"{gpu_uuid}: its model has no MIG geometry")
        profile = model.profile(name)
        if profile is None:
            raise PartitionError("INVALID_ARGUMENT", f"{gpu_uuid} ({model.name}) has no MIG profile {name!r} "
                                 f"(has {', '.join(p.name for p in model.profiles)})")
        return model, profile

    def _instances(self, gpu_uuid: str) -> list[BackendInstance]:
        try:
            return self._driver.instances(gpu_uuid)
        except MigError as e:
            raise partition_error(e) from None

    def _partition(self, gpu_uuid: str, model: MigModel | None, inst: BackendInstance) -> Partition:
        p = model.profile(inst.profile) if model is not None else None
        return Partition(
            gpu_uuid=gpu_uuid,
            partition_id=inst.uuid if inst.uuid is not None else f"{HALF_MADE_PREFIX}{inst.gi_id}",
            profile=inst.profile,
            start=inst.start,
            memory_mib=p.memory_mib if p is not None else 0,
            compute_units=(p.sm_count or 0) if p is not None else 0,  # 0: the SM count is not in the table
        )

    # --- PartitionBackend ------------------------------------------------------------------------------
    def profiles(self, gpu_uuid: str) -> tuple[str, ...]:
        model = self._model(gpu_uuid)
        return () if model is None else tuple(p.name for p in model.profiles)

    def partitions(self, gpu_uuid: str) -> tuple[Partition, ...]:
        model = self._model(gpu_uuid)
        return tuple(self._partition(gpu_uuid, model, i)
                     for i in sorted(self._instances(gpu_uuid), key=lambda i: (i.start, i.gi_id)))

    def busy(self, gpu_uuid: str) -> bool:
        try:
            return self._driver.busy(gpu_uuid)
        except MigError as e:
            raise partition_error(e) from None

    def create(self, gpu_uuid: str, profile: str, start: int) -> Partition:
        model, _ = self._profile(gpu_uuid, profile)
        try:  # a start the profile does not have, or one taken: the driver's INVALID_ARGUMENT / INSUFFICIENT_...
            gi = self._driver.create_gpu_instance(gpu_uuid, profile, start)
        except MigError as e:
            raise partition_error(e) from None
        try:
            uuid = self._driver.create_compute_instance(gpu_uuid, gi)
        except MigError as e:
            # no compute instance, so nothing can run on the GPU instance: take it back rather than leave
            # slices taken by a partition nobody was handed (if that fails too, `partitions` shows it as gi:<id>)
            with contextlib.suppress(MigError):
                self._driver.destroy_gpu_instance(gpu_uuid, gi)
            raise partition_error(e) from None
        return self._partition(gpu_uuid, model, BackendInstance(gi, profile, start, uuid))

    def destroy(self, gpu_uuid: str, partition_id: str) -> None:
        found = [i for i in self._instances(gpu_uuid)
                 if i.uuid == partition_id or (i.uuid is None and partition_id == f"{HALF_MADE_PREFIX}{i.gi_id}")]
        if not found:
            raise PartitionError("NOT_FOUND", f"{gpu_uuid} has no MIG instance {partition_id}")
        inst = found[0]
        try:
            if inst.uuid is not None:
                self._driver.destroy_compute_instance(gpu_uuid, inst.gi_id)
            self._driver.destroy_gpu_instance(gpu_uuid, inst.gi_id)
        except MigError as e:
            raise partition_error(e) from None


class NvidiaVendor:
    """NVIDIA cards on a node (Vendor).

    `discovery`: the NVML backend (or the fake backend); `partitioning`: its MIG driver as partitions, None
    when the backend has no MIG driver (a fake backend without `mig: true` cards). Isolation modes: whole cards
    (none), the interception library (hook), MPS and MIG. `remote` is not among them: it is a share of a GPU
    on another node, not a way of holding this node's cards. `cdi_kind`: the agent's `cdi_kind` when it runs
    with `cdi: true`, else None (grant.py's rule, module docstring).
    """

    name = NVIDIA
    resource_name = RESOURCE_NAME

    def __init__(self, discovery: DiscoveryBackend | None = None, cdi_kind: str | None = None,
                 mig: MigBackend | None = None) -> None:
        if discovery is None:
            from gpupool.agent.devices.nvml import NvmlBackend  # starts NVML: only when no backend is given

            discovery = NvmlBackend()
        self._discovery = discovery
        self._cdi_kind = cdi_kind
        self._mig = mig
        self._partitions: MigPartitions | None = None

    @property
    def discovery(self) -> DiscoveryBackend:
        return self._discovery

    @property
    def partitioning(self) -> PartitionBackend | None:
        if self._partitions is None:
            driver = self._mig
            if driver is None:
                make: Any = getattr(self._discovery, "mig_backend", None)
                driver = make() if make is not None else None
            if driver is None:
                return None
            self._partitions = MigPartitions(driver)
        return self._partitions

    def isolation_modes(self) -> frozenset[IsolationMode]:
        return frozenset({IsolationMode.NONE, IsolationMode.HOOK, IsolationMode.MPS, IsolationMode.MIG})

    def container_devices(self, device: DeviceInfo, partition: Partition | None = None) -> ContainerDevices:
        """The card (or its MIG instance `partition`) as grant.py hands it: `nvidia_visible` of its one ID."""
        visible = nvidia_visible([partition.partition_id if partition is not None else device.uuid], self._cdi_kind)
        return ContainerDevices((), dict(visible.env), cdi_devices=tuple(visible.cdi_devices))
