"""Isolation remote on the pod's node (docs/remote.md): what a remote claim's containers get (the forwarding
library as libcuda.so.1, the claim's directory with its token and its server's address, on the GPU's own
node the server's unix socket) and where the server of a share is found (its pool's ResourceSlice)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpupool.agent.port import AgentCluster
from gpupool.agent.state.checkpoint import write_atomically
from gpupool.agent.state.hookdir import claim_dir
from gpupool.api.dra import ATTR_REMOTE_SERVER, slice_name

# Isolation remote, in the container (docs/remote.md): the forwarding library is the container's libcuda.so.1;
# the claim's token and its server's address are files of one directory, mounted whole (read-only) so that
# the address the agent rewrites when the share moves (temporary file, rename) is seen by running containers
# (a file mount would keep the old inode); on the GPU's own node the server's unix socket.
REMOTE_LIBRARY_DIR = "/usr/lib/gpupool/remote"
REMOTE_LIBRARY = f"{REMOTE_LIBRARY_DIR}/libcuda.so.1"
REMOTE_CLAIM_DIR = "/run/gpupool/remote/claim"
REMOTE_TOKEN = f"{REMOTE_CLAIM_DIR}/token"
REMOTE_SERVER_FILE = f"{REMOTE_CLAIM_DIR}/server"
REMOTE_SOCKET_DIR = "/run/gpupool/remote/socket"  # the node's unix-socket server's directory (remote.serving)
REMOTE_SOCKET = f"{REMOTE_SOCKET_DIR}/server.sock"
CLAIM_REMOTE_DIR = "remote"  # in the claim's directory (claim_dir) on the pod's node: `token` and `server`
# what a slice may name as a server: the address becomes a container's environment, so nothing but this
_REMOTE_ADDRESS = re.compile(r"^tcp:[A-Za-z0-9.:\[\]-]{1,56}:\d{1,5}$")


def remote_claim_dir(hook_root: Path, uid: str) -> Path:
    """The host directory mounted at REMOTE_CLAIM_DIR in a remote claim's containers; ValueError for a bad UID."""
    return claim_dir(hook_root, uid) / CLAIM_REMOTE_DIR


def write_public(path: Path, text: str) -> None:
    """One file of the claim's remote directory (its token, its server's address), readable by any user of the
    container (its processes may run as any user): the directory is mounted into this claim's containers
    only. Written whole and renamed, so a process starting while it changes reads the old or the new line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(0o755)
    write_atomically(path, text.encode())
    path.chmod(0o644)


def write_address(directory: Path, address: str) -> bool:
    """The claim's server file says `address` (one line); True when it changed."""
    path = directory / "server"
    with contextlib.suppress(OSError):
        if path.read_text() == address + "\n":
            return False
    write_public(path, address + "\n")
    return True


@dataclass(frozen=True, slots=True)
class RemoteClient:
    """What the agent needs to prepare claims of isolation remote for pods of this node."""

    key: bytes | None  # the cluster's remote key (None: not configured: such claims are refused)
    library: Path  # the forwarding library on the host, mounted as the container's libcuda.so.1
    socket: Path | None = None  # this node's GPU server's unix socket (None: this node serves no remote shares)


def _slice_device(obj: Mapping[str, Any] | None, device: str) -> Mapping[str, Any] | None:
    for d in ((obj or {}).get("spec") or {}).get("devices") or []:
        if d.get("name") == device:
            return dict(d)
    return None


async def remote_address(cluster: AgentCluster, pool: str, device: str) -> str | None:
    """The GPU server a pool's device is served by: attribute remoteServer of the device in the pool's slices
    (its node's agent writes them while its TCP server listens); None when there is none or it is not a
    tcp:HOST:PORT (it becomes a file containers read and a move's target: nothing else may pass)."""
    first = await cluster.get_slice(slice_name(pool))
    found = _slice_device(first, device)
    count = int((((first or {}).get("spec") or {}).get("pool") or {}).get("resourceSliceCount", 1) or 1)
    for k in range(1, min(count, 64)):  # bounded: a pool of at most MAX_GPUS_PER_NODE devices
        if found is not None:
            break
        found = _slice_device(await cluster.get_slice(f"{slice_name(pool)}-{k}"), device)
    attr = ((found or {}).get("attributes") or {}).get(ATTR_REMOTE_SERVER) or {}
    address = attr.get("string") if isinstance(attr, Mapping) else None
    return address if isinstance(address, str) and _REMOTE_ADDRESS.match(address) else None
