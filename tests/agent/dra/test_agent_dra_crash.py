"""kill -9 of the DRA driver at every step of NodePrepareResources and NodeUnprepareResources, then a restart.

Each crash is a real process (tests/agent/dra_crash_child.py) running the driver's own prepare or unprepare
code on a node directory of its own; it SIGKILLs itself just before its N-th filesystem change (every one its
audit hook sees: each mkdir, chmod, file opened for writing, rename, unlink, rmdir), for every N, and once
after the last change, before the answer. Then the real agent (`Agent.start`: the node state's lock, the
checkpoints, `recover`) starts on that directory in this process, and kubelet asks again, as it does after
a failed call.

What must hold, written from the documented contract (docs/agent.md, "Node state"), not from the code:
- before the checkpoint records PrepareStarted (UnprepareStarted), nothing on the node changes;
- after the restart the claim is prepared whole (its checkpoint entry, its CDI spec and its limits file, byte
  for byte what an uninterrupted prepare writes) or not at all (no entry, no CDI spec, no claim directory, no
  temporary file): prepared exactly when the kill came after the checkpoint's PrepareCompleted write (for an
  unprepare: before its UnprepareStarted write);
- kubelet asking again gets the uninterrupted answer, and the claim is prepared once: a restarted agent that
  found it prepared answers from the checkpoint (it prepares nothing), else it prepares it once.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from gpupool.agent.devices.fake import FakeBackend
from gpupool.agent.dra.cdi import cdi_path
from gpupool.agent.dra.claims import CHECKPOINT_FILE, ClaimRef
from gpupool.agent.dra.driver import (
    STEP_CDI_REMOVED,
    STEP_CDI_WRITTEN,
    STEP_DIR_REMOVED,
    STEP_NODE_PREPARED,
    STEP_PREPARE_COMPLETED,
    STEP_PREPARE_STARTED,
    STEP_UNPREPARE_COMPLETED,
    STEP_UNPREPARE_STARTED,
)
from gpupool.agent.isolation.base import STEP_CARVED
from gpupool.agent.service import Agent
from gpupool.agent.state.checkpoint import KIND_CLAIMS, decode_state
from gpupool.agent.state.hookdir import read_limits
from gpupool.api.dra import DRIVER
from gpupool.cluster.port import RESOURCE_CLAIMS
from tests.agent.agent_helpers import NODE, four_gpus
from tests.agent.dra.test_agent_dra import MIG_CLASS, _mig_instances, _partition, claim, dra_rig
from tests.agent.dra_crash_child import FixedClaims, config_for

REPO = Path(__file__).resolve().parents[3]
UID = "c1a1m-0001"
REF = ClaimRef("team-a", "train", UID)
MIB = 1 << 20
CLAIM: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
    "metadata": {"name": "train", "namespace": "team-a", "uid": UID},
    "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
    "status": {"allocation": {"devices": {
        "results": [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-2", "shareID": "s2",
                     "consumedCapacity": {"memory": "8Gi", "cores": "30"}}],
        "config": [{"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": {"isolation": "hook"}}}],
    }}},
}
CHECKPOINT = f"gpupool-agent/{CHECKPOINT_FILE}"
COMMIT = ("os.rename", CHECKPOINT)  # a checkpoint write takes effect with its rename
# What a prepared hook claim has on the node (docs/agent.md: the CDI spec, the claim's hook directory with its
# limits file, accounting directory and pod.json), relative to the node directory; nothing else there.
PREPARED_FILES = {
    f"cdi/{DRIVER}-claim_{UID}.json",
    f"hook/claims/{UID}", f"hook/claims/{UID}/pod.json", f"hook/claims/{UID}/hook", f"hook/claims/{UID}/limits",
    f"hook/claims/{UID}/limits/limits.v1",
}


@contextmanager
def node_dirs() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="gpk-", dir="/tmp"))  # unix socket paths stay short
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def child(root: Path, phase: str, crash_at: int) -> tuple[int, str]:
    spec = root.with_suffix(".json")
    spec.write_text(json.dumps({"root": str(root), "claim": CLAIM, "phase": phase, "crash_at": crash_at}))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.agent.dra_crash_child", str(spec), cwd=REPO,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode() + err.decode()


def on_node(root: Path) -> set[str]:
    """Everything under the node's CDI directory and claims' hook root (what a claim can leave behind)."""
    found = set()
    for base in (root / "cdi", root / "hook" / "claims"):
        for dirpath, dirnames, filenames in os.walk(base):
            for name in dirnames + filenames:
                found.add(str((Path(dirpath) / name).relative_to(root)))
    return found


def checkpoint_entries(root: Path) -> list[dict[str, Any]]:
    path = root / CHECKPOINT
    if not path.exists():
        return []
    return decode_state(path.read_bytes(), KIND_CLAIMS, NODE)  # its checksum holds


def reference_bytes(root: Path) -> dict[str, bytes]:
    """The CDI spec and limits file, with the node directory's path taken out (it differs per run)."""
    return {name: (root / name).read_bytes().replace(str(root).encode(), b"<node>")
            for name in (f"cdi/{DRIVER}-claim_{UID}.json", f"hook/claims/{UID}/limits/limits.v1")}


