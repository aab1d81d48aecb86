"""R3 (reliability-tests.md): two pods with different shares on one node, bound and admitted in both
orders, with and without a second pod bound while the first still waits for its Allocate (the scheduler
went on past its hold). Over 1,000 randomized runs against the real agent over one kubelet connection,
every Allocate that succeeds hands the container exactly the limits of the pod being admitted, every
ambiguous case (two waiting pods asking for as many devices) is refused, and Allocate never touches the
Node object."""

from __future__ import annotations

import random
from typing import Any

import grpc

from gpupool.cluster.memory import MemoryCluster
from tests.agent.agent_helpers import RESOURCE, Rig, count_node_calls, pod_object, rig, scheduler_binds

GPUS = [f"GPU-aaaa-{i}" for i in range(4)]
CARD_MIB = 81920
RUNS = 1000


def random_grants(rng: random.Random) -> list[tuple[str, int, int, float]]:
    """A share of one GPU (random memory and cores) or 1-2 whole GPUs."""
    if rng.random() < 0.75:
        i = rng.randrange(4)
        return [(GPUS[i], i, rng.randrange(256, CARD_MIB, 256), float(rng.randrange(5, 100, 5)))]
    picked = sorted(rng.sample(range(4), rng.choice([1, 2])))
    return [(GPUS[i], i, CARD_MIB, 100.0) for i in picked]


def expected_env(grants: list[tuple[str, int, int, float]]) -> dict[str, str]:
    return {
        "NVIDIA_VISIBLE_DEVICES": ",".join(g[0] for g in grants),
        "GPUPOOL_MEMORY_LIMIT_MIB": ",".join(str(g[2]) for g in grants),
        "GPUPOOL_CORES_PERCENT": ",".join(f"{g[3]:g}" for g in grants),
    }


async def admit(r: Rig, key: str, count: int) -> dict[str, str] | str:
    """Kubelet admits the pod's container: its env on success, the refusal text otherwise."""
    try:
        resp = await r.kubelet.allocate(RESOURCE, key, count)
    except grpc.aio.AioRpcError as e:
        return e.details() or ""
    return {k: resp.envs[k] for k in ("NVIDIA_VISIBLE_DEVICES", "GPUPOOL_MEMORY_LIMIT_MIB", "GPUPOOL_CORES_PERCENT")}


async def finish(cluster: MemoryCluster, r: Rig, pods: list[dict[str, Any]]) -> None:
    for p in pods:
        m = p["metadata"]
        await cluster.delete_pod(m["namespace"], m["name"])
        r.kubelet.release(f"{m['namespace']}/{m['name']}")


async def test_each_pod_gets_its_own_limits_over_randomized_runs() -> None:
    rng = random.Random(20261121)
    served = served_late = refused = overlaps = different_sizes = 0
    async with rig() as r:
        calls = count_node_calls(r)
        for run in range(RUNS):
            a_grants, b_grants = random_grants(rng), random_grants(rng)
            while expected_env(a_grants) == expected_env(b_grants):  # "different shares"
                b_grants = random_grants(rng)
            a = pod_object(f"a{run}", len(a_grants))
            b = pod_object(f"b{run}", len(b_grants))
            first, second = (a, b) if rng.random() < 0.5 else (b, a)
            grants = {a["metadata"]["name"]: a_grants, b["metadata"]["name"]: b_grants}
            key = {p["metadata"]["name"]: f"default/{p['metadata']['name']}" for p in (a, b)}
            overlap = rng.random() < 0.3
            if not overlap:
                # the normal protocol: bind, admit, then the next pod
                for p in (first, second):
                    name = p["metadata"]["name"]
                    await scheduler_binds(r.cluster, p, grants[name])
                    got = await admit(r, key[name], len(grants[name]))
                    assert got == expected_env(grants[name]), f"run {run}: {name} got {got}"
                    await r.cluster.patch_pod_status("default", name, {"phase": "Running"})
                    served += 1
            else:
                # the first pod's Allocate is late: the scheduler's hold on the node ran out and it bound the
                # second pod while the first still waits; kubelet then admits the two in either order
                for p in (first, second):
                    await scheduler_binds(r.cluster, p, grants[p["metadata"]["name"]])
                same_size = len(a_grants) == len(b_grants)
                order = [first, second] if rng.random() < 0.5 else [second, first]
                for n, p in enumerate(order):
                    name = p["metadata"]["name"]
                    got = await admit(r, key[name], len(grants[name]))
                    if isinstance(got, str):  # refused: kubelet fails the pod
                        # only the first call, while both pods wait with the same size, may be refused
                        assert n == 0 and same_size, f"run {run}: {name} refused: {got}"
                        assert got.count("default/") == 2 and "ambiguous" in got, got  # names both pods
                        refused += 1
                        await r.cluster.patch_pod_status("default", name, {"phase": "Failed"})
                        r.kubelet.release(key[name])
                    else:
                        # never the other pod's share; and a call of a size both wait with is never served
                        assert got == expected_env(grants[name]), f"run {run}: {name} got another pod's {got}"
                        assert n == 1 or not same_size, f"run {run}: {name} served although ambiguous"
                        served_late += 1
                        await r.cluster.patch_pod_status("default", name, {"phase": "Running"})
                overlaps += 1
                different_sizes += not same_size
            await finish(r.cluster, r, [a, b])
        # every decision came from the pods and the checkpoint: the Node object was never read nor written
        assert (calls.node_reads, calls.node_writes) == (0, 0)
    # normal runs serve both pods; an overlap refuses exactly its first call when both pods ask for as many
    # devices (then the other pod is the only candidate left), and serves both calls otherwise
    assert served == 2 * (RUNS - overlaps)
    assert refused == overlaps - different_sizes and served_late == overlaps + different_sizes
    # both paths were exercised: P(overlap) = 0.3 (about 300 of 1,000 runs); a pod asks for 2 devices with
    # P = 0.25 * 0.5 = 0.125, so the sizes differ with P = 2 * 0.125 * 0.875 ~ 0.22 (about 65 overlaps)
    assert overlaps > 200 and different_sizes > 30 and refused > 150
