"""The node's isolation strategies, one per mode (gpupool.agent.isolation.base says what a strategy is)."""

from __future__ import annotations

from collections.abc import Callable

from gpupool.agent.config import AgentConfig
from gpupool.agent.devices.mig import MigManager
from gpupool.agent.devices.mps import MpsSupervisor
from gpupool.agent.isolation.base import Isolation
from gpupool.agent.isolation.hook import HookIsolation
from gpupool.agent.isolation.mig import MigIsolation
from gpupool.agent.isolation.mps import MpsIsolation
from gpupool.agent.isolation.none import NoIsolation
from gpupool.agent.state.hookdir import NvmlScales


def node_strategies(
    config: AgentConfig,
    mps: MpsSupervisor | None = None,
    mig: MigManager | None = None,
    mig_reconciled: Callable[[], bool] = lambda: True,
    changed: Callable[[], None] = lambda: None,
    nvml_scales: NvmlScales | None = None,
) -> dict[str, Isolation]:
    """The node's strategies by mode name (what a pod's allocation or the agent's default names)."""
    strategies: list[Isolation] = [
        NoIsolation(),
        HookIsolation(config, nvml_scales),
        MpsIsolation(config, mps),
        MigIsolation(config, mig, mig_reconciled, changed),
    ]
    return {s.name: s for s in strategies}
