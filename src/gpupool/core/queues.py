"""Team queues: guaranteed and maximum quota on GPU shares, borrowing within a hierarchy, and the admission
decision with a reason a person can read.

Quota counts three dimensions, each summed over all the GPUs a pod holds (so a 2 x 10 GiB pod charges
20 GiB, the multiplication native quota and several peers miss):
- `gpu_milli`: devices in thousandths: a whole GPU is 1000, a share is the larger of its compute and memory
  fractions of the card it sits on (a 10 GiB share of an 80 GiB card with 30 % compute holds 300 milli);
- `memory_mib`: GPU memory;
- `cores`: GPU compute in percent of one GPU (100 = one whole GPU's compute).

Queues form a tree (an optional parent). Pods join leaf queues. A queue's *guarantee* is capacity it gets
back by reclaim whenever it asks for it; its *maximum* caps it whatever is idle. A queue that lends lets
the rest of its parent's subtree use its idle guarantee; a queue that borrows may go beyond its guarantee
into what its siblings lend. The rule at each level (parent p, its children c):

    sum over c of  effective(c)  <=  guarantee(p)     effective(c) = usage(c)                if c lends
                                                                   = max(usage(c), guar(c)) otherwise

is checked only where the request makes a queue go past its own guarantee (borrowing): a request that
stays within its queue's guarantee is always admitted, and capacity borrowed by others is reclaimed for it
(gpupool.core.preemption). The root's guarantee is the cluster's capacity when given (idle capacity nobody
is guaranteed is free to borrow), else the sum of the top-level guarantees.

A queue may also cap one vendor's cards on their own (`QueueSpec.vendor_maximum`, the GPUQueue's
`maxGPUsByVendor`): each charge carries its `gpus` dimension split by the vendor of the cards it sits on
(`Quota.by_vendor`), summed like the rest, and a pod that would take a queue past a vendor's maximum on that
vendor's cards is refused (final, like every maximum); pods on other vendors' cards are not. Without vendor
maxima nothing of this changes a decision. A pending pod is charged to the vendor its runtime names (cuda:
NVIDIA, ...); one that names none is charged to the vendor of the cards placement chose, when it has chosen.

Pure: no I/O, no clock. The scheduler's admission plugin and the timeline replay call the same functions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpupool.core.model import MILLI_PER_GPU, Allocation, GPURequest, Node
from gpupool.core.vendors import RUNTIME_OF_VENDOR

UNLIMITED = 1 << 62  # a maximum nobody sets: large enough never to bind, small enough to add safely

DIMENSIONS = ("gpu_milli", "memory_mib", "cores")


VendorMilli = tuple[tuple[str, int], ...]  # (vendor, gpu_milli) sorted by vendor, no zero entries


def _merge(a: VendorMilli, b: VendorMilli, sign: int) -> VendorMilli:
    if not b:
        return a
    if not a and sign > 0:
        return b
    if len(a) == 1 and len(b) == 1 and a[0][0] == b[0][0]:  # the common case: one vendor's cards
        milli = a[0][1] + sign * b[0][1]
        return ((a[0][0], milli),) if milli else ()
    out = dict(a)
    for vendor, milli in b:
        out[vendor] = out.get(vendor, 0) + sign * milli
    return tuple(sorted((v, m) for v, m in out.items() if m))


@dataclass(frozen=True, slots=True)
class Quota:
    """An amount in the three quota dimensions (see the module doc for the units), with the `gpu_milli`
    dimension also split by the vendor of the cards it sits on (`by_vendor`; a part of unknown vendor is in
    no entry). Equality and the quota arithmetic of the three dimensions ignore the split: it only feeds
    per-vendor maxima."""

    gpu_milli: int = 0
    memory_mib: int = 0
    cores: int = 0
    by_vendor: VendorMilli = field(default=(), compare=False)

    def __add__(self, other: Quota) -> Quota:
        return Quota(self.gpu_milli + other.gpu_milli, self.memory_mib + other.memory_mib, self.cores + other.cores,
                     _merge(self.by_vendor, other.by_vendor, 1))

    def __sub__(self, other: Quota) -> Quota:
        return Quota(self.gpu_milli - other.gpu_milli, self.memory_mib - other.memory_mib, self.cores - other.cores,
                     _merge(self.by_vendor, other.by_vendor, -1))

    def vendor_milli(self, vendor: str) -> int:
        """The part of `gpu_milli` on `vendor`'s cards."""
        return next((m for v, m in self.by_vendor if v == vendor), 0)

    def values(self) -> tuple[int, int, int]:
        return (self.gpu_milli, self.memory_mib, self.cores)

    def fits_in(self, limit: Quota) -> bool:
        return all(a <= b for a, b in zip(self.values(), limit.values(), strict=True))

    def exceeds(self, limit: Quota) -> list[str]:
        """The dimensions in which this amount is above `limit`."""
        return [d for d, a, b in zip(DIMENSIONS, self.values(), limit.values(), strict=True) if a > b]

    def elementwise_max(self, other: Quota) -> Quota:
        g, m, c = (max(a, b) for a, b in zip(self.values(), other.values(), strict=True))
        vendors = {v for v, _ in (*self.by_vendor, *other.by_vendor)}
        split = tuple(sorted((v, max(self.vendor_milli(v), other.vendor_milli(v))) for v in vendors))
        return Quota(g, m, c, tuple((v, x) for v, x in split if x))

    def positive(self) -> Quota:
        g, m, c = (max(0, a) for a in self.values())
        return Quota(g, m, c, tuple((v, x) for v, x in self.by_vendor if x > 0))

    def is_zero(self) -> bool:
        return not any(self.values())


