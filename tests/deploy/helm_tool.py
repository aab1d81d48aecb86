"""The helm binary for the chart tests and the testbed: helm 4 built from its own Go module
(`helm.sh/helm/v4`, pinned in scripts/k8s/modules/helm) by scripts/k8s/build.sh into the testbed's cache,
$GPUPOOL_K8S_CACHE/bin/helm (default ~/.cache/gpupool-k8s/bin/helm). Never downloaded at run time as a
binary: when it is missing or older than its pin, `scripts/k8s/build.sh helm` builds it (~4 min cold on 2
cores, from the Go module proxy's sources; a stamp makes later runs free). GPUPOOL_K8S_BUILD=0 turns a
missing helm into a failure instead.
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "scripts" / "k8s" / "build.sh"
PIN_FILE = ROOT / "scripts" / "k8s" / "modules" / "helm" / "go.mod"


class HelmUnavailable(RuntimeError):
    pass


def helm_path() -> Path:
    """Where build.sh puts helm (whether or not it is there yet)."""
    cache = os.environ.get("GPUPOOL_K8S_CACHE") or str(Path.home() / ".cache" / "gpupool-k8s")
    return Path(cache) / "bin" / "helm"


def pinned_version() -> str:
    """The helm version scripts/k8s/modules/helm/go.mod requires (e.g. v4.3.2)."""
    for line in PIN_FILE.read_text().splitlines():
        words = line.split()
        if words[:1] == ["require"] and len(words) == 3 and words[1] == "helm.sh/helm/v4":
            return words[2]
    raise HelmUnavailable(f"{PIN_FILE}: no `require helm.sh/helm/v4 <version>` line")


@functools.cache
def helm_binary(cache_dir: Path | None = None) -> Path:
    """The built helm, built first when missing or older than the pin: build.sh decides, and is a no-op
    (a few milliseconds) when its stamp matches the pins; run once per process. `cache_dir` is not used:
    it is where helm used to be extracted to, and callers that still pass it get the built helm."""
    path = helm_path()
    if os.environ.get("GPUPOOL_K8S_BUILD", "1") == "0":
        if not os.access(path, os.X_OK):
            raise HelmUnavailable(f"{path} missing: run scripts/k8s/build.sh helm (GPUPOOL_K8S_BUILD=0 here)")
        return path
    done = subprocess.run(["bash", str(BUILD_SCRIPT), "helm"], capture_output=True, text=True, check=False)
    if done.returncode != 0 or not os.access(path, os.X_OK):
        tail = "\n".join(done.stderr.splitlines()[-20:])
        raise HelmUnavailable(f"building helm ({BUILD_SCRIPT} helm) failed (exit {done.returncode}):\n{tail}")
    return path
