"""Checks shared by the e2e tests: waiting without timing assertions, and the allocation invariants
(every GPU pod's grant is on its node, matches its request, and no GPU is over capacity)."""

from __future__ import annotations

import asyncio
import inspect
from collections import defaultdict
from typing import Any

from gpupool.api.allocation import decode_allocation
from gpupool.api.inventory import decode_inventory
from gpupool.api.names import ANN_ALLOCATION, ANN_INVENTORY, RESOURCE_CORES, RESOURCE_GPU, RESOURCE_MEMORY

Obj = dict[str, Any]


async def eventually(check: Any, timeout_s: float = 60.0, step_s: float = 0.25, what: str = "condition",
                     describe: Any = None) -> Any:
    """Poll `check()` (sync or async) until it returns a truthy value; the timeout only prevents a hang."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    last: Any = None
    while loop.time() < deadline:
        last = check()
        if inspect.isawaitable(last):
            last = await last
        if last:
            return last
        await asyncio.sleep(step_s)
    detail = describe() if describe is not None else f"last: {last!r}"
    raise AssertionError(f"{what} not reached within {timeout_s}s ({detail})")


def limits(pod: Obj) -> dict[str, str]:
    return dict(pod["spec"]["containers"][0]["resources"].get("limits") or {})


def allocation_problems(pods: list[Obj], nodes: list[Obj]) -> list[str]:
    """Everything wrong with the allocations of bound GPU pods, against the nodes' inventories.
    Shares: cores in percent of a GPU, memory in MiB; a GPU holds at most 100 % and its memory."""
    problems: list[str] = []
    gpus: dict[str, dict[str, Any]] = {}  # uuid -> {node, memory_mib}
    for n in nodes:
        text = (n["metadata"].get("annotations") or {}).get(ANN_INVENTORY)
        if text:
            for g in decode_inventory(text).gpus:
                gpus[g.uuid] = {"node": n["metadata"]["name"], "memory_mib": g.memory_mib}
    used_cores: dict[str, float] = defaultdict(float)
    used_mem: dict[str, int] = defaultdict(int)
    for p in pods:
        key = f"{p['metadata']['namespace']}/{p['metadata']['name']}"
        node = p["spec"].get("nodeName")
        text = (p["metadata"].get("annotations") or {}).get(ANN_ALLOCATION)
        want = limits(p)
        if RESOURCE_GPU not in want:
            if text:
                problems.append(f"{key}: asks for no GPU but carries {ANN_ALLOCATION}")
            continue
        if not node:
            continue
        if not text:
            problems.append(f"{key}: bound to {node} without {ANN_ALLOCATION}")
            continue
        doc = decode_allocation(text)
        if doc.node != node or doc.pod_uid != p["metadata"]["uid"]:
            problems.append(f"{key}: allocation for {doc.node}/{doc.pod_uid}, pod is on {node} with another UID")
        if len(doc.gpus) != int(want[RESOURCE_GPU]) or len({g.uuid for g in doc.gpus}) != len(doc.gpus):
            problems.append(f"{key}: {len(doc.gpus)} grants for {want[RESOURCE_GPU]} GPUs")
        for g in doc.gpus:
            gpu = gpus.get(g.uuid)
            if gpu is None or gpu["node"] != node:
                problems.append(f"{key}: granted {g.uuid}, which is not a GPU of {node}")
                continue
            if RESOURCE_MEMORY in want and g.memory_mib != int(want[RESOURCE_MEMORY]):
                problems.append(f"{key}: {g.memory_mib} MiB granted, {want[RESOURCE_MEMORY]} asked")
            if RESOURCE_CORES in want and g.cores != float(want[RESOURCE_CORES]):
                problems.append(f"{key}: {g.cores} % granted, {want[RESOURCE_CORES]} asked")
            used_cores[g.uuid] += g.cores
            used_mem[g.uuid] += g.memory_mib
    for uuid, cores in used_cores.items():
        if cores > 100 + 1e-9:
            problems.append(f"GPU {uuid}: {cores} % of compute granted")
        if used_mem[uuid] > gpus[uuid]["memory_mib"]:
            problems.append(f"GPU {uuid}: {used_mem[uuid]} MiB granted of {gpus[uuid]['memory_mib']}")
    return problems
