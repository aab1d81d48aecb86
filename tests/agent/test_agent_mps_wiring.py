"""The MPS supervisor inside the agent: Allocate refuses MPS shares on a GPU whose daemon is down, the node
inventory carries each GPU's daemon state and restarts, and /metrics serves them. The daemons are a stand-in
control program (a function answering like `nvidia-cuda-mps-control`) whose GPU can be broken at will."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpupool.agent.devices.mps import Answer, MpsConfig, MpsSupervisor
from gpupool.api.inventory import decode_inventory
from gpupool.api.names import ANN_INVENTORY
from tests.agent.agent_helpers import NODE, RESOURCE, Rig, eventually, pod_object, rig, scheduler_binds, scrape_metrics

GPUS = [f"GPU-aaaa-{i}" for i in range(4)]


class FakeDaemons:
    """One daemon per GPU (by CUDA_VISIBLE_DEVICES): `-d` starts it unless its GPU is broken; any command
    is answered while it runs."""

    def __init__(self) -> None:
        self.running: set[str] = set()
        self.broken: set[str] = set()

    def __call__(self, argv: list[str], env: dict[str, str], stdin: str, timeout_s: float) -> Answer:
        gpu = env["CUDA_VISIBLE_DEVICES"]
        if argv[1:] == ["-d"]:
            if gpu in self.broken:
                return Answer(False, "cannot start: GPU broken")
            self.running.add(gpu)
            return Answer(True, "")
        return Answer(True, "100") if gpu in self.running else Answer(False, "Cannot find MPS control daemon process")

    def kill(self, gpu: str, for_good: bool) -> None:
        self.running.discard(gpu)
        if for_good:
            self.broken.add(gpu)


def supervisor(tmp: Path, daemons: FakeDaemons) -> MpsSupervisor:
    return MpsSupervisor(MpsConfig(pipe_root=tmp / "pipe", log_root=tmp / "log"), GPUS, lambda: 0.0, runner=daemons)


async def inventory_mps(r: Rig) -> dict[str, tuple[str, int]]:
    text = (await r.cluster.get_node(NODE))["metadata"]["annotations"][ANN_INVENTORY]
    return {g.uuid: (g.mps, g.mps_restarts) for g in decode_inventory(text).gpus}


async def mps_metrics(r: Rig) -> dict[tuple[str, str], float]:
    text = await scrape_metrics(r)
    return {(s.name, s.labels["gpu"]): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name.startswith("gpupool_mps_daemon")}


async def test_mps_shares_are_refused_while_the_gpus_daemon_is_down_and_health_is_published(tmp_path: Path) -> None:
    daemons = FakeDaemons()
    async with rig(mps=supervisor(tmp_path, daemons), isolation="mps", mps_check_interval_s=0.05) as r:
        await eventually(lambda: daemons.running == set(GPUS))
        await scheduler_binds(r.cluster, pod_object("a", 1), [("GPU-aaaa-0", 0, 8192, 25.0)], isolation="mps")
        served = await r.kubelet.allocate_ids(RESOURCE, ["GPU-aaaa-0::0"])
        assert served.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"

        daemons.kill("GPU-aaaa-1", for_good=True)  # it dies and cannot be started again
        await eventually(lambda: r.agent.mps is not None and not r.agent.mps.health["GPU-aaaa-1"].up)
        await scheduler_binds(r.cluster, pod_object("b", 1), [("GPU-aaaa-1", 1, 8192, 25.0)], isolation="mps")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await r.kubelet.allocate_ids(RESOURCE, ["GPU-aaaa-1::0"])
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "pod default/b asks for isolation mps: the MPS daemon of GPU GPU-aaaa-1 is down" in err.value.details()

        # the inventory says so at once (restarts: each failed start after the first counts)
        async def down_published() -> bool:
            state, restarts = (await inventory_mps(r))["GPU-aaaa-1"]
            return state == "down" and restarts >= 1
        await eventually_async(down_published)
        assert (await inventory_mps(r))["GPU-aaaa-0"] == ("up", 0)
        metrics = await mps_metrics(r)
        assert metrics[("gpupool_mps_daemon_up", "GPU-aaaa-0")] == 1.0
        assert metrics[("gpupool_mps_daemon_up", "GPU-aaaa-1")] == 0.0
        assert metrics[("gpupool_mps_daemon_restarts_total", "GPU-aaaa-1")] >= 1.0

        # the GPU is repaired: the supervisor starts its daemon and the same call is served
        daemons.broken.clear()
        await eventually(lambda: r.agent.mps is not None and r.agent.mps.health["GPU-aaaa-1"].up)
        again = await r.kubelet.allocate_ids(RESOURCE, ["GPU-aaaa-1::0"])
        assert again.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/run/gpupool/mps"


async def test_whole_gpus_and_other_isolations_do_not_depend_on_the_daemon(tmp_path: Path) -> None:
    daemons = FakeDaemons()
    daemons.broken.add("GPU-aaaa-2")
    async with rig(mps=supervisor(tmp_path, daemons), isolation="mps", mps_check_interval_s=0.05) as r:
        await eventually(lambda: r.agent.mps is not None and r.agent.mps.health["GPU-aaaa-2"].starts > 0)
        # a whole GPU gets no MPS settings (docs/agent.md), so its daemon does not matter
        await scheduler_binds(r.cluster, pod_object("whole", 1), [("GPU-aaaa-2", 2, 81920, 100.0)], isolation="mps")
        assert "CUDA_MPS_PIPE_DIRECTORY" not in (await r.kubelet.allocate_ids(RESOURCE, ["GPU-aaaa-2::0"])).envs


async def test_an_agent_without_mps_daemons_publishes_no_mps_state_and_refuses_mps_shares() -> None:
    """Default isolation hook, no daemons: an MPS share would get the client settings and no server to
    enforce them, so it is refused with the reason (not retried: no daemon will come); a whole GPU asked for
    with isolation mps needs none and is served."""
    async with rig() as r:
        assert set((await inventory_mps(r)).values()) == {("", 0)}
        assert await mps_metrics(r) == {}
        await scheduler_binds(r.cluster, pod_object("share", 1), [("GPU-aaaa-0", 0, 8192, 25.0)], isolation="mps")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await r.kubelet.allocate_ids(RESOURCE, ["GPU-aaaa-0::0"])
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert (f"pod default/share asks for isolation mps, but the agent on {NODE} runs no MPS daemons "
                "(agent setting mps_daemons, or default isolation mps), so its MPS limits would not apply"
                ) in err.value.details()
        # the pod fails admission and is recreated elsewhere; a whole-GPU pod with isolation mps is served
        await r.cluster.delete_pod("default", "share")
        await scheduler_binds(r.cluster, pod_object("whole", 1), [("GPU-aaaa-1", 1, 81920, 100.0)], isolation="mps")
        whole = await r.kubelet.allocate_ids(RESOURCE, ["GPU-aaaa-1::0"])
        assert whole.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-aaaa-1" and "CUDA_MPS_PIPE_DIRECTORY" not in whole.envs


async def test_an_mps_share_on_a_gpu_without_a_supervised_daemon_is_refused(tmp_path: Path) -> None:
    """Daemons for GPUs 0-2 only (say, GPU 3 appeared after the agent started): a share of GPU 3 is
    refused as not servable, not as a daemon to wait for."""
    daemons = FakeDaemons()
    three = MpsSupervisor(MpsConfig(pipe_root=tmp_path / "pipe", log_root=tmp_path / "log"), GPUS[:3],
                          lambda: 0.0, runner=daemons)
    async with rig(mps=three, mps_check_interval_s=0.05) as r:  # default isolation hook, daemons asked for
        assert (await inventory_mps(r))["GPU-aaaa-0"] == ("up", 0)  # started before the first inventory
        await scheduler_binds(r.cluster, pod_object("late", 1), [("GPU-aaaa-3", 3, 8192, 25.0)], isolation="mps")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await r.kubelet.allocate_ids(RESOURCE, ["GPU-aaaa-3::0"])
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "asks for isolation mps: GPU GPU-aaaa-3 has no MPS daemon managed by gpupool" in err.value.details()


async def eventually_async(check, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    """Await `check()` until it is true; the timeout only prevents a hang."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await check():
        if loop.time() > deadline:
            raise AssertionError("condition not reached before the timeout")
        await asyncio.sleep(0.02)
