"""gpupool.scheduler.node_rules: may_run's answers remembered per pod shape and node version (MayRunCache)
are may_run's own, and a node that changes (labels, taints) is asked again."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.scheduler.node_rules import MayRunCache, may_run, pod_shape

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def node(name: str, version: int | None, labels: dict[str, str] | None = None,
         taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": dict(labels or {})}
    if version is not None:
        meta["resourceVersion"] = str(version)
    return {"metadata": meta, "spec": {"taints": list(taints or [])}}


def pod(selector: dict[str, str] | None = None, tolerations: list[dict[str, str]] | None = None,
        affinity: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeSelector": dict(selector or {}), "tolerations": list(tolerations or [])}
    if affinity is not None:
        spec["affinity"] = {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": affinity}]}}}
    return {"metadata": {"name": "p"}, "spec": spec}


GPU_ZONE = {"zone": "a"}
HARD = {"key": "maintenance", "value": "yes", "effect": "NoSchedule"}


def test_a_node_relabelled_or_tainted_is_asked_again() -> None:
    """The cached answer follows the node's new version: without the version in the key, the second and
    third answers would repeat the first."""
    cache = MayRunCache()
    objs = {"n1": node("n1", 1, GPU_ZONE)}
    p = pod({"zone": "a"})
    assert cache.allowed(p, ["n1"], objs) == [True]
    objs["n1"] = node("n1", 2, {"zone": "b"})  # relabelled: a new object with a new version
    assert cache.allowed(p, ["n1"], objs) == [False]
    objs["n1"] = node("n1", 3, GPU_ZONE)
    assert cache.allowed(p, ["n1"], objs) == [True]
    objs["n1"] = node("n1", 4, GPU_ZONE, [HARD])  # tainted
    assert cache.allowed(p, ["n1"], objs) == [False]


def test_the_answer_is_remembered_for_the_same_version() -> None:
    """Same version, same answer, without asking may_run again: an object changed in place under an
    unchanged version (which the API never serves) shows that the answer came from the cache."""
    cache = MayRunCache()
    objs = {"n1": node("n1", 7, GPU_ZONE)}
    p = pod({"zone": "a"})
    assert cache.allowed(p, ["n1"], objs) == [True]
    objs["n1"]["metadata"]["labels"] = {"zone": "b"}
    assert cache.allowed(p, ["n1"], objs) == [True]


def test_a_node_without_a_version_is_never_remembered() -> None:
    cache = MayRunCache()
    objs = {"n1": node("n1", None, GPU_ZONE)}
    p = pod({"zone": "a"})
    assert cache.allowed(p, ["n1"], objs) == [True]
    objs["n1"]["metadata"]["labels"] = {"zone": "b"}
    assert cache.allowed(p, ["n1"], objs) == [False]


def test_pods_of_other_shapes_get_their_own_answers() -> None:
    cache = MayRunCache()
    objs = {"n1": node("n1", 1, GPU_ZONE, [HARD]), "n2": node("n2", 1, {"zone": "b"})}
    names = ["n1", "n2", "gone"]
    assert cache.allowed(pod(), names, objs) == [False, True, False]
    assert cache.allowed(pod({"zone": "b"}), names, objs) == [False, True, False]
    assert cache.allowed(pod({"zone": "a"}, [{"key": "maintenance", "operator": "Exists"}]), names, objs) == \
        [True, False, False]
    assert cache.allowed(pod(affinity=[{"key": "zone", "operator": "In", "values": ["a"]}],
                             tolerations=[{"operator": "Exists"}]), names, objs) == [True, False, False]


def test_the_shape_is_all_may_run_reads_of_the_pod() -> None:
    base = pod({"zone": "a"})
    other_name = copy.deepcopy(base)
    other_name["metadata"]["name"] = "q"
    other_name["spec"]["containers"] = [{"name": "main"}]
    assert pod_shape(other_name) == pod_shape(base)  # nothing may_run reads differs
    assert pod_shape(pod({"zone": "b"})) != pod_shape(base)
    assert pod_shape(pod({"zone": "a"}, [{"operator": "Exists"}])) != pod_shape(base)
    assert pod_shape(pod({"zone": "a"}, affinity=[{"key": "k", "operator": "Exists"}])) != pod_shape(base)
    # the selector's key order does not matter
    assert pod_shape(pod({"a": "1", "b": "2"})) == pod_shape(pod({"b": "2", "a": "1"}))


def test_the_least_recently_asked_shape_is_forgotten_beyond_the_bound() -> None:
    cache = MayRunCache(shapes=2)
    objs = {"n1": node("n1", 1, GPU_ZONE)}
    a, b, c = pod({"zone": "a"}), pod({"zone": "b"}), pod({"zone": "c"})
    for p in (a, b, a, c):  # b is then the least recently asked
        cache.allowed(p, ["n1"], objs)
    objs["n1"]["metadata"]["labels"] = {"zone": "b"}  # in place, same version: only a forgotten shape sees it
    assert cache.allowed(a, ["n1"], objs) == [True]  # remembered
    assert cache.allowed(b, ["n1"], objs) == [True]  # forgotten, asked again: the label now matches


LABELS = st.dictionaries(st.sampled_from(["zone", "gpu", "rack"]), st.sampled_from(["a", "b"]), max_size=3)
TAINTS = st.lists(st.fixed_dictionaries({"key": st.sampled_from(["t1", "t2"]), "value": st.sampled_from(["x", ""]),
                                         "effect": st.sampled_from(["NoSchedule", "NoExecute", "PreferNoSchedule"])}),
                  max_size=2)
TOLERATIONS = st.lists(st.fixed_dictionaries({"key": st.sampled_from(["t1", "t2", ""]),
                                              "operator": st.sampled_from(["Exists", "Equal"]),
                                              "value": st.sampled_from(["x", ""])}), max_size=2)


@settings(max_examples=80, deadline=None)
@given(steps=st.lists(st.tuples(st.integers(0, 3), LABELS, TAINTS, LABELS, TOLERATIONS), min_size=1, max_size=12))
def test_the_cache_answers_as_may_run_through_any_node_changes(
        steps: list[tuple[int, dict[str, str], list[dict[str, str]], dict[str, str], list[dict[str, str]]]]) -> None:
    """Each step replaces one node (a new version) and asks for a pod: the answers are may_run's."""
    cache = MayRunCache(shapes=3)
    names = [f"n{i}" for i in range(4)]
    objs = {n: node(n, 1) for n in names}
    for version, (which, labels, taints, selector, tolerations) in enumerate(steps, start=2):
        objs[names[which]] = node(names[which], version, labels, taints)
        p = pod(selector, tolerations)
        assert cache.allowed(p, names, objs) == [may_run(p, objs[n]) for n in names]
