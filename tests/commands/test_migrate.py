"""`gpupool migrate`: the target GPU (the scheduler's framework chooses it: gpupool.scheduler.moves, tested
there against a claim's own cycle) and why none, the entry written with its deadline, each bad input's message
and exit status, following the move to its end, and `--cancel` (against a MemoryCluster:
tests/commands/remote_cluster.py).

The pods ask for the policy firstfit (`gpupool.io/policy`), so every target is computed by hand: the remote
tiers are all "any" (the pods run on cpu-0, a GPU-less node; no zones), every node scores 0, so the first
node in the ledger's order that fits wins (gpu-0000 < gpu-0001 < gpu-0002), and the first GPU of it that
fits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpupool.api.moves import MOVES_CONFIGMAP, GpuRef, Move
from gpupool.cli import main
from gpupool.cluster.memory import MemoryCluster
from gpupool.cluster.port import CONFIGMAPS
from gpupool.commands import migrate as migrate_module
from gpupool.commands.migrate import Refused, cancel_move, migrate_pod
from tests.commands.remote_cluster import NS, Clock, add_claim, add_pod, moves_of, remote_cluster, set_move

EPOCH = 1_800_000_000.0  # the wall clock of these tests at their start: 2027-01-15T08:00:00Z
FIRSTFIT = {"gpupool.io/policy": "firstfit"}


async def scene() -> tuple[MemoryCluster, str]:
    """c1 (remote, 4 GiB / 25 % on gpu-0000/gpu-0) used by pod p1 on cpu-0 (firstfit); gpu-0001's GPUs have
    14336 MiB / 90 % and 8192 MiB / 50 % free, gpu-0002/gpu-0 2048 MiB / 80 % (gpu-0002/gpu-1 is tainted)."""
    cluster = await remote_cluster()
    uid = await add_claim(cluster, "c1", "gpu-0000", 0, 4096, 25)
    await add_pod(cluster, "p1", "cpu-0", ["c1"])
    await cluster.patch_pod_annotations("team", "p1", FIRSTFIT)
    await add_claim(cluster, "f1", "gpu-0001", 0, 2048, 10, isolation="hook")
    await add_claim(cluster, "f2", "gpu-0001", 1, 8192, 50, isolation="hook")
    await add_claim(cluster, "f3", "gpu-0002", 0, 14336, 20, isolation="hook")
    return cluster, uid


async def run(cluster: MemoryCluster, to: str, pod: str = "p1", wait_s: float = 0,
              clock: Clock | None = None) -> tuple[int, list[str]]:
    lines: list[str] = []
    clock = clock or Clock()
    code = await migrate_pod(cluster, "team", pod, to, NS, wait_s, lines.append, clock.sleep, clock,
                             wall=lambda: EPOCH + clock.now)
    return code, lines


async def test_to_a_node_takes_the_gpu_the_scheduler_chooses_there() -> None:
    cluster, uid = await scene()
    code, lines = await run(cluster, "gpu-0001")
    # both GPUs of gpu-0001 have room (25 % and 4096 MiB of 90 % / 14336 and 50 % / 8192): firstfit's first, gpu-0
    assert code == 0
    assert lines == ["claim team/c1: move requested, gpu-0000/gpu-0 -> gpu-0001/gpu-0"]
    [(key, move)] = (await moves_of(cluster)).items()
    assert key == uid
    assert (move.claim, move.source, move.target, move.state, move.reason) == \
        ("team/c1", GpuRef("gpu-0000", 0), GpuRef("gpu-0001", 0), "requested", "")
    assert (move.requested_at, move.deadline) == ("2027-01-15T08:00:00Z", "2027-01-15T08:10:00Z")  # + 600 s
    cm = await cluster.get_object(CONFIGMAPS, MOVES_CONFIGMAP, NS)
    assert cm["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "gpupool"}


async def test_a_named_gpu_it_fits_on_is_taken_as_named() -> None:
    cluster, uid = await scene()
    assert (await run(cluster, "gpu-0001/gpu-1"))[0] == 0
    assert (await moves_of(cluster))[uid].target == GpuRef("gpu-0001", 1)
    cluster, uid = await scene()
    assert (await run(cluster, "gpu-0000/1"))[0] == 0  # NODE/<index>, on the share's own node too
    assert (await moves_of(cluster))[uid].target == GpuRef("gpu-0000", 1)


async def test_a_named_gpu_without_room_says_what_is_free() -> None:
    cluster, _ = await scene()
    with pytest.raises(Refused) as e:
        await run(cluster, "gpu-0002/gpu-0")
    assert e.value.code == 1
    assert e.value.message.startswith(
        "the share of claim team/c1 does not fit on gpu-0002/gpu-0: gpu-0002/gpu-0 has 80 % compute and 2048 MiB free, "
        "the share needs 25 % and 4096 MiB: "), e.value.message
    with pytest.raises(Refused) as e:
        await run(cluster, "gpu-0002")  # its one untainted GPU is that one
    assert e.value.code == 1 and e.value.message.startswith(
        "the share of claim team/c1 fits on no GPU of gpu-0002: gpu-0002/gpu-0 has 80 % compute and 2048 MiB free, "
        "the share needs 25 % and 4096 MiB: "), e.value.message
    assert await moves_of(cluster) == {}


@pytest.mark.parametrize(("pod", "to", "message"), [
    ("nope", "gpu-0001", "pod team/nope not found"),
    ("plain", "gpu-0001", "pod team/plain uses no ResourceClaim"),
    ("hooked", "gpu-0001", "pod team/hooked: none of its claims is allocated a remote share"),
    ("p1", "cpu-0", "--to: node cpu-0 is not a gpupool GPU node"),
    ("p1", "gpu-9", "--to: node gpu-9 is not a gpupool GPU node"),
    ("p1", "gpu-0002/gpu-1", "--to: gpu-0002/gpu-1 is not a GPU with a GPU server"),
    ("p1", "gpu-0001/gpu-7", "--to: gpu-0001/gpu-7 is not a GPU with a GPU server"),
    ("p1", "gpu-0001/x", "--to gpu-0001/x: 'gpu-0001/x' is not NODE/gpu-<index>"),
    ("p1", "gpu-0000/gpu-0", "the share of claim team/c1 is already served from gpu-0000/gpu-0"),
])
async def test_bad_input_exits_2_with_a_clear_message(pod: str, to: str, message: str) -> None:
    cluster, _ = await scene()
    await add_pod(cluster, "plain", "cpu-0", [])
    await add_claim(cluster, "h", "gpu-0001", 0, 1024, 5, isolation="hook")
    await add_pod(cluster, "hooked", "gpu-0001", ["h"])
    with pytest.raises(Refused) as e:
        await run(cluster, to, pod=pod)
    assert e.value.code == 2
    assert e.value.message.startswith(message) or message in e.value.message, e.value.message
    assert await moves_of(cluster) == {}


async def test_an_unfinished_move_is_not_replaced_and_a_finished_one_goes_on_from_its_end() -> None:
    cluster, uid = await scene()
    await set_move(cluster, uid, Move("team/c1", GpuRef("gpu-0000", 0), GpuRef("gpu-0001", 1), "ready"))
    with pytest.raises(Refused) as e:
        await run(cluster, "gpu-0001")
    assert e.value.code == 2 and e.value.message.startswith(
        "claim team/c1: a move of its share is still ready (gpu-0000/gpu-0 -> gpu-0001/gpu-1): the agent of gpu-0000")
    # moved: served from gpu-0001/gpu-1 now, so the next move starts there (and may go back)
    await set_move(cluster, uid, Move("team/c1", GpuRef("gpu-0000", 0), GpuRef("gpu-0001", 1), "moved"))
    assert (await run(cluster, "gpu-0000"))[0] == 0
    move = (await moves_of(cluster))[uid]
    # gpu-0000/gpu-1 (16384 free) over gpu-0000/gpu-0 (16384 free too, the share no longer counts there): name order
    assert (move.source, move.target, move.state) == (GpuRef("gpu-0001", 1), GpuRef("gpu-0000", 0), "requested")


async def test_waiting_prints_each_state_and_exits_0_when_moved() -> None:
    cluster, uid = await scene()
    clock = Clock()
    target = GpuRef("gpu-0001", 0)

    async def ready() -> None:
        await set_move(cluster, uid, Move("team/c1", GpuRef("gpu-0000", 0), target, "ready"))

    async def moved() -> None:
        await set_move(cluster, uid, Move("team/c1", GpuRef("gpu-0000", 0), target, "moved"))

    clock.on_sleep = [ready, moved]
    code, lines = await run(cluster, "gpu-0001", wait_s=30, clock=clock)
    assert code == 0
    assert lines == ["claim team/c1: move requested, gpu-0000/gpu-0 -> gpu-0001/gpu-0", "claim team/c1: requested",
                     "claim team/c1: ready", "claim team/c1: moved", "claim team/c1: served from gpu-0001/gpu-0"]


async def test_a_failed_move_exits_1_with_its_reason() -> None:
    cluster, uid = await scene()
    clock = Clock()

    async def failed() -> None:
        await set_move(cluster, uid, Move("team/c1", GpuRef("gpu-0000", 0), GpuRef("gpu-0001", 0), "failed",
                                          "client 4242 did not\x1b[31m move"))

    clock.on_sleep = [failed]
    code, lines = await run(cluster, "gpu-0001", wait_s=30, clock=clock)
    assert code == 1
    assert lines[-1] == "claim team/c1: the move failed: client 4242 did not\\x1b[31m move"


async def test_a_timeout_exits_1_and_says_the_entry_stays() -> None:
    cluster, uid = await scene()
    clock = Clock()
    code, lines = await run(cluster, "gpu-0001", wait_s=3, clock=clock)
    assert code == 1 and clock.now >= 3
    assert lines[-1] == ("claim team/c1: still requested after 3 s; the entry stays until its deadline "
                         "2027-01-15T08:10:00Z (then it is cancelled), waiting for the agent of gpu-0001 to prepare "
                         "the share on gpu-0001/gpu-0")
    assert (await moves_of(cluster))[uid].state == "requested"


async def test_at_max_moves_only_entries_of_gone_claims_make_room(monkeypatch: pytest.MonkeyPatch) -> None:
    """A live claim's entry says where its share is served from, finished or not: it is never dropped, even
    the oldest; the oldest entry of a claim that no longer exists goes first. Full of live claims' entries,
    the command refuses."""
    cluster, uid = await scene()
    monkeypatch.setattr(migrate_module, "MAX_MOVES", 3)
    older = Move("team/x", GpuRef("gpu-0000", 1), GpuRef("gpu-0001", 1), "failed", "", "2019-01-01T00:00:00Z")
    done = Move("team/x", GpuRef("gpu-0000", 1), GpuRef("gpu-0001", 1), "moved", "", "2020-01-01T00:00:00Z")
    later = Move("team/y", GpuRef("gpu-0000", 1), GpuRef("gpu-0001", 1), "requested", "", "2021-01-01T00:00:00Z")
    f1 = str((await cluster.get_object(migrate_module.RESOURCE_CLAIMS, "f1", "team"))["metadata"]["uid"])
    await set_move(cluster, f1, older)  # a live claim's, and the oldest
    await set_move(cluster, "gone-claim", done)  # claims that no longer exist
    await set_move(cluster, "gone-later", later)
    assert (await run(cluster, "gpu-0001"))[0] == 0
    assert sorted(await moves_of(cluster)) == sorted([uid, f1, "gone-later"])
    monkeypatch.setattr(migrate_module, "MAX_MOVES", 2)
    await set_move(cluster, uid, (await moves_of(cluster))[uid].advanced("failed", "test"))
    with pytest.raises(Refused) as e:
        await run(cluster, "gpu-0001")
    assert e.value.code == 1
    assert e.value.message == "gpupool-remote-moves holds 2 moves of claims that still exist; it cannot take more"


async def test_a_conflicting_writer_is_outrun() -> None:
    """An agent writes between the command's read and its write: the write conflicts, is read again, and keeps
    the agent's change."""
    cluster, uid = await scene()
    await set_move(cluster, "other", Move("team/y", GpuRef("gpu-0000", 1), GpuRef("gpu-0001", 1)))
    real_patch = cluster.patch_object
    calls = 0

    async def racing_patch(*args: object, **kwargs: object) -> object:
        nonlocal calls
        calls += 1
        if calls == 1:  # the agent's write lands first
            await set_move(cluster, "other", Move("team/y", GpuRef("gpu-0000", 1), GpuRef("gpu-0001", 1), "ready"))
        return await real_patch(*args, **kwargs)  # type: ignore[arg-type]

    cluster.patch_object = racing_patch  # type: ignore[method-assign]
    assert (await run(cluster, "gpu-0001"))[0] == 0
    moves = await moves_of(cluster)
    assert moves["other"].state == "ready" and moves[uid].state == "requested"


