"""gpupool.scheduler.moves: the target of a remote share's move is the framework's choice (the same as for the
equivalent pending claim on the same state; never a GPU it would over-commit), and moves past their deadline
are cancelled back to their source, with an Event, by the leader (MoveDeadlines, an injectable clock)."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.api.dra import DRIVER, REMOTE_ISOLATION
from gpupool.api.moves import MOVES_CONFIGMAP, GpuRef, Move, new_move, read_moves
from gpupool.cluster.memory import MemoryCluster
from gpupool.cluster.port import CONFIGMAPS, RESOURCE_CLAIMS, Obj
from gpupool.demo.embedded import node_objects
from gpupool.scheduler.config import SchedulerConfig
from gpupool.scheduler.framework.cycle import ClaimInCycle, Phase
from gpupool.scheduler.moves import (
    MakeRoom,
    MoveTargets,
    MovingShare,
    cancel_moves,
    movable_shares,
    move_ask,
    past_deadline,
    plan_room,
)
from gpupool.scheduler.service import ExtenderService
from tests.commands.remote_cluster import claim
from tests.scheduler.conftest import small_scenario

# gpu-0000..2, 2 GPUs of 16384 MiB each; cpu-0, a node without GPUs where the remote clients run
NODES = [*node_objects(small_scenario(nodes=3, gpus=2)),
         {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu-0"}}]
SERVERS = {"gpu-0001": [0, 1], "gpu-0002": [0, 1]}  # the candidates: every GPU but those of the source node
NS = "gp-system"


def a_claim(name: str, node: str, gpu: int, memory_mib: int, cores: int, isolation: str = "remote") -> Obj:
    c = claim(name, node, gpu, memory_mib, cores, isolation)
    c["metadata"]["uid"] = f"uid-{name}"
    return c


def a_pod(name: str, claims: list[str], node: str | None = "cpu-0", policy: str | None = None) -> Obj:
    pod: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}",
                     "annotations": {"gpupool.io/policy": policy} if policy else {}},
        "spec": {"containers": [{"name": "c", "image": "x"}],
                 "resourceClaims": [{"name": f"r{i}", "resourceClaimName": c} for i, c in enumerate(claims)]},
        "status": {"phase": "Running" if node else "Pending"}}
    if node:
        pod["spec"]["nodeName"] = node
    return pod


def targets(claims: list[Obj], pods: list[Obj], moves: dict[str, Move] | None = None) -> MoveTargets:
    return MoveTargets.of_objects(MemoryCluster(), NODES, pods, claims, moves or {})


def test_a_node_s_first_fitting_gpu_under_firstfit_hand_computed() -> None:
    """c1 (4096 MiB, 25 %) on gpu-0000/gpu-0 moves. gpu-0001/gpu-0 holds 14336 MiB: 2048 free; gpu-0001/gpu-1
    8192 MiB at 60 %: 8192 MiB and 40 % free; gpu-0002 is empty. firstfit: every node scores 0, the first node
    in the ledger's order with a GPU that fits wins (gpu-0001), then its first GPU that fits: gpu-1."""
    claims = [a_claim("c1", "gpu-0000", 0, 4096, 25), a_claim("f1", "gpu-0001", 0, 14336, 10, "hook"),
              a_claim("f2", "gpu-0001", 1, 8192, 60, "hook")]
    pod = a_pod("p1", ["c1"], policy="firstfit")
    t = targets(claims, [pod])
    share = MovingShare(claims[0], pod, GpuRef("gpu-0000", 0))
    assert t.choose(share, SERVERS) == GpuRef("gpu-0001", 1)
    # only gpu-0001/gpu-0 offered: 2048 MiB free, the share needs 4096 there: none, and why, in words
    why = t.choose(share, {"gpu-0001": [0]})
    assert isinstance(why, str) and why.startswith(
        "gpu-0001/gpu-0 has 90 % compute and 2048 MiB free, the share needs 25 % and 4096 MiB: "), why
    # the GPU it is served from is never a target, nor anything when it is all that is offered
    assert t.choose(share, {"gpu-0000": [0]}) == "no other GPU server"


