"""Isolation `none`: the GPUs and their limits as environment, nothing enforced."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from gpupool.agent.isolation.base import GrantRequest, ModeGrant, Prepared, Refused, plain_gpus
from gpupool.api.isolation import IsolationMode


class NoIsolation:
    """`none`: the GPUs and their limits as environment, nothing enforced (whole GPUs, trusted tenants)."""

    name = IsolationMode.NONE
    second_line = False

    def check(self, request: GrantRequest) -> Refused | None:
        return None

    async def prepare(self, request: GrantRequest) -> Prepared | Refused:
        return Prepared()

    def grant(self, request: GrantRequest, prepared: Prepared) -> ModeGrant | Refused:
        return ModeGrant(visible=plain_gpus(request))

    async def release(self, pods: Sequence[Mapping[str, Any]], node: str, claims: Collection[str] = ()) -> None:
        return None

    def inventory_fields(self) -> dict[str, dict[str, Any]]:
        return {}
