"""Remote mode (docs/remote.md) against the fake driver: what forwarding costs per call and per byte.

Builds the fake driver, gpupool's interception library, the remote client library, the GPU server and the
test program (tests/native/fakes/remote_app.c), then per round:
  - round trip of one forwarded call (cuCtxSynchronize: a request and its reply, nothing else), p50 and p99,
    over TCP on loopback, over a unix socket, and over TCP across two network namespaces joined by a veth
    pair (root and iproute2 needed; null otherwise); beside it the same call on the fake driver directly
    (the server's worker adds the interception library's wrapper to it);
  - memcpy bandwidth (64 MiB host to device and back, best of 3 each way) through the forwarder over TCP
    loopback, as a ratio of the same copies by the same program on the same fake driver without it;
  - live migration pause: a program holding 512 MiB of written device memory is moved between two servers
    (unix sockets); the one call that carries the move is timed, per GiB moved;
  - programs_ok: the hook tests' memory session (probe.c) answers as locally, a pattern sent through a
    kernel comes back as computed here, and the moved memory reads back intact.
Figures are medians of the rounds; the machine's own speed is in every number (the fake driver takes a
file lock per call), so the ratio is the portable figure. The last line is one JSON object.

    python benchmarks/remote_gpu.py [--rounds 5] [--calls 5000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import struct
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.native.native_helpers import build_all, have_cc  # noqa: E402
from tests.native.remote_helpers import NetnsPair, Remote, Server, build_remote, netns_pair  # noqa: E402
from tests.native.test_remote_programs import EXPECTED, memory_session  # noqa: E402

COPY_BYTES = 64 << 20
MOVE_BYTES = 512 << 20
MODULE = "gpupool-fake-module:add_u32"


def rtt(remote: Remote, server: Server | None, token: str, calls: int,
        netns: str | None = None) -> tuple[float, float]:
    """p50, p99 of one cuCtxSynchronize in us: through `server`, or (None) on the fake driver directly."""
    app = remote.app(server, token, netns=netns)
    try:
        if app.rc("ctx") != 0:
            raise SystemExit(f"no context through {server.address if server else 'the fake driver'}")
        app.ask(f"rtt {max(calls // 10, 10)}")  # warm-up
        rc, p50, p99 = (int(v) for v in app.ask(f"rtt {calls}"))
        if rc != 0:
            raise SystemExit(f"cuCtxSynchronize failed with CUDA error {rc}")
        return p50 / 1000, p99 / 1000
    finally:
        app.close()


def copy_ns(remote: Remote, server: Server | None, token: str = "") -> float:
    app = remote.app(server, token)
    try:
        if app.rc("ctx") != 0:
            raise SystemExit("no context")
        rc, up, down = (int(v) for v in app.ask(f"copy {COPY_BYTES} 3"))
        if rc != 0:
            raise SystemExit(f"the copies failed with CUDA error {rc}")
        return float(up + down)
    finally:
        app.close()


def migrate_pause_ms(remote: Remote) -> tuple[float, bool]:
    """(pause in ms for MOVE_BYTES, whether the memory came back intact)."""
    source, target = remote.server(), remote.server()
    token, pod = source.share(memory_mib="4096")
    target.share(memory_mib="4096", token=token)
    app = remote.app(source, token)
    try:
        ok = app.rc("ctx") == 0 and app.rc(f"alloc 0 {MOVE_BYTES}") == 0
        ok &= app.rc(f"memset 32 0 {0x5A5A1234} {MOVE_BYTES // 4} 0 0") == 0 and app.rc("sync") == 0
        (pod.hook_dir / "move-to").write_text(target.address + "\n")
        for worker in source.workers_of(pod):
            os.kill(worker, signal.SIGUSR1)
        rc, ns = app.ask("tsync")
        ok &= rc == "0" and len(target.workers()) == 1
        ok &= app.ask(f"read 0 {MOVE_BYTES - 8} 8 0 0") == ["0", "34125a5a" * 2]
        return int(ns) / 1e6, bool(ok)
    finally:
        app.close()


def programs_ok(remote: Remote, server: Server) -> bool:
    token, _ = server.share(memory_mib="10240")  # the hook tests' 10 GiB share
    probe = remote.probe(server, token, "gpa2")
    ok = memory_session(probe) == EXPECTED
    probe.close()
    other, pod = server.share(memory_mib="1024")
    app = remote.app(server, other)
    data = bytes(range(256)) * 16
    ok &= app.rc("ctx") == 0 and app.rc("alloc 0 4096") == 0 and app.rc(f"write 0 0 0 0 {data.hex()}") == 0
    ok &= app.rc(f"load {MODULE}") == 0 and app.rc("func add_u32") == 0 and app.rc("adds 0 1024 9 0") == 0
    rc, back = app.ask("read 0 0 4096 0 0")
    expect = struct.pack("<1024I", *[(v + 9) & 0xFFFFFFFF for v in struct.unpack("<1024I", data)])
    ok &= rc == "0" and bytes.fromhex(back) == expect
    app.close()
    return bool(ok and pod.hook_dir.exists())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=5000)
    args = parser.parse_args()
    if args.rounds < 1 or args.calls < 100:
        parser.error("--rounds must be >= 1 and --calls >= 100")
    if not have_cc():
        raise SystemExit("needs a C compiler (cc)")
    cores = len(os.sched_getaffinity(0))
    print(f"cores available: {cores} (os.cpu_count {os.cpu_count()})")
    use_netns = os.geteuid() == 0 and shutil.which("ip") is not None
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        rb = build_remote(root / "remote", build_all(root / "build"))
        rows: dict[str, list[float]] = {k: [] for k in ("tcp_p50", "tcp_p99", "unix_p50", "unix_p99", "netns_p50",
                                                         "netns_p99", "ratio", "pause", "local_p50")}
        ok = True
        for r in range(args.rounds):
            remote = Remote(rb, root / f"gpu-{r}", root / f"round-{r}")
            pair: NetnsPair | None = None
            try:
                tcp = remote.server(listen="tcp:127.0.0.1:0")
                tcp_token, _ = tcp.share(memory_mib="81920")
                unix = remote.server()
                unix_token, _ = unix.share(memory_mib="81920")
                rows["local_p50"].append(rtt(remote, None, "", args.calls)[0])
                p50, p99 = rtt(remote, tcp, tcp_token, args.calls)
                rows["tcp_p50"].append(p50)
                rows["tcp_p99"].append(p99)
                p50, p99 = rtt(remote, unix, unix_token, args.calls)
                rows["unix_p50"].append(p50)
                rows["unix_p99"].append(p99)
                if use_netns:
                    pair = netns_pair()
                    far = remote.server(listen=f"tcp:{pair.server_ip}:0", netns=pair.server_ns)
                    far_token, _ = far.share(memory_mib="81920")
                    p50, p99 = rtt(remote, far, far_token, args.calls, netns=pair.client_ns)
                    rows["netns_p50"].append(p50)
                    rows["netns_p99"].append(p99)
                local = copy_ns(remote, None)
                forwarded = copy_ns(remote, tcp, tcp_token)
                rows["ratio"].append(local / forwarded)
                ok &= programs_ok(remote, unix)
                pause_ms, moved_ok = migrate_pause_ms(remote)
                ok &= moved_ok
                rows["pause"].append(pause_ms / (MOVE_BYTES / (1 << 30)))
                print(f"round {r + 1}: rtt tcp p50 {rows['tcp_p50'][-1]:.1f} us, unix p50 "
                      f"{rows['unix_p50'][-1]:.1f} us, memcpy local {COPY_BYTES * 2 / local:.2f} GB/s, "
                      f"forwarded {COPY_BYTES * 2 / forwarded:.2f} GB/s, migration pause {pause_ms:.1f} ms "
                      f"for {MOVE_BYTES >> 20} MiB")
            finally:
                remote.close()
                if pair is not None:
                    pair.close()

    def med(key: str) -> float | None:
        return round(statistics.median(rows[key]), 2) if rows[key] else None

    print(f"call round trip (cuCtxSynchronize), median of {args.rounds} rounds of {args.calls} calls:")
    print(f"  local (no forwarder, same fake driver, no interception library)  p50 {med('local_p50')} us")
    print(f"  TCP loopback      p50 {med('tcp_p50')} us  p99 {med('tcp_p99')} us")
    print(f"  unix socket       p50 {med('unix_p50')} us  p99 {med('unix_p99')} us")
    print(f"  TCP across netns  p50 {med('netns_p50')} us  p99 {med('netns_p99')} us")
    print(f"memcpy bandwidth through the forwarder / local (64 MiB each way): {med('ratio')}")
    print(f"live migration pause: {med('pause')} ms per GiB moved ({MOVE_BYTES >> 20} MiB moved per round)")
    print(json.dumps({
        "call_rtt_p50_us": med("tcp_p50"),
        "call_rtt_p99_us": med("tcp_p99"),
        "call_rtt_unix_p50_us": med("unix_p50"),
        "local_call_p50_us": med("local_p50"),
        "call_rtt_netns_p50_us": med("netns_p50"),
        "call_rtt_netns_p99_us": med("netns_p99"),
        "memcpy_ratio": med("ratio"),
        "migrate_pause_ms_per_gib": med("pause"),
        "programs_ok": ok,
        "cores": cores,
    }))


if __name__ == "__main__":
    main()
