"""The bundled trace reaches users who install the wheel, not only those with the source tree."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from gpupool.sim.trace import BUNDLED, NODES_FILE, trace_dir

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_carries_the_trace_where_the_simulator_looks(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path),
         str(ROOT)],
        check=True, capture_output=True, cwd=tmp_path,
    )
    (wheel,) = tmp_path.glob("gpupool-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    # "<dist>.data/data/" is installed relative to the environment's prefix (the wheel format's scheme).
    installed = {n.split(".data/data/", 1)[1] for n in names if ".data/data/" in n}
    # Where the simulator looks when it runs from site-packages: <prefix>/share/gpupool/traces/<name>.
    expected_dir = trace_dir(tmp_path / "no-source-tree", Path("/prefix")).relative_to("/prefix")
    for name in [NODES_FILE, *BUNDLED.values(), "NOTICE.md", "README.md"]:
        assert f"{expected_dir}/{name}" in installed


def test_a_source_tree_wins_over_an_installed_copy(tmp_path: Path) -> None:
    (tmp_path / "data" / "traces" / "alibaba-gpu-v2023").mkdir(parents=True)
    assert trace_dir(tmp_path, Path("/prefix")) == tmp_path / "data" / "traces" / "alibaba-gpu-v2023"
    assert trace_dir(tmp_path / "elsewhere", Path("/prefix")) == Path(
        "/prefix/share/gpupool/traces/alibaba-gpu-v2023")
