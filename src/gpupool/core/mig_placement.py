"""Where a MIG pod goes on a MIG-mode GPU: an existing free instance of its profile, or a new instance at
an allowed start slot that the free slices admit, chosen to keep the most future demand placeable.

The measure is FGD's fragmentation idea applied to slice geometry. For one profile p of the expected
demand, the GPU's *idle* slices (free slices plus those of idle instances) are a fragment for p unless a
new p instance could cover them (a valid placement beside the current layout) or they belong to an idle
instance of p itself. A GPU's fragmentation is the demand-weighted sum over profiles, in memory slices.
A pod goes where that sum grows least; ties prefer reusing an instance (no re-partitioning), then the
fuller GPU, then the lower index and start. This function is the core of the scheduler's MIG plugin.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from gpupool.core.mig import MODELS, MigModel, PlacedInstance, can_add, mig_model

Demand = Mapping[str, float]  # profile name -> share of the expected MIG pods (sums to 1)


@dataclass(frozen=True, slots=True, order=True)
class MigInstance:
    """An instance that exists on a GPU; `used` when a pod holds it."""

    profile: str
    start: int
    used: bool = False


@dataclass(frozen=True, slots=True)
class MigGPU:
    """A MIG-mode GPU as placement sees it: its model and current instances (its free slices follow)."""

    model: str
    instances: tuple[MigInstance, ...] = ()

    @property
    def layout(self) -> tuple[PlacedInstance, ...]:
        return tuple(PlacedInstance(i.profile, i.start) for i in self.instances)

    def with_instance(self, profile: str, start: int, used: bool = True) -> MigGPU:
        """The GPU after the pod takes (or a new instance is made at) `profile`@`start`."""
        rest = tuple(i for i in self.instances if (i.profile, i.start) != (profile, start))
        return MigGPU(self.model, tuple(sorted((*rest, MigInstance(profile, start, used)))))

    def with_claim(self, profile: str, start: int) -> MigGPU:
        """The GPU once a pod holds `profile`@`start`: an instance there is used, and idle instances in
        its way are gone (the node agent destroys them before it creates the new one). The scheduler
        lays its pods' grants over the agent's last report with this until the report catches up."""
        model = mig_model(self.model)
        p = model.profile(profile) if model is not None else None
        mask = p.slots(start) if p is not None else 0
        keep = []
        for i in self.instances:
            q = model.profile(i.profile) if model is not None else None
            in_way = q is not None and bool(q.slots(i.start) & mask) and (i.profile, i.start) != (profile, start)
            if not (in_way and not i.used):
                keep.append(i)
        return MigGPU(self.model, tuple(keep)).with_instance(profile, start, used=True)

    def without_instance(self, start: int) -> MigGPU:
        return MigGPU(self.model, tuple(i for i in self.instances if i.start != start))


@dataclass(frozen=True, slots=True)
class MigOption:
    """One way to serve the pod on one GPU."""

    profile: str
    start: int
    reuse: bool  # True: an existing idle instance; False: a new instance is created there


@dataclass(frozen=True, slots=True)
class MigChoice:
    gpu: int  # index into the list of GPUs given
    option: MigOption
    fragment_delta: float  # growth of that GPU's fragmentation (memory slices)


@dataclass(frozen=True, slots=True)
class MigRefusal:
    reason: str


def observed_demand(profiles: Iterable[str]) -> dict[str, float]:
    """The share of each profile among the MIG pods seen (the "observed workload")."""
    counts = Counter(profiles)
    total = sum(counts.values())
    return {p: n / total for p, n in sorted(counts.items())} if total else {}


def _model(name: str) -> MigModel:
    found = mig_model(name)
    if found is None:
        raise KeyError(name)  # callers check the model first; reaching this is a programming error
    return found


def options(gpu: MigGPU, profile: str) -> list[MigOption]:
    """Every way `profile` can be served on `gpu`: idle instances of it, then new allowed starts."""
    model = _model(gpu.model)
    p = model.profile(profile)
    if p is None:
        return []
    out = [MigOption(profile, i.start, True) for i in gpu.instances if i.profile == profile and not i.used]
    layout = gpu.layout
    out.extend(MigOption(profile, s, False) for s in p.starts if can_add(model, layout, p, s))
    return out


@lru_cache(maxsize=65536)
def _fragment(model_name: str, instances: tuple[MigInstance, ...], demand: tuple[tuple[str, float], ...]) -> float:
    model = MODELS[model_name]
    layout = tuple(PlacedInstance(i.profile, i.start) for i in instances)
    busy = 0
    idle_by_profile: dict[str, int] = {}
    for i in instances:
        p = model.profile(i.profile)
        if p is None:
            continue
        if i.used:
            busy |= p.slots(i.start)
        else:
            idle_by_profile[p.name] = idle_by_profile.get(p.name, 0) | p.slots(i.start)
    idle = model.full_mask & ~busy
    idle_count = idle.bit_count()
    total = 0.0
    for name, weight in demand:
        p = model.profile(name)
        if p is None or weight <= 0:
            continue
        usable = idle_by_profile.get(name, 0)
        for s in p.starts:
            if can_add(model, layout, p, s):
                usable |= p.slots(s)
        total += weight * (idle_count - usable.bit_count())
    return total


def fragmentation(gpu: MigGPU, demand: Demand) -> float:
    """Demand-weighted idle memory slices that the demand could not use on this GPU."""
    return _fragment(mig_model_name(gpu.model), tuple(sorted(gpu.instances)), tuple(sorted(demand.items())))


def mig_model_name(name: str) -> str:
    return _model(name).name


def _idle_slices(gpu: MigGPU) -> int:
    model = _model(gpu.model)
    busy = 0
    for i in gpu.instances:
        p = model.profile(i.profile)
        if p is not None and i.used:
            busy |= p.slots(i.start)
    return (model.full_mask & ~busy).bit_count()


def choose(gpus: Sequence[MigGPU], profile: str, demand: Demand, first_fit: bool = False,
           highest_start: bool = False) -> MigChoice | MigRefusal:
    """Pick the GPU and the instance (existing idle one or new start) for a pod of `profile`.

    `first_fit` is the baseline the benchmark compares with: the first GPU that can serve the pod, an
    idle instance if it has one, else the lowest allowed start (the highest with `highest_start`: the order
    in which gpupool's DRA driver lists a GPU's partitions, which kube-scheduler's allocator takes first)."""
    best: tuple[tuple[float, int, int, int, int], MigChoice] | None = None
    for k, gpu in enumerate(gpus):
        found = options(gpu, profile)
        if not found:
            continue
        if first_fit:
            opt = min(found, key=lambda o: (not o.reuse, -o.start if highest_start else o.start))
            return MigChoice(k, opt, 0.0)
        before = fragmentation(gpu, demand)
        idle = _idle_slices(gpu)
        for opt in found:
            delta = fragmentation(gpu.with_instance(opt.profile, opt.start), demand) - before
            key = (round(delta, 9), 0 if opt.reuse else 1, idle, k, opt.start)
            if best is None or key < best[0]:
                best = (key, MigChoice(k, opt, delta))
    if best is not None:
        return best[1]
    if not any(_model(g.model).profile(profile) is not None for g in gpus):
        return MigRefusal(f"profile {profile} exists on none of the {len(gpus)} GPU(s) given")
    return MigRefusal(f"no GPU has an idle {profile} instance or free slices at an allowed start for one")
