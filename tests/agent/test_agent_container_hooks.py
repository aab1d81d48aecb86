"""Isolation hook with several GPU containers in one pod: each container gets its own hook directory, so the
interception library (the real one, built here against the fake driver) holds each container to exactly its
own memory cap, not to its cap against the pod's total. Driven through the agent's Allocate (stand-in
kubelet over real unix sockets); the containers are the library run with the environment each answer gave."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest

from gpupool.agent.devices.fake import parse_fake_description
from gpupool.agent.state.hookdir import hook_paths, read_all, read_limits
from gpupool.api.allocation import ContainerDoc, GrantDoc
from gpupool.api.squeeze import ANN_SQUEEZED
from tests.agent.agent_helpers import RESOURCE, rig
from tests.agent.test_agent_containers import bind_pod, container
from tests.native.native_helpers import GIB, Built, Pod, build_all, have_cc

GPU = "GPU-11111111-2222-3333-4444-555555555555"  # the fake driver's device: the library finds it by UUID
# One GPU shared by two app containers: train 8192 MiB / 30 %, eval 4096 MiB / 20 % (pod: 12288 MiB / 50 %).
TRAIN = GrantDoc(uuid=GPU, index=0, memory_mib=8192, cores=30.0)
EVAL = GrantDoc(uuid=GPU, index=0, memory_mib=4096, cores=20.0)
POD = GrantDoc(uuid=GPU, index=0, memory_mib=12288, cores=50.0)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    assert have_cc(), "no C compiler: these tests build the interception library (set CC)"
    return build_all(tmp_path_factory.mktemp("native"))


def one_gpu() -> Any:
    return parse_fake_description({"gpus": [{"uuid": GPU, "model": "A100-80GB", "memory_mib": 81920}]}, "test")


def hook_mount(answer: Any) -> Path:
    (host,) = [m.host_path for m in answer.mounts if m.container_path == answer.envs["GPUPOOL_HOOK_DIR"]]
    return Path(host)


async def test_two_containers_of_one_pod_are_each_held_to_their_own_memory_cap(built: Built, tmp_path: Path) -> None:
    hook_root = Path(tempfile.mkdtemp(prefix="gph-", dir=tmp_path))
    hook_paths(hook_root).pods.mkdir(parents=True)  # what `gpupool agent` installs at start
    async with rig(discovered=one_gpu(), hook_root=hook_root) as r:
        spec = {"containers": [container("train", "8192", "30"), container("eval", "4096", "20")]}
        parts = [ContainerDoc(name="train", gpus=[TRAIN]), ContainerDoc(name="eval", gpus=[EVAL])]
        pod = await bind_pod(r.cluster, "duo", spec, [POD], parts)
        uid = pod["metadata"]["uid"]
        train = await r.kubelet.allocate_ids(RESOURCE, [f"{GPU}::0"])
        evaluate = await r.kubelet.allocate_ids(RESOURCE, [f"{GPU}::1"])
    # one directory per container, each naming its own container and GPUs, with its own limits file (read
    # only in the container) beside the accounting directory the container mounts read-write
    assert hook_mount(train) == hook_root / "pods" / uid / "train" / "hook"
    assert hook_mount(evaluate) == hook_root / "pods" / uid / "eval" / "hook"
    for name, mib in (("train", 8192), ("eval", 4096)):
        info = json.loads((hook_root / "pods" / uid / name / "pod.json").read_text())
        assert info == {"uid": uid, "pod": "default/duo", "container": name, "gpus": [GPU]}
        written = read_limits(hook_root / "pods" / uid / name / "limits")
        assert written is not None and written["limit"][0] == mib << 20
    # below: the library run outside a container, so from the environment of each answer (it falls back to
    # it where no limits file is mapped at its compiled-in path, which only a container has)
    gpu_state = tmp_path / "gpu"  # one fake device shared by both containers
    procs = [Pod(built, gpu_state, hook_mount(a), memory_mib=a.envs["GPUPOOL_MEMORY_LIMIT_MIB"],
                 cores=a.envs["GPUPOOL_CORES_PERCENT"], extra={"NVIDIA_VISIBLE_DEVICES": GPU}).start()
             for a in (train, evaluate)]
    try:
        p_train, p_eval = procs
        assert p_train.alloc("mem", 6 * GIB)[0] == 0  # 6 of train's 8 GiB
        # 3 of eval's 4 GiB: refused if eval were counted against the pod's total (6 + 3 > 4)
        assert p_eval.alloc("mem", 3 * GIB)[0] == 0
        assert p_train.alloc("mem", 3 * GIB)[0] == 2  # 6 + 3 > 8: CUDA_ERROR_OUT_OF_MEMORY
        assert p_eval.alloc("mem", 1 * GIB)[0] == 0  # 3 + 1 = 4: exactly eval's cap
        usage = {(u.container, u.limit_bytes, u.used_bytes, u.cores_percent) for u in read_all(hook_root)}
        assert usage == {("train", 8 * GIB, 6 * GIB, 30.0), ("eval", 4 * GIB, 4 * GIB, 20.0)}
    finally:
        for p in procs:
            p.close()


async def test_a_squeeze_reaches_every_container_directory_of_the_pod(built: Built, tmp_path: Path) -> None:
    """The squeeze (scheduler: allocation version 1, so one GPU container) is written into the pod's
    container directory, found through the pod UID like every directory of the pod."""
    from gpupool.agent.enforce.squeeze import apply_squeezes
    from gpupool.api.allocation import AllocationDoc
    from gpupool.api.names import ANN_ALLOCATION

    hook_root = Path(tempfile.mkdtemp(prefix="gph-", dir=tmp_path))
    hook_paths(hook_root).pods.mkdir(parents=True)
    async with rig(discovered=one_gpu(), hook_root=hook_root) as r:
        spec = {"containers": [container("solo", "8192", "30")]}
        pod = await bind_pod(r.cluster, "solo", spec, [TRAIN], [ContainerDoc(name="solo", gpus=[TRAIN])])
        answer = await r.kubelet.allocate_ids(RESOURCE, [f"{GPU}::0"])
    uid = pod["metadata"]["uid"]
    assert hook_mount(answer) == hook_root / "pods" / uid / "solo" / "hook"
    proc = Pod(built, tmp_path / "gpu", hook_mount(answer), memory_mib="8192", cores="30",
               extra={"NVIDIA_VISIBLE_DEVICES": GPU}).start()
    try:
        assert proc.alloc("mem", 1 << 20)[0] == 0  # the library has made its file
        squeezed = AllocationDoc(pod_uid=uid, node="n", isolation="hook", time="t",
                                 gpus=[TRAIN.model_copy(update={"cores": 12.5})])
        annotations = {ANN_ALLOCATION: squeezed.model_dump_json(exclude_none=True, exclude={"containers"}),
                       ANN_SQUEEZED: "2026-01-01T00:00:00Z"}
        seen = {"metadata": {"uid": uid, "namespace": "default", "name": "solo", "annotations": annotations}}
        assert apply_squeezes(hook_root, [seen]) == {(uid, "solo"): {0: 12.5}}
        assert [(u.container, u.squeeze_percent) for u in read_all(hook_root)] == [("solo", 12.5)]
    finally:
        proc.close()
