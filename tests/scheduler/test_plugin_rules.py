"""The framework's rules for plugins, checked on the source and the registry:

- a plugin module never imports another plugin module, nor anything that imports back up: directly or
  through what it imports, it reaches only the framework's interface (interface, cycle, status, the
  preemption evaluator) and the scheduler's state (caches, ledger, what-ifs), never the service around the
  framework (extender verbs, service, watch, events, the runtime and registry that run plugins). What plugins
  share they reach through the Handle (caches, the preemption evaluator, record_event) and the cycle;
- each registered plugin meets every extension-point protocol whose methods it defines: all of the
  protocol's methods, with its parameters, async where the protocol is (a runtime isinstance check would
  silently leave a plugin that defines `reserve` but not `reserved` out of Reserve).
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from gpupool.scheduler.framework import interface
from gpupool.scheduler.framework.registry import CLAIM_PROFILE, PROFILE, REGISTRY

SRC = Path(__file__).resolve().parents[2] / "src"
SCHEDULER = SRC / "gpupool" / "scheduler"
PLUGINS = "gpupool.scheduler.framework.plugins"
# What a plugin may reach: the framework's interface, and the scheduler's state below it. A new module a
# plugin needs is placed here on purpose (a module of the service around the framework never is).
FRAMEWORK = {f"gpupool.scheduler.framework.{m}" for m in ("interface", "cycle", "status", "preemption", "choice")}
STATE = {f"gpupool.scheduler.{m}" for m in (
    "busy", "config", "ledger", "metrics", "mig_layouts", "node_rules", "pending", "pods", "queues", "squeeze",
    "what_if", "workload")}
PROTOCOLS = (interface.PreFilterPlugin, interface.FilterPlugin, interface.PostFilterPlugin,
             interface.ScorePlugin, interface.ReservePlugin, interface.UnreservePlugin, interface.PermitPlugin,
             interface.BindPlugin)


def module_path(module: str) -> Path | None:
    rel = Path(*module.split("."))
    for candidate in (SRC / rel.with_suffix(".py"), SRC / rel / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def scheduler_imports(module: str) -> set[str]:
    """The gpupool.scheduler modules `module` imports anywhere in its source (type-checking imports too)."""
    path = module_path(module)
    assert path is not None, module
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        out |= {n for n in names if n.startswith("gpupool.scheduler") and module_path(n) is not None}
    return out


def reached(module: str) -> set[str]:
    """Every gpupool.scheduler module `module` imports, directly or through others."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        for m in scheduler_imports(todo.pop()) - seen:
            seen.add(m)
            todo.append(m)
    return seen - {module}


PLUGIN_MODULES = sorted(f"{PLUGINS}.{p.stem}" for p in (SCHEDULER / "framework" / "plugins").glob("*.py")
                        if p.stem != "__init__")


@pytest.mark.parametrize("module", PLUGIN_MODULES)
def test_a_plugin_reaches_no_other_plugin_and_nothing_of_the_service(module: str) -> None:
    bad = sorted(m for m in reached(module) if m not in FRAMEWORK | STATE)
    assert bad == [], f"{module} reaches {bad}"


def test_the_rule_sees_an_import_through_another_module() -> None:
    """The check follows imports: the registry reaches every plugin, the preempt verb the runtime; and the
    state a plugin may reach reaches nothing else (no way back up through it)."""
    assert set(PLUGIN_MODULES) <= reached("gpupool.scheduler.framework.registry")
    assert "gpupool.scheduler.framework.runtime" in reached("gpupool.scheduler.preempt_verb")
    for module in FRAMEWORK | STATE:
        assert reached(module) <= FRAMEWORK | STATE, module


def _params(fn: object) -> list[str]:
    return list(inspect.signature(fn).parameters)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_each_registered_plugin_meets_the_protocols_of_its_extension_points(name: str) -> None:
    cls = REGISTRY[name].factory
    assert inspect.isclass(cls)
    assert cls.name == name and isinstance(cls.gpu_only, bool)
    joined = []
    for proto in PROTOCOLS:
        methods = [m for m in vars(proto) if not m.startswith("_") and callable(getattr(proto, m))]
        defined = [m for m in methods if callable(getattr(cls, m, None))]
        if not defined:
            continue
        assert defined == methods, f"{name} defines {defined} of {proto.__name__} but not all of {methods}"
        for m in methods:
            want, have = getattr(proto, m), getattr(cls, m)
            assert _params(have) == _params(want), f"{name}.{m}{inspect.signature(have)} != protocol"
            assert inspect.iscoroutinefunction(have) == inspect.iscoroutinefunction(want), f"{name}.{m} async-ness"
        joined.append(proto.__name__)
    assert joined, f"{name} takes part in no extension point"


def test_every_plugin_of_the_profile_is_registered() -> None:
    assert set(PROFILE) <= set(REGISTRY) and len(set(PROFILE)) == len(PROFILE)
    assert set(CLAIM_PROFILE) <= set(REGISTRY) and len(set(CLAIM_PROFILE)) == len(CLAIM_PROFILE)


def test_a_claim_meets_every_rule_a_pod_meets() -> None:
    """The claim profile runs every plugin of the pod profile but those that read the pod's own limits or
    serve kube-scheduler's binding through the extender (registry's module doc says why), in the same
    order, plus the claim's own rules; so a queue, fit or preference rule added for pods holds for claims."""
    pod_only = {"scheduler_name", "gpu_request", "nominate", "node_lock", "binding"}
    claim_only = {"claim_request", "claim_nodes", "claim_devices", "remote_tiers", "claim_reserve"}
    assert [p for p in PROFILE if p not in pod_only] == [p for p in CLAIM_PROFILE if p not in claim_only]
