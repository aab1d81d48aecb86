"""The host side of `hook` isolation: where the interception library and each container's hook directory
live, and what the library wrote there (the container's usage, read for metrics).

Host layout under `hook_root` (AgentConfig, default /run/gpupool/hook):
    lib/libgpupool_hook.so               copied from the agent's own package at start (kubelet mounts host paths)
    lib/ld.so.preload                    one line: the library's path inside the container
    pods/<pod UID>/<container>/          one GPU container's hook directory (agent only, never mounted whole)
    pods/<pod UID>/<container>/pod.json  who the pod and container are (written at Allocate), for metric labels
    pods/<pod UID>/<container>/limits/limits.v1
                                         the container's limits (`write_limits`): mounted READ-ONLY at
                                         CONTAINER_LIMITS_DIR, the path compiled into the library
    pods/<pod UID>/<container>/hook/     the container's accounting directory: mounted read-write at
                                         CONTAINER_HOOK_DIR; the library keeps usage.v1 there
    claims/<claim UID>/                  the same for a DRA claim's share (gpupool.agent.dra.driver), which every
                                         container using the claim shares; removed when kubelet unprepares
                                         the claim, never by the pods' clean-up

The library takes its caps, compute mode and the place of its accounting from limits.v1 only; the
container's environment (GPUPOOL_MEMORY_LIMIT_MIB, GPUPOOL_CORES_PERCENT, GPUPOOL_CORES_MODE) can lower a
cap, never raise it, and GPUPOOL_HOOK_DIR is ignored. The limits directory must not lie inside anything the
container mounts writable (a read-write mount of pods/<pod UID>/<container>/ itself would expose limits/
writable), hence the two sibling directories. Without limits.v1 (a container granted by an agent that did
not write one) the library falls back to the environment, which the tenant controls.

One directory per GPU container, not per pod: the library checks every allocation against the limits of
the file it maps, which are its own container's (GPUPOOL_MEMORY_LIMIT_MIB, GPUPOOL_CORES_PERCENT), and
indexes the file by the container's visible GPUs. Two containers of one pod sharing a file would each be
held to their own cap against the sum of both (one could be refused memory the other holds), and index 0
would mean a different GPU in each. Agents before this layout made pods/<pod UID>/ itself the directory;
such directories are still read (`hook_dirs`) and removed with their pod.

usage.v1 is the library's shared accounting file; its layout is `struct gp_shared` in native/gp_core.h (the
offsets below are checked there with static assertions). A process's slot counts only while someone holds
the process's OFD lock on byte 1 + slot, which the kernel drops when the process dies. The container can
write it, so the agent reads limits from limits.v1 where there is one, and usage.v1 only for usage.

limits.v1 is `struct gp_limits` in native/gp_core.h (2048 bytes, little-endian). The agent rewrites one field in
place while the pod runs: the reclaim squeeze (`squeeze_ppm`, per GPU of the container), which the library
enforces as min(its cap, the squeeze) from the next launch on (gpupool.api.squeeze, docs/queues.md); it is
also written into usage.v1 for libraries that predate limits.v1.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ANN_CORES_MODE = "gpupool.io/cores-mode"  # hard (default) or elastic; read from the pod at Allocate
CORES_MODES = ("hard", "elastic")
CONTAINER_LIBRARY = "/usr/local/lib/gpupool/libgpupool_hook.so"
# The HIP memory cap on the host (beside the CUDA library under <hook_root>/lib) and in the container; its
# preload list names the container path, as the CUDA library's does.
HIP_LIBRARY = "libgpupool_hip.so"
HIP_PRELOAD = "ld.so.preload.hip"
CONTAINER_HIP_LIBRARY = "/usr/local/lib/gpupool/libgpupool_hip.so"
CONTAINER_PRELOAD = "/etc/ld.so.preload"
CONTAINER_HOOK_DIR = "/run/gpupool/hook"
CONTAINER_LIMITS_DIR = "/run/gpupool/limits"  # the library's GP_LIMITS_PATH is CONTAINER_LIMITS_DIR/LIMITS_FILE
USAGE_FILE = "usage.v1"
LIMITS_FILE = "limits.v1"
LIMITS_SUBDIR = "limits"  # host: <container dir>/limits, mounted read-only at CONTAINER_LIMITS_DIR
ACCOUNTING_SUBDIR = "hook"  # host: <container dir>/hook, mounted read-write at CONTAINER_HOOK_DIR
POD_FILE = "pod.json"

# Kubernetes UIDs are UUIDs; any name that is safe as one path component is accepted (no "/", no "..").
_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")
# Container names are RFC 1123 labels (the API server enforces it): always one safe path component.
_CONTAINER = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_MAGIC = 0x314C4F4F50555047
_MAX_DEV, _SLOTS = 16, 256
_DEV_OFFSET, _SLOT_OFFSET, _SLOT_SIZE = 304, 2048, 264
_FEATURES_OFFSET, _SQUEEZE_OFFSET = 1328, 1336  # in what version 1 left as padding (zero in older files)
_LEARNT_SCALE_OFFSET = 1848  # scale_ppm[]: NVML's smUtil scale the library learnt while its pod ran alone
FEAT_SQUEEZE = 1  # the library in the pod honours the squeeze
_PPM = 1_000_000
_FILE_SIZE = _SLOT_OFFSET + _SLOTS * _SLOT_SIZE
# limits.v1 (struct gp_limits)
_LIMITS_MAGIC = 0x3154494D494C5047  # "GPLIMIT1"
_LIMITS_SIZE = 2048
_L_LIMIT, _L_CORES, _L_MODE, _L_SQUEEZE, _L_UUID, _L_ACCOUNTING, _L_OVERSUB = 16, 144, 272, 280, 408, 1432, 1688
_L_NVML_SCALE = 1816
# the library's own sanity bounds on a scale (gp_compute.c): outside them a value is not one it would use
_SCALE_MIN_PPM, _SCALE_MAX_PPM = 50_000, 20_000_000
_UUID_LEN, _ACCOUNTING_LEN = 64, 256


@dataclass(frozen=True, slots=True)
class HookPaths:
    library: Path
    preload: Path
    pods: Path


@dataclass(frozen=True, slots=True)
class HookLimits:
    """What the library in one container may use, per GPU of the container in its NVIDIA_VISIBLE_DEVICES
    order: the content of limits.v1."""

    memory_mib: tuple[int, ...]  # 0 = no memory cap
    cores: tuple[float, ...]  # percent of the GPU's time, 100 = no compute cap
    mode: str = "hard"  # hard or elastic
    gpus: tuple[str, ...] = ()  # the GPUs' UUIDs ("" or absent: matched by ordinal)
    accounting_dir: str = CONTAINER_HOOK_DIR  # where the container sees its writable accounting directory
    # memory oversubscription: MiB per GPU beyond its cap, served from host memory (empty: none; docs/claims.md)
    oversub_mib: tuple[int, ...] = ()
    # NVML's smUtil scale per GPU as the agent's caps probe measured it alone on the GPU (ppm; 0 or empty: not
    # known). A pod that shares its GPU from its first launch never runs alone to learn the scale itself, and
    # until it has one it divides NVML's samples by 1, which on an H100 (smUtil ~1.6x the busy share) paces
    # it far below its cap (docs/hook.md, "NVML's scale").
    nvml_scale_ppm: tuple[int, ...] = ()


@dataclass(slots=True)
class NvmlScales:
    """The node's measured NVML scales by GPU UUID: written by the validation's caps probe (checks), read
    when a hook container's limits.v1 is written (isolation). The mapping is replaced whole, never
    mutated, so the reader on another thread sees one probe's answer or the next one's."""

    by_gpu: Mapping[str, int] = field(default_factory=dict)

    def of(self, gpus: Iterable[str]) -> tuple[int, ...]:
        """The scale of each of `gpus` (0 for one not measured); empty when none is known."""
        known = self.by_gpu
        out = tuple(known.get(g, 0) for g in gpus)
        return out if any(out) else ()


@dataclass(frozen=True, slots=True)
class HookPod:
    """What the agent prepares on the host before answering Allocate for a GPU container of a `hook` pod."""

    uid: str
    label: str  # namespace/name
    container: str
    gpus: tuple[str, ...]  # the container's GPUs, in the order of its NVIDIA_VISIBLE_DEVICES (the library's)
    dir: Path  # container_dir(root, uid, container)
    limits: HookLimits | None = None  # written to limits.v1 by prepare_pod (None: no file, env-only library)


@dataclass(frozen=True, slots=True)
class PodGpuUsage:
    pod_uid: str
    label: str
    gpu: str  # UUID when pod.json names it, else the index among the container's GPUs
    limit_bytes: int  # 0 = no memory cap
    used_bytes: int  # live processes only: allocations plus context memory
    busy_seconds: float  # cumulative device busy time measured by the library (NVML samples)
    cores_percent: float
    mode: str
    processes: int
    squeeze_percent: float = 0.0  # the compute cap a reclaim squeezed the pod to (0: not squeezed)
    container: str = ""  # "" for a directory an older agent made for the whole pod


def hook_paths(root: Path) -> HookPaths:
    return HookPaths(root / "lib" / "libgpupool_hook.so", root / "lib" / "ld.so.preload", root / "pods")


def remote_shares(root: Path) -> Path:
    """Where this node's GPU server keeps the hook directories of the remote shares it holds, one per claim UID
    (docs/remote.md). Not claims/<UID>: that is a claim's directory on its pod's node, which may be this one."""
    return root / "remote" / "shares"


def claim_roots(root: Path) -> tuple[Path, ...]:
    """The folders of claims' hook directories (one per claim UID): DRA claims prepared on this node, and the
    remote shares its GPU server holds."""
    return (root / "claims", remote_shares(root))


def valid_uid(uid: str) -> bool:
    return _UID.match(uid) is not None


def valid_container(name: str) -> bool:
    return _CONTAINER.match(name) is not None


def pod_dir(root: Path, uid: str) -> Path:
    """The pod's directory: it holds one hook directory per GPU container and goes with the pod."""
    if not valid_uid(uid):  # it becomes a path: nothing but a UID may reach the file system
        raise ValueError(f"not usable as a pod UID: {uid!r}")
    return hook_paths(root).pods / uid


