"""The scheduler's background defragmenter (gpupool.scheduler.defrag): off by default, a round only above its
threshold and within its budget, its moves written as any move with an Event, one round at a time, on the
service's leader only."""

from __future__ import annotations

from gpupool.api.moves import MOVES_CONFIGMAP, GpuRef
from gpupool.cluster.memory import MemoryCluster
from gpupool.cluster.port import CONFIGMAPS, RESOURCE_CLAIMS, Obj
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.defrag import Defragmenter
from gpupool.scheduler.moves import MoveTargets, server_state
from gpupool.scheduler.service import ExtenderService
from tests.commands.remote_cluster import remote_cluster
from tests.scheduler.test_moves import NODES, NS, a_claim, moves_in

NOW = 1_800_000_000.0
# GPU servers (tests.commands.remote_cluster): both GPUs of gpu-0000 and gpu-0001, GPU 0 of gpu-0002 (its GPU 1
# is tainted). r1 (remote, 4096 MiB, 25 %) on gpu-0000/g0, r2 (remote, 8192 MiB, 50 %) on gpu-0001/g0, h1 (hook,
# 12288 MiB, 75 %) on gpu-0002/g0. Free on the servers: 750 + 1000 + 500 + 1000 + 250 = 3500 milli, 2000 of it
# on whole GPUs: fragmentation 1500 / 3500 = 0.43.


def claims() -> list[Obj]:
    return [a_claim("r1", "gpu-0000", 0, 4096, 25), a_claim("r2", "gpu-0001", 0, 8192, 50),
            a_claim("h1", "gpu-0002", 0, 12288, 75, "hook")]


async def scene(**config: float) -> tuple[MemoryCluster, MoveTargets]:
    cluster = await remote_cluster()
    await cluster.create_object(CONFIGMAPS, {"metadata": {"name": MOVES_CONFIGMAP, "namespace": NS}, "data": {}})
    t = MoveTargets.of_objects(cluster, NODES, [], claims(), {},
                               SchedulerConfig(leader_elect=False, gpupool_namespace=NS, **config),  # type: ignore[arg-type]
                               clock=lambda: NOW)
    return cluster, t


async def test_a_round_frees_the_gpu_whose_share_fits_a_fuller_server_elsewhere() -> None:
    """Sources: r1's GPU (250 used) and r2's (500); h1 (hook) never moves. r2 (0.5) fits no hole of a fuller
    GPU (only gpu-0002/g0 is fuller: 0.25 free). r1 (0.25) goes off gpu-0000 to the fuller GPU left with the
    least free: gpu-0002/g0 (0.25 free, 4096 MiB: none left) before gpu-0001/g0 (0.25 left)."""
    cluster, t = await scene()
    assert await Defragmenter(t.h, lambda: True, 0, threshold=0.4).round_once() is None  # off
    assert await Defragmenter(t.h, lambda: True, 4, threshold=0.5).round_once() is None  # 0.43: below
    assert await Defragmenter(t.h, lambda: True, 4, threshold=0.4, max_gib=3.0).round_once() is None  # 4 GiB
    defrag = Defragmenter(t.h, lambda: True, 4, threshold=0.4, deadline_s=60)
    plan = await defrag.round_once()
    assert plan is not None
    assert [(m.key, m.source, m.target) for m in plan.moves] == [("uid-r1", ("gpu-0000", 0), ("gpu-0002", 0))]
    assert plan.freed == (("gpu-0000", 0),) and plan.memory_mib == 4096
    [(uid, move)] = (await moves_in(cluster)).items()
    assert (uid, move.claim, move.source, move.target, move.state) == \
        ("uid-r1", "team/r1", GpuRef("gpu-0000", 0), GpuRef("gpu-0002", 0), "requested")
    assert (move.requested_at, move.deadline) == ("2027-01-15T08:00:00Z", "2027-01-15T08:01:00Z")
    [event] = [e for e in cluster.events if e["reason"] == "Defragmenting"]
    assert event["involvedObject"]["kind"] == "ResourceClaim" and event["involvedObject"]["name"] == "r1"
    assert event["type"] == "Normal" and event["message"] == (
        "gpupool: moving the share gpu-0000/gpu-0 -> gpu-0002/gpu-0 to free whole GPUs (1 move(s), 4.00 GiB this "
        "round)")
    assert (defrag.started, defrag.rounds) == (1, 1)
    # while its move is unfinished (the ledger follows the ConfigMap) no other round is planned
    t.ledger.replace_moves(await moves_in(cluster))
    assert await defrag.round_once() is None
    assert defrag.started == 1


async def test_no_moves_configmap_no_round() -> None:
    """The scheduler may not create the moves ConfigMap: without it the round writes nothing and is not
    counted, and the next one plans again."""
    cluster, t = await scene()
    await cluster.delete_object(CONFIGMAPS, MOVES_CONFIGMAP, namespace=NS)
    defrag = Defragmenter(t.h, lambda: True, 4, threshold=0.4)
    assert await defrag.round_once() is None
    assert (defrag.started, defrag.rounds, defrag.in_flight) == (0, 0, set())
    assert not [e for e in cluster.events if e["reason"] == "Defragmenting"]


async def test_only_gpu_servers_take_a_share() -> None:
    """Without gpu-0002's server (its slice gone), r1's only fuller target off its node is gpu-0001/g0."""
    cluster, t = await scene()
    servers = {"gpu-0000": {0, 1}, "gpu-0001": {0, 1}}
    state, usable = server_state(t.ledger.state, servers)
    assert not usable[state.index["gpu-0002"]].any() and usable[state.index["gpu-0000"]].all()
    plan = Defragmenter(t.h, lambda: True, 4, threshold=0.0).plan(servers)
    assert plan is not None and [m.target for m in plan.moves] == [("gpu-0001", 0)]
    assert t.ledger.state.gpu_healthy[t.ledger.state.index["gpu-0002"], 0]  # the ledger itself is not changed


async def test_the_service_runs_it_on_the_leader_only_and_not_by_default() -> None:
    assert SchedulerConfig().defrag_moves == 0
    cluster = await remote_cluster()
    for c in claims():
        await cluster.create_object(RESOURCE_CLAIMS, c)
    off = ExtenderService(cluster, SchedulerConfig(leader_elect=False, gpupool_namespace=NS))
    await off.start()
    assert off.defrag.max_moves == 0 and not off.defrag.running
    await off.stop()
    on = ExtenderService(cluster, SchedulerConfig(leader_elect=True, gpupool_namespace=NS, defrag_moves=3,
                                                  defrag_threshold=0.2, defrag_interval_s=30, defrag_gib=8))
    d = on.defrag
    assert (d.max_moves, d.threshold, d.interval_s, d.max_gib) == (3, 0.2, 30, 8)
    assert d.ready() is False  # not leading: its loop skips every round
