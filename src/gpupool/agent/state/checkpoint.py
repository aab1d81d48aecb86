"""The agent's node state on disk: one format for the answers the device plugin gave kubelet (this module's
`Checkpoint`, `allocations.json`) and the claims the DRA driver prepared (gpupool.agent.dra.driver, `dra-claims.json`),
so that a repeated Allocate or NodePrepareResources gets the same answer, even from a restarted agent, and a
restarted agent knows what it owns on the node.

The format (version 3), one JSON object per file:

    {"format": "gpupool.io/node-state", "version": 3, "kind": "allocations" | "claims", "node": "<node>",
     "<kind>": [entry, ...], "checksum": "sha256:<hex>"}

The checksum is SHA-256 over the canonical JSON (sorted keys, no spaces, ASCII) of every other field, so an
entry, the node or the version changed by hand or by a damaged disk is caught. Writes are atomic: a temporary
file in the same directory, fsync, rename over the old file, fsync of the directory; a reader sees the old
file or the new one, never half of one, so a crash of the agent can leave a stale temporary file but never a
torn checkpoint.

Older files are still read (`decode_state` with a kind's `legacy` reader) and written back in version 3 at the
next change: `allocations.json` versions 1 (one entry per pod) and 2 (one entry per pod UID and container),
each with a checksum over its entries only; `dra-claims.json` version 1 (no checksum).

A file that cannot be trusted (bad checksum, not JSON, another node's, a version this agent does not know) is a
`CheckpointError`, and the agent does not start (gpupool.agent.service): it is never served from, and it is
not set aside to start empty either, because an agent that forgot what it gave would remove the CDI specs and
limits files of running containers at its start-up sweep (gpupool.agent.state.node_state), could hand a prepared
claim's GPU share out again, and would refuse kubelet's repeats. Rebuilding it from the API is not possible
either: the API holds neither the exact answers nor which MIG device a claim got. The message says what to do.

Allocate's entries: one per served container (the pod's UID and name, the container's name, the device IDs
kubelet asked for, and the exact serialized ContainerAllocateResponse), written *before* the answer is
returned, so whatever the agent answered once it can answer again, byte for byte. Version 1 entries carry
the container "" = "the pod's only GPU container".
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FORMAT = "gpupool.io/node-state"
VERSION = 3
KIND_ALLOCATIONS = "allocations"
KIND_CLAIMS = "claims"
FILE_NAME = "allocations.json"
Key = tuple[str, str]  # (pod UID, container name)
# A reader of one kind's older files: the parsed document -> its entries in version 3's shape (raises
# CheckpointError for a file it cannot trust); None when the document is not one of its versions.
Legacy = Callable[[Mapping[str, Any]], list[dict[str, Any]] | None]


class CheckpointError(ValueError):
    """The node state cannot be used; the message names the file and says why."""


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def checksum(doc: Mapping[str, Any]) -> str:
    """The checksum of a version 3 document: over every field but `checksum` itself."""
    return "sha256:" + hashlib.sha256(_canonical({k: v for k, v in doc.items() if k != "checksum"})).hexdigest()


def encode_state(kind: str, node: str, entries: Iterable[Mapping[str, Any]]) -> bytes:
    doc: dict[str, Any] = {"format": FORMAT, "version": VERSION, "kind": kind, "node": node,
                           kind: [dict(e) for e in entries]}
    doc["checksum"] = checksum(doc)
    return json.dumps(doc, indent=1, sort_keys=True).encode()


def decode_state(text: bytes, kind: str, node: str, legacy: Legacy | None = None) -> list[dict[str, Any]]:
    """The entries of a node-state file of `kind` for `node`; raises CheckpointError when it cannot be trusted."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise CheckpointError(f"not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise CheckpointError("not a JSON object")
    if doc.get("format") != FORMAT:
        old = legacy(doc) if legacy is not None else None
        if old is None:
            raise CheckpointError(f"not a {kind} file of a version this agent reads (format {doc.get('format')!r}, "
                                  f"version {doc.get('version')!r}; it reads version {VERSION} and the ones before)")
        _check_node(doc, node)
        return old
    if doc.get("version") != VERSION:
        raise CheckpointError(f"version {doc.get('version')!r}: written by another gpupool agent (this one reads "
                              f"version {VERSION} and the ones before)")
    if doc.get("checksum") != checksum(doc):
        raise CheckpointError("checksum mismatch: the file was changed or damaged")
    if doc.get("kind") != kind:
        raise CheckpointError(f"holds {doc.get('kind')!r}, not {kind}")
    _check_node(doc, node)
    body = doc.get(kind)
    if not isinstance(body, list) or not all(isinstance(e, dict) for e in body):
        raise CheckpointError(f"{kind} is not a list of objects")
    return body


