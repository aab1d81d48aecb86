"""Remote shares on the GPU node (docs/remote.md, issue 30 item 2): the agent runs this node's GPU servers
and keeps their tokens file in step with the ResourceClaims of isolation remote allocated on its pool.

- Two `gpupool-gpu-server` processes: TCP on `remote_listen` (pods on other nodes) and a unix socket under
  `<hook_root>/remote/` (pods on this node, mounted into their containers by gpupool.agent.dra). Each is
  restarted when it dies, after a backoff (gpupool.cluster.reflector.Backoff) that resets once a server
  has run a minute; both are stopped with the agent, workers included (one process group each: no worker
  outlives the agent that would have to revoke it).
- The TCP server's address is published as `remoteServer` on the node's shared GPUs only while that
  server is up (`advertised`), so claims are only allocated remote shares a server answers for.
- A reflector over ResourceClaims (every namespace: a remote claim's pod may run anywhere): for each
  allocated claim of isolation remote whose device is in this node's pool, the share's hook directory
  `<hook_root>/remote/shares/<claim UID>/` is written exactly as a local `hook` claim's (hookdir.prepare_pod,
  limits from the allocation's consumed capacity read from the API: gpupool.agent.dra.share_grant) and a
  line `remote_token(key, UID) SHARE_DIR` in the tokens file. A claim deleted or deallocated loses both,
  and the workers serving it are killed (a worker's environment names its share: GPUPOOL_REMOTE_SHARE), so
  a revoked share ends at once and not when its client disconnects.
- The tokens file is private to the agent (0600: the server refuses any other mode) and rewritten whole
  (temporary file, rename) on every change; the server re-reads it at every connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpupool.agent.checkpoint import write_atomically
from gpupool.agent.config import AgentConfig
from gpupool.agent.devices import DeviceInfo
from gpupool.agent.dra import CLAIM_CONTAINER, RemoteClient, share_grant
from gpupool.agent.hookdir import HookLimits, HookPod, accounting_dir, hook_paths, prepare_pod, valid_uid
from gpupool.agent.port import AgentCluster
from gpupool.api.dra import DRIVER, REMOTE_ISOLATION, ClaimError, claim_shares, remote_token
from gpupool.cluster.port import RESOURCE_CLAIMS, ClusterPort, Kind, Obj, Selector
from gpupool.cluster.reflector import DELETED, Backoff, Reflector

log = logging.getLogger("gpupool.agent.remote")

SERVER_NAME = "gpupool-gpu-server"
CLIENT_LIBRARY = "libgpupool_remote.so"
MIN_KEY_BYTES = 16
_STABLE_S = 60.0  # a server that ran this long is healthy again: its next death restarts it at once
_STOP_GRACE_S = 2.0


class RemoteKeyError(ValueError):
    """The remote key file cannot be used; the message says which file and why."""


def load_key(path: Path) -> bytes:
    """The cluster's remote key: the file's content without surrounding whitespace (a Secret's value)."""
    try:
        key = path.read_bytes().strip()
    except OSError as e:
        raise RemoteKeyError(f"remote key file {path}: {e.strerror or e}") from None
    if len(key) < MIN_KEY_BYTES:
        raise RemoteKeyError(f"remote key file {path} holds {len(key)} bytes; at least {MIN_KEY_BYTES} are needed")
    return key


# --- host layout --------------------------------------------------------------------------------------------


def remote_root(hook_root: Path) -> Path:
    return hook_root / "remote"


def socket_path(hook_root: Path) -> Path:
    """This node's unix-socket server (mounted into remote containers on this node)."""
    return remote_root(hook_root) / "server.sock"


def tokens_path(hook_root: Path) -> Path:
    return remote_root(hook_root) / "tokens"


def share_dir(hook_root: Path, uid: str) -> Path:
    """A remote share's hook directory (not claims/<UID>: that is the claim's directory on the pod's node,
    which may be this node too)."""
    if not valid_uid(uid):  # it becomes a path
        raise ValueError(f"not a claim UID: {uid!r}")
    return remote_root(hook_root) / "shares" / uid


def client_library(hook_root: Path) -> Path:
    """Where the agent puts the forwarding library on the host (kubelet mounts host paths only)."""
    return hook_paths(hook_root).library.parent / CLIENT_LIBRARY


def install_client_library(hook_root: Path) -> str | None:
    """Copy the packaged forwarding library onto the host; the problem, if any (remote claims prepared on this
    node then fail to start on the missing mount instead of running without it)."""
    from gpupool.hook import library_path

    source = library_path().with_name(CLIENT_LIBRARY)
    target = client_library(hook_root)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(target, source.read_bytes())  # atomically: running containers map the old file
        target.chmod(0o755)
    except OSError as e:
        return f"cannot install {source} as {target}: {e.strerror or e}"
    return None


def remote_client(config: AgentConfig, key: bytes | None) -> RemoteClient:
    """What the DRA driver needs to prepare remote claims for pods of this node."""
    socket = socket_path(config.hook_root) if config.remote_listen is not None else None
    return RemoteClient(key=key, library=client_library(config.hook_root), socket=socket)


# --- the shares ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RemoteShare:
    uid: str
    label: str  # namespace/name of the claim
    gpu: str  # UUID
    memory_mib: int
    cores: float
    oversub_mib: int
    directory: Path
    token: str


def _line_safe(text: str) -> bool:
    return text.isprintable() and not any(c.isspace() for c in text)


def write_tokens(path: Path, shares: Mapping[str, RemoteShare]) -> None:
    """The server's tokens file: one `TOKEN SHARE_DIR` line per share, private to the agent, replaced whole."""
    lines = [f"{s.token} {s.directory}\n" for _, s in sorted(shares.items())]
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, "".join(lines).encode())  # created 0600, renamed over the old one
    path.chmod(0o600)


