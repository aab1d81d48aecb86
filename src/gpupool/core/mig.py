"""MIG geometry: the GPU-instance profiles of each MIG-capable GPU model and where they may sit.

A MIG GPU is a row of memory slices (8 on A100/H100/H200/GH200/B200, 4 on A30). A GPU instance of a
profile occupies `memory_slices` contiguous slices starting at one of the profile's allowed start slots;
a layout is valid when every instance sits at an allowed start, no two instances share a slice, no
profile exceeds its instance count and the compute slices add up to at most the GPU's.

The numbers come from the project's NVIDIA reference notes (§1.3 placements, §1.4 per-GPU tables).
Where those notes say a value is inferred rather than read from a transcript, the row carries an
`inferred` note; `gpupool mig models` prints them. Memory per profile is the *smallest* size seen in
`nvidia-smi mig -lgip` (sizes vary a little between drivers), so "the profile holds N MiB" stays true on
every driver. At runtime the agent reads profiles from NVML; this table is what the scheduler plans with.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One GPU-instance profile of one GPU model."""

    name: str  # e.g. "3g.40gb", "1g.10gb+me"
    compute_slices: int  # the "g" number
    memory_slices: int  # size of the placement in memory slices
    starts: tuple[int, ...]  # allowed first memory slice
    max_count: int  # most instances of this profile on one GPU
    memory_mib: int  # usable memory (smallest size reported)
    profile_id: int | None = None  # nvidia-smi / NVML info.id; None where unknown
    sm_count: int | None = None
    media: bool = False  # "+me": the one 1g instance with the JPEG/OFA engines
    inferred: str = ""  # what about this row is inferred rather than read

    def slots(self, start: int) -> int:
        """Bit mask of the memory slices an instance starting at `start` occupies."""
        return ((1 << self.memory_slices) - 1) << start


@dataclass(frozen=True, slots=True)
class MigModel:
    """A MIG-capable GPU model: its slices and profiles (smallest first)."""

    name: str
    memory_slices: int
    compute_slices: int
    memory_mib: int  # the card's memory, for percent-of-card arithmetic
    profiles: tuple[MigProfile, ...]
    inferred: str = ""

    @property
    def full_mask(self) -> int:
        return (1 << self.memory_slices) - 1

    def profile(self, name: str) -> MigProfile | None:
        for p in self.profiles:
            if p.name == name:
                return p
        return None


@dataclass(frozen=True, slots=True, order=True)
class PlacedInstance:
    """A GPU instance of a profile at a start slot (what NVML calls a placement)."""

    profile: str
    start: int


def _gib(value: float) -> int:
    return int(value * 1024)  # nvidia-smi prints GiB with two decimals; floor keeps "holds N MiB" true


# Start slots on every 8-slice GPU studied (reference §1.3).
_STARTS_1 = (0, 1, 2, 3, 4, 5, 6)
_STARTS_1_DOUBLE = (0, 2, 4, 6)
_STARTS_2 = (0, 2, 4)
_STARTS_3 = (0, 4)
_STARTS_4 = (0,)
_STARTS_7 = (0,)


def _eight_slice(
    name: str, card_mib: int, size_gb: tuple[str, str, str, str], gib: tuple[float, float, float, float],
    sms: tuple[int | None, int | None, int | None, int | None, int | None, int | None],
    ids: tuple[int | None, int | None, int | None, int | None, int | None],
    notes: dict[str, str] | None = None, model_note: str = "",
) -> MigModel:
    """The seven profiles of an 8-memory-slice, 7-compute-slice GPU. `size_gb` names the 1g, 1g-double
    (and 2g), 3g/4g and 7g sizes; `gib` gives their usable memory; `sms` is for 1g, 1g-double, 2g, 3g, 4g,
    7g; `ids` for 1g-double, 2g, 3g, 4g, 7g (1g and 1g+me are 19 and 20 everywhere)."""
    g1, g2, g4, g8 = size_gb
    m1, m2, m4, m8 = gib
    n = notes or {}
    rows = [
        MigProfile(f"1g.{g1}", 1, 1, _STARTS_1, 7, _gib(m1), 19, sms[0], inferred=n.get("1g", "")),
        MigProfile(f"1g.{g1}+me", 1, 1, _STARTS_1, 1, _gib(m1), 20, sms[0], media=True,
                   inferred=n.get("1g+me", "can sit beside six plain 1g instances (unverified)")),
        MigProfile(f"1g.{g2}", 1, 2, _STARTS_1_DOUBLE, 4, _gib(m2), ids[0], sms[1], inferred=n.get("1g2", "")),
        MigProfile(f"2g.{g2}", 2, 2, _STARTS_2, 3, _gib(m2), ids[1], sms[2], inferred=n.get("2g", "")),
        MigProfile(f"3g.{g4}", 3, 4, _STARTS_3, 2, _gib(m4), ids[2], sms[3], inferred=n.get("3g", "")),
        MigProfile(f"4g.{g4}", 4, 4, _STARTS_4, 1, _gib(m4), ids[3], sms[4], inferred=n.get("4g", "")),
        MigProfile(f"7g.{g8}", 7, 8, _STARTS_7, 1, _gib(m8), ids[4], sms[5], inferred=n.get("7g", "")),
    ]
    return MigModel(name, 8, 7, card_mib, tuple(rows), model_note)


