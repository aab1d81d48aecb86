"""Remote mode when things go wrong: a client killed mid-run frees everything it held on the server; a killed
server leaves its clients with clean CUDA errors (never a hang or a crash); a wrong token is refused; a
malformed, oversized or half-sent message costs only its own connection; and client and server in separate
network namespaces, joined by a veth pair, talk TCP and give the same answers (docs/remote.md)."""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.native.native_helpers import GIB
from tests.native.remote_helpers import (
    LAUNCH_FAILED,
    NO_DEVICE,
    NOT_PERMITTED,
    NOT_SUPPORTED,
    NetnsPair,
    Remote,
    Server,
    netns_pair,
    remote,
    remote_built,
    wait_for,
)
from tests.native.test_remote_programs import EXPECTED, memory_session

__all__ = ["remote", "remote_built"]  # fixtures

SHARE = 10 * GIB
MODULE = "gpupool-fake-module:add_u32,axpy_u32,spin_us"
MAGIC, VERSION = 0x31525047, 1
OP_HELLO, OP_MEM_ALLOC, OP_MEM_INFO = 1, 6, 5
E_PROTOCOL = 0x7FFF0001
INVALID_VALUE = 1
MAX_MSG = 16 << 20


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_killed_client_frees_its_server_state(remote: Remote) -> None:
    server = remote.server()
    token, pod = server.share(memory_mib="10240")
    victim = remote.app(server, token)
    assert victim.rc("ctx") == 0
    assert victim.rc("alloc 0 6442450944") == 0  # 6 GiB
    assert victim.rc(f"load {MODULE}") == 0 and victim.rc("stream 1") == 0
    (worker,) = server.workers_of(pod)
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait()
    assert wait_for(lambda: not alive(worker))  # its connection closed: the worker exited
    heir = remote.app(server, token)
    assert heir.rc("ctx") == 0
    assert heir.ask("info") == ["0", str(SHARE), str(SHARE)]  # the 6 GiB are back in the share
    assert heir.rc(f"alloc 0 {SHARE}") == 0


def test_a_killed_server_gives_its_clients_clean_errors(remote: Remote) -> None:
    server = remote.server()
    token, _ = server.share(memory_mib="10240")
    app = remote.app(server, token)
    assert app.rc("ctx") == 0 and app.rc("alloc 0 64") == 0
    assert app.rc(f"load {MODULE}") == 0 and app.rc("func add_u32") == 0
    server.kill()  # the listener and every worker, kill -9
    launched = app.rc("add 0 16 1 params 0")  # not waited for: the write may still succeed once
    assert launched in (0, LAUNCH_FAILED)
    for command in ("sync", "alloc 1 64", "free 0", "ssync 0", "stream 1", "func add_u32"):
        assert app.rc(command) == LAUNCH_FAILED, command
    assert app.ask("info")[0] == str(LAUNCH_FAILED)
    assert app.ask("read 0 0 16 0 0")[0] == str(LAUNCH_FAILED)
    err = app.close()
    assert app.proc.returncode == 0, err  # the program ran to its end: no crash, no SIGPIPE
    assert "lost the connection to the GPU server" in err
    newcomer = remote.app(server, token)
    assert newcomer.rc("ctx") == NO_DEVICE


def test_a_worker_sees_only_the_gpus_of_its_share(remote: Remote) -> None:
    """The library caps whatever device a one-GPU share uses, so the worker must not see the node's other
    GPUs: its CUDA_VISIBLE_DEVICES is its share's UUIDs from the limits file, whatever the server's was."""
    server = remote.server(extra_env={"CUDA_VISIBLE_DEVICES": "GPU-aaaa,GPU-bbbb,GPU-cccc"})
    token, pod = server.share(memory_mib="1024", gpus=("GPU-bbbb",))
    app = remote.app(server, token)
    assert app.rc("ctx") == 0
    (worker,) = server.workers_of(pod)
    env = Path(f"/proc/{worker}/environ").read_bytes().split(b"\0")
    assert [e for e in env if e.startswith(b"CUDA_VISIBLE_DEVICES=")] == [b"CUDA_VISIBLE_DEVICES=GPU-bbbb"]
    # a share matched by ordinal (no UUID: never an agent's claim) keeps the server's own view
    token2, pod2 = server.share(memory_mib="1024")
    other = remote.app(server, token2)
    assert other.rc("ctx") == 0
    (worker2,) = server.workers_of(pod2)
    env2 = Path(f"/proc/{worker2}/environ").read_bytes().split(b"\0")
    assert [e for e in env2 if e.startswith(b"CUDA_VISIBLE_DEVICES=")] == [
        b"CUDA_VISIBLE_DEVICES=GPU-aaaa,GPU-bbbb,GPU-cccc"]


