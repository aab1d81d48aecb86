"""Crash the agent between every two steps of an Allocate and restart it on the same checkpoint directory:
the restarted agent completes what was left (the pod's `gpupool.io/allocated` marker, which tells the
scheduler the node is free again), kubelet asking again gets the very answer the pod's allocation says, and
no pod ever gets another pod's share.

A crash is a BaseException raised from the step hook, so no code of the agent after that step runs (its
`except Exception` handlers do not catch it, and the call never gets an answer); then the agent is stopped,
which ends the call for kubelet and writes nothing to the API or the checkpoint, and a new agent starts on
the same directory: what a process kill and restart leaves. Kubelet and the embedded API server keep
running, as they do on a real node. Real gRPC over unix sockets.
"""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest

from gpupool.agent.kubelet.device_plugin import STEP_CHECKPOINTED, STEP_MARKED, STEP_READ
from gpupool.agent.state.checkpoint import Checkpoint
from gpupool.api.names import ANN_ALLOCATED
from tests.agent.agent_helpers import NODE, RESOURCE, Rig, pod_object, rig, scheduler_binds

STEPS = [STEP_READ, STEP_CHECKPOINTED, STEP_MARKED]


class Crash(BaseException):
    """The agent process dies here."""


class CrashAfter:
    """The step hook: the first time `step` is done, the agent dies."""

    def __init__(self, step: str) -> None:
        self.step = step
        self.crashed = asyncio.Event()

    def __call__(self, current: str) -> None:
        if current == self.step and not self.crashed.is_set():
            self.crashed.set()
            raise Crash(f"crash after step {self.step}")


# Pod A: 4096 MiB and 25 % of GPU-aaaa-0; pod B: 8192 MiB and 50 % of GPU-aaaa-1 (hook isolation: the answer
# carries the limits as environment, one value each for the one granted GPU).
A_SHARE = {"NVIDIA_VISIBLE_DEVICES": "GPU-aaaa-0", "GPUPOOL_MEMORY_LIMIT_MIB": "4096", "GPUPOOL_CORES_PERCENT": "25"}
B_SHARE = {"NVIDIA_VISIBLE_DEVICES": "GPU-aaaa-1", "GPUPOOL_MEMORY_LIMIT_MIB": "8192", "GPUPOOL_CORES_PERCENT": "50"}


def share(envs: dict[str, str]) -> dict[str, str]:
    return {k: envs[k] for k in A_SHARE}


async def marker(r: Rig, name: str) -> dict[str, object] | None:
    text = ((await r.cluster.get_pod("default", name))["metadata"].get("annotations") or {}).get(ANN_ALLOCATED)
    return None if text is None else dict(json.loads(text))


async def crash_and_restart(r: Rig, hook: CrashAfter, ids: list[str]) -> None:
    """Kubelet calls Allocate, the agent dies after the hooked step, a new agent starts and registers."""
    call = asyncio.create_task(r.kubelet.allocate_ids(RESOURCE, ids))
    await asyncio.wait_for(hook.crashed.wait(), 10)
    await r.restart_agent()
    with pytest.raises(grpc.aio.AioRpcError):  # kubelet sees the call fail, whatever the crash left
        await call
    await r.kubelet.wait_for(lambda k: len(k.registrations) == 2 and len(k.healthy(RESOURCE)) == 16)


@pytest.mark.parametrize("step", STEPS)
async def test_restart_completes_and_kubelet_asking_again_gets_the_pods_own_share(step: str) -> None:
    hook = CrashAfter(step)
    async with rig(step=hook) as r:
        await scheduler_binds(r.cluster, pod_object("a", 1), [("GPU-aaaa-0", 0, 4096, 25.0)])
        ids = ["GPU-aaaa-0::0"]
        await crash_and_restart(r, hook, ids)

        written = step != STEP_READ  # from the checkpoint on, the answer is fixed and the restart completes it
        assert ((await marker(r, "a")) is not None) == written
        entries = Checkpoint(r.config.checkpoint_path, NODE)
        assert entries.load() is None and len(entries.entries) == (1 if written else 0)

        resp = await r.kubelet.allocate_ids(RESOURCE, ids)  # kubelet asks again for the same devices
        assert share(dict(resp.envs)) == A_SHARE
        served = await marker(r, "a")
        assert served is not None and (served["node"], served["devices"]) == (NODE, ids)

        # the node goes on: the next pod gets its own share, not a's
        await scheduler_binds(r.cluster, pod_object("b", 1), [("GPU-aaaa-1", 1, 8192, 50.0)])
        resp_b = await r.kubelet.allocate_ids(RESOURCE, ["GPU-aaaa-1::0"])
        assert share(dict(resp_b.envs)) == B_SHARE


@pytest.mark.parametrize("step", STEPS)
async def test_devices_of_a_crashed_pod_reused_by_the_next_pod_carry_the_next_pods_share(step: str) -> None:
    """After the crash pod a is deleted (its admission failed), kubelet frees its device and hands the same
    device ID to pod b: the checkpoint of a must not answer for b."""
    hook = CrashAfter(step)
    async with rig(step=hook) as r:
        await scheduler_binds(r.cluster, pod_object("a", 1), [("GPU-aaaa-0", 0, 4096, 25.0)])
        ids = ["GPU-aaaa-0::0"]
        await crash_and_restart(r, hook, ids)
        await r.cluster.delete_pod("default", "a")  # the scheduler no longer counts it as waiting either

        await scheduler_binds(r.cluster, pod_object("b", 1), [("GPU-aaaa-1", 1, 8192, 50.0)])
        resp = await r.kubelet.allocate_ids(RESOURCE, ids)  # the very device ID pod a had
        assert share(dict(resp.envs)) == B_SHARE
        assert (await marker(r, "b")) is not None
        entries = Checkpoint(r.config.checkpoint_path, NODE)
        entries.load()
        assert {e.name for e in entries.entries.values()} == {"b"}  # a's entry went with the pod


@pytest.mark.parametrize("step", STEPS)
async def test_crash_with_a_rogue_pod_waiting_never_hands_out_the_crashed_pods_share(step: str) -> None:
    """A pod bound with spec.nodeName (no allocation, asking for one GPU too) waits on the node after the
    restart: a call with the crashed pod's devices could be for either pod, so it is refused as ambiguous,
    repeat or not, instead of handing the rogue pod a's share."""
    hook = CrashAfter(step)
    async with rig(step=hook) as r:
        await scheduler_binds(r.cluster, pod_object("a", 1), [("GPU-aaaa-0", 0, 4096, 25.0)])
        ids = ["GPU-aaaa-0::0"]
        await crash_and_restart(r, hook, ids)
        await r.cluster.create_pod(pod_object("rogue", 1, node=NODE))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await r.kubelet.allocate_ids(RESOURCE, ids)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "ambiguous" in err.value.details() and "default/rogue" in err.value.details()
        assert await marker(r, "rogue") is None
