"""Host processes, as the watchdog needs them: which pod and container a host PID runs in (its cgroup), and
stopping one without ever hitting another process that took its PID.

NVML reports host PIDs, so the agent must see the host's processes (the DaemonSet runs with hostPID);
`proc_root` is injectable so tests use a temporary tree. The kubelet names the pod UID and the container ID
in every container's cgroup path, in two spellings by cgroup driver:

    cgroupfs: /kubepods/burstable/pod6b1e0d2c-8e0a-4a4c-9d1e-3f2a1b0c9d8e/<64-hex container id>
    systemd:  /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6b1e0d2c_8e0a_..._9d8e.slice/
              cri-containerd-<64-hex container id>.scope      (also docker-<id>.scope, crio-<id>.scope)

cgroup v1 lists one line per hierarchy (`12:memory:/kubepods/...`), v2 a single `0::/...` line.
(gpupool.exporter.cgroup reads the same paths for the exporter; a service may not import another, and
tests/agent/enforce/test_agent_procs.py holds both parsers to the same fixtures.)
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

_UUID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
_POD = re.compile(rf"(?:^|[/-])pod({_UUID})(?:\.slice)?(?=/|$)")
_CONTAINER = re.compile(r"^(?:[a-z-]+-)?([0-9a-f]{64})(?:\.scope)?$")
_RUNTIME_PREFIX = re.compile(r"^[a-z0-9.-]+://")
_MAX_CGROUP_BYTES = 64 * 1024  # a cgroup file is a few hundred bytes; never read more than this


@dataclass(frozen=True, slots=True)
class ProcRef:
    """Where a host process runs: its pod, and its container when the path names one."""

    pod_uid: str
    container_id: str | None  # None when the process sits in the pod's cgroup itself


def parse_cgroup(text: str) -> ProcRef | None:
    """The pod UID (dashed form) and container ID named by /proc/<pid>/cgroup text; None outside pods."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1].strip()
        match = _POD.search(path) if path else None
        if match is None:
            continue
        rest = path[match.end():].strip("/")
        last = _CONTAINER.match(rest.rsplit("/", 1)[-1]) if rest else None
        return ProcRef(match.group(1).replace("_", "-"), last.group(1) if last else None)
    return None


def bare_container_id(status_id: str) -> str:
    """Pod status container IDs carry the runtime ("containerd://abc..."); cgroups carry the bare ID."""
    return _RUNTIME_PREFIX.sub("", status_id)


class ProcTable:
    """Reads /proc/<pid>/cgroup under `root` (the host's /proc in production)."""

    def __init__(self, root: Path = Path("/proc")) -> None:
        self.root = root

    def exists(self, pid: int) -> bool:
        return (self.root / str(pid)).is_dir()

    def ref(self, pid: int) -> ProcRef | None:
        """The pod of `pid`; None when it has exited, is not visible, or runs outside any pod."""
        try:
            with (self.root / str(pid) / "cgroup").open("rb") as f:
                text = f.read(_MAX_CGROUP_BYTES).decode("utf-8", "replace")
        except OSError:
            return None
        return parse_cgroup(text)


class Killer(Protocol):
    def kill(self, pid: int, expected: ProcRef) -> bool:
        """SIGKILL `pid` if it still runs where `expected` says; True when the signal was sent."""
        ...


class PidfdKiller:
    """Kills through a pidfd: the descriptor is opened first, then the process's cgroup is read again, and
    the signal goes to the descriptor. A PID that was reused between NVML's report and the kill is then
    either a different cgroup (not killed) or, if it was reused before the pidfd was opened, the new
    process, which the re-read cgroup catches. Never a process of another pod."""

    def __init__(self, procs: ProcTable) -> None:
        self.procs = procs

    def kill(self, pid: int, expected: ProcRef) -> bool:
        if pid <= 1:  # never init, never "every process" (pid 0 / -1 semantics of kill(2))
            return False
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return False  # gone already
        try:
            if self.procs.ref(pid) != expected:
                return False
            signal.pidfd_send_signal(fd, signal.SIGKILL)
            return True
        except OSError:
            return False
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)
