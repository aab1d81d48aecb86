"""The shared rule: which pods still wait for their device allocation (scheduler and agent read it alike)."""

from __future__ import annotations

import json

from gpupool.api.names import ANN_ALLOCATED, ANN_ALLOCATION
from gpupool.api.waiting import awaits_allocate, waiting_for_allocate


def _pod(phase: str = "Pending", node: str | None = "n1", **annotations: str) -> dict:
    return {"metadata": {"uid": "u", "name": "p", "namespace": "default", "annotations": annotations},
            "spec": {"nodeName": node} if node else {}, "status": {"phase": phase}}


def _allocation(node: str) -> str:
    return json.dumps({"pod_uid": "u", "node": node, "time": "2026-11-21T06:00:00Z",
                       "gpus": [{"uuid": "GPU-0", "index": 0, "memory_mib": 1024, "cores": 10.0}]})


def test_running_finished_deleting_or_marked_pods_no_longer_wait():
    assert awaits_allocate(_pod("Pending"))
    for phase in ("Running", "Succeeded", "Failed"):
        assert not awaits_allocate(_pod(phase))
    deleting = _pod()
    deleting["metadata"]["deletionTimestamp"] = "2026-11-21T06:00:00Z"
    assert not awaits_allocate(deleting)
    assert not awaits_allocate(_pod(**{ANN_ALLOCATED: "{}"}))


def test_the_waiting_allocation_must_be_readable_and_for_this_node():
    doc = waiting_for_allocate(_pod(**{ANN_ALLOCATION: _allocation("n1")}), "n1")
    assert doc is not None and doc.node == "n1" and doc.time == "2026-11-21T06:00:00Z"
    assert waiting_for_allocate(_pod(**{ANN_ALLOCATION: _allocation("n1")}), "n2") is None  # bound elsewhere
    assert waiting_for_allocate(_pod(**{ANN_ALLOCATION: _allocation("n2")}), "n1") is None  # written for n2
    assert waiting_for_allocate(_pod(**{ANN_ALLOCATION: "{not json"}), "n1") is None
    assert waiting_for_allocate(_pod(), "n1") is None  # no allocation: bound past the scheduler
    assert waiting_for_allocate(_pod("Running", **{ANN_ALLOCATION: _allocation("n1")}), "n1") is None