_PLACEMENTS_INFERRED = "start slots assumed equal to A100/H100 (no -lgipp transcript)"
_STD_IDS = (15, 14, 9, 5, 0)

MODELS: dict[str, MigModel] = {
    m.name: m
    for m in (
        _eight_slice("A100-40GB", 40960, ("5gb", "10gb", "20gb", "40gb"), (4.75, 9.62, 19.50, 39.25),
                     (14, 14, 28, 42, 56, 98), _STD_IDS),
        _eight_slice("A100-80GB", 81920, ("10gb", "20gb", "40gb", "80gb"), (9.50, 19.50, 39.25, 79.00),
                     (14, 14, 28, 42, 56, 98), _STD_IDS,
                     {"1g2": "SM count and memory (about 19.5 GiB) inferred from the A100 pattern"}),
        _eight_slice("H100-80GB", 81920, ("10gb", "20gb", "40gb", "80gb"), (9.75, 19.62, 39.50, 79.25),
                     (16, 26, 32, 60, 64, 132), _STD_IDS),
        _eight_slice("H100-NVL", 96256, ("12gb", "24gb", "47gb", "94gb"), (10.62, 21.50, 46.12, 92.62),
                     (16, 26, 32, 60, 64, 132), _STD_IDS),
        # H100 96GB as on GH200 96GB: names, counts and IDs from the reference; no memory sizes were
        # read, so the H100 NVL (94 GB) sizes stand in as lower bounds.
        _eight_slice("GH200-96GB", 98304, ("12gb", "24gb", "48gb", "96gb"), (10.62, 21.50, 46.12, 92.62),
                     (None, 26, 32, 60, 64, 132), _STD_IDS,
                     {k: "memory taken from H100 NVL as a lower bound" for k in ("1g", "1g2", "2g", "3g", "4g", "7g")},
                     _PLACEMENTS_INFERRED),
        _eight_slice("H200", 144384, ("18gb", "35gb", "71gb", "141gb"), (16.00, 32.25, 69.50, 139.00),
                     (16, 26, 32, 60, 64, None), (15, 14, 9, 5, None),
                     {"7g": "ID 0, SM count 132 and memory (2 x 3g = 139 GiB) inferred"}, _PLACEMENTS_INFERRED),
        _eight_slice("GH200-144GB", 147456, ("18gb", "36gb", "72gb", "144gb"), (17.50, 35.25, 70.50, 141.00),
                     (16, 26, 32, None, None, None), (15, 14, None, None, None),
                     {"3g": "memory (2 x 2g) inferred", "4g": "memory (2 x 2g) inferred",
                      "7g": "memory (4 x 2g) inferred"}, _PLACEMENTS_INFERRED),
        _eight_slice("B200", 184320, ("23gb", "45gb", "90gb", "180gb"), (20.50, 44.25, 88.50, 177.00),
                     (18, 30, 36, None, None, None), (15, 14, None, None, None),
                     {"3g": "ID (9?) and memory (2 x 2g) inferred", "4g": "ID (5?) and memory (2 x 2g) inferred",
                      "7g": "ID (0?) and memory (4 x 2g) inferred"}, _PLACEMENTS_INFERRED),
        # A30: 4 memory slices and 4 compute slices. The reference gives names and counts only; start
        # slots (1g at 0-3, 2g at 0 and 2, 4g at 0) and memory sizes are inferred from the 8-slice rule.
        MigModel("A30-24GB", 4, 4, 24576, (
            MigProfile("1g.6gb", 1, 1, (0, 1, 2, 3), 4, 5632, inferred="start slots and memory"),
            MigProfile("1g.6gb+me", 1, 1, (0, 1, 2, 3), 1, 5632, media=True, inferred="start slots and memory"),
            MigProfile("2g.12gb", 2, 2, (0, 2), 2, 11520, inferred="start slots and memory"),
            MigProfile("2g.12gb+me", 2, 2, (0, 2), 1, 11520, media=True, inferred="start slots and memory"),
            MigProfile("4g.24gb", 4, 4, (0,), 1, 23296, inferred="memory"),
        ), "start slots and memory sizes inferred (the reference lists names and counts only)"),
    )
}

