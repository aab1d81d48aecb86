from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpupool.agent.config import APPLICATION_XIDS
from gpupool.agent.devices.discovery import HealthEvent
from gpupool.agent.devices.health import HealthTracker

GPUS = ["G0", "G1", "G2"]


def test_critical_xid_marks_only_that_gpu() -> None:
    t = HealthTracker(APPLICATION_XIDS, quarantine_s=10)
    assert t.on_event(HealthEvent("G1", 79), GPUS, now=0) == (True, False)
    assert [t.healthy(g) for g in GPUS] == [True, False, True]
    assert t.faults["G1"].reason == "Xid 79"


def test_application_xid_and_unattributed_events() -> None:
    t = HealthTracker(APPLICATION_XIDS, quarantine_s=10)
    assert t.on_event(HealthEvent("G0", 31), GPUS, now=0) == (False, False)
    assert t.on_event(HealthEvent(None, 79), GPUS, now=0) == (False, True)  # re-probe all instead
    assert t.on_event(HealthEvent("GPU-unknown", 48), GPUS, now=0) == (False, True)
    assert t.faults == {}


def test_recovery_needs_a_good_probe_after_the_quarantine() -> None:
    t = HealthTracker(APPLICATION_XIDS, quarantine_s=10)
    t.mark("G2", "Xid 48", now=100)
    assert t.due_for_probe(now=105) == []
    assert t.probe_result("G2", None, now=105) is False  # too early, even if the probe is fine
    assert t.due_for_probe(now=110) == ["G2"]
    assert t.probe_result("G2", "still lost", now=111) is False
    assert t.probe_result("G2", None, now=112) is True
    assert t.healthy("G2")


@given(st.lists(st.tuples(st.sampled_from(GPUS + [None]), st.integers(0, 200)), max_size=40))
def test_only_gpus_named_by_critical_xids_turn_unhealthy(events: list[tuple[str | None, int]]) -> None:
    t = HealthTracker(APPLICATION_XIDS, quarantine_s=1)
    for uuid, xid in events:
        t.on_event(HealthEvent(uuid, xid), GPUS, now=0)
    expected = {u for u, x in events if u is not None and x not in APPLICATION_XIDS}
    assert set(t.faults) == expected