def test_a_choice_taken_counts_for_the_next_question() -> None:
    """Two 10240 MiB shares leave gpu-0000: the first takes gpu-0001/gpu-0 (firstfit), and is counted there, so
    the second (6144 MiB free there now) takes gpu-0001/gpu-1."""
    claims = [a_claim("c1", "gpu-0000", 0, 10240, 20), a_claim("c2", "gpu-0000", 1, 10240, 20)]
    pods = [a_pod("p1", ["c1"], policy="firstfit"), a_pod("p2", ["c2"], policy="firstfit")]
    t = targets(claims, pods)
    first = MovingShare(claims[0], pods[0], GpuRef("gpu-0000", 0))
    second = MovingShare(claims[1], pods[1], GpuRef("gpu-0000", 1))
    assert t.choose(first, SERVERS) == GpuRef("gpu-0001", 0)
    assert t.take(first, GpuRef("gpu-0001", 0)) is None
    assert t.choose(second, SERVERS) == GpuRef("gpu-0001", 1)
    assert t.take(first, GpuRef("gpu-0002", 0)) is not None  # only the last choice can be taken


def test_a_finished_pod_s_share_is_not_asked_about() -> None:
    claims = [a_claim("c1", "gpu-0000", 0, 4096, 25)]
    pod = a_pod("p1", ["c1"])
    pod["status"]["phase"] = "Succeeded"
    assert targets(claims, [pod]).choose(MovingShare(claims[0], pod, GpuRef("gpu-0000", 0)), SERVERS) == \
        "pod team/p1 has finished (Succeeded)"
    hooked = a_claim("h", "gpu-0000", 0, 4096, 25, "hook")
    assert "is not a one-GPU share of isolation remote" in str(
        targets([hooked], []).choose(MovingShare(hooked, None, GpuRef("gpu-0000", 0)), SERVERS))


def test_the_ask_is_read_back_from_the_allocation() -> None:
    ask, config = move_ask(a_claim("c1", "gpu-0000", 0, 4096, 25))
    assert (ask.request, ask.device_class, ask.count, ask.memory_mib, ask.cores) == ("gpu", DRIVER, 1, 4096, 25)
    assert config == ({"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": {"isolation": "remote"}}},)


occupancy = st.lists(st.tuples(st.integers(0, 16384), st.integers(0, 100)), min_size=4, max_size=4)


@settings(max_examples=40, deadline=None)
@given(used=occupancy, memory=st.integers(1, 16384), cores=st.integers(0, 100),
       policy=st.sampled_from(["gpupool", "firstfit", "bestfit", "packing"]))
def test_the_target_is_the_frameworks_choice_for_the_equivalent_claim_and_never_over_commits(
        used: list[tuple[int, int]], memory: int, cores: int, policy: str) -> None:
    """Random use of the four candidate GPUs (hook claims); the share moving off gpu-0000 gets the GPU that a
    claim cycle of the claim profile places the same ask on (its pod pending, on cpu-0), on the same state;
    and a GPU without the room is never chosen."""
    gpus = [("gpu-0001", 0), ("gpu-0001", 1), ("gpu-0002", 0), ("gpu-0002", 1)]
    fill = [a_claim(f"f{k}", n, j, m, c, "hook") for k, ((n, j), (m, c)) in enumerate(zip(gpus, used, strict=True))
            if m or c]
    moving = a_claim("c1", "gpu-0000", 0, memory, cores)
    pod = a_pod("p1", ["c1"], policy=policy)
    t = targets([moving, *fill], [pod])
    chosen = t.choose(MovingShare(moving, pod, GpuRef("gpu-0000", 0)), SERVERS)

    # never over-committed: the target had the room (a share asks at least 1 milli-GPU)
    room = [((n, j), 16384 - m, 1000 - c * 10) for (n, j), (m, c) in zip(gpus, used, strict=True)]
    fits = [GpuRef(n, j) for (n, j), mem, milli in room if mem >= memory and milli >= max(1, cores * 10)]
    if isinstance(chosen, GpuRef):
        assert chosen in fits
    else:
        assert not fits, chosen

    # the equivalent claim, pending, placed by the claim profile's own cycle on the same state
    twin = a_claim("c2", "gpu-0000", 0, memory, cores)
    ask, config = move_ask(twin)
    pending = a_pod("p2", ["c2"], node=None, policy=policy)
    cycle = t.fw.cycle(pending, Phase.CLAIM)
    cycle.claim = ClaimInCycle("uid-c2", "team/c2", ask, REMOTE_ISOLATION, config,
                               {n: frozenset(idx) for n, idx in SERVERS.items()}, frozenset({"cpu-0"}))
    status, node = asyncio.run(t.fw.place(cycle, sorted(SERVERS)))
    if node is None or cycle.allocation is None:
        assert isinstance(chosen, str), (chosen, status)
    else:
        assert chosen == GpuRef(node, cycle.allocation.grants[0].index)


