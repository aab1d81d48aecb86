"""The DRA kubelet plugin's gRPC side: registration with kubelet and the DRA service (v1 and v1beta1) on the
two unix sockets; each request goes to the driver (gpupool.agent.dra.driver)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from gpupool.agent.dra.claims import ClaimRef, Outcome
from gpupool.agent.dra.driver import DraDriver
from gpupool.agent.proto import dra_v1_pb2 as v1
from gpupool.agent.proto import dra_v1_pb2_grpc as v1_grpc
from gpupool.agent.proto import dra_v1beta1_pb2 as v1beta1
from gpupool.agent.proto import dra_v1beta1_pb2_grpc as v1beta1_grpc
from gpupool.agent.proto import pluginregistration_v1_pb2 as reg
from gpupool.agent.proto import pluginregistration_v1_pb2_grpc as reg_grpc
from gpupool.api.dra import DRIVER

log = logging.getLogger("gpupool.agent.dra")

SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")  # kubelet takes the first it knows


def _refs(claims: Sequence[Any]) -> list[ClaimRef]:
    return [ClaimRef(c.namespace, c.name, c.uid) for c in claims]


class _Registration(reg_grpc.RegistrationServicer):
    def __init__(self, server: DraServer) -> None:
        self.server = server

    async def GetInfo(self, request: reg.InfoRequest, context: grpc.aio.ServicerContext) -> reg.PluginInfo:
        return reg.PluginInfo(type="DRAPlugin", name=DRIVER, endpoint=str(self.server.service_socket),
                              supported_versions=list(SERVICES))

    async def NotifyRegistrationStatus(self, request: reg.RegistrationStatus,
                                       context: grpc.aio.ServicerContext) -> reg.RegistrationStatusResponse:
        self.server.registered = request.plugin_registered
        if request.plugin_registered:
            self.server.registrations += 1
            log.info("kubelet registered DRA driver %s", DRIVER)
        else:
            log.error("kubelet refused DRA driver %s: %s", DRIVER, request.error)
        return reg.RegistrationStatusResponse()


def _prepare_reply(pb: Any, outcomes: Mapping[str, Outcome], share_ids: bool) -> Any:
    """NodePrepareResourcesResponse of the proto module `pb` (v1 or v1beta1; share IDs exist in v1 only)."""
    reply = pb.NodePrepareResourcesResponse()
    for uid, o in outcomes.items():
        if o.claim is None:
            reply.claims[uid].error = o.error
            continue
        reply.claims[uid].devices.extend(
            pb.Device(request_names=[d.request], pool_name=d.pool, device_name=d.device,
                      cdi_device_ids=list(o.claim.cdi_ids),
                      **({"share_id": d.share_id} if share_ids and d.share_id else {}))
            for d in o.claim.devices)
    return reply


def _unprepare_reply(pb: Any, errors: Mapping[str, str]) -> Any:
    reply = pb.NodeUnprepareResourcesResponse()
    for uid, error in errors.items():
        reply.claims[uid].error = error
    return reply


class _ServiceV1(v1_grpc.DRAPluginServicer):
    def __init__(self, driver: DraDriver) -> None:
        self.driver = driver

    async def NodePrepareResources(self, request: v1.NodePrepareResourcesRequest,
                                   context: grpc.aio.ServicerContext) -> v1.NodePrepareResourcesResponse:
        reply: v1.NodePrepareResourcesResponse = _prepare_reply(v1, await self.driver.prepare(_refs(request.claims)),
                                                                 share_ids=True)
        return reply

    async def NodeUnprepareResources(self, request: v1.NodeUnprepareResourcesRequest,
                                     context: grpc.aio.ServicerContext) -> v1.NodeUnprepareResourcesResponse:
        reply: v1.NodeUnprepareResourcesResponse = _unprepare_reply(
            v1, await self.driver.unprepare(_refs(request.claims)))
        return reply


class _ServiceV1beta1(v1beta1_grpc.DRAPluginServicer):
    """The same service for kubelets that speak only v1beta1 (no share IDs there)."""

    def __init__(self, driver: DraDriver) -> None:
        self.driver = driver

    async def NodePrepareResources(self, request: v1beta1.NodePrepareResourcesRequest,
                                   context: grpc.aio.ServicerContext) -> v1beta1.NodePrepareResourcesResponse:
        reply: v1beta1.NodePrepareResourcesResponse = _prepare_reply(
            v1beta1, await self.driver.prepare(_refs(request.claims)), share_ids=False)
        return reply

    async def NodeUnprepareResources(self, request: v1beta1.NodeUnprepareResourcesRequest,
                                     context: grpc.aio.ServicerContext) -> v1beta1.NodeUnprepareResourcesResponse:
        reply: v1beta1.NodeUnprepareResourcesResponse = _unprepare_reply(
            v1beta1, await self.driver.unprepare(_refs(request.claims)))
        return reply


@dataclass
class DraServer:
    """The kubelet plugin's two unix sockets: registration in plugins_registry (kubelet watches it) and the
    DRA service under plugins/<driver>/. Removing the registration socket deregisters the driver."""

    driver: DraDriver
    kubelet_root: Path
    registered: bool = False
    registrations: int = 0
    _server: grpc.aio.Server | None = field(default=None, repr=False)

    @property
    def registration_socket(self) -> Path:
        return self.kubelet_root / "plugins_registry" / f"{DRIVER}-reg.sock"

    @property
    def service_socket(self) -> Path:
        return self.kubelet_root / "plugins" / DRIVER / "dra.sock"

    async def start(self) -> None:
        for path in (self.registration_socket, self.service_socket):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.unlink(missing_ok=True)  # a stale socket of an earlier run
        server = grpc.aio.server()
        reg_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        v1_grpc.add_DRAPluginServicer_to_server(_ServiceV1(self.driver), server)
        v1beta1_grpc.add_DRAPluginServicer_to_server(_ServiceV1beta1(self.driver), server)
        # the service socket first: kubelet dials it as soon as it sees the registration socket
        server.add_insecure_port(f"unix://{self.service_socket}")
        server.add_insecure_port(f"unix://{self.registration_socket}")
        await server.start()
        self._server = server

    async def stop(self, grace: float | None = 0.2) -> None:
        self.registration_socket.unlink(missing_ok=True)
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(grace)
        self.service_socket.unlink(missing_ok=True)

    def sockets_ok(self) -> bool:
        return self.registration_socket.is_socket() and self.service_socket.is_socket()
