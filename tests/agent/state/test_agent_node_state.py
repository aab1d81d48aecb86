"""The node state (gpupool.agent.state.node_state, the claims' checkpoint of gpupool.agent.dra.driver): one
agent process per node state, the start-up sweep touching gpupool's own files only, older checkpoints read, damaged ones
never served from."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gpupool.agent.devices.fake import FakeBackend
from gpupool.agent.dra.claims import CHECKPOINT_FILE, ClaimRef, PreparedClaim, PreparedDevice
from gpupool.agent.enforce.watchdog import Limit
from gpupool.agent.service import Agent
from gpupool.agent.state.checkpoint import KIND_CLAIMS, CheckpointError, decode_state
from gpupool.agent.state.node_state import LOCK_FILE, NodeStateBusy, NodeStateLock, sweep_claims
from gpupool.api.dra import DRIVER
from tests.agent.agent_helpers import NODE, four_gpus
from tests.agent.dra.test_agent_dra_crash import CLAIM, UID
from tests.agent.dra_crash_child import FixedClaims, config_for

REPO = Path(__file__).resolve().parents[3]
HOLD = """
import sys
from pathlib import Path
from gpupool.agent.state.node_state import NodeStateLock
NodeStateLock(Path(sys.argv[1])).acquire()
print("held", flush=True)
sys.stdin.read()  # until the test closes it or kills this process
"""


@contextmanager
def node_dir() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="gns-", dir="/tmp"))  # unix socket paths stay short
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def agent_on(root: Path) -> Agent:
    return Agent(config_for(root), FakeBackend(four_gpus()), FixedClaims(CLAIM))


# --- the lock -----------------------------------------------------------------------------------------------


async def test_a_second_agent_process_on_the_node_state_fails_with_the_holders_pid_until_it_dies() -> None:
    with node_dir() as root:
        state = config_for(root).checkpoint_path
        holder = await asyncio.create_subprocess_exec(
            sys.executable, "-c", HOLD, str(state), cwd=REPO,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        try:
            assert holder.stdout is not None
            assert await asyncio.wait_for(holder.stdout.readline(), 60) == b"held\n"
            agent = agent_on(root)
            with pytest.raises(NodeStateBusy, match=f"another gpupool agent \\(pid {holder.pid}\\) holds the node "
                                                    f"state in {state} .*two agents must not serve one node"):
                await agent.start()
            assert agent.dra is None and agent.dra_server is None  # it served nothing
            assert not (root / "kubelet" / "plugins_registry").exists()
        finally:
            holder.kill()  # SIGKILL: the kernel drops the lock of a process that dies
            await holder.wait()
        agent = agent_on(root)
        await agent.start()  # the next one gets it
        try:
            assert agent.lock.held
            assert (state / LOCK_FILE).read_text() == f"{os.getpid()}\n"
        finally:
            await agent.stop()
        assert not agent.lock.held


def test_two_locks_in_one_process_conflict_too_and_a_released_lock_can_be_taken(tmp_path: Path) -> None:
    first, second = NodeStateLock(tmp_path), NodeStateLock(tmp_path)
    first.acquire()
    with pytest.raises(NodeStateBusy, match=f"pid {os.getpid()}"):
        second.acquire()
    first.release()
    second.acquire()
    assert second.held and not first.held
    second.release()


# --- the sweep ---------------------------------------------------------------------------------------------


def files_under(root: Path) -> set[str]:
    found = set()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            found.add(str((Path(dirpath) / name).relative_to(root)))
    return found


def test_the_sweep_removes_only_gpupools_files_of_claims_no_entry_owns(tmp_path: Path) -> None:
    cdi, hook, outside = tmp_path / "cdi", tmp_path / "hook", tmp_path / "outside"
    for d in (cdi, hook / "claims" / "keep-1" / "limits", hook / "claims" / "gone-2" / "limits",
              hook / "claims" / "not a uid", hook / "pods" / "pod-9", outside / "target"):
        d.mkdir(parents=True)
    for name in (f"{DRIVER}-claim_keep-1.json", f"{DRIVER}-claim_gone-1.json", f".{DRIVER}-claim_keep-1.json.tmp",
                 "nvidia.com-gpu.json", f"{DRIVER}-claim_bad uid.json", "other-claim_gone-1.json",
                 f"{DRIVER}-claim_gone-1.yaml"):
        (cdi / name).write_text("{}")
    (cdi / f"{DRIVER}-claim_dir-1.json").mkdir()  # not a file: not gpupool's
    (outside / "spec.json").write_text("{}")
    (cdi / f"{DRIVER}-claim_link-1.json").symlink_to(outside / "spec.json")  # gpupool writes no links
    (hook / "claims" / "keep-1" / "limits" / "limits.v1").write_bytes(b"L")
    (hook / "claims" / "keep-1" / "limits" / ".limits.v1.4242.tmp").write_bytes(b"half")
    (hook / "claims" / "gone-2" / "limits" / "limits.v1").write_bytes(b"L")
    (hook / "claims" / "file-1").write_text("not a directory")
    (outside / "target" / "data").write_text("x")
    (hook / "claims" / "link-2").symlink_to(outside / "target")
    (hook / "pods" / "pod-9" / "pod.json").write_text("{}")  # the pods' directories are not the sweep's
    before = files_under(tmp_path)

    swept = sweep_claims(cdi, hook, owned={"keep-1"})

    assert (swept.cdi_specs, swept.claim_dirs) == (["gone-1"], ["gone-2"])
    assert sorted(Path(t).name for t in swept.temporary) == [f".{DRIVER}-claim_keep-1.json.tmp", ".limits.v1.4242.tmp"]
    gone = {f"cdi/{DRIVER}-claim_gone-1.json", f"cdi/.{DRIVER}-claim_keep-1.json.tmp", "hook/claims/gone-2",
            "hook/claims/gone-2/limits", "hook/claims/gone-2/limits/limits.v1",
            "hook/claims/keep-1/limits/.limits.v1.4242.tmp"}
    assert files_under(tmp_path) == before - gone
    assert (outside / "target" / "data").read_text() == "x"


def test_the_sweep_of_missing_directories_does_nothing(tmp_path: Path) -> None:
    assert not sweep_claims(tmp_path / "no-cdi", tmp_path / "no-hook", owned=())


# --- older checkpoints and damaged ones --------------------------------------------------------------------

# dra-claims.json as the agent before version 3 wrote it (json.dumps of the PreparedClaim fields; no checksum)
OLD_CLAIMS = (
    '{"version": 1, "node": "gpu-node-1", "claims": [{"uid": "c1a1m-0001", "namespace": "team-a", "name": "train", '
    '"isolation": "hook", "devices": [{"request": "gpu", "pool": "gpu-node-1", "device": "gpu-2", "share_id": "s2"}], '
    '"cdi_ids": ["gpu.gpupool.io/claim=c1a1m-0001"], "shares": [["GPU-aaaa-2", 8192, 30.0]]}]}'
)
OLD_PREPARED = PreparedClaim(UID, "team-a", "train", "hook", (PreparedDevice("gpu", NODE, "gpu-2", "s2"),),
                             (f"{DRIVER}/claim={UID}",), (("GPU-aaaa-2", 8192, 30.0),))


async def test_a_version_1_claims_checkpoint_is_read_its_claims_keep_their_files_and_the_next_write_is_version_3(
) -> None:
    with node_dir() as root:
        config = config_for(root)
        config.checkpoint_path.mkdir(parents=True)
        (config.checkpoint_path / CHECKPOINT_FILE).write_text(OLD_CLAIMS)
        spec = config.cdi_dir / f"{DRIVER}-claim_{UID}.json"
        limits = config.hook_root / "claims" / UID / "limits" / "limits.v1"
        limits.parent.mkdir(parents=True)
        spec.parent.mkdir(parents=True)
        spec.write_text("{}")
        limits.write_bytes(b"L")
        agent = agent_on(root)
        await agent.start()
        try:
            assert agent.dra is not None
            assert agent.dra.prepared == {UID: OLD_PREPARED}
            assert spec.exists() and limits.exists()  # owned: not swept
            assert agent._watched_claims() == {"team-a/train": {"GPU-aaaa-2": Limit(8192, 30.0, elastic=False)}}
            # read as it is; nothing changed, nothing written (an older agent could still read it)
            assert (config.checkpoint_path / CHECKPOINT_FILE).read_text() == OLD_CLAIMS
            again = (await agent.dra.prepare([ClaimRef("team-a", "train", UID)]))[UID]
            assert again.claim == OLD_PREPARED and agent.dra.prepare_count == 0  # answered from the checkpoint
            assert (await agent.dra.unprepare([ClaimRef("team-a", "train", UID)]))[UID] == ""
            doc = json.loads((config.checkpoint_path / CHECKPOINT_FILE).read_text())
            assert (doc["format"], doc["version"], doc["kind"], doc["node"], doc["claims"]) == (
                "gpupool.io/node-state", 3, "claims", NODE, [])
            assert decode_state((config.checkpoint_path / CHECKPOINT_FILE).read_bytes(), KIND_CLAIMS, NODE) == []
            assert not spec.exists() and not limits.parent.parent.exists()
        finally:
            await agent.stop()


@pytest.mark.parametrize(("damage", "why"), [
    (lambda t: t.replace('"gpu-2"', '"gpu-3"'), "checksum mismatch: the file was changed or damaged"),
    (lambda t: t[: len(t) // 2], "not JSON"),
    (lambda t: t.replace('"version": 3', '"version": 4'), "version 4: written by another gpupool agent"),
    (lambda t: t.replace('"checksum": "sha256:', '"checksum": "sha256:0'), "checksum mismatch"),
])
async def test_a_damaged_claims_checkpoint_stops_the_agent_and_its_claims_files_stay(damage: object,
                                                                                    why: str) -> None:
    with node_dir() as root:
        agent = agent_on(root)
        await agent.start()
        try:
            assert agent.dra is not None
            assert (await agent.dra.prepare([ClaimRef("team-a", "train", UID)]))[UID].error == ""
        finally:
            await agent.stop()
        path = agent.config.checkpoint_path / CHECKPOINT_FILE
        assert callable(damage)
        path.write_text(damage(path.read_text()))
        before = files_under(root)
        for _ in range(2):  # and again: the failed start let go of the lock
            broken = agent_on(root)
            with pytest.raises(CheckpointError) as failed:
                await broken.start()
            message = str(failed.value)
            assert f"node state {path} cannot be trusted: " in message and why in message
            assert "does not serve from it and does not start" in message and "Drain the node" in message
            assert not isinstance(failed.value, NodeStateBusy)
            assert broken.dra_server is None and not broken.lock.held
        # nothing was swept, moved or rewritten: the running containers keep their CDI spec and limits
        assert files_under(root) == before
