from pathlib import Path

import pytest

from gpupool.sim.trace import NODES_FILE, TRACE_DIR, TraceError, load_nodes, load_pods, resolve_trace


def test_bundled_trace_statistics() -> None:
    nodes = load_nodes(TRACE_DIR / NODES_FILE)
    assert len(nodes) == 1213 and sum(len(n.gpus) for n in nodes) == 6212
    pods = load_pods(resolve_trace("default"))
    assert len(pods) == 8152
    sharing = [p for p in pods if p.gpu.count == 1 and p.gpu.milli < 1000]
    assert len(sharing) == 3078  # 37.8 % of pods (trace-evaluation.md §2.3)
    assert len(load_pods(resolve_trace("multigpu50"))) == 9061  # the 5-column format


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("name,cpu_milli,memory_mib,num_gpu\np,1,1,0\n", r"bad\.csv:1: missing column\(s\) gpu_milli"),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,x,0,0\n", r"bad\.csv:2: column memory_mib: 'x' is not"),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,0,0\nq,-5,1,0,0\n",
         r"bad\.csv:3: column cpu_milli: -5 must be at least 0"),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,1500\n", r"bad\.csv:2: column gpu_milli: 1500"),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n", r"header but no rows"),
        ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1\n", r"bad\.csv:2: column num_gpu: missing value"),
    ],
)
def test_bad_pod_files_name_file_line_and_column(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(TraceError, match=message):
        load_pods(path)


def test_unknown_trace_name() -> None:
    with pytest.raises(TraceError, match="not a bundled trace"):
        resolve_trace("nosuch")
