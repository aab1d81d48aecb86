"""The node agent: discovery, health, inventory and the device plugin, kept alive across kubelet restarts,
and the watchdog behind isolation hook (gpupool.agent.enforce.watchdog, where `watchdog` is on).

The node's isolation modes are one strategy object each (gpupool.agent.isolation.base), built here and shared by
Allocate, the watchdog (which modes it holds to their grants) and the inventory (what each mode shows).

Start-up takes the node state's lock first (gpupool.agent.state.node_state: a second agent process on the same
checkpoint directory stops there with a message) and reads the checkpoints; a checkpoint that cannot be
trusted stops the agent (gpupool.agent.state.checkpoint says why). Start-up writes only to finish what a previous
run left half done: a DRA prepare a crash interrupted is rolled back and an unprepare finished, and CDI
specs and claim directories no prepared claim owns are swept (`DraDriver.recover`). Beyond the node's disk,
everything the agent must know about running pods (their allocations, the `gpupool.io/allocated` markers)
lives in the API, and the answers it gave kubelet live in its checkpoint on the node's disk. A checkpointed
pod still alive on the node whose GPU containers were all served gets its marker if an earlier run crashed
before writing it (`DevicePluginService.recover`): without it the scheduler would count the pod as still
waiting for its Allocate; no other pod is written. Slot IDs depend only on GPU UUIDs, so kubelet's
checkpoint stays valid across agent restarts.

Kubelet restarts are detected by polling (every `watch_interval_s`) the identity of kubelet.sock (inode
and change time) and the presence of our own socket: when kubelet re-creates its socket, or deletes ours,
the plugin server is restarted and registers again.

Node validation (gpupool.agent.state.validation, checks in gpupool.agent.checks): a pass runs at start, before
the plugin server, every `validation_interval_s` (every `validation_retry_s` while a step fails) and at
once on `revalidate()` (SIGHUP in `gpupool agent`). While the node is not ready every GPU is withheld
(DeviceTable.withhold): slots Unhealthy, Allocate refused, the inventory says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from gpupool.agent.checks.node import Check, node_checks, run_pass
from gpupool.agent.config import AgentConfig
from gpupool.agent.devices.discovery import DiscoveryBackend, DiscoveryError, HealthEvent
from gpupool.agent.devices.health import HealthTracker
from gpupool.agent.devices.inventory import InventoryPublisher, RemoteView
from gpupool.agent.devices.mig import MigManager
from gpupool.agent.devices.mps import MpsSupervisor, supervise
from gpupool.agent.devices.table import DeviceTable
from gpupool.agent.dra.driver import DraDriver
from gpupool.agent.enforce.procs import Killer
from gpupool.agent.enforce.squeeze import follow_squeezes
from gpupool.agent.enforce.watchdog import Limit, Watchdog
from gpupool.agent.isolation.base import merged_inventory
from gpupool.agent.isolation.strategies import node_strategies
from gpupool.agent.isolation.vendors import NO_VENDOR_DEVICES, VendorDevices
from gpupool.agent.kubelet.device_plugin import DevicePluginService, PluginServer, register
from gpupool.agent.kubelet.dra_service import DraServer
from gpupool.agent.port import AgentCluster
from gpupool.agent.remote.serving import (
    MovesBook,
    RemoteKeyError,
    RemoteServing,
    load_key,
    refuse_moves_here,
    remote_client,
)
from gpupool.agent.state.checkpoint import Checkpoint
from gpupool.agent.state.hookdir import NvmlScales
from gpupool.agent.state.node_state import NodeStateLock
from gpupool.agent.state.validation import Step, Validation, withheld_reason
from gpupool.api.names import ANN_ALLOCATED
from gpupool.api.waiting import waiting_for_allocate

log = logging.getLogger("gpupool.agent")


def _socket_identity(path: os.PathLike[str] | str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_ctime_ns


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        backend: DiscoveryBackend,
        cluster: AgentCluster,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        step: Callable[[str], None] | None = None,
        mps: MpsSupervisor | None = None,
        mig: MigManager | None = None,
        killer: Killer | None = None,
        vendors: VendorDevices = NO_VENDOR_DEVICES,
    ) -> None:
        self.config = config
        self.vendors = vendors  # the vendor object `gpupool agent` built: its cards' container devices
        self.mig = mig  # carves MIG instances for isolation mig pods (None: no GPU of the node is in MIG mode)
        self.mps = mps  # one MPS control daemon per GPU, supervised here (None: none run, MPS shares are refused)
        self.step = step  # the Allocate step hook (tests inject crashes between steps)
        self.backend = backend
        self.cluster = cluster
        self.clock = clock
        self.wall_clock = wall_clock
        self.table: DeviceTable | None = None
        self.service: DevicePluginService | None = None
        self.server: PluginServer | None = None
        self.dra: DraDriver | None = None  # config.dra: the DRA driver serves the GPUs (with `server` or not)
        self.dra_server: DraServer | None = None
        self.remote: RemoteServing | None = None  # remote_listen: this node's GPU servers (agent.remote.serving)
        self.moves: MovesBook | None = None  # a remote key and moves_namespace: the moves of remote shares
        self._slice_dirty = asyncio.Event()  # publish the slice now (the GPU server came up or went down)
        self.lock = NodeStateLock(config.checkpoint_path)  # held from start to stop: one agent per node state
        self.publisher = InventoryPublisher(cluster, config.node_name, config.split)
        # the isolation modes of this node (gpupool.agent.isolation.base), shared by Allocate, watchdog and inventory
        self.nvml_scales = NvmlScales()  # measured by the validation's caps probe, written into hook pods' limits
        self.isolation = node_strategies(config, mps, mig, self._mig_reconciled, self._inventory_changed,
                                         self.nvml_scales)
        self.killer = killer  # how the watchdog stops a process (None: SIGKILL through a pidfd)
        self.watchdog: Watchdog | None = None
        self.registrations = 0
        self.adopted: dict[str, int] = {}
        self.registered_at: float | None = None
        self._registered_identity: tuple[int, int] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stop = asyncio.Event()
        self._probe_all = asyncio.Event()
        self._inventory_dirty = asyncio.Event()
        self._revalidate = asyncio.Event()
        self.validation = Validation()
        self.validation_passes = 0
        self.checks: dict[Step, Check] | None = None  # None: before start (node_checks)
        self._event_thread: threading.Thread | None = None
        self._thread_stop = threading.Event()

    # --- lifecycle ----------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Raises CheckpointError (NodeStateBusy when another agent holds the node state) without serving."""
        await asyncio.to_thread(self.lock.acquire)
        try:
            await self._start()
        except BaseException:
            self.lock.release()
            raise

    async def _start(self) -> None:
        discovered = await asyncio.to_thread(self.backend.discover)
        tracker = HealthTracker(self.config.ignored_xids, quarantine_s=self.config.reprobe_interval_s)
        self.table = table_ = DeviceTable(discovered, self.config.split, tracker)
        for d in discovered.devices:  # GPUs that are already broken start unhealthy
            problem = await asyncio.to_thread(self.backend.probe, d.uuid)
            if problem is not None:
                tracker.mark(d.uuid, problem, self.clock())
        log.info(
            "discovered %d GPU(s) via %s (driver %s, CUDA %s): %s",
            len(discovered.devices),
            self.backend.name,
            discovered.driver_version,
            discovered.cuda_version,
            ", ".join(f"{d.index}:{d.model}:{d.uuid}" for d in discovered.devices) or "none",
        )
        if self.mps is not None:  # before the first inventory and Allocate: MPS shares need a daemon that answers
            await asyncio.to_thread(self.mps.start_all)
        checkpoint = Checkpoint(self.config.checkpoint_path, self.config.node_name)
        await asyncio.to_thread(checkpoint.load)  # one it cannot trust stops the agent here
        self.service = DevicePluginService(
            self.config, self.table, self.cluster, self.wall_clock, checkpoint=checkpoint, mps=self.mps,
            mig=self.mig, changed=self._inventory_dirty.set, isolation=self.isolation, vendors=self.vendors,
        )
        if self.step is not None:
            self.service.step = self.step
        await self.service.recover()
        if self.config.dra:  # a DRA driver, instead of or beside the device plugin (gpupool.agent.dra.driver)
            # Its checkpoint is read before the MIG reconciliation below: prepared claims hold instances too,
            # as the pods the device plugin served do (both are holders there, whichever form serves them).
            # Prepare and Allocate take the one lock, so the two never hand out one GPU's state at once.
            self.dra = dra = DraDriver(self.config, table_, self.cluster, self.isolation, self.wall_clock,
                                       mig=self.mig, lock=self.service.allocate_lock, vendors=self.vendors)
            await asyncio.to_thread(dra.load)
            for done in await dra.recover():  # before anything counts the prepared claims or serves kubelet
                log.warning("node state: %s", done)
            self.service.claims = lambda: dra.prepared.keys()
            await self._start_remote(dra, table_)
        await self.service.housekeeping(reconcile=True)
        # The first validation pass needs the MIG reconciliation above; it runs before the first inventory
        # and before kubelet can see a slot, so a node that fails validation never advertises its GPUs.
        self.checks = node_checks(self.config, self.backend, self.mps,
                                  None if self.mig is None else self._mig_reconciled,
                                  lambda: [d.uuid for d in sorted(table_.known.values(), key=lambda d: d.index)],
                                  self.nvml_scales)
        await self._validate()
        await self._publish()
        await self._adopt()
        if self.dra is not None:
            self.dra_server = DraServer(self.dra, self.config.kubelet_root)
            await self.dra_server.start()
        if self.config.serves_device_plugin:  # alone, or beside the DRA driver (device_plugin_with_dra)
            self.server = PluginServer(self.service, self.config.plugin_socket_path)
            self.config.device_plugin_dir.mkdir(parents=True, exist_ok=True)
            await self.server.start()
        loop = asyncio.get_running_loop()
        self._event_thread = threading.Thread(target=self._watch_events, args=(loop,), name="gpupool-xid", daemon=True)
        self._event_thread.start()
        # Both forms read the one device table: health and validation reach the slots (ListAndWatch) and the
        # slice's taints through the same changes.
        self._tasks = []
        if self.dra is not None:
            self._tasks.append(asyncio.create_task(self._slice_loop(), name="resource-slice"))
        if self.server is not None:
            self._tasks.append(asyncio.create_task(self._kubelet_loop(), name="kubelet-watch"))
        self._tasks += [
            asyncio.create_task(self._probe_loop(), name="health-probe"),
            asyncio.create_task(self._inventory_loop(), name="inventory"),
            asyncio.create_task(follow_squeezes(self.cluster, self.config.node_name, self.config.hook_root,
                                                self._stop), name="squeeze"),
        ]
        self._tasks.append(asyncio.create_task(self._housekeeping_loop(), name="housekeeping"))
        self._tasks.append(asyncio.create_task(self._validation_loop(), name="validation"))
        if self.config.watchdog:  # the second line behind isolation hook (agent/watchdog.py)
            self.watchdog = Watchdog(self.config, self.backend, self.cluster, self.isolation, self._watched_gpus,
                                     killer=self.killer, wall_clock=self.wall_clock, claims=self._watched_claims)
            self._tasks.append(asyncio.create_task(self.watchdog.run(self._stop, self.clock), name="watchdog"))
        if self.mps is not None:  # a daemon's state change reaches the inventory at once
            self._tasks.append(asyncio.create_task(
                supervise(self.mps, self._stop, self.config.mps_check_interval_s, self._inventory_dirty.set),
                name="mps"))

    async def _start_remote(self, dra: DraDriver, table: DeviceTable) -> None:
        """Remote shares: the key for claims of pods here, and with remote_listen this node's GPU servers,
        whose address the slice carries while the TCP server is up."""
        key = None
        if self.config.remote_key_file is not None:
            try:
                key = await asyncio.to_thread(load_key, self.config.remote_key_file)
            except RemoteKeyError as e:  # `gpupool agent` checks it before starting; here it changed since
                log.error("remote shares disabled: %s", e)
        dra.remote = remote_client(self.config, key)
        if key is not None and self.config.moves_namespace is not None:
            # moves: this node's remote claims follow where their shares are served from (the server files),
            # and as a GPU node it takes its steps of moves to and from its GPUs
            self.moves = book = MovesBook(self.cluster, self.config.moves_namespace, self.config.node_name)
            dra.moves = lambda: book.moves

            async def follow(changed: set[str]) -> None:
                await dra.follow_moves()

            book.handlers.append(follow)
        if self.config.remote_listen is None or key is None:
            if self.moves is not None:
                self.moves.handlers.append(refuse_moves_here(self.moves))
                self.moves.start()
            return

        def changed() -> None:
            self._slice_dirty.set()
            self._inventory_dirty.set()

        self.remote = RemoteServing(self.config, key, self.cluster, lambda: table.known, changed, book=self.moves,
                                    unhealthy=table.unhealthy)
        dra.remote_server = self.remote.advertised
        await self.remote.start()
        if self.moves is not None:
            self.moves.start()

    async def _adopt(self) -> None:
        """Read (never write) what the API says about this node's pods, so a restarted agent knows where it
        stands (logged): pods already served keep running untouched; a pod waiting for Allocate is served
        from its annotations when kubelet calls."""
        try:
            pods = await self.cluster.list_pods_on_node(self.config.node_name)
        except Exception as e:  # API errors and transport errors alike: serving kubelet comes first
            log.warning("could not read the pods of node %s at start: %s", self.config.node_name, e)
            return
        served = [p for p in pods if ANN_ALLOCATED in ((p.get("metadata") or {}).get("annotations") or {})]
        waiting = [p for p in pods if waiting_for_allocate(p, self.config.node_name) is not None]
        self.adopted = {"served": len(served), "waiting": len(waiting)}
        log.info(
            "node %s: %d pod(s) already served, %d waiting for Allocate",
            self.config.node_name,
            len(served),
            len(waiting),
        )

    def request_stop(self) -> None:
        self._stop.set()

    async def wait(self) -> None:
        await self._stop.wait()

    async def stop(self) -> None:
        self._stop.set()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self.service is not None:
            self.service.stop_streams()
        if self.server is not None:
            await self.server.stop(grace=0.2)
            self.config.plugin_socket_path.unlink(missing_ok=True)
        if self.dra_server is not None:
            await self.dra_server.stop()
        if self.moves is not None:
            await self.moves.stop()
        if self.remote is not None:
            await self.remote.stop()
        self._thread_stop.set()
        if self._event_thread is not None:
            await asyncio.to_thread(self._event_thread.join)
        self.backend.close()
        self.lock.release()

    # --- DRA: the node's ResourceSlice ---------------------------------------------------------------------
    async def _slice_loop(self) -> None:
        """Publish the slice now, on every change of the GPUs' health or validation, and every
        dra_resync_s (kubelet deletes a driver's slices when it starts; this puts them back)."""
        assert self.dra is not None and self.table is not None
        while not self._stop.is_set():
            seen = self.table.version
            self._slice_dirty.clear()
            try:
                node = await self.cluster.get_node(self.config.node_name)
                await self.dra.publish(str((node.get("metadata") or {}).get("uid", "")))
            except Exception as e:  # API trouble: the next pass tries again
                log.warning("could not publish the ResourceSlice of node %s: %s", self.config.node_name, e)
            waits = [asyncio.ensure_future(self.table.wait_changed(seen)),
                     asyncio.ensure_future(self._slice_dirty.wait())]
            try:
                await asyncio.wait(waits, timeout=self.config.dra_resync_s, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()

    # --- kubelet registration -----------------------------------------------------------------------------
    async def _kubelet_loop(self) -> None:
        assert self.server is not None
        while not self._stop.is_set():
            identity = _socket_identity(self.config.kubelet_socket_path)
            if identity is not None and (identity != self._registered_identity or not self.server.socket_ok()):
                await self._register(identity)
            await asyncio.sleep(self.config.watch_interval_s)

    async def _register(self, identity: tuple[int, int]) -> None:
        assert self.server is not None
        if self._registered_identity is not None or not self.server.socket_ok():
            await self.server.start()  # kubelet restarted: it removed our socket, or will not trust it
        try:
            await register(self.config)
        except Exception as e:  # any failure: retry on the next tick (the plugin must not die)
            log.warning("registration with kubelet at %s failed: %s", self.config.kubelet_socket_path, e)
            self._registered_identity = None
            return
        self._registered_identity = identity
        self.registrations += 1
        self.registered_at = self.clock()
        log.info("registered %s with kubelet (registration %d)", self.config.resource_name, self.registrations)

    # --- health -------------------------------------------------------------------------------------------
    def _watch_events(self, loop: asyncio.AbstractEventLoop) -> None:
        """Blocking event waits run on this thread; events are handed to the event loop."""
        while not self._thread_stop.is_set():
            try:
                event = self.backend.wait_event(self.config.event_wait_s)
            except Exception as e:  # keep watching: a broken wait must not end health checking
                log.warning("health event wait failed: %s", e)
                self._thread_stop.wait(self.config.event_wait_s)
                continue
            if event is not None:
                with contextlib.suppress(RuntimeError):  # loop closed during shutdown
                    asyncio.run_coroutine_threadsafe(self._on_event(event), loop)
                if event.uuid is None:  # a failing wait returns at once: do not spin on it
                    self._thread_stop.wait(self.config.event_wait_s)

    async def _on_event(self, event: HealthEvent) -> None:
        assert self.table is not None
        changed, reprobe_all = await self.table.apply_event(event, self.clock())
        if event.xid in self.config.ignored_xids:
            log.info("ignoring application Xid %d on %s", event.xid, event.uuid)
        elif changed:
            log.warning("GPU %s unhealthy: Xid %d (%s)", event.uuid, event.xid, event.detail)
            self._inventory_dirty.set()
        if reprobe_all:
            log.warning("device event not tied to one GPU (%s): re-probing all GPUs", event.detail or event.xid)
            self._probe_all.set()

    async def _probe_loop(self) -> None:
        assert self.table is not None
        interval = self.config.reprobe_interval_s
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._probe_all.wait(), timeout=max(interval / 2, 0.01))
            everything = self._probe_all.is_set()
            self._probe_all.clear()
            now = self.clock()
            uuids = list(self.table.uuids()) if everything else self.table.tracker.due_for_probe(now)
            for uuid in uuids:
                try:
                    problem = await asyncio.to_thread(self.backend.probe, uuid)
                except Exception as e:  # a probe that raises is a failed probe
                    problem = f"probe raised {e!r}"
                # a probe-everything pass only marks failures; recoveries wait for their quarantine
                relevant = not everything or problem is not None
                if relevant and await self.table.probe_result(uuid, problem, self.clock()):
                    log.info("GPU %s: %s", uuid, "healthy again" if problem is None else f"unhealthy: {problem}")
                    self._inventory_dirty.set()

    # --- node validation ----------------------------------------------------------------------------------
    def revalidate(self) -> None:
        """Run a validation pass now (SIGHUP; thread-safe only from the event loop's thread)."""
        self._revalidate.set()

    async def _validation_loop(self) -> None:
        while not self._stop.is_set():
            wait = self.config.validation_interval_s if self.validation.ready else self.config.validation_retry_s
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._revalidate.wait(), timeout=wait)
            self._revalidate.clear()
            await self._validate()

    async def _validate(self) -> None:
        """One pass over the checks; withholds or gives back the GPUs and publishes what changed."""
        assert self.table is not None and self.checks is not None
        before = self.validation
        self.validation = await asyncio.to_thread(run_pass, before, self.checks)
        self.validation_passes += 1
        reason = withheld_reason(self.validation)
        if await self.table.withhold(reason):
            if reason is None:
                log.info("node validation passed: advertising the GPUs")
            else:
                log.warning("GPUs withheld: %s", reason)
        if self.validation != before:
            self._inventory_dirty.set()

        # --- inventory ----------------------------------------------------------------------------------------
    async def _inventory_loop(self) -> None:
        assert self.table is not None
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._inventory_dirty.wait(), timeout=self.config.inventory_interval_s)
            self._inventory_dirty.clear()
            try:
                discovered = await asyncio.to_thread(self.backend.discover)
                if await self.table.rediscovered(discovered, self.clock()):
                    log.warning("GPU set changed: %d present", len(discovered.devices))
            except DiscoveryError as e:
                log.warning("rediscovery failed: %s", e)
            except Exception:  # keep the loop alive whatever a backend raises
                log.exception("rediscovery failed unexpectedly")
            await self._publish()

    async def _housekeeping_loop(self) -> None:
        """Release what the isolation strategies hold for pods gone (hook directories, MIG instances) and
        destroy MIG instances idle long enough (MigManager.reap), every `mig_interval_s`."""
        assert self.service is not None
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=self.config.mig_interval_s)
            if not self._stop.is_set() and await self.service.housekeeping():
                self._inventory_dirty.set()

    def _watched_gpus(self) -> list[str]:
        """GPUs whose processes the watchdog reads: not those in MIG mode (hardware isolation, and NVML's
        per-process view of a MIG parent is not per instance)."""
        if self.table is None:
            return []
        return [d.uuid for d in sorted(self.table.known.values(), key=lambda d: d.index) if not d.mig_enabled]

    def _watched_claims(self) -> dict[str, dict[str, Limit]]:
        """The prepared claims whose isolation has a second line (hook), as the watchdog holds them."""
        if self.dra is None:
            return {}
        return {c.label: {uuid: Limit(memory, cores, elastic=False) for uuid, memory, cores in c.shares}
                for c in self.dra.prepared.values()
                if (s := self.isolation.get(c.isolation)) is not None and s.second_line}

    def _mig_reconciled(self) -> bool:
        return self.service is not None and self.service.mig_reconciled

    def _inventory_changed(self) -> None:
        self._inventory_dirty.set()

    def _per_gpu(self) -> dict[str, dict[str, Any]]:
        """Inventory fields by GPU UUID beyond discovery: what each isolation mode shows (MPS daemon, MIG
        instances)."""
        return merged_inventory(self.isolation.values())

    async def _publish(self) -> None:
        if self.table is None:
            return
        try:
            remote = None if self.remote is None else RemoteView(self.remote.advertised(), len(self.remote.shares))
            await self.publisher.publish(
                self.table.inventory_view(), self.table.unhealthy(), self.wall_clock(), self._per_gpu(),
                self.validation, remote,
            )
        except Exception as e:  # the API being down must not stop the device plugin; retried next round
            log.warning("could not publish the inventory of node %s: %s", self.config.node_name, e)
