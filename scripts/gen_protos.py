#!/usr/bin/env python3
"""Generate the Python gRPC stubs for the kubelet APIs the agent speaks (device plugin v1beta1, plugin
registration, DRA v1 and v1beta1), or check that the committed ones are current.

    python scripts/gen_protos.py            # write src/gpupool/agent/proto/<module>_pb2*.py(i)
    python scripts/gen_protos.py --check    # regenerate into a temporary directory and compare

Each .proto is copied into a temporary tree at gpupool/agent/proto/ before protoc runs, because the
generated *_pb2_grpc.py imports its messages by the path relative to the include root: this way the
import is `from gpupool.agent.proto import ...` and lands inside our package.

Generated code pins its runtime (grpcio >= the grpcio-tools that generated it, protobuf runtime of the
same major version), so pyproject pins grpcio/protobuf to at least the versions named in the stubs.
--check ignores the lines that only record those versions, so a newer grpcio-tools in CI does not turn a
current stub into a false failure; any change of the .proto itself still shows.
"""

from __future__ import annotations

import argparse
import difflib
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIR = Path("gpupool") / "agent" / "proto"
# module name in gpupool.agent.proto -> its .proto
PROTOS = {
    "deviceplugin_v1beta1": ROOT / "proto" / "deviceplugin" / "v1beta1" / "api.proto",
    "pluginregistration_v1": ROOT / "proto" / "pluginregistration" / "v1" / "api.proto",
    "dra_v1": ROOT / "proto" / "dra" / "v1" / "api.proto",
    "dra_v1beta1": ROOT / "proto" / "dra" / "v1beta1" / "api.proto",
}

# Lines that only record the generator's or runtime's version.
_VERSION_LINE = re.compile(
    r"(Protobuf Python Version|GRPC_GENERATED_VERSION\s*=|ValidateProtobufRuntimeVersion|"
    r"_runtime_version\.Domain|^\s*\d+,\s*$|^\s*'',\s*$)"
)


def generate(out_root: Path) -> list[Path]:
    """Run protoc; return the generated files (under out_root/gpupool/agent/proto)."""
    from grpc_tools import protoc  # imported here: only this script needs grpcio-tools

    out: list[Path] = []
    for module, source in PROTOS.items():
        with tempfile.TemporaryDirectory() as tmp:
            include = Path(tmp)
            (include / PACKAGE_DIR).mkdir(parents=True)
            shutil.copyfile(source, include / PACKAGE_DIR / f"{module}.proto")
            (out_root / PACKAGE_DIR).mkdir(parents=True, exist_ok=True)
            args = [
                "grpc_tools.protoc",
                f"-I{include}",
                f"--python_out={out_root}",
                f"--pyi_out={out_root}",
                f"--grpc_python_out={out_root}",
                str(include / PACKAGE_DIR / f"{module}.proto"),
            ]
            rc = protoc.main(args)
            if rc != 0:
                raise SystemExit(f"protoc failed on {source.name} of {module} with exit code {rc}")
        out += [out_root / PACKAGE_DIR / f"{module}{suffix}" for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")]
    return out


def _show(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _normalise(text: str) -> list[str]:
    return [line for line in text.splitlines() if not _VERSION_LINE.search(line)]


def check(committed_root: Path) -> int:
    """0 when the committed stubs equal a fresh generation (version-only lines aside), else 1."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        stale = 0
        for path in fresh:
            committed = committed_root / PACKAGE_DIR / path.name
            if not committed.exists():
                print(f"missing: {_show(committed)}; run python scripts/gen_protos.py")
                stale += 1
                continue
            old, new = _normalise(committed.read_text()), _normalise(path.read_text())
            if old != new:
                stale += 1
                print(f"stale: {_show(committed)} differs from its .proto (PROTOS):")
                sys.stdout.writelines(line + "\n" for line in difflib.unified_diff(old, new, lineterm="", n=1))
        return 1 if stale else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    parser.add_argument("--out-root", type=Path, default=ROOT / "src", help="where gpupool/ lives")
    args = parser.parse_args()
    if args.check:
        status = check(args.out_root)
        print("stubs are current" if status == 0 else "stubs are stale")
        return status
    for path in generate(args.out_root):
        print(f"wrote {path}")
    init = args.out_root / PACKAGE_DIR / "__init__.py"
    if not init.exists():
        init.write_text('"""Generated gRPC stubs (scripts/gen_protos.py); do not edit."""\n')
    return 0


if __name__ == "__main__":
    sys.exit(main())
