"""What keeps the node state of one agent its own and tidy: a lock across processes, and the start-up sweep.

The lock: `<checkpoint_dir>/node-state.lock`, held with flock(2) for as long as the agent runs. Two agent
processes on one node state (a second DaemonSet, `gpupool agent` started by hand beside the pod, an old pod
still running during a rollout) would both answer kubelet from the same checkpoints and each overwrite what
the other wrote; the second one to start fails at once with a message naming the holder's PID. The kernel drops
the lock when its holder dies, also by SIGKILL, so a crashed agent never blocks its successor. The lock is on
an open file description: a second `NodeStateLock` in the same process conflicts too.

The sweep (`sweep_claims`, at start, after the DRA driver finished or rolled back what a crash left half done):
the CDI specs and claim hook directories (each holding the claim's limits file) of DRA claims that no entry of
the DRA checkpoint owns are removed, and so are temporary files an interrupted atomic write left. Only names
of gpupool's own pattern in gpupool's own directories are touched: `<cdi_dir>/gpu.gpupool.io-claim_<UID>.json`
(and its `.…tmp`; the CDI directory is shared with other drivers) and `<hook_root>/claims/<UID>/`. The pods'
hook directories are not the checkpoint's to sweep: a pod's directory stays while the pod is on the node (its
containers may still run after the checkpoint dropped its entry), and the start-up housekeeping removes
those of pods no longer on the node (gpupool.agent.isolation.base HookIsolation.release).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import stat
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from gpupool.agent.state.checkpoint import CheckpointError
from gpupool.agent.state.hookdir import LIMITS_FILE, limits_dir, valid_uid
from gpupool.api.dra import DRIVER

LOCK_FILE = "node-state.lock"
_UID = r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}"
CDI_SPEC = re.compile(rf"^{re.escape(DRIVER)}-claim_({_UID})\.json$")
CDI_TMP = re.compile(rf"^\.{re.escape(DRIVER)}-claim_({_UID})\.json\.tmp$")
LIMITS_TMP = re.compile(rf"^\.{re.escape(LIMITS_FILE)}\.\d+\.tmp$")  # hookdir.write_limits' temporary file


class NodeStateBusy(CheckpointError):
    """Another process holds the node state."""


class NodeStateLock:
    """flock(2) on `<directory>/node-state.lock`: one agent process per node state."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock or raise NodeStateBusy (never waits: the holder serves until it stops)."""
        if self._fd is not None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise CheckpointError(f"cannot open the node state lock {self.path} (agent setting checkpoint_dir): "
                                  f"{e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise NodeStateBusy(
                f"another gpupool agent (pid {holder}) holds the node state in {self.path.parent} "
                f"(lock {self.path.name}); two agents must not serve one node: stop the other one first"
            ) from None
        except OSError:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)  # for the message of the next one (informative only)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # drops the lock; the file stays (removing it would race with the next taker)


@dataclass
class Swept:
    cdi_specs: list[str] = field(default_factory=list)  # claim UIDs
    claim_dirs: list[str] = field(default_factory=list)  # claim UIDs
    temporary: list[str] = field(default_factory=list)  # paths

    def __bool__(self) -> bool:
        return bool(self.cdi_specs or self.claim_dirs or self.temporary)


def _plain_file(path: Path) -> bool:
    with contextlib.suppress(OSError):
        return stat.S_ISREG(path.lstat().st_mode)
    return False


def _plain_dir(path: Path) -> bool:
    with contextlib.suppress(OSError):
        return stat.S_ISDIR(path.lstat().st_mode)  # not a symbolic link to a directory elsewhere
    return False


def sweep_claims(cdi_dir: Path, hook_root: Path, owned: Collection[str]) -> Swept:
    """Remove what prepared claims leave on the node (CDI spec, claim directory with its limits file) for
    every claim UID not in `owned`, and leftovers of interrupted atomic writes; returns what went."""
    keep = set(owned)
    out = Swept()
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for entry in sorted(cdi_dir.iterdir()):
            spec, tmp = CDI_SPEC.match(entry.name), CDI_TMP.match(entry.name)
            if not _plain_file(entry):
                continue
            if spec is not None and spec.group(1) not in keep:
                entry.unlink(missing_ok=True)
                out.cdi_specs.append(spec.group(1))
            elif tmp is not None:  # the rename never happened: nobody reads it
                entry.unlink(missing_ok=True)
                out.temporary.append(str(entry))
    claims = hook_root / "claims"
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for entry in sorted(claims.iterdir()):
            if not (valid_uid(entry.name) and _plain_dir(entry)):
                continue
            if entry.name not in keep:
                shutil.rmtree(entry, ignore_errors=True)
                out.claim_dirs.append(entry.name)
                continue
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                for leftover in limits_dir(entry).iterdir():
                    if LIMITS_TMP.match(leftover.name) and _plain_file(leftover):
                        leftover.unlink(missing_ok=True)
                        out.temporary.append(str(leftover))
    return out
