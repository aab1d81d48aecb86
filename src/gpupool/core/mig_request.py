"""Which MIG profile a pod gets: the smallest one that holds its memory and cores request, or one
named in `gpupool.io/mig-profile`, checked against the GPU model's geometry (gpupool.core.mig).

`profile_for` is the one rule for a pod with isolation `mig` (the webhook checks it against every
MIG-capable model in the cluster, the scheduler against each MIG GPU's model); it answers with a
`MigProfile` or a `ProfileRefusal` carrying a sentence for the user, never an exception. `grant_share` is
what the allocation grants for a profile.

`vendor_profile_for` is the same rule on an AMD or Ascend card (gpupool.core.partitions): the profile named
(`gpupool.io/mig-profile`, or a claim's profile selector: "CPX/NPS4", "vir08"), else the smallest that holds
the request's memory and compute (compute as the partition's compute units over the card's).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpupool.core.mig import MigModel, MigProfile, known_models, mig_model
from gpupool.core.model import MILLI_PER_GPU, GPURequest
from gpupool.core.partitions import PartitionModel, PartitionProfile


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


def profile_for(model: str | MigModel, gpu: GPURequest, named: str | None = None) -> MigProfile | ProfileRefusal:
    """The profile a pod with isolation `mig` gets on a GPU of `model` for its per-GPU request `gpu`.

    `named` (`gpupool.io/mig-profile`) wins, but must hold an explicit share: memory asked for, and
    compute when below a whole GPU (a pod that gives no share asks for "the whole GPU", which the named
    profile then is). Otherwise the smallest profile that holds the memory and the compute (a whole GPU
    is 100 %, so the full-GPU profile; a memory-only share asks 0.1 % and gets the smallest by memory)."""
    if named:
        found = profile_by_name(model, named)
        if isinstance(found, ProfileRefusal):
            return found
        m = _model_or_refusal(model)
        assert isinstance(m, MigModel)  # profile_by_name resolved it
        if gpu.memory_mib is not None and gpu.memory_mib > found.memory_mib:
            return ProfileRefusal(f"MIG profile {found.name} has {found.memory_mib} MiB, less than the "
                                  f"{gpu.memory_mib} MiB asked for")
        if gpu.milli < MILLI_PER_GPU and found.compute_slices * MILLI_PER_GPU < gpu.milli * m.compute_slices:
            return ProfileRefusal(f"MIG profile {found.name} gives {compute_percent(m, found):.1f} % of the "
                                  f"compute, less than the {gpu.milli / 10:g} % asked for")
        return found
    return smallest_profile(model, gpu.memory_mib, min(gpu.milli, MILLI_PER_GPU) / 10)


def grant_share(model: MigModel, profile: MigProfile) -> tuple[int, int]:
    """(milli-GPU of compute, MiB of memory) a grant of `profile` records: its compute slices as a
    fraction of the GPU's, rounded down so that a full layout never adds up to more than the GPU, and
    the profile's memory."""
    return MILLI_PER_GPU * profile.compute_slices // model.compute_slices, profile.memory_mib


def vendor_profile_for(model: PartitionModel, gpu: GPURequest, named: str | None = None,
                       card_memory_mib: int | None = None) -> PartitionProfile | ProfileRefusal:
    """The AMD partition profile or Ascend vNPU template a request with isolation `mig` gets on a card of
    `model` (`card_memory_mib`: what the card reports, of which a partition holds its share; default the
    catalogue's memory). Named: it must exist and hold an explicit share; else the smallest that holds it."""
    card = model.memory_mib if card_memory_mib is None else card_memory_mib

    def memory(p: PartitionProfile) -> int:
        return card * p.memory_mib // model.memory_mib

    def short(p: PartitionProfile) -> str | None:
        if gpu.memory_mib is not None and gpu.memory_mib > memory(p):
            return f"{p.name} has {memory(p)} MiB, less than the {gpu.memory_mib} MiB asked for"
        if gpu.milli < MILLI_PER_GPU and p.compute_units * MILLI_PER_GPU < gpu.milli * model.compute_units:
            return (f"{p.name} gives {100 * p.compute_units / model.compute_units:.1f} % of the compute, less than "
                    f"the {gpu.milli / 10:g} % asked for")
        return None

    if named:
        found = model.profile(named.strip())
        if found is None:
            return ProfileRefusal(f"partition profile {named!r} does not exist on {model.name} "
                                  f"(profiles: {', '.join(p.name for p in model.profiles)})")
        why = short(found)
        return found if why is None else ProfileRefusal(f"partition profile {why}")
    whole = gpu.memory_mib is None and gpu.milli >= MILLI_PER_GPU
    for p in sorted(model.profiles, key=lambda p: (p.compute_units, p.memory_mib)):
        if short(p) is None and (not whole or p.compute_units == model.compute_units):
            return p
    return ProfileRefusal(f"no partition profile of {model.name} holds {gpu.memory_mib or 0} MiB and "
                          f"{min(gpu.milli, MILLI_PER_GPU) / 10:g} % of the compute")
