"""The node agent's rooms (docs/architecture.md, "The node agent"): each subpackage of gpupool.agent imports
only the rooms below it, so the agent reads bottom-up and no room reaches back into one that uses it.

    base (config, port, identify)  <  state  <  devices  <  isolation, checks  <  remote, enforce  <  dra
    <  kubelet  <  service (the composition root: builds and runs the rest)

proto (the generated kubelet stubs) is imported by kubelet alone. Function-local and type-checking imports
count like any other (the checker walks the whole source).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
AGENT = SRC / "gpupool" / "agent"
BASE = {"config", "port", "identify"}  # the agent's own floor: its settings, its cluster port, pod identity
# Which rooms each room may import (besides itself). A new module goes into a room; a new room gets a line.
MAY_IMPORT: dict[str, set[str]] = {
    "base": set(),
    "proto": set(),
    "state": {"base"},
    "devices": {"base", "state"},
    "isolation": {"base", "state", "devices"},
    "checks": {"base", "state", "devices"},
    "remote": {"base", "state", "devices", "isolation"},
    "enforce": {"base", "state", "devices", "isolation"},
    "dra": {"base", "state", "devices", "isolation", "remote"},
    "kubelet": {"base", "state", "devices", "isolation", "dra", "proto"},
    "service": {"base", "state", "devices", "isolation", "checks", "remote", "enforce", "dra", "kubelet"},
    "__init__": set(),
}


def room(module: str) -> str:
    """gpupool.agent.dra.driver -> dra; gpupool.agent.config -> base; gpupool.agent.service -> service."""
    parts = module.split(".")
    if len(parts) < 3:
        return "__init__"
    first = parts[2]
    if first in BASE:
        return "base"
    if (AGENT / first).is_dir():
        return first
    return first  # a top-level module outside BASE: `service`, or one the table does not know yet


def _module(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def agent_imports(module: str, source: str, is_package: bool = False) -> list[tuple[int, str]]:
    """Every gpupool.agent module `source` imports, anywhere in it, relative imports resolved; `from X import
    name` counts X.name when that is a module (so `from gpupool.agent import hookdir` names its room)."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], *([node.module] if node.module else [])])
            names = [base]
            if base in ("gpupool.agent", *(f"gpupool.agent.{d.name}" for d in AGENT.iterdir() if d.is_dir())):
                names = [f"{base}.{a.name}" for a in node.names]
        out += [(node.lineno, n) for n in names if n == "gpupool.agent" or n.startswith("gpupool.agent.")]
    return out


def violations(module: str, source: str, is_package: bool = False) -> list[str]:
    mine = room(module)
    out = []
    for line, imported in agent_imports(module, source, is_package):
        target = room(imported)
        if target != mine and target not in MAY_IMPORT.get(mine, set()):
            out.append(f"{line}: {mine} imports {imported}")
    return out


MODULES = sorted(AGENT.rglob("*.py"))


def test_every_module_of_the_agent_is_in_a_room_of_the_table() -> None:
    rooms = {room(_module(p)) for p in MODULES}
    assert rooms <= set(MAY_IMPORT), f"put {sorted(rooms - set(MAY_IMPORT))} in a room (MAY_IMPORT)"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(AGENT)))
def test_a_room_imports_only_the_rooms_below_it(path: Path) -> None:
    assert violations(_module(path), path.read_text(), path.name == "__init__.py") == []


def test_the_rooms_are_ordered_without_a_circle() -> None:
    """The table itself is a ladder: no room may import one that may import it back, directly or not."""
    def below(r: str, seen: frozenset[str] = frozenset()) -> set[str]:
        assert r not in seen, f"circle through {r}"
        out = set(MAY_IMPORT[r])
        for s in MAY_IMPORT[r]:
            out |= below(s, seen | {r})
        return out
    for r in MAY_IMPORT:
        assert r not in below(r), r


def test_the_rule_catches_what_it_should() -> None:
    """Made-up modules: state reaching up into devices, a relative import from isolation into dra, devices
    importing a base module and its own room (allowed), a lazy import of kubelet from dra, the package
    imported by name, and a module outside every room."""
    assert violations("gpupool.agent.state.bad", "from gpupool.agent.devices.mig import MigManager\n") == [
        "1: state imports gpupool.agent.devices.mig"]
    assert violations("gpupool.agent.isolation.bad", "from ..dra import driver\n") == [
        "1: isolation imports gpupool.agent.dra.driver"]
    assert violations("gpupool.agent.devices.ok", "from gpupool.agent.config import AgentConfig\n"
                                                  "from . import table\n") == []
    assert violations("gpupool.agent.dra.bad", "def later():\n    from gpupool.agent.kubelet import dra_service\n") == [
        "2: dra imports gpupool.agent.kubelet.dra_service"]
    assert violations("gpupool.agent.state.bad", "from gpupool.agent import service\n") == [
        "1: state imports gpupool.agent.service"]
    assert room("gpupool.agent.somewhere_new") not in MAY_IMPORT
