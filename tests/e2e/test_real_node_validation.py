"""Node validation through a real kubelet: a validation fault written into the agent's fake GPU file
(re-read on SIGHUP) takes the node's gpupool.io/gpu allocatable to 0, with the condition GpupoolReady and
the labels saying why; the fix brings the slots back."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import pytest

from tests.e2e.real_node_fixtures import (
    GPUS_PER_NODE,
    SPLIT,
    RealCluster,
    no_pods_left,  # noqa: F401  (autouse)
    real_cluster,  # noqa: F401  (module fixture)
    wait_for,
)

pytestmark = pytest.mark.e2e


def _set_fault(c: RealCluster, step: str | None, reason: str = "") -> None:
    agent = c.agent(0)
    doc: dict[str, Any] = json.loads(agent.fake_file.read_text())
    doc["validation"] = {step: reason} if step else {}
    agent.fake_file.write_text(json.dumps(doc))
    assert agent.proc is not None
    os.kill(agent.proc.pid, signal.SIGHUP)  # re-validate now (docs/agent.md)


def _condition(c: RealCluster) -> dict[str, Any]:
    node = c.node_obj(0) or {}
    return next((x for x in (node.get("status") or {}).get("conditions") or [] if x["type"] == "GpupoolReady"), {})


def test_a_validation_fault_withdraws_the_gpus_and_its_fix_brings_them_back(real_cluster: RealCluster) -> None:  # noqa: F811
    c = real_cluster
    wait_for(lambda: _condition(c).get("status") == "True", 60, "GpupoolReady True on a healthy node",
             lambda: f"{_condition(c)}\n{c.agent(0).tail()}")
    for step, reason in (("toolkit", "toolkit 1.17.3 is older than 1.17.8"), ("workload", "CUDA error 999")):
        _set_fault(c, step, reason)
        wait_for(lambda: c.gpu_slots(0) == 0, 90, f"allocatable 0 after a {step} fault", c.agent(0).tail)
        cond = _condition(c)
        assert (cond["status"], cond["reason"], cond["message"]) == ("False", f"{step.capitalize()}Failed",
                                                                     f"{step}: {reason}")
        labels = (c.node_obj(0) or {})["metadata"]["labels"]
        assert labels[f"gpupool.io/validation.{step}"] == "false"
        assert c.gpu_slots(1) == GPUS_PER_NODE * SPLIT  # the other node is untouched
        _set_fault(c, None)
        wait_for(lambda: c.gpu_slots(0) == GPUS_PER_NODE * SPLIT, 90, f"slots back after the {step} fix",
                 c.agent(0).tail)
        assert _condition(c)["status"] == "True"
