"""Remote shares on the GPU node (docs/remote.md, issue 30 item 2): the agent runs this node's GPU servers
and keeps their tokens file in step with the ResourceClaims of isolation remote allocated on its pool.

- Two `gpupool-gpu-server` processes: TCP on `remote_listen` (pods on other nodes) and a unix socket under
  `<hook_root>/remote/` (pods on this node, mounted into their containers by gpupool.agent.dra.driver). Each is
  restarted when it dies, after a backoff (gpupool.cluster.reflector.Backoff) that resets once a server
  has run a minute; both are stopped with the agent, workers included (one process group each: no worker
  outlives the agent that would have to revoke it).
- The TCP server's address is published as `remoteServer` on the node's shared GPUs only while that
  server is up (`advertised`), so claims are only allocated remote shares a server answers for.
- A reflector over ResourceClaims (every namespace: a remote claim's pod may run anywhere): for each
  allocated claim of isolation remote whose device is in this node's pool, the share's hook directory
  `<hook_root>/remote/shares/<claim UID>/` is written exactly as a local `hook` claim's (hookdir.prepare_pod,
  limits from the allocation's consumed capacity read from the API: gpupool.agent.isolation.grant.share_grant) and a
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
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpupool.agent.config import AgentConfig
from gpupool.agent.devices.discovery import DeviceInfo
from gpupool.agent.isolation.grant import CLAIM_CONTAINER, share_grant
from gpupool.agent.isolation.remote import RemoteClient
from gpupool.agent.port import AgentCluster
from gpupool.agent.remote.client import remote_address
from gpupool.agent.state.checkpoint import write_atomically
from gpupool.agent.state.hookdir import (
    HookLimits,
    HookPod,
    accounting_dir,
    hook_paths,
    prepare_pod,
    remote_shares,
    valid_uid,
)
from gpupool.api.dra import DRIVER, REMOTE_ISOLATION, ClaimError, claim_shares, device_name, remote_token
from gpupool.api.moves import MOVES_CONFIGMAP, STATES, GpuRef, Move, holding, read_moves
from gpupool.cluster.port import CONFIGMAPS, RESOURCE_CLAIMS, ClusterPort, Conflict, Kind, Obj, Selector
from gpupool.cluster.reflector import DELETED, Backoff, Reflector
from gpupool.hook import library_path

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
    """This node's unix-socket server. Its directory, holding nothing else (not the tokens), is what remote
    containers on this node mount, read-only: a server restarted after they started makes a new socket
    there, which a mount of the socket file itself would not show them; and no container can put a socket
    of its own in its place."""
    return remote_root(hook_root) / "socket" / "server.sock"


def tokens_path(hook_root: Path) -> Path:
    return remote_root(hook_root) / "tokens"


def share_dir(hook_root: Path, uid: str) -> Path:
    """A remote share's hook directory (not claims/<UID>: that is the claim's directory on the pod's node,
    which may be this node too)."""
    if not valid_uid(uid):  # it becomes a path
        raise ValueError(f"not a claim UID: {uid!r}")
    return remote_shares(hook_root) / uid


def client_library(hook_root: Path) -> Path:
    """Where the agent puts the forwarding library on the host (kubelet mounts host paths only)."""
    return hook_paths(hook_root).library.parent / CLIENT_LIBRARY


def server_binary(config: AgentConfig) -> Path:
    """The GPU server the agent runs: the configured one, else the one packaged beside the hook library."""
    return config.remote_server_binary or library_path().with_name(SERVER_NAME)


def install_client_library(hook_root: Path) -> str | None:
    """Copy the packaged forwarding library onto the host; the problem, if any (remote claims prepared on this
    node then fail to start on the missing mount instead of running without it)."""
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
    index: int  # the GPU's index on this node
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


def share_gpus(move: Move | None, placed: GpuRef, node: str) -> tuple[GpuRef, ...]:
    """The one rule for where a remote share must be in place on `node`: the GPUs that hold it
    (gpupool.api.moves.holding) and, while a move is requested, its target, so the target is ready to admit
    the share's clients before the move becomes `ready`. Not a target on its source's node: one GPU server
    maps the claim's token to one share directory (such a move fails, `RemoteServing._target_verdict`)."""
    gpus = holding(move, placed)
    if move is not None and move.state == "requested" and move.target.node != move.source.node:
        gpus = (*gpus, move.target)
    return tuple(g for g in gpus if g.node == node)