def assert_prepared_whole(root: Path, reference: dict[str, bytes]) -> None:
    assert on_node(root) == PREPARED_FILES
    assert reference_bytes(root) == reference
    limits = read_limits(root / "hook" / "claims" / UID / "limits")
    # gpu-2 with 8Gi and 30 cores: 8192 MiB, 30 % = 300,000 parts per million
    assert limits is not None and (limits["ndev"], limits["limit"][0], limits["cores"][0]) == (1, 8192 * MIB, 300_000)
    entries = checkpoint_entries(root)
    assert [(e["uid"], e["state"], e["cdi_ids"]) for e in entries] == [
        (UID, "PrepareCompleted", [f"{DRIVER}/claim={UID}"])]


def assert_nothing_left(root: Path) -> None:
    assert on_node(root) == set()
    assert checkpoint_entries(root) == []
    # no temporary file of an interrupted write either (the checkpoint exists once something was written)
    assert {p.name for p in (root / "gpupool-agent").iterdir()} - {CHECKPOINT_FILE} == {"node-state.lock"}


async def restarted(root: Path) -> Agent:
    agent = Agent(config_for(root), FakeBackend(four_gpus()), FixedClaims(CLAIM))
    await agent.start()
    return agent


async def uninterrupted(root: Path, phase: str) -> list[tuple[str, str]]:
    code, out = await child(root, phase, 0)
    assert code == 0, out
    result = json.loads(out.splitlines()[-1])
    expected = {"error": "", "cdi_ids": [f"{DRIVER}/claim={UID}"]} if phase == "prepare" else ""
    assert result["answer"] == expected
    return [(e, p) for e, p in result["ops"]]


async def crash_every_step(phase: str) -> None:
    with node_dirs() as base:
        ops = await uninterrupted(base / "ref", phase)
        commits = [n for n, op in enumerate(ops, 1) if op == COMMIT]
        assert len(commits) == 2  # the Started record, then the Completed one (prepare) or the entry's removal
        # nothing on the node changes before the Started record is written
        assert all(p.partition("/")[0] == "gpupool-agent" for _, p in ops[:commits[0]]), ops[:commits[0]]
        reference = reference_bytes(base / "ref") if phase == "prepare" else {}
        if phase == "unprepare":
            assert_nothing_left(base / "ref")
            with node_dirs() as other:  # the prepared state an unprepare starts from
                await uninterrupted(other / "n", "prepare")
                reference = reference_bytes(other / "n")
        points = range(1, len(ops) + 2)  # before each change, and after the last one
        limit = asyncio.Semaphore(8)

        async def kill(n: int) -> tuple[int, str]:
            async with limit:
                return await child(base / f"n{n}", phase, n)

        results = await asyncio.gather(*(kill(n) for n in points))
        for n, (code, out) in zip(points, results, strict=True):
            root = base / f"n{n}"
            what = f"{phase} killed before change {n} of {len(ops)} ({ops[n - 1] if n <= len(ops) else 'after all'})"
            assert code == -signal.SIGKILL, f"{what}: exit {code}\n{out}"
            agent = await restarted(root)
            try:
                assert agent.dra is not None
                prepared = n > commits[1] if phase == "prepare" else n <= commits[0]
                try:
                    if prepared:
                        assert_prepared_whole(root, reference)
                    else:
                        assert_nothing_left(root)
                except AssertionError as e:
                    raise AssertionError(f"{what}: after the restart: {e}") from None
                if phase == "prepare":  # kubelet asks again: the uninterrupted answer, prepared once
                    outcome = (await agent.dra.prepare([REF]))[UID]
                    assert outcome.claim is not None and outcome.claim.cdi_ids == (f"{DRIVER}/claim={UID}",), what
                    assert agent.dra.prepare_count == (0 if prepared else 1), what
                    assert_prepared_whole(root, reference)
                else:
                    assert (await agent.dra.unprepare([REF]))[UID] == "", what
                    assert_nothing_left(root)
            finally:
                await agent.stop()


