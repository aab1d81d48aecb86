"""A stand-in for kube-scheduler that talks to the extender over HTTP exactly as kube-scheduler does with
`nodeCacheCapable: true`: POST /filter with the candidate node names, POST /prioritize (skipped when one
node is left) and pick the highest `score x weight`, then POST /bind. Scheduling cycles run one pod at a
time; binds run concurrently, as kube-scheduler's binding cycles do. A failed bind re-queues the pod.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpupool.api.pod import pod_key
from gpupool.cluster.port import ClusterPort, Obj
from gpupool.demo.extender_client import JsonClient


@dataclass(slots=True)
class Outcome:
    pod: str
    node: str | None = None
    reason: str = ""  # why not bound
    attempts: int = 0


@dataclass(slots=True)
class DriverStats:
    bound: int = 0
    unschedulable: int = 0
    bind_retries: int = 0
    outcomes: list[Outcome] = field(default_factory=list)


class KubeSchedulerDriver:
    def __init__(
        self,
        url: str,
        cluster: ClusterPort,
        node_names: list[str],
        weight: int = 1,
        bind_concurrency: int = 16,
        max_attempts: int = 5,
        seed: int = 0,
        timeout_s: float = 30.0,
    ) -> None:
        self.url = url.rstrip("/")
        self.cluster = cluster
        self.node_names = node_names
        self.weight = weight
        self.max_attempts = max_attempts
        self._bind_slots = asyncio.Semaphore(bind_concurrency)
        self._rng = random.Random(seed)
        self._client = JsonClient(self.url, timeout_s)
        self._all_names = json.dumps(node_names).encode()  # the same candidate list for every pod
        self.stats = DriverStats()
        self.bind_seconds: list[float] = []  # latency of every /bind call, for the benchmarks

    async def close(self) -> None:
        await self._client.close()

    async def _post(self, verb: str, body: Any) -> Any:
        return await self._client.post(f"/{verb}", body)

    async def decide(self, pod: Obj) -> tuple[str | None, str]:
        """One scheduling cycle: (chosen node, "") or (None, why not)."""
        body = b'{"Pod":' + json.dumps(pod).encode() + b',"Nodes":null,"NodeNames":' + self._all_names + b"}"
        result = await self._post("filter", body)
        if result.get("Error"):
            return None, result["Error"]
        feasible = result.get("NodeNames") or []
        if not feasible:
            failed = {**(result.get("FailedNodes") or {}), **(result.get("FailedAndUnresolvableNodes") or {})}
            counts: dict[str, int] = {}
            for why in failed.values():
                counts[why] = counts.get(why, 0) + 1
            summary = "; ".join(f"{n} node(s): {w}" for w, n in sorted(counts.items(), key=lambda kv: -kv[1])[:3])
            return None, f"0/{len(self.node_names)} nodes are available: {summary}"
        if len(feasible) == 1:
            return feasible[0], ""
        scores = await self._post("prioritize", {"Pod": pod, "NodeNames": feasible, "Nodes": None})
        # kube-scheduler adds score x weight x 10 to its own plugin scores; with no plugins here, the
        # highest weighted score wins and ties are broken at random, as kube-scheduler does.
        if not scores:  # every node scored 0
            return self._rng.choice(feasible), ""
        top = max(h["Score"] * self.weight for h in scores)
        return self._rng.choice([h["Host"] for h in scores if h["Score"] * self.weight == top]), ""

    async def bind(self, pod: Obj, node: str) -> str:
        meta = pod["metadata"]
        args = {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": node}
        async with self._bind_slots:
            start = time.perf_counter()
            result = await self._post("bind", args)
            self.bind_seconds.append(time.perf_counter() - start)
        return str(result.get("Error") or "")

    async def run(self, pods: list[Obj], on_outcome: Callable[[Outcome], None] | None = None) -> DriverStats:
        """Create each pod in the cluster and schedule it; returns when every pod is bound or given up."""
        queue: asyncio.Queue[tuple[Obj, int]] = asyncio.Queue()
        for p in pods:
            created = await self.cluster.create_pod(p)
            queue.put_nowait((created, 1))
        pending = len(pods)
        done = asyncio.Event()
        binds: set[asyncio.Task[None]] = set()

        def finish(outcome: Outcome) -> None:
            nonlocal pending
            self.stats.outcomes.append(outcome)
            if outcome.node:
                self.stats.bound += 1
            else:
                self.stats.unschedulable += 1
            if on_outcome is not None:
                on_outcome(outcome)
            pending -= 1
            if pending == 0:
                done.set()

        async def bind_later(pod: Obj, node: str, attempt: int) -> None:
            error = await self.bind(pod, node)
            if not error:
                finish(Outcome(pod_key(pod), node, "", attempt))
            elif attempt < self.max_attempts:
                self.stats.bind_retries += 1
                await asyncio.sleep(0.01 * attempt)
                queue.put_nowait((pod, attempt + 1))
            else:
                finish(Outcome(pod_key(pod), None, error, attempt))

        if pending == 0:
            return self.stats
        try:
            while not done.is_set():
                getter = asyncio.create_task(queue.get())
                waiter = asyncio.create_task(done.wait())
                await asyncio.wait({getter, waiter}, return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    waiter.cancel()
                    break
                waiter.cancel()
                pod, attempt = getter.result()
                node, why = await self.decide(pod)
                if node is None:
                    finish(Outcome(pod_key(pod), None, why, attempt))
                    continue
                task = asyncio.create_task(bind_later(pod, node, attempt))
                binds.add(task)
                task.add_done_callback(binds.discard)
            await asyncio.gather(*binds)
        finally:
            # Idle keep-alive connections would outlive a caller that never calls close() (a resource
            # warning, an error under the test settings); the next run opens new ones.
            await self._client.close()
        return self.stats
