"""The scheduler's background defragmenter for remote shares (config `defrag_moves` > 0; 0, the default: off).

On the leader, every `defrag_interval_s`: when the fragmentation of the GPUs with a GPU server (the share of
their free compute that is not on a whole free GPU, gpupool.core.defrag.fragmentation) is above
`defrag_threshold`, one round of gpupool.core.defrag.plan_defrag: GPUs whose every holder is a movable remote
share are emptied into fuller GPU servers, best fit, each share to another node than the one it leaves, the
sources chosen by the fragmentation they remove (for the workload the scheduler observes, when it has seen
enough pods) per GiB moved; at most `defrag_moves` moves and `defrag_gib` GiB (0: no limit) a round. The
simulator runs the same rule (`gpupool.sim.replay`, `DefragPolicy`).

What may move, and how, is what MakeRoom uses (gpupool.scheduler.moves): the remote one-GPU claims with no
unfinished move (`movable_shares`), on a copy of the ledger's state where only GPUs with a GPU server (the
untainted devices with a `remoteServer` attribute in the newest ResourceSlices, listed each round as
`gpupool migrate` lists them) take a share; the round's moves are written as any move (`requested`, with the
move deadline, `start_moves`) and each moved claim gets a Normal Event `Defragmenting`. The agents carry them
out and the leader's deadline check cancels one that does not finish. One round at a time: while a move of the
last round is unfinished no other is planned.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

from gpupool.api.logsafe import shown
from gpupool.api.moves import DEFAULT_DEADLINE_S, GpuRef, new_move
from gpupool.cluster.port import RESOURCE_SLICES, ApiError
from gpupool.core.defrag import DefragPlan, fragmentation, plan_defrag
from gpupool.core.frag import WorkloadArrays
from gpupool.core.moves import MIB_PER_GIB
from gpupool.scheduler.beat import Beat
from gpupool.scheduler.claims import usable_devices
from gpupool.scheduler.framework.interface import Handle
from gpupool.scheduler.moves import movable_shares, server_state, start_moves

log = logging.getLogger(__name__)


class Defragmenter:
    """On the leader: a defragmentation round every `interval_s` when it is due (see the module doc)."""

    def __init__(self, handle: Handle, ready: Callable[[], bool], max_moves: int, threshold: float = 0.5,
                 interval_s: float = 60.0, max_gib: float = 0.0, deadline_s: float = DEFAULT_DEADLINE_S) -> None:
        self.h = handle
        self.ready = ready
        self.max_moves = max_moves
        self.threshold = threshold
        self.interval_s = interval_s
        self.max_gib = max_gib
        self.deadline_s = deadline_s
        self.in_flight: set[str] = set()  # claim UIDs the last round moves
        self.started = 0  # moves started (tests, metrics)
        self.rounds = 0  # rounds that started moves
        self._beat = Beat("defragmenter", interval_s, ready, self.round_once, (ApiError,),
                          "defragmentation round not done")

    def plan(self, servers: Mapping[str, Iterable[int]]) -> DefragPlan | None:
        """The round's plan on the ledger as it is (None: not due, below the threshold or nothing to do)."""
        if self.max_moves <= 0:
            return None
        state, usable = server_state(self.h.ledger.state, servers)
        if fragmentation(state, usable) <= self.threshold:
            return None
        workload = self.h.workload.current
        measure = WorkloadArrays.build(state, workload) if workload else None
        plan = plan_defrag(state, movable_shares(self.h.ledger), self.max_moves,
                           int(self.max_gib * MIB_PER_GIB) if self.max_gib > 0 else None, rank=self.h.ledger.rank,
                           usable=usable, off_node=True, measure=measure)
        return plan if plan.moves else None

    async def round_once(self) -> DefragPlan | None:
        """One round now: the plan whose moves were written, or None (a move of the last round is unfinished,
        nothing is due, or the moves could not be written)."""
        moves = self.h.ledger.moves
        if any(uid in moves and not moves[uid].finished for uid in self.in_flight):
            return None
        self.in_flight.clear()
        if self.max_moves <= 0:
            return None
        slices, _ = await self.h.cluster.list_objects(RESOURCE_SLICES)
        plan = self.plan(usable_devices(slices).remote)
        if plan is None:
            return None
        now = self.h.clock()
        entries = {m.key: new_move(self.h.ledger.entries[m.key].key, GpuRef(*m.source), GpuRef(*m.target), now,
                                   self.deadline_s) for m in plan.moves}
        if not await start_moves(self.h.cluster, self.h.config.own_namespace(), entries):
            return None
        self.in_flight = set(entries)
        self.started += len(entries)
        self.rounds += 1
        log.info("defragmenting: moving %d remote share(s) (%.2f GiB) to free %d GPU(s): %s", len(entries), plan.gib,
                 len(plan.freed), ", ".join(f"claim {shown(m.claim)} {m.source} -> {m.target}"
                                            for m in entries.values()))
        for uid, move in entries.items():
            claim = self.h.ledger.claim_objs.get(uid) or {}
            namespace, _, name = move.claim.partition("/")
            await self.h.record_event(namespace, name, uid, "Defragmenting",
                                      f"gpupool: moving the share {move.source} -> {move.target} to free whole GPUs"
                                      f" ({len(entries)} move(s), {plan.gib:.2f} GiB this round)"[:1024], "Normal",
                                      kind="ResourceClaim",
                                      api_version=str(claim.get("apiVersion", "resource.k8s.io/v1")))
        return plan

    @property
    def running(self) -> bool:
        return self._beat.running

    def start(self) -> None:
        if self.max_moves > 0:
            self._beat.start()

    async def stop(self) -> None:
        await self._beat.stop()
