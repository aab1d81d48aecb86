"""Validation of a node whose cards are AMD's or Ascend's (backend amdsmi or dcmi).

NVIDIA's checks do not apply there: the container toolkit is NVIDIA's, and the caps probe and the workload
check run CUDA. What is checked instead, and what is not (a passing step says so in its note, which the
node publishes with the step):
- driver: the vendor's management library answers, reports at least one card and a driver version (the
  same judgement as on NVIDIA);
- toolkit: nothing to check; the agent hands the cards' device nodes to containers itself;
- isolation: on AMD, the HIP memory cap the agent installed loads in a separate process (it is not probed
  against a card: there is no HIP probe yet); without it the node still serves whole cards and refuses
  shares. On Ascend nothing holds a share, so the node serves whole cards only;
- workload: not checked (no ROCm or CANN workload check yet).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from gpupool.agent.checks import driver, isolation
from gpupool.agent.config import AgentConfig
from gpupool.agent.devices.discovery import DiscoveryBackend
from gpupool.agent.state.hookdir import hip_installed, hip_paths
from gpupool.agent.state.validation import Result, Step
from gpupool.core.vendors import AMD, ASCEND, RUNTIME_OF_VENDOR

# The discovery backends of other vendors, by the name they report (gpupool.agent.devices.amd / .ascend).
VENDOR_OF_BACKEND = {"amdsmi": AMD, "dcmi": ASCEND}


def hip_cap(config: AgentConfig) -> Result:
    if not hip_installed(config.hook_root):
        return Result.passed("the HIP memory cap is not installed: AMD shares are refused, whole cards served")
    problem = isolation.library_loads(hip_paths(config.hook_root).library)
    if problem is not None:
        return Result.failed(f"HIP memory cap: {problem}")
    return Result.passed("the HIP memory cap loads; it is not probed against a card (no HIP probe yet)")


def checks(config: AgentConfig, backend: DiscoveryBackend, vendor: str) -> dict[Step, Callable[[], Result]]:
    """The checks of a node of `vendor`'s cards."""
    runtime = RUNTIME_OF_VENDOR.get(vendor, vendor)
    return {
        "driver": functools.partial(driver.check, backend),
        "toolkit": lambda: Result.passed(f"not applicable: the agent hands {vendor} cards' device nodes to "
                                         "containers itself"),
        "isolation": functools.partial(hip_cap, config) if vendor == AMD
        else lambda: Result.passed(f"no share isolation on {vendor} cards: whole cards only"),
        "workload": lambda: Result.passed(f"not checked: no {runtime} workload check yet"),
    }
