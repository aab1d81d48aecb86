"""`gpupool top`: the pool in the terminal: who holds which share of which GPU, and what waits.

Reads the pool snapshot JSON that the scheduler (or `gpupool demo --serve`) serves at GET /pool.

Each GPU shows its vendor and runtime (nvidia/cuda, amd/rocm, ascend/cann) and its hardware partitions (MIG
instances, AMD compute/memory-mode partitions, Ascend vNPUs) with the pod holding each; one line per vendor
under the summary gives its cards, memory and allocated shares.

Every name in the snapshot (pods, namespaces, nodes, models, vendors, profiles, pending reasons) comes from
tenants, node agents or the scheduler's callers: it is shown through `_text`, which escapes control
characters (no terminal escape sequence or OSC-8 link reaches the terminal) and never lets rich read it as
markup (`x[/]`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.text import Text

    from gpupool.api.snapshot import GPUView, PartitionView, PendingPod, Snapshot, VendorTotals

from gpupool.api.logsafe import shown
from gpupool.core.vendors import UNIT_OF_VENDOR

DEFAULT_URL = "http://127.0.0.1:8888/pool"
COLOURS = ("cyan", "magenta", "green", "yellow", "blue", "red", "bright_cyan", "bright_magenta")
BAR = 20  # characters for one GPU's compute


class FetchError(Exception):
    """The snapshot could not be had; the message says from where and why."""


def fetch(url: str, timeout: float) -> Snapshot:
    import httpx
    from pydantic import ValidationError

    from gpupool.api.snapshot import Snapshot

    try:
        r = httpx.get(url, timeout=timeout, follow_redirects=True)
    except httpx.HTTPError as e:
        raise FetchError(f"cannot reach {url}: {e or type(e).__name__}") from None
    if r.status_code != 200:
        raise FetchError(f"{url} answered HTTP {r.status_code}: {shown(r.text[:200].strip())}")
    try:
        return Snapshot.model_validate_json(r.content)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(map(str, first["loc"])) or "document"
        raise FetchError(f"{url} did not return a pool snapshot ({shown(where)}: {shown(first['msg'])})") from None


def _text(value: object, style: str = "") -> Text:
    """A name as rich shows it: plain text (never markup), control characters escaped, length bounded."""
    from rich.text import Text

    return Text(shown(value), style=style)


def _bar(gpu: GPUView, colour_of: dict[str, str]) -> RenderableType:
    from rich.text import Text

    text = Text()
    used = 0
    for g in gpu.grants:
        n = max(1, round(g.cores_percent / 100 * BAR))
        n = min(n, BAR - used)
        text.append("█" * n, style=colour_of[f"{g.namespace}/{g.pod}"])
        used += n
    text.append("·" * (BAR - used), style="dim")
    return text


@dataclass(frozen=True, slots=True)
class Shown:
    """The GPUs one frame lists (those holding a pod matching the query, at most max_gpus) and its pending
    pods, as both layouts show them."""

    gpus: list[tuple[str, GPUView, list[str]]]  # node name, GPU, names of the pods on it
    hidden: int  # GPUs matching but beyond max_gpus
    pending: list[PendingPod]


def select(snap: Snapshot, query: str, max_gpus: int) -> Shown:
    q = query.lower()
    gpus: list[tuple[str, GPUView, list[str]]] = []
    hidden = 0
    for node in snap.nodes:
        for gpu in node.gpus:
            names = [f"{g.namespace}/{g.pod}" if g.namespace else g.pod for g in gpu.grants]
            if q and not any(q in n.lower() for n in names):
                continue
            if max_gpus and len(gpus) >= max_gpus:
                hidden += 1
                continue
            gpus.append((node.name, gpu, names))
    pending = [p for p in snap.pending if not q or q in f"{p.namespace}/{p.pod}".lower()]
    return Shown(gpus, hidden, pending)


def _summary(snap: Snapshot) -> list[tuple[str, str]]:
    t = snap.totals
    return [
        ("gpupool  ", "bold"),
        (f"nodes {t.nodes}  GPUs {t.gpus} ({t.healthy_gpus} healthy)  ", ""),
        ("compute ", "dim"), (f"{100 * t.allocated_share:.1f} %  ", ""),
        ("memory ", "dim"), (f"{100 * t.allocated_memory_share:.1f} %  ", ""),
        ("fragmented ", "dim"), (f"{100 * t.fragmented_share:.1f} %  ", ""),
        (f"GPU pods {t.gpu_pods}  ", ""),
        (f"pending {t.pending}", "bold yellow" if t.pending else ""),
    ]


def _vendor_line(v: VendorTotals) -> str:
    """One vendor's share of the pool: its cards, memory, and the compute and memory handed out on them."""
    return (f"{_vendor_of(v.vendor, v.runtime)}  GPUs {v.gpus} ({v.healthy_gpus} healthy)  "
            f"{v.memory_mib / 1024:.0f} GiB  compute {100 * v.allocated_share:.1f} %  "
            f"memory {100 * v.allocated_memory_share:.1f} %")