# --- the bound ------------------------------------------------------------------------------------------------


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def moves_in(cluster: MemoryCluster) -> dict[str, Move]:
    return read_moves(await cluster.get_object(CONFIGMAPS, MOVES_CONFIGMAP, NS))


async def deadline_scene(clock: Clock) -> tuple[MemoryCluster, ExtenderService]:
    """c1's share moving gpu-0000/gpu-0 -> gpu-0001/gpu-0, `ready` since 1000 s with a 60 s deadline (the
    target counted from `ready` on); another move (c9) with its deadline far off."""
    cluster = MemoryCluster()
    for n in NODES:
        await cluster.create_node(n)
    c1 = await cluster.create_object(RESOURCE_CLAIMS, claim("c1", "gpu-0000", 0, 4096, 25))
    uid = str(c1["metadata"]["uid"])
    ready = new_move("team/c1", GpuRef("gpu-0000", 0), GpuRef("gpu-0001", 0), 1000.0, deadline_s=60).advanced("ready")
    later = new_move("team/c9", GpuRef("gpu-0000", 1), GpuRef("gpu-0002", 0), 1000.0, deadline_s=6000)
    await cluster.create_object(CONFIGMAPS, {"metadata": {"name": MOVES_CONFIGMAP, "namespace": NS},
                                             "data": {uid: ready.to_json(), "uid-c9": later.to_json()}})
    service = ExtenderService(cluster, SchedulerConfig(leader_elect=False, gpupool_namespace=NS), clock=clock)
    await service.start()
    return cluster, service


async def test_a_move_past_its_deadline_is_cancelled_and_counted_back_at_its_source() -> None:
    clock = Clock(1059.0)
    cluster, service = await deadline_scene(clock)
    deadlines, ledger = service.deadlines, service.ledger
    uid = next(u for u, m in ledger.moves.items() if m.claim == "team/c1")
    target = ledger.state.index["gpu-0001"]
    # ready: counted on both GPUs, 4096 MiB on gpu-0001/gpu-0 too
    assert int(ledger.state.gpu_mem_free[target, 0]) == 16384 - 4096
    assert await deadlines.check_once() == {}  # 1059 s: one second before its deadline
    clock.now = 1060.0
    done = await deadlines.check_once()
    assert list(done) == [uid]
    move = (await moves_in(cluster))[uid]
    assert (move.state, move.reason) == ("failed", "cancelled: still ready at its deadline 1970-01-01T00:17:40Z (the "
                                         "agent of gpu-0000 to move the share's clients to gpu-0001/gpu-0); the share "
                                         "is served from gpu-0000/gpu-0 again")
    assert (await moves_in(cluster))["uid-c9"].state == "requested"  # its deadline is far off
    # the watch brings the cancelled entry: the target is no longer counted, the source still is
    for _ in range(50):
        if ledger.moves[uid].state == "failed":
            break
        await asyncio.sleep(0.01)
    assert int(ledger.state.gpu_mem_free[target, 0]) == 16384
    assert int(ledger.state.gpu_mem_free[ledger.state.index["gpu-0000"], 0]) == 16384 - 4096
    [event] = [e for e in cluster.events if e["reason"] == "MoveCancelled"]
    assert event["involvedObject"]["kind"] == "ResourceClaim" and event["involvedObject"]["name"] == "c1"
    assert event["type"] == "Warning" and "cancelled: still ready at its deadline" in event["message"]
    assert deadlines.cancelled == 1
    assert await deadlines.check_once() == {}  # finished now: nothing more
    await service.stop()


