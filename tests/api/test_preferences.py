"""Soft scheduling preferences of a pod and PreferNoSchedule taints, as kube-scheduler reads them."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpupool.api.preferences import soft_preferences, soft_taints, untolerated

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
