"""Which checks this node runs (`node_checks`), and one validation pass over them (`run_pass`)."""


from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence

from gpupool.agent.checks import driver, fake, isolation, other_vendors, toolkit, workload
from gpupool.agent.config import AgentConfig
from gpupool.agent.devices.discovery import DiscoveryBackend
from gpupool.agent.devices.fake import FakeBackend
from gpupool.agent.devices.mps import MpsSupervisor
from gpupool.agent.state.hookdir import NvmlScales, hook_paths
from gpupool.agent.state.validation import STEPS, Result, Step, Validation, record

Check = Callable[[], Result]


def run_pass(v: Validation, checks: Mapping[Step, Check]) -> Validation:
    """Check every step in order from the first, stopping at the first failure (later steps are then
    pending). A check that raises is a failure with the exception as its reason. Blocking: the agent runs
    it off the event loop."""
    for step in STEPS:
        try:
            result = checks[step]()  # type: ignore[index]
        except Exception as e:  # a broken check must fail its step, not the agent
            result = Result.failed(f"check raised {e!r}")
        v = record(v, step, result)  # type: ignore[arg-type]
        if not result.ok:
            break
    return v


def node_checks(
    config: AgentConfig,
    backend: DiscoveryBackend,
    mps: MpsSupervisor | None,
    mig_reconciled: Callable[[], bool] | None,
    gpus: Callable[[], Sequence[str]],
    scales: NvmlScales | None = None,
) -> dict[Step, Check]:
    """The checks of this node: the fake ones for the fake backend, else the real ones. `mig_reconciled`:
    None where the node has no MIG manager; `gpus`: the UUIDs discovery knows, by NVML index (the workload
    runs on each); `scales`: where the NVML scales the caps probe measured go, by GPU UUID."""
    if isinstance(backend, FakeBackend):
        return {step: functools.partial(fake.step_check, backend, step) for step in fake.all_steps()}
    vendor = other_vendors.VENDOR_OF_BACKEND.get(backend.name)
    if vendor is not None:
        return other_vendors.checks(config, backend, vendor)
    library = hook_paths(config.hook_root).library  # any node may serve isolation hook pods
    proven = isolation.Proven()  # the caps probe runs once per library build, not at every pass

    def isolation_check() -> Result:
        result = isolation.check(library, {} if mps is None else mps.health, mig_reconciled, proven=proven)
        if scales is not None and proven.scales:
            scales.by_gpu = {g: ppm for g, ppm in zip(gpus(), proven.scales, strict=False) if ppm}
        return result

    return {
        "driver": functools.partial(driver.check, backend),
        "toolkit": functools.partial(toolkit.check, cdi=config.cdi),
        "isolation": isolation_check,
        "workload": lambda: workload.check(len(gpus())),
    }
