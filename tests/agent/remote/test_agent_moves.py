"""Moves of remote shares between GPU servers (issue 30 item 3; gpupool.api.moves, docs/remote.md), driven
as the admin CLI, the API and kubelet drive the agents: three agents on one in-memory cluster, two GPU nodes
that run their real GPU servers over the fake driver (the native tests' build, as test_agent_remote.py runs
them) and a pod node without GPU servers that prepares the claim over its DRA socket; a move is an entry
written into gpupool's moves ConfigMap; the client is remote_app through the forwarding library, configured
as the CDI spec configures a container (the token and server files of the claim's remote directory).

Expected values are the contract's (states, reasons, files, addresses), written here by hand."""

from __future__ import annotations

import asyncio
import random
import shutil
import struct
import tempfile
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from gpupool.agent.config import ConfigError, load_config
from gpupool.agent.devices.fake import FakeBackend
from gpupool.agent.port import ClusterPortAgent
from gpupool.agent.proto import dra_v1_pb2_grpc as v1_grpc
from gpupool.agent.remote.serving import MovesBook, MovesCollector, share_dir, tokens_path
from gpupool.agent.service import Agent
from gpupool.api.moves import MOVES_CONFIGMAP, GpuRef, Move, read_moves
from gpupool.cluster.memory import MemoryCluster
from gpupool.cluster.port import CONFIGMAPS, RESOURCE_CLAIMS, RESOURCE_SLICES, NotFound, Obj
from tests.agent.agent_helpers import agent_config, four_gpus
from tests.agent.dra.test_agent_dra import DraRig, _register, dra_rig, prepare
from tests.agent.remote.test_agent_remote import (  # noqa: F401  (fixtures)
    OTHER,
    OTHER_SERVER,
    eventually,
    fake_driver,
    gpu_slice,
    key_file,
    remote_claim,
    serving,
    token_of,
)
from tests.native.conftest import built  # noqa: F401  (fixture)
from tests.native.remote_helpers import App, RemoteBuilt, remote_built, start_app  # noqa: F401

NS = "gpupool-system"
SOURCE, TARGET, POD_NODE = "gpu-node-a", "gpu-node-b", "cpu-node"
NOBODY = "tcp:127.0.0.1:1"  # GPUPOOL_REMOTE_SERVER in the client's environment: the file must win over it


@dataclass
class Cluster3:
    cluster: MemoryCluster
    agents: dict[str, Agent]
    pod: DraRig  # the pod node's agent, with its DRA stub (prepare)

    def remote_dir(self, uid: str) -> Path:
        return self.agents[POD_NODE].config.hook_root / "claims" / uid / "remote"

    def tokens(self, node: str) -> list[str]:
        return tokens_path(self.agents[node].config.hook_root).read_text().splitlines()

    def share_dir(self, node: str, uid: str) -> Path:
        return share_dir(self.agents[node].config.hook_root, uid)

    def tcp(self, node: str) -> str:
        remote = self.agents[node].remote
        assert remote is not None
        return remote.tcp.address

    def workers(self, node: str, uid: str) -> list[int]:
        remote = self.agents[node].remote
        assert remote is not None
        return remote._workers_of(self.share_dir(node, uid))

    def app(self, rb: RemoteBuilt, uid: str, server: str | None = None) -> App:
        """A new client process as the container starts it: the claim's token and server files (`server`: the
        address the server file named when it started)."""
        d = self.remote_dir(uid)
        if server is None:
            return start_app(rb, NOBODY, extra={"GPUPOOL_REMOTE_SERVER_FILE": str(d / "server"),
                                                "GPUPOOL_REMOTE_TOKEN_FILE": str(d / "token")})
        return start_app(rb, server, extra={"GPUPOOL_REMOTE_TOKEN_FILE": str(d / "token")})