def claim_dir(root: Path, uid: str) -> Path:
    """The hook directory of a DRA claim's share (not under pods/: the pods' clean-up must not see it)."""
    if not valid_uid(uid):
        raise ValueError(f"not a claim UID: {uid!r}")
    return root / "claims" / uid


def container_dir(root: Path, uid: str, container: str) -> Path:
    """The hook directory of one GPU container of the pod (what that container mounts)."""
    if not valid_container(container):
        raise ValueError(f"not usable as a container name: {container!r}")
    return pod_dir(root, uid) / container


def limits_dir(directory: Path) -> Path:
    """The host directory to mount READ-ONLY at CONTAINER_LIMITS_DIR (it holds limits.v1)."""
    return directory / LIMITS_SUBDIR


def accounting_dir(directory: Path) -> Path:
    """The host directory to mount read-write at CONTAINER_HOOK_DIR (the library's usage.v1)."""
    return directory / ACCOUNTING_SUBDIR


def hook_dirs(root: Path, uid: str) -> list[Path]:
    """The pod's hook directories that exist: one per GPU container served, sorted by container name, and
    the pod's directory itself where an older agent made that the (pod-wide) hook directory."""
    base = pod_dir(root, uid)
    out = []
    with contextlib.suppress(OSError):
        if (base / POD_FILE).is_file() or (base / USAGE_FILE).is_file():
            out.append(base)
        out += [e for e in sorted(base.iterdir()) if e.is_dir() and valid_container(e.name)]
    return out


