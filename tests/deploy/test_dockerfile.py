"""Static checks of the one-image Dockerfile (no Docker daemon in CI): it copies what exists, keeps the
build context small, runs `gpupool` as a non-root user, and puts the bundled traces where the
simulator looks for them in an installed (non-editable) package."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def instructions(name: str) -> list[str]:
    return [m.group(1).strip() for m in re.finditer(rf"^{name}\s+(.*)$", DOCKERFILE, re.M)]


def test_build_context_sources_exist_and_are_not_ignored() -> None:
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    sources = [c.split()[0] for c in instructions("COPY") if not c.startswith("--from")]
    assert sources == ["pyproject.toml", "src", "data"]
    for source in [*sources, "README.md"]:
        assert (ROOT / source).exists(), source
        assert source not in ignored, source
    assert {"tests", ".venv", ".git"} <= ignored


def test_entrypoint_and_user() -> None:
    assert instructions("ENTRYPOINT") == ['["gpupool"]']
    (user,) = instructions("USER")
    assert not user.startswith("0") and not user.startswith("root")


def test_traces_land_where_the_simulator_looks() -> None:
    # trace.py looks three directories above its package dir: <venv>/lib/pythonX.Y/site-packages/gpupool/sim
    # -> <venv>/lib/pythonX.Y/data/traces. The image's Python version must match the path it copies to.
    trace_py = (ROOT / "src/gpupool/sim/trace.py").read_text()
    assert 'parents[3] / "data" / "traces"' in trace_py
    image = re.search(r"ARG PYTHON_IMAGE=python:(\d+\.\d+)", DOCKERFILE)
    assert image is not None
    assert f"COPY --from=build /src/data /opt/gpupool/lib/python{image.group(1)}/data" in DOCKERFILE
