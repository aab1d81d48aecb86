"""`gpupool drain`: the node cordoned, the remote shares it serves moved (the targets the scheduler's framework
chooses, each counted before the next is asked, and why none), the pods holding its GPUs in place evicted
(budgets honoured) and nothing else, --dry-run changing nothing, and the exit status (against a MemoryCluster:
tests/commands/remote_cluster.py).

The remote shares' pods ask for the policy firstfit, so the targets are computed by hand: the remote tiers
are all "any" (no zones; no pod runs on a candidate node), every node scores 0, so the first node in the
ledger's order with a GPU that fits wins (gpu-0001 < gpu-0002), and its first GPU that fits."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from gpupool.api.moves import GpuRef, Move
from gpupool.cli import main
from gpupool.cluster.memory import MemoryCluster
from gpupool.cluster.port import NODES, PDBS, PODS
from gpupool.commands.drain import drain_node
from gpupool.commands.migrate import Refused
from tests.commands.remote_cluster import NS, Clock, add_claim, add_pod, moves_of, remote_cluster, set_move

EPOCH = 1_800_000_000.0  # the wall clock of these tests at their start: 2027-01-15T08:00:00Z

GPU_POD = [{"name": "c", "image": "x", "resources": {"limits": {"gpupool.io/gpu": "1"}}}]


async def scene() -> tuple[MemoryCluster, dict[str, str]]:
    """On gpu-0000: remote shares c1 (4 GiB, its pod p1 on cpu-0) and c2 (12 GiB, its pod p2 on gpu-0000
    itself), a hook claim h1 whose pod ph runs there, a device-plugin pod pd, a pod with no GPU pp. Elsewhere:
    gpu-0001's GPUs have 14336 and 8192 MiB free (a hook pod po on gpu-0001), gpu-0002/gpu-0 16384 (its GPU 1 is
    tainted)."""
    cluster = await remote_cluster()
    uids = {
        "c1": await add_claim(cluster, "c1", "gpu-0000", 0, 4096, 25),
        "c2": await add_claim(cluster, "c2", "gpu-0000", 1, 12288, 50),
    }
    await add_pod(cluster, "p1", "cpu-0", ["c1"])
    await add_pod(cluster, "p2", "gpu-0000", ["c2"])
    for pod in ("p1", "p2"):
        await cluster.patch_pod_annotations("team", pod, {"gpupool.io/policy": "firstfit"})
    await add_claim(cluster, "h1", "gpu-0000", 1, 1024, 5, isolation="hook")
    await add_pod(cluster, "ph", "gpu-0000", ["h1"])
    await add_pod(cluster, "pd", "gpu-0000", [], containers=GPU_POD)
    await add_pod(cluster, "pp", "gpu-0000", [])
    await add_claim(cluster, "f1", "gpu-0001", 0, 2048, 10, isolation="hook")
    await add_claim(cluster, "f2", "gpu-0001", 1, 8192, 50, isolation="hook")
    await add_pod(cluster, "po", "gpu-0001", ["f1"])
    return cluster, uids


async def run(cluster: MemoryCluster, node: str = "gpu-0000", wait_s: float = 0, dry_run: bool = False,
              clock: Clock | None = None) -> tuple[int, list[str]]:
    lines: list[str] = []
    clock = clock or Clock()
    code = await drain_node(cluster, node, NS, wait_s, dry_run, lines.append, clock.sleep, clock,
                            wall=lambda: EPOCH + clock.now)
    return code, lines


async def pods(cluster: MemoryCluster) -> list[str]:
    return sorted(p["metadata"]["name"] for p in (await cluster.list_pods())[0])


async def test_drain_cordons_moves_the_shares_and_evicts_the_pods_holding_gpus_in_place() -> None:
    cluster, uids = await scene()
    code, lines = await run(cluster)
    assert code == 0
    assert (await cluster.get_node("gpu-0000"))["spec"]["unschedulable"] is True
    moves = await moves_of(cluster)
    # the larger share is asked for first: c2 (12 GiB, 50 %) fits gpu-0001/gpu-0 (14336 MiB, 90 % free), the first
    # GPU of the first node; then c1 (4 GiB, 25 %): gpu-0001/gpu-0 has 2048 MiB left once c2 is counted there,
    # gpu-0001/gpu-1 8192 MiB and 50 %: there
    assert {k: (m.source, m.target, m.state) for k, m in moves.items()} == {
        uids["c2"]: (GpuRef("gpu-0000", 1), GpuRef("gpu-0001", 0), "requested"),
        uids["c1"]: (GpuRef("gpu-0000", 0), GpuRef("gpu-0001", 1), "requested"),
    }
    assert {m.deadline for m in moves.values()} == {"2027-01-15T08:10:00Z"}  # the default 600 s
    # evicted: the hook claim's pod and the device-plugin pod; p2 (a remote client: its share moves), pp (no
    # GPU: kubectl drain's) and the pods of other nodes stay
    assert await pods(cluster) == ["p1", "p2", "po", "pp"]
    assert lines == [
        "cordon gpu-0000",
        "move claim team/c2: gpu-0000/gpu-1 -> gpu-0001/gpu-0",
        "move claim team/c1: gpu-0000/gpu-0 -> gpu-0001/gpu-1",
        "evict pod team/pd (it holds a GPU of gpu-0000 in place)",
        "evict pod team/ph (it holds a GPU of gpu-0000 in place)",
        "evicted pod team/pd",
        "evicted pod team/ph",
        "2 move(s) requested; not waiting (--wait 0)",
        "gpupool drain gpu-0000: done; other pods are kubectl drain's",
    ]


async def test_dry_run_changes_nothing() -> None:
    cluster, _ = await scene()
    code, lines = await run(cluster, dry_run=True)
    assert code == 0
    assert not (await cluster.get_node("gpu-0000")).get("spec", {}).get("unschedulable")
    assert await moves_of(cluster) == {}
    assert await pods(cluster) == ["p1", "p2", "pd", "ph", "po", "pp"]
    assert lines[0] == "would cordon gpu-0000" and all(line.startswith("would ") for line in lines)
    assert "would move claim team/c2: gpu-0000/gpu-1 -> gpu-0001/gpu-0" in lines


async def test_waiting_follows_the_moves_to_their_end() -> None:
    cluster, uids = await scene()
    clock = Clock()

    async def agents_finish() -> None:
        for uid, move in (await moves_of(cluster)).items():
            await set_move(cluster, uid, move.advanced("ready").advanced("moved"))

    clock.on_sleep = [agents_finish]
    code, lines = await run(cluster, wait_s=60, clock=clock)
    assert code == 0
    assert "claim team/c1: moved" in lines and "claim team/c2: moved" in lines
    assert lines[-1] == "gpupool drain gpu-0000: done; other pods are kubectl drain's"


async def test_a_failed_move_and_a_share_that_fits_nowhere_are_left_and_exit_1() -> None:
    cluster, uids = await scene()
    # gpu-0001 cordoned and gpu-0002/gpu-0 nearly full: c2 (12 GiB) fits nowhere, c1 (4 GiB) goes to gpu-0002
    await cluster.patch_object(NODES, "gpu-0001", {"spec": {"unschedulable": True}})
    await add_claim(cluster, "f3", "gpu-0002", 0, 8192, 10, isolation="hook")
    clock = Clock()

    async def agent_fails() -> None:
        move = (await moves_of(cluster))[uids["c1"]]
        await set_move(cluster, uids["c1"], move.advanced("failed", "the target GPU server is unreachable"))

    clock.on_sleep = [agent_fails]
    code, lines = await run(cluster, wait_s=60, clock=clock)
    assert code == 1
    assert (await moves_of(cluster))[uids["c1"]].target == GpuRef("gpu-0002", 0)
    assert uids["c2"] not in await moves_of(cluster)
    left = ("left: claim team/c2 on gpu-0000/gpu-1 fits on no other GPU server: gpu-0002/gpu-0 has 90 % compute and "
            "8192 MiB free, the share needs 50 % and 12288 MiB: ")
    assert any(line.startswith(left) for line in lines), lines
    assert "left: claim team/c1: the move failed: the target GPU server is unreachable" in lines
    assert lines[-1] == "gpupool drain gpu-0000: 2 thing(s) left; other pods are kubectl drain's"


async def test_an_eviction_a_budget_forbids_is_asked_again_until_wait_runs_out() -> None:
    cluster, _ = await scene()
    await add_pod(cluster, "pb", "gpu-0000", [], containers=GPU_POD)
    await cluster.patch_object(PODS, "pb", {"metadata": {"labels": {"app": "b"}}}, namespace="team")
    await cluster.patch_pod_status("team", "pb", {"conditions": [{"type": "Ready", "status": "True"}]})
    budget: dict[str, Any] = {"metadata": {"name": "b", "namespace": "team"},
                              "spec": {"selector": {"matchLabels": {"app": "b"}}},
                              "status": {"disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1}}
    await cluster.create_object(PDBS, budget)
    clock = Clock()
    code, lines = await run(cluster, wait_s=12, clock=clock)
    assert code == 1
    assert [line for line in lines if line.startswith("left: ")] == [
        "left: pod team/pb not evicted: its disruption budget forbids it (Cannot evict pod as it would violate the "
        "pod's disruption budget.)",
        "left: claim team/c2: still requested after 12 s; the entry stays until its deadline 2027-01-15T08:10:00Z "
        "(then it is cancelled), waiting for the agent of gpu-0001 to prepare the share on gpu-0001/gpu-0",
        "left: claim team/c1: still requested after 12 s; the entry stays until its deadline 2027-01-15T08:10:00Z "
        "(then it is cancelled), waiting for the agent of gpu-0001 to prepare the share on gpu-0001/gpu-1",
    ]
    assert clock.sleeps >= 2 and clock.now >= 12  # asked again every EVICT_RETRY_S until --wait ran out
    assert "pb" in await pods(cluster)


async def test_an_unknown_node_is_a_usage_error() -> None:
    cluster, _ = await scene()
    with pytest.raises(Refused) as e:
        await run(cluster, node="gpu-\x1b[2J")
    assert e.value.code == 2 and e.value.message == "node gpu-\\x1b[2J not found"


async def test_a_share_already_moving_away_is_followed_not_moved_again() -> None:
    cluster, uids = await scene()
    await set_move(cluster, uids["c1"], Move("team/c1", GpuRef("gpu-0000", 0), GpuRef("gpu-0001", 1), "ready"))
    code, lines = await run(cluster)
    assert code == 0
    assert (await moves_of(cluster))[uids["c1"]].state == "ready"
    assert "claim team/c1 is already moving to gpu-0001/gpu-1 (ready)" in lines


def test_the_command_line() -> None:
    runner = CliRunner()
    assert "--dry-run" in runner.invoke(main, ["drain", "--help"]).output
    assert runner.invoke(main, ["drain"]).exit_code == 2
    assert runner.invoke(main, ["drain", "n", "--wait", "x"]).exit_code == 2
    for bad in ("0", "-5", "x"):
        out = runner.invoke(main, ["drain", "n", "--deadline", bad])
        assert out.exit_code == 2 and "--deadline" in out.output and "Traceback" not in out.output