@asynccontextmanager
async def three_nodes(rb: RemoteBuilt, key: Path) -> AsyncIterator[Cluster3]:
    cluster = MemoryCluster()
    agents: dict[str, Agent] = {}
    dirs: list[Path] = []
    channel = None
    try:
        for node in (SOURCE, TARGET, POD_NODE):
            directory = Path(tempfile.mkdtemp(prefix="gpm-", dir="/tmp"))  # unix socket paths stay short
            dirs.append(directory)
            await cluster.create_node({"metadata": {"name": node}, "status": {"allocatable": {"cpu": "32"}}})
            gpu = serving(rb, key) if node != POD_NODE else {"remote_key_file": key}
            config = agent_config(directory, node_name=node, dra=True, kubelet_root=directory / "kubelet",
                                  cdi_dir=directory / "cdi", dra_resync_s=0.05, moves_namespace=NS, move_check_s=0.1,
                                  **gpu)
            agents[node] = agent = Agent(config, FakeBackend(four_gpus()), ClusterPortAgent(cluster))
            await agent.start()
        pod = agents[POD_NODE]
        info = await _register(pod.config.kubelet_root)
        channel = grpc.aio.insecure_channel(f"unix://{info.endpoint}")
        rig = DraRig(cluster, FakeBackend(four_gpus()), pod, dirs[2], channel, v1_grpc.DRAPluginStub(channel), info)
        c3 = Cluster3(cluster, agents, rig)
        for node in (SOURCE, TARGET):  # both GPU servers listen and are published
            remote = agents[node].remote
            assert remote is not None
            await eventually(lambda r=remote: r.advertised() != "")  # type: ignore[misc]
        yield c3
    finally:
        if channel is not None:
            await channel.close()
        for agent in agents.values():
            await agent.stop()
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)


async def ask(cluster: MemoryCluster, uid: str, move: Move) -> None:
    """What `gpupool migrate` writes: the claim's entry, in the ConfigMap (made on first use)."""
    try:
        await cluster.get_object(CONFIGMAPS, MOVES_CONFIGMAP, NS)
    except NotFound:
        await cluster.create_object(CONFIGMAPS, {"apiVersion": "v1", "kind": "ConfigMap",
                                                 "metadata": {"name": MOVES_CONFIGMAP, "namespace": NS},
                                                 "data": {uid: move.to_json()}})
        return
    await cluster.patch_object(CONFIGMAPS, MOVES_CONFIGMAP, {"data": {uid: move.to_json()}}, namespace=NS)


async def entry(cluster: MemoryCluster, uid: str) -> Move:
    return read_moves(await cluster.get_object(CONFIGMAPS, MOVES_CONFIGMAP, NS))[uid]


async def state_is(cluster: MemoryCluster, uid: str, state: str, reason: str | None = None) -> bool:
    got = await entry(cluster, uid)
    return got.state == state and (reason is None or got.reason == reason)


def pattern(n: int, seed: int) -> bytes:
    rng = random.Random(seed)
    return struct.pack(f"<{n}I", *(rng.getrandbits(32) for _ in range(n)))


async def ask_app(app: App, command: str) -> list[str]:
    return await asyncio.to_thread(app.ask, command)


async def fill(app: App, data: bytes) -> None:
    """A context and one 8 KiB allocation (number 0) holding `data`, each call answered 0."""
    assert await ask_app(app, "ctx") == ["0"]
    assert await ask_app(app, "alloc 0 8192") == ["0"]
    assert await ask_app(app, f"write 0 0 0 0 {data.hex()}") == ["0"]


def moves_metric(agent: Agent) -> dict[str, float]:
    assert agent.moves is not None
    return moves_metric_of(agent.moves)


async def placed_claim(c3: Cluster3, rb: RemoteBuilt) -> tuple[str, App, bytes]:
    """A remote claim placed on the source's gpu-1, prepared on the pod node, and a client that holds a
    pattern in 8 KiB of the share's memory."""
    claim = await c3.cluster.create_object(RESOURCE_CLAIMS, remote_claim("mover", SOURCE, device="gpu-1",
                                                                         memory="1Gi", cores="100"))
    uid = claim["metadata"]["uid"]
    await eventually(lambda: c3.tokens(SOURCE) == [f"{token_of(uid)} {c3.share_dir(SOURCE, uid)}"])
    reply = await prepare(c3.pod, claim)
    assert reply.claims[uid].error == ""
    assert (c3.remote_dir(uid) / "server").read_text() == c3.tcp(SOURCE) + "\n"
    return uid, c3.app(rb, uid), pattern(2048, 7)


