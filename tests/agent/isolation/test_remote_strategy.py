"""Isolation remote as a strategy of the same protocol as the other modes (gpupool.agent.isolation.remote):
what a remote claim's container gets, the files its prepare writes, and what it refuses. The driver's whole
path (prepare, moves, unprepare) is tests/agent/remote/test_agent_remote.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gpupool.agent.isolation.base import GrantRequest, Isolation, ModeGrant, Prepared, Refused
from gpupool.agent.isolation.grant import CLAIM_CONTAINER
from gpupool.agent.isolation.remote import (
    REMOTE_CLAIM_DIR,
    REMOTE_LIBRARY,
    REMOTE_SOCKET_DIR,
    RemoteClient,
    RemoteIsolation,
    remote_claim_dir,
)
from gpupool.api.allocation import AllocationDoc
from gpupool.api.dra import remote_token
from gpupool.api.isolation import IsolationMode
from tests.agent.agent_helpers import agent_config

UID = "0b6f6f1e-3c2a-4c57-9a8e-5d1f2e3a4b5c"
KEY = b"k" * 32


def _request(tmp_path: Path, *, claim: bool = True, server: str = "tcp:10.0.0.7:7070",
             socket: bool = False) -> GrantRequest:
    doc = AllocationDoc(version=1, pod_uid=UID, node="gpu-1", policy="dra", isolation="remote", gpus=[])
    return GrantRequest(doc, CLAIM_CONTAINER, (), {}, agent_config(tmp_path), "team/claim", claim=claim,
                        remote_server=server, remote_socket=socket)


def test_it_meets_the_protocol_and_names_its_mode(tmp_path: Path) -> None:
    strategy: Isolation = RemoteIsolation(agent_config(tmp_path), RemoteClient(KEY, tmp_path / "lib.so"))
    assert strategy.name == IsolationMode.REMOTE == "remote"
    assert strategy.second_line is False and strategy.inventory_fields() == {}


def test_grant_mounts_the_library_and_the_claims_directory_and_the_socket_only_where_the_share_is(
        tmp_path: Path) -> None:
    client = RemoteClient(KEY, tmp_path / "lib.so", socket=tmp_path / "socket" / "server.sock")
    strategy = RemoteIsolation(agent_config(tmp_path), client)
    away = strategy.grant(_request(tmp_path), Prepared())
    assert isinstance(away, ModeGrant)
    assert [(m.container_path, m.host_path, m.read_only) for m in away.mounts] == [
        (REMOTE_LIBRARY, str(tmp_path / "lib.so"), True),
        (REMOTE_CLAIM_DIR, str(remote_claim_dir(tmp_path / "hook", UID)), True)]
    assert away.envs["GPUPOOL_ISOLATION"] == "remote" and type(away.envs["GPUPOOL_ISOLATION"]) is str
    here = strategy.grant(_request(tmp_path, socket=True), Prepared())
    assert isinstance(here, ModeGrant)
    assert here.mounts[-1].container_path == REMOTE_SOCKET_DIR
    assert here.mounts[-1].host_path == str(tmp_path / "socket")


def test_prepare_writes_the_token_and_the_servers_address(tmp_path: Path) -> None:
    strategy = RemoteIsolation(agent_config(tmp_path), RemoteClient(KEY, tmp_path / "lib.so"))
    assert asyncio.run(strategy.prepare(_request(tmp_path))) == Prepared()
    directory = remote_claim_dir(tmp_path / "hook", UID)
    assert (directory / "token").read_text() == remote_token(KEY, UID)
    assert (directory / "server").read_text() == "tcp:10.0.0.7:7070\n"


def test_it_refuses_without_the_key_and_for_a_pods_allocation(tmp_path: Path) -> None:
    keyless = RemoteIsolation(agent_config(tmp_path), RemoteClient(None, tmp_path / "lib.so"))
    refused = keyless.check(_request(tmp_path))
    assert isinstance(refused, Refused) and "no remote key" in refused.reason
    assert RemoteIsolation(agent_config(tmp_path), None).check(_request(tmp_path)) is not None
    pod = RemoteIsolation(agent_config(tmp_path), RemoteClient(KEY, tmp_path / "lib.so")).check(
        _request(tmp_path, claim=False))
    assert isinstance(pod, Refused) and "unknown isolation 'remote'" in pod.reason
