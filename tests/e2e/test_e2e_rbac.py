"""Each component's rights are exactly the ones it uses.

The e2e suite runs kube-scheduler, the gpupool extender, the agent and the webhook under the chart's own
ServiceAccounts and rules (conftest.py: `chart_rbac`, `identities`), and the API server writes every
request made with a service-account token to its audit log. This test, run after the other e2e tests
(conftest.py orders it last), reads that log and compares it with the chart's rules:

- none missing: no request of any component was refused (403), and every resource and verb the agent and
  the webhook used is granted by their own role (they have no other);
- none unused: every verb of every rule in the chart's own roles was used by the component it is for,
  except the few listed in RARE with the code path that needs them and the e2e suite does not reach.

kube-scheduler and the extender share the scheduler's account (one pod); the audit log tells them apart by
user agent. The built-in roles the chart binds for kube-scheduler (system:kube-scheduler, ...) are
Kubernetes' own and are not checked for unused verbs.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

from tests.e2e.conftest import NAMESPACE
from tests.harness import testbed as tb

pytestmark = pytest.mark.e2e

# Which component each of the chart's own roles is for (a new role must be placed here).
ROLE_OWNER = {
    "gp-gpupool-scheduler": "extender",
    "gp-gpupool-scheduler-leases": "kube-scheduler",
    "gp-gpupool-scheduler-moves": "extender",
    "gp-gpupool-agent": "agent",
    "gp-gpupool-webhook": "webhook",
}
# Components whose only rights are their chart role: everything they use must be in it.
ONLY_THEIR_ROLE = ("agent", "webhook")
# (component, apiGroup, resource, verb) granted for a path the e2e suite does not reach, with that path.
RARE = {
    ("agent", "", "pods", "get"): "agent/plugin.py re-reads a pod when marking it served meets a 409 conflict",
    ("extender", "", "configmaps", "patch"): "scheduler/moves.py cancels a remote share's move still unfinished "
                                             "past its deadline (10 min by default); the suite's moves end sooner",
}

Use = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)


def _component(event: dict[str, Any]) -> str | None:
    user = event["user"]["username"]
    prefix = f"system:serviceaccount:{NAMESPACE}:gp-gpupool-"
    if not user.startswith(prefix):
        return None
    account = user.removeprefix(prefix)
    if account == "scheduler":
        return "kube-scheduler" if event.get("userAgent", "").startswith("kube-scheduler/") else "extender"
    return account


def _uses(events: list[dict[str, Any]]) -> tuple[dict[str, set[Use]], list[str]]:
    used: dict[str, set[Use]] = defaultdict(set)
    refused = []
    for e in events:
        component = _component(e)
        ref = e.get("objectRef")
        if component is None or ref is None:  # discovery (/api, /apis) is granted to every user
            continue
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        used[component].add((ref.get("apiGroup", ""), resource, e["verb"]))
        if (e.get("responseStatus") or {}).get("code") == 403:
            refused.append(f"{component}: {e['verb']} {resource} {e.get('requestURI')}")
    return used, refused


def _granted(chart_rbac: list[dict[str, Any]]) -> dict[str, set[Use]]:
    granted: dict[str, set[Use]] = defaultdict(set)
    roles = [d for d in chart_rbac if d["kind"] in ("ClusterRole", "Role")]
    assert {r["metadata"]["name"] for r in roles} == set(ROLE_OWNER), "place each chart role in ROLE_OWNER"
    for role in roles:
        for rule in role["rules"]:
            for group in rule.get("apiGroups", [""]):
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        granted[ROLE_OWNER[role["metadata"]["name"]]].add((group, resource, verb))
    return granted


def test_each_component_uses_exactly_the_rights_the_chart_grants(
    testbed: tb.Testbed, chart_rbac: list[dict[str, Any]]
) -> None:
    used, refused = _uses(testbed.audit_events())
    granted = _granted(chart_rbac)
    assert refused == [], "requests refused under the chart's RBAC (a right is missing)"
    silent = sorted(c for c in granted if not used.get(c))
    assert silent == [], f"no request from {silent} in the audit log: run the whole e2e suite (pytest -m e2e)"
    for component in ONLY_THEIR_ROLE:
        assert used[component] - granted[component] == set(), f"{component} used rights outside its role"
    unused = {(c, *g) for c, gs in granted.items() for g in gs if g not in used[c]}
    assert unused == set(RARE), (
        f"granted but unused (drop them from the chart or say in RARE why they are needed): {unused - set(RARE)}; "
        f"listed in RARE but used after all: {set(RARE) - unused}"
    )
