"""A stand-in kubelet: the device-manager half of kubelet, for tests, benchmarks and demos.

It serves `Registration` on <dir>/kubelet.sock, and on Register does what kubelet's device manager does
(k8s-interfaces.md section 1.5-1.7): checks the version and resource name, dials the plugin's socket
inside the same call, reads its options, and keeps a ListAndWatch stream open, rebuilding the device
list from every message. `allocate` picks slots like kubelet (healthy minus already assigned, preferring
GetPreferredAllocation's answer) and calls Allocate with one container request. `restart` removes the
socket files of the directory and serves a fresh kubelet.sock, as a restarted kubelet does.

Built from the same generated stubs as the agent, so both sides speak the committed .proto.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from gpupool.agent.proto import deviceplugin_v1beta1_pb2 as pb
from gpupool.agent.proto import deviceplugin_v1beta1_pb2_grpc as pb_grpc

SUPPORTED_VERSIONS = ("v1beta1",)


@dataclass
class PluginEndpoint:
    resource: str
    endpoint: str
    options: pb.DevicePluginOptions
    channel: grpc.aio.Channel
    stub: pb_grpc.DevicePluginStub
    devices: dict[str, str] = field(default_factory=dict)  # ID -> health
    updates: int = 0
    reader: asyncio.Task[None] | None = None


class _Registration(pb_grpc.RegistrationServicer):
    def __init__(self, kubelet: StandInKubelet) -> None:
        self.kubelet = kubelet

    async def Register(self, request: pb.RegisterRequest, context: grpc.aio.ServicerContext) -> pb.Empty:
        if request.version not in SUPPORTED_VERSIONS:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported version {request.version!r}")
        name = request.resource_name
        if "/" not in name or name.split("/")[0].endswith("kubernetes.io") or name.startswith("requests."):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid extended resource name {name!r}")
        try:
            await self.kubelet._connect(request)
        except grpc.aio.AioRpcError as e:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, f"cannot reach plugin at {request.endpoint}: {e.details()}"
            )
        return pb.Empty()


class StandInKubelet:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.socket_path = directory / "kubelet.sock"
        self.plugins: dict[str, PluginEndpoint] = {}
        self.registrations: list[tuple[str, str]] = []  # (resource, endpoint) in order
        self.assigned: dict[str, list[str]] = {}  # pod key -> device IDs (kubelet's checkpoint)
        self._server: grpc.aio.Server | None = None
        self._changed = asyncio.Condition()
        # kubelet admits pods one at a time (its device manager picks and records devices under a mutex);
        # concurrent callers here must not pick the same free device.
        self._admitting = asyncio.Lock()

    # --- lifecycle ----------------------------------------------------------------------------------------
    async def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.socket_path.unlink(missing_ok=True)
        server = grpc.aio.server()
        pb_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        for plugin in list(self.plugins.values()):
            await self._drop(plugin)
        self.plugins.clear()
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(0)

    async def restart(self) -> None:
        """Stop, remove every socket file in the directory (kubelet's start-up cleanup), start again.
        The checkpoint (`assigned`) survives, as kubelet's does."""
        await self.stop()
        for path in self.directory.iterdir():
            if path.is_socket():
                path.unlink(missing_ok=True)
        await self.start()

    async def _drop(self, plugin: PluginEndpoint) -> None:
        if plugin.reader is not None:
            plugin.reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await plugin.reader
        await plugin.channel.close()

    # --- registration -------------------------------------------------------------------------------------
    async def _connect(self, request: pb.RegisterRequest) -> None:
        channel = grpc.aio.insecure_channel(f"unix://{self.directory / request.endpoint}")
        stub = pb_grpc.DevicePluginStub(channel)
        try:
            options = await stub.GetDevicePluginOptions(pb.Empty(), timeout=10)
        except grpc.aio.AioRpcError:
            await channel.close()
            raise
        old = self.plugins.get(request.resource_name)
        if old is not None:  # a new registration replaces the previous endpoint
            await self._drop(old)
        plugin = PluginEndpoint(request.resource_name, request.endpoint, options, channel, stub)
        plugin.reader = asyncio.create_task(self._read(plugin))
        self.plugins[request.resource_name] = plugin
        self.registrations.append((request.resource_name, request.endpoint))
        async with self._changed:
            self._changed.notify_all()

    async def _read(self, plugin: PluginEndpoint) -> None:
        try:
            async for response in plugin.stub.ListAndWatch(pb.Empty()):
                plugin.devices = {d.ID: d.health for d in response.devices}  # every message is the full list
                plugin.updates += 1
                async with self._changed:
                    self._changed.notify_all()
        except grpc.aio.AioRpcError:
            pass
        # stream ended: kubelet marks every device of the resource unhealthy
        plugin.devices = dict.fromkeys(plugin.devices, "Unhealthy")
        async with self._changed:
            self._changed.notify_all()

    async def wait_for(self, predicate: Callable[[StandInKubelet], bool], timeout: float = 10.0) -> None:
        """Wait until `predicate(self)` holds (generous timeouts only avoid hangs)."""
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: predicate(self)), timeout)

    def healthy(self, resource: str) -> list[str]:
        plugin = self.plugins.get(resource)
        if plugin is None:
            return []
        return [d for d, h in plugin.devices.items() if h == "Healthy"]

    # --- allocation ---------------------------------------------------------------------------------------
    async def allocate(self, resource: str, pod: str, count: int) -> pb.ContainerAllocateResponse:
        """Admit one container of `pod` asking for `count` devices; raises AioRpcError on refusal."""
        async with self._admitting:
            return await self._allocate(resource, pod, count)

    async def _allocate(self, resource: str, pod: str, count: int) -> pb.ContainerAllocateResponse:
        plugin = self.plugins[resource]
        used = {d for ids in self.assigned.values() for d in ids}
        available = sorted(d for d in self.healthy(resource) if d not in used)
        if len(available) < count:
            raise RuntimeError(f"kubelet: only {len(available)} free {resource} for {pod}, {count} wanted")
        chosen = available[:count]
        if plugin.options.get_preferred_allocation_available:
            reply = await plugin.stub.GetPreferredAllocation(
                pb.PreferredAllocationRequest(
                    container_requests=[
                        pb.ContainerPreferredAllocationRequest(available_deviceIDs=available, allocation_size=count)
                    ]
                )
            )
            preferred = [d for d in reply.container_responses[0].deviceIDs if d in available]
            if len(preferred) == count:
                chosen = preferred
        response = await self.allocate_ids(resource, chosen)
        self.assigned[pod] = chosen
        return response

    async def allocate_ids(self, resource: str, ids: list[str]) -> pb.ContainerAllocateResponse:
        reply = await self.plugins[resource].stub.Allocate(
            pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])
        )
        response: pb.ContainerAllocateResponse = reply.container_responses[0]
        return response

    def release(self, pod: str) -> None:
        self.assigned.pop(pod, None)
