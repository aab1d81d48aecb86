"""The agent's half of the reclaim squeeze: a pod the scheduler annotated `gpupool.io/squeezed` has its
allocation's (squeezed) compute written into its hook file, where the real library (built here against the
fake driver) reads it; lifting the squeeze clears it. Driven through gpupool.agent.enforce.squeeze's public
functions, with the loop reading the node's pods from a stand-in cluster."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from gpupool.agent.enforce.squeeze import apply_squeezes, follow_squeezes
from gpupool.agent.state.hookdir import HookPod, container_dir, hook_paths, prepare_pod, read_usage
from gpupool.api.allocation import AllocationDoc, GrantDoc
from gpupool.api.names import ANN_ALLOCATION
from gpupool.api.squeeze import ANN_SQUEEZED
from tests.native.native_helpers import Built, Pod, build_all, have_cc

UID = "6b1e0d2c-8e0a-4a4c-9d1e-3f2a1b0c9d8e"
GPU_A, GPU_B = "GPU-aaaaaaaa-0000-0000-0000-000000000001", "GPU-bbbbbbbb-0000-0000-0000-000000000002"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    assert have_cc(), "no C compiler: these tests build the interception library (set CC)"
    return build_all(tmp_path_factory.mktemp("native"))


def pod_object(cores: tuple[float, float], squeezed: bool) -> dict[str, Any]:
    doc = AllocationDoc(version=1, pod_uid=UID, node="n1", policy="gpupool", isolation="hook",
                        time="2026-01-01T00:00:00Z",
                        gpus=[GrantDoc(uuid=GPU_B, index=1, memory_mib=8192, cores=cores[1]),
                              GrantDoc(uuid=GPU_A, index=0, memory_mib=8192, cores=cores[0])])
    annotations = {ANN_ALLOCATION: doc.model_dump_json(exclude_none=True, exclude={"containers"})}
    if squeezed:
        annotations[ANN_SQUEEZED] = "2026-01-01T00:01:00Z"
    return {"metadata": {"uid": UID, "namespace": "team-a", "name": "borrower", "annotations": annotations}}


class NodePods:
    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods

    async def list_pods_on_node(self, node: str) -> list[dict[str, Any]]:
        return self.pods


def test_the_squeezed_allocation_reaches_the_library_file_per_gpu_and_lifting_clears_it(
        built: Built, tmp_path: Path) -> None:
    root = tmp_path / "root"
    hook_paths(root).pods.mkdir(parents=True)
    # The pod's GPUs in NVIDIA_VISIBLE_DEVICES order (pod.json): A is the library's index 0, B index 1.
    hook = HookPod(UID, "team-a/borrower", "main", (GPU_A, GPU_B), container_dir(root, UID, "main"))
    prepare_pod(hook)
    assert apply_squeezes(root, [pod_object((30, 40), squeezed=True)]) == {}  # no process yet: no file
    probe = Pod(built, tmp_path / "gpu", hook.dir, cores="70,70",
                extra={"NVIDIA_VISIBLE_DEVICES": f"{GPU_A},{GPU_B}"}).start()
    try:
        assert probe.alloc("mem", 1 << 20)[0] == 0  # the library is loaded and has made its file
        assert [u.squeeze_percent for u in read_usage(hook.dir)] == [0.0, 0.0]
        # The allocation lists B first; the file follows the pod's own GPU order.
        assert apply_squeezes(root, [pod_object((30, 40), squeezed=True)]) == {(UID, "main"): {0: 30, 1: 40}}
        assert [(u.gpu, u.squeeze_percent) for u in read_usage(hook.dir)] == [(GPU_A, 30.0), (GPU_B, 40.0)]
        assert apply_squeezes(root, [pod_object((30, 40), squeezed=True)]) == {}  # unchanged: nothing written
        # Lifted by the scheduler (annotation gone, grants back to the spec), seen by the agent's loop.
        stop = asyncio.Event()

        async def one_pass() -> None:
            task = asyncio.create_task(follow_squeezes(NodePods([pod_object((70, 70), squeezed=False)]), "n1",
                                                       root, stop, interval_s=0.01))
            for _ in range(500):
                if [u.squeeze_percent for u in read_usage(hook.dir)] == [0.0, 0.0]:
                    break
                await asyncio.sleep(0.01)
            stop.set()
            await task

        asyncio.run(one_pass())
        assert [u.squeeze_percent for u in read_usage(hook.dir)] == [0.0, 0.0]
    finally:
        probe.close()


def test_an_agent_without_hook_isolation_installed_writes_nothing(tmp_path: Path) -> None:
    assert apply_squeezes(tmp_path / "absent", [pod_object((30, 30), squeezed=True)]) == {}
    assert not (tmp_path / "absent").exists()
