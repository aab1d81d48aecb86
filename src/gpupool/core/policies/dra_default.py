"""`dra-default`: what a stock kube-scheduler does with a pod whose GPU share comes through a DRA ResourceClaim.

The model is of Kubernetes 1.37 with its default plugins and gpupool's DRA driver (gpupool.api.dra: one shared
device per GPU, `allowMultipleAllocations: true`, consumable capacities `memory` and `cores`), the claim
asking with an `exactly` request (no `firstAvailable` alternatives). It is a baseline: no fragmentation
awareness anywhere. The sources are kubernetes/kubernetes; the 1.37 release itself could not be read, so each
choice below is what the most recent stored sources say, and where they might have changed is noted.

Device choice inside a node (`choose`): first fit in index order.
  The structured-parameters allocator (staging/src/k8s.io/dynamic-resource-allocation/structured/internal/
  {stable,incubating,experimental}/allocator_*.go, `allocateOne`) walks pools, then the node's ResourceSlices,
  then each slice's devices in the order published, and takes the first device that passes the selectors
  and, with consumable capacity, whose remaining capacity covers the request (`CmpRequestOverCapacity`). It
  does not compare candidates. The next device of a multi-device request is searched from the following
  position on, so a request for `count` devices gets the first `count` fitting devices. gpupool's driver
  publishes `gpu-<index>` in index order, so "first" is "lowest GPU index", which is `first_gpus`.

Node choice (`score`): the sum of the default score plugins that can tell nodes apart here.
  - DynamicResources has a Score, but it only adds points for `firstAvailable` sub-requests (the earlier the
    chosen alternative, the more); an `exactly` request scores 0 on every node
    (pkg/scheduler/framework/plugins/dynamicresources/dynamicresources.go, `computeScore`). No DRA scoring
    looks at capacity left on devices. The node-allocatable DRA resources (nodeallocatabledynamicresources.go)
    only filter, and only for devices that declare `nodeAllocatableResources`, which ours do not.
  - NodeResourcesFit, LeastAllocated over cpu and memory, weight 1 each, plugin weight 1
    (pkg/scheduler/apis/config/v1/default_plugins.go; noderesources/least_allocated.go): per resource
    floor((allocatable - requested) * 100 / allocatable), 0 once requested exceeds allocatable, then the
    integer mean. `requested` is the node's sum plus the pod's, with the "non-zero" defaults for scoring: a
    request of 0 counts as 100m CPU or 200 MiB. The devices of a claim are not node resources, so GPU memory
    and cores never enter it (DRA-backed extended resources would, but a claim is not one).
  - NodeResourcesBalancedAllocation, plugin weight 1 (noderesources/balanced_allocation.go): fractions
    requested/allocatable of cpu and memory (actual requests, not the non-zero ones; capped at 1), score
    trunc((1 - |f_cpu - f_mem| / 2) * 100). A best-effort pod (no cpu or memory request) skips it.
  - TaintToleration, NodeAffinity, PodTopologySpread, InterPodAffinity, ImageLocality: a trace has no taints,
    affinities, spread constraints, owners or images, so they give every node the same score and are left out.
  Memory is MiB here and bytes in Kubernetes: both formulas are ratios of integers scaled by the same power of
  two, so floor and float64 give the same numbers in either unit.

Which nodes are scored: percentageOfNodesToScore (pkg/scheduler/schedule_one.go, `numFeasibleNodesToFind`,
  `findNodesThatPassFilters`). With the default 0 and 100 or more nodes, filtering stops after
  max(100, n * max(5, 50 - n/125) / 100) feasible nodes (1,213 nodes: 41 %, 497 nodes); it starts at the node
  after the last one the previous pod's search reached (`nextStartNodeIndex`, round robin). The model walks the
  nodes sequentially from that index in state order (the scheduler walks its node tree, zones interleaved, with
  16 goroutines, so its stop point differs by a few nodes), scores the first feasible ones, and keeps the next
  start index in `ctx.cache`. Nodes outside the window score -1, below any scored node (every score is >= 0).

Ties: the scheduler takes one of the top-scored nodes uniformly at random (a random key per node in its score
  heap, reservoir sampling in older releases). The integer score plus a draw from `ctx.rng` in [0, 0.5) does
  the same: the top integer score always wins, and among equals the draw decides, uniformly. The context's
  node rank is therefore never used.

Left out: opportunistic batching (pods with DRA claims are not signable, so it never applies to them), the
  non-zero defaults of pods already on a node (state keeps actual requests; the bundled traces have no pod
  with a zero CPU request and one with a zero memory request), preemption, and the scheduler's queue.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpupool.core.model import PodRequest
from gpupool.core.policies.common import first_gpus
from gpupool.core.policy import FloatArray, PolicyContext
from gpupool.core.state import BoolArray, ClusterState, IntArray

MAX_NODE_SCORE = 100
# kube-scheduler's scoring defaults for a container with no request (pkg/scheduler/util: DefaultMilliCPURequest
# and DefaultMemoryRequest, 200 MiB), so that such pods still spread.
NON_ZERO_CPU_MILLI = 100
NON_ZERO_MEMORY_MIB = 200
MIN_FEASIBLE_NODES_TO_FIND = 100
MIN_FEASIBLE_PERCENTAGE = 5
TIE_JITTER = 0.5  # below 1, the smallest gap between two integer scores: jitter never reorders unequal ones
OUTSIDE_WINDOW = -1.0
START_KEY = "dra-default:next-start-node"


def num_feasible_nodes_to_find(num_all_nodes: int, percentage: int = 0) -> int:
    """How many feasible nodes the scheduler collects before it stops filtering (0: the adaptive default)."""
    if num_all_nodes < MIN_FEASIBLE_NODES_TO_FIND:
        return num_all_nodes
    if percentage <= 0:
        percentage = max(50 - num_all_nodes // 125, MIN_FEASIBLE_PERCENTAGE)
    return max(num_all_nodes * min(percentage, 100) // 100, MIN_FEASIBLE_NODES_TO_FIND)


def least_allocated(state: ClusterState, pod: PodRequest, nodes: IntArray) -> IntArray:
    """NodeResourcesFit's LeastAllocated score (0-100) on cpu and memory, equal weights."""
    cpu_pod = pod.cpu_milli or NON_ZERO_CPU_MILLI
    mem_pod = pod.memory_mib or NON_ZERO_MEMORY_MIB
    parts = []
    for total, free, asked in ((state.cpu_total, state.cpu_free, cpu_pod), (state.mem_total, state.mem_free, mem_pod)):
        alloc = total[nodes]
        requested = alloc - free[nodes] + asked
        safe = np.maximum(alloc, 1)  # a node without the resource scores 0 on it (guarded below)
        score = (alloc - requested) * MAX_NODE_SCORE // safe
        parts.append(np.where((alloc > 0) & (requested <= alloc), score, 0))
    result: IntArray = (parts[0] + parts[1]) // 2
    return result