def test_past_deadline_bounds_entries_without_one_from_their_request() -> None:
    old = Move("team/c", GpuRef("a", 0), GpuRef("b", 0), "requested", requested_at="1970-01-01T00:10:00Z")
    assert past_deadline({"u": old}, 600 + 599, default_s=600) == {}
    assert list(past_deadline({"u": old}, 1200, default_s=600)) == ["u"]
    assert past_deadline({"u": old.advanced("ready").advanced("moved")}, 10**9) == {}


async def test_cancel_moves_writes_only_unfinished_entries_and_reads_again_on_conflict() -> None:
    cluster = MemoryCluster()
    ready = Move("team/c1", GpuRef("a", 0), GpuRef("b", 0), "ready")
    moved = Move("team/c2", GpuRef("a", 0), GpuRef("b", 0), "moved")
    await cluster.create_object(CONFIGMAPS, {"metadata": {"name": MOVES_CONFIGMAP, "namespace": NS},
                                             "data": {"u1": ready.to_json(), "u2": moved.to_json()}})
    real = cluster.patch_object
    calls = 0

    async def racing(*args: Any, **kwargs: Any) -> Obj:
        nonlocal calls
        calls += 1
        if calls == 1:  # an agent's write lands between the read and the write
            await real(CONFIGMAPS, MOVES_CONFIGMAP, {"data": {"u3": ready.to_json()}}, namespace=NS)
        return await real(*args, **kwargs)

    cluster.patch_object = racing  # type: ignore[method-assign]
    done = await cancel_moves(cluster, NS, lambda current: {u: "test" for u in current})
    assert sorted(done) == ["u1", "u3"] and calls == 2  # the conflict, then one write of both
    moves = await moves_in(cluster)
    assert moves["u1"].reason == "cancelled: test" and moves["u2"].state == "moved"
    assert await cancel_moves(MemoryCluster(), NS, lambda current: {"u1": "x"}) == {}  # no ConfigMap: nothing


# --- making room --------------------------------------------------------------------------------------------

# Servers on gpu-0000 and gpu-0001 only (gpu-0002's GPUs have none). gpu-0000/g0: remote r1 4096 MiB, 25 %;
# gpu-0000/g1: hook h1 12288 MiB, 75 %; gpu-0001/g0: hook h2 10240 MiB, 60 %; gpu-0001/g1: remote r2 8192 MiB,
# 50 %. Free: 12288 / 75 %, 4096 / 25 %, 6144 / 40 %, 8192 / 50 % (gpu-0002: 16384 each, no server).
ROOM_SERVERS = {"gpu-0000": frozenset({0, 1}), "gpu-0001": frozenset({0, 1})}


def room_claims() -> list[Obj]:
    return [a_claim("r1", "gpu-0000", 0, 4096, 25), a_claim("h1", "gpu-0000", 1, 12288, 75, "hook"),
            a_claim("h2", "gpu-0001", 0, 10240, 60, "hook"), a_claim("r2", "gpu-0001", 1, 8192, 50)]


def pending_cycle(t: MoveTargets, memory: int = 14336, cores: int = 30) -> Any:
    ask, config = move_ask(a_claim("p", "gpu-0000", 0, memory, cores))
    cycle = t.fw.cycle(a_pod("pp", ["p"], node=None), Phase.CLAIM)
    cycle.claim = ClaimInCycle("uid-p", "team/p", ask, REMOTE_ISOLATION, config, ROOM_SERVERS, frozenset({"cpu-0"}))
    return cycle