def parse_cores_mode(annotations: Mapping[str, str]) -> str | None:
    """The pod's cores mode, or None when the annotation holds something else."""
    mode = annotations.get(ANN_CORES_MODE, "hard")
    return mode if mode in CORES_MODES else None


def cores_mode_of(pods: Iterable[Mapping[str, Any]], uid: str) -> str:
    """The raw annotation of pod `uid` (validated by build_grant), "hard" when absent."""
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("uid") == uid:
            return str((meta.get("annotations") or {}).get(ANN_CORES_MODE, "hard"))
    return "hard"


# ---- effects (agent start, Allocate, sweeps) ------------------------------------------------------------
def _install(source: Path, library: Path, preload: Path, container_library: str) -> None:
    """Copy a library and write the preload list naming its container path, each atomically: running pods
    map the old file."""
    library.parent.mkdir(parents=True, exist_ok=True)
    tmp = library.with_name(f".{library.name}.tmp")
    shutil.copyfile(source, tmp)
    tmp.chmod(0o755)
    os.replace(tmp, library)
    tmp = preload.with_name(f".{preload.name}.tmp")
    tmp.write_text(container_library + "\n")
    tmp.chmod(0o644)
    os.replace(tmp, preload)


def install_library(root: Path, source: Path) -> HookPaths:
    """The CUDA interception library and its preload list under <root>/lib, and the pods' directory."""
    paths = hook_paths(root)
    paths.pods.mkdir(parents=True, exist_ok=True)
    _install(source, paths.library, paths.preload, CONTAINER_LIBRARY)
    return paths


@dataclass(frozen=True, slots=True)
class HipPaths:
    library: Path
    preload: Path


def hip_paths(hook_root: Path) -> HipPaths:
    return HipPaths(hook_root / "lib" / HIP_LIBRARY, hook_root / "lib" / HIP_PRELOAD)