def balanced_allocation(state: ClusterState, pod: PodRequest, nodes: IntArray) -> IntArray:
    """NodeResourcesBalancedAllocation's score (0-100) on cpu and memory; 0 everywhere for a best-effort pod."""
    if pod.cpu_milli == 0 and pod.memory_mib == 0:
        return np.zeros(len(nodes), dtype=np.int64)
    fractions = []
    for total, free, asked in ((state.cpu_total, state.cpu_free, pod.cpu_milli),
                               (state.mem_total, state.mem_free, pod.memory_mib)):
        alloc = total[nodes]
        requested = alloc - free[nodes] + asked
        fractions.append(np.minimum(requested / np.maximum(alloc, 1), 1.0))
    std = np.abs(fractions[0] - fractions[1]) / 2
    # A resource the node has none of drops out of the standard deviation: with one resource left it is 0.
    std = np.where((state.cpu_total[nodes] > 0) & (state.mem_total[nodes] > 0), std, 0.0)
    result: IntArray = np.trunc((1.0 - std) * MAX_NODE_SCORE).astype(np.int64)
    return result


def kube_scores(state: ClusterState, pod: PodRequest, nodes: IntArray) -> IntArray:
    """The default profile's total for the plugins that differ between nodes here (both of weight 1)."""
    result: IntArray = least_allocated(state, pod, nodes) + balanced_allocation(state, pod, nodes)
    return result


def scored_window(num_all_nodes: int, start: int, nodes: IntArray, percentage: int = 0) -> tuple[BoolArray, int]:
    """Which of the feasible `nodes` (node indices) the scheduler scores when its search starts at `start`,
    and where the next pod's search starts. Walking in index order from `start` (wrapping), the search stops
    when it meets one more feasible node than it needs; that node is where the next search begins. With too
    few feasible nodes every node is checked, which brings the start back where it was."""
    want = num_feasible_nodes_to_find(num_all_nodes, percentage)
    if len(nodes) <= want:
        return np.ones(len(nodes), dtype=bool), start
    position = (nodes - start) % num_all_nodes
    order = np.argsort(position, kind="stable")
    window = np.zeros(len(nodes), dtype=bool)
    window[order[:want]] = True
    return window, int((start + position[order[want]]) % num_all_nodes)


@dataclass(frozen=True, slots=True)
class DraDefault:
    """kube-scheduler's default plugins over DRA claims: spread by CPU and memory, first fitting GPUs."""

    name: str = "dra-default"
    percentage_of_nodes_to_score: int = 0  # the scheduler's setting; 0 = adaptive, 100 = every feasible node

    def score(
        self, state: ClusterState, pod: PodRequest, nodes: IntArray, gpu_fit: BoolArray, ctx: PolicyContext
    ) -> FloatArray:
        total = kube_scores(state, pod, nodes).astype(np.float64)
        start = int(ctx.cache.get(START_KEY, 0)) % max(len(state), 1)
        window, next_start = scored_window(len(state), start, nodes, self.percentage_of_nodes_to_score)
        # One scheduling cycle per call: the placement step scores each pod once (gpupool.sim.engine,
        # gpupool.core.placement), as kube-scheduler searches once per pod.
        ctx.cache[START_KEY] = next_start
        jitter = ctx.rng.random(len(nodes)) * TIE_JITTER
        result: FloatArray = np.where(window, total + jitter, OUTSIDE_WINDOW)
        return result

    def choose(
        self, state: ClusterState, pod: PodRequest, node: int, gpu_fit: BoolArray, ctx: PolicyContext
    ) -> tuple[int, ...]:
        return first_gpus(pod, gpu_fit)
