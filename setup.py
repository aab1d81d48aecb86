"""Build step for the C interception library; everything else is in pyproject.toml.

`pip install .`, `pip wheel` and `pip install -e .` all run build_py: the library (and remote mode's client
library and GPU server, and the HIP memory cap) are compiled with the system C compiler into gpupool/hook/ of
the build tree (wheels) or of the source tree (editable installs).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def _native_build():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gpupool_native_build", ROOT / "native" / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildWithHook(build_py):
    def run(self) -> None:
        super().run()
        native = _native_build()
        if getattr(self, "editable_mode", False):
            target = ROOT / "src" / "gpupool" / "hook" / native.LIBRARY_NAME
        else:
            target = Path(self.build_lib) / "gpupool" / "hook" / native.LIBRARY_NAME
        native.compile_library(target)
        native.compile_remote(target.parent)  # remote mode: the client library and the GPU server
        native.compile_hip_library(target.parent / native.HIP_LIBRARY_NAME)  # the HIP memory cap


setup(cmdclass={"build_py": BuildWithHook})
