"""NVIDIA as one implementation of the vendor seam: MIG instances as partitions over the fake MIG driver, and
what a container is handed for a card or a MIG instance, which must be exactly what grant.py hands out."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.agent.config import AgentConfig
from gpupool.agent.devices.discovery import DeviceInfo, Discovered
from gpupool.agent.devices.fake import FakeBackend
from gpupool.agent.devices.fake_mig import FakeMigDriver
from gpupool.agent.devices.mig import MigError
from gpupool.agent.devices.nvidia import (
    MigPartitions,
    NvidiaVendor,
    nvidia_visible,
    partition_error,
)
from gpupool.agent.devices.vendor import ContainerDevices, Partition, PartitionBackend, PartitionError, Vendor
from gpupool.agent.isolation.grant import ContainerGrant, build_grant
from gpupool.agent.isolation.vendors import merge_env
from gpupool.api.allocation import AllocationDoc, GrantDoc, MigGrantDoc
from gpupool.api.isolation import IsolationMode

GPU = "GPU-h100-0000aaaa"
OTHER = "GPU-h100-0000bbbb"
H100_PROFILES = ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")


def driver(mig_enabled: bool = True) -> FakeMigDriver:
    return FakeMigDriver({GPU: "H100-80GB", OTHER: "H100-80GB"}, mig_enabled=mig_enabled)


def code_of(call: object) -> str:
    assert callable(call)
    with pytest.raises(PartitionError) as e:
        call()
    return e.value.code


# --- MIG as partitions -----------------------------------------------------------------------------------------
def test_profiles_are_the_cards_mig_model_smallest_first() -> None:
    assert MigPartitions(driver()).profiles(GPU) == H100_PROFILES


def test_create_carves_gpu_instance_then_compute_instance_and_names_the_partition_by_its_mig_uuid() -> None:
    d = driver()
    parts = MigPartitions(d)
    got = parts.create(GPU, "3g.40gb", 4)
    assert d.calls == [f"create_gi {GPU} 3g.40gb@4", f"create_ci {GPU} 1"]
    # H100-80GB 3g.40gb: 39.50 GiB usable = 40448 MiB, 60 SMs (gpupool.core.mig's table)
    assert got == Partition(GPU, "MIG-fake-0000aaaa-0001", "3g.40gb", 4, 40448, 60)
    assert parts.partitions(GPU) == (got,)
    assert parts.partitions(OTHER) == ()


def test_partitions_are_listed_by_start() -> None:
    parts = MigPartitions(driver())
    late = parts.create(GPU, "1g.10gb", 6)
    early = parts.create(GPU, "2g.20gb", 0)
    assert [p.start for p in parts.partitions(GPU)] == [0, 6]
    assert parts.partitions(GPU) == (early, late)


def test_destroy_removes_compute_instance_then_gpu_instance() -> None:
    d = driver()
    parts = MigPartitions(d)
    got = parts.create(GPU, "1g.10gb", 2)
    d.calls.clear()
    parts.destroy(GPU, got.partition_id)
    assert d.calls == [f"destroy_ci {GPU} 1", f"destroy_gi {GPU} 1"]
    assert parts.partitions(GPU) == () and d.destroyed == [(GPU, "1g.10gb", 2)]


def test_a_partition_in_use_is_kept() -> None:
    d = driver()
    parts = MigPartitions(d)
    got = parts.create(GPU, "1g.10gb", 0)
    d.start_process(got.partition_id)
    assert parts.busy(GPU) and not parts.busy(OTHER)
    assert code_of(lambda: parts.destroy(GPU, got.partition_id)) == "IN_USE"
    assert parts.partitions(GPU) == (got,)
    d.stop_process(got.partition_id)
    parts.destroy(GPU, got.partition_id)
    assert parts.partitions(GPU) == ()


@pytest.mark.parametrize(("profile", "start", "code"), [
    ("3g.40gb", 1, "INVALID_ARGUMENT"),  # 3g starts at 0 or 4 only
    ("5g.50gb", 0, "INVALID_ARGUMENT"),  # no such profile on an H100
    ("4g.40gb", 0, "INSUFFICIENT_RESOURCES"),  # overlaps the 1g at slot 2 carved first
])
def test_create_refusals_keep_the_drivers_reason(profile: str, start: int, code: str) -> None:
    parts = MigPartitions(driver())
    kept = parts.create(GPU, "1g.10gb", 2)
    assert code_of(lambda: parts.create(GPU, profile, start)) == code
    assert parts.partitions(GPU) == (kept,)


def test_create_on_a_card_out_of_mig_mode_is_not_supported() -> None:
    assert code_of(lambda: MigPartitions(driver(mig_enabled=False)).create(GPU, "1g.10gb", 0)) == "NOT_SUPPORTED"


def test_a_card_without_mig_geometry_has_no_profiles() -> None:
    class NoMig(FakeMigDriver):
        def model(self, gpu: str) -> str:
            return "Tesla T4"

    parts = MigPartitions(NoMig({GPU: "H100-80GB"}))
    assert parts.profiles(GPU) == ()
    assert code_of(lambda: parts.create(GPU, "1g.10gb", 0)) == "NOT_SUPPORTED"


def test_unknown_card_and_unknown_partition_are_not_found() -> None:
    parts = MigPartitions(driver())
    assert code_of(lambda: parts.profiles("GPU-nope")) == "NOT_FOUND"
    assert code_of(lambda: parts.partitions("GPU-nope")) == "NOT_FOUND"
    assert code_of(lambda: parts.destroy(GPU, "MIG-nope")) == "NOT_FOUND"


def test_a_failed_compute_instance_takes_its_gpu_instance_back() -> None:
    class NoCompute(FakeMigDriver):
        def create_compute_instance(self, gpu: str, gi_id: int) -> str:
            raise MigError("INSUFFICIENT_RESOURCES", f"{gpu}: no compute instance for GI {gi_id}")

    d = NoCompute({GPU: "H100-80GB"})
    assert code_of(lambda: MigPartitions(d).create(GPU, "2g.20gb", 2)) == "INSUFFICIENT_RESOURCES"
    assert d.layout(GPU) == [] and d.destroyed == [(GPU, "2g.20gb", 2)]


def test_a_half_made_gpu_instance_is_listed_and_can_be_destroyed() -> None:
    d = driver()
    gi = d.create_gpu_instance(GPU, "2g.20gb", 4)  # a crash between GPU instance and compute instance
    parts = MigPartitions(d)
    assert [(p.partition_id, p.profile, p.start) for p in parts.partitions(GPU)] == [(f"gi:{gi}", "2g.20gb", 4)]
    parts.destroy(GPU, f"gi:{gi}")
    assert d.layout(GPU) == []


@pytest.mark.parametrize(("nvml", "seam"), [
    ("IN_USE", "IN_USE"),
    ("INSUFFICIENT_RESOURCES", "INSUFFICIENT_RESOURCES"),
    ("INVALID_ARGUMENT", "INVALID_ARGUMENT"),
    ("NOT_FOUND", "NOT_FOUND"),
    ("NOT_SUPPORTED", "NOT_SUPPORTED"),
    ("NO_PERMISSION", "NOT_SUPPORTED"),  # the agent may not change MIG: for it the card cannot be partitioned
    ("UNKNOWN", "INVALID_ARGUMENT"),
])
def test_mig_errors_map_to_partition_codes(nvml: str, seam: str) -> None:
    got = partition_error(MigError(nvml, "GPU-x: said the driver"))
    assert got.code == seam
    # the driver's words stay, and a folded code stays readable in the message
    said = "GPU-x: said the driver" if nvml == seam else f"NVML {nvml}: GPU-x: said the driver"
    assert str(got) == f"{seam}: {said}"


# --- the vendor --------------------------------------------------------------------------------------------------
def fake_backend(mig: bool) -> FakeBackend:
    card = DeviceInfo(uuid=GPU, index=0, model="H100-80GB", memory_mib=81920, mig_enabled=mig)
    return FakeBackend(Discovered("nvidia", "570.86.15", "12.8", (card,)))


def test_the_vendor_is_nvidias_cards_with_their_four_modes() -> None:
    backend = fake_backend(mig=False)
    vendor: Vendor = NvidiaVendor(backend)
    assert (vendor.name, vendor.resource_name) == ("nvidia", "nvidia.com/gpu")
    assert vendor.discovery is backend
    assert vendor.isolation_modes() == {IsolationMode.NONE, IsolationMode.HOOK, IsolationMode.MPS, IsolationMode.MIG}
    assert vendor.partitioning is None  # the fake backend has no MIG driver without a `mig: true` card


def test_partitioning_is_the_backends_mig_driver_kept_across_calls() -> None:
    vendor = NvidiaVendor(fake_backend(mig=True))
    parts = vendor.partitioning
    assert isinstance(parts, MigPartitions) and vendor.partitioning is parts
    made = parts.create(GPU, "1g.10gb", 3)
    assert vendor.partitioning.partitions(GPU) == (made,)  # one driver: what was carved stays seen


def test_an_injected_mig_driver_is_used() -> None:
    d = driver()
    parts: PartitionBackend | None = NvidiaVendor(fake_backend(mig=False), mig=d).partitioning
    assert parts is not None
    parts.create(GPU, "7g.80gb", 0)
    assert d.layout(GPU)[0].profile == "7g.80gb"


CARD = DeviceInfo(uuid=GPU, index=0, model="H100-80GB", memory_mib=81920)
MIG_PART = Partition(GPU, "MIG-4f1c-0001", "3g.40gb", 4, 40448, 60)


@pytest.mark.parametrize(("partition", "cdi_kind", "env", "cdi"), [
    (None, None, {"NVIDIA_VISIBLE_DEVICES": GPU}, ()),
    (MIG_PART, None, {"NVIDIA_VISIBLE_DEVICES": "MIG-4f1c-0001"}, ()),
    (None, "nvidia.com/gpu", {"NVIDIA_VISIBLE_DEVICES": "void"}, (f"nvidia.com/gpu={GPU}",)),
    (MIG_PART, "example.com/gpu", {"NVIDIA_VISIBLE_DEVICES": "void"}, ("example.com/gpu=MIG-4f1c-0001",)),
])
def test_container_devices_name_the_card_or_its_mig_instance(partition: Partition | None, cdi_kind: str | None,
                                                             env: dict[str, str], cdi: tuple[str, ...]) -> None:
    got = NvidiaVendor(fake_backend(mig=False), cdi_kind=cdi_kind).container_devices(CARD, partition)
    assert isinstance(got, ContainerDevices)
    # the toolkit picks the device nodes from the variable or the CDI spec: the agent hands none itself
    assert (got.device_nodes, dict(got.env), got.cdi_devices) == ((), env, cdi)


def test_nvidia_visible_of_no_devices_is_what_grant_always_gave() -> None:
    # a remote share's container sees no local GPU: an empty list, or `void` with CDI (never a missing key)
    assert nvidia_visible((), None).env == {"NVIDIA_VISIBLE_DEVICES": ""}
    assert nvidia_visible((), "k/gpu").env == {"NVIDIA_VISIBLE_DEVICES": "void"}


# --- one place: the vendor's answer is grant.py's -------------------------------------------------------------
DEVICES = {f"GPU-{i:04d}": DeviceInfo(uuid=f"GPU-{i:04d}", index=i, model="H100-80GB", memory_mib=81920)
           for i in range(4)}
MIG_DRIVER_CARDS = {u: "H100-80GB" for u in DEVICES}


@st.composite
def grants(draw: st.DrawFn) -> tuple[str, list[str], bool, str]:
    mode = draw(st.sampled_from(["none", "hook", "mps", "mig"]))
    # MPS shares and MIG instances are one card per container (mps.py, mig.py); hook and none take several
    most = 1 if mode in ("mps", "mig") else 4
    cards = draw(st.lists(st.sampled_from(sorted(DEVICES)), min_size=1, max_size=most, unique=True))
    cdi = draw(st.booleans())
    kind = draw(st.sampled_from(["nvidia.com/gpu", "example.com/gpu"]))
    return mode, cards, cdi, kind


@settings(max_examples=150, deadline=None)
@given(grants(), st.data())
def test_for_any_grant_the_vendors_devices_are_what_grant_hands_out(
        drawn: tuple[str, list[str], bool, str], data: st.DataObject) -> None:
    mode, cards, cdi, kind = drawn
    vendor = NvidiaVendor(fake_backend(mig=False), cdi_kind=kind if cdi else None, mig=FakeMigDriver(MIG_DRIVER_CARDS))
    parts = vendor.partitioning
    assert parts is not None
    gpus: list[GrantDoc] = []
    carved: dict[str, Partition] = {}
    for i, uuid in enumerate(cards):
        memory, cores = DEVICES[uuid].memory_mib, 100.0
        if mode in ("hook", "mps"):
            memory = data.draw(st.integers(1, DEVICES[uuid].memory_mib), label="memory")
            cores = data.draw(st.sampled_from([5.0, 12.5, 50.0, 100.0]), label="cores")
        mig = None
        if mode == "mig":
            profile = data.draw(st.sampled_from(["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"]), label="profile")
            start = {"1g.10gb": 6, "2g.20gb": 4, "3g.40gb": 0, "7g.80gb": 0}[profile]
            carved[uuid] = parts.create(uuid, profile, start)
            mig = MigGrantDoc(profile=profile, start=start)
        gpus.append(GrantDoc(uuid=uuid, index=i, memory_mib=memory, cores=cores, mig=mig))
    doc = AllocationDoc(pod_uid="u", node="n", isolation=mode, gpus=gpus)
    config = AgentConfig(node_name="n", cdi=cdi, cdi_kind=kind)
    granted = build_grant(doc, "main", DEVICES, {}, config, "ns/p",
                          mig_devices={u: p.partition_id for u, p in carved.items()})
    assert isinstance(granted, ContainerGrant), granted

    mine = [vendor.container_devices(DEVICES[u], carved.get(u)) for u in cards]
    assert all(m.device_nodes == () for m in mine)
    env = merge_env([m.env for m in mine])
    assert {k: v for k, v in granted.envs.items() if k in env} == env
    assert [n for m in mine for n in m.cdi_devices] == granted.cdi_devices
    assert granted.devices == []


# --- `gpupool agent --backend nvml` builds the vendor ------------------------------------------------------------
def test_the_agent_builds_nvidias_vendor_for_nvml_and_hands_it_on(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpupool.agent.devices import nvml
    from gpupool.agent.isolation.vendors import devices_source
    from gpupool.commands.agent import _backend

    stand_in = fake_backend(mig=False)
    monkeypatch.setattr(nvml, "NvmlBackend", lambda: stand_in)  # no NVML here: the vendor wraps what it is given
    config = AgentConfig(node_name="n", backend="nvml", cdi=True, cdi_kind="example.com/gpu")
    backend, vendors = _backend(config)
    assert backend is stand_in  # the agent runs on the vendor's discovery, as before
    source = devices_source(config, "nvidia", vendors)
    assert isinstance(source, NvidiaVendor)
    got = source.container_devices(CARD)
    assert isinstance(got, ContainerDevices)
    assert (dict(got.env), got.cdi_devices) == ({"NVIDIA_VISIBLE_DEVICES": "void"}, (f"example.com/gpu={GPU}",))