def hip_installed(hook_root: Path) -> bool:
    paths = hip_paths(hook_root)
    return paths.library.is_file() and paths.preload.is_file()


def install_hip_library(hook_root: Path, source: Path) -> str | None:
    """The packaged HIP memory cap and its preload list beside the CUDA library; the problem, if any (AMD hook
    shares are then refused with it)."""
    if not source.is_file():
        return f"{source} is missing (the package was installed without building it)"
    paths = hip_paths(hook_root)
    try:
        _install(source, paths.library, paths.preload, CONTAINER_HIP_LIBRARY)
    except OSError as e:
        return f"cannot install it under {hook_root}: {e}"
    return None


def install_packaged_library(root: Path) -> str | None:
    """`gpupool agent` at start: put the library this package was built with on the host; the problem, if
    any (pods asking for hook isolation then fail to start, on the missing mount, instead of running
    unenforced)."""
    from gpupool.hook import library_path

    source = library_path()
    if not source.is_file():
        return f"{source} is missing (the package was installed without building it)"
    try:
        install_library(root, source)
    except OSError as e:
        return f"cannot install it under {root}: {e}"
    return None


def prepare_pod(pod: HookPod) -> None:
    """The container's directories, pod.json and (when the grant carries them) its limits file. The
    accounting directory is writable by any user of the container (its processes may run as any user);
    the limits directory only by the agent."""
    pod.dir.mkdir(parents=True, exist_ok=True)
    pod.dir.chmod(0o777)  # agents before limits.v1 mount this directory itself as the accounting directory
    hook = accounting_dir(pod.dir)
    hook.mkdir(exist_ok=True)
    hook.chmod(0o777)
    info = {"uid": pod.uid, "pod": pod.label, "container": pod.container, "gpus": list(pod.gpus)}
    (pod.dir / POD_FILE).write_text(json.dumps(info))
    if pod.limits is not None:
        write_limits(limits_dir(pod.dir), pod.limits)


def limits_bytes(limits: HookLimits) -> bytes:
    """limits.v1 for `limits` (struct gp_limits in native/gp_core.h)."""
    n = len(limits.memory_mib)
    if n != len(limits.cores) or not 0 < n <= _MAX_DEV:
        raise ValueError(f"limits for {len(limits.memory_mib)} and {len(limits.cores)} GPUs: one value per GPU, "
                         f"1 to {_MAX_DEV} GPUs")
    if limits.gpus and len(limits.gpus) != n:
        raise ValueError(f"{len(limits.gpus)} GPU UUIDs for {n} GPUs")
    if limits.mode not in CORES_MODES:
        raise ValueError(f"cores mode {limits.mode!r} is not one of {', '.join(CORES_MODES)}")
    if limits.oversub_mib and (len(limits.oversub_mib) != n or min(limits.oversub_mib) < 0):
        raise ValueError(f"oversubscription {limits.oversub_mib} for {n} GPUs: one value per GPU, none negative")
    if any(o and not m for o, m in zip(limits.oversub_mib, limits.memory_mib, strict=False)):
        raise ValueError("oversubscription on a GPU without a memory cap")
    if limits.nvml_scale_ppm and (len(limits.nvml_scale_ppm) != n or min(limits.nvml_scale_ppm) < 0):
        raise ValueError(f"NVML scales {limits.nvml_scale_ppm} for {n} GPUs: one value per GPU, none negative")
    data = bytearray(_LIMITS_SIZE)
    struct.pack_into("<QII", data, 0, _LIMITS_MAGIC, 1, n)
    for i, (mib, cores) in enumerate(zip(limits.memory_mib, limits.cores, strict=True)):
        if mib < 0 or not 0 < cores <= 100:
            raise ValueError(f"GPU {i}: memory {mib} MiB / cores {cores} % out of range")
        struct.pack_into("<Q", data, _L_LIMIT + 8 * i, mib << 20)
        struct.pack_into("<Q", data, _L_CORES + 8 * i, 0 if cores >= 100 else max(1, round(cores * _PPM / 100)))
    struct.pack_into("<Q", data, _L_MODE, CORES_MODES.index(limits.mode))
    for i, mib in enumerate(limits.oversub_mib):
        struct.pack_into("<Q", data, _L_OVERSUB + 8 * i, mib << 20)
    for i, ppm in enumerate(limits.nvml_scale_ppm):
        struct.pack_into("<Q", data, _L_NVML_SCALE + 8 * i, ppm)
    for i, uuid in enumerate(limits.gpus):
        raw = uuid.encode()
        if len(raw) >= _UUID_LEN:
            raise ValueError(f"GPU UUID {uuid!r} is too long")
        data[_L_UUID + _UUID_LEN * i:_L_UUID + _UUID_LEN * i + len(raw)] = raw
    raw = limits.accounting_dir.encode()
    if not raw.startswith(b"/") or len(raw) >= _ACCOUNTING_LEN:
        raise ValueError(f"accounting directory {limits.accounting_dir!r} is not an absolute path under 256 bytes")
    data[_L_ACCOUNTING:_L_ACCOUNTING + len(raw)] = raw
    return bytes(data)


