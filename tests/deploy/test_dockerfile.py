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
    assert sources == ["pyproject.toml", "src", "data", "native"]
    for source in [*sources, "README.md", "setup.py", "MANIFEST.in"]:
        assert (ROOT / source).exists(), source
        assert source not in ignored, source
    assert {"tests", ".venv", ".git"} <= ignored


def test_entrypoint_and_user() -> None:
    assert instructions("ENTRYPOINT") == ['["gpupool"]']
    (user,) = instructions("USER")
    assert not user.startswith("0") and not user.startswith("root")


def test_the_image_installs_the_wheel_into_the_venv_it_runs() -> None:
    # The wheel installs the bundled trace relative to the venv's prefix (tests/sim/test_trace_packaging.py),
    # so the image must run the very venv it installed the wheel into, and copy the source data to build it.
    assert "COPY data ./data" in DOCKERFILE
    assert "/opt/gpupool/bin/pip install /tmp/wheels/*.whl" in DOCKERFILE
    assert "COPY --from=build /opt/gpupool /opt/gpupool" in DOCKERFILE
    assert "ENV PATH=/opt/gpupool/bin:$PATH" in DOCKERFILE


def test_the_build_stage_can_compile_the_interception_library() -> None:
    # setup.py compiles native/ into the wheel with the system C compiler; the slim image has none.
    build_stage = DOCKERFILE.split("\nFROM ", 2)[1]
    assert "gcc" in build_stage and "libc6-dev" in build_stage
    assert "COPY native ./native" in build_stage
    assert "setup.py" in build_stage
