"""`gpupool top` over a mixed pool (tests/dashboard/mixed_pool.py): each card's vendor and runtime, its
partitions with their holders, a line per vendor, at 80 columns (piped) and as the wide table; names with
markup or control characters shown as text."""

from __future__ import annotations

import json

from gpupool.api.snapshot import build_snapshot
from tests.commands.test_top import pool_app, run_top, serve
from tests.dashboard.mixed_pool import EVIL_NS, EVIL_POD, REPORTED, mixed_state


def mixed_json(reported: dict[str, list[tuple[str, int, bool]]] = REPORTED) -> str:
    return build_snapshot(mixed_state(), {}, partitions=reported).model_dump_json()


def top_output(body: str, columns: int) -> str:
    with serve(pool_app(body)) as url:
        result = run_top("--once", "--url", f"{url}/pool", env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return str(result.output)


def test_piped_lines_show_vendor_runtime_and_partitions() -> None:
    out = top_output(mixed_json(), 80)
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80, out
    # One line per vendor, by name: 2 x 192 GiB = 384 GiB; Ascend 266 of 1,000 milli and 17,476 / 65,536 MiB
    vendor_lines = [line.split("  GPUs")[0].strip() for line in lines if "  GPUs " in line and "nodes" not in line]
    assert vendor_lines == ["amd/rocm", "ascend/cann", "nvidia/cuda"]
    assert "  amd/rocm  GPUs 2 (2 healthy)  384 GiB  compute 56.2 %  memory 56.2 %" in lines
    assert "  ascend/cann  GPUs 1 (1 healthy)  64 GiB  compute 26.6 %  memory 26.7 %" in lines
    amd = lines.index("amd-0  GPU 0  MI300X  amd/rocm  used 12.5%  memory 24576/196608 Mi")
    assert lines[amd + 1:amd + 4] == [
        "    team-b/rocm  12.5%  24576Mi",
        "    partition CPX/NPS4 @2  38 CU  24576Mi  team-b/rocm",
        "    partition CPX/NPS4 @0,@1,@3,@4,@5,@6,@7  38 CU  24576Mi  idle",  # one mode: one line for the idle
    ]
    mig = lines.index("nv-0  GPU 1  A100-40GB  nvidia/cuda  used 42.9%  memory 19968/40960 Mi")
    assert lines[mig + 2:mig + 4] == ["    partition 3g.20gb @0  42 SM  19968Mi  team-a/mig",
                                      "    partition 3g.20gb @4  42 SM  19968Mi  idle"]
    assert "npu-0  GPU 0  Ascend910B  ascend/cann  used 26.6%  memory 17476/65536 Mi" in lines
    assert "    partition vir04 @1  4 AI Core  8738Mi  idle" in lines


def test_the_wide_table_has_a_vendor_column_and_the_partitions() -> None:
    out = top_output(mixed_json(), 200)
    lines = out.splitlines()
    header = next(line for line in lines if line.split()[:4] == ["node", "gpu", "model", "vendor"])
    assert header.split()[4:] == ["compute", "used", "memory", "pods"]
    row = next(line for line in lines if line.startswith("amd-0") and "team-b/rocm" in line)
    assert row.split()[:4] == ["amd-0", "0", "MI300X", "amd/rocm"]
    assert any("partition CPX/NPS4 @2  38 CU  24576Mi  team-b/rocm" in line for line in lines)
    assert any(line.strip().startswith("ascend/cann  GPUs 1 (1 healthy)") for line in lines)


def test_names_with_markup_and_control_characters_are_shown_as_text() -> None:
    hostile = {**REPORTED, "NPU-0": [("vir04\x1b]8;;http://x\x07[/]", 1, False)]}
    for columns in (80, 200):
        out = top_output(mixed_json(hostile), columns)
        flat = "".join(line.strip() for line in out.splitlines())
        # rich would have eaten "[bold red]" as a style had it read the name as markup
        assert f"{EVIL_NS}/{EVIL_POD}" in flat, out
        assert "\x1b" not in out and "\x07" not in out
        assert "vir04\\x1b]8;;http://x\\x07[/]" in flat, out


def test_a_snapshot_from_before_vendors_shows_its_cards_as_nvidia() -> None:
    doc = json.loads(mixed_json())
    for node in doc["nodes"]:
        for gpu in node["gpus"]:
            del gpu["vendor"], gpu["runtime"], gpu["partitions"]
    del doc["totals"]["vendors"]
    lines = top_output(json.dumps(doc), 80).splitlines()
    assert "amd-0  GPU 0  MI300X  nvidia  used 12.5%  memory 24576/196608 Mi" in lines
    assert not any("partition" in line for line in lines)
