"""Reading Node objects: the gpupool nodes among them (those with an inventory), what of a Node object a
cache of parsed nodes depends on, and a node's pods-per-GPU limit."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpupool.api.counted import DEFAULT_SPLIT
from gpupool.api.inventory import InventoryError, decode_inventory, node_from_object
from gpupool.api.names import ANN_INVENTORY
from gpupool.core.model import Node


def nodes_from_objects(objs: Iterable[Mapping[str, Any]]) -> tuple[list[Node], dict[str, str]]:
    """gpupool nodes (those with an inventory) sorted by name, and errors of malformed inventories."""
    nodes: list[Node] = []
    errors: dict[str, str] = {}
    for obj in objs:
        name = str((obj.get("metadata") or {}).get("name", ""))
        try:
            node = node_from_object(obj)
        except InventoryError as e:
            errors[name] = str(e)
            continue
        if node is not None:
            nodes.append(node)
    nodes.sort(key=lambda n: n.name)
    return nodes, errors


def node_signature(obj: Mapping[str, Any]) -> tuple[str, str, str, tuple[tuple[str, str], ...]]:
    """What of a Node object the ledger depends on (an annotation it does not read must not rebuild anything)."""
    meta = obj.get("metadata") or {}
    alloc = (obj.get("status") or {}).get("allocatable") or {}
    return (
        str((meta.get("annotations") or {}).get(ANN_INVENTORY, "")),
        str(alloc.get("cpu", "")),
        str(alloc.get("memory", "")),
        tuple(sorted((str(k), str(v)) for k, v in (meta.get("labels") or {}).items())),
    )


def inventory_split(obj: Mapping[str, Any]) -> int:
    """The node's pods-per-GPU limit: its inventory's `split` (DEFAULT_SPLIT when unreadable)."""
    text = ((obj.get("metadata") or {}).get("annotations") or {}).get(ANN_INVENTORY)
    if not text:
        return DEFAULT_SPLIT
    try:
        return decode_inventory(str(text)).split
    except InventoryError:
        return DEFAULT_SPLIT
