"""The examples in docs/install.md say what the webhook does; check that it does exactly that."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonpatch
import kubernetes_validate
import yaml

from gpupool.api.pod import parse_pod
from gpupool.webhook.admission import Settings, check_create, mutate
from gpupool.webhook.inventory import InventoryView, Limits
from tests.webhook.helpers import CLUSTER_NODES

DOC = Path(__file__).resolve().parents[2] / "docs" / "install.md"


def _limits() -> Limits | None:
    view = InventoryView()
    view.replace(CLUSTER_NODES)
    return view.limits


def test_sample_pod_is_admitted_as_described() -> None:
    blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)]
    pods = [b for b in blocks if isinstance(b, dict) and b.get("kind") == "Pod"]
    assert pods, "docs/install.md has no sample pod"
    pod = pods[0]
    pod["metadata"]["namespace"] = "default"
    pod["spec"]["schedulerName"] = "default-scheduler"  # what API-server defaulting gives the webhook
    decision = mutate(pod, Settings(), _limits())
    assert decision.allowed, decision.message
    result = jsonpatch.apply_patch(pod, decision.patch)
    for version in ("1.30.0", "1.35.0"):
        kubernetes_validate.validate(result, version, strict=True)
    limits = result["spec"]["containers"][0]["resources"]["limits"]
    assert limits["gpupool.io/gpu-memory"] == "10240"  # "stored as 10240 (MiB)"
    assert result["spec"]["schedulerName"] == "gpupool-scheduler"
    request = parse_pod(result).request
    assert request is not None and request.gpu.milli == 300


def test_refusal_example_is_the_real_message() -> None:
    text = DOC.read_text()
    overrides = re.search(r"--overrides='(.*?)'", text, re.S)
    assert overrides is not None
    spec = json.loads(overrides.group(1).replace("\n", " "))["spec"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bad", "namespace": "default"}, "spec": spec}
    decision = mutate(pod, Settings(), _limits())
    assert not decision.allowed
    # The doc wraps the message over two comment lines; compare it unwrapped.
    documented = re.search(r"denied the request: (gpupool refused.*?\))\n", text, re.S)
    assert documented is not None
    assert re.sub(r"\s*\n#\s*", " ", documented.group(1)) == decision.message


def test_forbidden_variable_example_is_the_real_message() -> None:
    text = DOC.read_text()
    pattern = r'"pods\.validate\.gpupool\.io" denied the request: (gpupool\n?#? ?refused.*?grant\))'
    documented = re.search(pattern, text, re.S)
    assert documented is not None
    # kubectl run sneaky --image=busybox --env=NVIDIA_VISIBLE_DEVICES=all: one container named like the pod.
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sneaky", "namespace": "default"},
           "spec": {"containers": [{"name": "sneaky", "image": "busybox",
                                    "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]}}
    decision = check_create(pod, Settings(), _limits(), "alice")
    assert not decision.allowed and decision.code == 403
    assert re.sub(r"\s*\n#\s*", " ", documented.group(1)) == decision.message
