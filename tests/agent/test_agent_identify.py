"""The identification rules, one by one, on plain API objects."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import assume, given
from hypothesis import strategies as st

from gpupool.agent.identify import Identified, Repeat, Unidentified, identify
from gpupool.api.allocation import AllocationDoc, GrantDoc
from gpupool.api.lock import ANN_BIND_LOCK, encode_lock
from gpupool.api.names import ANN_ALLOCATED, ANN_ALLOCATION, RESOURCE_GPU

N = "node-1"


def pod(
    name: str,
    count: int = 1,
    node: str = N,
    phase: str = "Pending",
    containers: int = 1,
    allocated: bool = False,
    alloc_node: str = N,
) -> dict[str, Any]:
    grants = [GrantDoc(uuid=f"G{i}", index=i, memory_mib=100, cores=10) for i in range(count)]
    annotations = {ANN_ALLOCATION: AllocationDoc(pod_uid=f"uid-{name}", node=alloc_node, gpus=grants).model_dump_json()}
    if allocated:
        annotations[ANN_ALLOCATED] = json.dumps({"node": N})
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "annotations": annotations},
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": f"c{i}", "resources": {"limits": {RESOURCE_GPU: str(count)}}} for i in range(containers)
            ],
        },
        "status": {"phase": phase},
    }


def node(holder: str | None) -> dict[str, Any]:
    annotations = {} if holder is None else {ANN_BIND_LOCK: encode_lock(f"uid-{holder}", "ns", holder, 0)}
    return {"metadata": {"name": N, "annotations": annotations}}


def reason(result: Identified | Repeat | Unidentified) -> str:
    assert isinstance(result, Unidentified), result
    return result.reason


def test_lock_holder_is_identified() -> None:
    result = identify(node("a"), [pod("a"), pod("b", allocated=True, phase="Running")], N, 1)
    assert isinstance(result, Identified) and (result.namespace, result.name, result.uid) == ("ns", "a", "uid-a")


def test_each_rule_refuses() -> None:
    assert "has no gpupool.io/bind-lock" in reason(identify(node(None), [pod("a")], N, 1))
    bad = {"metadata": {"name": N, "annotations": {ANN_BIND_LOCK: "{not json"}}}
    assert "invalid gpupool.io/bind-lock" in reason(identify(bad, [pod("a")], N, 1))
    assert "which is not on node" in reason(identify(node("ghost"), [pod("a")], N, 1))
    assert "already served" in reason(identify(node("a"), [pod("a", allocated=True)], N, 1))
    assert "is not waiting" in reason(identify(node("a"), [pod("a", phase="Running")], N, 1))
    assert "is not waiting" in reason(identify(node("a"), [pod("a", alloc_node="elsewhere")], N, 1))
    assert "does not say which container holds" in reason(identify(node("a"), [pod("a", containers=2)], N, 1))
    assert "kubelet asks for 2 device(s)" in reason(identify(node("a"), [pod("a")], N, 2))
    no_alloc = pod("a")
    del no_alloc["metadata"]["annotations"][ANN_ALLOCATION]
    assert "has no gpupool.io/allocation" in reason(identify(node("a"), [no_alloc], N, 1))
    renamed = pod("a")
    renamed["metadata"]["name"] = "other"
    assert "belongs to ns/other" in reason(identify(node("a"), [renamed], N, 1))


def test_a_rival_of_the_same_size_makes_it_ambiguous() -> None:
    text = reason(identify(node("b"), [pod("a"), pod("b")], N, 1))
    assert "ambiguous" in text and "ns/a" in text
    # a rival of another size cannot be the subject of this call; finished or served pods are no rivals
    assert isinstance(identify(node("b"), [pod("a", count=2), pod("b")], N, 1), Identified)
    assert isinstance(identify(node("b"), [pod("a", phase="Failed"), pod("b")], N, 1), Identified)
    assert isinstance(identify(node("b"), [pod("a", allocated=True), pod("b")], N, 1), Identified)


def rogue(name: str, count: int = 1) -> dict[str, Any]:
    """A GPU pod bound with spec.nodeName: no allocation, never seen by the scheduler."""
    p = pod(name, count=count)
    del p["metadata"]["annotations"][ANN_ALLOCATION]
    return p


def test_a_gpu_pod_without_an_allocation_makes_the_lock_ambiguous() -> None:
    text = reason(identify(node("a"), [pod("a"), rogue("b")], N, 1))
    assert "ambiguous" in text and "ns/b" in text and "bound without gpupool's scheduler" in text
    # it cannot be the subject of a call of another size, and once finished it is no candidate at all
    assert isinstance(identify(node("a"), [pod("a"), rogue("b", count=2)], N, 1), Identified)
    failed = rogue("b")
    failed["status"]["phase"] = "Failed"
    assert isinstance(identify(node("a"), [pod("a"), failed], N, 1), Identified)


def test_a_repeat_is_answered_only_when_no_other_pod_could_be_the_subject() -> None:
    served = pod("a", allocated=True, phase="Running")
    assert identify(node(None), [served], N, 1, answered={"uid-a"}) == Repeat("ns", "a", "uid-a")
    # the lock holder waits for an Allocate of the same size: the devices may have moved on to it
    assert "ambiguous" in reason(identify(node("b"), [served, pod("b")], N, 1, answered={"uid-a"}))
    # a finished pod's devices are free again: no repeat for it
    done = pod("a", allocated=True, phase="Succeeded")
    assert isinstance(identify(node("b"), [done, pod("b")], N, 1, answered={"uid-a"}), Identified)


STATES: dict[str, dict[str, Any]] = {
    "waiting": {},
    "served": {"allocated": True},
    "running": {"phase": "Running", "allocated": True},
    "failed": {"phase": "Failed"},
    "rogue": {},  # no allocation: bound with spec.nodeName
}


def make(name: str, count: int, state: str) -> dict[str, Any]:
    return rogue(name, count) if state == "rogue" else pod(name, count=count, **STATES[state])


@given(
    st.lists(st.tuples(st.integers(1, 3), st.sampled_from(sorted(STATES))), min_size=1, max_size=6),
    st.data(),
)
def test_a_served_call_is_always_for_the_pod_kubelet_admits(specs: list[tuple[int, str]], data: st.DataObject) -> None:
    """Safety (R3): kubelet calls Allocate for some pod S that waits (a gpupool pod or a rogue one), or
    repeats a call for a served pod S with the devices it was answered. Whatever the lock and the
    checkpoint say, if identify names a pod, it is S."""
    pods = [make(f"p{i}", c, state) for i, (c, state) in enumerate(specs)]
    states = [state for _, state in specs]
    waiting = [p for p, state in zip(pods, states, strict=True) if state in ("waiting", "rogue")]
    served = [p for p, state in zip(pods, states, strict=True) if state in ("served", "running")]
    assume(waiting or served)
    subject = data.draw(st.sampled_from(waiting + served))
    holder = data.draw(st.sampled_from([None] + [p["metadata"]["name"] for p in pods]))
    # The checkpoint names the pods answered exactly these device IDs: besides S (when S repeats), pods that
    # finished, or served pods whose admission failed after the answer (kubelet freed their devices before
    # the API shows them Failed).
    others = [p["metadata"]["uid"] for p, state in zip(pods, states, strict=True) if state != "waiting"]
    answered = set(data.draw(st.lists(st.sampled_from(others), unique=True))) if others else set()
    if subject in served:
        answered.add(subject["metadata"]["uid"])
    count = int(subject["spec"]["containers"][0]["resources"]["limits"][RESOURCE_GPU])  # kubelet asks this many
    result = identify(node(holder), pods, N, count, answered)
    if isinstance(result, Identified | Repeat):
        assert result.uid == subject["metadata"]["uid"]
