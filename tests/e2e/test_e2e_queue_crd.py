"""The GPUQueue CRD on the real API server: the chart's schema is accepted by kube-apiserver 1.20, rejects bad
queues with the field at fault, and what the server stores reads back into the queue tree."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from gpupool.api.queue import read_queues
from gpupool.core.queues import Quota
from tests.e2e.kubectl_tool import kubectl_binary
from tests.harness import testbed as tb

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "deploy/helm/gpupool/crds/gpuqueues.yaml"


def _kubectl(bed: tb.Testbed, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    binary = kubectl_binary()
    return subprocess.run([str(binary), "--kubeconfig", str(bed.kubeconfig()), *args], input=stdin,
                          capture_output=True, text=True, timeout=60, check=False)


def _queue(name: str, spec: str) -> str:
    return f"apiVersion: gpupool.io/v1alpha1\nkind: GPUQueue\nmetadata: {{name: {name}}}\nspec: {spec}\n"


def test_the_crd_validates_queues_and_they_read_back(testbed: tb.Testbed) -> None:
    applied = _kubectl(testbed, "apply", "-f", str(CRD))
    assert applied.returncode == 0, applied.stderr
    # The CRD becomes usable a moment after it is created (Established condition).
    waited = _kubectl(testbed, "wait", "--for=condition=Established", "--timeout=60s",
                      "crd/gpuqueues.gpupool.io")
    assert waited.returncode == 0, waited.stderr
    good = _queue("e2e-team-a", '{guaranteed: {gpus: "1.5", gpuMemory: 120Gi}, maximum: {gpus: "3"}, lend: false}')
    deadline = time.monotonic() + 30
    while (created := _kubectl(testbed, "apply", "-f", "-", stdin=good)).returncode != 0:
        assert time.monotonic() < deadline, created.stderr  # discovery may lag the Established condition
        time.sleep(0.5)
    bad = _kubectl(testbed, "apply", "-f", "-", stdin=_queue("e2e-bad", '{guaranteed: {gpus: "1.2345"}}'))
    assert bad.returncode != 0 and "spec.guaranteed.gpus" in bad.stderr
    bad = _kubectl(testbed, "apply", "-f", "-", stdin=_queue("e2e-bad", "{weight: -1}"))
    assert bad.returncode != 0 and "spec.weight" in bad.stderr

    listed = _kubectl(testbed, "get", "gpuqueues", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    items = json.loads(listed.stdout)["items"]
    assert [i["metadata"]["name"] for i in items] == ["e2e-team-a"]
    # The server filled the schema's defaults (weight 1, borrow true) and kept what was given.
    assert items[0]["spec"]["weight"] == 1 and items[0]["spec"]["borrow"] is True
    queues = read_queues(items)
    spec = queues.tree.specs["e2e-team-a"]
    assert spec.guaranteed == Quota(1500, 122880, 0) and spec.maximum.gpu_milli == 3000 and not spec.lend
    assert queues.errors == {}