async def test_a_running_client_moves_to_the_target_and_new_clients_follow(
        remote_built: RemoteBuilt, fake_driver: Path, key_file: Path) -> None:  # noqa: F811
    async with three_nodes(remote_built, key_file) as c3:
        uid, app, data = await placed_claim(c3, remote_built)
        try:
            await fill(app, data)
            pointer = await ask_app(app, "ptr 0")
            assert c3.workers(SOURCE, uid) != [] and c3.workers(TARGET, uid) == []

            await ask(c3.cluster, uid, Move("team-a/mover", GpuRef(SOURCE, 1), GpuRef(TARGET, 2)))
            # the target prepares the share on its gpu-2 (limits from the claim) and says ready; the source
            # signals its one worker, which moves at the client's next waiting call: until then it waits
            await eventually(lambda: state_is(c3.cluster, uid, "ready", "1 clients still on the source"))
            assert c3.tokens(TARGET) == [f"{token_of(uid)} {c3.share_dir(TARGET, uid)}"]
            assert (c3.share_dir(TARGET, uid) / "pod.json").exists()
            assert '"GPU-aaaa-2"' in (c3.share_dir(TARGET, uid) / "pod.json").read_text()
            assert (c3.share_dir(SOURCE, uid) / "move-to").read_text() == c3.tcp(TARGET) + "\n"
            # new processes go to the target from ready on (it admits the token); this one stays until it waits
            await eventually(lambda: (c3.remote_dir(uid) / "server").read_text() == c3.tcp(TARGET) + "\n")
            assert moves_metric(c3.agents[SOURCE])["ready"] == 1 and moves_metric(c3.agents[TARGET])["ready"] == 1
            assert moves_metric(c3.agents[POD_NODE])["ready"] == 0  # not a GPU node of this move

            assert await ask_app(app, "sync") == ["0"]  # the waiting call: the client moves here
            assert await ask_app(app, "ptr 0") == pointer
            rc, got = await ask_app(app, "read 0 0 8192 0 0")
            assert rc == "0" and bytes.fromhex(got) == data
            assert len(c3.workers(TARGET, uid)) == 1

            await eventually(lambda: state_is(c3.cluster, uid, "moved", ""))
            await eventually(lambda: c3.tokens(SOURCE) == [] and not c3.share_dir(SOURCE, uid).exists())
            assert c3.tokens(TARGET) == [f"{token_of(uid)} {c3.share_dir(TARGET, uid)}"]
            await eventually(lambda: (c3.remote_dir(uid) / "server").read_text() == c3.tcp(TARGET) + "\n")
            assert moves_metric(c3.agents[SOURCE])["moved"] == 1

            # a process started after the move dials the target, read from the server file
            second = c3.app(remote_built, uid)
            try:
                assert await ask_app(second, "ctx") == ["0"]
                assert await ask_app(second, "alloc 0 4096") == ["0"]
                assert len(c3.workers(TARGET, uid)) == 2
            finally:
                await asyncio.to_thread(second.close)
            rc, got = await ask_app(app, "read 0 0 8192 0 0")  # the first one carries on
            assert rc == "0" and bytes.fromhex(got) == data
        finally:
            err = await asyncio.to_thread(app.close)
        assert app.proc.returncode == 0 and f"moved to {c3.tcp(TARGET)}" in err


@pytest.mark.parametrize(("target", "reason"), [
    (GpuRef(TARGET, 7), "claim team-a/mover: node gpu-node-b has no shared GPU gpu-7"),
    (GpuRef(SOURCE, 2), "source and target are both on node gpu-node-a: its GPU server maps the claim's token to "
                        "one GPU; move the share to another node"),
    (GpuRef(POD_NODE, 0), "node cpu-node serves no remote shares (its agent has no remote_listen)"),
])
async def test_a_target_that_cannot_take_the_share_fails_the_move_and_the_client_stays(
        remote_built: RemoteBuilt, fake_driver: Path, key_file: Path,  # noqa: F811
        target: GpuRef, reason: str) -> None:
    async with three_nodes(remote_built, key_file) as c3:
        uid, app, data = await placed_claim(c3, remote_built)
        try:
            await fill(app, data)
            (worker,) = c3.workers(SOURCE, uid)

            await ask(c3.cluster, uid, Move("team-a/mover", GpuRef(SOURCE, 1), target))
            await eventually(lambda: state_is(c3.cluster, uid, "failed", reason))
            assert moves_metric(c3.agents[SOURCE])["failed"] == 1
            # untouched: the same worker on the source, never asked to move; nothing left on the target
            assert not (c3.share_dir(SOURCE, uid) / "move-to").exists()
            assert c3.tokens(SOURCE) == [f"{token_of(uid)} {c3.share_dir(SOURCE, uid)}"]
            assert c3.tokens(TARGET) == [] and not c3.share_dir(TARGET, uid).exists()
            assert await ask_app(app, "sync") == ["0"]
            rc, got = await ask_app(app, "read 0 0 8192 0 0")
            assert rc == "0" and bytes.fromhex(got) == data
            assert c3.workers(SOURCE, uid) == [worker]
            assert (c3.remote_dir(uid) / "server").read_text() == c3.tcp(SOURCE) + "\n"
        finally:
            err = await asyncio.to_thread(app.close)
        assert app.proc.returncode == 0 and "move" not in err


