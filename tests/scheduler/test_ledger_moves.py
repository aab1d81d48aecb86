"""Remote shares that move (gpupool.api.moves) in the scheduler's ledger: a share counts on exactly the GPUs
`holding` names, on one or two, never on none; the ledger equals the recomputation from the API objects with
the same moves; and the watch follows the moves ConfigMap into the ledger."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from gpupool.api.dra import DRIVER, MOVING_SUFFIX
from gpupool.api.moves import MOVES_CONFIGMAP, STATES, GpuRef, Move, holding
from gpupool.api.recompute import recompute
from gpupool.cluster.memory import MemoryCluster
from gpupool.cluster.port import CONFIGMAPS, RESOURCE_CLAIMS
from gpupool.demo.embedded import node_objects
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.ledger import Ledger
from gpupool.scheduler.service import ExtenderService
from tests.scheduler.conftest import small_scenario

NODES = node_objects(small_scenario(nodes=3, gpus=2))  # gpu-0000..gpu-0002, 2 GPUs of 16384 MiB each
NAMES = [str(n["metadata"]["name"]) for n in NODES]


def remote_claim(uid: str = "u1", node: str = "gpu-0000", gpu: int = 0, memory_mib: int = 4096,
                 cores: int = 25) -> dict[str, Any]:
    config = [{"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": {"isolation": "remote"}}}]
    result = {"request": "gpu", "driver": DRIVER, "pool": node, "device": f"gpu-{gpu}",
              "consumedCapacity": {"memory": f"{memory_mib}Mi", "cores": str(cores)}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": f"c-{uid}", "namespace": "team", "uid": uid},
            "status": {"allocation": {"devices": {"results": [result], "config": config}}}}


def held_by(ledger: Ledger, uid: str) -> set[GpuRef]:
    return {GpuRef(e.allocation.node, g.index) for key in (uid, uid + MOVING_SUFFIX)
            if (e := ledger.entries.get(key)) is not None for g in e.allocation.grants}


def free(ledger: Ledger, ref: GpuRef) -> tuple[int, int]:
    i = ledger.state.index[ref.node]
    return int(ledger.state.gpu_milli_free[i, ref.index]), int(ledger.state.gpu_mem_free[i, ref.index])


def test_a_ready_move_holds_both_gpus_and_a_finished_one_hands_over() -> None:
    ledger = Ledger(NODES)
    ledger.apply_claim("ADDED", remote_claim())
    source, target = GpuRef("gpu-0000", 0), GpuRef("gpu-0001", 1)
    move = Move("team/c-u1", source, target)
    ledger.replace_moves({"u1": move})
    assert held_by(ledger, "u1") == {source} and free(ledger, target) == (1000, 16384)
    ledger.replace_moves({"u1": move.advanced("ready")})
    # 25 % and 4 GiB on both while the contents travel
    assert held_by(ledger, "u1") == {source, target}
    assert free(ledger, source) == free(ledger, target) == (750, 12288)
    # new clients go to the target from `ready` on: the claim's key is there, the source's is the moving one
    assert ledger.entries["u1" + MOVING_SUFFIX].claim and ledger.entries["u1"].allocation.node == "gpu-0001"
    ledger.replace_moves({"u1": move.advanced("ready").advanced("moved")})
    assert held_by(ledger, "u1") == {target} and not ledger.stranded
    assert free(ledger, source) == (1000, 16384) and free(ledger, target) == (750, 12288)
    # the entry gone (dropped from the ConfigMap): the share counts where its allocation put it again
    ledger.replace_moves({})
    assert held_by(ledger, "u1") == {source}
    # the claim deleted: nothing is held, the moving key included
    ledger.replace_moves({"u1": move.advanced("ready")})
    ledger.apply_claim("DELETED", remote_claim())
    assert held_by(ledger, "u1") == set() and free(ledger, target) == (1000, 16384)


def test_a_target_full_of_a_moving_share_hands_over_without_stranding() -> None:
    """The whole GPU moves: at `moved` the claim's entry takes the target's capacity the moving entry held."""
    ledger = Ledger(NODES)
    ledger.apply_claim("ADDED", remote_claim(memory_mib=16384, cores=100))
    move = Move("team/c-u1", GpuRef("gpu-0000", 0), GpuRef("gpu-0002", 1), "ready")
    ledger.replace_moves({"u1": move})
    ledger.replace_moves({"u1": move.advanced("moved")})
    assert held_by(ledger, "u1") == {GpuRef("gpu-0002", 1)} and not ledger.stranded
    assert ledger.diff(recompute(NODES, [], [remote_claim(memory_mib=16384, cores=100)], ledger.moves)) == \
        {"missing": [], "extra": [], "different": [], "overcommitted": []}


refs = st.builds(GpuRef, st.sampled_from(NAMES), st.integers(0, 1))
moves = st.builds(Move, st.just("team/c-u1"), refs, refs, st.sampled_from(STATES))


@given(st.lists(st.one_of(st.none(), moves), min_size=1, max_size=12))
def test_any_sequence_of_moves_counts_the_share_exactly_where_it_is_held(sequence: list[Move | None]) -> None:
    ledger = Ledger(NODES)
    claim = remote_claim()
    ledger.apply_claim("ADDED", claim)
    placed = GpuRef("gpu-0000", 0)
    for move in sequence:
        ledger.replace_moves({} if move is None else {"u1": move})
        held = held_by(ledger, "u1")
        assert held == set(holding(move, placed))
        assert 1 <= len(held) <= 2
        assert ledger.diff(recompute(NODES, [], [claim], ledger.moves)) == \
            {"missing": [], "extra": [], "different": [], "overcommitted": []}
        # nothing else is held anywhere: every GPU not holding the share is wholly free
        for node in NAMES:
            for index in (0, 1):
                ref = GpuRef(node, index)
                assert free(ledger, ref) == ((750, 12288) if ref in held else (1000, 16384))


async def test_the_scheduler_follows_the_moves_configmap() -> None:
    cluster = MemoryCluster()
    for obj in NODES:
        await cluster.create_node(obj)
    claim = await cluster.create_object(RESOURCE_CLAIMS, remote_claim())
    uid = claim["metadata"]["uid"]
    move = Move("team/c-u1", GpuRef("gpu-0000", 0), GpuRef("gpu-0001", 0), "ready")
    await cluster.create_object(CONFIGMAPS, {"metadata": {"name": MOVES_CONFIGMAP, "namespace": "gp-system"},
                                             "data": {uid: move.to_json()}})
    svc = ExtenderService(cluster, SchedulerConfig(leader_elect=False, gpupool_namespace="gp-system"))
    await svc.start()
    try:
        # listed at start: both GPUs hold it, and the pool views (/pool, `gpupool top`) show it on both
        assert held_by(svc.ledger, uid) == {GpuRef("gpu-0000", 0), GpuRef("gpu-0001", 0)}
        from gpupool.commands.pool_views import snapshot_of

        shown = {(n.name, g.index): [(x.namespace, x.pod, x.memory_mib) for x in g.grants]
                 for n in snapshot_of(svc).nodes for g in n.gpus}
        assert shown[("gpu-0000", 0)] == shown[("gpu-0001", 0)] == [("team", "c-u1", 4096)]
        assert shown[("gpu-0002", 0)] == []
        await cluster.patch_object(CONFIGMAPS, MOVES_CONFIGMAP, {"data": {uid: move.advanced("moved").to_json()}},
                                   namespace="gp-system")
        for _ in range(200):
            if held_by(svc.ledger, uid) == {GpuRef("gpu-0001", 0)}:
                break
            await asyncio.sleep(0.01)
        assert held_by(svc.ledger, uid) == {GpuRef("gpu-0001", 0)}
        await cluster.delete_object(CONFIGMAPS, MOVES_CONFIGMAP, namespace="gp-system")
        for _ in range(200):
            if held_by(svc.ledger, uid) == {GpuRef("gpu-0000", 0)}:
                break
            await asyncio.sleep(0.01)
        assert held_by(svc.ledger, uid) == {GpuRef("gpu-0000", 0)}
        # the debug view's recomputation counts the same moves
        assert (await svc.debug_ledger())["diff"]["different"] == []
    finally:
        await svc.stop()