def test_the_cheapest_room_moves_the_smaller_remote_share_off_its_node() -> None:
    """A 14336 MiB, 30 % remote share fits no server GPU. One move makes room: r1 (4096 MiB) off gpu-0000/g0,
    or r2 (8192) off gpu-0001/g1; r1 is cheaper. Its targets off gpu-0000 (hook claims never move; gpu-0002
    has no server): gpu-0001/g0 (40 % free, 15 % left after it) and gpu-0001/g1 (50 %, 25 % left): the tighter,
    g0. (gpu-0000/g1 would fit it exactly, but it is the node it leaves.)"""
    t = targets(room_claims(), [])
    assert sorted(movable_shares(t.ledger)) == ["uid-r1", "uid-r2"]  # remote claims only
    cycle = pending_cycle(t)
    status, node = asyncio.run(t.fw.place(cycle, sorted(ROOM_SERVERS)))
    assert node is None  # fits nowhere now
    plan = plan_room(t.ledger, cycle.request, ROOM_SERVERS, 1)
    assert plan is not None
    assert [(m.key, m.source, m.target) for m in plan.moves] == [("uid-r1", ("gpu-0000", 0), ("gpu-0001", 0))]
    assert plan.memory_mib == 4096 and plan.allocation.node == "gpu-0000"
    assert [g.index for g in plan.allocation.grants] == [0]
    assert plan_room(t.ledger, cycle.request, ROOM_SERVERS, 0) is None  # no moves allowed: no room
    # a whole card (16384 MiB, 100 %): gpu-0000/g0 and gpu-0001/g1 are whole once their one remote share goes;
    # r1 is the cheaper move again
    big = pending_cycle(t, memory=16384, cores=100)
    asyncio.run(t.fw.place(big, sorted(ROOM_SERVERS)))
    full = plan_room(t.ledger, big.request, ROOM_SERVERS, 1)
    assert full is not None and [m.key for m in full.moves] == ["uid-r1"]


async def test_make_room_starts_the_moves_once_and_says_so() -> None:
    cluster = MemoryCluster()
    await cluster.create_object(CONFIGMAPS, {"metadata": {"name": MOVES_CONFIGMAP, "namespace": NS}, "data": {}})
    t = MoveTargets.of_objects(cluster, NODES, [], room_claims(), {},
                               SchedulerConfig(leader_elect=False, gpupool_namespace=NS, make_room_moves=1),
                               clock=lambda: 1_800_000_000.0)
    cycle = pending_cycle(t)
    status, node = await t.fw.place(cycle, sorted(ROOM_SERVERS))
    assert node is None
    assert await MakeRoom(t.h, 0).make_room(cycle) is None  # off
    room = MakeRoom(t.h, 1)
    said = await room.make_room(cycle)
    assert said == ("moving 1 remote share(s) (4.00 GiB) to make room for claim team/p: claim team/r1 "
                    "gpu-0000/gpu-0 -> gpu-0001/gpu-0")
    [(uid, move)] = (await moves_in(cluster)).items()
    assert (uid, move.claim, move.source, move.target, move.state) == \
        ("uid-r1", "team/r1", GpuRef("gpu-0000", 0), GpuRef("gpu-0001", 0), "requested")
    assert (move.requested_at, move.deadline) == ("2027-01-15T08:00:00Z", "2027-01-15T08:10:00Z")
    [event] = [e for e in cluster.events if e["reason"] == "MakingRoom"]
    assert event["involvedObject"]["name"] == "pp" and event["message"] == f"gpupool: {said}"
    # while the move is unfinished (the ledger follows the ConfigMap), no other plan: it waits
    t.ledger.replace_moves(await moves_in(cluster))
    assert await room.make_room(cycle) == "1 move(s) the scheduler started to make room are under way, 1 of them " \
                                          "for this claim"
    assert room.started == 1


def test_making_room_is_off_by_default() -> None:
    assert SchedulerConfig().make_room_moves == 0
