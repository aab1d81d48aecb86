"""kubectl for the e2e tests: the one scripts/k8s-testbed build made with the server, so client and server
are the same Kubernetes release."""

from __future__ import annotations

from pathlib import Path

from tests.harness import testbed as tb


def kubectl_binary() -> Path:
    return tb.find_binaries().kubectl