async def test_kill_9_at_every_step_of_prepare_leaves_the_claim_prepared_whole_or_not_at_all() -> None:
    await crash_every_step("prepare")


async def test_kill_9_at_every_step_of_unprepare_leaves_the_claim_prepared_whole_or_gone() -> None:
    await crash_every_step("unprepare")


# --- MIG: the named steps, in process ---------------------------------------------------------------------
# The MIG manager's hardware is the fake driver, which lives in this process (it outlives the agent, as the
# GPU does): the crash is a BaseException from the driver's step hook (no code of the agent after the step
# runs), then the agent is stopped without a word to the checkpoint and a new one starts on the directory.


class Crash(BaseException):
    """The agent process dies here."""


def crash_at(step: str) -> Any:
    def hook(current: str) -> None:
        if current == step:
            raise Crash(step)
    return hook


PREPARE_STEPS = [STEP_PREPARE_STARTED, STEP_CARVED, STEP_NODE_PREPARED, STEP_CDI_WRITTEN, STEP_PREPARE_COMPLETED]
UNPREPARE_STEPS = [STEP_UNPREPARE_STARTED, STEP_CDI_REMOVED, STEP_DIR_REMOVED, STEP_UNPREPARE_COMPLETED]


@pytest.mark.parametrize("step", PREPARE_STEPS)
async def test_a_mig_claim_killed_at_a_step_of_prepare_holds_one_instance_after_the_restart(step: str) -> None:
    async with dra_rig(mig=True) as r:
        c = await r.cluster.create_object(RESOURCE_CLAIMS, claim("infer", [_partition("gpu-0-3g40gb-4")], MIG_CLASS))
        uid = c["metadata"]["uid"]
        ref = ClaimRef("team-a", "infer", uid)
        assert r.agent.dra is not None
        r.agent.dra.step = crash_at(step)
        with pytest.raises(Crash):
            await r.agent.dra.prepare([ref])
        await r.restart()
        assert r.agent.dra is not None
        completed = step == STEP_PREPARE_COMPLETED
        # not completed: rolled back; the instance it may have carved is nobody's, and idle for 0 s of 0: gone
        assert _mig_instances(r) == ([("3g.40gb", 4, uid)] if completed else [])
        assert cdi_path(r.agent.config.cdi_dir, uid).exists() == completed
        assert set(r.agent.dra.prepared) == ({uid} if completed else set())
        outcome = (await r.agent.dra.prepare([ref]))[uid]  # kubelet asks again
        assert outcome.error == ""
        assert _mig_instances(r) == [("3g.40gb", 4, uid)]  # one instance, the claim's
        assert r.agent.dra.prepare_count == (0 if completed else 1)


@pytest.mark.parametrize("step", UNPREPARE_STEPS)
async def test_a_mig_claim_killed_at_a_step_of_unprepare_is_unprepared_by_the_restart(step: str) -> None:
    async with dra_rig(mig=True) as r:
        c = await r.cluster.create_object(RESOURCE_CLAIMS, claim("infer", [_partition("gpu-0-3g40gb-4")], MIG_CLASS))
        uid = c["metadata"]["uid"]
        ref = ClaimRef("team-a", "infer", uid)
        assert r.agent.dra is not None
        assert (await r.agent.dra.prepare([ref]))[uid].error == ""
        r.agent.dra.step = crash_at(step)
        with pytest.raises(Crash):
            await r.agent.dra.unprepare([ref])
        await r.restart()
        assert r.agent.dra is not None
        # UnprepareStarted was written before the first step: the restart finishes the unprepare, and the
        # released instance, idle for 0 s of 0, is destroyed by the start's housekeeping
        assert (_mig_instances(r), r.agent.dra.prepared) == ([], {})
        assert not cdi_path(r.agent.config.cdi_dir, uid).exists()
        assert not (r.agent.config.hook_root / "claims" / uid).exists()
        assert (await r.agent.dra.unprepare([ref]))[uid] == ""  # kubelet asks again: already unprepared
