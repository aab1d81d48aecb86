"""What each component's ServiceAccount must be allowed to do, asked of the API server one
SubjectAccessReview per line.

The rows marked `chart` are exactly the rules of the chart's own Roles and ClusterRoles
(`tests/deploy/test_chart_rbac.py` compares them with the rendered chart, both ways), so the doctor and the
chart cannot drift apart. The other rows come from the built-in roles the chart binds for kube-scheduler
(`system:kube-scheduler`): a few of the rights without which no GPU pod is placed, asked so that a missing
binding shows too.
"""

from __future__ import annotations

from dataclasses import dataclass

# The parts of the chart that add rights (`Access.when`), each recognised by a variable of the agent's
# DaemonSet: dra.enabled sets GPUPOOL_AGENT_DRA, and with it the chart grants the scheduler its pod patch too;
# dra.remote.enabled sets GPUPOOL_AGENT_REMOTE_LISTEN (remote shares: the agents serve and move them).
VARIANTS = {"watchdog": "GPUPOOL_AGENT_WATCHDOG", "dra": "GPUPOOL_AGENT_DRA", "remote": "GPUPOOL_AGENT_REMOTE_LISTEN"}

# Placeholders in `Access.name`: the component's ServiceAccount name (the chart names the scheduler's
# leader-election Lease after it).
ACCOUNT = "{account}"


@dataclass(frozen=True, slots=True)
class Access:
    verb: str
    group: str
    resource: str  # with its subresource: "pods/eviction"
    why: str
    in_release_namespace: bool = False  # False: cluster-wide
    name: str = ""  # one object only ("" = any); ACCOUNT is replaced
    chart: bool = True  # a rule of the chart's own roles (False: a built-in role the chart binds)
    when: str = ""  # "" always; else a VARIANTS name: only with that part of the chart on

    def object_name(self, account: str) -> str:
        return self.name.replace(ACCOUNT, account)


def _rows(verbs: str, group: str, resource: str, why: str, *, in_release_namespace: bool = False, name: str = "",
          chart: bool = True, when: str = "") -> list[Access]:
    return [Access(v, group, resource, why, in_release_namespace, name, chart, when) for v in verbs.split()]


NEEDS: dict[str, list[Access]] = {
    "scheduler": [
        *_rows("list watch", "", "nodes", "the extender's node cache"),
        *_rows("list watch", "gpupool.io", "gpuqueues", "team queues"),
        *_rows("patch", "gpupool.io", "gpuqueues/status", "team queue usage"),
        *_rows("list watch", "", "namespaces", "the namespace label that joins a queue"),
        *_rows("create", "", "pods/eviction", "queue reclaim and preemption"),
        *_rows("create", "coordination.k8s.io", "leases", "kube-scheduler's leader election",
               in_release_namespace=True),
        *_rows("get update", "coordination.k8s.io", "leases", "kube-scheduler's leader election",
               in_release_namespace=True, name=f"{ACCOUNT}-kube"),
        *_rows("list watch", "", "configmaps", "counting a moving remote share where it is held",
               in_release_namespace=True, name="gpupool-remote-moves"),
        *_rows("patch", "", "configmaps", "cancelling a remote share's move past its deadline",
               in_release_namespace=True, name="gpupool-remote-moves"),
        *_rows("list watch", "", "pods", "kube-scheduler sees pods (system:kube-scheduler)", chart=False),
        *_rows("create", "", "pods/binding", "kube-scheduler binds (system:kube-scheduler)", chart=False),
        *_rows("patch", "", "pods", "removing the scheduling gate of a pod whose claim gpupool placed", when="dra"),
        *_rows("create", "resource.k8s.io", "resourceclaimtemplates",
               "making the claim template a GPU pod of a dra namespace policy points at", when="dra"),
    ],
    "agent": [
        *_rows("get patch", "", "nodes", "the node's inventory and labels"),
        *_rows("patch", "", "nodes/status", "the node's GpupoolReady condition (node validation)"),
        *_rows("get list patch", "", "pods", "finding the pod of an Allocate, its allocated marker"),
        *_rows("create", "", "events", "the watchdog's Events on pods", when="watchdog"),
        *_rows("get create patch delete", "resource.k8s.io", "resourceslices", "publishing the node's DRA devices",
               when="dra"),
        *_rows("get", "resource.k8s.io", "resourceclaims", "preparing a pod's claims (DRA kubelet plugin)", when="dra"),
        *_rows("list watch", "resource.k8s.io", "resourceclaims",
               "serving the remote shares allocated on the node's GPUs, whatever node their pods run on",
               when="remote"),
        *_rows("get list watch update patch", "", "configmaps", "carrying out and following remote share moves",
               in_release_namespace=True, name="gpupool-remote-moves", when="remote"),
    ],
    "webhook": [
        *_rows("list watch", "", "nodes", "the inventory the admission checks read"),
    ],
}

COMPONENTS = tuple(NEEDS)
