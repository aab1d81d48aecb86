"""Node validation: the steps a node passes before its GPUs are advertised, as a pure state machine.

The steps run in order, each only once every step before it passed (a later check means nothing while an
earlier one fails: no toolkit check without a driver, no workload without isolation):

    driver → toolkit → isolation → workload → ready

Each step is `pending` (not checked since an earlier step last failed, or never), `true` (passed) or
`false` (failed, with the check's reason). A failure sends every later step back to `pending`: after the
fault is fixed they must pass again before the node is ready. The node is ready, and its GPUs are
advertised, only while every step is `true`.

No I/O and no clock here: the agent (gpupool.agent.service) runs a pass of the checks
(gpupool.agent.checks) and records each result; what is published (Node condition, labels, inventory)
is derived from the state by the functions below.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from gpupool.api.names import DOMAIN

STEPS = ("driver", "toolkit", "isolation", "workload")
Step = Literal["driver", "toolkit", "isolation", "workload"]
State = Literal["pending", "true", "false"]

CONDITION = "GpupoolReady"
LABEL_PREFIX = f"{DOMAIN}/validation."
REASON_READY = "NodeValidated"


class OutOfOrder(ValueError):
    """A step was recorded while an earlier step had not passed (the driver of the machine has a bug)."""


@dataclass(frozen=True, slots=True)
class Result:
    """What one check found: `ok`, or why not (shown on the node, so one line a person can act on)."""

    ok: bool
    reason: str = ""

    @staticmethod
    def passed(note: str = "") -> Result:
        """`note`: what the check could not see (published with the step, which still passes)."""
        return Result(True, note)

    @staticmethod
    def failed(reason: str) -> Result:
        return Result(False, reason or "failed (no reason given)")


@dataclass(frozen=True, slots=True)
class StepStatus:
    state: State = "pending"
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Validation:
    steps: tuple[StepStatus, ...] = tuple(StepStatus() for _ in STEPS)

    def status(self, step: Step) -> StepStatus:
        return self.steps[STEPS.index(step)]

    @property
    def ready(self) -> bool:
        return all(s.state == "true" for s in self.steps)

    @property
    def failing(self) -> tuple[Step, StepStatus] | None:
        """The first failed step (there is at most one: a failure resets every later step)."""
        for step, s in zip(STEPS, self.steps, strict=True):
            if s.state == "false":
                return step, s  # type: ignore[return-value]
        return None

    def next_step(self) -> Step | None:
        """The first step not yet passed: where a pass that stopped would go on (None: ready)."""
        for step, s in zip(STEPS, self.steps, strict=True):
            if s.state != "true":
                return step  # type: ignore[return-value]
        return None


def record(v: Validation, step: Step, result: Result) -> Validation:
    """The state after `step`'s check gave `result`. Recording a step whose predecessors have not all
    passed raises OutOfOrder: its check could not have been meaningful."""
    i = STEPS.index(step)
    if any(s.state != "true" for s in v.steps[:i]):
        raise OutOfOrder(f"validation step {step} checked before {STEPS[: i]} all passed")
    steps = list(v.steps)
    if result.ok:
        steps[i] = StepStatus("true", result.reason)
    else:
        steps[i] = StepStatus("false", result.reason)
        steps[i + 1:] = [StepStatus("pending", f"waiting for {step}") for _ in steps[i + 1:]]
    return replace(v, steps=tuple(steps))


def withheld_reason(v: Validation) -> str | None:
    """Why the GPUs are not advertised (None: ready, they are)."""
    failing = v.failing
    if failing is not None:
        return f"node validation failed at {failing[0]}: {failing[1].reason}"
    step = v.next_step()
    return None if step is None else f"node validation pending at {step}"


def labels(v: Validation) -> dict[str, str]:
    """`gpupool.io/validation.<step>` = `true` | `false` | `pending`, one per step."""
    return {LABEL_PREFIX + step: s.state for step, s in zip(STEPS, v.steps, strict=True)}


@dataclass(frozen=True, slots=True)
class Condition:
    """The Node condition `GpupoolReady` without its times (the publisher adds them)."""

    status: Literal["True", "False", "Unknown"]
    reason: str  # CamelCase, as Kubernetes condition reasons are
    message: str


def condition(v: Validation) -> Condition:
    failing = v.failing
    if failing is not None:
        step, s = failing
        return Condition("False", f"{step.capitalize()}Failed", f"{step}: {s.reason}")
    pending = v.next_step()
    if pending is not None:
        return Condition("Unknown", f"{pending.capitalize()}Pending", f"validation has not reached {pending} yet")
    return Condition("True", REASON_READY, "driver, toolkit, isolation and workload checks passed")