def share_of(claim: Mapping[str, Any], node: str, devices: Mapping[int, DeviceInfo], hook_root: Path,
             key: bytes) -> RemoteShare | None | str:
    """The remote share this node serves for `claim`: None when it is none of this node's (not allocated,
    another isolation, another pool), a reason when it is but cannot be served."""
    try:
        shares = claim_shares(claim)
    except ClaimError as e:
        results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
        ours = any(r.get("driver") == DRIVER and r.get("pool") == node for r in results)
        return str(e) if ours and "not allocated" not in str(e) else None
    if shares.isolation != REMOTE_ISOLATION or not any(s.pool == node for s in shares.devices):
        return None
    label = shares.label
    if len(shares.devices) != 1:
        return f"claim {label}: isolation remote serves one GPU share per claim; it is allocated {len(shares.devices)}"
    s = shares.devices[0]
    dev = devices.get(s.index)
    if dev is None or s.mig is not None:
        return f"claim {label}: node {node} has no shared GPU {s.device}"
    grant = share_grant(dev, s, shares)
    if isinstance(grant, str):
        return grant
    try:
        directory = share_dir(hook_root, shares.uid)
    except ValueError as e:
        return f"claim {label}: {e}"
    if not _line_safe(str(directory)):
        return f"claim {label}: share directory {directory} cannot be a line of the tokens file"
    return RemoteShare(shares.uid, label, dev.uuid, grant.memory_mib, grant.cores, grant.oversub_mib or 0,
                       directory, remote_token(key, shares.uid))


def prepare_share(share: RemoteShare) -> None:
    """The share's hook directory as a local `hook` claim's, except that the accounting directory in limits.v1
    is the host path: the server's workers run in the agent's mount namespace, not in a container."""
    limits = HookLimits(memory_mib=(share.memory_mib,), cores=(share.cores,), gpus=(share.gpu,),
                        accounting_dir=str(accounting_dir(share.directory)),
                        oversub_mib=(share.oversub_mib,) if share.oversub_mib else ())
    prepare_pod(HookPod(share.uid, share.label, CLAIM_CONTAINER, (share.gpu,), share.directory, limits))


# --- the servers --------------------------------------------------------------------------------------------