async def test_clients_that_connect_to_the_source_while_the_move_is_ready_are_moved_too(
        remote_built: RemoteBuilt, fake_driver: Path, key_file: Path) -> None:  # noqa: F811
    """A process that started before its pod's node switched the address: it connects to the source while the
    entry is ready; the source asks it to move as well, and the move ends only when it has."""
    async with three_nodes(remote_built, key_file) as c3:
        uid, first, data = await placed_claim(c3, remote_built)
        late = None
        try:
            assert await ask_app(first, "ctx") == ["0"]
            await ask(c3.cluster, uid, Move("team-a/mover", GpuRef(SOURCE, 1), GpuRef(TARGET, 0)))
            await eventually(lambda: state_is(c3.cluster, uid, "ready", "1 clients still on the source"))
            # a process that read the server file just before the pod's node switched it to the target
            late = c3.app(remote_built, uid, server=c3.tcp(SOURCE))
            await fill(late, data)
            await eventually(lambda: state_is(c3.cluster, uid, "ready", "2 clients still on the source"))
            assert await ask_app(first, "sync") == ["0"]
            await eventually(lambda: state_is(c3.cluster, uid, "ready", "1 clients still on the source"))
            rc, got = await ask_app(late, "read 0 0 8192 0 0")  # a waiting call: it moves here
            assert rc == "0" and bytes.fromhex(got) == data
            await eventually(lambda: state_is(c3.cluster, uid, "moved", ""))
            assert len(c3.workers(TARGET, uid)) == 2
        finally:
            errs = [await asyncio.to_thread(a.close) for a in (first, late) if a is not None]
        assert all(f"moved to {c3.tcp(TARGET)}" in e for e in errs) and len(errs) == 2


# --- the moves ConfigMap: reads and compare-and-set writes (no GPU servers) ---------------------------------


class Interfering(ClusterPortAgent):
    """Another writer's change lands between the agent's read of the ConfigMap and its update, once."""

    def __init__(self, port: MemoryCluster, change: dict[str, str]) -> None:
        super().__init__(port)
        self.change: dict[str, str] | None = change
        self.updates = 0

    async def update_moves(self, namespace: str, entries: Mapping[str, str], resource_version: str) -> Obj:
        self.updates += 1
        if self.change is not None:
            change, self.change = self.change, None
            await self.port.patch_object(CONFIGMAPS, MOVES_CONFIGMAP, {"data": change}, namespace=NS)
        return await super().update_moves(namespace, entries, resource_version)


A_MOVE = Move("team-a/one", GpuRef(SOURCE, 0), GpuRef(TARGET, 1))
B_MOVE = Move("team-a/two", GpuRef(SOURCE, 2), GpuRef(TARGET, 3))


async def test_a_write_after_another_writers_change_is_retried_on_the_new_version() -> None:
    cluster = MemoryCluster()
    await ask(cluster, "uid-1", A_MOVE)
    port = Interfering(cluster, {"uid-2": B_MOVE.to_json()})  # another claim's entry: no reason to give up
    book = MovesBook(port, NS, TARGET)
    assert await book.write("uid-1", A_MOVE, A_MOVE.advanced("ready"))
    assert port.updates == 2  # the first one met a Conflict
    assert await entry(cluster, "uid-1") == Move("team-a/one", GpuRef(SOURCE, 0), GpuRef(TARGET, 1), "ready")
    assert await entry(cluster, "uid-2") == B_MOVE


async def test_a_write_over_an_entry_that_changed_is_not_made() -> None:
    cluster = MemoryCluster()
    await ask(cluster, "uid-1", A_MOVE)
    again = Move("team-a/one", GpuRef(SOURCE, 0), GpuRef("gpu-node-c", 0))  # the admin asked another target
    port = Interfering(cluster, {"uid-1": again.to_json()})
    book = MovesBook(port, NS, TARGET)
    assert not await book.write("uid-1", A_MOVE, A_MOVE.advanced("ready"))
    assert await entry(cluster, "uid-1") == again
    assert not await MovesBook(ClusterPortAgent(MemoryCluster()), NS, TARGET).write("uid-1", A_MOVE, again)