def test_the_command_line(tmp_path: Path) -> None:
    runner = CliRunner()
    assert "--to" in runner.invoke(main, ["migrate", "--help"]).output
    missing = runner.invoke(main, ["migrate", "p1"])
    assert missing.exit_code == 2 and "Missing option '--to'" in missing.output
    slash = runner.invoke(main, ["migrate", "team/p1", "--to", "gpu-0001"])
    assert slash.exit_code == 2 and "give the pod's name and its namespace with -n" in slash.output
    bad = runner.invoke(main, ["migrate", "p1", "--to", "gpu-0001/"])
    assert bad.exit_code == 2 and "is not NODE or NODE/GPU" in bad.output
    assert runner.invoke(main, ["migrate", "p1", "--to", "n", "--wait", "-1"]).exit_code == 2
    garbage = tmp_path / "kubeconfig"
    garbage.write_text(json.dumps({"apiVersion": "v1", "kind": "Config"}))
    out = runner.invoke(main, ["migrate", "p1", "--to", "n", "--kubeconfig", str(garbage)])
    assert out.exit_code == 2 and "gpupool migrate: cannot use" in out.output and "Traceback" not in out.output


# --- --cancel -------------------------------------------------------------------------------------------------


async def test_cancel_by_pod_or_claim_returns_the_share_to_its_source() -> None:
    cluster, uid = await scene()
    for name in ("p1", "c1"):  # the pod's name, or the claim's
        ready = Move("team/c1", GpuRef("gpu-0000", 0), GpuRef("gpu-0001", 1), "ready", "",
                     "2027-01-15T08:00:00Z", "2027-01-15T08:10:00Z")
        await set_move(cluster, uid, ready)
        lines: list[str] = []
        assert await cancel_move(cluster, "team", name, NS, lines.append) == 0
        assert lines == ["claim team/c1: move gpu-0000/gpu-0 -> gpu-0001/gpu-1 cancelled; served from gpu-0000/gpu-0"]
        move = (await moves_of(cluster))[uid]
        assert (move.state, move.reason, move.deadline) == \
            ("failed", "cancelled: by gpupool migrate --cancel", "2027-01-15T08:10:00Z")
        assert move.cancelled
    # cancelled, the share is served from its source: a new move starts there
    assert (await run(cluster, "gpu-0001"))[0] == 0
    assert (await moves_of(cluster))[uid].source == GpuRef("gpu-0000", 0)


