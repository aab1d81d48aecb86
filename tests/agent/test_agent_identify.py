"""The identification rules, one by one, on plain API objects."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import assume, given
from hypothesis import strategies as st

from gpupool.agent.identify import ANN_ALLOCATED, Identified, Unidentified, identify
from gpupool.api.allocation import AllocationDoc, GrantDoc
from gpupool.api.lock import ANN_BIND_LOCK, encode_lock
from gpupool.api.names import ANN_ALLOCATION, RESOURCE_GPU

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


def reason(result: Identified | Unidentified) -> str:
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
    assert "2 containers asking" in reason(identify(node("a"), [pod("a", containers=2)], N, 1))
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


STATES = {
    "waiting": {},
    "served": {"allocated": True},
    "running": {"phase": "Running", "allocated": True},
    "failed": {"phase": "Failed"},
}


@given(
    st.lists(st.tuples(st.integers(1, 3), st.sampled_from(sorted(STATES))), min_size=1, max_size=6),
    st.data(),
)
def test_a_served_call_is_always_for_the_pod_kubelet_admits(specs: list[tuple[int, str]], data: st.DataObject) -> None:
    """Safety (R3): kubelet calls Allocate for some waiting pod S. Whatever the lock says, if identify names
    a pod, it is S."""
    pods = [pod(f"p{i}", count=c, **STATES[state]) for i, (c, state) in enumerate(specs)]
    waiting = [p for p, (_, state) in zip(pods, specs, strict=True) if state == "waiting"]
    assume(waiting)
    subject = data.draw(st.sampled_from(waiting))
    holder = data.draw(st.sampled_from([None] + [p["metadata"]["name"] for p in pods]))
    count = int(subject["spec"]["containers"][0]["resources"]["limits"][RESOURCE_GPU])  # kubelet asks this many
    result = identify(node(holder), pods, N, count)
    if isinstance(result, Identified):
        assert result.uid == subject["metadata"]["uid"]
