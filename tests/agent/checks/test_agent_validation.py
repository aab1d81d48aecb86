"""Node validation as a state machine (gpupool.agent.state.validation) driven by one pass over the checks
(gpupool.agent.checks.node.run_pass): each step failing and recovering, in every order."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.agent.checks.node import Check, run_pass
from gpupool.agent.state.validation import (
    CONDITION,
    LABEL_PREFIX,
    STEPS,
    OutOfOrder,
    Result,
    Step,
    Validation,
    condition,
    labels,
    record,
    withheld_reason,
)


def _checks(faults: dict[str, str]) -> dict[Step, Check]:
    return {step: (lambda s=step: Result.failed(faults[s]) if s in faults else Result.passed())  # type: ignore[misc]
            for step in STEPS}


def test_a_new_node_is_not_ready_until_a_pass_ran() -> None:
    v = Validation()
    assert not v.ready and withheld_reason(v) == "node validation pending at driver"
    assert labels(v) == {LABEL_PREFIX + s: "pending" for s in STEPS}
    assert condition(v).status == "Unknown" and CONDITION == "GpupoolReady"
    v = run_pass(v, _checks({}))
    assert v.ready and withheld_reason(v) is None
    assert labels(v) == {LABEL_PREFIX + s: "true" for s in STEPS}
    assert (condition(v).status, condition(v).reason) == ("True", "NodeValidated")


def test_a_step_cannot_be_recorded_before_the_steps_before_it_passed() -> None:
    with pytest.raises(OutOfOrder):
        record(Validation(), "toolkit", Result.passed())


def test_a_failure_sends_every_later_step_back_to_pending() -> None:
    v = run_pass(Validation(), _checks({}))
    v = run_pass(v, _checks({"toolkit": "toolkit 1.17.3 is older than 1.17.8"}))
    assert labels(v) == {LABEL_PREFIX + "driver": "true", LABEL_PREFIX + "toolkit": "false",
                         LABEL_PREFIX + "isolation": "pending", LABEL_PREFIX + "workload": "pending"}
    c = condition(v)
    assert (c.status, c.reason, c.message) == ("False", "ToolkitFailed", "toolkit: toolkit 1.17.3 is older than 1.17.8")
    assert withheld_reason(v) == "node validation failed at toolkit: toolkit 1.17.3 is older than 1.17.8"


def test_a_check_that_raises_fails_its_step() -> None:
    def broken() -> Result:
        raise OSError("no such file")

    checks = {**_checks({}), "isolation": broken}
    v = run_pass(Validation(), checks)
    assert v.failing is not None and v.failing[0] == "isolation" and "no such file" in v.failing[1].reason


# A fault or a fix on one step at a time, in any order, each followed by a validation pass.
events = st.lists(st.tuples(st.sampled_from(STEPS), st.one_of(st.none(), st.text(min_size=1, max_size=20))),
                  max_size=25)


@settings(max_examples=300, deadline=None)
@given(events)
def test_gpus_are_advertised_iff_every_step_passes_and_the_first_fault_is_published(
    sequence: list[tuple[str, str | None]],
) -> None:
    faults: dict[str, str] = {}
    v = Validation()
    for step, fault in sequence:
        if fault is None:
            faults.pop(step, None)
        else:
            faults[step] = fault
        v = run_pass(v, _checks(faults))
        assert v.ready == (not faults) == (withheld_reason(v) is None)
        first = next((s for s in STEPS if s in faults), None)
        published = labels(v)
        assert len(published) == len(STEPS)
        for i, s in enumerate(STEPS):  # before the first fault: true; at it: false; after it: pending
            expected = "true" if first is None or i < STEPS.index(first) else (
                "false" if s == first else "pending")
            assert published[LABEL_PREFIX + s] == expected, (s, faults)
        if first is not None:
            assert condition(v).reason == f"{first.capitalize()}Failed"
            assert condition(v).message == f"{first}: {faults[first]}"
            assert withheld_reason(v) == f"node validation failed at {first}: {faults[first]}"
