"""Which MIG profile a pod gets: the smallest one that holds its memory and cores request, or one
named in `gpupool.io/mig-profile`, checked against the GPU model's geometry (gpupool.core.mig).

The webhook and the pod reader call these two functions; both answer with a `MigProfile` or a
`ProfileRefusal` carrying a sentence for the user, never an exception.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpupool.core.mig import MigModel, MigProfile, known_models, mig_model


@dataclass(frozen=True, slots=True)
class ProfileRefusal:
    reason: str


def _model_or_refusal(model: str | MigModel) -> MigModel | ProfileRefusal:
    if isinstance(model, MigModel):
        return model
    found = mig_model(model)
    if found is None:
        return ProfileRefusal(f"GPU model {model!r} has no MIG geometry in gpupool "
                              f"(known: {', '.join(known_models())})")
    return found


def compute_percent(model: MigModel, profile: MigProfile) -> float:
    """Share of the GPU's compute a profile gives (3 of 7 compute slices = 42.9 %)."""
    return 100.0 * profile.compute_slices / model.compute_slices


def smallest_profile(model: str | MigModel, memory_mib: int | None = None,
                     cores_percent: float | None = None) -> MigProfile | ProfileRefusal:
    """The profile with the fewest memory slices (then fewest compute slices) that gives at least
    `memory_mib` of memory and `cores_percent` of the GPU's compute. `+me` profiles are never picked
    here: there is one per GPU and it carries engines the request did not ask for; name it instead."""
    m = _model_or_refusal(model)
    if isinstance(m, ProfileRefusal):
        return m
    if memory_mib is not None and memory_mib <= 0:
        return ProfileRefusal(f"GPU memory {memory_mib} MiB must be positive")
    if cores_percent is not None and not 0 < cores_percent <= 100:
        return ProfileRefusal(f"GPU cores {cores_percent:g} percent must be within 1-100")
    candidates = sorted((p for p in m.profiles if not p.media),
                        key=lambda p: (p.memory_slices, p.compute_slices, p.memory_mib))
    for p in candidates:
        if memory_mib is not None and p.memory_mib < memory_mib:
            continue
        # compare in whole slices so that 3/7 of 100 % is not lost to float rounding
        if cores_percent is not None and p.compute_slices * 100 < cores_percent * m.compute_slices - 1e-9:
            continue
        return p
    largest = max(m.profiles, key=lambda p: p.memory_mib)
    return ProfileRefusal(f"no MIG profile of {m.name} holds {memory_mib or 0} MiB and {cores_percent or 0:g} % "
                          f"cores (the largest, {largest.name}, has {largest.memory_mib} MiB and 100 %)")


def profile_by_name(model: str | MigModel, name: str) -> MigProfile | ProfileRefusal:
    """The profile `name` (as in `gpupool.io/mig-profile: 3g.40gb`) of `model`, or why not."""
    m = _model_or_refusal(model)
    if isinstance(m, ProfileRefusal):
        return m
    wanted = name.strip().lower()
    for p in m.profiles:
        if p.name == wanted:
            return p
    return ProfileRefusal(f"MIG profile {name!r} does not exist on {m.name} "
                          f"(profiles: {', '.join(p.name for p in m.profiles)})")
