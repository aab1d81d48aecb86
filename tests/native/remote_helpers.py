"""Remote mode's test harness (docs/remote.md): builds the client library (installed as libcuda.so.1 in a
folder of its own, as a container without a GPU would have it), the GPU server and the data test program
(fakes/remote_app.c), runs servers (optionally in a network namespace) over the fake driver with gpupool's
interception library preloaded into their workers, and runs clients: the probe of the hook tests
(fakes/probe.c) and remote_app.

Shares are granted exactly as the agent grants a local `hook` pod: limits.v1 written by the agent's own
writer; the server maps each share's token to that directory (its token file). The test build of the
interception library reads its limits from /proc/self/fd/201 (native_helpers.LIMITS_DEFINE), so the server
runs with --limits-fd 201."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.native.native_helpers import (
    CC_FLAGS,
    FAKES,
    LIMITS_FD,
    Built,
    Pod,
    Probe,
    _cc,
    drain,
    end_process,
    native_build,
)

NOT_SUPPORTED = 801
NOT_PERMITTED = 800
LAUNCH_FAILED = 719
NO_DEVICE = 100
INVALID_CONTEXT = 201


@dataclass(frozen=True)
class RemoteBuilt:
    base: Built          # the fake driver, fake NVML, probe and interception library
    client_dir: Path     # libcuda.so.1 here is the remote client library
    server: Path
    app: Path            # fakes/remote_app.c, linked against libcuda.so.1


def build_remote(out: Path, base: Built, extra: list[str] | None = None) -> RemoteBuilt:
    extra = extra or []
    out.mkdir(parents=True, exist_ok=True)
    client, server = native_build().compile_remote(out, extra)
    client_dir = out / "client"
    client_dir.mkdir(exist_ok=True)
    os.replace(client, client_dir / "libcuda.so.1")
    app = out / "remote_app"
    _cc(*CC_FLAGS, *extra, "-o", str(app), str(FAKES / "remote_app.c"), f"-L{base.dir}", "-l:libcuda.so.1",
        "-ldl", "-lpthread")
    return RemoteBuilt(base, client_dir, server, app)


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPOOL_", "FAKE_GPU_"))}
    env.pop("LD_PRELOAD", None)
    return env


def netns_prefix(netns: str | None) -> list[str]:
    return ["ip", "netns", "exec", netns] if netns else []


class Server:
    """One GPU server over the fake device `state`; shares are folders under `root`."""

    def __init__(self, rb: RemoteBuilt, state: Path, root: Path, listen: str | None = None,
                 netns: str | None = None, hook: bool = True, extra_env: dict[str, str] | None = None,
                 args: tuple[str, ...] = ()) -> None:
        self.rb, self.state, self.root, self.netns = rb, state, root, netns
        root.mkdir(parents=True, exist_ok=True)
        self.tokens = root / "tokens"
        self.tokens.touch(mode=0o600)
        os.chmod(self.tokens, 0o600)
        self.count = 0
        env = _clean_env()
        env.update(LD_LIBRARY_PATH=str(rb.base.dir), FAKE_GPU_STATE=str(state))
        env.update(extra_env or {})
        self.listen = listen or f"unix:{root / 'server.sock'}"
        argv = [*netns_prefix(netns), str(rb.server), "--listen", self.listen, "--tokens", str(self.tokens),
                "--limits-fd", str(LIMITS_FD), *args]
        if hook:
            argv += ["--hook", str(rb.base.hook)]
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        assert line[:1] == ["listening"], f"the server did not start: {self.stderr()}"
        self.address = line[1]

    def share(self, memory_mib: str | None = None, cores: str | None = None, mode: str | None = None,
              token: str | None = None, oversub_mib: int = 0, gpus: tuple[str, ...] = ()) -> tuple[str, Pod]:
        """A share granted as the agent grants a pod, and its token (written into the server's file)."""
        self.count += 1
        hook_dir = self.root / f"share-{self.count}"
        hook_dir.mkdir()
        pod = Pod(self.rb.base, self.state, hook_dir, memory_mib=memory_mib, cores=cores, mode=mode, granted=True,
                  oversub_mib=oversub_mib, gpus=gpus)
        pod.write_limits()
        token = token or secrets.token_hex(16)
        with self.tokens.open("a") as f:
            f.write(f"{token} {hook_dir}\n")
        return token, pod

    def workers(self) -> list[int]:
        """The server's per-connection processes (its children)."""
        path = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        try:
            return [int(p) for p in path.read_text().split()]
        except OSError:
            return []

    def workers_of(self, pod: Pod) -> list[int]:
        """The workers serving one share (their environment names it)."""
        found = []
        for pid in self.workers():
            with contextlib.suppress(OSError):
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                if f"GPUPOOL_REMOTE_SHARE={pod.hook_dir}".encode() in env:
                    found.append(pid)
        return found

    def stderr(self) -> str:
        if self.proc.poll() is None or self.proc.stderr is None:
            return ""
        return self.proc.stderr.read()

    def kill(self) -> None:
        """kill -9 the listener and every worker (one process group)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def close(self) -> str:
        if self.proc.poll() is None:
            self.kill()
        return drain(self.proc)


def client_env(rb: RemoteBuilt, address: str, token: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """What the agent gives a remote container: the client library as libcuda.so.1, the server, the token."""
    env = _clean_env()
    env.update(LD_LIBRARY_PATH=str(rb.client_dir), GPUPOOL_REMOTE_SERVER=address, GPUPOOL_REMOTE_TOKEN=token)
    env.update(extra or {})
    return env


def start_probe(rb: RemoteBuilt, address: str, token: str, mode: str = "direct", netns: str | None = None,
                extra: dict[str, str] | None = None) -> Probe:
    """The hook tests' probe, with the remote library as its driver."""
    argv = [*netns_prefix(netns), str(rb.base.probe), mode]
    return Probe(subprocess.Popen(argv, env=client_env(rb, address, token, extra), stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1))


class App:
    """remote_app (fakes/remote_app.c): one command, one answer line (as words)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc

    @property
    def pid(self) -> int:
        return self.proc.pid

    def ask(self, command: str) -> list[str]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line and self.proc.stderr is not None:
            self.proc.wait(timeout=10)
            raise AssertionError(f"remote_app died on {command[:80]!r}: {self.proc.stderr.read()[:2500]}")
        return line.split()

    def rc(self, command: str) -> int:
        return int(self.ask(command)[0])

    def close(self) -> str:
        return end_process(self.proc, 20)


def start_app(rb: RemoteBuilt, address: str | None, token: str = "", netns: str | None = None,
              state: Path | None = None, extra: dict[str, str] | None = None) -> App:
    """remote_app through the forwarder, or (address None) on the fake driver directly, for comparisons."""
    if address is None:
        env = _clean_env()
        env.update(LD_LIBRARY_PATH=str(rb.base.dir), FAKE_GPU_STATE=str(state))
        env.update(extra or {})
    else:
        env = client_env(rb, address, token, extra)
    argv = [*netns_prefix(netns), str(rb.app)]
    return App(subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, bufsize=1))


class NetnsPair:
    """Two network namespaces joined by a veth pair: the server's at `server_ip`, the client's at `client_ip`
    (needs root and iproute2, as the issue's test plan does)."""

    def __init__(self, tag: str, subnet: int) -> None:
        self.server_ns, self.client_ns = f"gprs{tag}", f"gprc{tag}"
        self.server_link, self.client_link = f"vs{tag}", f"vc{tag}"
        net = f"10.{subnet >> 8 & 255}.{subnet & 255}"
        self.server_ip, self.client_ip = f"{net}.1", f"{net}.2"
        cmds = [
            ["ip", "netns", "add", self.server_ns],
            ["ip", "netns", "add", self.client_ns],
            ["ip", "link", "add", f"vs{tag}", "netns", self.server_ns, "type", "veth", "peer", "name", f"vc{tag}",
             "netns", self.client_ns],
            ["ip", "-n", self.server_ns, "addr", "add", f"{self.server_ip}/30", "dev", f"vs{tag}"],
            ["ip", "-n", self.client_ns, "addr", "add", f"{self.client_ip}/30", "dev", f"vc{tag}"],
            ["ip", "-n", self.server_ns, "link", "set", f"vs{tag}", "up"],
            ["ip", "-n", self.client_ns, "link", "set", f"vc{tag}", "up"],
            ["ip", "-n", self.server_ns, "link", "set", "lo", "up"],
            ["ip", "-n", self.client_ns, "link", "set", "lo", "up"],
        ]
        try:
            for cmd in cmds:
                subprocess.run(cmd, check=True, capture_output=True, text=True)
        except (subprocess.CalledProcessError, FileNotFoundError):
            self.close()
            raise

    def close(self) -> None:
        for ns in (self.server_ns, self.client_ns):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def netns_pair() -> NetnsPair:
    tag = f"{os.getpid() % 100000}{secrets.randbelow(1000)}"
    return NetnsPair(tag[-9:], 0x1000 + os.getpid() % 0xE000)


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll `predicate` until true or `timeout` seconds pass."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())


# ---- fixtures (imported by the test modules) ----------------------------------------------------------------
@dataclass
class Remote:
    """What one test started: servers, probes and apps, all ended at teardown."""

    rb: RemoteBuilt
    device: Path
    root: Path
    servers: list[Server] = field(default_factory=list)
    probes: list[Probe] = field(default_factory=list)
    apps: list[App] = field(default_factory=list)

    def server(self, **kwargs: object) -> Server:
        server = Server(self.rb, self.device, self.root / f"server-{len(self.servers) + 1}",
                        **kwargs)  # type: ignore[arg-type]
        self.servers.append(server)
        return server

    def probe(self, server: Server, token: str, mode: str = "direct", address: str | None = None,
              netns: str | None = None) -> Probe:
        probe = start_probe(self.rb, address or server.address, token, mode, netns)
        self.probes.append(probe)
        return probe

    def app(self, server: Server | None, token: str = "", address: str | None = None,
            netns: str | None = None, extra: dict[str, str] | None = None) -> App:
        where = address or (server.address if server is not None else None)
        app = start_app(self.rb, where, token, netns, self.device, extra)
        self.apps.append(app)
        return app

    def close(self) -> None:
        try:
            for probe in self.probes:
                if probe.proc.poll() is None:
                    probe.proc.kill()
                probe.close()
            for app in self.apps:
                if app.proc.poll() is None:
                    app.proc.kill()
                app.close()
        finally:  # whatever went wrong above, no server outlives its test
            for server in self.servers:
                server.close()


@pytest.fixture(scope="session")
def remote_built(built: Built, tmp_path_factory: pytest.TempPathFactory) -> RemoteBuilt:
    return build_remote(tmp_path_factory.mktemp("remote"), built)


@pytest.fixture
def remote(remote_built: RemoteBuilt, device: Path, tmp_path: Path) -> Iterator[Remote]:
    r = Remote(remote_built, device, tmp_path / "remote")
    yield r
    r.close()