def write_limits(directory: Path, limits: HookLimits) -> Path:
    """Write <directory>/limits.v1 atomically (a container starting meanwhile sees the old file or the new
    one, never half of one); readable by every user, writable by the agent only."""
    data = limits_bytes(limits)
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o755)
    path = directory / LIMITS_FILE
    tmp = directory / f".{LIMITS_FILE}.{os.getpid()}.tmp"
    tmp.write_bytes(data)
    tmp.chmod(0o644)
    os.replace(tmp, path)
    return path


def read_limits(directory: Path) -> dict[str, Any] | None:
    """What limits.v1 in `directory` (a limits directory) grants, or None without a valid file."""
    try:
        data = (directory / LIMITS_FILE).read_bytes()
    except OSError:
        return None
    if len(data) < _LIMITS_SIZE or struct.unpack_from("<Q", data, 0)[0] != _LIMITS_MAGIC:
        return None
    ndev = min(struct.unpack_from("<I", data, 12)[0], _MAX_DEV)
    return {
        "limit": list(struct.unpack_from(f"<{_MAX_DEV}Q", data, _L_LIMIT)),
        "cores": list(struct.unpack_from(f"<{_MAX_DEV}Q", data, _L_CORES)),
        "mode": struct.unpack_from("<Q", data, _L_MODE)[0],
        "squeeze": list(struct.unpack_from(f"<{_MAX_DEV}Q", data, _L_SQUEEZE)),
        "oversub": list(struct.unpack_from(f"<{_MAX_DEV}Q", data, _L_OVERSUB)),
        "nvml_scale": list(struct.unpack_from(f"<{_MAX_DEV}Q", data, _L_NVML_SCALE)),
        "ndev": ndev,
    }


# ---- cu_masks.v1: the CUs each GPU of an AMD container may run on --------------------------------------
# Beside limits.v1 in the container's limits directory (read-only in the container); the HIP library applies
# each device's mask to every HSA queue of the process (docs/hook-hip.md, "Compute on AMD"). Little-endian,
# CU_MASKS_SIZE bytes: u64 magic, u32 version (1), u32 ndev (<= 16, limits.v1's device order), then per
# device at 16 + 136*i: u32 ncu (the card's CUs; 0 = no mask: every CU), u32 reserved (0), u32 bits[32]
# (bit j = CU j usable; bit j of the mask is bits[j // 32] >> (j % 32) & 1). native/hip/gph.h has the C side.
CU_MASKS_FILE = "cu_masks.v1"
CU_MASKS_MAGIC = 0x314B534D55435047  # "GPCUMSK1"
CU_MASKS_MAX_CUS = 1024
_CU_DEV_OFFSET, _CU_DEV_SIZE, _CU_WORDS = 16, 136, 32
CU_MASKS_SIZE = _CU_DEV_OFFSET + _MAX_DEV * _CU_DEV_SIZE


@dataclass(frozen=True, slots=True)
class CuMask:
    """The compute units of one card a container's queues may run on: CU j of `card_cus` is usable when j is
    in `cus`."""

    card_cus: int
    cus: frozenset[int]

    def __post_init__(self) -> None:
        if not 0 < self.card_cus <= CU_MASKS_MAX_CUS:
            raise ValueError(f"CU mask: a card of {self.card_cus} CUs is outside 1..{CU_MASKS_MAX_CUS}")
        if not self.cus:
            raise ValueError(f"CU mask of a {self.card_cus}-CU card is empty: it would allow no CU at all")
        bad = sorted(c for c in self.cus if not 0 <= c < self.card_cus)
        if bad:
            raise ValueError(f"CU mask names CUs {bad[:8]} outside the card's 0..{self.card_cus - 1}")


