"""The Allocate checkpoint on disk: round trip, atomic replacement, damage detection, pruning."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.agent.state.checkpoint import Checkpoint, CheckpointError, Served, decode, encode

NODE = "node-1"


def served(
    uid: str, devices: tuple[str, ...] = ("GPU-a::0",), response: bytes = b"\x0a\x01x", container: str = "main"
) -> Served:
    return Served(uid, "ns", f"pod-{uid}", devices, response, "2026-11-24T09:00:00Z", container)


def test_entries_survive_a_reload_and_are_found_by_their_exact_devices(tmp_path: Path) -> None:
    c = Checkpoint(tmp_path, NODE)
    assert c.load() is None and c.entries == {}
    c.record(served("u1", ("GPU-a::0", "GPU-b::1")), keep=set())
    c.record(served("u2", ("GPU-a::1",)), keep={"u1"})
    again = Checkpoint(tmp_path, NODE)
    assert again.load() is None
    assert again.entries == c.entries
    # the device order kubelet used does not matter; a subset or superset is another call
    assert [e.pod_uid for e in again.for_devices(["GPU-b::1", "GPU-a::0"])] == ["u1"]
    assert again.for_devices(["GPU-a::0"]) == []


def test_record_drops_pods_that_are_gone(tmp_path: Path) -> None:
    c = Checkpoint(tmp_path, NODE)
    c.record(served("u1"), keep=set())
    c.record(served("u2"), keep=set())  # u1 is no longer alive on the node
    assert set(c.entries) == {("u2", "main")}
    assert c.prune({"u2"}) is False  # nothing to drop: no write
    assert c.prune(set()) is True and c.entries == {}
    reloaded = Checkpoint(tmp_path, NODE)
    reloaded.load()
    assert reloaded.entries == {}


def test_a_damaged_file_stops_the_agent_and_stays_as_it_is(tmp_path: Path) -> None:
    c = Checkpoint(tmp_path, NODE)
    c.record(served("u1"), keep=set())
    text = c.path.read_text().replace("pod-u1", "pod-u9")  # an edit the checksum covers
    c.path.write_text(text)
    damaged = Checkpoint(tmp_path, NODE)
    with pytest.raises(CheckpointError, match="checksum mismatch.*does not serve from it and does not start"):
        damaged.load()
    assert damaged.entries == {}
    assert c.path.read_text() == text  # not moved or rewritten: the admin decides


def test_a_checkpoint_of_another_node_is_not_trusted(tmp_path: Path) -> None:
    Checkpoint(tmp_path, "node-2").record(served("u1"), keep=set())
    c = Checkpoint(tmp_path, NODE)
    with pytest.raises(CheckpointError, match="written for node 'node-2', this is node 'node-1'"):
        c.load()
    assert c.entries == {}


def test_a_crash_while_writing_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    c = Checkpoint(tmp_path, NODE)
    c.record(served("u1"), keep=set())
    # a crash after writing the temporary file, before the rename: the temporary file is left over
    (tmp_path / ".allocations.json.tmp").write_bytes(b'{"half": ')
    again = Checkpoint(tmp_path, NODE)
    assert again.load() is None and set(again.entries) == {("u1", "main")}
    again.record(served("u2"), keep={"u1"})  # and the next write replaces the leftover
    assert set(decode(c.path.read_bytes(), NODE)) == {("u1", "main"), ("u2", "main")}
    assert oct(os.stat(c.path).st_mode & 0o777) == "0o600"


uids = st.text("abcdef0123456789-", min_size=1, max_size=12)
entries = st.lists(
    st.builds(
        served,
        uids,
        st.lists(st.text("GPU-ab:0123", min_size=1, max_size=10), min_size=1, max_size=4).map(
            lambda d: tuple(sorted(d))
        ),
        st.binary(max_size=64),
        container=st.sampled_from(["main", "init", "side"]),
    ),
    max_size=5,
    unique_by=lambda e: e.key,
)


@given(entries)
def test_encode_decode_round_trip(items: list[Served]) -> None:
    assert decode(encode(NODE, items), NODE) == {(e.pod_uid, e.container): e for e in items}


def test_each_container_of_a_pod_has_its_own_entry_and_they_go_together(tmp_path: Path) -> None:
    c = Checkpoint(tmp_path, NODE)
    c.record(served("u1", ("GPU-a::0",), container="train"), keep=set())
    c.record(served("u1", ("GPU-a::1",), container="eval"), keep={"u1"})
    assert {n: e.devices for n, e in c.for_pod("u1").items()} == {"train": ("GPU-a::0",), "eval": ("GPU-a::1",)}
    assert c.pods() == {"u1"}
    c.record(served("u2"), keep={"u2"})  # u1 left the node: both its containers' entries go
    assert set(c.entries) == {("u2", "main")}


def test_a_version_1_checkpoint_is_still_read(tmp_path: Path) -> None:
    """Written by the agent that served one GPU container per pod: one entry per pod, no container field.
    Its entries carry the container "" (the pod's only GPU container)."""
    body = [{"podUID": "u1", "namespace": "ns", "name": "pod-u1", "devices": ["GPU-a::0"],
             "response": base64.b64encode(b"answer").decode(), "time": "2026-11-24T09:00:00Z"}]
    checksum = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    (tmp_path / "allocations.json").write_text(
        json.dumps({"version": 1, "node": NODE, "entries": body, "checksum": checksum})
    )
    c = Checkpoint(tmp_path, NODE)
    assert c.load() is None
    assert c.entries == {("u1", ""): Served("u1", "ns", "pod-u1", ("GPU-a::0",), b"answer", "2026-11-24T09:00:00Z")}


def test_an_unusable_directory_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(CheckpointError, match="node state directory .* \\(agent setting checkpoint_dir\\)"):
        Checkpoint(blocker / "sub", NODE).load()


def test_a_version_2_checkpoint_is_read_and_the_next_write_is_version_3(tmp_path: Path) -> None:
    """allocations.json as the agent before version 3 wrote it: one entry per (pod UID, container), a checksum
    over the entries only (SHA-256 of their canonical JSON, without a prefix)."""
    body = [{"container": "main", "devices": ["GPU-a::0"], "name": "pod-u1", "namespace": "ns", "podUID": "u1",
             "response": "YW5zd2Vy", "time": "2026-11-24T09:00:00Z"}]  # "answer"
    checksum = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    text = json.dumps({"checksum": checksum, "entries": body, "node": NODE, "version": 2}, indent=1, sort_keys=True)
    (tmp_path / "allocations.json").write_text(text)
    c = Checkpoint(tmp_path, NODE)
    c.load()
    old = Served("u1", "ns", "pod-u1", ("GPU-a::0",), b"answer", "2026-11-24T09:00:00Z", "main")
    assert c.entries == {("u1", "main"): old}
    assert (tmp_path / "allocations.json").read_text() == text  # read as it is: nothing written until a change
    c.record(served("u2"), keep={"u1", "u2"})
    doc = json.loads((tmp_path / "allocations.json").read_text())
    assert (doc["format"], doc["version"], doc["kind"], doc["node"]) == (
        "gpupool.io/node-state", 3, "allocations", NODE)
    assert [e["podUID"] for e in doc["allocations"]] == ["u1", "u2"]
    assert set(decode((tmp_path / "allocations.json").read_bytes(), NODE)) == {("u1", "main"), ("u2", "main")}


def test_a_version_2_checkpoint_with_a_wrong_checksum_is_not_trusted(tmp_path: Path) -> None:
    body = [{"podUID": "u1", "namespace": "ns", "name": "pod-u1", "devices": ["GPU-a::0"], "response": "", "time": ""}]
    (tmp_path / "allocations.json").write_text(json.dumps({"version": 2, "node": NODE, "entries": body,
                                                           "checksum": "0" * 64}))
    with pytest.raises(CheckpointError, match="checksum mismatch \\(version 2\\)"):
        Checkpoint(tmp_path, NODE).load()


def test_the_checksum_of_version_3_covers_the_node_and_the_version_too(tmp_path: Path) -> None:
    """The checksum is SHA-256 over the canonical JSON of every field but itself (docs/agent.md)."""
    text = encode(NODE, [served("u1")])
    doc = json.loads(text)
    rest = {k: v for k, v in doc.items() if k != "checksum"}
    canonical = json.dumps(rest, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    assert doc["checksum"] == "sha256:" + hashlib.sha256(canonical).hexdigest()
    moved = json.dumps({**doc, "node": "node-2"}).encode()  # the file copied to another node, node edited
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        decode(moved, "node-2")
