"""Reading a `gpupool simulate` results directory (results.json, allocation.png) for the report page."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class SimulationError(ValueError):
    """results.json exists but cannot be used; the message says which file and what is wrong."""


class PolicyResult(BaseModel):
    # The simulator may add fields (e.g. failed pods); the report shows what it knows and keeps quiet on the rest.
    model_config = ConfigDict(extra="ignore")

    unallocated_pct_at_100: float
    std_pct_at_100: float = Field(ge=0)
    unallocated_pct_at_130: float
    curve: list[tuple[float, float]]
    seconds_per_seed: float = Field(ge=0)


class SimulationResults(BaseModel):
    model_config = ConfigDict(extra="ignore")

    trace: str
    seeds: list[int]
    policies: dict[str, PolicyResult] = Field(min_length=1)


@dataclass(frozen=True, slots=True)
class Line:
    """One policy's curve as an SVG polyline (x: arrived %, y: allocated %)."""

    name: str
    points: str
    colour: str


@dataclass(frozen=True, slots=True)
class Report:
    results: SimulationResults
    ranking: list[tuple[str, PolicyResult]]  # best (least unallocated at 100 %) first
    has_plot: bool
    lines: list[Line]
    x_max: float
    directory: str


# Colour-blind-safe palette (Okabe-Ito), repeated if there are more policies.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")
SVG_W, SVG_H = 600, 300


def load_results(directory: Path) -> Report:
    path = directory / "results.json"
    if not path.is_file():
        raise FileNotFoundError(f"no results.json in {directory} (run `gpupool simulate --out {directory}`)")
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SimulationError(f"{path} is not readable JSON: {e}") from e
    try:
        results = SimulationResults.model_validate(doc)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()[:5])
        raise SimulationError(f"{path} does not have the results.json shape: {problems}") from e
    ranking = sorted(results.policies.items(), key=lambda kv: kv[1].unallocated_pct_at_100)
    x_max = max((x for _, r in ranking for x, _ in r.curve), default=100.0) or 100.0
    lines = [
        Line(name, _points(r.curve, x_max), PALETTE[k % len(PALETTE)]) for k, (name, r) in enumerate(ranking)
    ]
    return Report(results, ranking, (directory / "allocation.png").is_file(), lines, x_max, str(directory))


def _points(curve: list[tuple[float, float]], x_max: float) -> str:
    """Scale (arrived %, allocated % in 0..100) into the SVG box, y growing upwards."""
    return " ".join(
        f"{x / x_max * SVG_W:.1f},{SVG_H - min(max(y, 0.0), 100.0) / 100 * SVG_H:.1f}" for x, y in curve
    )
