"""Which compute units of an AMD card a share runs on: CU masks (issue 40, item 2).

A `hook` share of an AMD card gets a CU mask (the agent writes it to cu_masks.v1, the HIP library applies it to
every HSA queue of the container). The mask is a hard partition of the CUs: two shares of one card never get
the same CU, and a share never runs on another's idle CUs (not work-conserving). Memory bandwidth, caches and
the rest of the card stay shared, so that part of the isolation is soft. Granularity is one CU.

How many CUs: floor(p x CUs / 100) for a share of p %, at least 1. Floor, because the ledger keeps the shares
of a card at 100 % or less, and the floors of shares that sum to at most 100 % sum to at most the card's CUs:
sum(floor(p_i C / 100)) <= floor(sum(p_i) C / 100) <= C. So the shares the ledger admits always fit, whatever
order they come in. Rounding up could need C + 1 CUs for shares the ledger calls full (three shares of 33.4 %
on 304 CUs: 102 each, 306 in all). The "at least 1" only matters below 100 / C % (0.33 % on an MI300X), which
the ledger's whole percents never ask for on these cards.

Which CUs: the bit positions mean what the kernel driver makes of them. KFD turns the user's mask into each
queue's per-shader-engine enable registers in `mqd_symmetrically_map_cu_mask` (amdgpu's
drivers/gpu/drm/amd/amdkfd/kfd_mqd_manager.c, the GC 9.4.3 variant that takes the XCC instance), which walks
the mask bits in this order:

- with X XCCs in the KFD node (8 on an MI300X in SPX, the only mode whose cards serve shares), bit i belongs
  to XCC i mod X: each XCC's queue reads bits inst, inst + X, inst + 2X, ...;
- within the XCC, its k-th bit (k = i div X) goes round the shader engines first and down the CUs second
  (for CU 0..15: for each shader array: for each SE with more than that many active CUs): so with S shader
  engines of at least m active CUs each, its k-th bit is on SE k mod S for every k < S x m;
- the bits past that (k >= S x m: the 10th CU of the MI300X's two 10-CU engines, k = 36, 37) land on whichever
  engines kept more CUs after harvesting, which differs from chip to chip. They are `se=None` here.
- bits at or past the card's active CU count are dropped by KFD (mask bits beyond the node's CUs): the card's
  CUs are bits 0 .. C-1.

So the lowest n bits are spread as evenly as the card allows, which is what "symmetrically" means there.

Spreading a share evenly matters because in SPX mode the hardware hands a dispatch's workgroups to the XCCs in
turn; an XCC with fewer of the share's CUs finishes its part last. The rule here:

1. XCCs first: each XCC gets L or L + 1 of the share's CUs (L the highest level the free CUs allow; an XCC
   with fewer free CUs than L gives all it has), the extra ones going to the XCCs with the most free CUs
   (then the lowest index), so the CUs left on the card stay even for the shares after it.
2. Within an XCC, the same over its shader engines, with the harvest-dependent bits (`se=None`) used last.
3. Within a shader engine, its lowest free bits.

On an empty MI300X this picks bits 0..75 for 25 % and the next 25 % gets 76..151: consecutive shares get
consecutive ranges, each 10 CUs on four XCCs and 9 on the others.

Free CUs may be fragmented (shares come and go); a mask is a bitmap, so that is fine. The geometry (XCCs, shader
engines) only decides the spread, never whether the CUs fit or overlap. Where gpupool does not know a card's
layout, or the card reports a CU count other than the catalogue's, the card is one XCC of one engine: still
exclusive and exact, not spread.

Pure: no I/O. The agent (gpupool.agent.isolation.vendors) reads who holds what and writes the file.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from fractions import Fraction

from gpupool.core.vendors import card_model


class CuShortage(ValueError):
    """The card has fewer free CUs than the share needs."""


@dataclass(frozen=True, slots=True)
class CuGeometry:
    """How a card's CU mask bits map onto its XCCs and shader engines (the module docstring's rule)."""

    cus: int  # the card's active CUs: mask bits 0 .. cus-1
    xccs: int = 1
    shader_engines: int = 1  # per XCC

    def __post_init__(self) -> None:
        if self.cus < 1 or self.xccs < 1 or self.shader_engines < 1:
            raise ValueError(f"CU geometry: {self.cus} CUs on {self.xccs} XCC(s) of {self.shader_engines} shader "
                             "engine(s): each must be at least 1")

    def xcc_cus(self, xcc: int) -> int:
        """How many of the card's mask bits belong to XCC `xcc` (i mod xccs == xcc, i < cus)."""
        return len(range(xcc, self.cus, self.xccs))

    def position(self, cu: int) -> tuple[int, int | None]:
        """(XCC, shader engine) of mask bit `cu`; the engine is None for the bits whose engine depends on the
        chip's harvesting (past shader_engines x the fewest CUs an engine of that XCC can have)."""
        if not 0 <= cu < self.cus:
            raise ValueError(f"CU {cu} is outside the card's 0..{self.cus - 1}")
        xcc, k = cu % self.xccs, cu // self.xccs
        per_engine = self.xcc_cus(xcc) // self.shader_engines
        return xcc, (k % self.shader_engines if k < self.shader_engines * per_engine else None)


