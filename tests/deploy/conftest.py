"""Fixtures for the chart tests: the helm binary and a renderer returning the chart's objects."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.deploy.helm_tool import helm_binary

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "gpupool"
NAMESPACE = "gpupool-system"
RELEASE = "gp"

Render = Callable[..., list[dict[str, Any]]]


@pytest.fixture(scope="session")
def helm(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Kept in pytest's cache between runs (extracting takes a few seconds); a temp dir without the cache.
    cache = getattr(request.config, "cache", None)
    return helm_binary(Path(cache.mkdir("gpupool-helm")) if cache is not None else tmp_path_factory.mktemp("helm"))


def assert_valid_kubernetes(objs: Iterable[dict[str, Any]], version: str) -> None:
    """Every object valid against Kubernetes `version`'s schema (strict: no unknown fields), else the test fails
    naming the first invalid one."""
    for obj in objs:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} invalid for {version}: {str(e).splitlines()[0]}")


def run_helm(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture(scope="session")
def render(helm: Path, tmp_path_factory: pytest.TempPathFactory) -> Render:
    cache: dict[tuple[Any, ...], list[dict[str, Any]]] = {}

    def _render(values: dict[str, Any] | None = None, *extra: str) -> list[dict[str, Any]]:
        key = (yaml.safe_dump(values or {}), extra)
        if key not in cache:
            args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, *extra]
            if values:
                path = tmp_path_factory.mktemp("values") / "values.yaml"
                path.write_text(yaml.safe_dump(values))
                args += ["--values", str(path)]
            out = run_helm(helm, *args)
            assert out.returncode == 0, out.stderr
            cache[key] = [d for d in yaml.safe_load_all(out.stdout) if d]
        return cache[key]

    return _render
