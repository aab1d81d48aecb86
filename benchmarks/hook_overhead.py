"""Cost of gpupool's CUDA interception library per call, against the fake driver (no GPU needed).

Builds the library, the fake libcuda/NVML and the probe (tests/native/fakes), then times in one run, per
round, the same calls with and without the library preloaded: an empty kernel launch (cap 100 %: the
pacing path that every uncapped launch takes) and a 1 MiB cuMemAlloc_v2 + cuMemFree_v2 pair under a
10 GiB cap (pod-wide accounting: OFD-locked shared file). The fake driver itself takes a file lock per
call, so absolute numbers are those of this machine; the ratio is the figure. Median of the rounds.
The last line is one JSON object.

    python benchmarks/hook_overhead.py [--rounds 7] [--calls 20000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.native.native_helpers import Pod, build_all, have_cc  # noqa: E402


def per_call_ns(pod: Pod, what: str, calls: int) -> float:
    probe = pod.start()
    try:
        probe.ask(f"bench {what} {max(calls // 10, 1)}")  # warm-up: lazy initialisation, first lookups
        rc, picoseconds = probe.ask(f"bench {what} {calls}")
        if rc != 0:
            raise SystemExit(f"the probe failed with CUDA error {rc}")
        return picoseconds / 1000
    finally:
        probe.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    if args.rounds < 1 or args.calls < 10:
        parser.error("--rounds must be >= 1 and --calls >= 10")
    if not have_cc():
        raise SystemExit("needs a C compiler (cc)")
    cores = len(os.sched_getaffinity(0))
    print(f"cores available: {cores} (os.cpu_count {os.cpu_count()})")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        built = build_all(root / "build")
        (root / "hook").mkdir()
        hooked = Pod(built, root / "gpu", root / "hook", memory_mib="10240", cores="100")
        plain = Pod(built, root / "gpu", root / "hook", preload=False)
        results: dict[str, list[tuple[float, float]]] = {"launch": [], "alloc_free": []}
        for r in range(args.rounds):
            for what, key in (("launch", "launch"), ("alloc", "alloc_free")):
                base = per_call_ns(plain, what, args.calls)
                with_hook = per_call_ns(hooked, what, args.calls)
                results[key].append((base, with_hook))
                print(f"round {r + 1} {key:10s} without {base:8.0f} ns  with {with_hook:8.0f} ns  "
                      f"ratio {with_hook / base:.3f}")
    summary: dict[str, object] = {"benchmark": "hook_overhead", "cores": cores, "rounds": args.rounds,
                                  "calls": args.calls}
    for key, pairs in results.items():
        summary[f"{key}_ns_without"] = round(statistics.median(p[0] for p in pairs), 1)
        summary[f"{key}_ns_with"] = round(statistics.median(p[1] for p in pairs), 1)
        summary[f"{key}_ratio"] = round(statistics.median(p[1] / p[0] for p in pairs), 3)
        summary[f"{key}_added_ns"] = round(statistics.median(p[1] - p[0] for p in pairs), 1)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