def _check_node(doc: Mapping[str, Any], node: str) -> None:
    if doc.get("node") != node:
        raise CheckpointError(f"written for node {doc.get('node')!r}, this is node {node!r}")


def untrusted(path: Path, why: str) -> CheckpointError:
    """The error that stops the agent at a node-state file it cannot trust, with what to do about it."""
    return CheckpointError(
        f"node state {path} cannot be trusted: {why}. The agent does not serve from it and does not start: "
        "starting without it would forget what running containers were given (the start-up sweep would remove "
        "their CDI specs and limits files, and their GPU shares could be handed out again). Drain the node, "
        "then move the file away (the agent then starts with no state), or put back a good copy"
    )


def read_state(path: Path, kind: str, node: str, legacy: Legacy | None = None) -> list[dict[str, Any]]:
    """The entries of the file at `path` ([] when there is none); CheckpointError (see `untrusted`) otherwise."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # the temporary file of a write a crash interrupted: never renamed, so never part of the state
        path.with_name(f".{path.name}.tmp").unlink(missing_ok=True)
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as e:
        raise CheckpointError(
            f"cannot use the node state directory {path.parent} (agent setting checkpoint_dir): {e.strerror or e}"
        ) from None
    try:
        return decode_state(data, kind, node, legacy)
    except CheckpointError as e:
        raise untrusted(path, str(e)) from None


def write_state(path: Path, kind: str, node: str, entries: Iterable[Mapping[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, encode_state(kind, node, entries))


def write_atomically(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so that a crash at any point leaves either the old or the new file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)  # a leftover of a crash mid-write; created afresh so the mode below holds
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself is durable only once the directory is
    finally:
        os.close(dir_fd)


# --- Allocate's entries (allocations.json) ------------------------------------------------------------------


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


def _entries_checksum(entries: list[Any]) -> str:
    """The checksum of versions 1 and 2: over the entries only."""
    return hashlib.sha256(json.dumps(entries, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def allocations_legacy(doc: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """allocations.json of versions 1 and 2: {"version", "node", "entries", "checksum" over the entries}."""
    if "format" in doc or doc.get("version") not in (1, 2):
        return None
    body = doc.get("entries")
    if not isinstance(body, list) or doc.get("checksum") != _entries_checksum(body):
        raise CheckpointError(f"checksum mismatch (version {doc.get('version')}): the file was changed or damaged")
    return list(body)  # each entry is checked as it is read (Served.from_json)


def encode(node: str, entries: Iterable[Served]) -> bytes:
    return encode_state(KIND_ALLOCATIONS, node, [e.to_json() for e in sorted(entries, key=lambda e: e.key)])


def decode(text: bytes, node: str) -> dict[Key, Served]:
    entries = [Served.from_json(e) for e in decode_state(text, KIND_ALLOCATIONS, node, allocations_legacy)]
    return {e.key: e for e in entries}


class Checkpoint:
    """The served containers of this node, by (pod UID, container), mirrored in `<directory>/allocations.json`."""

    def __init__(self, directory: Path, node: str) -> None:
        self.directory = directory
        self.node = node
        self.path = directory / FILE_NAME
        self.entries: dict[Key, Served] = {}

    def load(self) -> None:
        """Read the file (none: no entries). Raises CheckpointError when it cannot be trusted or the directory
        cannot be used: without its answers the agent could not answer a repeat the same way."""
        body = read_state(self.path, KIND_ALLOCATIONS, self.node, allocations_legacy)
        try:
            entries = [Served.from_json(e) for e in body]
        except CheckpointError as e:
            raise untrusted(self.path, str(e)) from None
        self.entries = {e.key: e for e in entries}

    def _write(self, entries: dict[Key, Served]) -> None:
        write_atomically(self.path, encode(self.node, entries.values()))
        self.entries = entries

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
        self._write(entries)

    def prune(self, keep: Collection[str]) -> bool:
        """Drop entries of pods not in `keep`; writes only when something was dropped."""
        entries = {key: e for key, e in self.entries.items() if key[0] in keep}
        if len(entries) == len(self.entries):
            return False
        self._write(entries)
        return True