def desired_share(claim: Mapping[str, Any], move: Move | None, node: str, devices: Mapping[int, DeviceInfo],
                  unhealthy: Mapping[str, str], hook_root: Path, key: bytes) -> RemoteShare | None | str:
    """The remote share this node serves for `claim` (`share_gpus`): None when it is none of this node's (not
    allocated, another isolation, another pool, no move of it here), a reason when it is but cannot be
    served. Its limits are the claim's consumed capacity, read from the API, whichever GPU serves it."""
    involved = move is not None and node in (move.source.node, move.target.node)
    try:
        shares = claim_shares(claim)
    except ClaimError as e:
        results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
        ours = any(r.get("driver") == DRIVER and r.get("pool") == node for r in results)
        return str(e) if involved or (ours and "not allocated" not in str(e)) else None
    label = shares.label
    if shares.isolation != REMOTE_ISOLATION:
        return f"claim {label} is not of isolation remote" if involved else None
    if not involved and not any(s.pool == node for s in shares.devices):
        return None
    if len(shares.devices) != 1:
        return f"claim {label}: isolation remote serves one GPU share per claim; it is allocated {len(shares.devices)}"
    s = shares.devices[0]
    gpus = share_gpus(move, GpuRef(s.pool, s.index), node)
    if not gpus:
        return None
    gpu = gpus[0]  # one: `share_gpus` never puts both ends of a move on one node
    dev = devices.get(gpu.index)
    if dev is None or s.mig is not None:
        return f"claim {label}: node {node} has no shared GPU {device_name(gpu.index)}"
    if move is not None and move.state == "requested" and gpu == move.target and dev.uuid in unhealthy:
        return f"claim {label}: GPU {gpu} is unhealthy ({unhealthy[dev.uuid]})"
    grant = share_grant(dev, replace(s, index=gpu.index, device=device_name(gpu.index)), shares)
    if isinstance(grant, str):
        return grant
    try:
        directory = share_dir(hook_root, shares.uid)
    except ValueError as e:
        return f"claim {label}: {e}"
    if not _line_safe(str(directory)):
        return f"claim {label}: share directory {directory} cannot be a line of the tokens file"
    return RemoteShare(shares.uid, label, dev.uuid, gpu.index, grant.memory_mib, grant.cores,
                       grant.oversub_mib or 0, directory, remote_token(key, shares.uid))


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


