"""Remote mode: data goes to the server's device and comes back intact, kernels run there with the program's
parameters, streams and events keep their order, and what is not forwarded fails cleanly. The program
(fakes/remote_app.c) runs the same commands on the fake driver directly and through the forwarder; every
expected value is computed here, from the bytes the test wrote."""

from __future__ import annotations

import random
import struct

import pytest

from tests.native.remote_helpers import NOT_SUPPORTED, App, Remote, remote, remote_built

__all__ = ["remote", "remote_built"]  # fixtures

MODULE = "gpupool-fake-module:add_u32,axpy_u32,spin_us"
MASK = 0xFFFFFFFF
ILLEGAL_ADDRESS = 700
NOT_FOUND = 500
INVALID_IMAGE = 200
NOT_READY = 600


def words(data: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(data) // 4}I", data))


def pack(values: list[int]) -> bytes:
    return struct.pack(f"<{len(values)}I", *values)


def read(app: App, slot: int, nbytes: int, offset: int = 0, asynchronous: int = 0, stream: int = 0) -> bytes:
    rc, *rest = app.ask(f"read {slot} {offset} {nbytes} {asynchronous} {stream}")
    assert int(rc) == 0
    return bytes.fromhex(rest[0]) if rest else b""


def start(remote: Remote, where: str, memory_mib: str = "10240") -> App:
    """The program with a context: on the fake driver itself ("local") or through a server ("remote")."""
    if where == "local":
        app = remote.app(None)
    else:
        server = remote.server()
        token, _ = server.share(memory_mib=memory_mib)
        app = remote.app(server, token)
    assert app.rc("ctx") == 0
    return app


WHERE = ["local", "remote"]


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("how", ["params", "extra"])
def test_a_pattern_goes_out_through_a_kernel_and_comes_back(remote: Remote, where: str, how: str) -> None:
    app = start(remote, where)
    rng = random.Random(11)
    x = [rng.getrandbits(32) for _ in range(1024)]
    y = [rng.getrandbits(32) for _ in range(1024)]
    for slot in (0, 1):
        assert app.rc(f"alloc {slot} 4096") == 0
    assert app.rc(f"write 0 0 0 0 {pack(x).hex()}") == 0
    assert app.rc(f"write 1 0 0 0 {pack(y).hex()}") == 0
    assert app.rc(f"load {MODULE}") == 0
    assert app.rc("func add_u32") == 0
    assert app.rc(f"add 0 1000 7 {how} 0") == 0  # the first 1000 words only
    expect_x = [(v + 7) & MASK for v in x[:1000]] + x[1000:]
    assert words(read(app, 0, 4096)) == expect_x
    assert app.rc("func axpy_u32") == 0  # a layout with padding: u32, then 8-aligned pointers
    assert app.rc(f"axpy 3 0 1 1024 {how} 0") == 0
    assert words(read(app, 1, 4096)) == [(3 * a + b) & MASK for a, b in zip(expect_x, y, strict=True)]
    assert words(read(app, 0, 16, offset=400)) == expect_x[100:104]  # device pointer arithmetic


@pytest.mark.parametrize("where", WHERE)
def test_asynchronous_work_is_pipelined_and_kept_in_order(remote: Remote, where: str) -> None:
    app = start(remote, where)
    data = bytes(range(256)) * 16
    assert app.rc("alloc 0 4096") == 0 and app.rc("alloc 1 4096") == 0
    assert app.rc("stream 1") == 0
    assert app.rc(f"write 0 0 1 1 {data.hex()}") == 0
    assert app.rc(f"load {MODULE}") == 0 and app.rc("func add_u32") == 0
    assert app.rc("adds 0 1024 500 1") == 0  # 500 launches, no reply awaited for any of them
    assert app.rc("memset 32 1 3735928559 1024 1 1") == 0
    assert app.rc("dtod 1 0 64 1 1") == 0  # the first 64 bytes of buffer 1 from buffer 0, in stream order
    assert app.rc("ssync 1") == 0
    expect0 = [(v + 500) & MASK for v in words(data)]
    assert words(read(app, 0, 4096, asynchronous=1, stream=1)) == expect0
    assert words(read(app, 1, 4096)) == expect0[:16] + [0xDEADBEEF] * 1008


@pytest.mark.parametrize("where", WHERE)
def test_memsets_of_each_width(remote: Remote, where: str) -> None:
    app = start(remote, where)
    assert app.rc("alloc 0 64") == 0 and app.rc("alloc 1 64") == 0
    assert app.rc("memset 8 0 171 64 0 0") == 0
    assert read(app, 0, 64) == b"\xab" * 64
    assert app.rc("memset 8 1 0 64 0 0") == 0
    assert app.rc("memset 16 1 4660 8 0 0") == 0  # 0x1234 in the first 16 bytes
    assert read(app, 1, 64) == b"\x34\x12" * 8 + bytes(48)
    assert app.rc("memset 32 0 305419896 4 1 0") == 0  # 0x12345678, asynchronous, NULL stream
    assert app.rc("sync") == 0
    assert read(app, 0, 64) == struct.pack("<4I", *[0x12345678] * 4) + b"\xab" * 48


@pytest.mark.parametrize("asynchronous", [0, 1])
def test_copies_larger_than_one_message_arrive_whole(remote: Remote, asynchronous: int) -> None:
    app = start(remote, "remote")
    assert app.ask(f"big {20 * 2**20 + 12345} 9 {asynchronous}") == ["0", "1"]  # 3 chunks each way


@pytest.mark.parametrize("where", WHERE)
def test_events_time_device_work(remote: Remote, where: str) -> None:
    app = start(remote, where)
    assert app.rc(f"load {MODULE}") == 0 and app.rc("func spin_us") == 0
    assert app.rc("stream 2") == 0
    for e in (1, 2, 3):
        assert app.rc(f"event {e}") == 0
    assert app.rc("record 1 2") == 0
    assert app.rc("spin 30000 2") == 0  # 30 ms of device time on stream 2
    assert app.rc("record 2 2") == 0
    assert app.rc("esync 2") == 0
    assert app.rc("equery 2") == 0
    rc, micros = (int(v) for v in app.ask("elapsed 1 2"))
    assert rc == 0 and micros >= 30000  # device time between the records, not a speed
    assert app.rc("spin 200000 2") == 0
    assert app.rc("record 3 2") == 0
    assert app.rc("wait 0 3") == 0  # the NULL stream waits for stream 2's event
    assert app.rc("sync") == 0
    assert app.rc("equery 3") == 0
    for e in (1, 2, 3):
        assert app.rc(f"edestroy {e}") == 0
    assert app.rc("sdestroy 2") == 0


def test_a_kernels_fault_surfaces_at_the_next_synchronising_call_once(remote: Remote) -> None:
    """Launches are not waited for: the server keeps the first failure of one and hands it to the next call
    that waits, as the driver reports an asynchronous kernel fault."""
    app = start(remote, "remote")
    assert app.rc("alloc 0 64") == 0
    assert app.rc(f"load {MODULE}") == 0 and app.rc("func add_u32") == 0
    assert app.rc("add 0 4096 1 params 0") == 0  # 16 KiB of a 64-byte buffer: returns at once
    assert app.rc("sync") == ILLEGAL_ADDRESS
    assert app.rc("sync") == 0
    assert words(read(app, 0, 8)) == [0, 0]


def test_the_device_is_described_from_the_server(remote: Remote) -> None:
    app = start(remote, "remote", memory_mib="10240")
    assert app.ask("dev") == ["0", "1", "9", "0", str(10 << 30), "gpupool_fake_GPU"]  # the share, not 80 GiB


def test_the_primary_context_path(remote: Remote) -> None:
    server = remote.server()
    token, _ = server.share(memory_mib="1024")
    app = remote.app(server, token)
    assert app.rc("primary") == 0
    assert app.rc("alloc 0 16") == 0
    assert app.rc(f"write 0 0 0 0 {'01' * 16}") == 0
    assert read(app, 0, 16) == b"\x01" * 16
    assert app.ask("info") == ["0", str((1 << 30) - 16), str(1 << 30)]


def test_what_is_not_forwarded_or_not_found_fails_cleanly(remote: Remote) -> None:
    app = start(remote, "remote")
    assert app.rc("managed") == NOT_SUPPORTED
    assert app.rc("gpa cuNoSuchEntryPoint") == NOT_FOUND
    assert app.ask("errname 801") == ["0", "CUDA_ERROR_NOT_SUPPORTED"]
    assert app.rc("load not-a-module-image") == INVALID_IMAGE
    assert app.rc(f"load {MODULE}") == 0
    assert app.rc("func no_such_kernel") == NOT_FOUND
    assert app.rc("alloc 0 16") == 0 and app.rc("sync") == 0  # the context is fine afterwards
    assert app.close() == ""
