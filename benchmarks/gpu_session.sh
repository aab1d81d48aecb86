#!/usr/bin/env bash
# The one prepared script a session runs when it is lent an NVIDIA GPU (issue 38): everything goes under
# $OUT, and it ends by itself within GPU_SESSION_LIMIT_S seconds (480 by default: the 8 minutes the issue
# gives the recording, out of a 15-minute lease that also pays for the machine's start).
#
#   OUT=/some/dir bash benchmarks/gpu_session.sh
#
# It only reads the GPU's settings (nvidia-smi queries); it never changes MIG mode, clocks, persistence or
# compute mode. No network and no pip: it needs python3, cc and the NVIDIA driver; PyTorch only for the
# matmul workload (skipped without it). Steps:
#   1. facts: nvidia-smi's view of the GPU and driver, python and torch versions, the commit;
#   2. the `isolation` validation probe (gpupool.agent.checks.isolation) through the library as the package
#      builds it, then its two negative controls: a library that interposes nothing (must fail on memory)
#      and one that caps memory but does not pace kernels (must fail on compute);
#   3. benchmarks/isolation_gpu.py --quick, told how much time is left so it ends with its summary.
# What to commit afterwards: $OUT/isolation_gpu (small: gzip'd spans and NVML traces, summary.json) and
# the figures in docs/agent.md.
set -u -o pipefail
: "${OUT:?set OUT to the folder the results go to}"
LIMIT_S="${GPU_SESSION_LIMIT_S:-480}"
PY="${PYTHON:-python3}"
cd "$(dirname "$0")/.." || exit 2
mkdir -p "$OUT"
exec > >(tee -a "$OUT/session.log") 2>&1
START=$(date +%s)
left() { echo $((LIMIT_S - ($(date +%s) - START))); }
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

echo "== 1. facts ($(date -u +%FT%TZ))"
git rev-parse HEAD > "$OUT/commit.txt" 2>/dev/null || true
timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,mig.mode.current,persistence_mode,compute_mode,clocks.sm,clocks.max.sm --format=csv 2>&1 | tee "$OUT/gpu.csv"
timeout 20 nvidia-smi -q > "$OUT/nvidia-smi-q.txt" 2>&1 || true
"$PY" -c 'import sys; print("python", sys.version.split()[0])'
timeout 60 "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())' 2>&1 | tail -1
command -v cc >/dev/null || echo "no cc on this machine: the library cannot be built"

echo "== 2. isolation validation probe (left: $(left) s)"
timeout -k 5 120 "$PY" - "$WORK" <<'EOF' | tee "$OUT/isolation_probe.json"
import json, subprocess, sys, time
from pathlib import Path

sys.path.insert(0, "native")
import build as native  # native/build.py
from gpupool.agent.checks import isolation

work = Path(sys.argv[1])
real = native.compile_library(work / "libgpupool_hook.so")  # the production build, as the package makes it
nothing = work / "nothing.c"
nothing.write_text("int gpupool_nothing;\n")
controls = {}
for name, src in (("interposes nothing", nothing), ("memory only, no pacing", Path("tests/agent/checks/memory_only_hook.c"))):
    out = work / f"lib{len(controls)}.so"
    subprocess.run(["cc", "-std=c11", "-fPIC", "-shared", "-o", str(out), str(src), "-ldl"], check=True)
    controls[name] = out
results = {}
for name, lib in {"library": real, **controls}.items():
    t = time.monotonic()
    r = isolation.check(lib, {}, None)
    results[name] = {"ok": r.ok, "reason": r.reason, "seconds": round(time.monotonic() - t, 2)}
    print(f"# {name}: {'passed' if r.ok else 'failed: ' + r.reason} ({results[name]['seconds']} s)", file=sys.stderr)
results["as_expected"] = results["library"]["ok"] and not any(results[n]["ok"] for n in controls)
print(json.dumps(results))
EOF

echo "== 3. benchmarks/isolation_gpu.py --quick (left: $(left) s)"
BUDGET=$(($(left) - 20))
if [ "$BUDGET" -lt 60 ]; then
    echo "not enough time left for the benchmark"
    exit 1
fi
timeout -k 10 $((BUDGET + 10)) "$PY" benchmarks/isolation_gpu.py --quick --budget "$BUDGET" --out "$OUT/isolation_gpu"
rc=$?
echo "== done in $(($(date +%s) - START)) s (benchmark exit $rc)"
exit $rc