def cu_masks_bytes(masks: Sequence[CuMask | None]) -> bytes:
    """cu_masks.v1 for `masks`, one per GPU of the container in limits.v1's order (None: no mask)."""
    if len(masks) > _MAX_DEV:
        raise ValueError(f"CU masks for {len(masks)} GPUs: at most {_MAX_DEV}")
    data = bytearray(CU_MASKS_SIZE)
    struct.pack_into("<QII", data, 0, CU_MASKS_MAGIC, 1, len(masks))
    for i, mask in enumerate(masks):
        if mask is None:
            continue
        words = [0] * _CU_WORDS
        for cu in mask.cus:
            words[cu // 32] |= 1 << (cu % 32)
        struct.pack_into(f"<II{_CU_WORDS}I", data, _CU_DEV_OFFSET + _CU_DEV_SIZE * i, mask.card_cus, 0, *words)
    return bytes(data)


def write_cu_masks(limits_dir: Path, masks: Sequence[CuMask | None]) -> None:
    """Write <limits_dir>/cu_masks.v1 atomically (a process starting meanwhile reads the old file or the new
    one, never half of one); readable by every user, writable by the agent only, like limits.v1."""
    data = cu_masks_bytes(masks)
    limits_dir.mkdir(parents=True, exist_ok=True)
    limits_dir.chmod(0o755)
    tmp = limits_dir / f".{CU_MASKS_FILE}.{os.getpid()}.tmp"
    tmp.write_bytes(data)
    tmp.chmod(0o644)
    os.replace(tmp, limits_dir / CU_MASKS_FILE)


def parse_cu_masks(data: bytes, where: str = CU_MASKS_FILE) -> tuple[CuMask | None, ...]:
    """The masks in the bytes of a cu_masks.v1; ValueError naming `where` and the fault for anything the HIP
    library would refuse as garbled (it then refuses every queue)."""
    if len(data) != CU_MASKS_SIZE:
        raise ValueError(f"{where}: {len(data)} bytes, not {CU_MASKS_SIZE}")
    magic, version, ndev = struct.unpack_from("<QII", data, 0)
    if magic != CU_MASKS_MAGIC or version != 1:
        raise ValueError(f"{where}: not a version 1 CU mask file (magic {magic:#x}, version {version})")
    if ndev > _MAX_DEV:
        raise ValueError(f"{where}: {ndev} devices, at most {_MAX_DEV}")
    out: list[CuMask | None] = []
    for i in range(ndev):
        ncu, reserved, *words = struct.unpack_from(f"<II{_CU_WORDS}I", data, _CU_DEV_OFFSET + _CU_DEV_SIZE * i)
        if reserved:
            raise ValueError(f"{where}: device {i}: reserved word is {reserved:#x}, not 0")
        cus = frozenset(32 * w + b for w, word in enumerate(words) for b in range(32) if word >> b & 1)
        if ncu == 0:
            if cus:
                raise ValueError(f"{where}: device {i}: CU bits set without a CU count")
            out.append(None)
            continue
        if ncu > CU_MASKS_MAX_CUS or not cus or max(cus) >= ncu:
            raise ValueError(f"{where}: device {i}: mask of {len(cus)} CUs (highest {max(cus, default=-1)}) "
                             f"does not fit a card of {ncu} CUs (1..{CU_MASKS_MAX_CUS})")
        out.append(CuMask(ncu, cus))
    return tuple(out)


def read_cu_masks(path: Path) -> tuple[CuMask | None, ...]:
    """The masks in the cu_masks.v1 file at `path`, one per GPU (None: no mask). OSError when it cannot be
    read, ValueError naming the file when it is garbled."""
    return parse_cu_masks(path.read_bytes(), str(path))


def prepare_hook_pod(root: Path, pod: HookPod, pods_on_node: Iterable[Mapping[str, Any]]) -> bool:
    """At Allocate: create this container's directory, and remove those of pods no longer on the node. Does
    nothing (False) where `gpupool agent` did not install the library: an embedded agent (tests, demo)
    never writes to the host's /run."""
    if not hook_paths(root).pods.is_dir():
        return False
    prepare_pod(pod)
    live = {str((p.get("metadata") or {}).get("uid")) for p in pods_on_node}
    remove_gone(root, live | {pod.uid})
    return True


def remove_gone(root: Path, live_uids: Iterable[str]) -> list[str]:
    """Remove the hook directories of pods that are no longer on the node; returns their UIDs."""
    pods = hook_paths(root).pods
    keep = set(live_uids)
    removed = []
    with contextlib.suppress(FileNotFoundError):
        for entry in pods.iterdir():
            if entry.is_dir() and valid_uid(entry.name) and entry.name not in keep:
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry.name)
    return removed


# ---- reading usage ------------------------------------------------------------------------------------
def _held_by_someone(fd: int, offset: int) -> bool:
    probe = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, offset, 1, 0)
    answer = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, probe)
    kind: int = struct.unpack_from("h", answer)[0]
    return kind != fcntl.F_UNLCK


