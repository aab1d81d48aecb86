"""Which pod a GPU process belongs to, from the text of /proc/<pid>/cgroup.

The kubelet puts every container in a cgroup whose path names the pod UID and the container ID, with
two spellings depending on the cgroup driver:

    cgroupfs: /kubepods/burstable/pod6b1e0d2c-8e0a-4a4c-9d1e-3f2a1b0c9d8e/<64-hex container id>
    systemd:  /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6b1e0d2c_8e0a_..._9d8e.slice/
              cri-containerd-<64-hex container id>.scope      (also docker-<id>.scope, crio-<id>.scope)

cgroup v1 lists one line per hierarchy (`12:memory:/kubepods/...`), v2 a single `0::/...` line. The
parsing is pure so it is tested on fixtures; reading the file is one small function beside it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

_UUID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
_POD = re.compile(rf"(?:^|[/-])pod({_UUID})(?:\.slice)?(?=/|$)")
_CONTAINER = re.compile(r"^(?:[a-z-]+-)?([0-9a-f]{64})(?:\.scope)?$")
_RUNTIME_PREFIX = re.compile(r"^[a-z0-9.-]+://")


@dataclass(frozen=True, slots=True)
class CgroupRef:
    pod_uid: str
    container_id: str | None  # None when the process sits in the pod's cgroup itself (e.g. the pause)


@dataclass(frozen=True, slots=True)
class PodRef:
    """The Kubernetes labels a GPU series gets once its process is mapped."""

    namespace: str
    pod: str
    container: str = ""


@dataclass(frozen=True, slots=True)
class PodInfo:
    """What the agent knows of a pod on its node: identity, and container ID -> container name."""

    namespace: str
    name: str
    containers: Mapping[str, str] = field(default_factory=dict)


def parse_cgroup(text: str) -> CgroupRef | None:
    """The pod UID (dashed form) and container ID named by /proc/<pid>/cgroup text, or None when the
    process is not in a Kubernetes pod."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1].strip()
        if not path:
            continue
        match = _POD.search(path)
        if match is None:
            continue
        uid = match.group(1).replace("_", "-")
        rest = path[match.end():].strip("/")
        cid = None
        if rest:
            last = _CONTAINER.match(rest.rsplit("/", 1)[-1])
            cid = last.group(1) if last else None
        return CgroupRef(uid, cid)
    return None


def container_id(status_id: str) -> str:
    """Pod status container IDs carry the runtime ("containerd://abc..."); cgroups carry the bare ID."""
    return _RUNTIME_PREFIX.sub("", status_id)


def resolve(text: str, pods: Mapping[str, PodInfo]) -> PodRef | None:
    """Map /proc/<pid>/cgroup text to a pod, given the node's pods keyed by UID (None if unknown)."""
    ref = parse_cgroup(text)
    if ref is None:
        return None
    info = pods.get(ref.pod_uid)
    if info is None:
        return None
    container = info.containers.get(ref.container_id, "") if ref.container_id else ""
    return PodRef(info.namespace, info.name, container)


def read_cgroup(pid: int, proc_root: Path = Path("/proc")) -> str | None:
    """The cgroup text of `pid`, or None when the process has exited or is not visible."""
    try:
        return (proc_root / str(pid) / "cgroup").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None


def proc_pod_mapper(
    pods: Callable[[], Mapping[str, PodInfo]], proc_root: Path = Path("/proc")
) -> Callable[[int], PodRef | None]:
    """`pod_of_pid` for `DeviceCollector`: reads /proc/<pid>/cgroup and looks the pod up in `pods()` (the
    node's pods by UID, e.g. from the agent's pod cache; it should be a cheap lookup, it is called per
    process); PIDs of exited processes or of processes outside pods map to None."""

    def pod_of_pid(pid: int) -> PodRef | None:
        text = read_cgroup(pid, proc_root)
        return resolve(text, pods()) if text is not None else None

    return pod_of_pid
