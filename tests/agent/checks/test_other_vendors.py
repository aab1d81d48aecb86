"""Validation of AMD and Ascend nodes (gpupool.agent.checks.other_vendors): NVIDIA's toolkit, caps probe and
CUDA workload are not run there; what is checked can fail, and what is not is said in the step's note."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.agent.checks.node import node_checks, run_pass
from gpupool.agent.config import AgentConfig
from gpupool.agent.devices.discovery import DeviceInfo, Discovered, DiscoveryError
from gpupool.agent.state.hookdir import hip_paths, install_hip_library
from gpupool.agent.state.validation import STEPS, Validation
from gpupool.hook import hip_library_path


class VendorBackend:
    """Discovery of another vendor's node (only what validation asks of it)."""

    def __init__(self, name: str, vendor: str, devices: int = 1, version: str = "6.8.5") -> None:
        self.name, self.vendor, self.devices, self.version = name, vendor, devices, version

    def discover(self) -> Discovered:
        if self.version == "broken":
            raise DiscoveryError("libdcmi.so: dcmi_init returned -8005")
        devices = tuple(DeviceInfo(f"{self.vendor}-{i}", i, "MI300X", 196_608, vendor=self.vendor)
                        for i in range(self.devices))
        return Discovered(self.vendor, self.version, "", devices)


def validate(config: AgentConfig, backend: VendorBackend) -> Validation:
    checks = node_checks(config, backend, None, None, lambda: [])  # type: ignore[arg-type]
    return run_pass(Validation(), checks)


def test_an_ascend_node_passes_without_nvidias_checks_and_says_what_was_not_checked(tmp_path: Path) -> None:
    v = validate(AgentConfig(node_name="n", hook_root=tmp_path), VendorBackend("dcmi", "ascend", version="24.1.0"))
    assert [s.state for s in v.steps] == ["true"] * len(STEPS)
    notes = dict(zip(STEPS, (s.reason for s in v.steps), strict=True))
    assert notes["isolation"] == "no share isolation on ascend cards: whole cards only"
    assert notes["workload"] == "not checked: no cann workload check yet"
    assert "device nodes" in notes["toolkit"]


@pytest.mark.parametrize(("backend", "reason"), [
    (VendorBackend("dcmi", "ascend", devices=0), "the driver reports no GPU"),
    (VendorBackend("amdsmi", "amd", version="broken"), "libdcmi.so: dcmi_init returned -8005"),
])
def test_the_driver_step_still_fails_on_another_vendors_node(tmp_path: Path, backend: VendorBackend,
                                                             reason: str) -> None:
    v = validate(AgentConfig(node_name="n", hook_root=tmp_path), backend)
    assert (v.steps[0].state, v.steps[0].reason) == ("false", reason)


def test_an_amd_node_loads_its_hip_cap_or_serves_whole_cards(tmp_path: Path) -> None:
    config = AgentConfig(node_name="n", hook_root=tmp_path)
    amd = VendorBackend("amdsmi", "amd")
    step = STEPS.index("isolation")
    none = validate(config, amd).steps[step]
    assert (none.state, none.reason) == ("true", "the HIP memory cap is not installed: AMD shares are refused, "
                                                   "whole cards served")
    assert install_hip_library(tmp_path, hip_library_path()) is None  # as `gpupool agent` does at start
    loaded = validate(config, amd).steps[step]
    assert loaded.state == "true" and "loads" in loaded.reason
    hip_paths(tmp_path).library.write_bytes(b"not an ELF file")  # a broken copy: every AMD share would fail
    broken = validate(config, amd).steps[step]
    assert broken.state == "false" and broken.reason.startswith("HIP memory cap: ") and "does not load" in broken.reason