ZERO = Quota()
NO_LIMIT = Quota(UNLIMITED, UNLIMITED, UNLIMITED)


class CardMemory(dict[str, int]):
    """GPU memory (MiB) by GPU UUID, and each card's vendor (`vendor`, by UUID): what `card_memory` gives, so
    that every caller's charges carry the vendor split without a second argument."""

    def __init__(self, memory: Mapping[str, int], vendor: Mapping[str, str]) -> None:
        super().__init__(memory)
        self.vendor: dict[str, str] = dict(vendor)


def card_memory(nodes: Iterable[Node]) -> CardMemory:
    """GPU memory (MiB) by GPU UUID: what a share's memory fraction is measured against (and its vendor)."""
    cards = [g for n in nodes for g in n.gpus]
    return CardMemory({g.uuid: g.memory_mib for g in cards}, {g.uuid: g.vendor for g in cards})


_VENDOR_OF_RUNTIME = {runtime: vendor for vendor, runtime in RUNTIME_OF_VENDOR.items()}


def charge_of_request(request: GPURequest, gpu_memory_mib: int) -> Quota:
    """What a pod asking `request` is charged when it sits on GPUs of `gpu_memory_mib` (the candidate GPU's
    size: a pending pod is charged as it would be on the GPU its placement chose), on the vendor its runtime
    names (none for "any" or nothing said)."""
    if request.count <= 0:
        return ZERO
    memory = request.memory_on(gpu_memory_mib)
    return _charge(request.count, request.milli, memory, gpu_memory_mib,
                   _VENDOR_OF_RUNTIME.get(request.runtime or ""))


def charge_of_allocation(allocation: Allocation, gpu_memory_mib: Mapping[str, int]) -> Quota:
    """What an allocated pod is charged: what it was given, GPU by GPU (`gpu_memory_mib` maps UUID to the
    card's memory; an unknown card counts its share of compute only). With `card_memory`'s mapping, each
    GPU's part is also counted on its card's vendor."""
    vendors = gpu_memory_mib.vendor if isinstance(gpu_memory_mib, CardMemory) else {}
    total = ZERO
    for grant in allocation.grants:
        total = total + _charge(1, grant.milli, grant.memory_mib, gpu_memory_mib.get(grant.uuid, 0),
                                vendors.get(grant.uuid))
    return total


def charge_of_share(milli: int, memory_mib: int, card_mib: int) -> Quota:
    """What one GPU's share of `milli` compute and `memory_mib` memory on a card of `card_mib` charges."""
    return _charge(1, milli, memory_mib, card_mib)


