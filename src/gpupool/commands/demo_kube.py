"""`gpupool demo --kube`: the same demo on a real control plane (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler v1.37.2 built by scripts/k8s-testbed) instead of the embedded
cluster, so a user can watch the real kube-scheduler call the gpupool extender, e.g. with
`kubectl --kubeconfig <printed path> get pods -A -o wide -w`.

The control plane and the fake nodes come from the test harness (gpupool.testing.testbed and .fleet); the
binaries are built once with `scripts/k8s-testbed build`. Wiring (in commands/demo.py): a `--kube` flag
that calls `run_kube_demo(nodes, pods, policy, serve)` instead of the embedded run and exits with its
return code.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time

import click

from gpupool.testing import fleet, testbed


def run_kube_demo(nodes: int | None, pods: int | None, policy: str | None, serve: bool) -> int:
    """Run the demo on the real control plane; returns the process exit code."""
    try:
        testbed.find_binaries()
    except testbed.TestbedError as e:
        raise click.ClickException(str(e)) from None
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(_run(nodes or 20, 200 if pods is None else pods, policy, serve))
    return 130


async def _run(nodes: int, pods: int, policy: str | None, serve: bool) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from gpupool.cluster.kube import KubeCluster
    from gpupool.commands.signals import until_stopped
    from gpupool.core.policies import DEFAULT_POLICY
    from gpupool.scheduler.app import create_app
    from gpupool.scheduler.config import SchedulerConfig
    from gpupool.scheduler.server import serve_in_background
    from gpupool.scheduler.service import ExtenderService

    console = Console()
    bed = testbed.Testbed()
    console.print("starting etcd, kube-apiserver and kube-controller-manager v1.37.2 on 127.0.0.1 ...")
    bed.start()  # in this thread: the components are tied to the thread that starts them
    cluster = service = server = api = None
    try:
        config = SchedulerConfig(port=0, leader_elect=False, default_policy=policy or DEFAULT_POLICY,
                                 kubeconfig=str(bed.kubeconfig(testbed.SCHEDULER_USER)))
        console.print(f"scheduler config: {config.describe()}")
        cluster = KubeCluster.from_config(config.kubeconfig)
        service = ExtenderService(cluster, config)
        await service.start()
        server = await serve_in_background(create_app(service), config.host, config.port)
        bed.start_scheduler(testbed.scheduler_config(server.url))
        console.print(f"API server [cyan]{bed.url}[/], extender [cyan]{server.url}[/], kube-scheduler running")
        console.print(f"watch it: [bold]kubectl --kubeconfig {bed.kubeconfig()} get pods -n demo -o wide -w[/]")
        api = fleet.KubeApi(bed.url, bed.admin_token)
        await api.ensure_namespace("demo")
        await fleet.create_nodes(api, [fleet.gpu_node(f"gpu-{i:03d}", gpus=4) for i in range(nodes)])
        console.print(f"{nodes} fake GPU nodes (4 x A100-80GB each) created")
        rng = random.Random(1)
        specs = [fleet.share_pod(f"share-{i:04d}", "demo", memory_mib=rng.choice([5120, 10240, 20480, 40960]),
                                 cores=rng.choice([10, 20, 25, 30, 50])) for i in range(pods)]
        async with fleet.StatusKubelet(api, namespace="demo"):
            start = time.perf_counter()
            for p in specs:
                await api.create_pod(p)
            bound = 0
            with Progress(TextColumn("kube-scheduler binding"), BarColumn(), MofNCompleteColumn(),
                          TimeElapsedColumn(), console=console) as progress:
                task = progress.add_task("pods", total=len(specs))
                deadline = time.monotonic() + 120 + len(specs)
                while bound < len(specs) and time.monotonic() < deadline:
                    current, _ = await api.list_pods("demo")
                    bound = sum(1 for p in current if p["spec"].get("nodeName"))
                    progress.update(task, completed=bound)
                    await asyncio.sleep(0.5)
            elapsed = time.perf_counter() - start
        check = await service.debug_ledger()
        problems = sum(len(v) for v in check["diff"].values())
        state = service.ledger.state
        table = Table(title="summary (real kube-scheduler + gpupool extender)", show_header=False)
        table.add_row("pods created", str(len(specs)))
        table.add_row("bound by kube-scheduler", str(bound))
        table.add_row("pods per second", f"{bound / elapsed:.1f}" if elapsed > 0 else "-")
        table.add_row("GPUs in use", f"{int((state.gpu_sharers > 0).sum())} / {state.total_gpus}")
        table.add_row("ledger vs API", "consistent" if problems == 0 else f"[red]{problems} difference(s)[/]")
        console.print(table)
        if serve:
            console.print(f"serving until Ctrl-C: kubeconfig {bed.kubeconfig()}  ledger {server.url}/debug/ledger")
            await until_stopped()
        return 0 if bound == len(specs) and problems == 0 else 1
    finally:
        if api is not None:
            await api.close()
        bed.stop_scheduler()
        if server is not None:
            await server.stop()
        if service is not None:
            await service.stop()
        if cluster is not None:
            await cluster.close()
        bed.stop()

