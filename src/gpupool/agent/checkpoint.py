"""The agent's record of the answers it gave kubelet, kept on the node's disk so that a repeated Allocate
gets the same answer, even from a restarted agent.

Kubelet's Allocate names devices, never a pod, and kubelet may ask again for the same container (after its
own restart, before it wrote its checkpoint). The agent writes one entry per served container — the pod's UID
and name, the container's name, the device IDs kubelet asked for, and the exact serialized
ContainerAllocateResponse — *before* it returns the answer (NVIDIA's DRA driver keeps its prepared claims
the same way), so whatever the agent answered once it can answer again, byte for byte.

Writes are atomic: a temporary file in the same directory, fsync, rename over the old file, fsync of the
directory. A reader sees the old checkpoint or the new one, never half of one. A checksum over the entries
catches a file damaged some other way; an unreadable file is moved aside and the agent starts with an empty
checkpoint (repeats are then refused, never answered with a guess).

Version 2 keys entries by (pod UID, container). Version 1 files (one entry per pod, no container: the agent
then served one GPU container per pod) are still read; their entries carry the container "" =
"the pod's only GPU container".
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FILE_NAME = "allocations.json"
VERSION = 2
READABLE_VERSIONS = (1, 2)
Key = tuple[str, str]  # (pod UID, container name)


class CheckpointError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Served:
    """One answer given to kubelet: for which pod and container, for which devices, and the answer itself."""

    pod_uid: str
    namespace: str
    name: str
    devices: tuple[str, ...]  # sorted: kubelet's order is not part of the identity
    response: bytes  # the serialized ContainerAllocateResponse
    time: str
    container: str = ""  # "" in entries read from a version 1 file: the pod's only GPU container

    @property
    def label(self) -> str:
        return f"{self.namespace}/{self.name}" + (f" container {self.container}" if self.container else "")

    @property
    def key(self) -> Key:
        return self.pod_uid, self.container

    def to_json(self) -> dict[str, Any]:
        return {
            "podUID": self.pod_uid,
            "namespace": self.namespace,
            "name": self.name,
            "devices": list(self.devices),
            "response": base64.b64encode(self.response).decode("ascii"),
            "time": self.time,
            "container": self.container,
        }

    @staticmethod
    def from_json(data: Any) -> Served:
        try:
            devices = tuple(sorted(str(d) for d in data["devices"]))
            return Served(
                pod_uid=str(data["podUID"]),
                namespace=str(data["namespace"]),
                name=str(data["name"]),
                devices=devices,
                response=base64.b64decode(data["response"], validate=True),
                time=str(data.get("time", "")),
                container=str(data.get("container", "")),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"bad entry {str(data)[:200]!r}: {e!r}") from None


def _checksum(entries: list[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(entries, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def encode(node: str, entries: Iterable[Served]) -> bytes:
    body = [e.to_json() for e in sorted(entries, key=lambda e: e.key)]
    doc = {"version": VERSION, "node": node, "entries": body, "checksum": _checksum(body)}
    return json.dumps(doc, indent=1, sort_keys=True).encode()


def decode(text: bytes, node: str) -> dict[Key, Served]:
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise CheckpointError(f"not JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("version") not in READABLE_VERSIONS:
        raise CheckpointError(f"expected a checkpoint of version {' or '.join(map(str, READABLE_VERSIONS))}")
    if doc.get("node") != node:
        raise CheckpointError(f"written for node {doc.get('node')!r}, this is node {node!r}")
    body = doc.get("entries")
    if not isinstance(body, list) or doc.get("checksum") != _checksum(body):
        raise CheckpointError("checksum mismatch: the file was changed or damaged")
    entries = [Served.from_json(e) for e in body]
    return {e.key: e for e in entries}


def write_atomically(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so that a crash at any point leaves either the old or the new file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)  # a leftover of a crash mid-write; created afresh so the mode below holds
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself is durable only once the directory is
    finally:
        os.close(dir_fd)


class Checkpoint:
    """The served containers of this node, by (pod UID, container), mirrored in `<directory>/allocations.json`."""

    def __init__(self, directory: Path, node: str) -> None:
        self.directory = directory
        self.node = node
        self.path = directory / FILE_NAME
        self.entries: dict[Key, Served] = {}

    def load(self) -> str | None:
        """Read the file; returns a warning when it had to be set aside (the agent logs it). Raises
        CheckpointError when the directory cannot be created or read: without a checkpoint the agent could
        not answer a repeat the same way, so it does not start."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            data = self.path.read_bytes()
        except FileNotFoundError:
            self.entries = {}
            return None
        except OSError as e:
            raise CheckpointError(
                f"cannot use the Allocate checkpoint directory {self.directory} (agent setting checkpoint_dir): "
                f"{e.strerror or e}"
            ) from None
        try:
            self.entries = decode(data, self.node)
            return None
        except CheckpointError as e:
            aside = self.path.with_name(self.path.name + ".unreadable")
            with contextlib.suppress(OSError):
                os.replace(self.path, aside)
            self.entries = {}
            return f"checkpoint {self.path} unreadable ({e}); moved to {aside.name}, starting empty"

    def for_devices(self, devices: Collection[str]) -> list[Served]:
        """Entries that were answered for exactly these device IDs."""
        wanted = tuple(sorted(devices))
        return [e for e in self.entries.values() if e.devices == wanted]

    def for_pod(self, pod_uid: str) -> dict[str, Served]:
        """The served containers of one pod, by container name."""
        return {e.container: e for e in self.entries.values() if e.pod_uid == pod_uid}

    def pods(self) -> set[str]:
        return {e.pod_uid for e in self.entries.values()}

    def record(self, served: Served, keep: Collection[str]) -> None:
        """Add `served` and drop entries whose pod UID is not in `keep` (pods gone or finished), then write."""
        entries = {key: e for key, e in self.entries.items() if key[0] in keep}
        entries[served.key] = served
        write_atomically(self.path, encode(self.node, entries.values()))
        self.entries = entries

    def prune(self, keep: Collection[str]) -> bool:
        """Drop entries of pods not in `keep`; writes only when something was dropped."""
        entries = {key: e for key, e in self.entries.items() if key[0] in keep}
        if len(entries) == len(self.entries):
            return False
        write_atomically(self.path, encode(self.node, entries.values()))
        self.entries = entries
        return True
