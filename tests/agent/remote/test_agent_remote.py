"""Remote shares (gpupool.agent.remote.serving, docs/remote.md, issue 30 item 2), driven as kubelet and the API drive
the agent: claims created in the in-memory cluster, NodePrepareResources over the DRA socket, the agent's GPU
servers as real processes (the servers built from native/ as the native tests build them, over the fake
driver), clients through the forwarding library.

Expected values come from the contract (docs/remote.md, gpupool.api.dra: the token is HMAC-SHA256 of the
claim's UID under the key), computed here by hand, not by the agent's code."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from gpupool.agent.config import ConfigError, load_config
from gpupool.agent.dra.cdi import cdi_path
from gpupool.agent.proto import dra_v1_pb2 as v1
from gpupool.agent.remote.serving import RemoteCollector, share_dir, socket_path, tokens_path
from gpupool.agent.state.hookdir import read_limits
from gpupool.api.dra import DRIVER, slice_name
from gpupool.api.names import ANN_INVENTORY
from gpupool.cluster.port import RESOURCE_CLAIMS, RESOURCE_SLICES, NotFound
from tests.agent.agent_helpers import NODE
from tests.agent.dra.test_agent_dra import DraRig, claim, dra_rig, prepare, ref, spec_of
from tests.native.conftest import built  # noqa: F401  (fixture)
from tests.native.native_helpers import LIMITS_FD
from tests.native.remote_helpers import NOT_PERMITTED, RemoteBuilt, remote_built, start_app  # noqa: F401

KEY = b"0123456789abcdef-the-cluster-key"
OTHER = "gpu-node-2"
OTHER_SERVER = "tcp:10.1.2.3:7070"
REMOTE_CLASS = [{"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": {"isolation": "remote"}}}]
OUT_OF_MEMORY = 2


def token_of(uid: str, key: bytes = KEY) -> str:
    return hmac.new(key, uid.encode(), hashlib.sha256).hexdigest()


def remote_share(pool: str, device: str = "gpu-0", memory: str = "1Gi", cores: str = "25") -> dict[str, Any]:
    return {"request": "gpu", "driver": DRIVER, "pool": pool, "device": device, "shareID": "s-1",
            "consumedCapacity": {"memory": memory, "cores": cores}}


def remote_claim(name: str, pool: str, **kwargs: Any) -> dict[str, Any]:
    return claim(name, [remote_share(pool, **kwargs)], REMOTE_CLASS)


def gpu_slice(node: str, server: str | None) -> dict[str, Any]:
    """Another node's pool as its agent publishes it: one shared GPU, with or without a GPU server."""
    attrs: dict[str, Any] = {"type": {"string": "gpu"}, "uuid": {"string": "GPU-bbbb-0"}, "index": {"int": 0}}
    if server is not None:
        attrs["remoteServer"] = {"string": server}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": slice_name(node)},
            "spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": node, "generation": 1,
                                                                   "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-0", "attributes": attrs}]}}


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "remote-key"
    path.write_bytes(KEY + b"\n")  # a Secret's value may end in a newline
    return path


