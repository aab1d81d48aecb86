"""The project's static gates run as tests, so that CI fails when they fail."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_the_package_passes_mypy_strict() -> None:
    """Every module of gpupool (pyproject.toml's [tool.mypy] names only third-party and generated code)."""
    result = run("mypy", "--strict", "src/gpupool")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_is_clean() -> None:
    result = run("ruff", "check", "src", "tests", "benchmarks")
    assert result.returncode == 0, result.stdout + result.stderr


def test_core_imports_nothing_outside_the_domain() -> None:
    """docs/architecture.md: core never imports I/O libraries or other gpupool layers."""
    forbidden = ("lightkube", "grpc", "pynvml", "starlette", "uvicorn", "httpx", "pydantic", "yaml", "os",
                 "gpupool.api", "gpupool.cluster", "gpupool.scheduler", "gpupool.agent", "gpupool.sim")
    offenders = []
    for path in (ROOT / "src/gpupool/core").rglob("*.py"):
        for line in path.read_text().splitlines():
            words = line.split()
            if len(words) >= 2 and words[0] in ("import", "from"):
                module = words[1]
                if any(module == f or module.startswith(f + ".") for f in forbidden):
                    offenders.append(f"{path.relative_to(ROOT)}: {line.strip()}")
    assert offenders == []


# --- layers (docs/architecture.md, "Layers") ------------------------------------------------------------

SRC = ROOT / "src" / "gpupool"
SERVICES = ("scheduler", "agent", "webhook", "exporter", "dashboard", "sim", "doctor")
# Which gpupool packages each package may import (besides itself). `demo` is what `gpupool demo` runs in
# place of a cluster (embedded cluster, extender client, stand-in kube-scheduler): no production package may
# import it, only the entry layer (commands/ runs `gpupool demo` on it). The real-Kubernetes harness is
# under tests/harness, outside the package.
MAY_IMPORT: dict[str, set[str]] = {
    "core": set(),
    "api": {"core"},
    "cluster": {"core", "api"},
    **{service: {"core", "api", "cluster"} for service in SERVICES},
    "demo": {"core", "api", "cluster", *SERVICES},
    "commands": {"core", "api", "cluster", *SERVICES, "demo", "hook"},
    "cli": {"commands"},
    "__main__": {"cli"},
    "__init__": set(),
    "hook": set(),  # where the built CUDA interception library lies (native/): imports nothing of gpupool
}
MAY_IMPORT["agent"] |= {"hook"}  # the agent installs the library on the host for isolation hook
# Third-party libraries that belong to one adapter (docs/architecture.md: one adapter per external system).
ONLY_IN = {
    "lightkube": ("gpupool.cluster",),
    "pynvml": ("gpupool.agent.devices.nvml",),
    "amdsmi": ("gpupool.agent.devices.amd",),
    "grpc": ("gpupool.agent",),
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(module: str, source: str, is_package: bool = False) -> list[tuple[int, str]]:
    """Every module imported anywhere in `source` (function-local imports included), relative ones resolved."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                out.append((node.lineno, ".".join([*base, *([node.module] if node.module else [])])))
            elif node.module:
                out.append((node.lineno, node.module))
    return out


def _layer(module: str) -> str:
    """gpupool.scheduler.app -> scheduler; gpupool.cli -> cli; gpupool -> __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _violations(module: str, source: str, is_package: bool = False) -> list[str]:
    mine = _layer(module)
    out = []
    for line, imported in _imports(module, source, is_package):
        if imported.startswith("gpupool."):
            target = _layer(imported)
            if target != mine and target not in MAY_IMPORT[mine]:
                out.append(f"{line}: {mine} imports {imported}")
        owners = ONLY_IN.get(imported.split(".")[0])
        if owners and not any(module == o or module.startswith(o + ".") for o in owners):
            out.append(f"{line}: {imported} belongs in {' or '.join(owners)}")
    return out


def test_every_package_is_in_the_layer_table() -> None:
    found = {_layer(_module_name(p)) for p in SRC.rglob("*.py")}
    assert found <= set(MAY_IMPORT), f"add {sorted(found - set(MAY_IMPORT))} to MAY_IMPORT"


def test_imports_only_point_down_the_layers_and_adapter_libraries_stay_in_their_adapter() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{v}"
        for path in sorted(SRC.rglob("*.py"))
        for v in _violations(_module_name(path), path.read_text(), path.name == "__init__.py")
    ]
    assert offenders == []


def test_the_layer_check_catches_what_it_should() -> None:
    """The checker on made-up modules: a relative import into another service, the harness imported by a
    service, lightkube outside the cluster adapter, and lazy (function-local) imports are all caught."""
    source = (
        "from ..scheduler import service\n"
        "def later():\n"
        "    import gpupool.demo.embedded\n"
        "    from lightkube import AsyncClient\n"
        "from . import config\n"
        "from gpupool.api import pod\n"
    )
    assert _violations("gpupool.webhook.bad", source) == [
        "1: webhook imports gpupool.scheduler",
        "3: webhook imports gpupool.demo.embedded",
        "4: lightkube belongs in gpupool.cluster",
    ]
    # The entry layer may run the demo on the harness; core may import nothing of gpupool.
    assert _violations("gpupool.commands.demo", "from gpupool.demo import embedded\n") == []
    assert _violations("gpupool.core.fit", "from ..api import pod\n") == ["1: core imports gpupool.api"]