def _vendor_of(vendor: str, runtime: str) -> str:
    """"amd/rocm": a card's vendor and the runtime its pods run (the vendor alone when it is not known). Raw
    text, like the other helpers here: the caller escapes it once (`shown` or `_text`)."""
    return f"{vendor}/{runtime}" if runtime else vendor


def _partition_texts(gpu: GPUView) -> list[tuple[str, bool]]:
    """(text, used) per line: each partition in use with who holds it, then the idle ones of a profile on one
    line (an AMD card in CPX is eight partitions of one profile), each with its size from the geometry."""
    unit = UNIT_OF_VENDOR.get(gpu.vendor, "units")

    def size(p: PartitionView) -> str:
        return "".join([f"  {p.compute_units} {unit}" if p.compute_units else "",
                        f"  {p.memory_mib}Mi" if p.memory_mib else ""])

    out = [(f"partition {p.profile} @{p.start}{size(p)}  {p.pod or 'in use'}", True)
           for p in gpu.partitions if p.used]
    idle: dict[str, list[PartitionView]] = {}
    for p in gpu.partitions:
        if not p.used:
            idle.setdefault(p.profile, []).append(p)
    for profile, parts in idle.items():
        starts = ",".join(f"@{p.start}" for p in parts)
        out.append((f"partition {profile} {starts}{size(parts[0])}  idle", False))
    return out


def render_lines(snap: Snapshot, query: str = "", max_gpus: int = 0, width: int = 80) -> str:
    """One frame as plain lines wrapped to `width`, for a pipe or a narrow terminal, where the seven-column
    table cuts names and bars short: one line per GPU, then one indented line per pod on it."""
    import textwrap

    width = max(width, 40)

    def wrap(text: str, indent: str = "") -> list[str]:
        return textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent + "    ",
                             break_on_hyphens=False)

    shown_ = select(snap, query, max_gpus)
    out = wrap("".join(text for text, _ in _summary(snap)))
    for share in snap.totals.vendors:
        out += wrap(shown(_vendor_line(share)), "  ")
    for node, gpu, names in shown_.gpus:
        health = "" if gpu.healthy else " unhealthy"
        vendor = shown(_vendor_of(gpu.vendor, gpu.runtime))
        out += wrap(f"{shown(node)}  GPU {gpu.index}  {shown(gpu.model)}{health}  {vendor}"
                    f"  used {gpu.allocated_cores_percent:g}%  memory {gpu.allocated_memory_mib}/{gpu.memory_mib} Mi")
        for g, name in zip(gpu.grants, names, strict=True):
            out += wrap(f"{shown(name)}  {g.cores_percent:g}%  {g.memory_mib}Mi", "    ")
        for line, _ in _partition_texts(gpu):
            out += wrap(shown(line), "    ")
    if shown_.hidden:
        out.append(f"... {shown_.hidden} more GPU(s) not shown (use --query or --max-gpus)")
    if query and not shown_.gpus:
        out.append(f"no GPU holds a pod matching {shown(query)!r}")
    if snap.queues:
        out.append("team queues (GPUs):")
        for v in snap.queues:
            limit = "-" if v.maximum_gpus is None else f"{v.maximum_gpus:g}"
            out += wrap(f"{shown(v.name)}  used {v.used_gpus:g}  guaranteed {v.guaranteed_gpus:g}  maximum {limit}  "
                        f"borrowed {v.borrowed_gpus:g}  lent {v.lent_gpus:g}  pending {v.pending}", "    ")
    if shown_.pending:
        out.append("pending GPU pods:")
        for p in shown_.pending:
            out += wrap(f"{shown(f'{p.namespace}/{p.pod}' if p.namespace else p.pod)}: {shown(p.reason)}", "    ")
    return "\n".join(out)


# Below this many columns (or into a pipe, which rich reads as 80) a frame is lines, not tables.
TABLE_MIN_WIDTH = 120