def test_the_server_file_decides_where_a_new_process_connects(remote: Remote, tmp_path: Path) -> None:
    """The agent names the server in a file it rewrites when the share moves: a process reads it when it
    starts, and it wins over GPUPOOL_REMOTE_SERVER; a file naming nothing gives no GPU (100)."""
    server = remote.server()
    token, _ = server.share(memory_mib="1024")
    where = tmp_path / "server"
    where.write_text(server.address + "\n")
    elsewhere = f"unix:{tmp_path / 'nothing-listens-here.sock'}"
    app = remote.app(None, token, address=elsewhere, extra={"GPUPOOL_REMOTE_SERVER_FILE": str(where)})
    assert app.rc("ctx") == 0
    assert app.rc("alloc 0 1048576") == 0
    where.write_text("")
    lost = remote.app(None, token, address=server.address, extra={"GPUPOOL_REMOTE_SERVER_FILE": str(where)})
    assert lost.rc("ctx") == 100  # CUDA_ERROR_NO_DEVICE


def test_a_wrong_token_is_refused_and_the_server_serves_the_others(remote: Remote) -> None:
    server = remote.server()
    token, _ = server.share(memory_mib="10240")
    stranger = remote.app(server, "not-" + token)
    assert stranger.rc("ctx") == NOT_PERMITTED
    assert "refused this share's token" in stranger.close()
    empty = remote.app(server, "")
    assert empty.rc("ctx") == NOT_PERMITTED
    member = remote.app(server, token)
    assert member.rc("ctx") == 0 and member.rc("alloc 0 64") == 0


def test_a_token_file_others_can_read_is_refused(remote: Remote) -> None:
    server = remote.server()
    token, _ = server.share(memory_mib="10240")
    os.chmod(server.tokens, 0o644)
    assert remote.app(server, token).rc("ctx") == NOT_PERMITTED
    os.chmod(server.tokens, 0o600)
    assert remote.app(server, token).rc("ctx") == 0


# ---- raw protocol ------------------------------------------------------------------------------------------
OPEN: list[socket.socket] = []


@pytest.fixture(autouse=True)
def _close_sockets() -> Iterator[None]:
    yield
    while OPEN:
        OPEN.pop().close()


def connect(server: Server) -> socket.socket:
    assert server.address.startswith("unix:")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    OPEN.append(s)
    s.settimeout(20)
    s.connect(server.address[5:])
    return s


