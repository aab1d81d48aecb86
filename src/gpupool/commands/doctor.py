"""`gpupool doctor`: check an installation of the chart end to end (gpupool.doctor) and print what is wrong
and how to fix it. Exit 0 when nothing failed (warnings allowed), 1 when something did, 2 for usage errors.

Every name shown comes from the cluster, some of it from tenants (node names, labels, API messages): the
table shows it as plain `Text` (never read as rich markup) through `shown`, which escapes control
characters, so no name can style the terminal or forge a line.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from gpupool.api.logsafe import shown

if TYPE_CHECKING:
    from gpupool.doctor.checks import Finding
    from gpupool.doctor.collect import Options

STYLE = {"ok": "green", "info": "cyan", "warn": "yellow", "fail": "bold red"}


def _kubeconfig(path: str | None) -> str | None:
    """The file to read: --kubeconfig, else $KUBECONFIG (its first entry), else ~/.kube/config when there,
    else None (in-cluster service account)."""
    if path:
        return path
    env = os.environ.get("KUBECONFIG", "")
    if env:
        return env.split(os.pathsep)[0]
    default = Path.home() / ".kube" / "config"
    return str(default) if default.is_file() else None


def _labels(text: str) -> dict[str, str]:
    out = {}
    for part in filter(None, text.split(",")):
        key, eq, value = part.partition("=")
        if not eq or not key.strip():
            raise click.BadParameter(f"{part!r} is not KEY=VALUE", param_hint="--nodes")
        out[key.strip()] = value.strip()
    return out


async def _run(kubeconfig: str | None, context: str | None, options: Options) -> list[Finding]:
    from gpupool.cluster.kube import KubeCluster
    from gpupool.doctor.collect import diagnose

    try:
        cluster = KubeCluster.from_config(kubeconfig, context)
    except Exception as e:  # lightkube's ConfigError and whatever a malformed file raises
        where = kubeconfig or "the in-cluster service account"
        raise click.UsageError(f"cannot use {where}{f' (context {context})' if context else ''}: {e}") from None
    try:
        return await diagnose(cluster, options, time.time)
    finally:
        await cluster.close()


def render(findings: list[Finding]) -> object:
    from rich.table import Table
    from rich.text import Text

    table = Table(show_lines=False, expand=False)
    for column in ("status", "area", "subject", "what was found", "how to fix it"):
        table.add_column(column, overflow="fold")
    for f in findings:
        table.add_row(Text(f.status.value, style=STYLE[f.status.value]), Text(f.area), Text(shown(f.subject)),
                      Text(shown(f.detail, 2000)), Text(shown(f.fix, 2000)))
    return table


def render_lines(findings: list[Finding], width: int) -> str:
    """The findings as wrapped lines, for a pipe or a narrow terminal, where a five-column table folds every
    cell into a column a few characters wide: the status first, then the subject, what was found and the
    fix, each wrapped to `width` under a hanging indent."""
    import textwrap

    width = max(width, 40)
    out: list[str] = []
    for f in findings:
        head = f"{f.status.value.upper():<5} {f.area}: {shown(f.subject)}"
        out += textwrap.wrap(head, width, subsequent_indent="      ", break_on_hyphens=False)
        for label, text in (("", f.detail), ("fix: ", f.fix)):
            if text:
                out += textwrap.wrap(label + shown(text, 2000), width, initial_indent="      ",
                                     subsequent_indent="      ", break_on_hyphens=False)
    return "\n".join(out)


# Below this many columns (or into a pipe) the findings are printed as lines, not as a table.
TABLE_MIN_WIDTH = 120


@click.command(name="doctor")
@click.option("--kubeconfig", type=click.Path(exists=True, dir_okay=False),
              help="Kubeconfig file [$KUBECONFIG, ~/.kube/config, or the in-cluster service account].")
@click.option("--context", default=None, help="Kubeconfig context [the current one].")
@click.option("--namespace", "-n", default="gpupool-system", show_default=True, help="The release's namespace.")
@click.option("--release", default="", help="The Helm release name [the only release of the chart in the namespace].")
@click.option("--extender-url", default="",
              help="Where this machine reaches the extender (e.g. http://127.0.0.1:8888 after kubectl port-forward "
                   "to the scheduler pod) [read the kubelet's readiness of its container instead].")
@click.option("--nodes", "node_labels", default="", metavar="KEY=VALUE[,...]",
              help="Check only the nodes with these labels [every GPU node].")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of a table.")
def doctor(kubeconfig: str | None, context: str | None, namespace: str, release: str, extender_url: str,
           node_labels: str, as_json: bool) -> None:
    """Check an installation: webhook, scheduler and extender, agents, node validation, RBAC, toolkit, DRA."""
    from gpupool.doctor.checks import failed
    from gpupool.doctor.collect import Options

    options = Options(namespace, release, extender_url.rstrip("/"), _labels(node_labels))
    findings = asyncio.run(_run(_kubeconfig(kubeconfig), context, options))
    bad = failed(findings)
    if as_json:
        click.echo(json.dumps({"ok": not bad, "release": release, "namespace": namespace,
                               "findings": [f.as_json() for f in findings]}, indent=1))
    else:
        from rich.console import Console

        console = Console()
        if console.is_terminal and console.width >= TABLE_MIN_WIDTH:
            console.print(render(findings))
        else:
            click.echo(render_lines(findings, console.width if console.is_terminal else 80))
        summary = "something is wrong" if bad else "nothing failed"
        console.print(f"gpupool doctor: {summary} ({sum(f.status.value == 'fail' for f in findings)} failed, "
                      f"{sum(f.status.value == 'warn' for f in findings)} warnings)", markup=False)
    raise SystemExit(1 if bad else 0)