def render(snap: Snapshot, query: str = "", max_gpus: int = 0) -> RenderableType:
    """One frame: summary, GPU table (only GPUs holding a matching pod when `query` is given), pending."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    summary = Text.assemble(*_summary(snap))
    for share in snap.totals.vendors:
        summary.append("\n  ")
        summary.append_text(_text(_vendor_line(share), "dim"))
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, expand=False)
    for col in ("node", "gpu", "model", "vendor", "compute", "used", "memory", "pods"):
        table.add_column(col, no_wrap=col != "pods", justify="right" if col in ("gpu", "used") else "left")
    colour_of: dict[str, str] = {}
    shown_ = select(snap, query, max_gpus)
    for node_name, gpu, names in shown_.gpus:
        pods = Text()
        for g, name in zip(gpu.grants, names, strict=True):
            key = f"{g.namespace}/{g.pod}"
            colour_of.setdefault(key, COLOURS[len(colour_of) % len(COLOURS)])
            pods.append_text(_text(name, colour_of[key]))
            pods.append(f" {g.cores_percent:g}% {g.memory_mib}Mi  ", style="dim")
        for line, used in _partition_texts(gpu):
            pods.append("\n")
            pods.append_text(_text(line, "" if used else "dim"))
        model = _text(gpu.model)
        if not gpu.healthy:
            model.append(" unhealthy", style="bold red")
        table.add_row(
            _text(node_name), str(gpu.index), model, _text(_vendor_of(gpu.vendor, gpu.runtime)), _bar(gpu, colour_of),
            f"{gpu.allocated_cores_percent:g}%", f"{gpu.allocated_memory_mib}/{gpu.memory_mib} Mi", pods,
        )
    parts: list[RenderableType] = [summary, table]
    if shown_.hidden:
        parts.append(Text(f"... {shown_.hidden} more GPU(s) not shown (use --query or --max-gpus)", style="dim"))
    if query and not shown_.gpus:
        parts.append(Text(f"no GPU holds a pod matching {shown(query)!r}", style="dim"))
    if snap.queues:
        queues = Table(title="team queues (GPUs)", title_justify="left", box=box.SIMPLE_HEAD, show_edge=False,
                       pad_edge=False)
        for column in ("queue", "used", "guaranteed", "maximum", "borrowed", "lent", "pending"):
            queues.add_column(column, no_wrap=True, justify="left" if column == "queue" else "right")
        for v in snap.queues:
            limit = "-" if v.maximum_gpus is None else f"{v.maximum_gpus:g}"
            queues.add_row(_text(v.name), f"{v.used_gpus:g}", f"{v.guaranteed_gpus:g}", limit, f"{v.borrowed_gpus:g}",
                           f"{v.lent_gpus:g}", str(v.pending))
        parts.append(queues)
    pending = shown_.pending
    if pending:
        waiting = Table(title="pending GPU pods", title_justify="left", box=box.SIMPLE_HEAD, show_edge=False,
                        pad_edge=False)
        waiting.add_column("pod", no_wrap=True)
        waiting.add_column("why it waits")
        for p in pending:
            waiting.add_row(_text(f"{p.namespace}/{p.pod}" if p.namespace else p.pod), _text(p.reason, style=""))
        parts.append(waiting)
    return Group(*parts)


@click.command("top")
@click.option("--url", envvar="GPUPOOL_URL", default=DEFAULT_URL, show_default=True,
              help="Pool snapshot URL (the scheduler's GET /pool). Env: GPUPOOL_URL.")
@click.option("--once", is_flag=True, help="Print one frame and exit.")
@click.option("--interval", type=click.FloatRange(min=0.2), default=2.0, show_default=True,
              help="Seconds between refreshes.")
@click.option("--query", "-q", default="", help="Only GPUs holding pods (and pending pods) matching this text.")
@click.option("--max-gpus", type=click.IntRange(min=0), default=0, show_default=True,
              help="Show at most this many GPU rows (0 = all).")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=5.0, show_default=True,
              help="HTTP timeout in seconds.")
def top(url: str, once: bool, interval: float, query: str, max_gpus: int, timeout: float) -> None:
    """Show the GPU pool in the terminal: each GPU's shares with pod names, totals, pending pods.
    Refreshes until Ctrl-C; exits 2 when the snapshot cannot be fetched or is not a pool snapshot."""
    from rich.console import Console, Group
    from rich.live import Live
    from rich.text import Text

    console = Console()
    try:
        snap = fetch(url, timeout)
    except FetchError as e:
        click.echo(f"gpupool top: {e}", err=True)
        raise SystemExit(2) from None
    def frame_of(snap: Snapshot) -> RenderableType:
        if console.width >= TABLE_MIN_WIDTH:
            return render(snap, query, max_gpus)
        return Text(render_lines(snap, query, max_gpus, console.width))

    if once:
        console.print(frame_of(snap))
        return
    frame = frame_of(snap)
    try:
        with Live(frame, console=console, auto_refresh=False, screen=False) as live:
            while True:
                time.sleep(interval)
                try:
                    snap = fetch(url, timeout)
                    frame = frame_of(snap)
                except FetchError as e:
                    # Keep the last frame and retry: the scheduler may be restarting.
                    frame = Group(frame_of(snap), Text(f"refresh failed: {e}", style="bold red"))
                live.update(frame, refresh=True)
    except KeyboardInterrupt:
        pass