@pytest.mark.parametrize(("name", "message"), [
    ("nope", "no pod or claim team/nope: nothing to cancel"),
    ("p\x1b[2J", "no pod or claim team/p\\x1b[2J: nothing to cancel"),
    ("p1", "pod team/p1: no unfinished move to cancel"),
    ("c1", "claim team/c1: no unfinished move to cancel"),
])
async def test_cancelling_what_is_not_moving_is_a_usage_error(name: str, message: str) -> None:
    cluster, _ = await scene()
    with pytest.raises(Refused) as e:
        await cancel_move(cluster, "team", name, NS, print)
    assert (e.value.code, e.value.message) == (2, message)


async def test_cancelling_a_finished_move_says_how_it_ended() -> None:
    cluster, uid = await scene()
    await set_move(cluster, uid, Move("team/c1", GpuRef("gpu-0000", 0), GpuRef("gpu-0001", 1), "moved"))
    with pytest.raises(Refused) as e:
        await cancel_move(cluster, "team", "p1", NS, print)
    assert (e.value.code, e.value.message) == \
        (2, "pod team/p1: no unfinished move to cancel (the move of claim team/c1 is moved)")
    assert (await moves_of(cluster))[uid].state == "moved"


def test_the_cancel_command_line() -> None:
    runner = CliRunner()
    assert "--cancel" in runner.invoke(main, ["migrate", "--help"]).output
    for args, words in (
        (["migrate", "p1", "--cancel", "p1"], "--cancel takes the pod or claim itself: give no POD and no --to"),
        (["migrate", "--cancel", "p1", "--to", "gpu-0001"], "give no POD and no --to with it"),
        (["migrate", "--cancel", "team/p1"], "give the pod's or claim's name and its namespace with -n"),
        (["migrate", "--cancel", ""], "give the pod's or claim's name"),
        (["migrate"], "Missing argument 'POD' (or --cancel POD_OR_CLAIM)"),
        (["migrate", "p1", "--to", "n", "--deadline", "0"], "--deadline"),
    ):
        out = runner.invoke(main, args)
        assert out.exit_code == 2 and words in out.output and "Traceback" not in out.output, (args, out.output)
