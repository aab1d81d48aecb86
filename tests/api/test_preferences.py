"""Soft scheduling preferences of a pod and PreferNoSchedule taints, as kube-scheduler reads them."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpupool.api.preferences import required_affinity_allows, soft_preferences, soft_taints, untolerated

PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def _pod(spec: dict) -> dict:
    return {"metadata": {"name": "p"}, "spec": spec}


def test_each_kind_of_soft_preference_is_named():
    spec = {
        "affinity": {"nodeAffinity": {PREFERRED: [{"weight": 1}]}, "podAffinity": {PREFERRED: [{"weight": 2}]},
                     "podAntiAffinity": {PREFERRED: [{"weight": 3}]}},
        "topologySpreadConstraints": [{"whenUnsatisfiable": "DoNotSchedule"},
                                      {"whenUnsatisfiable": "ScheduleAnyway"}],
    }
    assert soft_preferences(_pod(spec)) == ["nodeAffinity", "podAffinity", "podAntiAffinity",
                                            "topologySpreadConstraints"]


def test_hard_constraints_and_empty_lists_are_not_preferences():
    spec = {
        "affinity": {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": []}, PREFERRED: []},
                     "podAntiAffinity": {REQUIRED: [{"topologyKey": "kubernetes.io/hostname"}]}},
        "topologySpreadConstraints": [{"whenUnsatisfiable": "DoNotSchedule"}],
        "nodeSelector": {"zone": "a"},
    }
    assert soft_preferences(_pod(spec)) == []
    assert soft_preferences({}) == []


def test_malformed_shapes_are_read_as_absent():
    assert soft_preferences(_pod({"affinity": "x", "topologySpreadConstraints": {"a": 1}})) == []
    assert soft_preferences({"spec": None}) == []
    assert soft_taints({"spec": {"taints": ["x", {"effect": "PreferNoSchedule", "key": "k"}]}}) == (
        {"effect": "PreferNoSchedule", "key": "k"},)


TAINT = {"key": "maintenance", "value": "soon", "effect": "PreferNoSchedule"}


def test_toleration_matching_follows_kubernetes():
    def count(*tolerations: dict) -> int:
        return untolerated(_pod({"tolerations": list(tolerations)}), [TAINT])

    assert count() == 1
    assert count({"operator": "Exists"}) == 0  # empty key + Exists: every taint
    assert count({"key": "maintenance", "operator": "Exists"}) == 0
    assert count({"key": "maintenance", "value": "soon"}) == 0  # Equal is the default operator
    assert count({"key": "maintenance", "operator": "Equal", "value": "later"}) == 1
    assert count({"key": "maintenance", "operator": "Exists", "effect": "NoSchedule"}) == 1  # other effect
    assert count({"key": "other", "operator": "Exists"}) == 1
    assert count({"operator": "Equal", "value": "soon"}) == 1  # Equal needs a key
    assert count("not a map") == 1  # type: ignore[arg-type]


_taint = st.fixed_dictionaries({"key": st.sampled_from(["a", "b", "c"]), "value": st.sampled_from(["", "x", "y"]),
                                "effect": st.just("PreferNoSchedule")})
_toleration = st.fixed_dictionaries({}, optional={
    "key": st.sampled_from(["", "a", "b"]), "value": st.sampled_from(["", "x"]),
    "operator": st.sampled_from(["Equal", "Exists"]),
    "effect": st.sampled_from(["", "PreferNoSchedule", "NoSchedule"])})


@given(st.lists(_taint, max_size=4), st.lists(_toleration, max_size=3), _toleration)
def test_more_tolerations_never_leave_more_taints_untolerated(taints, tolerations, extra):
    before = untolerated(_pod({"tolerations": tolerations}), taints)
    after = untolerated(_pod({"tolerations": [*tolerations, extra]}), taints)
    assert 0 <= after <= before <= len(taints)
    assert untolerated(_pod({"tolerations": [*tolerations, {"operator": "Exists"}]}), taints) == 0


def _node(name: str, labels: dict[str, str]) -> dict:
    return {"metadata": {"name": name, "labels": labels}}


def _requiring(*terms: dict) -> dict:
    return _pod({"affinity": {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": list(terms)}}}})


def _expr(key: str, op: str, *values: str) -> dict:
    return {"matchExpressions": [{"key": key, "operator": op, "values": list(values)}]}


NODE = _node("gpu-7", {"zone": "a", "gpus": "8", "pool": "train"})


def test_each_operator_as_kubernetes_reads_it():
    holds = {
        ("zone", "In", ("a", "b")): True, ("zone", "In", ("b",)): False, ("rack", "In", ("a",)): False,
        ("zone", "NotIn", ("b",)): True, ("zone", "NotIn", ("a",)): False, ("rack", "NotIn", ("a",)): True,
        ("zone", "Exists", ()): True, ("rack", "Exists", ()): False,
        ("zone", "DoesNotExist", ()): False, ("rack", "DoesNotExist", ()): True,
        ("gpus", "Gt", ("7",)): True, ("gpus", "Gt", ("8",)): False, ("gpus", "Lt", ("9",)): True,
        ("gpus", "Lt", ("8",)): False, ("zone", "Gt", ("1",)): False, ("gpus", "Gt", ("x",)): False,
        ("gpus", "Gt", ("1", "2")): False, ("rack", "Lt", ("9",)): False, ("zone", "Matches", ("a",)): False,
    }
    for (key, op, values), expected in holds.items():
        assert required_affinity_allows(_requiring(_expr(key, op, *values)), NODE) is expected, (key, op, values)


def test_terms_are_ored_and_a_terms_requirements_anded():
    both = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]},
                                 {"key": "pool", "operator": "In", "values": ["infer"]}]}
    assert not required_affinity_allows(_requiring(both), NODE)
    assert required_affinity_allows(_requiring(both, _expr("pool", "In", "train")), NODE)


def test_match_fields_name_the_node():
    def by_name(op: str, *names: str) -> dict:
        return _requiring({"matchFields": [{"key": "metadata.name", "operator": op, "values": list(names)}]})
    assert required_affinity_allows(by_name("In", "gpu-7"), NODE)
    assert not required_affinity_allows(by_name("In", "gpu-8"), NODE)
    assert required_affinity_allows(by_name("NotIn", "gpu-8"), NODE)
    # a field other than metadata.name is one the node does not have
    assert not required_affinity_allows(
        _requiring({"matchFields": [{"key": "spec.unschedulable", "operator": "In", "values": ["false"]}]}), NODE)


def test_no_required_affinity_allows_every_node_and_an_empty_term_none():
    assert required_affinity_allows(_pod({}), NODE)
    assert required_affinity_allows(_pod({"affinity": {"nodeAffinity": {PREFERRED: [{"weight": 1}]}}}), NODE)
    assert not required_affinity_allows(_requiring({}), NODE)
    assert not required_affinity_allows(_requiring(), NODE)
    assert not required_affinity_allows(_requiring({"matchExpressions": "zone"}), NODE)


_words = st.sampled_from(["a", "b", "c"])


@given(labels=st.dictionaries(st.sampled_from(["zone", "rack"]), _words), key=st.sampled_from(["zone", "rack"]),
       values=st.lists(_words, min_size=1, max_size=3))
def test_in_and_notin_exists_and_doesnotexist_are_complements(labels, key, values):
    node = _node("n", labels)
    assert (required_affinity_allows(_requiring(_expr(key, "In", *values)), node)
            != required_affinity_allows(_requiring(_expr(key, "NotIn", *values)), node))
    assert (required_affinity_allows(_requiring(_expr(key, "Exists")), node)
            != required_affinity_allows(_requiring(_expr(key, "DoesNotExist")), node))


@given(have=st.integers(-50, 50), bound=st.integers(-50, 50))
def test_gt_and_lt_compare_integers(have, bound):
    node = _node("n", {"k": str(have)})
    assert required_affinity_allows(_requiring(_expr("k", "Gt", str(bound))), node) is (have > bound)
    assert required_affinity_allows(_requiring(_expr("k", "Lt", str(bound))), node) is (have < bound)


def test_rules_about_other_pods_are_named():
    from gpupool.api.preferences import pod_rules

    anti = {"affinity": {"podAntiAffinity": {REQUIRED: [{"topologyKey": "kubernetes.io/hostname"}]},
                         "podAffinity": {PREFERRED: [{"weight": 1}]}}}
    assert pod_rules(_pod(anti)) == ["podAntiAffinity"]
    spread = {"topologySpreadConstraints": [{"whenUnsatisfiable": "ScheduleAnyway"}, {"maxSkew": 1}]}
    assert pod_rules(_pod(spread)) == ["topologySpreadConstraints"]  # unset is read as DoNotSchedule
    assert pod_rules(_pod({"topologySpreadConstraints": [{"whenUnsatisfiable": "ScheduleAnyway"}]})) == []
    assert pod_rules(_pod({"affinity": {"podAffinity": {REQUIRED: []},
                                        "nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [{}]}}}})) == []
    assert pod_rules({}) == []
