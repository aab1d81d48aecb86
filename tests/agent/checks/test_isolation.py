"""Validation step `isolation` (gpupool.agent.checks.isolation): the caps probe through the interception
library on the simulated GPU of tests/native/fakes (fake libcuda and NVML found through LD_LIBRARY_PATH).

The library under test is built as the package builds it (the production limits path, which does not exist
here, so the probe's caps come from its environment, as on a node). Each failing case is a library whose
caps really do not apply, and the check must name which cap."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import cast

import pytest

from gpupool.agent.checks import isolation
from gpupool.agent.checks.node import Check, node_checks, run_pass
from gpupool.agent.config import AgentConfig
from gpupool.agent.devices.discovery import DiscoveryBackend
from gpupool.agent.state.hookdir import NvmlScales, install_library
from gpupool.agent.state.validation import (
    LABEL_PREFIX,
    STEPS,
    Result,
    Step,
    Validation,
    condition,
    labels,
    withheld_reason,
)

HERE = Path(__file__).resolve().parent


def _shared_object(out: Path, source: Path) -> Path:
    subprocess.run(["cc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared", "-o", str(out), str(source),
                    "-ldl"], check=True, capture_output=True, text=True)
    return out


def _node_pass(isolation_check: Check) -> Validation:
    checks: dict[Step, Check] = {step: Result.passed for step in STEPS}
    checks["isolation"] = isolation_check
    return run_pass(Validation(), checks)


def test_the_caps_of_the_real_library_apply_and_the_node_is_ready(library: Path, gpu: dict[str, str]) -> None:
    result = isolation.check(library, {}, None, env=gpu)
    assert result.ok, result.reason
    assert _node_pass(lambda: isolation.check(library, {}, None, env=gpu)).ready


def test_a_library_that_interposes_nothing_fails_on_memory_and_the_node_is_withheld(
        tmp_path: Path, gpu: dict[str, str]) -> None:
    source = tmp_path / "nothing.c"
    source.write_text("int gpupool_test_nothing;\n")
    nothing = _shared_object(tmp_path / "libnothing.so", source)
    result = isolation.check(nothing, {}, None, env=gpu)
    assert not result.ok
    assert "memory cap does not apply" in result.reason and "81920 MiB in total under a 2048 MiB cap" in result.reason
    v = _node_pass(lambda: isolation.check(nothing, {}, None, env=gpu))
    # the existing withdrawal path: not ready, so the GPUs are withheld, with the reason on the node
    assert not v.ready
    assert labels(v)[LABEL_PREFIX + "isolation"] == "false"
    assert condition(v).reason == "IsolationFailed" and "memory cap does not apply" in condition(v).message
    assert (withheld_reason(v) or "").startswith("node validation failed at isolation: interception library: GPU 0:")


def test_a_library_that_caps_memory_but_does_not_pace_kernels_fails_on_compute(
        tmp_path: Path, gpu: dict[str, str]) -> None:
    stub = _shared_object(tmp_path / "libmemonly.so", HERE / "memory_only_hook.c")
    result = isolation.check(stub, {}, None, env=gpu)
    assert not result.ok
    assert "GPU 0: the compute cap does not apply: a 30 % cap kept the GPU busy" in result.reason
    # the probe saw the GPU busy most of the time it ran (no pacing at all), far above 30 %
    share = float(result.reason.split("busy ")[1].split(" %")[0])
    assert share > 60


def test_a_library_whose_pacing_starves_its_tenant_fails_on_compute(tmp_path: Path, gpu: dict[str, str]) -> None:
    stub = _shared_object(tmp_path / "libmemonly.so", HERE / "memory_only_hook.c")
    # 10 ms before every 1 ms kernel: at most about 9 % of the GPU, under half of a 30 % share
    result = isolation.check(stub, {}, None, env={**gpu, "STUB_STARVE_US": "10000"})
    assert not result.ok
    assert "GPU 0: the compute cap starves its tenant: a 30 % cap kept the GPU busy only" in result.reason


def test_a_missing_or_broken_library_fails_with_the_reason(tmp_path: Path, gpu: dict[str, str]) -> None:
    missing = isolation.check(tmp_path / "gone.so", {}, None, env=gpu)
    assert not missing.ok and missing.reason.endswith("gone.so is missing")
    garbage = tmp_path / "garbage.so"
    garbage.write_bytes(b"not an ELF file")
    broken = isolation.check(garbage, {}, None, env=gpu)
    assert not broken.ok and "does not load" in broken.reason and "Traceback" not in broken.reason


def test_a_probe_without_a_cuda_driver_fails_with_the_reason_not_a_traceback(library: Path, tmp_path: Path) -> None:
    result = isolation.check(library, {}, None, env={"LD_LIBRARY_PATH": str(tmp_path), isolation.FAKE_ENV: "1"})
    # on this machine there is no libcuda.so.1 outside the fakes' directory
    assert not result.ok
    assert "the caps probe failed: cannot load libcuda.so.1" in result.reason and "Traceback" not in result.reason


def test_a_node_without_hook_isolation_runs_no_probe() -> None:
    assert isolation.check(None, {}, None).ok


def test_the_agent_probes_a_library_build_once_and_again_when_it_changes_or_failed(
        library: Path, gpu: dict[str, str], tmp_path: Path) -> None:
    no_driver = {"LD_LIBRARY_PATH": str(tmp_path), isolation.FAKE_ENV: "1"}  # a probe here would fail
    copy = tmp_path / "libgpupool_hook.so"
    copy.write_bytes(library.read_bytes())
    proven = isolation.Proven()
    assert not isolation.check(copy, {}, None, env=no_driver, proven=proven).ok  # a failure is not kept...
    assert isolation.check(copy, {}, None, env=gpu, proven=proven).ok  # ...the next pass probes again
    assert isolation.check(copy, {}, None, env=no_driver, proven=proven).ok  # proven: not probed again
    copy.write_bytes(library.read_bytes() + b"\0")  # a reinstalled library is probed again
    assert not isolation.check(copy, {}, None, env=no_driver, proven=proven).ok


def test_the_probe_learns_nvmls_scale_alone_on_the_gpu(library: Path, gpu: dict[str, str]) -> None:
    """The simulated NVML reports smUtil as the busy share times FAKE_GPU_SM_SCALE_PCT (an H100 reads about
    1.6x, nvidia-facts.md); the library divides NVML's samples by what it learnt against its own events."""
    for pct, low, high in [(100, 950_000, 1_050_000), (160, 1_500_000, 1_680_000)]:
        proven = isolation.Proven()
        assert isolation.check(library, {}, None, env={**gpu, "FAKE_GPU_SM_SCALE_PCT": str(pct)}, proven=proven).ok
        assert low <= proven.scales[0] <= high, (pct, proven.scales[0])
    failed = isolation.Proven()
    assert not isolation.check(library, {}, None, env={isolation.FAKE_ENV: "1"}, proven=failed).ok
    assert failed.scales == ()  # a probe that failed measured nothing the agent may hand out


def test_the_node_hands_each_gpus_measured_scale_to_its_uuid(
        library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the probe itself is the test above; here what it measured by CUDA ordinal (PCI order) -> UUIDs by index
    measured = isolation.Probed(None, (1_600_000, 0, 1_100_000))
    monkeypatch.setattr(isolation, "caps_apply", lambda lib, env=None: measured)
    install_library(tmp_path, library)
    scales = NvmlScales()
    config = AgentConfig(node_name="n", hook_root=tmp_path)
    checks = node_checks(config, cast(DiscoveryBackend, NoBackend()), None, None, lambda: ["GPU-aaa", "GPU-bbb"],
                         scales)
    assert checks["isolation"]().ok
    assert scales.by_gpu == {"GPU-aaa": 1_600_000}  # GPU-bbb learnt none; ordinal 2 is no GPU discovery knows
    assert scales.of(["GPU-bbb", "GPU-aaa"]) == (0, 1_600_000) and scales.of(["GPU-bbb"]) == ()


class NoBackend:
    """Discovery is not asked by the isolation step; any call here is a test failure."""

    name = "none"

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"the isolation step called discovery's {name}")
