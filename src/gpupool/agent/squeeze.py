"""The agent's half of time-sharing instead of eviction: it follows the `gpupool.io/squeezed` pods of its
node (gpupool.api.squeeze) and writes each one's squeezed compute into the pod's hook file, where the
interception library enforces it from the next kernel launch; when the scheduler lifts the squeeze the
value is cleared the same way. The file is written again on every pass, so a pod whose library re-created
it (its first process started after the squeeze) is squeezed all the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from gpupool.agent.hookdir import hook_paths, pod_dir, squeeze_by_index, valid_uid, write_squeeze
from gpupool.agent.port import AgentCluster
from gpupool.api.squeeze import squeezed_cores

log = logging.getLogger(__name__)

# How soon a squeeze (or its lifting) reaches a running pod, at most. A list of the node's pods (filtered by
# the API server) per pass, and none while the node has no hook pod.
INTERVAL_S = 5.0


def apply_squeezes(root: Path, pods: Iterable[Mapping[str, Any]]) -> dict[str, dict[int, float]]:
    """Bring every hook pod's file in line with its squeeze; returns the squeezes now in force by pod UID
    (GPU index -> percent), for pods whose file was changed. Pods without a hook directory are skipped."""
    if not hook_paths(root).pods.is_dir():
        return {}
    changed: dict[str, dict[int, float]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        if not valid_uid(uid):
            continue
        directory = pod_dir(root, uid)
        if not directory.is_dir():
            continue
        wanted = squeeze_by_index(directory, squeezed_cores(pod))
        try:
            written = write_squeeze(directory, wanted)
        except (OSError, ValueError) as e:
            log.warning("pod %s/%s: squeeze not written: %s", meta.get("namespace"), meta.get("name"), e)
            continue
        if written is None or not written.changed:
            continue
        changed[uid] = wanted
        what = ", ".join(f"GPU {i}: {v:g} %" for i, v in sorted(wanted.items())) or "lifted"
        if written.enforced:
            log.info("pod %s/%s: compute squeeze %s", meta.get("namespace"), meta.get("name"), what)
        else:
            log.warning("pod %s/%s: compute squeeze %s written, but the pod's interception library is too old "
                        "to enforce it", meta.get("namespace"), meta.get("name"), what)
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
