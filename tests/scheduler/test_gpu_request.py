"""PreFilter gpu_request: the pod's request read from the API's pod, once per pod version."""

from __future__ import annotations

import pytest

from gpupool.api.extender import ExtenderArgs
from gpupool.api.names import ANN_POLICY
from gpupool.scheduler.framework.plugins import gpu_request
from tests.scheduler.conftest import eventually, gpu_pod, started_service


@pytest.fixture
def read(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Every pod the plugin parses, in order."""
    seen: list[dict] = []
    real = gpu_request.parse_pod

    def counting(pod):  # type: ignore[no-untyped-def]
        seen.append(pod)
        return real(pod)

    monkeypatch.setattr(gpu_request, "parse_pod", counting)
    return seen


async def test_a_pod_is_read_once_per_version_and_again_when_it_changes(read: list[dict]) -> None:
    svc = await started_service(nodes=1, gpus=1)
    try:
        pod = await svc.cluster.create_pod(gpu_pod("p", cores=50))
        uid = pod["metadata"]["uid"]
        await eventually(lambda: svc.pods.get(uid) is not None)
        for _ in range(3):
            assert (await svc.filter(ExtenderArgs(Pod=pod, NodeNames=["gpu-0000"]))).NodeNames == ["gpu-0000"]
        assert len(read) == 1
        # A new version (here: a policy nobody knows) is read again, and decides.
        await svc.cluster.patch_pod_annotations("default", "p", {ANN_POLICY: "no-such-policy"})
        await eventually(lambda: svc.pods.get(uid)["metadata"]["annotations"].get(ANN_POLICY) is not None)  # type: ignore[index]
        answer = await svc.filter(ExtenderArgs(Pod=pod, NodeNames=["gpu-0000"]))
        assert answer.NodeNames == [] and "no-such-policy" in answer.FailedAndUnresolvableNodes["gpu-0000"]
        versions = [p["metadata"]["resourceVersion"] for p in read]
        assert len(versions) == 2 and versions[0] != versions[1]
    finally:
        await svc.stop()


async def test_readings_kept_are_bounded(read: list[dict], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_request, "MAX_KEPT", 3)
    svc = await started_service(nodes=1, gpus=1)
    try:
        pods = []
        for k in range(5):
            pod = await svc.cluster.create_pod(gpu_pod(f"p{k}", cores=10))
            await eventually(lambda: svc.pods.get(pod["metadata"]["uid"]) is not None)  # noqa: B023
            pods.append(pod)
        for pod in pods:
            await svc.filter(ExtenderArgs(Pod=pod, NodeNames=["gpu-0000"]))
        # Three kept (p2, p3, p4): p4 is answered from what was kept, p0 was let go and is read again.
        for pod in (pods[4], pods[0]):
            await svc.filter(ExtenderArgs(Pod=pod, NodeNames=["gpu-0000"]))
        assert [p["metadata"]["name"] for p in read] == ["p0", "p1", "p2", "p3", "p4", "p0"]
    finally:
        await svc.stop()
