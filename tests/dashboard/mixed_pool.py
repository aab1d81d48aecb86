"""A mixed pool for the views' tests: NVIDIA, AMD and Ascend cards, each vendor with a partitioned card, and a
pod whose name carries terminal markup and HTML (every view must show it as text).

Importable by the snapshot, `gpupool top`, exporter and dashboard tests (unlike conftest).

The pool (hand-computed figures the tests compare against):

| node  | GPU | model      | vendor | partitions (reported)            | held                                        |
|-------|-----|------------|--------|----------------------------------|---------------------------------------------|
| nv-0  | 0   | A100-40GB  | nvidia | -                                | team-a/train 300 milli, 10,240 MiB          |
| nv-0  | 1   | A100-40GB  | nvidia | 3g.20gb @0 used, 3g.20gb @4 idle | team-a/mig in 3g.20gb @0: 429, 19,968 MiB   |
| amd-0 | 0   | MI300X     | amd    | CPX/NPS4 @0..@7, @2 used         | team-b/rocm in CPX/NPS4 @2: 125, 24,576 MiB |
| amd-0 | 1   | MI300X     | amd    | -                                | team-b/whole 1000, 196,608 MiB              |
| npu-0 | 0   | Ascend910B | ascend | vir04 @1 idle (vir08 @0 claimed) | EVIL_POD in vir08 @0: 266, 17,476 MiB       |

The Ascend vNPU the pod holds is not in the agent's report yet (it reports a vNPU once carved): the snapshot
must still list it, as used, from the grant.
"""

from __future__ import annotations

from gpupool.core.model import GPU, Allocation, GPUGrant, GPURequest, MigSlot, Node, PodRequest
from gpupool.core.state import ClusterState

MI300X_MIB = 192 * 1024  # 196,608
A100_MIB = 40960
ASCEND_910B_MIB = 64 * 1024  # 65,536
EVIL_NS = "team-c"
EVIL_POD = "[bold red]npu[/bold red]<script>alert(1)</script>"  # rich markup and HTML in one name
EVIL_PROFILE = "vir04"  # the reported idle vNPU; tests that need a hostile profile name replace it

# GPU UUID -> (profile, start, used) as the node agents report them (inventory mig_instances)
REPORTED: dict[str, list[tuple[str, int, bool]]] = {
    "GPU-nv-1": [("3g.20gb", 0, True), ("3g.20gb", 4, False)],
    "AMD-0": [("CPX/NPS4", k, k == 2) for k in range(8)],
    "NPU-0": [(EVIL_PROFILE, 1, False)],
}


def mixed_state() -> ClusterState:
    state = ClusterState([
        Node("nv-0", 64000, 512000, (GPU("GPU-nv-0", 0, "A100-40GB", A100_MIB),
                                     GPU("GPU-nv-1", 1, "A100-40GB", A100_MIB))),
        Node("amd-0", 64000, 512000, (GPU("AMD-0", 0, "MI300X", MI300X_MIB, vendor="amd"),
                                      GPU("AMD-1", 1, "MI300X", MI300X_MIB, vendor="amd"))),
        Node("npu-0", 64000, 512000, (GPU("NPU-0", 0, "Ascend910B", ASCEND_910B_MIB, vendor="ascend"),)),
    ])
    for key, node, index, milli, mem, slot in [
        ("team-a/train", "nv-0", 0, 300, 10240, None),
        ("team-a/mig", "nv-0", 1, 429, 19968, MigSlot("3g.20gb", 0)),
        ("team-b/rocm", "amd-0", 0, 125, 24576, MigSlot("CPX/NPS4", 2)),
        ("team-b/whole", "amd-0", 1, 1000, MI300X_MIB, None),
        (f"{EVIL_NS}/{EVIL_POD}", "npu-0", 0, 266, 17476, MigSlot("vir08", 0)),
    ]:
        uuid = state.nodes[state.index[node]].gpus[index].uuid
        grant = GPUGrant(uuid, index, milli, mem, slot)
        assert state.allocate(PodRequest(key, gpu=GPURequest(1, milli, mem)), Allocation(key, node, (grant,))) is None
    return state
