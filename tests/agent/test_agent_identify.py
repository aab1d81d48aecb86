"""The identification rules, one by one, on plain API objects: the call is for the only candidate."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import assume, given
from hypothesis import strategies as st

from gpupool.agent.identify import Identified, Repeat, Unidentified, identify
from gpupool.api.allocation import AllocationDoc, ContainerDoc, GrantDoc
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


def reason(result: Identified | Repeat | Unidentified) -> str:
    assert isinstance(result, Unidentified), result
    return result.reason


def named(result: Identified | Repeat | Unidentified) -> tuple[str, str]:
    assert isinstance(result, Identified | Repeat), result
    return type(result).__name__, result.name


def test_the_only_candidate_is_identified() -> None:
    # b is served and running: no candidate, whatever its size
    result = identify([pod("a"), pod("b", allocated=True, phase="Running")], N, 1)
    assert isinstance(result, Identified)
    assert (result.namespace, result.name, result.uid) == ("ns", "a", "uid-a")
    assert result.allocation.node == N and [g.uuid for g in result.allocation.gpus] == ["G0"]


def test_no_candidate_is_refused_with_the_reason() -> None:
    nobody = reason(identify([], N, 1))
    assert "no pod bound to node node-1 waits for an Allocate of 1 device(s)" in nobody
    assert "not guessing" in nobody
    # a served pod, a running one, a finished one, one on another node: none waits here
    for p in (pod("a", allocated=True), pod("a", phase="Running"), pod("a", phase="Succeeded"), pod("a", node="n2")):
        assert "no pod bound to node node-1 waits" in reason(identify([p], N, 1))
    # a waiting pod of another size is no candidate either; the reason names it and what it asks for
    other_size = reason(identify([pod("a", count=2)], N, 1))
    assert "no pod bound to node node-1 waits for an Allocate of 1 device(s)" in other_size
    assert "pods waiting here for other counts: ns/a asks for 2" in other_size


def with_allocation(p: dict[str, Any], doc: AllocationDoc | str | None) -> dict[str, Any]:
    annotations = p["metadata"]["annotations"]
    if doc is None:
        del annotations[ANN_ALLOCATION]
    else:
        annotations[ANN_ALLOCATION] = doc if isinstance(doc, str) else doc.model_dump_json(exclude_none=True)
    return p


def test_each_check_refuses_the_only_candidate() -> None:
    g = GrantDoc(uuid="G0", index=0, memory_mib=100, cores=10)
    assert "has no gpupool.io/allocation" in reason(identify([with_allocation(pod("a"), None)], N, 1))
    assert "gpupool.io/allocation" in reason(identify([with_allocation(pod("a"), "{not json")], N, 1))
    assert "is for node 'elsewhere', not node-1" in reason(identify([pod("a", alloc_node="elsewhere")], N, 1))
    foreign = with_allocation(pod("a"), AllocationDoc(pod_uid="uid-other", node=N, gpus=[g]))
    assert "written for pod uid uid-other" in reason(identify([foreign], N, 1))
    # two GPU containers: version 1 does not say who holds what, and version 2 must give each its part
    assert "does not say which container holds" in reason(identify([pod("a", containers=2)], N, 1))
    half = AllocationDoc(version=2, pod_uid="uid-a", node=N, gpus=[g], containers=[ContainerDoc(name="c0", gpus=[g])])
    assert "gives no GPUs to c1" in reason(identify([with_allocation(pod("a", containers=2), half)], N, 1))
    both = half.model_copy(update={"containers": [ContainerDoc(name=f"c{i}", gpus=[g]) for i in range(2)]})
    assert named(identify([with_allocation(pod("a", containers=2), both)], N, 1)) == ("Identified", "a")


def test_two_waiting_pods_of_the_same_size_are_ambiguous() -> None:
    # a's hold ran out on the scheduler's side and b was bound while a still waits: either may be admitted
    text = reason(identify([pod("a"), pod("b")], N, 1))
    assert text.startswith("ambiguous: ns/a, ns/b could each be the pod this Allocate of 1 device(s)")
    assert "refusing to guess" in text
    # finished or served pods are no rivals
    assert named(identify([pod("a", phase="Failed"), pod("b")], N, 1)) == ("Identified", "b")
    assert named(identify([pod("a", allocated=True), pod("b")], N, 1)) == ("Identified", "b")
    assert named(identify([pod("a", phase="Running"), pod("b")], N, 1)) == ("Identified", "b")


def test_two_waiting_pods_of_different_sizes_each_get_their_own_call() -> None:
    pods = [pod("a", count=1), pod("b", count=2)]
    assert named(identify(pods, N, 1)) == ("Identified", "a")
    assert named(identify(pods, N, 2)) == ("Identified", "b")
    assert "no pod bound to node node-1 waits for an Allocate of 3" in reason(identify(pods, N, 3))


def rogue(name: str, count: int = 1) -> dict[str, Any]:
    """A GPU pod bound with spec.nodeName: no allocation, never seen by the scheduler."""
    return with_allocation(pod(name, count=count), None)


def test_a_gpu_pod_without_an_allocation_makes_the_call_ambiguous() -> None:
    text = reason(identify([pod("a"), rogue("b")], N, 1))
    assert "ambiguous" in text and "ns/a" in text and "ns/b" in text and "bound without gpupool's scheduler" in text
    # alone, it is refused for lacking an allocation (never served with a guessed share)
    assert "has no gpupool.io/allocation" in reason(identify([rogue("b")], N, 1))
    # it cannot be the subject of a call of another size, and once finished it is no candidate at all
    assert named(identify([pod("a"), rogue("b", count=2)], N, 1)) == ("Identified", "a")
    failed = rogue("b")
    failed["status"]["phase"] = "Failed"
    assert named(identify([pod("a"), failed], N, 1)) == ("Identified", "a")


def test_a_repeat_is_answered_only_when_no_other_pod_could_be_the_subject() -> None:
    served = pod("a", allocated=True, phase="Running")
    assert identify([served], N, 1, answered={"uid-a"}) == Repeat("ns", "a", "uid-a")
    # b waits for an Allocate of the same size: the devices may have moved on to it
    text = reason(identify([served, pod("b")], N, 1, answered={"uid-a"}))
    assert "ambiguous" in text and "ns/a (was answered these devices before)" in text and "ns/b" in text
    # a waiting pod of another size does not matter
    assert identify([served, pod("b", count=2)], N, 1, answered={"uid-a"}) == Repeat("ns", "a", "uid-a")
    # a finished pod's devices are free again: no repeat for it
    done = pod("a", allocated=True, phase="Succeeded")
    assert named(identify([done, pod("b")], N, 1, answered={"uid-a"})) == ("Identified", "b")


def test_a_repeat_of_a_pod_that_still_waits_is_identified_and_falls_back_to_a_repeat() -> None:
    # a has two GPU containers, the first one served with these devices: it still waits (no marker, not
    # Running), so it is identified with its allocation and which_container picks the container
    g = GrantDoc(uuid="G0", index=0, memory_mib=100, cores=10)
    doc = AllocationDoc(version=2, pod_uid="uid-a", node=N, gpus=[g],
                        containers=[ContainerDoc(name=f"c{i}", gpus=[g]) for i in range(2)])
    duo = with_allocation(pod("a", containers=2), doc)
    assert named(identify([duo], N, 1, answered={"uid-a"})) == ("Identified", "a")
    # its allocation no longer readable: the checkpointed answer may be given again, nothing new
    broken = with_allocation(pod("a", containers=2), "{not json")
    assert identify([broken], N, 1, answered={"uid-a"}) == Repeat("ns", "a", "uid-a")
    # another waiting pod of the same size makes it ambiguous, repeat or not
    assert "ambiguous" in reason(identify([duo, pod("b")], N, 1, answered={"uid-a"}))


STATES: dict[str, dict[str, Any]] = {
    "waiting": {},
    "served": {"allocated": True},
    "running": {"phase": "Running", "allocated": True},
    "failed": {"phase": "Failed"},
    "rogue": {},  # no allocation: bound with spec.nodeName
    "elsewhere": {"alloc_node": "n2"},  # waits, with an allocation for another node
}


def make(name: str, count: int, state: str) -> dict[str, Any]:
    return rogue(name, count) if state == "rogue" else pod(name, count=count, **STATES[state])


@given(
    st.lists(st.tuples(st.integers(1, 3), st.sampled_from(sorted(STATES))), min_size=1, max_size=6),
    st.data(),
)
def test_a_served_call_is_always_for_the_pod_kubelet_admits(specs: list[tuple[int, str]], data: st.DataObject) -> None:
    """Safety (R3): kubelet calls Allocate for some pod S that waits (a gpupool pod or a rogue one), or
    repeats a call for a served pod S with the devices it was answered. Whatever other pods wait on the
    node and whatever the checkpoint says, if identify names a pod, it is S."""
    pods = [make(f"p{i}", c, state) for i, (c, state) in enumerate(specs)]
    states = [state for _, state in specs]
    waiting = [p for p, state in zip(pods, states, strict=True) if state in ("waiting", "rogue", "elsewhere")]
    served = [p for p, state in zip(pods, states, strict=True) if state in ("served", "running")]
    assume(waiting or served)
    subject = data.draw(st.sampled_from(waiting + served))
    # The checkpoint names the pods answered exactly these device IDs: besides S (when S repeats), pods that
    # finished, served pods whose admission failed after the answer (kubelet freed their devices before
    # the API shows them Failed), or a waiting pod one of whose containers was served.
    others = [p["metadata"]["uid"] for p in pods if p is not subject]
    answered = set(data.draw(st.lists(st.sampled_from(others), unique=True))) if others else set()
    if subject in served:
        answered.add(subject["metadata"]["uid"])
    count = int(subject["spec"]["containers"][0]["resources"]["limits"][RESOURCE_GPU])  # kubelet asks this many
    result = identify(pods, N, count, answered)
    if isinstance(result, Identified | Repeat):
        assert result.uid == subject["metadata"]["uid"]


# --- which containers ask for GPUs: the one pod reader (gpupool.api.pod) decides, for the agent too ----------

# How a count may be written in a pod: the API server accepts any quantity that is a whole number.
COUNT_TEXT = [lambda n: n, str, lambda n: f"{n}e0", lambda n: f"{n * 1000}m"]


@given(st.lists(st.tuples(st.sampled_from(["init", "sidecar", "app"]), st.integers(1, 4),
                          st.sampled_from(range(len(COUNT_TEXT))), st.booleans()), min_size=1, max_size=5))
def test_the_agent_counts_a_pods_gpus_as_the_scheduler_does(specs: list[tuple[str, int, int, bool]]) -> None:
    """kubelet's Allocate carries a container's gpupool.io/gpu count; the agent matches calls to pods by
    it, so it must read each container's count as the scheduler placed it (parse_pod), whatever way the
    quantity is written, and know which containers hand their devices on (plain init containers only)."""
    from gpupool.agent.identify import gpu_containers
    from gpupool.api.pod import INIT, parse_pod

    inits: list[dict[str, Any]] = []
    apps: list[dict[str, Any]] = []
    for i, (kind, count, form, in_requests) in enumerate(specs):
        section = "requests" if in_requests else "limits"
        c: dict[str, Any] = {"name": f"c{i}", "resources": {section: {RESOURCE_GPU: COUNT_TEXT[form](count)}}}
        if kind == "sidecar":
            c["restartPolicy"] = "Always"
        (apps if kind == "app" else inits).append(c)
    subject = {"metadata": {"name": "p"}, "spec": {"initContainers": inits, "containers": apps}}
    read = [(c.name, c.count, c.reusable) for c in gpu_containers(subject)]
    placed = [(c.name, c.count, c.kind == INIT) for c in parse_pod(subject).containers]
    assert read == placed and len(read) == len(specs)


def test_containers_asking_for_no_gpu_or_an_unreadable_count() -> None:
    from gpupool.agent.identify import GpuContainer, gpu_containers

    subject = {"spec": {"containers": [
        {"name": "cpu-only", "resources": {"limits": {"cpu": "1"}}},
        {"name": "zero", "resources": {"limits": {RESOURCE_GPU: "0"}}},  # kubelet makes no Allocate for it
        {"name": "bad", "resources": {"limits": {RESOURCE_GPU: "two"}}},  # never matches a call
        {"name": "limit-wins", "resources": {"requests": {RESOURCE_GPU: "1"}, "limits": {RESOURCE_GPU: "2"}}},
    ]}}
    assert gpu_containers(subject) == [GpuContainer("bad", -1, False), GpuContainer("limit-wins", 2, False)]
