"""Several GPU containers in one pod: kubelet calls Allocate once per GPU container (init containers first),
and each call gets that container's own part of the allocation (version 2 `containers`), idempotently per
(pod, container); the pod gets its `gpupool.io/allocated` marker (the scheduler's cue that the node is free
again) only once its last GPU container is served, and until then it is still a candidate of every call of
its containers' sizes. Crashes between the steps of either call leave a state the restarted agent
completes."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.agent.identify import Again, GpuContainer, NextContainer, Unidentified, which_container
from gpupool.agent.kubelet.device_plugin import STEP_CHECKPOINTED, STEP_MARKED, STEP_READ
from gpupool.agent.state.checkpoint import Checkpoint
from gpupool.api.allocation import AllocationDoc, ContainerDoc, GrantDoc
from gpupool.api.names import ANN_ALLOCATED, ANN_ALLOCATION, RESOURCE_GPU
from gpupool.cluster.memory import MemoryCluster
from tests.agent.agent_helpers import NODE, RESOURCE, Rig, count_node_calls, pod_object, rig, scheduler_binds

# --- which container a call is for (pure) -------------------------------------------------------------------

INIT = GpuContainer("prep", 1, reusable=True)
SIDE = GpuContainer("side", 1, reusable=False)
TRAIN = GpuContainer("train", 1, reusable=False)
EVAL = GpuContainer("eval", 1, reusable=False)


def test_the_first_call_is_for_the_first_gpu_container_in_kubelets_order() -> None:
    assert which_container("ns/p", [INIT, TRAIN], {}, ["G::0"]) == NextContainer(INIT)


def test_a_call_with_the_last_served_app_containers_devices_is_a_repeat() -> None:
    # app containers never pass their devices on: the same IDs again can only be kubelet asking again
    assert which_container("ns/p", [TRAIN, EVAL], {"train": ("G::0",)}, ["G::0"]) == Again("train")
    assert which_container("ns/p", [TRAIN, EVAL], {"train": ("G::0",)}, ["G::1"]) == NextContainer(EVAL)


def test_an_init_containers_devices_again_are_told_apart_by_kubelets_checkpoint() -> None:
    """Kubelet hands a plain init container's devices to the containers after it: the same IDs are the next
    container once kubelet recorded the init container, else kubelet asking for the init container again."""
    served = {"prep": ("G::0",)}
    assert which_container("ns/p", [INIT, TRAIN], served, ["G::0"], lambda: {"prep"}) == NextContainer(TRAIN)
    assert which_container("ns/p", [INIT, TRAIN], served, ["G::0"], lambda: set()) == Again("prep")
    unknown = which_container("ns/p", [INIT, TRAIN], served, ["G::0"], lambda: "no such file")
    assert isinstance(unknown, Unidentified)
    assert "either kubelet asking for prep again or the first call for train" in unknown.reason
    assert "no such file" in unknown.reason
    # other IDs, or a next container of another size: no ambiguity, kubelet's checkpoint is not read
    assert which_container("ns/p", [INIT, TRAIN], served, ["G::1"], lambda: "unread") == NextContainer(TRAIN)
    big = GpuContainer("big", 2, reusable=False)
    assert which_container("ns/p", [INIT, big], served, ["G::0"], lambda: "unread") == Again("prep")


def test_kubelets_checkpoint_decides_between_the_last_container_again_and_the_next() -> None:
    served = {"train": ("G::0",)}
    # kubelet recorded train: whatever the IDs, the call is for eval
    assert which_container("ns/p", [TRAIN, EVAL], served, ["G::1"], lambda: {"train"}) == NextContainer(EVAL)
    # not recorded: kubelet asks for train again; with other IDs than it was answered, refused, never eval's grant
    assert which_container("ns/p", [TRAIN, EVAL], served, ["G::0"], lambda: set()) == Again("train")
    other = which_container("ns/p", [TRAIN, EVAL], served, ["G::1"], lambda: set())
    assert isinstance(other, Unidentified)
    assert "kubelet asks again for container train of pod ns/p" in other.reason and "['G::0']" in other.reason


def test_sidecars_and_app_containers_keep_their_devices() -> None:
    # a sidecar keeps its devices: the same IDs are a repeat
    assert which_container("ns/p", [SIDE, TRAIN], {"side": ("G::0",)}, ["G::0"]) == Again("side")
    # once every container is served, the init container's devices are the last container's repeat
    both = {"prep": ("G::0",), "train": ("G::0",)}
    assert which_container("ns/p", [INIT, TRAIN], both, ["G::0"]) == Again("train")


def test_calls_that_fit_no_container_are_refused_with_the_reason() -> None:
    two = GpuContainer("big", 2, reusable=False)
    wrong_size = which_container("ns/p", [TRAIN, two], {"train": ("G::0",)}, ["G::1"])
    assert isinstance(wrong_size, Unidentified)
    assert "kubelet asks for 1 device(s) but the next GPU container of pod ns/p, big, asks for 2" in wrong_size.reason
    # only the last served container can be repeated: kubelet checkpointed the earlier ones before going on
    done = which_container("ns/p", [TRAIN, EVAL], {"train": ("G::0",), "eval": ("G::1",)}, ["G::0"])
    assert isinstance(done, Unidentified)
    assert "every GPU container of pod ns/p (train, eval) has been served" in done.reason


def test_an_entry_of_a_version_1_checkpoint_is_the_pods_only_gpu_container() -> None:
    assert which_container("ns/p", [TRAIN], {"": ("G::0",)}, ["G::0"]) == Again("train")


containers_st = st.lists(
    st.tuples(st.sampled_from(["init", "sidecar", "app"]), st.integers(1, 2)), min_size=1, max_size=5
)


@given(containers_st, st.data())
def test_kubelets_calls_each_reach_their_own_container(shape: list[tuple[str, int]], data: st.DataObject) -> None:
    """Kubelet's protocol, simulated: containers in order (init containers and sidecars first), each with
    device IDs from the reusable pool (plain init containers' devices) first, then fresh ones, and each
    recorded in kubelet's checkpoint before the next; after any answered call kubelet may restart before
    recording it and ask for that container again with the same IDs. Whatever the shape, every call is
    matched to the container kubelet is asking for."""
    order = sorted(range(len(shape)), key=lambda i: shape[i][0] == "app")  # stable: inits/sidecars first
    containers = [GpuContainer(f"c{i}", shape[i][1], reusable=shape[i][0] == "init") for i in order]
    fresh = (f"G::{n}" for n in range(100))
    reusable: list[str] = []
    served: dict[str, tuple[str, ...]] = {}
    recorded: set[str] = set()  # kubelet's checkpoint
    for c in containers:
        ids = (reusable + [next(fresh) for _ in range(c.count)])[: c.count]
        reusable = [d for d in reusable if d not in ids]
        assert which_container("ns/p", containers, served, ids, lambda: set(recorded)) == NextContainer(c)
        served[c.name] = tuple(sorted(ids))
        if data.draw(st.booleans(), label=f"kubelet restarts before recording {c.name}"):
            assert which_container("ns/p", containers, served, ids, lambda: set(recorded)) == Again(c.name)
            # after its restart kubelet may pick other devices for the same container: never another's grant
            others = [next(fresh) for _ in range(c.count)]
            assert not isinstance(which_container("ns/p", containers, served, others, lambda: set(recorded)),
                                  NextContainer)
        recorded.add(c.name)
        if c.reusable:  # sidecars and app containers keep their devices for the pod's life
            reusable = sorted(set(reusable) | set(ids))


# --- through the device plugin -------------------------------------------------------------------------------

# Pod "duo": one GPU, GPU-aaaa-0 (81920 MiB), shared by two app containers: train 30 % / 8192 MiB, eval
# 20 % / 4096 MiB (what the scheduler's split_by_container writes for gpu-cores 30 and 20 with gpu-memory).
TRAIN_GRANT = GrantDoc(uuid="GPU-aaaa-0", index=0, memory_mib=8192, cores=30.0)
EVAL_GRANT = GrantDoc(uuid="GPU-aaaa-0", index=0, memory_mib=4096, cores=20.0)
POD_GRANT = GrantDoc(uuid="GPU-aaaa-0", index=0, memory_mib=12288, cores=50.0)


def expected(g: GrantDoc) -> dict[str, str]:
    """The environment a container gets for one grant under isolation hook (docs/agent.md)."""
    return {"NVIDIA_VISIBLE_DEVICES": g.uuid, "GPUPOOL_MEMORY_LIMIT_MIB": str(g.memory_mib),
            "GPUPOOL_CORES_PERCENT": f"{g.cores:g}"}


def share(envs: Any) -> dict[str, str]:
    return {k: envs[k] for k in ("NVIDIA_VISIBLE_DEVICES", "GPUPOOL_MEMORY_LIMIT_MIB", "GPUPOOL_CORES_PERCENT")}


def container(name: str, memory: str, cores: str) -> dict[str, Any]:
    limits = {RESOURCE_GPU: "1", "gpupool.io/gpu-memory": memory, "gpupool.io/gpu-cores": cores}
    return {"name": name, "resources": {"limits": limits}}


async def bind_pod(
    cluster: MemoryCluster, name: str, spec: dict[str, Any], gpus: list[GrantDoc], parts: list[ContainerDoc]
) -> dict[str, Any]:
    """What the scheduler does at bind for a pod with several GPU containers: allocation version 2 (which
    container holds what), binding."""
    created = await cluster.create_pod(
        {"metadata": {"name": name, "namespace": "default", "annotations": {}},
         "spec": {"schedulerName": "gpupool-scheduler", **spec}, "status": {"phase": "Pending"}}
    )
    meta = created["metadata"]
    doc = AllocationDoc(version=2, pod_uid=meta["uid"], node=NODE, isolation="hook", gpus=gpus, containers=parts)
    await cluster.patch_pod_annotations("default", name, {ANN_ALLOCATION: doc.model_dump_json(exclude_none=True)})
    await cluster.create_binding("default", name, meta["uid"], NODE)
    return await cluster.get_pod("default", name)


async def bind_duo(cluster: MemoryCluster) -> None:
    spec = {"containers": [container("train", "8192", "30"), container("eval", "4096", "20")]}
    parts = [ContainerDoc(name="train", gpus=[TRAIN_GRANT]), ContainerDoc(name="eval", gpus=[EVAL_GRANT])]
    await bind_pod(cluster, "duo", spec, [POD_GRANT], parts)


async def marker(r: Rig, name: str) -> dict[str, Any] | None:
    text = ((await r.cluster.get_pod("default", name))["metadata"].get("annotations") or {}).get(ANN_ALLOCATED)
    return None if text is None else dict(json.loads(text))


async def test_each_container_gets_its_own_share_and_the_pod_is_marked_after_the_last() -> None:
    async with rig() as r:
        await bind_duo(r.cluster)
        calls = count_node_calls(r)
        first = await r.kubelet.allocate_ids(RESOURCE, ["GPU-aaaa-0::0"])
        assert share(first.envs) == expected(TRAIN_GRANT)
        # one container of two served: the pod still waits (no marker), so the scheduler keeps the node
        assert await marker(r, "duo") is None
        second = await r.kubelet.allocate_ids(RESOURCE, ["GPU-aaaa-0::1"])
        assert share(second.envs) == expected(EVAL_GRANT)
        done = await marker(r, "duo")
        assert done is not None and done["devices"] == ["GPU-aaaa-0::0", "GPU-aaaa-0::1"]
        assert (calls.node_reads, calls.node_writes) == (0, 0)
        # kubelet asking again for the last container (its restart) gets the very same bytes
        again = await r.kubelet.allocate_ids(RESOURCE, ["GPU-aaaa-0::1"])
        assert again.SerializeToString(deterministic=True) == second.SerializeToString(deterministic=True)
        entries = Checkpoint(r.config.checkpoint_path, NODE)
        uid = (await r.cluster.get_pod("default", "duo"))["metadata"]["uid"]
        assert entries.load() is None and set(entries.entries) == {(uid, "train"), (uid, "eval")}


async def test_a_repeat_of_the_first_container_before_the_second_is_the_same_answer() -> None:
    async with rig() as r:
        await bind_duo(r.cluster)
        first = await r.kubelet.allocate_ids(RESOURCE, ["GPU-aaaa-0::0"])
        again = await r.kubelet.allocate_ids(RESOURCE, ["GPU-aaaa-0::0"])  # kubelet restarted in between
        assert again.SerializeToString(deterministic=True) == first.SerializeToString(deterministic=True)
        assert share((await r.kubelet.allocate_ids(RESOURCE, ["GPU-aaaa-0::1"])).envs) == expected(EVAL_GRANT)


async def test_the_first_container_asked_again_with_other_devices_never_gets_the_seconds_grant() -> None:
    async with rig() as r:
        await bind_duo(r.cluster)
        await r.kubelet.allocate_ids(RESOURCE, ["GPU-aaaa-0::0"])
        uid = (await r.cluster.get_pod("default", "duo"))["metadata"]["uid"]
        kubelet_records(r, uid)  # kubelet restarted before recording train, and picks another slot for it
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await r.kubelet.allocate_ids(RESOURCE, ["GPU-aaaa-0::2"])
        assert "kubelet asks again for container train of pod default/duo" in err.value.details()
        kubelet_records(r, uid, "train")  # once kubelet recorded train, the next call is eval's
        assert share((await r.kubelet.allocate_ids(RESOURCE, ["GPU-aaaa-0::1"])).envs) == expected(EVAL_GRANT)


def kubelet_records(r: Rig, uid: str, *containers: str) -> None:
    """What kubelet's device manager writes after an Allocate (only the fields the agent reads matter)."""
    entries = [{"PodUID": uid, "ContainerName": c, "ResourceName": RESOURCE, "DeviceIDs": {"-1": []},
                "AllocResp": ""} for c in containers]
    text = json.dumps({"Data": {"PodDeviceEntries": entries, "RegisteredDevices": {}}, "Checksum": 0})
    (r.config.device_plugin_dir / "kubelet_internal_checkpoint").write_text(text)


async def test_an_init_containers_device_reused_by_the_app_container_carries_the_apps_share() -> None:
    # prep (init) 10 % / 2048 MiB, then train 40 % / 8192 MiB on the same GPU; kubelet hands the app container
    # the init container's device ID
    prep = GrantDoc(uuid="GPU-aaaa-2", index=2, memory_mib=2048, cores=10.0)
    train = GrantDoc(uuid="GPU-aaaa-2", index=2, memory_mib=8192, cores=40.0)
    pod_grant = GrantDoc(uuid="GPU-aaaa-2", index=2, memory_mib=8192, cores=40.0)
    async with rig() as r:
        spec = {"initContainers": [container("prep", "2048", "10")],
                "containers": [container("train", "8192", "40")]}
        parts = [ContainerDoc(name="prep", kind="init container", gpus=[prep]),
                 ContainerDoc(name="train", gpus=[train])]
        staged = await bind_pod(r.cluster, "staged", spec, [pod_grant], parts)
        ids = ["GPU-aaaa-2::3"]
        assert share((await r.kubelet.allocate_ids(RESOURCE, ids)).envs) == expected(prep)
        kubelet_records(r, staged["metadata"]["uid"])  # kubelet restarted before recording prep
        assert share((await r.kubelet.allocate_ids(RESOURCE, ids)).envs) == expected(prep)  # prep's repeat
        kubelet_records(r, staged["metadata"]["uid"], "prep")  # kubelet records prep, then asks for train
        assert share((await r.kubelet.allocate_ids(RESOURCE, ids)).envs) == expected(train)
        assert await marker(r, "staged") is not None
        assert share((await r.kubelet.allocate_ids(RESOURCE, ids)).envs) == expected(train)  # a repeat


async def test_whole_gpus_per_container_and_a_wrong_count_is_refused() -> None:
    # a: 1 whole GPU (GPU-aaaa-1), b: 2 whole GPUs (GPU-aaaa-2, GPU-aaaa-3)
    whole = [GrantDoc(uuid=f"GPU-aaaa-{i}", index=i, memory_mib=81920, cores=100.0) for i in (1, 2, 3)]
    async with rig() as r:
        spec = {"containers": [{"name": "a", "resources": {"limits": {RESOURCE_GPU: "1"}}},
                               {"name": "b", "resources": {"limits": {RESOURCE_GPU: "2"}}}]}
        parts = [ContainerDoc(name="a", gpus=whole[:1]), ContainerDoc(name="b", gpus=whole[1:])]
        await bind_pod(r.cluster, "wide", spec, whole, parts)
        with pytest.raises(grpc.aio.AioRpcError) as err:  # container a asks for 1, kubelet sends 2
            await r.kubelet.allocate_ids(RESOURCE, ["GPU-aaaa-1::0", "GPU-aaaa-2::0"])
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "the next GPU container of pod default/wide, a, asks for 1" in err.value.details()
        a = await r.kubelet.allocate_ids(RESOURCE, ["GPU-aaaa-1::0"])
        b = await r.kubelet.allocate_ids(RESOURCE, ["GPU-aaaa-2::0", "GPU-aaaa-3::0"])
        assert a.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-aaaa-1"
        assert b.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-aaaa-2,GPU-aaaa-3"
        assert b.envs["GPUPOOL_MEMORY_LIMIT_MIB"] == "81920,81920"


async def test_a_version_1_allocation_for_two_gpu_containers_is_refused() -> None:
    async with rig() as r:
        created = await r.cluster.create_pod(
            {"metadata": {"name": "old", "namespace": "default", "annotations": {}},
             "spec": {"containers": [container("x", "4096", "10"), container("y", "4096", "10")]},
             "status": {"phase": "Pending"}}
        )
        uid = created["metadata"]["uid"]
        doc = AllocationDoc(pod_uid=uid, node=NODE, gpus=[POD_GRANT])
        text = doc.model_dump_json(exclude_none=True)
        await r.cluster.patch_pod_annotations("default", "old", {ANN_ALLOCATION: text})
        await r.cluster.create_binding("default", "old", uid, NODE)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await r.kubelet.allocate_ids(RESOURCE, ["GPU-aaaa-0::0"])
        assert "does not say which container holds which GPUs" in err.value.details()


async def test_a_pod_bound_while_a_two_container_pod_is_half_served_makes_the_calls_of_its_size_ambiguous() -> None:
    async with rig() as r:
        await bind_duo(r.cluster)
        first = await r.kubelet.allocate_ids(RESOURCE, ["GPU-aaaa-0::0"])
        assert share(first.envs) == expected(TRAIN_GRANT)
        # the scheduler's hold on the node ran out: solo (1 GPU, like each of duo's containers) and pair
        # (2 GPUs) are bound while duo's second container still waits
        await scheduler_binds(r.cluster, pod_object("solo", 1), [("GPU-aaaa-1", 1, 2048, 10.0)])
        await scheduler_binds(r.cluster, pod_object("pair", 2),
                              [("GPU-aaaa-2", 2, 81920, 100.0), ("GPU-aaaa-3", 3, 81920, 100.0)])
        # eval's call, train's repeat: either could be solo's admission; refused, naming both pods
        for ids in (["GPU-aaaa-0::1"], ["GPU-aaaa-0::0"]):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await r.kubelet.allocate_ids(RESOURCE, ids)
            assert "ambiguous" in err.value.details()
            assert "default/duo" in err.value.details() and "default/solo" in err.value.details()
        # a call of 2 devices can only be pair's
        both = await r.kubelet.allocate_ids(RESOURCE, ["GPU-aaaa-2::0", "GPU-aaaa-3::0"])
        assert both.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-aaaa-2,GPU-aaaa-3"
        # kubelet fails solo's admission: duo is the only candidate again, and eval gets its own share
        await r.cluster.patch_pod_status("default", "solo", {"phase": "Failed"})
        assert share((await r.kubelet.allocate_ids(RESOURCE, ["GPU-aaaa-0::1"])).envs) == expected(EVAL_GRANT)
        assert await marker(r, "duo") is not None and await marker(r, "solo") is None


# --- crashes between the steps of either container's call ----------------------------------------------------


class Crash(BaseException):
    """The agent process dies here (not an Exception: no handler of the agent runs after it)."""


class CrashAt:
    """The step hook: the agent dies after `step` of its `call`-th Allocate."""

    def __init__(self, step: str, call: int) -> None:
        self.step, self.call, self.calls = step, call, 0
        self.crashed = asyncio.Event()

    def __call__(self, current: str) -> None:
        self.calls += current == STEP_READ  # every call passes the read step first
        if current == self.step and self.calls == self.call and not self.crashed.is_set():
            self.crashed.set()
            raise Crash(f"crash after step {self.step} of call {self.call}")


# the first container's call never reaches the marker step (the pod has a second GPU container)
CASES = [(s, 1) for s in (STEP_READ, STEP_CHECKPOINTED)] + [(s, 2) for s in (STEP_READ, STEP_CHECKPOINTED,
                                                                             STEP_MARKED)]


@pytest.mark.parametrize(("step", "call"), CASES)
async def test_a_crash_after_any_step_of_either_call_is_completed_and_each_container_keeps_its_share(
    step: str, call: int
) -> None:
    hook = CrashAt(step, call)
    ids = [["GPU-aaaa-0::0"], ["GPU-aaaa-0::1"]]
    async with rig(step=hook) as r:
        await bind_duo(r.cluster)
        if call == 2:
            assert share((await r.kubelet.allocate_ids(RESOURCE, ids[0])).envs) == expected(TRAIN_GRANT)
        pending = asyncio.create_task(r.kubelet.allocate_ids(RESOURCE, ids[call - 1]))
        await asyncio.wait_for(hook.crashed.wait(), 10)
        await r.restart_agent()
        with pytest.raises(grpc.aio.AioRpcError):  # kubelet sees the call fail
            await pending
        await r.kubelet.wait_for(lambda k: len(k.registrations) == 2 and len(k.healthy(RESOURCE)) == 16)

        # the restart completed the marker only when the last container's answer was fixed
        fixed_last = call == 2 and step != STEP_READ
        assert ((await marker(r, "duo")) is not None) == fixed_last

        # kubelet asks again for the crashed call, then goes on: each container gets its own share
        grants = [TRAIN_GRANT, EVAL_GRANT]
        for n in range(call - 1, 2):
            assert share((await r.kubelet.allocate_ids(RESOURCE, ids[n])).envs) == expected(grants[n])
        done = await marker(r, "duo")
        assert done is not None and done["devices"] == ["GPU-aaaa-0::0", "GPU-aaaa-0::1"]
