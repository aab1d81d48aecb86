"""Grants of non-NVIDIA cards (gpupool.agent.isolation.vendors): what the container is handed per vendor, the
modes each vendor's cards are served in, and the NVIDIA answer left as it was."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.agent.config import AgentConfig
from gpupool.agent.devices.ascend import AscendBackend, AscendVendor
from gpupool.agent.devices.discovery import DeviceInfo, DiscoveryError
from gpupool.agent.devices.vendor import ContainerDevices, Partition
from gpupool.agent.dra.cdi import cdi_spec
from gpupool.agent.isolation.base import DeviceNode, GrantRequest
from gpupool.agent.isolation.grant import ContainerGrant, Refused, build_grant
from gpupool.agent.isolation.vendors import NO_VENDOR_DEVICES, VendorDevices, merge_env, vendor_mode
from gpupool.agent.kubelet.device_plugin import _to_proto
from gpupool.agent.state.hookdir import CONTAINER_HIP_LIBRARY, hip_installed, install_hip_library
from gpupool.api.allocation import AllocationDoc, GrantDoc
from tests.agent.fakes import ascend as dcmi_fake

MI300X_MIB = 196_592
ASCEND_MIB = 65_536
DEVICES = {
    "A0": DeviceInfo(uuid="A0", index=0, model="MI300X", memory_mib=MI300X_MIB, vendor="amd"),
    "A1": DeviceInfo(uuid="A1", index=1, model="MI300X", memory_mib=MI300X_MIB, vendor="amd"),
    "H0": DeviceInfo(uuid="H0", index=0, model="Ascend910B", memory_mib=ASCEND_MIB, vendor="ascend"),
    "H1": DeviceInfo(uuid="H1", index=1, model="Ascend910B", memory_mib=ASCEND_MIB, vendor="ascend"),
    "N0": DeviceInfo(uuid="N0", index=0, model="L40S", memory_mib=46068),
}
ASCEND_SHARED = "/dev/davinci_manager,/dev/devmm_svm,/dev/hisi_hdc"


def doc(*grants: tuple[str, int, float], isolation: str = "") -> AllocationDoc:
    return AllocationDoc(pod_uid="u", node="n", isolation=isolation,
                         gpus=[GrantDoc(uuid=u, index=i, memory_mib=m, cores=c) for i, (u, m, c) in enumerate(grants)])


def config(tmp_path: Path, backend: str = "fake", **kw: object) -> AgentConfig:
    fake = {"fake_file": tmp_path / "gpus.yaml"} if backend == "fake" else {}
    return AgentConfig(node_name="n", backend=backend, hook_root=tmp_path / "hook", **fake, **kw)  # type: ignore[arg-type]


def grant(d: AllocationDoc, cfg: AgentConfig, devices: Mapping[str, DeviceInfo] = DEVICES,
          vendors: VendorDevices = NO_VENDOR_DEVICES) -> ContainerGrant | Refused:
    return build_grant(d, "main", devices, {}, cfg, "ns/p", vendors=vendors)


def served(d: AllocationDoc, cfg: AgentConfig, devices: Mapping[str, DeviceInfo] = DEVICES,
           vendors: VendorDevices = NO_VENDOR_DEVICES) -> ContainerGrant:
    g = grant(d, cfg, devices, vendors)
    assert isinstance(g, ContainerGrant), g
    return g


def refused(d: AllocationDoc, cfg: AgentConfig, vendors: VendorDevices = NO_VENDOR_DEVICES) -> str:
    g = grant(d, cfg, vendors=vendors)
    assert isinstance(g, Refused), g
    return g.reason


@pytest.fixture
def hip(tmp_path: Path) -> Path:
    """The HIP memory cap installed under the hook root (any file stands for the library here)."""
    source = tmp_path / "libgpupool_hip.so"
    source.write_bytes(b"\x7fELF")
    assert install_hip_library(tmp_path / "hook", source) is None
    return tmp_path / "hook"


# --- the fake backend: environment only ------------------------------------------------------------------------
def test_a_whole_fake_amd_card_gets_its_would_be_nodes_as_env_and_no_nvidia_variable(tmp_path: Path) -> None:
    g = served(doc(("A1", MI300X_MIB, 100.0)), config(tmp_path))  # the agent's default isolation: hook
    assert g.envs == {
        "GPUPOOL_MEMORY_LIMIT_MIB": "196592",
        "GPUPOOL_CORES_PERCENT": "100",
        "GPUPOOL_ISOLATION": "none",  # a whole card without the HIP library: nothing to hold it to
        "GPUPOOL_FAKE_DEVICE_NODES": "/dev/kfd,/dev/dri/renderD129",  # card index 1: render minor 128 + 1
    }
    assert g.devices == [] and g.mounts == [] and g.cdi_devices == [] and g.hook_pod is None


def test_two_fake_ascend_cards_list_both_chips_and_the_shared_nodes_once(tmp_path: Path) -> None:
    g = served(doc(("H1", ASCEND_MIB, 100.0), ("H0", ASCEND_MIB, 100.0), isolation="none"), config(tmp_path))
    assert g.envs["ASCEND_VISIBLE_DEVICES"] == "1,0"  # the container's card order
    assert g.envs["GPUPOOL_FAKE_DEVICE_NODES"] == f"/dev/davinci1,{ASCEND_SHARED},/dev/davinci0"
    assert g.envs["GPUPOOL_MEMORY_LIMIT_MIB"] == "65536,65536"
    assert "NVIDIA_VISIBLE_DEVICES" not in g.envs and g.devices == []


def test_cdi_on_the_agent_does_not_turn_other_vendors_cards_into_nvidia_cdi_names(tmp_path: Path) -> None:
    g = served(doc(("H0", ASCEND_MIB, 100.0)), config(tmp_path, cdi=True))
    assert g.cdi_devices == [] and "NVIDIA_VISIBLE_DEVICES" not in g.envs


# --- modes per vendor ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("isolation", "why"), [
    ("hook", "gpupool has no memory or compute limiter for ascend cards; they are served whole or as vNPUs"),
    ("", "gpupool has no memory or compute limiter for ascend cards"),  # the default, hook
    ("mps", "MPS is NVIDIA's"),
])
def test_a_share_of_an_ascend_card_is_refused_with_the_reason(tmp_path: Path, isolation: str, why: str) -> None:
    reason = refused(doc(("H0", 16384, 25.0), isolation=isolation), config(tmp_path))
    assert reason.startswith(f"pod ns/p: isolation {isolation or 'hook'} on ascend card(s) H0 of node n cannot")
    assert why in reason


def test_partitions_of_other_vendors_are_refused_to_device_plugin_pods_and_served_to_claims(tmp_path: Path) -> None:
    reason = refused(doc(("A0", MI300X_MIB, 100.0), isolation="mig"), config(tmp_path))
    assert "are carved for DRA claims of partition devices only" in reason
    cfg = config(tmp_path)
    for card in ("A0", "H0"):
        request = GrantRequest(doc((card, 24_574, 12.5), isolation="mig"), "main",
                               tuple(doc((card, 24_574, 12.5)).gpus), DEVICES, cfg, "ns/c", claim=True)
        assert vendor_mode(request, "mig") == "mig"  # a claim's partition is carved (gpupool.agent.dra.driver)
        assert isinstance(vendor_mode(replace(request, claim=False), "mig"), Refused)


def test_an_amd_hook_share_without_the_hip_library_is_refused_naming_it(tmp_path: Path) -> None:
    assert not hip_installed(tmp_path / "hook")
    reason = refused(doc(("A0", 65536, 50.0), isolation="hook"), config(tmp_path))
    assert "the HIP memory cap (libgpupool_hip.so) is not installed on node n" in reason


def test_an_amd_hook_share_gets_the_hip_library_and_its_limits(tmp_path: Path, hip: Path) -> None:
    g = served(doc(("A0", 65536, 50.0), isolation="hook"), config(tmp_path))
    assert g.envs["GPUPOOL_ISOLATION"] == "hook" and g.envs["GPUPOOL_MEMORY_LIMIT_MIB"] == "65536"
    assert [(m.container_path, m.host_path, m.read_only) for m in g.mounts] == [
        (CONTAINER_HIP_LIBRARY, str(hip / "lib" / "libgpupool_hip.so"), True),
        ("/etc/ld.so.preload", str(hip / "lib" / "ld.so.preload.hip"), True),
        ("/run/gpupool/limits", str(hip / "pods" / "u" / "main" / "limits"), True),
        ("/run/gpupool/hook", str(hip / "pods" / "u" / "main" / "hook"), False),
    ]
    assert (hip / "lib" / "ld.so.preload.hip").read_text() == CONTAINER_HIP_LIBRARY + "\n"
    assert g.hook_pod is not None and g.hook_pod.limits is not None and g.hook_pod.limits.memory_mib == (65536,)
    assert g.envs["GPUPOOL_FAKE_DEVICE_NODES"] == "/dev/kfd,/dev/dri/renderD128"


def test_amd_mps_is_refused_even_with_the_hip_library(tmp_path: Path, hip: Path) -> None:
    assert "MPS is NVIDIA's" in refused(doc(("A0", 65536, 50.0), isolation="mps"), config(tmp_path))


def test_a_container_is_handed_one_vendors_cards(tmp_path: Path) -> None:
    reason = refused(doc(("A0", MI300X_MIB, 100.0), ("H1", ASCEND_MIB, 100.0), isolation="none"), config(tmp_path))
    assert "cards of several vendors (amd, ascend)" in reason


def test_hip_library_install_names_a_missing_source(tmp_path: Path) -> None:
    problem = install_hip_library(tmp_path / "hook", tmp_path / "absent.so")
    assert problem is not None and "absent.so is missing" in problem and not hip_installed(tmp_path / "hook")


# --- a real vendor's devices: device nodes, renames, the answers -----------------------------------------------
class _Renaming:
    """A source that renames one node (as an Ascend vNPU's is) and fails for one card."""

    def container_devices(self, device: DeviceInfo, partition: Partition | None = None) -> ContainerDevices:
        if device.uuid == "A1":
            raise DiscoveryError("AMD SMI reports no render node for A1")
        host = f"/dev/vdavinci{100 + device.index}"
        return ContainerDevices((host, "/dev/davinci_manager"), {"X_VISIBLE": str(device.index)},
                                renames={host: f"/dev/davinci{100 + device.index}"})


RENAMING: VendorDevices = {"amd": _Renaming()}


def test_the_vendors_devices_become_device_specs_and_cdi_device_nodes(tmp_path: Path) -> None:
    g = served(doc(("A0", MI300X_MIB, 100.0), isolation="none"), config(tmp_path, backend="amdsmi"), vendors=RENAMING)
    assert g.devices == [DeviceNode("/dev/davinci100", "/dev/vdavinci100"),
                         DeviceNode("/dev/davinci_manager", "/dev/davinci_manager")]
    assert g.envs["X_VISIBLE"] == "0" and "NVIDIA_VISIBLE_DEVICES" not in g.envs
    proto = _to_proto(g)
    assert [(d.container_path, d.host_path, d.permissions) for d in proto.devices] == [
        ("/dev/davinci100", "/dev/vdavinci100", "rw"), ("/dev/davinci_manager", "/dev/davinci_manager", "rw")]
    edits = cdi_spec("claim-1", g)["devices"][0]["containerEdits"]
    assert edits["deviceNodes"] == [
        {"path": "/dev/davinci100", "hostPath": "/dev/vdavinci100", "permissions": "rw"},
        {"path": "/dev/davinci_manager", "hostPath": "/dev/davinci_manager", "permissions": "rw"},
    ]


def test_a_vendor_library_that_cannot_name_the_nodes_gives_a_retryable_refusal(tmp_path: Path) -> None:
    g = grant(doc(("A1", MI300X_MIB, 100.0), isolation="none"), config(tmp_path, backend="amdsmi"), vendors=RENAMING)
    assert isinstance(g, Refused) and g.retry and "no render node for A1" in g.reason


def test_without_the_vendor_a_real_backend_refuses_other_vendors_cards(tmp_path: Path) -> None:
    reason = refused(doc(("H0", ASCEND_MIB, 100.0), isolation="none"), config(tmp_path, backend="nvml"))
    assert reason == "pod ns/p: the agent on n (backend nvml) cannot hand out ascend cards' devices"


class _Numbered:
    """A vendor stand-in handing each card one node, `prefix` and `base` + the card's index: which agent's
    vendor answered shows in the node."""

    def __init__(self, prefix: str, base: int) -> None:
        self.prefix, self.base = prefix, base

    def container_devices(self, device: DeviceInfo, partition: Partition | None = None) -> ContainerDevices:
        return ContainerDevices((f"{self.prefix}{self.base + device.index}",))


def test_two_agents_in_one_process_each_hand_out_their_own_vendors_devices(tmp_path: Path) -> None:
    """Three agents' vendors built side by side, as tests build agents: two AMD agents whose vendors number
    render nodes differently and an Ascend agent. Each grant is its own agent's vendor's answer, whichever was
    built last; an agent asked for a vendor it was not built with refuses. (A registry of one source per
    vendor name, filled as each agent starts, would answer both AMD agents with the last one's nodes and let
    the AMD agents hand out Ascend chips.)"""
    first: VendorDevices = {"amd": _Numbered("/dev/dri/renderD", 128)}
    second: VendorDevices = {"amd": _Numbered("/dev/dri/renderD", 200)}
    ascend: VendorDevices = {"ascend": _Numbered("/dev/davinci", 0)}
    amdsmi, dcmi = config(tmp_path, backend="amdsmi"), config(tmp_path, backend="dcmi")
    whole_a1 = doc(("A1", MI300X_MIB, 100.0), isolation="none")
    whole_h1 = doc(("H1", ASCEND_MIB, 100.0), isolation="none")

    assert [d.host_path for d in served(whole_a1, amdsmi, vendors=first).devices] == ["/dev/dri/renderD129"]
    assert [d.host_path for d in served(whole_a1, amdsmi, vendors=second).devices] == ["/dev/dri/renderD201"]
    assert [d.host_path for d in served(whole_h1, dcmi, vendors=ascend).devices] == ["/dev/davinci1"]
    for vendors in (first, second):
        assert refused(whole_h1, amdsmi, vendors) == ("pod ns/p: the agent on n (backend amdsmi) cannot hand out "
                                                      "ascend cards' devices")
    assert refused(whole_a1, dcmi, ascend) == ("pod ns/p: the agent on n (backend dcmi) cannot hand out amd "
                                               "cards' devices")


def test_ascend_over_the_dcmi_library_hands_the_chips_node_by_physical_id(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = dcmi_fake.write_state(tmp_path / "dcmi.json", [{"card_id": 3, "chips": [dcmi_fake.card_910b(4)]}])
    monkeypatch.setenv(dcmi_fake.STATE_ENV, str(path))
    vendor = AscendVendor(AscendBackend(str(dcmi_fake.library()), numa_reader=lambda bus: -1))
    chip = vendor.discovery.discover().devices[0]
    g = served(doc((chip.uuid, chip.memory_mib, 100.0), isolation="none"), config(tmp_path, backend="dcmi"),
               {chip.uuid: chip}, {vendor.name: vendor})
    assert g.envs["ASCEND_VISIBLE_DEVICES"] == "4"  # the physical id, not the index (0)
    assert [d.host_path for d in g.devices] == ["/dev/davinci4", *ASCEND_SHARED.split(",")]
    assert all(d.container_path == d.host_path for d in g.devices)


# --- NVIDIA: the answer as it was ----------------------------------------------------------------------------------
def test_nvidia_cards_keep_nvidia_visible_devices_and_no_device_specs(tmp_path: Path) -> None:
    g = served(doc(("N0", 46068, 100.0), isolation="none"), config(tmp_path))
    assert g.envs["NVIDIA_VISIBLE_DEVICES"] == "N0" and g.devices == []
    assert list(_to_proto(g).devices) == [] and "deviceNodes" not in cdi_spec("c", g)["devices"][0]["containerEdits"]


@given(st.lists(st.dictionaries(st.sampled_from("ABC"), st.lists(st.sampled_from("0123"), min_size=1, max_size=3)
                                .map(",".join), max_size=3), max_size=4))
def test_merged_env_holds_every_item_once_in_first_seen_order(parts: list[dict[str, str]]) -> None:
    merged = merge_env(parts)
    assert set(merged) == {k for p in parts for k in p}
    for key, value in merged.items():
        expected: list[str] = []
        for p in parts:
            expected += [v for v in p.get(key, "").split(",") if p.get(key) and v not in expected]
        assert value.split(",") == expected
