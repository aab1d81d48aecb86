"""kubectl for the e2e tests: the one scripts/k8s-testbed build made with the server, so client and server
are the same Kubernetes release."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

from tests.harness import testbed as tb

# Every kind the chart can create (cert-manager's only with cert-manager installed, which the testbed is not).
CHART_NAMESPACED = ("configmaps,secrets,serviceaccounts,services,deployments,daemonsets,roles,rolebindings,"
                    "poddisruptionbudgets,networkpolicies")
CHART_CLUSTER = ("clusterroles,clusterrolebindings,mutatingwebhookconfigurations,validatingwebhookconfigurations,"
                 "validatingadmissionpolicies,validatingadmissionpolicybindings")


def kubectl_binary() -> Path:
    return tb.find_binaries().kubectl


def release_objects(kubectl: Callable[..., subprocess.CompletedProcess[str]], namespace: str, release: str,
                    extra_namespaced: str = "") -> list[str]:
    """kind/name of every object of the chart's release `release` still in the cluster (`extra_namespaced`:
    more kinds to look for in its namespace, e.g. the pods its workloads made), through `kubectl(*args)`."""
    namespaced = ",".join(filter(None, (CHART_NAMESPACED, extra_namespaced)))
    names = []
    for kinds, scope in ((namespaced, ["-n", namespace]), (CHART_CLUSTER, [])):
        out = kubectl("get", kinds, *scope, "-l", f"app.kubernetes.io/instance={release}", "-o", "name")
        assert out.returncode == 0, out.stderr
        names += out.stdout.split()
    return sorted(names)