async def eventually(check: Callable[[], Awaitable[bool] | bool], timeout: float = 15.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        got = check()
        if await got if isinstance(got, Awaitable) else got:
            return
        if loop.time() > deadline:
            raise AssertionError("condition not reached before the timeout")
        await asyncio.sleep(0.05)


async def created(r: DraRig, obj: dict[str, Any]) -> dict[str, Any]:
    made: dict[str, Any] = await r.cluster.create_object(RESOURCE_CLAIMS, obj)
    return made


# --- the pod's node -----------------------------------------------------------------------------------------


async def test_a_remote_claim_on_another_nodes_gpu_gets_the_library_the_server_and_its_token(key_file: Path) -> None:
    async with dra_rig(remote_key_file=key_file) as r:
        await r.cluster.create_object(RESOURCE_SLICES, gpu_slice(OTHER, OTHER_SERVER))
        c = await created(r, remote_claim("far", OTHER))
        uid = c["metadata"]["uid"]
        reply = await prepare(r, c)
        assert reply.claims[uid].error == ""
        [device] = reply.claims[uid].devices
        assert (device.pool_name, device.device_name) == (OTHER, "gpu-0")
        assert list(device.cdi_device_ids) == [f"{DRIVER}/claim={uid}"]
        hook_root = r.agent.config.hook_root
        remote_dir = hook_root / "claims" / uid / "remote"
        # one read-only directory (token and server address), so a rewritten address reaches running containers;
        # the address only in the file (the client library reads GPUPOOL_REMOTE_SERVER_FILE at each start)
        assert spec_of(r, uid)["devices"] == [{"name": uid, "containerEdits": {
            "env": ["GPUPOOL_ISOLATION=remote", "GPUPOOL_REMOTE_SERVER_FILE=/run/gpupool/remote/claim/server",
                    "GPUPOOL_REMOTE_TOKEN_FILE=/run/gpupool/remote/claim/token",
                    "LD_LIBRARY_PATH=/usr/lib/gpupool/remote"],
            "mounts": [
                {"hostPath": str(hook_root / "lib" / "libgpupool_remote.so"),
                 "containerPath": "/usr/lib/gpupool/remote/libcuda.so.1", "type": "bind",
                 "options": ["bind", "ro", "nosuid", "nodev"]},
                {"hostPath": str(remote_dir), "containerPath": "/run/gpupool/remote/claim", "type": "bind",
                 "options": ["bind", "ro", "nosuid", "nodev"]},
            ]}}]
        assert (remote_dir / "token").read_text() == token_of(uid)
        assert (remote_dir / "server").read_text() == OTHER_SERVER + "\n"
        for f in ("token", "server"):  # a container user other than root reads them
            assert (remote_dir / f).stat().st_mode & 0o777 == 0o644
        token_file = remote_dir / "token"
        # no GPU of this node: nothing for the watchdog to hold
        assert r.agent._watched_claims() == {}
        assert r.agent.dra is not None and r.agent.dra.prepared[uid].shares == ()
        done = await r.stub.NodeUnprepareResources(v1.NodeUnprepareResourcesRequest(claims=[ref(c)]), timeout=10)
        assert done.claims[uid].error == ""
        assert not token_file.parent.exists() and not cdi_path(r.agent.config.cdi_dir, uid).exists()


@pytest.mark.parametrize(("server", "results", "message"), [
    (None, None, "has no GPU server"),
    ("tcp:10.1.2.3:7070\nLD_PRELOAD=/evil.so", None, "has no GPU server"),  # never passed into the env
    (OTHER_SERVER, [remote_share(OTHER), remote_share(OTHER, device="gpu-1")], "one GPU share per claim"),
])
async def test_remote_claims_that_cannot_be_served_get_a_clear_error(
        key_file: Path, server: str | None, results: list[dict[str, Any]] | None, message: str) -> None:
    async with dra_rig(remote_key_file=key_file) as r:
        await r.cluster.create_object(RESOURCE_SLICES, gpu_slice(OTHER, server))
        body = remote_claim("bad", OTHER) if results is None else claim("bad", results, REMOTE_CLASS)
        c = await created(r, body)
        reply = await prepare(r, c)
        uid = c["metadata"]["uid"]
        assert message in reply.claims[uid].error
        assert not reply.claims[uid].devices
        assert not cdi_path(r.agent.config.cdi_dir, uid).exists()


async def test_without_a_key_remote_claims_are_refused() -> None:
    async with dra_rig() as r:
        await r.cluster.create_object(RESOURCE_SLICES, gpu_slice(OTHER, OTHER_SERVER))
        c = await created(r, remote_claim("nokey", OTHER))
        reply = await prepare(r, c)
        assert "no remote key" in reply.claims[c["metadata"]["uid"]].error


def test_serving_remote_shares_needs_a_key_dra_and_an_address_pods_can_dial(tmp_path: Path) -> None:
    base = {"node_name": NODE}
    with pytest.raises(ConfigError, match="remote_key_file"):
        load_config(None, {**base, "dra": True, "remote_listen": "tcp:10.0.0.1:7070"}, {})
    with pytest.raises(ConfigError, match="needs dra"):
        load_config(None, {**base, "remote_listen": "tcp:10.0.0.1:7070", "remote_key_file": tmp_path}, {})
    with pytest.raises(ConfigError, match="remote_address"):
        load_config(None, {**base, "dra": True, "remote_listen": "tcp:0.0.0.0:7070", "remote_key_file": tmp_path},
                    {})
    config = load_config(None, base, {"GPUPOOL_AGENT_DRA": "true", "GPUPOOL_AGENT_REMOTE_LISTEN": "tcp:0.0.0.0:7070",
                                      "GPUPOOL_AGENT_REMOTE_ADDRESS": "tcp:10.0.0.1:7070",
                                      "GPUPOOL_AGENT_REMOTE_KEY_FILE": str(tmp_path)})
    assert (config.remote_listen, config.remote_address) == ("tcp:0.0.0.0:7070", "tcp:10.0.0.1:7070")


# --- the GPU node: real GPU servers -------------------------------------------------------------------------


def serving(rb: RemoteBuilt, key_file: Path) -> dict[str, Any]:
    """Agent settings that run the native tests' server build (its library reads limits from a descriptor)."""
    return {"remote_key_file": key_file, "remote_listen": "tcp:127.0.0.1:0", "remote_server_binary": rb.server,
            "remote_hook": rb.base.hook, "remote_limits_fd": LIMITS_FD, "remote_restart_max_s": 0.5}


@pytest.fixture
def fake_driver(remote_built: RemoteBuilt, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:  # noqa: F811
    """The servers' workers load the fake driver (they inherit the agent's environment)."""
    state = tmp_path / "fake-gpu-state"
    monkeypatch.setenv("LD_LIBRARY_PATH", str(remote_built.base.dir))
    monkeypatch.setenv("FAKE_GPU_STATE", str(state))
    return state


async def remote_servers(r: DraRig) -> list[str]:
    try:
        obj = await r.cluster.get_object(RESOURCE_SLICES, slice_name(NODE))
    except NotFound:
        return []
    return [d["attributes"].get("remoteServer", {}).get("string", "") for d in obj["spec"]["devices"]]


def tokens(r: DraRig) -> list[str]:
    return tokens_path(r.agent.config.hook_root).read_text().splitlines()


async def test_the_slice_names_the_server_only_while_it_runs(remote_built: RemoteBuilt,  # noqa: F811
                                                             fake_driver: Path, key_file: Path) -> None:
    async with dra_rig(**serving(remote_built, key_file)) as r:
        remote = r.agent.remote
        assert remote is not None
        await eventually(lambda: remote.tcp.up and remote.unix.up)
        address = remote.tcp.address
        assert address.startswith("tcp:127.0.0.1:") and not address.endswith(":0")
        await eventually(lambda: _all(remote_servers(r), address))
        assert socket_path(r.agent.config.hook_root).is_socket()
        assert tokens_path(r.agent.config.hook_root).stat().st_mode & 0o777 == 0o600
        # the listener dies: the slice stops naming it, until the agent has it running again
        assert remote.tcp.proc is not None
        os.kill(remote.tcp.proc.pid, signal.SIGKILL)
        await eventually(lambda: _all(remote_servers(r), ""))
        await eventually(lambda: remote.tcp.up)
        await eventually(lambda: _all(remote_servers(r), remote.tcp.address))
        assert remote.tcp.restarts == 1
        proc = remote.tcp.proc
    assert proc is not None and proc.returncode is not None  # stopped with the agent


async def _all(servers: Awaitable[list[str]], address: str) -> bool:
    got = await servers
    return len(got) == 4 and all(s == address for s in got)


async def test_a_remote_claim_on_this_pool_gets_a_share_directory_and_a_token_until_it_goes(
        remote_built: RemoteBuilt, fake_driver: Path, key_file: Path) -> None:  # noqa: F811
    async with dra_rig(**serving(remote_built, key_file)) as r:
        remote = r.agent.remote
        assert remote is not None
        hook_root = r.agent.config.hook_root
        elsewhere = await created(r, remote_claim("elsewhere", OTHER))  # another node's GPU: not ours
        hook = await created(r, claim("local", [remote_share(NODE)]))  # isolation hook: kubelet prepares it
        c = await created(r, remote_claim("near", NODE, device="gpu-2", memory="1Gi", cores="25"))
        uid = c["metadata"]["uid"]
        directory = share_dir(hook_root, uid)
        await eventually(lambda: tokens(r) == [f"{token_of(uid)} {directory}"])
        assert tokens_path(hook_root).stat().st_mode & 0o777 == 0o600
        limits = read_limits(directory / "limits")
        assert limits is not None
        assert (limits["ndev"], limits["limit"][0], limits["cores"][0]) == (1, 1024 << 20, 250_000)
        assert json.loads((directory / "pod.json").read_text())["gpus"] == ["GPU-aaaa-2"]
        for other in (elsewhere, hook):
            assert not share_dir(hook_root, other["metadata"]["uid"]).exists()
        await eventually(lambda: _inventory(r, remote.tcp.address, 1))
        await r.cluster.delete_object(RESOURCE_CLAIMS, "near", namespace="team-a")
        await eventually(lambda: tokens(r) == [])
        assert not directory.exists()
        await eventually(lambda: _inventory(r, remote.tcp.address, 0))


async def _inventory(r: DraRig, server: str, shares: int) -> bool:
    node = await r.cluster.get_node(NODE)
    doc = json.loads(node["metadata"]["annotations"].get(ANN_INVENTORY, "{}"))
    return bool(doc.get("remote_server") == server and doc.get("remote_shares") == shares)


def _metrics(collector: RemoteCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for m in collector.collect() for s in m.samples}


async def test_a_client_with_the_token_the_pods_node_wrote_is_held_to_the_claims_memory(
        remote_built: RemoteBuilt, fake_driver: Path, key_file: Path) -> None:  # noqa: F811
    """The whole path: the GPU node serves the claim, the pod's node (here the same agent) prepares it; the
    client, with the CDI spec's environment and the token file it mounts, allocates within the claim's
    1 GiB and is refused beyond it, over TCP and over the unix socket."""
    async with dra_rig(**serving(remote_built, key_file)) as r:
        remote = r.agent.remote
        assert remote is not None
        await eventually(lambda: _all(remote_servers(r), remote.tcp.address))
        c = await created(r, remote_claim("near", NODE, memory="1Gi", cores="100"))
        uid = c["metadata"]["uid"]
        await eventually(lambda: len(tokens(r)) == 1)
        reply = await prepare(r, c)
        assert reply.claims[uid].error == ""
        edits = spec_of(r, uid)["devices"][0]["containerEdits"]
        env = dict(e.split("=", 1) for e in edits["env"])
        mounts = {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}
        assert "GPUPOOL_REMOTE_SERVER" not in env
        remote_dir = Path(mounts["/run/gpupool/remote/claim"])
        # the GPU is on this node: its unix socket
        assert (remote_dir / "server").read_text() == "unix:/run/gpupool/remote/socket/server.sock\n"
        # the socket's directory, read-only (it holds the socket only: not the tokens)
        sockets = [m for m in edits["mounts"] if m["containerPath"] == "/run/gpupool/remote/socket"]
        assert sockets == [{"hostPath": str(socket_path(r.agent.config.hook_root).parent),
                            "containerPath": "/run/gpupool/remote/socket", "type": "bind",
                            "options": ["bind", "ro", "nosuid", "nodev"]}]
        assert sorted(p.name for p in socket_path(r.agent.config.hook_root).parent.iterdir()) == ["server.sock"]
        token = (remote_dir / "token").read_text()
        collector = RemoteCollector(remote)
        for address in (f"unix:{socket_path(r.agent.config.hook_root)}", remote.tcp.address):
            app = start_app(remote_built, address, token)
            try:
                assert await asyncio.to_thread(app.rc, "ctx") == 0
                assert await asyncio.to_thread(app.rc, f"alloc 0 {256 << 20}") == 0
                assert await asyncio.to_thread(app.rc, f"alloc 1 {1024 << 20}") == OUT_OF_MEMORY
                got = _metrics(collector)
                assert got[("gpupool_remote_shares", ())] == 1
                assert got[("gpupool_remote_clients", ())] == 1
                assert got[("gpupool_remote_server_up", (("listener", "tcp"),))] == 1
            finally:
                await asyncio.to_thread(app.close)
        # revoked: the claim goes, a new client with its token is refused
        app = start_app(remote_built, remote.tcp.address, token)
        try:
            await r.cluster.delete_object(RESOURCE_CLAIMS, "near", namespace="team-a")
            await eventually(lambda: tokens(r) == [])
            assert await asyncio.to_thread(app.rc, "ctx") == NOT_PERMITTED
        finally:
            await asyncio.to_thread(app.close)


def test_the_default_gpu_server_is_the_one_installed_beside_the_hook_library(tmp_path: Path) -> None:
    """Without remote_server_binary the agent runs the packaged server (pip install builds it into
    gpupool/hook/). The agent's rooms moved this module a level down, and the path it derived from its own
    file pointed into gpupool/agent/hook/, where nothing is: no GPU server could start."""
    from gpupool.agent.config import AgentConfig
    from gpupool.agent.remote.serving import SERVER_NAME, server_binary
    from gpupool.hook import library_path

    config = AgentConfig(node_name=NODE)
    binary = server_binary(config)
    assert binary == library_path().with_name(SERVER_NAME)
    assert binary.is_file() and os.access(binary, os.X_OK), binary
    assert server_binary(config.model_copy(update={"remote_server_binary": tmp_path / "mine"})) == tmp_path / "mine"
