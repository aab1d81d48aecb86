"""The progress bar of `gpupool simulate`: one line for all replays, one per replay running."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from gpupool.core.model import Node
from gpupool.sim.parallel import Job, run_all


def run_with_bar(console: Console, fn: Callable[..., Any], nodes: Sequence[Node], pods: Sequence[Any],
                 jobs: Sequence[Job], workers: int, **options: Any) -> list[Any]:
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        overall = bar.add_task(f"{len(jobs)} replays on {min(workers, len(jobs))} process(es)", total=len(jobs))
        running: dict[int, TaskID] = {}

        def progress(k: int, done: int, total: int) -> None:
            if k not in running:
                running[k] = bar.add_task(f"  {jobs[k].policy} seed {jobs[k].seed}", total=total)
            bar.update(running[k], completed=done, total=total)

        def finished(k: int) -> None:
            if k in running:
                bar.remove_task(running.pop(k))
            bar.advance(overall)

        return run_all(fn, nodes, pods, jobs, workers, progress=progress, finished=finished, **options)
