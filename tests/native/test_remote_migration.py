"""Live migration of a remote client (docs/remote.md): an administrator writes the target server's address
into the share's `move-to` file on the source server and signals the client's worker (SIGUSR1); at the
client's next call that waits for a reply, the source synchronises the context and answers "moved"; the
client library replays the context's state (allocations at the same device addresses, their contents,
modules, functions, streams, events) into a fresh worker on the target, swaps the connection and sends the
call again. The program never notices: its pointers and handles stay valid, and it runs to the end.

Each server is a separate GPU server with its own share directory for the same token, as two nodes would
have (the agent on each writes the share's limits there). Expected values are computed here."""

from __future__ import annotations

import os
import random
import signal
import struct

import pytest

from tests.native.native_helpers import GIB
from tests.native.remote_helpers import App, Remote, Server, remote, remote_built, wait_for

__all__ = ["remote", "remote_built"]  # fixtures

MODULE = "gpupool-fake-module:add_u32,axpy_u32,spin_us"
MASK = 0xFFFFFFFF
GRANULE = 2 << 20  # the fake driver's VMM granularity (the driver's usual 2 MiB)


def words(data: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(data) // 4}I", data))


def pack(values: list[int]) -> bytes:
    return struct.pack(f"<{len(values)}I", *values)


def read(app: App, slot: int, nbytes: int) -> list[int]:
    rc, *rest = app.ask(f"read {slot} 0 {nbytes} 0 0")
    assert rc == "0"
    return words(bytes.fromhex(rest[0]))


def pair(remote: Remote, memory_mib: str = "10240") -> tuple[Server, Server, str]:
    a, b = remote.server(), remote.server()
    token, _ = a.share(memory_mib=memory_mib)
    b.share(memory_mib=memory_mib, token=token)
    return a, b, token


def mapped(allocations: list[tuple[int, int]]) -> int:
    """What a migration maps for these (pointer, bytes) allocations: the union of their spans rounded out to
    the granularity (neighbours closer than it share a mapping, docs/remote.md)."""
    total, hi = 0, -1
    for ptr, nbytes in sorted(allocations):
        lo, end = ptr // GRANULE * GRANULE, -(-(ptr + nbytes) // GRANULE) * GRANULE
        if lo < hi:
            total += max(0, end - hi)
        else:
            total += end - lo
        hi = max(hi, end)
    return total


def ask_move(source: Server, target: Server) -> int:
    """The administrator's two steps; returns the worker that was asked to move its client."""
    (share,) = sorted(source.root.glob("share-*"))
    (share / "move-to").write_text(target.address + "\n")
    (worker,) = source.workers()
    os.kill(worker, signal.SIGUSR1)
    return worker


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def gone(pid: int) -> bool:
    return wait_for(lambda: not alive(pid))


def test_a_running_client_moves_with_its_memory_modules_streams_and_events(remote: Remote) -> None:
    a, b, token = pair(remote)
    app = remote.app(a, token)
    rng = random.Random(5)
    x = [rng.getrandbits(32) for _ in range(2048)]
    y = [rng.getrandbits(32) for _ in range(2048)]
    assert app.rc("ctx") == 0
    assert app.rc("alloc 0 8192") == 0 and app.rc("alloc 1 8192") == 0
    assert app.rc(f"write 0 0 0 0 {pack(x).hex()}") == 0 and app.rc(f"write 1 0 0 0 {pack(y).hex()}") == 0
    pointers = [app.ask(f"ptr {s}") for s in (0, 1)]
    held = mapped([(int(p[1]), 8192) for p in pointers])
    assert app.rc(f"load {MODULE}") == 0 and app.rc("func spin_us") == 0
    assert app.rc("stream 1") == 0 and app.rc("event 1") == 0
    assert app.rc("spin 300000 1") == 0  # 300 ms of device work running on stream 1 when the move is asked
    assert app.rc("func add_u32") == 0
    assert app.rc("adds 0 2048 5 1") == 0  # five more kernels queued behind it
    source_worker = ask_move(a, b)
    assert app.rc("ssync 1") == 0  # the waiting call: the context moves here, and the call runs on b
    assert wait_for(lambda: not alive(source_worker))  # the source let go of the GPU
    assert a.workers() == [] and len(b.workers()) == 1
    assert [app.ask(f"ptr {s}") for s in (0, 1)] == pointers
    expect_x = [(v + 5) & MASK for v in x]
    assert read(app, 0, 8192) == expect_x  # the kernels that ran on a, carried over
    assert read(app, 1, 8192) == y
    assert app.rc("adds 0 2048 1 1") == 0  # the same function handle and stream, now on b
    assert app.rc("func axpy_u32") == 0 and app.rc("axpy 2 0 1 2048 params 1") == 0
    assert app.rc("record 1 1") == 0 and app.rc("esync 1") == 0
    expect_x = [(v + 1) & MASK for v in expect_x]
    assert read(app, 0, 8192) == expect_x
    assert read(app, 1, 8192) == [(2 * p + q) & MASK for p, q in zip(expect_x, y, strict=True)]
    # b's share holds the rebuilt allocations at its VMM granularity
    assert app.ask("info") == ["0", str(10 * GIB - held), str(10 * GIB)]
    assert app.rc("free 0") == 0 and app.rc("free 1") == 0
    assert app.ask("info") == ["0", str(10 * GIB), str(10 * GIB)]
    assert app.rc("unload") == 0 and app.rc("edestroy 1") == 0 and app.rc("sdestroy 1") == 0
    err = app.close()
    assert app.proc.returncode == 0 and f"moved to {b.address}" in err


def test_migration_under_load_100_times_leaks_nothing(remote: Remote) -> None:
    a, b, token = pair(remote, memory_mib="1024")
    app = remote.app(a, token)
    base = list(range(1000, 1000 + 4096))
    assert app.rc("ctx") == 0 and app.rc("alloc 0 16384") == 0
    held = mapped([(int(app.ask("ptr 0")[1]), 16384)])
    assert app.rc(f"write 0 0 0 0 {pack(base).hex()}") == 0
    assert app.rc(f"load {MODULE}") == 0 and app.rc("stream 1") == 0
    servers = [a, b]
    for i in range(100):
        source, target = servers[i % 2], servers[(i + 1) % 2]
        assert app.rc("func spin_us") == 0 and app.rc("spin 2000 1") == 0  # work in flight at every move
        assert app.rc("func add_u32") == 0 and app.rc("adds 0 4096 1 1") == 0
        worker = ask_move(source, target)
        assert app.rc("sync") == 0, i
        assert gone(worker), i
        assert source.workers() == [] and len(target.workers()) == 1, i
    assert read(app, 0, 16384) == [v + 100 for v in base]
    assert app.ask("info") == ["0", str(GIB - held), str(GIB)]  # one buffer, nothing left behind
    err = app.close()
    assert app.proc.returncode == 0 and err.count("moved to") == 100


def test_a_move_to_an_unreachable_server_leaves_the_client_where_it_was(remote: Remote) -> None:
    a, _, token = pair(remote)
    app = remote.app(a, token)
    assert app.rc("ctx") == 0 and app.rc("alloc 0 64") == 0
    assert app.rc(f"write 0 0 0 0 {'07' * 64}") == 0
    (share,) = sorted(a.root.glob("share-*"))
    (share / "move-to").write_text(f"unix:{a.root / 'nobody-listens-here'}\n")
    (worker,) = a.workers()
    os.kill(worker, signal.SIGUSR1)
    assert app.rc("sync") == 0  # served by the source after the failed move
    assert a.workers() == [worker]
    assert app.ask("read 0 0 64 0 0") == ["0", "07" * 64]
    assert "could not move" in app.close()


def test_a_move_the_target_refuses_leaves_the_client_where_it_was(remote: Remote) -> None:
    a, b = remote.server(), remote.server()
    token, _ = a.share(memory_mib="1024")
    b.share(memory_mib="1024")  # another token: the target does not know this share
    app = remote.app(a, token)
    assert app.rc("ctx") == 0 and app.rc("alloc 0 64") == 0
    ask_move(a, b)
    assert app.rc("sync") == 0
    assert len(a.workers()) == 1
    assert wait_for(lambda: b.workers() == [])  # the refusing child has exited; nothing runs there


@pytest.mark.parametrize("gib", [1])
def test_the_pause_is_one_waiting_call(remote: Remote, gib: int) -> None:
    """A move of `gib` GiB of contents completes inside the one call that triggered it (what the benchmark
    times), and every byte arrives."""
    a, b, token = pair(remote, memory_mib=str(4 * 1024))
    app = remote.app(a, token)
    size = gib * GIB
    assert app.rc("ctx") == 0 and app.rc(f"alloc 0 {size}") == 0
    assert app.rc(f"memset 32 0 {0x5A5A1234} {size // 4} 0 0") == 0
    ask_move(a, b)
    rc, _ = app.ask("tsync")
    assert rc == "0"
    assert app.ask(f"read 0 {size - 8} 8 0 0") == ["0", "34125a5a" * 2]
    assert app.ask("read 0 0 8 0 0") == ["0", "34125a5a" * 2]
