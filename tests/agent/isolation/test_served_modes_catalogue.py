"""The agent serves a vendor's cards in the modes the catalogue says they hold (gpupool.core.vendors
.ISOLATION_OF_VENDOR, the table the scheduler places shares by), narrowed by the node: hook on AMD only where
the HIP library is installed, partitions (mig) only for DRA claims."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.agent.config import AgentConfig
from gpupool.agent.isolation.vendors import served_modes
from gpupool.agent.state.hookdir import install_hip_library
from gpupool.core.vendors import AMD, ASCEND, ISOLATION_OF_VENDOR


def config(tmp_path: Path) -> AgentConfig:
    return AgentConfig(node_name="n", backend="fake", hook_root=tmp_path / "hook", fake_file=tmp_path / "gpus.yaml")


def test_ascend_is_served_whole_and_as_vnpus_only(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    assert served_modes(ASCEND, cfg) == {"none"}
    assert served_modes(ASCEND, cfg, claim=True) == {"none", "mig"}


def test_amd_hook_needs_the_hip_library(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    assert served_modes(AMD, cfg) == {"none"}
    source = tmp_path / "libgpupool_hip.so"
    source.write_bytes(b"\x7fELF")
    assert install_hip_library(cfg.hook_root, source) is None
    assert served_modes(AMD, cfg) == {"none", "hook"}
    assert served_modes(AMD, cfg, claim=True) == {"none", "hook", "mig"}


@pytest.mark.parametrize("vendor", [AMD, ASCEND])
def test_never_more_than_the_catalogue_holds(tmp_path: Path, vendor: str) -> None:
    cfg = config(tmp_path)
    source = tmp_path / "libgpupool_hip.so"
    source.write_bytes(b"\x7fELF")
    assert install_hip_library(cfg.hook_root, source) is None
    assert served_modes(vendor, cfg, claim=True) == ISOLATION_OF_VENDOR[vendor]


def test_a_vendor_gpupool_does_not_know_is_served_whole(tmp_path: Path) -> None:
    assert served_modes("hygon", config(tmp_path), claim=True) == {"none"}