def _charge(count: int, milli: int, memory_mib: int, card_mib: int, vendor: str | None = None) -> Quota:
    memory_milli = -(-memory_mib * MILLI_PER_GPU // card_mib) if card_mib > 0 else 0  # rounded up: never undercharge
    held = min(MILLI_PER_GPU, max(milli, memory_milli))
    by_vendor = ((vendor, count * held),) if vendor and held else ()
    return Quota(count * held, count * memory_mib, count * milli // 10, by_vendor)


@dataclass(frozen=True, slots=True)
class QueueSpec:
    name: str
    guaranteed: Quota = ZERO
    maximum: Quota = NO_LIMIT
    parent: str | None = None
    weight: int = 1  # share of what is left over (used by the replay's fair ordering)
    lend: bool = True
    borrow: bool = True
    # The dimensions this queue's quota counts (those its object declares): a queue that sets only GPUs is
    # not held to a GPU-memory guarantee of zero.
    dims: frozenset[str] = frozenset(DIMENSIONS)
    # Per vendor, the most gpu_milli of its cards the queue (its subtree) may hold: (vendor, milli) sorted by
    # vendor; a vendor left out is held only by `maximum`.
    vendor_maximum: VendorMilli = ()

    def over_guarantee(self, amount: Quota) -> list[str]:
        return [d for d in amount.exceeds(self.guaranteed) if d in self.dims]

    def within_guarantee(self, amount: Quota) -> bool:
        return not self.over_guarantee(amount)

    def borrowed(self, usage: Quota) -> Quota:
        """Usage beyond the guarantee, in the counted dimensions."""
        return self._counted((usage - self.guaranteed).positive())

    def idle(self, usage: Quota) -> Quota:
        """Guarantee not in use, in the counted dimensions."""
        return self._counted((self.guaranteed - usage).positive())

    def _counted(self, amount: Quota) -> Quota:
        g, m, c = (v if d in self.dims else 0 for d, v in zip(DIMENSIONS, amount.values(), strict=True))
        return Quota(g, m, c, amount.by_vendor if "gpu_milli" in self.dims else ())


class QueueConfigError(ValueError):
    """A queue tree that cannot be used, with every problem found."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class QueueTree:
    """Validated queues. Build with `QueueTree.build`."""

    specs: Mapping[str, QueueSpec]
    children: Mapping[str | None, tuple[str, ...]]  # None: the top-level queues
    capacity: Quota | None = None

    @staticmethod
    def build(specs: Iterable[QueueSpec], capacity: Quota | None = None) -> QueueTree:
        by_name: dict[str, QueueSpec] = {}
        problems: list[str] = []
        for spec in specs:
            if spec.name in by_name:
                problems.append(f"queue {spec.name!r} is defined twice")
            by_name[spec.name] = spec
        children: dict[str | None, list[str]] = {None: []}
        for spec in by_name.values():
            if spec.parent is not None and spec.parent not in by_name:
                problems.append(f"queue {spec.name!r}: parent {spec.parent!r} does not exist")
                continue
            children.setdefault(spec.parent, []).append(spec.name)
            if not spec.guaranteed.fits_in(spec.maximum):
                dims = ", ".join(spec.guaranteed.exceeds(spec.maximum))
                problems.append(f"queue {spec.name!r}: guarantee above maximum in {dims}")
            if spec.weight < 0:
                problems.append(f"queue {spec.name!r}: weight {spec.weight} is negative")
            if any(v < 0 for v in spec.guaranteed.values()):
                problems.append(f"queue {spec.name!r}: negative guarantee")
            problems.extend(f"queue {spec.name!r}: negative maximum for {vendor} GPUs"
                            for vendor, milli in spec.vendor_maximum if milli < 0)
        for name in by_name:
            seen: set[str] = set()
            cur: str | None = name
            while cur is not None and cur in by_name:
                if cur in seen:
                    problems.append(f"queue {name!r}: its parents form a cycle")
                    break
                seen.add(cur)
                cur = by_name[cur].parent
        for parent, kids in children.items():
            if parent is None:
                continue
            total = sum((by_name[k].guaranteed for k in kids), ZERO)
            over = by_name[parent].over_guarantee(total)
            if over:
                dims = ", ".join(over)
                problems.append(f"queue {parent!r}: its children are guaranteed more than it is ({dims})")
        if problems:
            raise QueueConfigError(sorted(set(problems)))
        return QueueTree(by_name, {k: tuple(sorted(v)) for k, v in children.items()}, capacity)

    def is_leaf(self, name: str) -> bool:
        return not self.children.get(name)

    def chain(self, name: str) -> list[str]:
        """The queue and its ancestors, leaf first."""
        out = [name]
        parent = self.specs[name].parent
        while parent is not None:
            out.append(parent)
            parent = self.specs[parent].parent
        return out

    def root_guarantee(self) -> Quota:
        top = sum((self.specs[n].guaranteed for n in self.children.get(None, ())), ZERO)
        return top if self.capacity is None else top.elementwise_max(self.capacity)

    def subtree_usage(self, usage: Mapping[str, Quota]) -> dict[str, Quota]:
        """Usage of every queue including its descendants (`usage` is per leaf queue)."""
        out: dict[str, Quota] = {name: ZERO for name in self.specs}
        for leaf, amount in usage.items():
            if leaf in self.specs:
                for name in self.chain(leaf):
                    out[name] = out[name] + amount
        return out


@dataclass(frozen=True, slots=True)
class Admitted:
    borrowing: bool  # beyond its queue's guarantee: such pods are the ones reclaim may take back


@dataclass(frozen=True, slots=True)
class Refused:
    reason: str
    queue: str
    # True when reclaiming from borrowers cannot help (past a maximum, borrowing disabled, unknown queue)
    final: bool = True


Decision = Admitted | Refused


def fmt(dimension: str, value: int) -> str:
    """A quota figure as a person reads it."""
    if value >= UNLIMITED // 2:
        return "unlimited"
    if dimension == "gpu_milli":
        return f"{value / MILLI_PER_GPU:g} GPUs"
    if dimension == "memory_mib":
        return f"{value / 1024:g} GiB GPU memory"
    return f"{value:g} % GPU cores"


def _over(name: str, what: str, dims: list[str], used: Quota, limit: Quota) -> str:
    first = dims[0]
    u, lim = getattr(used, first), getattr(limit, first)
    return f"queue {name}: {fmt(first, u).split(' ', 1)[0]} of {fmt(first, lim)} {what}"


def admit(tree: QueueTree, usage: Mapping[str, Quota], queue: str, charge: Quota) -> Decision:
    """May a pod of `queue` charged `charge` start, given the per-leaf-queue `usage` (pods running and
    bound, the pod itself excluded)?"""
    if queue not in tree.specs:
        return Refused(f"queue {queue} does not exist", queue)
    if not tree.is_leaf(queue):
        return Refused(f"queue {queue} has child queues; pods join leaf queues only", queue)
    sub = tree.subtree_usage(usage)
    chain = tree.chain(queue)
    after = {name: sub[name] + charge for name in chain}
    for name in chain:
        spec = tree.specs[name]
        over = after[name].exceeds(spec.maximum)
        if over:
            return Refused(_over(name, "maximum", over, after[name], spec.maximum), name)
        for vendor, most in spec.vendor_maximum:
            # Only a pod that adds to this vendor's cards can pass its maximum; others are not held to it.
            held = after[name].vendor_milli(vendor)
            if charge.vendor_milli(vendor) > 0 and held > most:
                return Refused(f"queue {name}: {held / MILLI_PER_GPU:g} of {most / MILLI_PER_GPU:g} {vendor} GPUs "
                               "maximum", name)
    for name in chain:
        spec = tree.specs[name]
        over = spec.over_guarantee(after[name])
        if not over:
            # Within this level's guarantee: what its siblings borrowed is reclaimed for it if need be.
            return Admitted(borrowing=name != queue)
        head = _over(name, "guaranteed", over, after[name], spec.guaranteed)
        if not spec.borrow:
            return Refused(f"{head}, cannot borrow: borrowing disabled", name)
        parent = spec.parent
        total = ZERO
        for sib in tree.children.get(parent, ()):
            used = after.get(sib, sub[sib])
            s = tree.specs[sib]
            total = total + (used if s.lend else used.elementwise_max(s.guaranteed))
        if parent is None:
            limit, counted = tree.root_guarantee(), set(over)
        else:
            limit, counted = tree.specs[parent].guaranteed, set(over) & tree.specs[parent].dims
        if all(getattr(total, d) <= getattr(limit, d) for d in counted):
            return Admitted(borrowing=True)  # the parent's guarantee covers what this level borrows
        if parent is None:
            return Refused(f"{head}, cannot borrow: cohort full", name, final=False)
        if not set(tree.specs[parent].over_guarantee(after[parent])) & set(over):
            # The parent is within its guarantee, but siblings that do not lend keep theirs reserved.
            return Refused(f"{head}, cannot borrow: queue {parent} full", name, final=False)
        # The whole parent subtree is past its guarantee: it borrows one level up.
    return Admitted(borrowing=True)


@dataclass(frozen=True, slots=True)
class QueueStatus:
    """What a queue's status (and the views) show."""

    name: str
    usage: Quota
    guaranteed: Quota
    maximum: Quota
    borrowed: Quota  # usage beyond the guarantee
    lent: Quota  # idle guarantee others may use (0 for a queue that does not lend)
    pending: int = 0
    extra: Mapping[str, str] = field(default_factory=dict)


def statuses(tree: QueueTree, usage: Mapping[str, Quota], pending: Mapping[str, int]) -> list[QueueStatus]:
    sub = tree.subtree_usage(usage)
    out: list[QueueStatus] = []
    for name in sorted(tree.specs):
        spec = tree.specs[name]
        used = sub[name]
        lent = spec.idle(used) if spec.lend else ZERO
        waiting = sum(n for leaf, n in pending.items() if leaf in tree.specs and name in tree.chain(leaf))
        out.append(QueueStatus(name, used, spec.guaranteed, spec.maximum, spec.borrowed(used),
                               lent, waiting))
    return out