def recv_exact(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise EOFError(f"closed after {len(out)} of {n} bytes")
        out += chunk
    return out


def reply(s: socket.socket) -> tuple[int, bytes]:
    result, _, length = struct.unpack("<III", recv_exact(s, 12))
    return result, recv_exact(s, length)


def hello(s: socket.socket, token: str) -> int:
    t = token.encode()
    s.sendall(struct.pack("<IIIIII", OP_HELLO, 0, 12 + len(t), MAGIC, VERSION, len(t)) + t)
    return reply(s)[0]


def closed(s: socket.socket) -> bool:
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def test_malformed_and_oversized_messages_cost_only_their_own_connection(remote: Remote) -> None:
    server = remote.server()
    token, _ = server.share(memory_mib="10240")
    bystander = remote.app(server, token)
    assert bystander.rc("ctx") == 0 and bystander.rc("alloc 0 64") == 0

    s = connect(server)  # not a hello at all
    s.sendall(struct.pack("<III", 77, 0, 4) + b"junk")
    assert reply(s)[0] == E_PROTOCOL and closed(s)

    s = connect(server)  # a hello with a wrong magic
    s.sendall(struct.pack("<IIIIII", OP_HELLO, 0, 12, 0xDEADBEEF, VERSION, 0))
    assert reply(s)[0] == E_PROTOCOL and closed(s)

    s = connect(server)
    assert hello(s, token) == 0
    s.sendall(struct.pack("<III", 999, 0, 0))  # an operation the server does not know: an error, and on
    assert reply(s)[0] == NOT_SUPPORTED
    s.sendall(struct.pack("<III", OP_MEM_ALLOC, 0, 3) + b"\x01\x02\x03")  # short of its u64: refused
    assert reply(s)[0] != 0
    s.sendall(struct.pack("<III", OP_MEM_INFO, 0, 0))  # before any context: no context, not a crash
    assert reply(s)[0] == 201
    s.sendall(struct.pack("<III", OP_MEM_ALLOC, 0, 2 * MAX_MSG))  # oversized: refused, connection closed
    assert reply(s)[0] == E_PROTOCOL and closed(s)

    assert bystander.rc("alloc 1 64") == 0  # the others never noticed
    assert bystander.ask("info") == ["0", str(SHARE - 128), str(SHARE)]


def test_a_half_sent_message_is_dropped_after_the_timeout(remote: Remote) -> None:
    server = remote.server(args=("--message-timeout-ms", "300"))
    token, _ = server.share(memory_mib="10240")
    s = connect(server)
    assert hello(s, token) == 0
    s.sendall(struct.pack("<III", OP_MEM_ALLOC, 0, 8)[:7])  # 7 of the header's 12 bytes, then nothing
    assert closed(s)  # the worker gave up on it (recv would raise after the socket's 20 s otherwise)
    stalled = connect(server)
    stalled.sendall(b"\x01\x00")  # a hello that never finishes: the admitting child gives up after 5 s
    assert closed(stalled)
    member = remote.app(server, token)
    assert member.rc("ctx") == 0


# ---- across network namespaces -----------------------------------------------------------------------------
@pytest.fixture
def netns() -> Iterator[NetnsPair]:
    if os.geteuid() != 0:
        pytest.fail("the network namespace tests need root (ip netns, veth)")
    pair = netns_pair()
    yield pair
    pair.close()


def test_across_network_namespaces_the_programs_answer_the_same(remote: Remote, netns: NetnsPair) -> None:
    server = remote.server(listen=f"tcp:{netns.server_ip}:0", netns=netns.server_ns)
    assert server.address.startswith(f"tcp:{netns.server_ip}:")
    token, _ = server.share(memory_mib="10240")
    probe = remote.probe(server, token, "gpa2", netns=netns.client_ns)
    assert memory_session(probe) == EXPECTED  # (which leaves that share full)
    other, _ = server.share(memory_mib="1024")
    app = remote.app(server, other, netns=netns.client_ns)
    assert app.rc("ctx") == 0
    data = bytes(range(256)) * 64
    assert app.rc("alloc 0 16384") == 0
    assert app.rc(f"write 0 0 1 0 {data.hex()}") == 0
    assert app.rc(f"load {MODULE}") == 0 and app.rc("func add_u32") == 0
    assert app.rc("adds 0 4096 3 0") == 0
    rc, back = app.ask("read 0 0 16384 0 0")
    expect = struct.pack("<4096I", *[(v + 3) & 0xFFFFFFFF for v in struct.unpack("<4096I", data)])
    assert rc == "0" and bytes.fromhex(back) == expect
    assert app.ask("big 9000000 5 1") == ["0", "1"]


def test_a_client_without_a_route_to_the_server_is_told_there_is_no_device(remote: Remote,
                                                                            netns: NetnsPair) -> None:
    """A client in the server's peer namespace reaches it; one on the host (no route to the veth) gets
    CUDA_ERROR_NO_DEVICE once the connect fails or times out (10 s), not a hang."""
    server = remote.server(listen=f"tcp:{netns.server_ip}:0", netns=netns.server_ns)
    token, _ = server.share(memory_mib="1024")
    outsider = remote.app(server, token)
    assert outsider.rc("ctx") == NO_DEVICE
    insider = remote.app(server, token, netns=netns.client_ns)
    assert insider.rc("ctx") == 0


def test_the_server_serves_at_most_max_clients_connections_at_once(remote: Remote) -> None:
    server = remote.server(args=("--max-clients", "2"))
    token, _ = server.share(memory_mib="1024")
    first = remote.app(server, token)
    assert first.rc("ctx") == 0
    assert wait_for(lambda: len(server.workers()) == 1)
    second = remote.app(server, token)
    assert second.rc("ctx") == 0
    assert wait_for(lambda: len(server.workers()) == 2)
    assert remote.app(server, token).rc("ctx") == NO_DEVICE  # full: refused without a process for it
    first.close()
    assert wait_for(lambda: len(server.workers()) == 1)
    assert remote.app(server, token).rc("ctx") == 0
    assert second.rc("alloc 0 64") == 0


def test_a_cut_link_ends_in_a_clean_error_not_a_hang(remote: Remote, netns: NetnsPair) -> None:
    """The link goes down without a FIN or a reset reaching the client (the server's node vanished): with
    GPUPOOL_REMOTE_TIMEOUT_S the waiting call gives up after that long (without it, TCP keepalive ends the
    connection after about 25 s), and the context's later calls fail at once."""
    server = remote.server(listen=f"tcp:{netns.server_ip}:0", netns=netns.server_ns)
    token, _ = server.share(memory_mib="1024")
    app = remote.app(server, token, netns=netns.client_ns, extra={"GPUPOOL_REMOTE_TIMEOUT_S": "2"})
    assert app.rc("ctx") == 0 and app.rc("alloc 0 64") == 0
    subprocess.run(["ip", "-n", netns.client_ns, "link", "set", netns.client_link, "down"], check=True)
    assert app.rc("sync") == LAUNCH_FAILED
    assert app.rc("alloc 1 64") == LAUNCH_FAILED
    assert "lost the connection" in app.close()
