"""The validation checks of the fake backend: each step reports the fault the fake GPU file (key
`validation`, re-read when the file changes) or a test (`FakeBackend.fail_validation`) gives it; the
driver step also needs discovery to answer."""

from __future__ import annotations

from gpupool.agent.devices.discovery import DiscoveryError
from gpupool.agent.devices.fake import FakeBackend
from gpupool.agent.state.validation import STEPS, Result, Step


def judge(fault: str | None) -> Result:
    return Result.passed() if fault is None else Result.failed(fault)


def step_check(backend: FakeBackend, step: Step) -> Result:
    fault = backend.validation_fault(step)
    if fault is None and step == "driver":
        try:
            backend.discover()
        except DiscoveryError as e:
            fault = str(e)
    return judge(fault)


def all_steps() -> tuple[Step, ...]:
    return STEPS  # type: ignore[return-value]