def geometry_for(model: str, cus: int) -> CuGeometry:
    """The geometry of a card of catalogue model `model` reporting `cus` CUs: the catalogue's XCCs and shader
    engines when it knows them for that CU count, else one XCC of one engine."""
    row = card_model(model)
    if row is None or not row.shader_engines or row.compute_units != cus:
        return CuGeometry(cus)
    return CuGeometry(cus, row.xccs, row.shader_engines)


def share_cus(percent: float, cus: int) -> int:
    """floor(percent x cus / 100), at least 1 (the module docstring says why floor). The percent is taken as
    written (33.3 is 333/10, not the float nearest it), so a share that divides the card exactly is not
    floored one CU short by binary rounding."""
    if cus < 1:
        raise ValueError(f"a card of {cus} CUs")
    if not 0 < percent <= 100:
        raise ValueError(f"a share of {percent} % is not a percent in (0, 100]")
    return max(1, int(Fraction(str(percent)) * cus / 100))


def _level_fill(wanted: int, free: list[int]) -> list[int]:
    """How many of `wanted` each group gives: the same number L from every group (all of a group's free when it
    has fewer than L), one more from some groups with free left, those with the most free first (then the lowest
    index). sum(free) >= wanted."""
    level = 0
    while sum(min(f, level + 1) for f in free) <= wanted and level < max(free, default=0):
        level += 1
    take = [min(f, level) for f in free]
    extra = wanted - sum(take)
    for g in sorted((g for g, f in enumerate(free) if f > level), key=lambda g: (-free[g], g))[:extra]:
        take[g] += 1
    return take


def choose_cus(geometry: CuGeometry, percent: float, held: Iterable[int]) -> frozenset[int]:
    """The CUs a share of `percent` % of the card gets, none of `held` (the CUs other shares on the card hold;
    bits outside the card are ignored). CuShortage when fewer are free than the share needs."""
    wanted = share_cus(percent, geometry.cus)
    taken = {c for c in held if 0 <= c < geometry.cus}
    free_count = geometry.cus - len(taken)
    if free_count < wanted:
        raise CuShortage(f"a share of {percent} % needs {wanted} of the card's {geometry.cus} CUs, and only "
                         f"{free_count} are free ({len(taken)} held by other shares)")
    # free bits by XCC, then by shader engine (the last list: the harvest-dependent bits), each ascending
    engines = geometry.shader_engines
    free: list[list[list[int]]] = [[[] for _ in range(engines + 1)] for _ in range(geometry.xccs)]
    for cu in range(geometry.cus):
        if cu not in taken:
            xcc, se = geometry.position(cu)
            free[xcc][engines if se is None else se].append(cu)
    chosen: list[int] = []
    per_xcc = _level_fill(wanted, [sum(len(g) for g in groups) for groups in free])
    for groups, n in zip(free, per_xcc, strict=True):
        known = sum(len(g) for g in groups[:engines])
        tail = max(0, n - known)  # the harvest-dependent bits only once the known engines are used up
        per_se = _level_fill(n - tail, [len(g) for g in groups[:engines]])
        for group, k in zip(groups, [*per_se, tail], strict=True):
            chosen += group[:k]
    return frozenset(chosen)


def counts(geometry: CuGeometry, cus: Collection[int]) -> dict[tuple[int, int | None], int]:
    """How many of `cus` sit on each (XCC, shader engine) of the card (for tests and reports)."""
    out: dict[tuple[int, int | None], int] = {}
    for cu in cus:
        pos = geometry.position(cu)
        out[pos] = out.get(pos, 0) + 1
    return out