@dataclass
class GpuServer:
    """One supervised `gpupool-gpu-server` process."""

    name: str  # "tcp" or "unix"
    argv: list[str]
    restart_max_s: float
    changed: Callable[[], None] = lambda: None
    address: str = ""  # what the server reported ("listening ADDRESS") while it is up; "" when down
    restarts: int = 0
    last_error: str = ""
    proc: asyncio.subprocess.Process | None = field(default=None, repr=False)

    @property
    def up(self) -> bool:
        return bool(self.address) and self.proc is not None and self.proc.returncode is None

    async def run(self, stop: asyncio.Event) -> None:
        """Start, wait for its end, restart after a backoff; until `stop` is set (or cancelled)."""
        backoff = Backoff(initial_s=0.5, factor=2.0, max_s=self.restart_max_s)
        failures = 0
        try:
            while not stop.is_set():
                started = time.monotonic()
                await self._run_once()
                if stop.is_set():
                    break
                failures = 1 if time.monotonic() - started > _STABLE_S else failures + 1
                self.restarts += 1
                delay = backoff.delay(failures)
                log.warning("GPU server %s ended (%s); restarting in %.1f s", self.name, self.last_error, delay)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=delay)
        finally:
            await self.stop()

    async def _run_once(self) -> None:
        try:
            # a session of its own: the listener and its workers are one process group, ended together
            self.proc = proc = await asyncio.create_subprocess_exec(
                *self.argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, start_new_session=True)
        except OSError as e:
            self.last_error = f"cannot start {self.argv[0]}: {e.strerror or e}"
            return
        assert proc.stdout is not None
        first = (await proc.stdout.readline()).decode(errors="replace").split()
        if first[:1] == ["listening"] and len(first) > 1:
            self.address = first[1]
            log.info("GPU server %s listening on %s (pid %d)", self.name, self.address, proc.pid)
            self.changed()
        async for line in proc.stdout:  # keep the pipe drained; the server says little there
            log.info("GPU server %s: %s", self.name, line.decode(errors="replace").rstrip())
        code = await proc.wait()
        self.last_error = f"exit status {code}" if self.address else f"it did not start (exit status {code})"
        self._down()

    def _down(self) -> None:
        if self.address:
            self.address = ""
            self.changed()

    async def stop(self) -> None:
        """End the server and its workers (TERM, then KILL after a grace period)."""
        proc, self.proc = self.proc, None
        self._down()
        if proc is None or proc.returncode is not None:
            return
        for sig, wait in ((signal.SIGTERM, _STOP_GRACE_S), (signal.SIGKILL, None)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                await asyncio.wait_for(proc.wait(), timeout=wait)
                break
            except TimeoutError:
                continue

    def workers(self, proc_root: Path = Path("/proc")) -> list[int]:
        """The listener's children: one per connection being admitted or served."""
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return []
        try:
            children = proc_root / str(proc.pid) / "task" / str(proc.pid) / "children"
            return [int(p) for p in children.read_text().split()]
        except (OSError, ValueError):
            return []


def _share_of_worker(pid: int, proc_root: Path = Path("/proc")) -> str | None:
    try:
        env = (proc_root / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for entry in env:
        if entry.startswith(b"GPUPOOL_REMOTE_SHARE="):
            return entry.split(b"=", 1)[1].decode(errors="replace")
    return None


class _ClaimsPort:
    """The two calls a Reflector makes, over the agent's narrow cluster port (list and watch of claims)."""

    def __init__(self, cluster: AgentCluster) -> None:
        self.cluster = cluster

    async def list_objects(self, kind: Kind, *, namespace: str | None = None, labels: Selector | None = None,
                           fields: Selector | None = None) -> tuple[list[Obj], str]:
        return await self.cluster.list_claims()

    def watch_objects(self, kind: Kind, resource_version: str, *, namespace: str | None = None,
                      labels: Selector | None = None, fields: Selector | None = None) -> Any:
        return self.cluster.watch_claims(resource_version)


class RemoteServing:
    """The GPU-node side: servers, tokens file, share directories, and what the slice and metrics show."""

    def __init__(self, config: AgentConfig, key: bytes, cluster: AgentCluster,
                 devices: Callable[[], Mapping[str, DeviceInfo]], changed: Callable[[], None] = lambda: None,
                 proc_root: Path = Path("/proc")) -> None:
        assert config.remote_listen is not None
        self.config = config
        self.key = key
        self.devices = devices  # the node's GPUs by UUID (the device table's)
        self.changed = changed  # the slice and the inventory should be published again
        self.proc_root = proc_root
        root = config.hook_root
        self.tokens = tokens_path(root)
        self.shares: dict[str, RemoteShare] = {}
        self.refused: dict[str, str] = {}  # claim UID -> why it is not served (logged once)
        binary = config.remote_server_binary or Path(__file__).resolve().parent.parent / "hook" / SERVER_NAME
        argv = [str(binary), "--tokens", str(self.tokens), "--hook",
                str(config.remote_hook or hook_paths(root).library)]
        if config.remote_cuda:
            argv += ["--cuda", config.remote_cuda]
        if config.remote_limits_fd is not None:
            argv += ["--limits-fd", str(config.remote_limits_fd)]
        self.tcp = GpuServer("tcp", [argv[0], "--listen", config.remote_listen, *argv[1:]],
                             config.remote_restart_max_s, changed)
        self.unix = GpuServer("unix", [argv[0], "--listen", f"unix:{socket_path(root)}", *argv[1:]],
                              config.remote_restart_max_s)
        self.reflector = Reflector(cast(ClusterPort, _ClaimsPort(cluster)), RESOURCE_CLAIMS, on_event=self._on_claim)
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    # --- what others read ---------------------------------------------------------------------------------
    def advertised(self) -> str:
        """The address published as remoteServer: only while the TCP server is up."""
        if not self.tcp.up:
            return ""
        return self.config.remote_address or self.tcp.address

    def servers(self) -> tuple[GpuServer, GpuServer]:
        return self.tcp, self.unix

    def clients(self) -> int:
        return sum(len(s.workers(self.proc_root)) for s in self.servers())

    # --- lifecycle ----------------------------------------------------------------------------------------
    async def start(self) -> None:
        # a previous run's shares: the reflector's first list says which still hold; start from none
        await asyncio.to_thread(self._reset)
        self._stop.clear()
        self._tasks = [asyncio.create_task(s.run(self._stop), name=f"gpu-server-{s.name}") for s in self.servers()]
        self.reflector.start()

    async def stop(self) -> None:
        self._stop.set()
        await self.reflector.stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    def _reset(self) -> None:
        shutil.rmtree(remote_root(self.config.hook_root) / "shares", ignore_errors=True)
        write_tokens(self.tokens, {})

    # --- claims -------------------------------------------------------------------------------------------
    async def _on_claim(self, kind: str, obj: Obj, old: Obj | None) -> None:
        uid = str((obj.get("metadata") or {}).get("uid", ""))
        by_index = {d.index: d for d in self.devices().values()}
        found = None if kind == DELETED else share_of(obj, self.config.node_name, by_index, self.config.hook_root,
                                                      self.key)
        if isinstance(found, str):
            if self.refused.get(uid) != found:
                log.warning("remote share not served: %s", found)
            self.refused[uid] = found
            found = None
        else:
            self.refused.pop(uid, None)
        current = self.shares.get(uid)
        if found == current:
            return
        if found is not None:
            await asyncio.to_thread(prepare_share, found)
            await self._set({**self.shares, uid: found})
            log.info("serving remote share %s: %d MiB, %g %% of %s", found.label, found.memory_mib, found.cores,
                     found.gpu)
        else:
            await self._set({u: s for u, s in self.shares.items() if u != uid})
        if current is not None and current != found:
            await asyncio.to_thread(self._revoke, current)
        self.changed()

    async def _set(self, shares: dict[str, RemoteShare]) -> None:
        await asyncio.to_thread(write_tokens, self.tokens, shares)
        self.shares = shares

    def _revoke(self, share: RemoteShare) -> None:
        """After its token line is gone: end the workers that still serve it, then its directory."""
        if share.uid not in self.shares:
            for server in self.servers():
                for pid in server.workers(self.proc_root):
                    if _share_of_worker(pid, self.proc_root) == str(share.directory):
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
            shutil.rmtree(share.directory, ignore_errors=True)
            log.info("remote share %s revoked", share.label)


class RemoteCollector(Collector):
    """gpupool_remote_* on the agent's /metrics (where the agent serves remote shares)."""

    def __init__(self, serving: RemoteServing) -> None:
        self.serving = serving

    def collect(self) -> Iterator[Any]:
        s = self.serving
        up = GaugeMetricFamily("gpupool_remote_server_up", "Whether this node's GPU server listens (1) or not (0)",
                               labels=["listener"])
        for server in s.servers():
            up.add_metric([server.name], 1 if server.up else 0)
        yield up
        yield GaugeMetricFamily("gpupool_remote_shares", "Remote shares (claims) this node's GPU servers serve now",
                                value=len(s.shares))
        yield GaugeMetricFamily("gpupool_remote_clients",
                                "Connections this node's GPU servers serve now (one worker process each)",
                                value=s.clients())
