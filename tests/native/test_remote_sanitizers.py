"""Remote mode built with AddressSanitizer + UndefinedBehaviorSanitizer: the client library, the server (its
listener and its workers, which preload the sanitized interception library after the ASan runtime), the
fakes and both test programs. Data round trips, kernels with both parameter forms, streams and events, the
probe's memory session, a killed client and malformed messages must all leave every process's stderr free of
sanitizer reports, and every worker must exit cleanly (LeakSanitizer runs at its exit). A live migration
moves the program between two sanitized servers."""

from __future__ import annotations

import os
import signal
import socket
import struct
from pathlib import Path

import pytest

from tests.native.native_helpers import build_all
from tests.native.remote_helpers import Remote, RemoteBuilt, build_remote, wait_for
from tests.native.test_hook_sanitizers import CLEAN_ENV, SANITIZE, runtime
from tests.native.test_remote_programs import EXPECTED, memory_session

MODULE = "gpupool-fake-module:add_u32,axpy_u32,spin_us"
REPORTS = ("AddressSanitizer", "LeakSanitizer", "runtime error:", "UndefinedBehaviorSanitizer")


@pytest.fixture(scope="module")
def asan_remote(tmp_path_factory: pytest.TempPathFactory) -> tuple[RemoteBuilt, str]:
    root = tmp_path_factory.mktemp("asan-remote")
    return build_remote(root / "remote", build_all(root / "base", SANITIZE), SANITIZE), runtime()


def test_the_remote_build_is_really_sanitized(asan_remote: tuple[RemoteBuilt, str]) -> None:
    rb, _ = asan_remote
    for binary in (rb.client_dir / "libcuda.so.1", rb.server):
        assert b"__asan_report_load" in binary.read_bytes(), binary
        assert b"__ubsan_handle" in binary.read_bytes(), binary


def test_forwarding_end_to_end_is_clean_under_the_sanitizers(asan_remote: tuple[RemoteBuilt, str],
                                                             tmp_path: Path) -> None:
    rb, asan = asan_remote
    remote = Remote(rb, tmp_path / "gpu", tmp_path / "remote")
    try:
        server = remote.server(extra_env=CLEAN_ENV, hook=False, args=("--hook", f"{asan}:{rb.base.hook}"))
        token, pod = server.share(memory_mib="10240")
        small, small_pod = server.share(memory_mib="1024")
        probe = remote.probe(server, token, "gpa2")
        assert memory_session(probe) == EXPECTED
        app = remote.app(server, small, extra=CLEAN_ENV)
        assert app.rc("ctx") == 0
        data = bytes(range(256)) * 4
        assert app.rc("alloc 0 1024") == 0 and app.rc("alloc 1 1024") == 0
        assert app.rc(f"write 0 0 0 0 {data.hex()}") == 0
        assert app.rc(f"load {MODULE}") == 0
        assert app.rc("func add_u32") == 0 and app.rc("func add_u32") == 0  # the same handle twice
        assert app.rc("add 0 256 5 params 0") == 0 and app.rc("add 0 256 5 extra 0") == 0
        assert app.rc("stream 1") == 0 and app.rc("event 1") == 0
        assert app.rc("adds 0 256 20 1") == 0 and app.rc("record 1 1") == 0 and app.rc("esync 1") == 0
        assert app.rc("func axpy_u32") == 0 and app.rc("axpy 2 0 1 256 params 1") == 0
        rc, back = app.ask("read 1 0 1024 1 1")
        x = [(v + 30) & 0xFFFFFFFF for v in struct.unpack("<256I", data)]
        assert rc == "0" and struct.unpack("<256I", bytes.fromhex(back)) == tuple((2 * v) & 0xFFFFFFFF for v in x)
        assert app.ask("big 9000000 3 1") == ["0", "1"]
        assert app.rc("func add_u32") == 0
        assert app.rc("add 0 100000 1 params 0") == 0 and app.rc("sync") == 700
        target = remote.server(extra_env=CLEAN_ENV, hook=False, args=("--hook", f"{asan}:{rb.base.hook}"))
        target.share(memory_mib="1024", token=small)
        (small_pod.hook_dir / "move-to").write_text(target.address + "\n")
        for worker in server.workers_of(small_pod):
            os.kill(worker, signal.SIGUSR1)
        assert app.rc("sync") == 0  # a live migration, both ends sanitized
        rc, back = app.ask("read 1 0 1024 0 0")
        assert rc == "0" and struct.unpack("<256I", bytes.fromhex(back)) == tuple((2 * v) & 0xFFFFFFFF for v in x)
        assert app.rc("unload") == 0 and app.rc("edestroy 1") == 0 and app.rc("sdestroy 1") == 0
        assert app.rc("managed") == 801

        victim = remote.app(server, small, extra=CLEAN_ENV)
        assert victim.rc("ctx") == 0 and victim.rc("alloc 0 4096") == 0
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait()

        raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        raw.settimeout(20)
        raw.connect(server.address[5:])
        t = token.encode()
        raw.sendall(struct.pack("<IIIIII", 1, 0, 12 + len(t), 0x31525047, 1, len(t)) + t)
        raw.sendall(struct.pack("<III", 6, 0, 3) + b"abc" + struct.pack("<III", 6, 0, 64 << 20))
        while raw.recv(4096):
            pass  # the replies, then the server hangs up on the oversized message
        raw.close()

        for client in (probe, app):
            err = client.close()
            assert client.proc.returncode == 0 and not any(r in err for r in REPORTS), err
        assert wait_for(lambda: server.workers() == [] and target.workers() == [], timeout=30)  # exits ran LSan
    finally:
        remote.close()
    for s in (server, target):
        err = s.close()
        assert not any(r in err for r in REPORTS), err
    assert pod.hook_dir.exists()
