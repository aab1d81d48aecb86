"""Isolation `remote` (DRA claims only; docs/remote.md): no GPU of this node. The container gets the
forwarding library as its libcuda.so.1 and the claim's remote directory, with the claim's token (derived
from the cluster's key: the tenant never chooses it) and the address of the server its share is served
from; on the GPU's own node also that server's unix socket, so the data never leaves the node.

The same protocol as the other modes (gpupool.agent.isolation.base): `check` (the agent holds the cluster's
key), `grant` (environment and mounts), `prepare` (the token and server files), `release` (nothing: a
claim's directory goes when it is unprepared). The DRA driver (gpupool.agent.dra.driver) finds the server's
address first (`GrantRequest.remote_server`) and writes the CDI spec of the grant after `prepare`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpupool.agent.config import AgentConfig
from gpupool.agent.isolation.base import ISOLATION_MODES, GrantRequest, ModeGrant, MountSpec, Prepared, Refused
from gpupool.agent.state.checkpoint import write_atomically
from gpupool.agent.state.hookdir import claim_dir
from gpupool.api.dra import remote_token
from gpupool.api.isolation import IsolationMode

# In the container (docs/remote.md): the forwarding library is the container's libcuda.so.1; the claim's
# token and its server's address are files of one directory, mounted whole (read-only) so that the address
# the agent rewrites when the share moves (temporary file, rename) is seen by running containers (a file
# mount would keep the old inode); on the GPU's own node the server's unix socket.
REMOTE_LIBRARY_DIR = "/usr/lib/gpupool/remote"
REMOTE_LIBRARY = f"{REMOTE_LIBRARY_DIR}/libcuda.so.1"
REMOTE_CLAIM_DIR = "/run/gpupool/remote/claim"
REMOTE_TOKEN = f"{REMOTE_CLAIM_DIR}/token"
REMOTE_SERVER_FILE = f"{REMOTE_CLAIM_DIR}/server"
REMOTE_SOCKET_DIR = "/run/gpupool/remote/socket"  # the node's unix-socket server's directory (remote.serving)
REMOTE_SOCKET = f"{REMOTE_SOCKET_DIR}/server.sock"
CLAIM_REMOTE_DIR = "remote"  # in the claim's directory (claim_dir) on the pod's node: `token` and `server`


@dataclass(frozen=True, slots=True)
class RemoteClient:
    """What the agent needs to prepare claims of isolation remote for pods of this node."""

    key: bytes | None  # the cluster's remote key (None: not configured: such claims are refused)
    library: Path  # the forwarding library on the host, mounted as the container's libcuda.so.1
    socket: Path | None = None  # this node's GPU server's unix socket (None: this node serves no remote shares)


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


class RemoteIsolation:
    """`remote`: the forwarding library and the claim's remote directory; the GPU server on the share's node
    holds the share to its grant (gpupool.agent.remote.serving)."""

    name = IsolationMode.REMOTE
    second_line = False  # no process of the container runs on a GPU of this node

    def __init__(self, config: AgentConfig, client: RemoteClient | None) -> None:
        self.config = config
        self.client = client

    def check(self, request: GrantRequest) -> Refused | None:
        label = request.pod_label
        if not request.claim:  # a pod's allocation never names it: what the device plugin answered before
            modes = ", ".join(sorted(ISOLATION_MODES))
            return Refused(f"pod {label}: unknown isolation {request.doc.isolation!r} (use {modes})")
        if self.client is None or self.client.key is None:
            return Refused(f"claim {label}: isolation remote, but the agent on {self.config.node_name} has no "
                           "remote key (agent setting remote_key_file; chart value dra.remote.enabled)")
        return None

    def grant(self, request: GrantRequest, prepared: Prepared) -> ModeGrant | Refused:
        client = self.client
        if client is None:
            return Refused(f"claim {request.pod_label}: isolation remote, but the agent has no remote client")
        try:
            directory = remote_claim_dir(request.config.hook_root, request.doc.pod_uid)
        except ValueError as e:
            return Refused(f"claim {request.pod_label}: {e}")
        mounts = [MountSpec(REMOTE_LIBRARY, str(client.library), read_only=True),
                  MountSpec(REMOTE_CLAIM_DIR, str(directory), read_only=True)]
        if client.socket is not None and request.remote_socket:
            # the GPU is here: its server's unix socket, so the data never leaves the node
            mounts.append(MountSpec(REMOTE_SOCKET_DIR, str(client.socket.parent), read_only=True))
        envs = {"LD_LIBRARY_PATH": REMOTE_LIBRARY_DIR, "GPUPOOL_REMOTE_TOKEN_FILE": REMOTE_TOKEN,
                "GPUPOOL_REMOTE_SERVER_FILE": REMOTE_SERVER_FILE, "GPUPOOL_ISOLATION": self.name.value}
        return ModeGrant(envs=envs, mounts=mounts)

    async def prepare(self, request: GrantRequest) -> Prepared | Refused:
        """The claim's token and its server's address, in the directory `grant` mounts."""
        uid, label = request.doc.pod_uid, request.pod_label
        if self.client is None or self.client.key is None:
            return Refused(f"claim {label}: isolation remote, but the agent has no remote key")
        try:
            directory = remote_claim_dir(request.config.hook_root, uid)
            await asyncio.to_thread(write_public, directory / "token", remote_token(self.client.key, uid))
            await asyncio.to_thread(write_address, directory, request.remote_server)
        except (OSError, ValueError) as e:
            return Refused(f"cannot write the remote directory or CDI spec of claim {label}: {e}", retry=True)
        return Prepared()

    async def release(self, pods: Sequence[Mapping[str, Any]], node: str, claims: Collection[str] = ()) -> None:
        return None  # the claim's remote directory is part of its claim directory, removed at unprepare

    def inventory_fields(self) -> dict[str, dict[str, Any]]:
        return {}
