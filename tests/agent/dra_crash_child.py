"""A DRA driver in a process of its own that kills itself (SIGKILL) at a chosen filesystem step of a prepare
or an unprepare: what `kill -9` of the agent leaves on the node (tests/agent/dra/test_agent_dra_crash.py).

    python -m tests.agent.dra_crash_child SPEC.json

SPEC: {"root": directory of the node (checkpoints, CDI specs, hook root), "claim": the claim object (its UID
is kept: the stand-in API serves it as given), "phase": "prepare" or "unprepare", "crash_at": N}.

The process starts the way the agent does on the node state (the lock, the checkpoint, `recover`), runs the
real `DraDriver` code (an unprepare first prepares the claim, unwatched), then counts every filesystem
change under `root` the phase makes, as Python's audit hooks see them (a file opened for writing, mkdir,
chmod, rename, unlink, rmdir, also each of rmtree's), and kills itself with SIGKILL just before the N-th;
N beyond the last: after the phase returned, before anything is printed (the answer never reached kubelet).
N = 0: no kill; it prints {"ops": [[event, path under root], ...], "answer": what the phase returned}.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from gpupool.agent.devices.health import HealthTracker
from gpupool.agent.devices.table import DeviceTable
from gpupool.agent.dra.claims import ClaimRef
from gpupool.agent.dra.driver import DraDriver
from gpupool.agent.isolation.strategies import node_strategies
from gpupool.agent.port import ClusterPortAgent
from gpupool.agent.state.node_state import NodeStateLock
from gpupool.cluster.memory import MemoryCluster
from tests.agent.agent_helpers import agent_config, four_gpus

_WRITES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_CHANGES = {"os.mkdir", "os.chmod", "os.rename", "os.remove", "os.rmdir", "os.truncate", "os.symlink", "os.link",
            "shutil.rmtree"}


class FixedClaims(ClusterPortAgent):
    """The stand-in API with one claim, served with the UID it was given (the memory cluster would mint one)."""

    def __init__(self, claim: dict[str, Any]) -> None:
        super().__init__(MemoryCluster())
        self.claim = claim

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        meta = self.claim["metadata"]
        if (meta["namespace"], meta["name"]) != (namespace, name):
            return await super().get_claim(namespace, name)
        return json.loads(json.dumps(self.claim))  # type: ignore[no-any-return]


def config_for(root: Path) -> Any:
    return agent_config(root, dra=True, kubelet_root=root / "kubelet", cdi_dir=root / "cdi")


class Steps:
    """The audit hook: counts the changes under `root`, kills the process before the `crash_at`-th."""

    def __init__(self, root: Path, crash_at: int) -> None:
        self.root = str(root)
        self.crash_at = crash_at
        self.armed = False
        self.ops: list[tuple[str, str]] = []

    def _path(self, event: str, args: tuple[Any, ...]) -> str | None:
        if event == "open":
            path, _mode, flags = args
            if not isinstance(flags, int) or not flags & _WRITES:
                return None
        elif event == "os.rename":
            path = args[1]  # where it lands: the rename of a checkpoint's temporary file is its commit
        elif event in _CHANGES:
            path = args[0]
        else:
            return None
        if isinstance(path, os.PathLike):
            path = os.fspath(path)
        if isinstance(path, bytes):
            path = path.decode(errors="replace")
        if not isinstance(path, str):
            return None
        if path.startswith(self.root + "/"):
            return path[len(self.root) + 1:]
        # rmtree removes what it walks by names relative to a directory descriptor; only ours runs here
        return f"(in a directory) {path}" if event in ("os.remove", "os.rmdir") and "/" not in path else None

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.armed:
            return
        path = self._path(event, args)
        if path is None:
            return
        self.ops.append((event, path))
        if len(self.ops) == self.crash_at:
            os.kill(os.getpid(), signal.SIGKILL)


async def main(spec: dict[str, Any]) -> None:
    root = Path(spec["root"])
    config = config_for(root)
    lock = NodeStateLock(config.checkpoint_path)
    lock.acquire()  # as the agent holds it: the kernel drops it when this process is killed
    table = DeviceTable(four_gpus(), config.split, HealthTracker((), quarantine_s=1.0))
    driver = DraDriver(config, table, FixedClaims(spec["claim"]), node_strategies(config))
    driver.load()
    await driver.recover()
    meta = spec["claim"]["metadata"]
    ref = ClaimRef(meta["namespace"], meta["name"], meta["uid"])
    if spec["phase"] == "unprepare":
        first = (await driver.prepare([ref]))[ref.uid]
        assert first.claim is not None, first.error
    steps = Steps(root, int(spec["crash_at"]))
    sys.addaudithook(steps)
    steps.armed = True
    if spec["phase"] == "prepare":
        outcome = (await driver.prepare([ref]))[ref.uid]
        answer: Any = {"error": outcome.error,
                       "cdi_ids": list(outcome.claim.cdi_ids) if outcome.claim is not None else []}
    else:
        answer = (await driver.unprepare([ref]))[ref.uid]
    steps.armed = False
    if steps.crash_at:  # past the last step: killed before the answer is returned
        os.kill(os.getpid(), signal.SIGKILL)
    print(json.dumps({"ops": steps.ops, "answer": answer}))


if __name__ == "__main__":
    asyncio.run(main(json.loads(Path(sys.argv[1]).read_text())))