async def test_no_configmap_is_no_moves_and_its_entries_arrive_and_go_with_it() -> None:
    cluster = MemoryCluster()
    book = MovesBook(ClusterPortAgent(cluster), NS, SOURCE)
    seen: list[set[str]] = []

    async def record(changed: set[str]) -> None:
        seen.append(changed)

    book.handlers.append(record)
    book.start()
    try:
        await book.wait_synced()
        assert book.moves == {} and seen == []
        await ask(cluster, "uid-1", A_MOVE)
        await eventually(lambda: book.moves == {"uid-1": A_MOVE})
        await cluster.patch_object(CONFIGMAPS, MOVES_CONFIGMAP, {"data": {"uid-2": "not a move"}}, namespace=NS)
        await ask(cluster, "uid-3", B_MOVE)
        await eventually(lambda: book.moves == {"uid-1": A_MOVE, "uid-3": B_MOVE})  # a damaged entry is skipped
        await cluster.delete_object(CONFIGMAPS, MOVES_CONFIGMAP, namespace=NS)
        await eventually(lambda: book.moves == {})
        assert seen == [{"uid-1"}, {"uid-3"}, {"uid-1", "uid-3"}]
        metric = moves_metric_of(book)
        assert metric == {"requested": 0, "ready": 0, "moved": 0, "failed": 0}
    finally:
        await book.stop()


def moves_metric_of(book: MovesBook) -> dict[str, float]:
    return {s.labels["state"]: s.value for m in MovesCollector(book).collect() for s in m.samples}


def test_the_moves_namespace_is_a_setting_an_env_variable_and_a_flag(tmp_path: Path) -> None:
    assert load_config(None, {"node_name": "n"}, {}).moves_namespace is None
    assert load_config(None, {"node_name": "n"}, {"GPUPOOL_AGENT_MOVES_NAMESPACE": "gpupool"}).moves_namespace \
        == "gpupool"
    assert load_config(None, {"node_name": "n", "moves_namespace": "ops"}, {}).moves_namespace == "ops"
    with pytest.raises(ConfigError, match="moves_namespace"):
        load_config(None, {"node_name": "n", "moves_namespace": "Not/A-Namespace"}, {})


async def test_the_pod_nodes_server_file_follows_where_the_share_is_served_from(key_file: Path) -> None:  # noqa: F811
    """requested and ready: still the source (its server moves the running clients); moved: the target; a
    later move starts from there. The target's address is the one its slice publishes."""
    third, third_server = "gpu-node-3", "tcp:10.9.9.9:7070"
    async with dra_rig(remote_key_file=key_file, moves_namespace=NS, move_check_s=0.1) as r:
        await r.cluster.create_object(RESOURCE_SLICES, gpu_slice(OTHER, OTHER_SERVER))
        other_three = gpu_slice(third, third_server)
        other_three["spec"]["devices"][0]["name"] = "gpu-3"
        await r.cluster.create_object(RESOURCE_SLICES, other_three)
        c = await r.cluster.create_object(RESOURCE_CLAIMS, remote_claim("far", OTHER))
        uid = c["metadata"]["uid"]
        assert (await prepare(r, c)).claims[uid].error == ""
        server = r.agent.config.hook_root / "claims" / uid / "remote" / "server"
        assert server.read_text() == OTHER_SERVER + "\n"
        move = Move("team-a/far", GpuRef(OTHER, 0), GpuRef(third, 3))
        await ask(r.cluster, uid, move)
        await asyncio.sleep(0.3)
        assert server.read_text() == OTHER_SERVER + "\n"  # requested: the target may not take it yet
        # ready: the target admits the share's token, and a process starting now must not find the source
        # letting the share go
        await ask(r.cluster, uid, move.advanced("ready"))
        await eventually(lambda: server.read_text() == third_server + "\n")
        await ask(r.cluster, uid, move.advanced("ready").advanced("moved"))
        await asyncio.sleep(0.3)
        assert server.read_text() == third_server + "\n"
        await ask(r.cluster, uid, Move("team-a/far", GpuRef(third, 3), GpuRef(OTHER, 0), "moved"))  # and back
        await eventually(lambda: server.read_text() == OTHER_SERVER + "\n")
        assert server.stat().st_mode & 0o777 == 0o644
