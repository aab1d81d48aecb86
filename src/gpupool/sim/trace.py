"""Loading the Alibaba GPU trace v2023 (node list and pod lists) into domain objects.

Any problem in a file is reported once, naming the file, line and column, as a TraceError.

Every value has a bound, so that no file can make a replay take unbounded memory or overflow the
simulator's 64-bit arrays: at most MAX_GPUS_PER_NODE GPUs per node (and per pod: a pod runs on one node),
MAX_NODES nodes, CPU and memory up to MAX_QUANTITY, times up to MAX_TIME_S, files up to MAX_FILE_BYTES.
The bounds are far above any real cluster (the bundled trace: 8 GPUs per node at most, 1,213 nodes, times
under 2 × 10^7 s).
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

from gpupool.core.model import GPU, MILLI_PER_GPU, GPURequest, Node, PodRequest


def trace_dir(source_root: Path, prefix: Path, name: str = "alibaba-gpu-v2023") -> Path:
    """data/traces/ of the source tree (an editable install), else the copy a wheel installs as data
    files under <prefix>/share/gpupool/traces/ (see pyproject.toml)."""
    source = source_root / "data" / "traces" / name
    return source if source.is_dir() else prefix / "share" / "gpupool" / "traces" / name


TRACE_DIR = trace_dir(Path(__file__).resolve().parents[3], Path(sys.prefix))
BUNDLED = {
    "default": "openb_pod_list_default.csv",
    "gpushare100": "openb_pod_list_gpushare100.csv",
    "multigpu50": "openb_pod_list_multigpu50.csv",
}
NODES_FILE = "openb_node_list_gpu_node.csv"

# Card memory by model, MiB. G2/G3 are undisclosed internal codes: we give them 32 GiB. The trace asks
# for compute only; memory is derived as the same fraction of the card, so the value does not change
# any placement (rounding is downwards and never blocks a share whose compute fits).
GPU_MEMORY_MIB = {"P100": 16384, "T4": 16384, "V100M16": 16384, "V100M32": 32768, "A10": 24576}
DEFAULT_GPU_MEMORY_MIB = 32768

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")


MAX_GPUS_PER_NODE = 32  # the replays log a pod's GPUs as a bit set in an int64 (GPU j = 1 << j)
MAX_NODES = 100_000
MAX_QUANTITY = 10**12  # millicores or MiB; a sum over MAX_NODES nodes stays within int64
MAX_TIME_S = 10**10  # about 317 years of trace clock
MAX_FILE_BYTES = 512 * 1024 * 1024


class TraceError(ValueError):
    """A trace file that cannot be used; the message names file, line and column."""


def resolve_trace(name_or_path: str) -> Path:
    if name_or_path in BUNDLED:
        return TRACE_DIR / BUNDLED[name_or_path]
    path = Path(name_or_path)
    if not path.exists():
        raise TraceError(f"trace {name_or_path!r}: no such file, and not a bundled trace ({', '.join(BUNDLED)})")
    return path


def _rows(path: Path, required: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise TraceError(f"{path}: {size:,} bytes, over the limit of {MAX_FILE_BYTES:,}")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TraceError(f"{path}: cannot read: {e}") from None
    reader = csv.DictReader(text.splitlines())
    try:  # the csv module refuses a field over its limit (128 KiB) and malformed quoting with csv.Error
        header = reader.fieldnames or []
        missing = [c for c in required if c not in header]
        if missing:
            raise TraceError(f"{path}:1: missing column(s) {', '.join(missing)} (header: {','.join(header)})")
        rows = [(reader.line_num, row) for row in reader]
    except csv.Error as e:
        raise TraceError(f"{path}:{reader.line_num + 1}: not a readable CSV row: {e}") from None
    if not rows:
        raise TraceError(f"{path}: the file has a header but no rows")
    return rows


def _int(path: Path, line: int, row: dict[str, str], column: str, minimum: int = 0,
         maximum: int = MAX_QUANTITY) -> int:
    raw = row.get(column)
    if raw is None:
        raise TraceError(f"{path}:{line}: column {column}: missing value (row has too few fields)")
    text = raw.strip()
    # int() of a long digit string is quadratic (and Python refuses over 4,300 digits): look first.
    digits = text.lstrip("+-").lstrip("0")
    if len(digits) > len(str(maximum)) and digits.isdigit():
        shown = text if len(text) <= 24 else f"{text[:20]}... ({len(digits)} digits)"
        raise TraceError(f"{path}:{line}: column {column}: {shown} is over the limit of {maximum:,}")
    try:
        value = int(text)
    except ValueError:
        raise TraceError(f"{path}:{line}: column {column}: {raw[:40]!r} is not a whole number") from None
    if value < minimum:
        raise TraceError(f"{path}:{line}: column {column}: {value} must be at least {minimum}")
    if value > maximum:
        raise TraceError(f"{path}:{line}: column {column}: {value:,} is over the limit of {maximum:,}")
    return value


def load_nodes(path: Path) -> list[Node]:
    nodes = []
    rows = _rows(path, NODE_COLUMNS)
    if len(rows) > MAX_NODES:
        raise TraceError(f"{path}: {len(rows):,} nodes, over the limit of {MAX_NODES:,}")
    for line, row in rows:
        name = (row.get("sn") or "").strip()
        if not name:
            raise TraceError(f"{path}:{line}: column sn: empty node name")
        count = _int(path, line, row, "gpu", maximum=MAX_GPUS_PER_NODE)
        model = (row.get("model") or "").strip()
        if count and not model:
            raise TraceError(f"{path}:{line}: column model: a node with GPUs needs a model")
        memory = GPU_MEMORY_MIB.get(model, DEFAULT_GPU_MEMORY_MIB)
        gpus = tuple(GPU(uuid=f"{name}-gpu{j}", index=j, model=model, memory_mib=memory) for j in range(count))
        nodes.append(
            Node(name=name, cpu_milli=_int(path, line, row, "cpu_milli"),
                 memory_mib=_int(path, line, row, "memory_mib"), gpus=gpus)
        )
    return nodes


def load_pods(path: Path) -> list[PodRequest]:
    pods = []
    for line, row in _rows(path, POD_COLUMNS):
        name = (row.get("name") or "").strip()
        if not name:
            raise TraceError(f"{path}:{line}: column name: empty pod name")
        count = _int(path, line, row, "num_gpu", maximum=MAX_GPUS_PER_NODE)
        milli = _int(path, line, row, "gpu_milli")
        if count and not 0 < milli <= MILLI_PER_GPU:
            raise TraceError(f"{path}:{line}: column gpu_milli: {milli} must be 1..1000 for a GPU pod")
        if count > 1 and milli < MILLI_PER_GPU:
            raise TraceError(f"{path}:{line}: column gpu_milli: a {count}-GPU pod must ask whole GPUs (1000)")
        spec = (row.get("gpu_spec") or "").strip()
        models = frozenset(m for m in spec.split("|") if m)
        gpu = GPURequest(count=count, milli=milli if count else MILLI_PER_GPU, models=models)
        pods.append(
            PodRequest(key=name, cpu_milli=_int(path, line, row, "cpu_milli"),
                       memory_mib=_int(path, line, row, "memory_mib"), gpu=gpu)
        )
    return pods


TIME_COLUMNS = ("creation_time", "scheduled_time", "deletion_time")


def load_times(path: Path) -> list[tuple[int, int | None, int]]:
    """(creation, scheduled or None, deletion) seconds per pod, in file order (as `load_pods`)."""
    out: list[tuple[int, int | None, int]] = []
    try:
        rows = _rows(path, POD_COLUMNS + TIME_COLUMNS)
    except TraceError as e:
        raise TraceError(f"{e}; a timeline replay needs the columns {', '.join(TIME_COLUMNS)}") from None
    for line, row in rows:
        created = _int(path, line, row, "creation_time", maximum=MAX_TIME_S)
        deleted = _int(path, line, row, "deletion_time", maximum=MAX_TIME_S)
        given = (row.get("scheduled_time") or "").strip()
        scheduled = _int(path, line, row, "scheduled_time", maximum=MAX_TIME_S) if given else None
        start = scheduled if scheduled is not None else created
        if deleted < start:
            raise TraceError(f"{path}:{line}: column deletion_time: {deleted} is before the pod started ({start})")
        out.append((created, scheduled, deleted))
    return out
