"""gpupool.scheduler.node_rules: may_run's answers remembered per pod shape and node version (MayRunCache)
are may_run's own, and a node that changes (labels, taints) is asked again."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.scheduler.node_rules import MayRunCache, may_run, pod_shape

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def node(name: str, labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None
         ) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": dict(labels or {})}, "spec": {"taints": list(taints or [])}}


def pod(selector: dict[str, str] | None = None, tolerations: list[dict[str, str]] | None = None,
        affinity: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeSelector": dict(selector or {}), "tolerations": list(tolerations or [])}
    if affinity is not None:
        spec["affinity"] = {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": affinity}]}}}
    return {"metadata": {"name": "p"}, "spec": spec}


GPU_ZONE = {"zone": "a"}
HARD = {"key": "maintenance", "value": "yes", "effect": "NoSchedule"}


class Nodes:
    """Node objects with the ledger's kind of versions: each `put` is a new version of its node."""

    def __init__(self, *objs: dict[str, Any]) -> None:
        self.objs: dict[str, dict[str, Any]] = {}
        self.versions: dict[str, int] = {}
        self.serial = 0
        for o in objs:
            self.put(o)

    def put(self, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        self.objs[name] = obj
        self.serial += 1
        self.versions[name] = self.serial

    def remove(self, name: str) -> None:
        del self.objs[name], self.versions[name]
        self.serial += 1

    def ask(self, cache: MayRunCache, p: dict[str, Any], names: list[str]) -> list[bool]:
        answer: list[bool] = cache.allowed(p, names, self.objs, self.versions, self.serial).tolist()
        return answer


def test_a_node_relabelled_or_tainted_is_asked_again() -> None:
    """The answer follows the node's new version: without the version in the key, the second and third
    answers would repeat the first."""
    cache = MayRunCache()
    nodes = Nodes(node("n1", GPU_ZONE))
    p = pod({"zone": "a"})
    assert nodes.ask(cache, p, ["n1"]) == [True]
    nodes.put(node("n1", {"zone": "b"}))  # relabelled
    assert nodes.ask(cache, p, ["n1"]) == [False]
    nodes.put(node("n1", GPU_ZONE))
    assert nodes.ask(cache, p, ["n1"]) == [True]
    nodes.put(node("n1", GPU_ZONE, [HARD]))  # tainted
    assert nodes.ask(cache, p, ["n1"]) == [False]


def test_the_answer_is_remembered_for_the_same_version() -> None:
    """Same version, same answer, without asking may_run again: an object changed in place under an
    unchanged version (which the ledger never holds) shows that the answer came from the cache."""
    cache = MayRunCache()
    nodes = Nodes(node("n1", GPU_ZONE))
    p = pod({"zone": "a"})
    assert nodes.ask(cache, p, ["n1"]) == [True]
    nodes.objs["n1"]["metadata"]["labels"] = {"zone": "b"}
    assert nodes.ask(cache, p, ["n1"]) == [True]


def test_a_node_without_a_version_is_never_remembered() -> None:
    cache = MayRunCache()
    objs = {"n1": node("n1", GPU_ZONE), "n2": node("n2", GPU_ZONE)}
    p = pod({"zone": "a"})
    assert cache.allowed(p, ["n1", "n2"], objs, {"n2": 1}, 1).tolist() == [True, True]
    objs["n1"]["metadata"]["labels"] = {"zone": "b"}
    assert cache.allowed(p, ["n1", "n2"], objs, {"n2": 1}, 1).tolist() == [False, True]


def test_while_no_node_changes_the_whole_answer_is_kept_and_a_removed_node_is_asked_again() -> None:
    """The same names under the same serial: the kept answer (an object changed in place, which the ledger
    never does, shows it). Other names, or a new serial, look at each node again: a node that went is one
    the pod may not go to."""
    cache = MayRunCache()
    nodes = Nodes(node("n1", GPU_ZONE), node("n2", GPU_ZONE))
    p = pod({"zone": "a"})
    assert nodes.ask(cache, p, ["n1", "n2"]) == [True, True]
    nodes.objs["n1"]["metadata"]["labels"] = {"zone": "b"}
    assert nodes.ask(cache, p, ["n1", "n2"]) == [True, True]
    nodes.remove("n2")
    assert nodes.ask(cache, p, ["n1", "n2"]) == [True, False]  # n1: its version stayed
    assert nodes.ask(cache, p, ["n2"]) == [False]


def test_pods_of_other_shapes_get_their_own_answers() -> None:
    cache = MayRunCache()
    nodes = Nodes(node("n1", GPU_ZONE, [HARD]), node("n2", {"zone": "b"}))
    names = ["n1", "n2", "gone"]
    assert nodes.ask(cache, pod(), names) == [False, True, False]
    assert nodes.ask(cache, pod({"zone": "b"}), names) == [False, True, False]
    assert nodes.ask(cache, pod({"zone": "a"}, [{"key": "maintenance", "operator": "Exists"}]), names) == \
        [True, False, False]
    assert nodes.ask(cache, pod(affinity=[{"key": "zone", "operator": "In", "values": ["a"]}],
                                tolerations=[{"operator": "Exists"}]), names) == [True, False, False]


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
    nodes = Nodes(node("n1", GPU_ZONE))
    a, b, c = pod({"zone": "a"}), pod({"zone": "b"}), pod({"zone": "c"})
    for p in (a, b, a, c):  # b is then the least recently asked
        nodes.ask(cache, p, ["n1"])
    nodes.objs["n1"]["metadata"]["labels"] = {"zone": "b"}  # in place, same version: only a forgotten shape sees it
    assert nodes.ask(cache, a, ["n1"]) == [True]  # remembered
    assert nodes.ask(cache, b, ["n1"]) == [True]  # forgotten, asked again: the label now matches


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
    nodes = Nodes(*(node(n) for n in names))
    for which, labels, taints, selector, tolerations in steps:
        nodes.put(node(names[which], labels, taints))
        p = pod(selector, tolerations)
        assert nodes.ask(cache, p, names) == [may_run(p, nodes.objs[n]) for n in names]
