"""Isolation remote on the pod's node (docs/remote.md): where the GPU server of a share is found (its pool's
ResourceSlice). What a remote claim's containers get is the strategy gpupool.agent.isolation.remote."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gpupool.agent.port import AgentCluster
from gpupool.api.dra import ATTR_REMOTE_SERVER, slice_name

# what a slice may name as a server: the address becomes a container's environment, so nothing but this
_REMOTE_ADDRESS = re.compile(r"^tcp:[A-Za-z0-9.:\[\]-]{1,56}:\d{1,5}$")


def _slice_device(obj: Mapping[str, Any] | None, device: str) -> Mapping[str, Any] | None:
    for d in ((obj or {}).get("spec") or {}).get("devices") or []:
        if d.get("name") == device:
            return dict(d)
    return None


async def remote_address(cluster: AgentCluster, pool: str, device: str) -> str | None:
    """The GPU server a pool's device is served by: attribute remoteServer of the device in the pool's slices
    (its node's agent writes them while its TCP server listens); None when there is none or it is not a
    tcp:HOST:PORT (it becomes a file containers read and a move's target: nothing else may pass)."""
    first = await cluster.get_slice(slice_name(pool))
    found = _slice_device(first, device)
    count = int((((first or {}).get("spec") or {}).get("pool") or {}).get("resourceSliceCount", 1) or 1)
    for k in range(1, min(count, 64)):  # bounded: a pool of at most MAX_GPUS_PER_NODE devices
        if found is not None:
            break
        found = _slice_device(await cluster.get_slice(f"{slice_name(pool)}-{k}"), device)
    attr = ((found or {}).get("attributes") or {}).get(ATTR_REMOTE_SERVER) or {}
    address = attr.get("string") if isinstance(attr, Mapping) else None
    return address if isinstance(address, str) and _REMOTE_ADDRESS.match(address) else None