# Names NVML reports for these cards (lower case, "nvidia " dropped). Inferred from common naming;
# a card not listed is looked up by its table name.
_ALIASES = {
    "a100-sxm4-40gb": "A100-40GB", "a100-pcie-40gb": "A100-40GB", "a100-sxm4-80gb": "A100-80GB",
    "a100 80gb pcie": "A100-80GB", "a100-pcie-80gb": "A100-80GB", "a30": "A30-24GB",
    "h100 80gb hbm3": "H100-80GB", "h100 pcie": "H100-80GB", "h100-sxm5-80gb": "H100-80GB",
    "h100 nvl": "H100-NVL", "h200": "H200", "h200 nvl": "H200", "gh200 480gb": "GH200-96GB",
    "gh200 144g hbm3e": "GH200-144GB", "b200": "B200",
}


def known_models() -> list[str]:
    return sorted(MODELS)


def mig_model(name: str) -> MigModel | None:
    """The geometry of a GPU model, by table name (any case) or by the name NVML reports."""
    key = name.strip().lower().removeprefix("nvidia ").strip()
    for model in MODELS.values():
        if model.name.lower() == key:
            return model
    alias = _ALIASES.get(key)
    return MODELS[alias] if alias else None


def occupied(model: MigModel, layout: tuple[PlacedInstance, ...] | list[PlacedInstance]) -> int:
    """Bit mask of the memory slices a (valid) layout occupies."""
    mask = 0
    for inst in layout:
        p = model.profile(inst.profile)
        if p is not None:
            mask |= p.slots(inst.start)
    return mask


def layout_problems(model: MigModel, layout: tuple[PlacedInstance, ...] | list[PlacedInstance]) -> list[str]:
    """Why a layout is impossible on `model` (empty list = valid)."""
    out: list[str] = []
    used = 0
    compute = 0
    media = 0
    counts: dict[str, int] = {}
    for inst in layout:
        p = model.profile(inst.profile)
        if p is None:
            out.append(f"{inst.profile}: not a profile of {model.name}")
            continue
        if inst.start not in p.starts:
            out.append(f"{p.name} cannot start at slot {inst.start} (allowed: {', '.join(map(str, p.starts))})")
            continue
        mask = p.slots(inst.start)
        if used & mask:
            out.append(f"{p.name} at slot {inst.start} overlaps another instance")
        used |= mask
        compute += p.compute_slices
        media += p.media
        if media == 2:  # the media engines exist once per GPU (inferred: matters on A30's two +me profiles)
            out.append("more than one +me instance (the GPU has one set of media engines)")
        counts[p.name] = counts.get(p.name, 0) + 1
        if counts[p.name] == p.max_count + 1:
            out.append(f"more than {p.max_count} instance(s) of {p.name}")
    if compute > model.compute_slices:
        out.append(f"{compute} compute slices asked, {model.name} has {model.compute_slices}")
    return out


def can_add(model: MigModel, layout: tuple[PlacedInstance, ...], profile: MigProfile, start: int) -> bool:
    """Whether `profile` at `start` may join an already valid `layout`."""
    return not layout_problems(model, (*layout, PlacedInstance(profile.name, start)))


def free_starts(model: MigModel, layout: tuple[PlacedInstance, ...], profile: MigProfile) -> list[int]:
    """Start slots where a new instance of `profile` fits beside `layout`."""
    return [s for s in profile.starts if can_add(model, layout, profile, s)]


def _extensions(model: MigModel, layout: tuple[PlacedInstance, ...], after: PlacedInstance | None) -> Iterator[
        tuple[PlacedInstance, ...]]:
    """Depth-first over layouts, each generated once: instances are added in increasing (start, name)."""
    grew = False
    for p in model.profiles:
        for s in p.starts:
            inst = PlacedInstance(p.name, s)
            if can_add(model, layout, p, s):
                grew = True
                if after is None or (inst.start, inst.profile) > (after.start, after.profile):
                    yield from _extensions(model, (*layout, inst), inst)
    if not grew:
        yield layout


@cache
def maximal_layouts(model_name: str) -> tuple[tuple[PlacedInstance, ...], ...]:
    """Every valid layout to which no further instance can be added, instances ordered by start slot,
    layouts in a stable order. (A branch that can still grow, but only with an instance that sorts
    before its last one, is a subset of a layout found along another branch and yields nothing.)"""
    model = MODELS[model_name]
    found = {tuple(sorted(layout, key=lambda i: (i.start, i.profile))) for layout in _extensions(model, (), None)}
    return tuple(sorted(found, key=lambda lay: [(i.start, i.profile) for i in lay]))
