"""What the webhook knows about the cluster's GPUs: the largest card per model and the most GPUs on one
node, kept current from node objects (their `gpupool.io/inventory` annotation).

Admission is on the API server's request path, so lookups are O(models); the summary is rebuilt only
when some node's inventory text actually changes (node heartbeats change status, not the annotation).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpupool.api.inventory import InventoryError, node_from_object
from gpupool.api.logsafe import shown
from gpupool.api.names import ANN_INVENTORY
from gpupool.cluster.port import ClusterPort, Gone
from gpupool.core.model import Node

log = logging.getLogger("gpupool.webhook.inventory")


@dataclass(frozen=True, slots=True)
class Limits:
    """The largest things a pod could be given anywhere in the cluster right now."""

    largest_memory_mib: int  # over every GPU
    largest_by_model: Mapping[str, int] = field(default_factory=dict)
    most_gpus_on_a_node: int = 0


class InventoryView:
    """Node name -> (annotation text, Node); `limits` is None until the first list has been seen, or
    when no node has an inventory (then no capacity check can be made)."""

    def __init__(self) -> None:
        self._text: dict[str, str] = {}
        self._nodes: dict[str, Node] = {}
        self.synced = False
        self.limits: Limits | None = None

    def replace(self, objects: Iterable[Mapping[str, Any]]) -> None:
        self._text.clear()
        self._nodes.clear()
        for obj in objects:
            self._store(obj)
        self.synced = True
        self._summarise()

    def upsert(self, obj: Mapping[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name", ""))
        text = ((obj.get("metadata") or {}).get("annotations") or {}).get(ANN_INVENTORY)
        if self._text.get(name) == text and (text is None or name in self._nodes):
            return  # heartbeat or label change: nothing the webhook uses
        self._text.pop(name, None)
        self._nodes.pop(name, None)
        self._store(obj)
        self._summarise()

    def delete(self, obj: Mapping[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name", ""))
        if self._nodes.pop(name, None) is not None:
            self._summarise()
        self._text.pop(name, None)

    def _store(self, obj: Mapping[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name", ""))
        text = ((obj.get("metadata") or {}).get("annotations") or {}).get(ANN_INVENTORY)
        if text is None:
            return
        self._text[name] = text
        try:
            node = node_from_object(obj)
        except InventoryError as e:
            # A broken inventory must not make admission fail; the scheduler reports it on the node.
            log.warning("ignoring node %s: %s", shown(name), shown(e, 1000))
            return
        if node is not None:
            self._nodes[name] = node

    def _summarise(self) -> None:
        by_model: dict[str, int] = {}
        most = 0
        for node in self._nodes.values():
            most = max(most, len(node.gpus))
            for gpu in node.gpus:
                by_model[gpu.model] = max(by_model.get(gpu.model, 0), gpu.memory_mib)
        self.limits = Limits(max(by_model.values()), by_model, most) if by_model else None


async def follow(port: ClusterPort, view: InventoryView, retry_s: float = 5.0) -> None:
    """Keep `view` current: list, then watch from the list's version; list again when the watch
    expires (410 Gone) or breaks. Runs until cancelled."""
    while True:
        try:
            objects, version = await port.list_nodes()
            view.replace(objects)
            async for event in port.watch_nodes(version):
                if event.type == "DELETED":
                    view.delete(event.object)
                else:
                    view.upsert(event.object)
        except asyncio.CancelledError:
            raise
        except Gone:
            continue
        except Exception as e:  # the API server may be briefly unreachable; keep serving meanwhile
            log.warning("node watch failed (%s); retrying in %.0fs", e, retry_s)
            await asyncio.sleep(retry_s)