def _catches_move(pid: int, proc_root: Path = Path("/proc")) -> bool:
    """Whether the worker has installed its SIGUSR1 handler (SigCgt): between its exec and that moment the
    signal's default action would end it, and its client with it; such a worker is asked at the next check."""
    try:
        for line in (proc_root / str(pid) / "status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signal.SIGUSR1 - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _write_move_to(directory: Path, address: str) -> None:
    path = directory / "move-to"
    with contextlib.suppress(OSError):
        if path.read_text() == address + "\n":
            return
    write_atomically(path, (address + "\n").encode())  # a worker reads it whole, old or new


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


class _MovesPort:
    """The same two calls for the moves ConfigMap (one object, by a metadata.name field selector)."""

    def __init__(self, cluster: AgentCluster, namespace: str) -> None:
        self.cluster = cluster
        self.namespace = namespace

    async def list_objects(self, kind: Kind, *, namespace: str | None = None, labels: Selector | None = None,
                           fields: Selector | None = None) -> tuple[list[Obj], str]:
        return await self.cluster.list_moves(self.namespace)

    def watch_objects(self, kind: Kind, resource_version: str, *, namespace: str | None = None,
                      labels: Selector | None = None, fields: Selector | None = None) -> Any:
        return self.cluster.watch_moves(self.namespace, resource_version)


# --- moves (gpupool.api.moves) ------------------------------------------------------------------------------

MovesHandler = Callable[[set[str]], Awaitable[None]]  # called with the claim UIDs whose entries changed
_WRITE_TRIES = 5  # conflicts in a row before a write is left to the next check


class MovesBook:
    """The moves of remote shares: gpupool's ConfigMap, watched (a missing one: no moves), and the entries
    this agent advances. Every write is a compare-and-set: the entry must still be what the agent acted on
    (else another writer came first, and its change arrives by the watch), and the ConfigMap is updated at
    the resourceVersion read (a Conflict: read again)."""

    def __init__(self, cluster: AgentCluster, namespace: str, node: str) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.node = node
        self.moves: dict[str, Move] = {}  # claim UID -> its move, as the ConfigMap last said
        self.handlers: list[MovesHandler] = []
        self.reflector = Reflector(cast(ClusterPort, _MovesPort(cluster, namespace)), CONFIGMAPS,
                                   namespace=namespace, fields={"metadata.name": MOVES_CONFIGMAP},
                                   on_event=self._on_event)

    def start(self) -> None:
        self.reflector.start()

    async def stop(self) -> None:
        await self.reflector.stop()

    async def wait_synced(self) -> None:
        await self.reflector.wait_synced()

    def here(self) -> list[Move]:
        """The entries this node takes part in (as a move's source or target)."""
        return [m for m in self.moves.values() if self.node in (m.source.node, m.target.node)]

    async def _on_event(self, kind: str, obj: Obj, old: Obj | None) -> None:
        fresh = {} if kind == DELETED else read_moves(obj)
        before, self.moves = self.moves, fresh
        changed = {u for u in before.keys() | fresh.keys() if before.get(u) != fresh.get(u)}
        if changed:
            for handler in self.handlers:
                await handler(changed)

    async def write(self, uid: str, seen: Move, new: Move) -> bool:
        """Replace the claim's entry `seen` by `new`; False when nothing was written."""
        for _ in range(_WRITE_TRIES):
            try:
                obj = await self.cluster.get_moves(self.namespace)
                if obj is None or read_moves(obj).get(uid) != seen:
                    return False
                version = str((obj.get("metadata") or {}).get("resourceVersion", ""))
                await self.cluster.update_moves(self.namespace, {uid: new.to_json()}, version)
            except Conflict:
                continue
            except Exception as e:  # API or transport trouble: the next check (or change) tries again
                log.warning("cannot record the move of %s as %s: %s", seen.claim, new.state, e)
                return False
            log.info("move of %s from %s to %s: %s%s", new.claim, new.source, new.target, new.state,
                     f" ({new.reason})" if new.reason else "")
            return True
        return False


def refuse_moves_here(book: MovesBook) -> MovesHandler:
    """For an agent that serves no remote shares: moves to its node fail at once, with the reason."""

    async def handler(changed: set[str]) -> None:
        for uid in sorted(changed):
            move = book.moves.get(uid)
            if move is not None and move.state == "requested" and move.target.node == book.node:
                await book.write(uid, move, move.advanced(
                    "failed", f"node {book.node} serves no remote shares (its agent has no remote_listen)"))

    return handler


class RemoteServing:
    """The GPU-node side: servers, tokens file, share directories, moves, and what the slice and metrics show."""

    def __init__(self, config: AgentConfig, key: bytes, cluster: AgentCluster,
                 devices: Callable[[], Mapping[str, DeviceInfo]], changed: Callable[[], None] = lambda: None,
                 proc_root: Path = Path("/proc"), book: MovesBook | None = None,
                 unhealthy: Callable[[], Mapping[str, str]] = dict) -> None:
        assert config.remote_listen is not None
        self.config = config
        self.key = key
        self.cluster = cluster
        self.devices = devices  # the node's GPUs by UUID (the device table's)
        self.unhealthy = unhealthy  # GPU UUID -> fault: no move lands on such a GPU
        self.changed = changed  # the slice and the inventory should be published again
        self.proc_root = proc_root
        self.book = book  # the moves (None: not followed)
        root = config.hook_root
        self.tokens = tokens_path(root)
        self.shares: dict[str, RemoteShare] = {}
        self.refused: dict[str, str] = {}  # claim UID -> why it is not served (logged once)
        self.signalled: dict[str, set[int]] = {}  # claim UID -> source workers asked to move (live ones only)
        binary = server_binary(config)
        argv = [str(binary), "--tokens", str(self.tokens), "--hook",
                str(config.remote_hook or hook_paths(root).library)]
        if config.remote_cuda:
            argv += ["--cuda", config.remote_cuda]
        if config.remote_limits_fd is not None:
            argv += ["--limits-fd", str(config.remote_limits_fd)]
        self._kick = asyncio.Event()  # check the moves now (a move changed, the TCP server came up)

        def server_changed() -> None:
            changed()
            self._kick.set()

        self.tcp = GpuServer("tcp", [argv[0], "--listen", config.remote_listen, *argv[1:]],
                             config.remote_restart_max_s, server_changed)
        self.unix = GpuServer("unix", [argv[0], "--listen", f"unix:{socket_path(root)}", *argv[1:]],
                              config.remote_restart_max_s)
        self.reflector = Reflector(cast(ClusterPort, _ClaimsPort(cluster)), RESOURCE_CLAIMS, on_event=self._on_claim)
        if book is not None:
            book.handlers.append(self._on_moves)
        self._lock = asyncio.Lock()  # one claim's share and move are handled at a time
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
        self._tasks.append(asyncio.create_task(self._follow(), name="remote-moves"))

    async def stop(self) -> None:
        self._stop.set()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        await self.reflector.stop()

    def _reset(self) -> None:
        shutil.rmtree(remote_shares(self.config.hook_root), ignore_errors=True)
        write_tokens(self.tokens, {})
        socket_path(self.config.hook_root).parent.mkdir(mode=0o755, parents=True, exist_ok=True)

    async def _follow(self) -> None:
        """Claims are served from the moves' first read on (else a share moved away would be served here
        again until then); then, while a move waits on this node, it is checked every move_check_s."""
        if self.book is not None:
            await self.book.wait_synced()
        self.reflector.start()
        if self.book is None:
            return
        while True:
            wait = self._kick.wait()
            if self._waiting():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wait, timeout=self.config.move_check_s)
            else:
                await wait
            self._kick.clear()
            for uid in self._waiting():
                await self._sync(uid)

    def _waiting(self) -> list[str]:
        """Moves this node has a step of: a target to make ready, a source's clients to move."""
        node = self.config.node_name
        moves = {} if self.book is None else self.book.moves
        return sorted(u for u, m in moves.items()
                      if (m.state == "requested" and m.target.node == node)
                      or (m.state == "ready" and m.source.node == node))

    # --- claims and moves ---------------------------------------------------------------------------------
    async def _on_claim(self, kind: str, obj: Obj, old: Obj | None) -> None:
        await self._sync(str((obj.get("metadata") or {}).get("uid", "")))

    async def _on_moves(self, changed: set[str]) -> None:
        for uid in sorted(changed):
            await self._sync(uid)
        self._kick.set()  # the periodic check starts or stops with the moves waiting here

    async def _sync(self, uid: str) -> None:
        async with self._lock:
            await self._serve(uid)
            await self._step(uid)

    def _move(self, uid: str) -> Move | None:
        return None if self.book is None else self.book.moves.get(uid)

    async def _serve(self, uid: str) -> None:
        """The claim's share here as `desired_share` says: written, kept, or revoked."""
        claim = self.reflector.get_by_uid(uid)
        by_index = {d.index: d for d in self.devices().values()}
        found = None if claim is None else desired_share(claim, self._move(uid), self.config.node_name, by_index,
                                                         self.unhealthy(), self.config.hook_root, self.key)
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
        if current is not None:  # another GPU: the old share's workers end before the new one is offered
            await self._set({u: s for u, s in self.shares.items() if u != uid})
            await asyncio.to_thread(self._revoke, current)
        if found is not None:
            await asyncio.to_thread(prepare_share, found)
            await self._set({**self.shares, uid: found})
            log.info("serving remote share %s: %d MiB, %g %% of %s", found.label, found.memory_mib, found.cores,
                     found.gpu)
        self.changed()

    async def _step(self, uid: str) -> None:
        """This node's step of the claim's move, if it has one: its verdict as target, or moving the source's
        clients; recorded when it changes the entry."""
        move = self._move(uid)
        node = self.config.node_name
        if move is None or move.finished or self.book is None:
            self.signalled.pop(uid, None)
            return
        if move.state == "requested" and move.target.node == node:
            state, reason = self._target_verdict(uid, move)
        elif move.state == "ready" and move.source.node == node:
            state, reason = await self._move_clients(uid, move)
        else:
            return
        if (state, reason) != (move.state, move.reason):
            new = replace(move, reason=reason) if state == move.state else move.advanced(state, reason)
            await self.book.write(uid, move, new)

    def _target_verdict(self, uid: str, move: Move) -> tuple[str, str]:
        """A move to this node: `ready` once the share's directory and token line are here and the TCP server
        listens (what the source's clients dial), `failed` when this node cannot take it."""
        node = self.config.node_name
        if not self.reflector.synced.is_set():
            return move.state, move.reason
        if move.source.node == node:
            return "failed", (f"source and target are both on node {node}: its GPU server maps the claim's token "
                              "to one GPU; move the share to another node")
        if self.reflector.get_by_uid(uid) is None:
            return "failed", f"claim {move.claim} is gone"
        share = self.shares.get(uid)
        if share is None or share.index != move.target.index:
            return "failed", self.refused.get(uid) or f"node {node} cannot serve claim {move.claim} on {move.target}"
        if not self.tcp.up:
            return "requested", f"waiting for the GPU server of node {node} to listen"
        return "ready", ""

    async def _move_clients(self, uid: str, move: Move) -> tuple[str, str]:
        """A move from this node, its target ready: the share's workers are told where to go (move-to) and
        signalled, each once (workers that appear later too: clients that started before their pod's node
        switched the address); `moved` once none is left."""
        if not self.reflector.synced.is_set():
            return move.state, move.reason
        if self.reflector.get_by_uid(uid) is None:
            return "failed", f"claim {move.claim} is gone"
        share = self.shares.get(uid)
        if share is None or share.index != move.source.index:
            return "moved", ""  # nothing of the share is served here: no client to move
        try:
            target = await remote_address(self.cluster, move.target.node, device_name(move.target.index))
        except Exception as e:  # API trouble: the next check tries again
            return "ready", f"cannot read the target's ResourceSlice: {e}"
        if target is None:
            return "ready", f"{move.target} advertises no GPU server now; waiting for it"
        try:
            await asyncio.to_thread(_write_move_to, share.directory, target)
        except OSError as e:
            return "ready", f"cannot write {share.directory / 'move-to'}: {e}"
        workers = await asyncio.to_thread(self._workers_of, share.directory)
        asked = self.signalled.setdefault(uid, set())
        asked &= set(workers)  # bounded: pids of workers gone are forgotten (and may be reused)
        for pid in workers:
            if pid not in asked and _catches_move(pid, self.proc_root):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGUSR1)
                asked.add(pid)
        if not workers:
            self.signalled.pop(uid, None)
            return "moved", ""
        return "ready", f"{len(workers)} clients still on the source"

    async def _set(self, shares: dict[str, RemoteShare]) -> None:
        await asyncio.to_thread(write_tokens, self.tokens, shares)
        self.shares = shares

    def _workers_of(self, directory: Path) -> list[int]:
        """The workers serving one share (their environment names its directory: GPUPOOL_REMOTE_SHARE)."""
        return [pid for server in self.servers() for pid in server.workers(self.proc_root)
                if _share_of_worker(pid, self.proc_root) == str(directory)]

    def _revoke(self, share: RemoteShare) -> None:
        """After its token line is gone: end the workers that still serve it, then its directory."""
        if self.shares.get(share.uid) != share:
            for pid in self._workers_of(share.directory):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            shutil.rmtree(share.directory, ignore_errors=True)
            log.info("remote share %s revoked on GPU %s", share.label, share.gpu)


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


class MovesCollector(Collector):
    """gpupool_remote_moves{state} on the agent's /metrics (where the agent follows moves)."""

    def __init__(self, book: MovesBook) -> None:
        self.book = book

    def collect(self) -> Iterator[Any]:
        family = GaugeMetricFamily("gpupool_remote_moves",
                                   "Moves of remote shares this node takes part in (as source or target), by state",
                                   labels=["state"])
        here = [m.state for m in self.book.here()]
        for state in STATES:
            family.add_metric([state], here.count(state))
        yield family