def read_usage(directory: Path) -> list[PodGpuUsage]:
    """One record per GPU of the directory's container (of the pod, for an older agent's pod-wide
    directory); [] when the library has not written (or not finished) the file."""
    usage = _usage_path(directory)
    try:
        fd = os.open(usage, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        data = os.read(fd, _FILE_SIZE)
        if len(data) < _FILE_SIZE or struct.unpack_from("<Q", data, 0)[0] != _MAGIC:
            return []
        ndev = min(struct.unpack_from("<I", data, 12)[0], _MAX_DEV)
        limits = struct.unpack_from(f"<{_MAX_DEV}Q", data, 16)
        cores = struct.unpack_from(f"<{_MAX_DEV}Q", data, 144)
        (mode,) = struct.unpack_from("<Q", data, 272)
        live = [i for i in range(_SLOTS) if struct.unpack_from("<q", data, _SLOT_OFFSET + i * _SLOT_SIZE)[0] != 0
                and _held_by_someone(fd, 1 + i)]
    finally:
        os.close(fd)
    granted = read_limits(limits_dir(directory))
    squeezes = struct.unpack_from(f"<{_MAX_DEV}Q", data, _SQUEEZE_OFFSET)
    if granted is not None:  # the agent's own file, not the copy the container can rewrite
        limits, cores, mode, squeezes = granted["limit"], granted["cores"], granted["mode"], granted["squeeze"]
        ndev = granted["ndev"]
    info = _pod_info(directory)
    gpus = info.get("gpus") or []
    out = []
    for d in range(ndev):
        used = 0
        for i in live:
            base = _SLOT_OFFSET + i * _SLOT_SIZE + 8  # after the pid: used[16], then ctx[16]
            used += struct.unpack_from("<Q", data, base + 8 * d)[0]
            used += struct.unpack_from("<Q", data, base + 128 + 8 * d)[0]
        (busy_ns,) = struct.unpack_from("<Q", data, _DEV_OFFSET + 64 * d + 40)
        squeeze = squeezes[d]
        out.append(PodGpuUsage(
            pod_uid=str(info.get("uid") or directory.name), label=str(info.get("pod", "")),
            gpu=str(gpus[d]) if d < len(gpus) else str(d), limit_bytes=limits[d], used_bytes=used,
            busy_seconds=busy_ns / 1e9, cores_percent=(cores[d] or _PPM) / 1e4,
            mode=CORES_MODES[1] if mode else CORES_MODES[0],
            processes=len(live), squeeze_percent=squeeze / 1e4, container=str(info.get("container", "")),
        ))
    return out


def learnt_scales(accounting: Path) -> tuple[int, ...]:
    """NVML's scale the library learnt on each of its GPUs (ppm, by the library's device index; 0 where it
    learnt none or wrote a value it would not use itself), from usage.v1 in the accounting directory
    `accounting`; empty without a valid file. Only for a process of the agent's own (its caps probe): a
    tenant can write its usage.v1."""
    try:
        data = (accounting / USAGE_FILE).read_bytes()[:_SLOT_OFFSET]
    except OSError:
        return ()
    if len(data) < _SLOT_OFFSET or struct.unpack_from("<Q", data, 0)[0] != _MAGIC:
        return ()
    ndev = min(struct.unpack_from("<I", data, 12)[0], _MAX_DEV)
    raw = struct.unpack_from(f"<{ndev}q", data, _LEARNT_SCALE_OFFSET)
    return tuple(v if _SCALE_MIN_PPM <= v <= _SCALE_MAX_PPM else 0 for v in raw)


def _usage_path(directory: Path) -> Path:
    """usage.v1 of a container directory: in its accounting subdirectory, or (agents before limits.v1
    mounted the container directory itself) directly in it."""
    inner = accounting_dir(directory) / USAGE_FILE
    return inner if inner.exists() else directory / USAGE_FILE


def _pod_info(directory: Path) -> dict[str, Any]:
    try:
        loaded = json.loads((directory / POD_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def read_all(root: Path) -> list[PodGpuUsage]:
    """The usage of every hook directory: each GPU container's, then each DRA claim's and remote share's."""
    pods = hook_paths(root).pods
    out: list[PodGpuUsage] = []
    with contextlib.suppress(FileNotFoundError):
        for entry in sorted(pods.iterdir()):
            if entry.is_dir() and valid_uid(entry.name):
                for directory in hook_dirs(root, entry.name):
                    out.extend(read_usage(directory))
    for base in claim_roots(root):
        with contextlib.suppress(FileNotFoundError):
            for entry in sorted(base.iterdir()):
                if entry.is_dir() and valid_uid(entry.name):
                    out.extend(read_usage(entry))
    return out


# ---- the reclaim squeeze -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SqueezeWritten:
    changed: bool  # a value in the file was different and has been written
    enforced: bool  # the library that made the file honours the squeeze (older ones ignore it)


def _lock_accounting(fd: int, kind: int) -> None:
    """The library's accounting lock (byte 0): held while it creates or resets the file, so the agent never
    writes into a file the library is about to clear."""
    fcntl.fcntl(fd, fcntl.F_OFD_SETLKW, struct.pack("hhqqi4x", kind, os.SEEK_SET, 0, 1, 0))


def write_squeeze(directory: Path, percent: Mapping[int, float]) -> SqueezeWritten | None:
    """Set the squeeze of the directory's container: the compute cap in percent of each of its GPUs (by its
    index among the container's GPUs, the library's order); a GPU not named is not squeezed. None when the
    library has not made the file yet (no process of the container ran): nothing to write into, the caller
    writes again later."""
    wanted = [0] * _MAX_DEV
    for index, value in percent.items():
        if not 0 <= index < _MAX_DEV:
            raise ValueError(f"GPU index {index} is outside the pod's {_MAX_DEV} GPUs")
        if not 0 < value <= 100:
            raise ValueError(f"squeeze of GPU {index}: {value} is not a percent in (0, 100]")
        wanted[index] = 0 if value >= 100 else round(value * _PPM / 100)
    in_limits = _write_limits_squeeze(limits_dir(directory), wanted)
    try:
        fd = os.open(_usage_path(directory), os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return None if in_limits is None else SqueezeWritten(in_limits, True)
    try:
        _lock_accounting(fd, fcntl.F_WRLCK)
        try:
            head = os.pread(fd, _SQUEEZE_OFFSET + 8 * _MAX_DEV, 0)
            if len(head) < _SQUEEZE_OFFSET + 8 * _MAX_DEV or struct.unpack_from("<Q", head, 0)[0] != _MAGIC:
                return None if in_limits is None else SqueezeWritten(in_limits, True)
            (features,) = struct.unpack_from("<Q", head, _FEATURES_OFFSET)
            changed = _pwrite_squeeze(fd, head, _SQUEEZE_OFFSET, wanted)
        finally:
            _lock_accounting(fd, fcntl.F_UNLCK)
    finally:
        os.close(fd)
    # Whether the squeeze holds is the library's own word (its feature bit), limits file or not: the HIP
    # library reads limits.v1 but does not pace compute, so a squeeze written there is not enforced.
    return SqueezeWritten(changed or bool(in_limits), bool(features & FEAT_SQUEEZE))


def _pwrite_squeeze(fd: int, head: bytes, offset: int, wanted: list[int]) -> bool:
    """Write the per-GPU squeeze array at `offset` of a mapped file (usage.v1 or limits.v1) where it differs
    from `head`, the file's current bytes; whether anything changed. One aligned 8-byte write per value: the
    library loads each whole."""
    current = struct.unpack_from(f"<{_MAX_DEV}Q", head, offset)
    changed = False
    for d in range(_MAX_DEV):
        if current[d] != wanted[d]:
            os.pwrite(fd, struct.pack("<Q", wanted[d]), offset + 8 * d)
            changed = True
    return changed


def _write_limits_squeeze(directory: Path, wanted: list[int]) -> bool | None:
    """Rewrite the squeeze in limits.v1 in place (same file, so running libraries, which map it, see it);
    whether a value changed, None without a valid file."""
    try:
        fd = os.open(directory / LIMITS_FILE, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        head = os.pread(fd, _LIMITS_SIZE, 0)
        if len(head) < _LIMITS_SIZE or struct.unpack_from("<Q", head, 0)[0] != _LIMITS_MAGIC:
            return None
        return _pwrite_squeeze(fd, head, _L_SQUEEZE, wanted)
    finally:
        os.close(fd)


def squeeze_by_index(directory: Path, cores_by_uuid: Mapping[str, float]) -> dict[int, float]:
    """The squeeze per GPU index of the directory's container from the squeezed cores per GPU UUID (its
    allocation), in the order pod.json lists the container's GPUs (the order of its NVIDIA_VISIBLE_DEVICES,
    hence the library's); GPUs of the pod that this container does not see are left out."""
    gpus = [str(g) for g in _pod_info(directory).get("gpus") or []]
    return {gpus.index(uuid): cores for uuid, cores in cores_by_uuid.items() if uuid in gpus}
