"""The agent's half of time-sharing instead of eviction: it follows the `gpupool.io/squeezed` pods of its
node (gpupool.api.squeeze) and writes each one's squeezed compute into the hook file of every GPU
container of the pod (one directory each, gpupool.agent.state.hookdir: each container gets the squeeze of the
GPUs it sees, by its own GPU order), where the interception library enforces it from the next kernel
launch; when the scheduler lifts the squeeze the value is cleared the same way. The files are written again
on every pass, so a container whose library re-created its file (its first process started after the
squeeze) is squeezed all the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from gpupool.agent.port import AgentCluster
from gpupool.agent.state.hookdir import hook_dirs, hook_paths, pod_dir, squeeze_by_index, valid_uid, write_squeeze
from gpupool.api.squeeze import squeezed_cores

log = logging.getLogger("gpupool.agent.squeeze")  # the name it had before the agent's rooms

# How soon a squeeze (or its lifting) reaches a running pod, at most. A list of the node's pods (filtered by
# the API server) per pass, and none while the node has no hook pod.
INTERVAL_S = 5.0


def apply_squeezes(root: Path, pods: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], dict[int, float]]:
    """Bring every hook container's file in line with its pod's squeeze; returns the squeezes now in force
    by (pod UID, container) (GPU index -> percent; container "" for an older agent's pod-wide directory), for
    the files that were changed. Pods without a hook directory are skipped."""
    if not hook_paths(root).pods.is_dir():
        return {}
    changed: dict[tuple[str, str], dict[int, float]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        if not valid_uid(uid):
            continue
        cores = squeezed_cores(pod)
        base = pod_dir(root, uid)
        for directory in hook_dirs(root, uid):
            container = "" if directory == base else directory.name
            where = f"pod {meta.get('namespace')}/{meta.get('name')}" + (f" container {container}" if container else "")
            wanted = squeeze_by_index(directory, cores)
            try:
                written = write_squeeze(directory, wanted)
            except (OSError, ValueError) as e:
                log.warning("%s: squeeze not written: %s", where, e)
                continue
            if written is None or not written.changed:
                continue
            changed[(uid, container)] = wanted
            what = ", ".join(f"GPU {i}: {v:g} %" for i, v in sorted(wanted.items())) or "lifted"
            if written.enforced:
                log.info("%s: compute squeeze %s", where, what)
            else:
                log.warning("%s: compute squeeze %s written, but its interception library is too old to enforce it",
                            where, what)
    return changed


async def follow_squeezes(cluster: AgentCluster, node: str, root: Path, stop: asyncio.Event,
                          interval_s: float = INTERVAL_S) -> None:
    """Until `stop`: every `interval_s`, read the node's pods and apply their squeezes."""
    while not stop.is_set():
        try:
            if await asyncio.to_thread(_has_hook_pods, root):
                pods = await cluster.list_pods_on_node(node)
                await asyncio.to_thread(apply_squeezes, root, pods)
        except Exception as e:  # API and file errors alike: the next pass tries again
            log.warning("squeezes of node %s not applied: %s", node, e)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval_s)


def _has_hook_pods(root: Path) -> bool:
    with contextlib.suppress(OSError):
        return any(entry.is_dir() for entry in hook_paths(root).pods.iterdir())
    return False
