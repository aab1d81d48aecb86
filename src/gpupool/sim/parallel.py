"""Running many replays at once: one process per replay, at most one per core, each single-threaded.

A replay is a long chain of small numpy steps, so a process per replay scales with the cores while more
threads per process would only fight over them. BLAS thread pools are fixed when numpy loads, so the
workers are started (spawn) with one thread each in their environment; the parent's settings are left
as they were. Results come back in the order of the jobs, so tables do not depend on which finished first.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from gpupool.core.model import Node

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")
PROGRESS_EVERY = 500  # pods between progress reports from a worker

Progress = Callable[[int, int, int], None]  # job index, pods done, pods in the replay


@dataclass(frozen=True, slots=True)
class Job:
    """One replay: a function of (nodes, pods, policy, seed, progress callback, **options)."""

    policy: str
    seed: int


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


_worker: dict[str, Any] = {}


def _init(nodes: Sequence[Node], pods: Sequence[Any], updates: Any) -> None:
    _worker.update(nodes=nodes, pods=pods, updates=updates)


def _run(fn: Callable[..., Any], index: int, job: Job, options: dict[str, Any]) -> Any:
    updates = _worker["updates"]

    def tick(done: int, total: int) -> None:
        if done % PROGRESS_EVERY == 0 or done == total:
            updates.put((index, done, total))

    return fn(_worker["nodes"], _worker["pods"], job.policy, job.seed, progress=tick, **options)


@contextmanager
def _single_threaded_children() -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in THREAD_VARIABLES}
    os.environ.update({k: "1" for k in THREAD_VARIABLES})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_all(fn: Callable[..., Any], nodes: Sequence[Node], pods: Sequence[Any], jobs: Sequence[Job],
            workers: int, progress: Progress | None = None, finished: Callable[[int], None] | None = None,
            **options: Any) -> list[Any]:
    """fn(nodes, pods, job.policy, job.seed, progress=..., **options) for every job, `workers` at a
    time (1: in this process); `finished(k)` when job k is done. `fn` must be a module-level function
    (it is sent to the workers)."""
    if workers <= 1 or len(jobs) <= 1:
        out = []
        for k, job in enumerate(jobs):
            def tick(done: int, total: int, k: int = k) -> None:
                if progress is not None and (done % PROGRESS_EVERY == 0 or done == total):
                    progress(k, done, total)
            out.append(fn(nodes, pods, job.policy, job.seed, progress=tick, **options))
            if finished is not None:
                finished(k)
        return out
    ctx = mp.get_context("spawn")
    updates: Any = ctx.Queue()
    with _single_threaded_children():
        pool = ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=ctx, initializer=_init,
                                   initargs=(list(nodes), list(pods), updates))
        futures: list[Future[Any]] = [pool.submit(_run, fn, k, job, options) for k, job in enumerate(jobs)]
    reported: set[int] = set()
    try:
        while len(reported) < len(futures):
            try:
                k, done, total = updates.get(timeout=0.2)
                if progress is not None:
                    progress(k, done, total)
            except queue.Empty:
                pass
            for k, f in enumerate(futures):
                if f.done() and k not in reported:
                    reported.add(k)
                    if f.exception() is not None:
                        raise f.exception()  # type: ignore[misc]
                    if finished is not None:
                        finished(k)
        return [f.result() for f in futures]
    finally:
        pool.shutdown(cancel_futures=True)
