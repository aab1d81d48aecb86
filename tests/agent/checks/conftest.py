"""The simulated GPU (tests/native/fakes) and the interception library as the package builds it, for the
checks that run CUDA in a child process."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.agent.checks import isolation
from tests.native.native_helpers import Built, build_all, have_cc, native_build


@pytest.fixture(scope="session")
def fakes(tmp_path_factory: pytest.TempPathFactory) -> Built:
    assert have_cc(), "no C compiler: these tests build the library and the simulated GPU (set CC)"
    return build_all(tmp_path_factory.mktemp("fakes"))


@pytest.fixture(scope="session")
def library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The interception library as `pip install` builds it (GP_LIMITS_PATH at the container's mount, which
    does not exist here: its caps come from the environment)."""
    out: Path = native_build().compile_library(tmp_path_factory.mktemp("hook") / "libgpupool_hook.so")
    return out


@pytest.fixture
def gpu(fakes: Built, tmp_path: Path) -> dict[str, str]:
    """The environment of a child process on a fresh simulated GPU."""
    return {"LD_LIBRARY_PATH": str(fakes.dir), "FAKE_GPU_STATE": str(tmp_path / "gpu"), isolation.FAKE_ENV: "1"}
