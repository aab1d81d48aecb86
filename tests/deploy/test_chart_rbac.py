"""RBAC allowlist: the rules and bindings the chart renders must equal this reviewed list exactly.

A change to the chart's RBAC fails here until this list is updated in the same review, so no right is
added by accident. The reason for each right is in the chart (comments next to each rule).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy.conftest import NAMESPACE, Render

SA = f"{NAMESPACE}/gp-gpupool"

# (kind, name, namespace or "") -> sorted (apiGroups, resources, resourceNames, verbs) tuples
REVIEWED_RULES: dict[tuple[str, str, str], list[tuple[tuple[str, ...], ...]]] = {
    ("ClusterRole", "gp-gpupool-scheduler", ""): [
        (("",), ("nodes",), (), ("list", "watch")),
        # team queues: GPUQueue objects and the namespace label that joins a queue; reclaim evicts
        (("gpupool.io",), ("gpuqueues",), (), ("list", "watch")),
        (("gpupool.io",), ("gpuqueues/status",), (), ("patch",)),
        (("",), ("namespaces",), (), ("list", "watch")),
        (("",), ("pods/eviction",), (), ("create",)),
    ],
    ("Role", "gp-gpupool-scheduler-leases", NAMESPACE): [
        (("coordination.k8s.io",), ("leases",), (), ("create",)),
        (
            ("coordination.k8s.io",),
            ("leases",),
            ("gp-gpupool-scheduler-kube",),
            ("get", "update"),
        ),
    ],
    # the remote shares' moves, that one ConfigMap: read, and a move past its deadline cancelled
    ("Role", "gp-gpupool-scheduler-moves", NAMESPACE): [
        (("",), ("configmaps",), ("gpupool-remote-moves",), ("list", "watch", "patch")),
    ],
    ("ClusterRole", "gp-gpupool-agent", ""): [
        (("",), ("nodes",), (), ("get", "patch")),
        (("",), ("nodes/status",), (), ("patch",)),
        (("",), ("pods",), (), ("get", "list", "patch")),
    ],
    ("ClusterRole", "gp-gpupool-webhook", ""): [
        (("",), ("nodes",), (), ("list", "watch")),
    ],
}

# (binding kind, namespace or "", role kind, role name, subject "namespace/name")
REVIEWED_BINDINGS = sorted(
    [
        ("ClusterRoleBinding", "", "ClusterRole", "system:kube-scheduler", f"{SA}-scheduler"),
        ("ClusterRoleBinding", "", "ClusterRole", "system:volume-scheduler", f"{SA}-scheduler"),
        ("RoleBinding", "kube-system", "Role", "extension-apiserver-authentication-reader", f"{SA}-scheduler"),
        ("ClusterRoleBinding", "", "ClusterRole", "gp-gpupool-scheduler", f"{SA}-scheduler"),
        ("RoleBinding", NAMESPACE, "Role", "gp-gpupool-scheduler-leases", f"{SA}-scheduler"),
        ("RoleBinding", NAMESPACE, "Role", "gp-gpupool-scheduler-moves", f"{SA}-scheduler"),
        ("ClusterRoleBinding", "", "ClusterRole", "gp-gpupool-agent", f"{SA}-agent"),
        ("ClusterRoleBinding", "", "ClusterRole", "gp-gpupool-webhook", f"{SA}-webhook"),
    ]
)


def _rule(rule: dict[str, Any]) -> tuple[tuple[str, ...], ...]:
    return (
        tuple(rule.get("apiGroups", [])),
        tuple(rule["resources"]),
        tuple(rule.get("resourceNames", [])),
        tuple(rule["verbs"]),
    )


@pytest.mark.parametrize(
    "values", [None, {"webhook": {"certs": {"mode": "certManager"}}, "agent": {"backend": "fake"}}]
)
def test_rbac_equals_the_reviewed_allowlist(render: Render, values: dict[str, Any] | None) -> None:
    objs = render(values)
    rules = {
        (o["kind"], o["metadata"]["name"], o["metadata"].get("namespace", "")): sorted(map(_rule, o["rules"]))
        for o in objs
        if o["kind"] in ("ClusterRole", "Role")
    }
    assert rules == {k: sorted(v) for k, v in REVIEWED_RULES.items()}
    bindings = sorted(
        (
            o["kind"],
            o["metadata"].get("namespace", ""),
            o["roleRef"]["kind"],
            o["roleRef"]["name"],
            *[f"{s['namespace']}/{s['name']}" for s in o["subjects"]],
        )
        for o in objs
        if o["kind"] in ("ClusterRoleBinding", "RoleBinding")
    )
    assert bindings == REVIEWED_BINDINGS


def test_no_wildcards_and_no_secrets(render: Render) -> None:
    for obj in render(None):
        for rule in obj.get("rules", []):
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule.get(key, []), (obj["metadata"]["name"], rule)
            assert "secrets" not in rule["resources"], obj["metadata"]["name"]
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), obj["metadata"]["name"]


def test_every_service_account_is_used_by_one_workload(render: Render) -> None:
    objs = render(None)
    accounts = sorted(o["metadata"]["name"] for o in objs if o["kind"] == "ServiceAccount")
    used = sorted(
        o["spec"]["template"]["spec"]["serviceAccountName"] for o in objs if o["kind"] in ("Deployment", "DaemonSet")
    )
    assert accounts == used == ["gp-gpupool-agent", "gp-gpupool-scheduler", "gp-gpupool-webhook"]


@pytest.mark.parametrize(("watchdog", "dra", "remote"), [(False, False, False), (True, False, False),
                                                       (False, True, False), (True, True, False), (False, True, True)])
def test_the_doctors_rights_table_is_the_charts_own_roles(render: Render, watchdog: bool, dra: bool,
                                                          remote: bool) -> None:
    """`gpupool doctor` asks for each right in gpupool.doctor.rbac.NEEDS; its `chart` rows must be exactly
    the rules of the chart's own roles (for the values that switch rules on), so neither can drift."""
    from gpupool.doctor.rbac import NEEDS

    account = "gp-gpupool-{}"
    rendered = set()
    values = {"agent": {"watchdog": {"enabled": watchdog}}, "dra": {"enabled": dra, "remote": {"enabled": remote}}}
    for obj in render(values, "--kube-version", "1.37.0"):  # dra.enabled needs 1.36 or newer
        if obj["kind"] not in ("ClusterRole", "Role"):
            continue
        component = next(c for c in NEEDS if obj["metadata"]["name"].startswith(account.format(c)))
        for rule in obj["rules"]:
            for verb in rule["verbs"]:
                for resource in rule["resources"]:
                    for group in rule.get("apiGroups", []):
                        for name in rule.get("resourceNames") or [""]:
                            rendered.add((component, verb, group, resource, obj["kind"] == "Role", name))
    enabled = {name for name, on in (("watchdog", watchdog), ("dra", dra), ("remote", remote)) if on}
    table = {(c, a.verb, a.group, a.resource, a.in_release_namespace, a.object_name(account.format(c)))
             for c, needs in NEEDS.items() for a in needs if a.chart and (not a.when or a.when in enabled)}
    assert len(table) > 10
    assert rendered == table


def test_the_scheduler_reads_the_moves_configmap_of_its_release_namespace(render: Render) -> None:
    """The extender counts moving remote shares from gpupool's moves ConfigMap: the chart tells it the release
    namespace, where its Role lets it read that one ConfigMap (and no other)."""
    from gpupool.api.moves import MOVES_CONFIGMAP

    objs = render(None)
    (deployment,) = [o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "gp-gpupool-scheduler"]
    env = {e["name"]: e.get("value") for c in deployment["spec"]["template"]["spec"]["containers"]
           for e in c.get("env") or []}
    assert env["GPUPOOL_SCHEDULER_GPUPOOL_NAMESPACE"] == NAMESPACE
    (role,) = [o for o in objs if o["kind"] == "Role" and o["metadata"]["name"] == "gp-gpupool-scheduler-moves"]
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [MOVES_CONFIGMAP],
                              "verbs": ["list", "watch", "patch"]}]  # patch: a move past its deadline cancelled
