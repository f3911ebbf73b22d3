"""Topology-aware collective costs: α-β per tier, ring / tree / NVLS / hierarchical algorithms.

A group of ``n`` ranks occupies global ranks ``o, o + stride, ..., o + (n-1)·stride``. Tiers are
nested domains of consecutive ranks (``TopologyTier.num_devices``: 8 for an NVLink node, 72 for
an NVL72 rack, 3,072 for a pod...), so the rank positions decide which tiers the group spans:
TP=8 with stride 1 stays on NVLink, a DP group with stride 64 crosses nodes and maybe pods. Where
the innermost tier sets ``job_devices`` a job fills only that many devices of each of its
domains (GB200 NVL72: 64 of a rack's 72 GPUs) when the job spans several of them, and the
domains count ranks that way (``rank_domains``). Without ``world_size`` the group at ``o = 0``
is priced. With it (the job's ranks ``0 .. world_size-1``), the groups of the mesh axis tile the
job (``o = r + b·n·stride``, ``r < stride``; a send/recv of a ring of ``n`` ranks: each hop
``(x, x + stride)`` inside a block of ``n·stride`` ranks) and the slowest one is
priced, since the step waits for it: where tier sizes do not divide the groups' layout (72 GPUs
per rack and EP=32, or the 64-GPU racks and PP stages of 32 ranks) some groups straddle a rack
and cross the network while the group at rank 0 does not. The distinct placements are
enumerated once per shape (``_group_offsets``: the layout repeats with the lcm of the block
``n·stride`` and the tier sizes that cut it) and each distinct level structure is priced.

Notation (per call): ``S`` = message bytes per rank (``ir.ops.PARAMS_BY_KIND``: the full buffer of
an all-reduce, the gathered output of an all-gather, the input of a reduce-scatter, the send buffer
of an all-to-all, the payload of a send/recv); ``k_t`` = most group ranks inside one tier-``t``
domain (``k_{-1} = 1``, ``k_T = n`` at the outermost spanned tier ``T``), ``k^min_t`` the fewest
in an occupied one; ``m_t`` the fan-out at level ``t``, most occupied tier-``(t-1)`` domains
inside one tier-``t`` domain (``k_t / k_{t-1}`` when every domain holds as many ranks);
``B_t`` = per-GPU bandwidth of tier ``t`` times its calibrated efficiency, divided by the
contention factor; ``α_t`` the calibrated per-step latency.

Algorithms (NCCL-like; ``algo=None`` picks the fastest available):

* ``ring`` on one tier: all-reduce ``2(n-1)/n·S/B + 2(n-1)·α``; all-gather / reduce-scatter
  ``(n-1)/n·S/B + (n-1)·α``. Across tiers (multi-channel ring, each lower domain crossing through
  its ``k_{t-1}`` NICs): the bandwidth term is the bottleneck ``max_t factor·S/(k_{t-1}·B_t)``;
  each step pays the α of the tier its hop crosses (NCCL's tuning model: of an all-reduce's
  ``2(n-1)`` steps, ``2·nNodes`` cross the network; ``_ring_latency``).
* ``tree`` (double binary tree, all-reduce): ``2·S/B_min + 2·Σ_t ceil(log2 m_t)·α_t``, except
  that an innermost level that is one node (a DGX/HGX NVSwitch, a PCIe box) is a chain
  (``m_0 − 1`` steps: NCCL's tuning model ``2·((nRanks/nNodes − 1)·intraLat +
  log2(nNodes)·interLat)``; ``_tree_latency``), on one tier as across tiers.
* ``nvls`` (NVLink SHARP, in-switch reduction) where a tier lists it: all-reduce ``S/B + 2α``;
  all-gather / reduce-scatter ``(n-1)/n·S/B + 2α``.
* ``hierarchical`` for groups crossing tiers: reduce-scatter inside each level from the innermost
  out (level ``t`` works on ``S/k^min_{t-1}`` bytes over ``m_t`` ranks: a domain holding fewer
  ranks leaves each a larger shard for the next stage, which its fewer NICs carry), all-reduce
  among the outermost level's ``m_T`` ranks, then all-gather back. All-gather /
  reduce-scatter use half of it.
* ``pairwise`` all-to-all: every rank sends ``S/n`` to each peer; the ``p_t = k_t - k^min_{t-1}``
  peers a rank of the smallest tier-``(t-1)`` domain first reaches at tier ``t`` go over
  ``B_t``: ``max_t S·p_t/n/B_t + α_0 + Σ_{t>0} p_t·α_t``. Inside the innermost tier (an
  NVLink switch domain) the sends to all peers are in flight at once (NCCL groups them; EP
  kernels write every peer in one launch), so that tier adds one latency ``α_0``
  (``<tier>.pairwise``, fitted to measured NCCL all-to-all: aiconfigurator's 2-8-GPU tables
  rise by 0.15-0.25 us per peer at 512 B, not by a ring step's α); across a network tier
  every peer is a separate message, ``α_t`` each.
* ``p2p`` send/recv between ranks ``0`` and ``stride``: ``S/B_T + α_T`` on the tier they share.

Contention: ``concurrent_groups`` groups of the same shape communicate at once (e.g. the 8 DP
groups of a node, one per TP rank). A tier's uplinks out of a lower domain of ``D`` devices carry
``D·bw/oversubscription``; with ``A = min(D, k·concurrent_groups)`` active senders each gets
``min(bw, D·bw/(oversubscription·A))``. A non-blocking tier (oversubscription 1, e.g.
rail-optimized NICs, one per GPU) never slows down; Llama 3's 1:7 aggregation layer does when
many groups cross it.

Every call adds ``calibration.collective_launch_s`` once (kernel launch / NCCL setup).
NB: not modelled: protocol switching (LL/LL128/Simple), channel counts, PXN, SHARP in IB switches,
congestion between different collectives (the simulator shares tiers between concurrent ops).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from charon_search.errors import ConfigError
from charon_search.ir.ops import COMM_KINDS, OpKind

if TYPE_CHECKING:
    from charon_search.hardware.spec import ClusterSpec, TopologyTier

__all__ = [
    "ALGORITHMS",
    "CollectiveEstimate",
    "collective_bus_bandwidth",
    "collective_time",
    "estimate_collective",
    "group_tiers",
    "rank_domains",
]

ALGORITHMS = ("ring", "tree", "nvls", "hierarchical", "pairwise", "p2p")
_PROBE_BYTES = float(2**30)


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectiveEstimate:
    """The cost of one collective and how it was reached."""

    duration_s: float
    algorithm: str
    """The algorithm chosen (or forced)."""
    tiers: tuple[str, ...]
    """Tiers the group spans, innermost first."""
    bottleneck_tier: str
    """The tier whose bandwidth term is largest."""
    candidates: tuple[tuple[str, float], ...] = ()
    """Every algorithm considered with its duration."""


@dataclass(frozen=True, slots=True)
class _Level:
    tier_idx: int
    k_prev: int
    """Most group ranks inside one domain of the tier below (1 at the innermost level)."""
    k_prev_min: int
    """Fewest group ranks inside an occupied domain of the tier below (their NICs carry rings)."""
    k: int
    """Most group ranks inside one domain of this tier."""
    m: int
    """Fan-out: most occupied domains of the tier below inside one domain of this tier."""
    parts: int
    """Occupied domains of the tier below over the whole group (``k`` ranks at the innermost
    level are ``k`` parts)."""


@functools.lru_cache(maxsize=4096)
def _levels(n: int, stride: int, sizes: tuple[int, ...], offset: int = 0
            ) -> tuple[_Level, ...]:
    """The levels the group of ``n`` ranks ``offset + i·stride`` spans (exact counting of
    domains)."""
    ranks = [offset + i * stride for i in range(n)]
    out: list[_Level] = []
    k_prev, k_prev_min, below = 1, 1, 1
    for idx, size in enumerate(sizes):
        counts: dict[int, int] = {}
        subs: dict[int, set[int]] = {}
        for r in ranks:
            d = r // size
            counts[d] = counts.get(d, 0) + 1
            subs.setdefault(d, set()).add(r // below)
        k, k_min = max(counts.values()), min(counts.values())
        if k > k_prev:
            out.append(_Level(tier_idx=idx, k_prev=k_prev, k_prev_min=k_prev_min, k=k,
                              m=max(len(v) for v in subs.values()),
                              parts=len({r // below for r in ranks})))
        if k == n:
            break
        k_prev, k_prev_min, below = k, k_min, size
    return tuple(out)


@functools.lru_cache(maxsize=4096)
def _group_offsets(n: int, stride: int, sizes: tuple[int, ...], world: int | None,
                   ring: int) -> tuple[int, ...]:
    """First ranks of the groups whose placements differ, among the groups of the axis that
    tile ranks ``0 .. world-1`` (``(0,)`` without ``world``).

    Collective groups start at ``o = r + b·n·stride`` (``r < stride``). A tier of ``T`` ranks
    cuts no group when ``T`` is a multiple of the block ``n·stride`` or holds the whole job
    (``T >= world``); the other tiers' boundaries repeat with ``q = lcm(n·stride, T...)``, so
    offsets below ``q`` cover every placement, and ``r`` matters only where such a ``T`` and
    ``stride`` do not divide one another. When every cutting tier is a multiple or a divisor of
    the block (and of the stride) all groups lie alike and only ``o = 0`` is returned.

    Send/recv pairs (``ring`` > 0: the hops of the axis' rings of ``ring`` ranks, blocks of
    ``ring·stride`` ranks; pipeline stages and CP rings) are ``(x, x + stride)`` with both ends
    in one block. A tier boundary ``B`` (a multiple of ``T``) is crossed by a hop unless it is a
    block edge; the first crossing boundary of each tier smaller than the job gives one pair
    (``x = B - stride``, or the block's first rank where ``B`` lies less than ``stride`` past
    a block edge), and those and ``0`` cover the tiers a hop can share. Boundaries repeat with
    ``lcm(T, ring·stride)``.
    """
    span = (n - 1) * stride + 1
    if world is None or world <= span:
        return (0,)
    if ring:
        block = ring * stride
        out = {0}
        for t in sizes:
            for b in range(t, min(world, math.lcm(t, block)), t):
                if b % block:
                    x = b - stride if b % block >= stride else b - b % block
                    if x + stride < world:
                        out.add(x)
                    break
        return tuple(sorted(out))
    block = n * stride
    cutting = [t for t in sizes if t < world and t % block]
    if all(block % t == 0 and (t % stride == 0 or stride % t == 0) for t in cutting):
        return (0,)
    q = math.lcm(block, *cutting)
    last = min(world - span, q - 1)
    rs = range(1) if all(t % stride == 0 or stride % t == 0 for t in cutting) else range(stride)
    return tuple(o for b in range(0, last + 1, block) for r in rs if (o := b + r) <= last)


def _kind(kind: OpKind | str) -> OpKind:
    try:
        k = OpKind(kind)
    except ValueError:
        k = None
    if k is None or k not in COMM_KINDS:
        raise ConfigError(
            f"collective kind must be one of {sorted(x.value for x in COMM_KINDS)}, "
            f"but got {kind!r}"
        )
    return k


def group_tiers(group_size: int, cluster: ClusterSpec, *, stride: int = 1) -> tuple[str, ...]:
    """Names of the tiers a group of ``group_size`` ranks at ``stride`` communicates over."""
    _check_group(group_size, stride, cluster)
    if group_size <= 1:
        return ()
    sizes = rank_domains(cluster)
    return tuple(cluster.tiers[lv.tier_idx].name for lv in _levels(group_size, stride, sizes))


def rank_domains(cluster: ClusterSpec, world_size: int | None = None) -> tuple[int, ...]:
    """Consecutive global ranks per domain of each tier, innermost first: ``num_devices``, or,
    for a job of ``world_size`` ranks larger than one innermost domain where that tier sets
    ``job_devices`` (a job fills ``P`` of a domain's ``T`` devices: 64 of an NVL72 rack's 72,
    as schedulers place jobs of several racks), ``num_devices·P/T`` (a leaf of 8 racks holds
    512 job ranks); the outermost then grows to a multiple of that at least ``num_devices``,
    so that it still holds every rank. A job that fits one domain, a call without a job size
    (serving instances, single groups), or a job larger than the packed cluster holds
    (``P`` of every domain's devices) keeps ``num_devices``. The loader checks that the tiers
    nest."""
    tiers = cluster.tiers
    inner = tiers[0]
    plain = tuple(t.num_devices for t in tiers)
    if (not inner.job_devices or inner.job_devices == inner.num_devices or world_size is None
            or world_size <= inner.num_devices
            or world_size > tiers[-1].num_devices // inner.num_devices * inner.job_devices):
        return plain
    scaled = [t.num_devices // inner.num_devices * inner.job_devices for t in tiers]
    scaled[-1] *= -(-tiers[-1].num_devices // scaled[-1])
    return tuple(scaled)


def whole_number(name: str, value: float) -> int:
    """``value`` as an int if it is a whole number >= 1, else ``ConfigError`` naming ``name``."""
    try:
        ok = value >= 1 and int(value) == value
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        raise ConfigError(f"`{name}` must be a whole number >= 1, but got {value!r}")
    return int(value)


def _check_group(n: int, stride: int, cluster: ClusterSpec) -> None:
    if n < 1 or stride < 1:
        raise ConfigError(f"`group_size >= 1` and `stride >= 1` must hold, but got "
                          f"(group_size={n}, stride={stride})")
    span = (n - 1) * stride + 1
    outer = cluster.tiers[-1].num_devices
    if span > outer:
        raise ConfigError(
            f"a group of {n} ranks at stride {stride} spans {span} ranks, but cluster "
            f"{cluster.name} has {outer} devices in its outermost tier"
        )


class _Ctx:
    """View of the cluster for one group shape: α and effective bandwidth per level and
    algorithm (memoized, since the simulator asks about the same groups over and over)."""

    def __init__(self, cluster: ClusterSpec, levels: tuple[_Level, ...],
                 concurrent_groups: int) -> None:
        self.cluster = cluster
        self.levels = levels
        self.cal = cluster.calibration
        self.concurrent = max(1, int(concurrent_groups))
        self._alpha: dict[tuple[int, str], float] = {}
        self._bw: dict[tuple[_Level, str], float] = {}
        self._lines: dict[tuple[OpKind, int], tuple[tuple[str, float, float, str], ...]] = {}

    def tier(self, lv: _Level) -> TopologyTier:
        return self.cluster.tiers[lv.tier_idx]

    def alpha(self, lv: _Level, algo: str) -> float:
        key = (lv.tier_idx, algo)
        if key not in self._alpha:
            t = self.tier(lv)
            a = self.cal.collective_alpha_s
            self._alpha[key] = a.get(f"{t.name}.{algo}", a.get(t.name, t.latency_s))
        return self._alpha[key]

    def bw(self, lv: _Level, algo: str) -> float:
        key = (lv, algo)
        if key not in self._bw:
            self._bw[key] = self._compute_bw(lv, algo)
        return self._bw[key]

    def _compute_bw(self, lv: _Level, algo: str) -> float:
        """Effective per-rank bandwidth of the level's tier (efficiency and contention)."""
        t = self.tier(lv)
        e = self.cal.collective_bw_efficiency
        eff = e.get(f"{t.name}.{algo}", e.get(t.name, 1.0))
        bw = t.bandwidth_bytes_per_s * eff
        if t.oversubscription > 1.0:
            if lv.tier_idx == 0:
                domain, per_domain = t.num_devices, lv.k
            else:
                domain = self.cluster.tiers[lv.tier_idx - 1].num_devices
                per_domain = lv.k_prev
            active = min(domain, per_domain * self.concurrent)
            bw *= min(1.0, domain / (t.oversubscription * active))
        return bw

    def has(self, lv: _Level, algo: str) -> bool:
        return algo in self.tier(lv).algorithms

    @property
    def tier_names(self) -> tuple[str, ...]:
        return tuple(self.tier(lv).name for lv in self.levels)

    def lines(self, kind: OpKind, n: int) -> tuple[tuple[str, float, float, str], ...]:
        """Per candidate algorithm ``(name, a, b, bottleneck tier)`` with time ``a + b·S``.

        Every candidate is affine in the message size, so it is evaluated at two sizes once
        per group shape and kind; each later call is a handful of multiply-adds.
        """
        key = (kind, n)
        hit = self._lines.get(key)
        if hit is None:
            zero = self._candidates(kind, 0.0, n)
            probe = self._candidates(kind, _PROBE_BYTES, n)
            hit = tuple(
                (name.partition("/")[0], zero[name][0],
                 (probe[name][0] - zero[name][0]) / _PROBE_BYTES, probe[name][1])
                for name in sorted(probe)
            )
            self._lines[key] = hit
        return hit

    def _candidates(self, kind: OpKind, s: float, n: int) -> dict[str, tuple[float, str]]:
        if kind is OpKind.ALL_REDUCE:
            return _all_reduce(self, s, n)
        if kind in (OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER):
            return _gather_scatter(self, s, n)
        if kind is OpKind.ALL_TO_ALL:
            return _all_to_all(self, s, n)
        return _send_recv(self, s)


def _ring_single(factor_steps: float, s: float, n: float, bw: float, alpha: float) -> float:
    """``factor_steps`` = 2 for all-reduce, 1 for all-gather / reduce-scatter."""
    return factor_steps * (n - 1) / n * s / bw + factor_steps * (n - 1) * alpha


def _tree_latency(ctx: _Ctx) -> float:
    """Latency of a tree all-reduce over several levels, as NCCL's tuning model charges it
    (``src/graph/tuning.cc``, ``NCCL_ALGO_TREE``: ``2·((nRanks/nNodes − 1)·intraLat +
    log2(nNodes)·interLat)``): inside a node NCCL's tree is a chain, one step per rank of the
    node; across network tiers a binary tree, ``ceil(log2 m_t)`` steps at fan-out ``m_t``. Up
    and down: times 2.

    The chain applies where the innermost tier is one node (a DGX/HGX NVSwitch). An NVLink
    domain of several nodes (GB200 NVL72: 18 trays) keeps ``ceil(log2 m_0)`` steps there: NCCL
    runs NVLS / NVLS-tree in such a domain (in-switch reduction, a constant intra-domain
    latency), which this model has no multi-tier candidate for, and a 71-step chain would
    price a two-rack all-reduce of 64 KiB at 330 us where NVLS-tree takes tens of us."""
    lat = 0.0
    node = ctx.cluster.gpus_per_node
    for lv in ctx.levels:
        chain = lv.tier_idx == 0 and ctx.tier(lv).num_devices <= node
        steps = lv.m - 1 if chain else math.ceil(math.log2(lv.m))
        lat += 2 * steps * ctx.alpha(lv, "tree")
    return lat


def _ring_latency(ctx: _Ctx, n: int, *, all_reduce: bool) -> float:
    """Latency of a ring over several levels, as NCCL's tuning model charges it
    (``src/graph/tuning.cc``, ``NCCL_ALGO_RING``: ``(nsteps − nInterSteps)·intraLat +
    nInterSteps·interLat`` with ``nsteps = 2(n−1)``, ``nInterSteps = 2·nNodes`` for an
    all-reduce and ``n−1``, ``nNodes−1`` for an all-gather / reduce-scatter), extended to more
    than two tiers: one trip round the ring crosses ``D_j`` boundaries of the domains below
    level ``j`` (``D_j``: the occupied ones, ``_Level.parts``), ``D_j − D_{j+1}`` of them on
    level ``j``'s tier
    and no higher one; an all-reduce makes two trips, an all-gather / reduce-scatter one less
    one outermost hop. The other steps stay inside the innermost level and pay its α."""
    lvs = ctx.levels
    doms = [lv.parts for lv in lvs[1:]] + [0]
    total_steps = (2 if all_reduce else 1) * (n - 1)
    lat, outer_steps = 0.0, 0
    for j, lv in enumerate(lvs[1:]):
        hops = doms[j] - doms[j + 1]
        steps = 2 * hops if all_reduce else hops - (1 if j == len(lvs) - 2 else 0)
        outer_steps += steps
        lat += steps * ctx.alpha(lv, "ring")
    return lat + (total_steps - outer_steps) * ctx.alpha(lvs[0], "ring")


def _all_reduce(ctx: _Ctx, s: float, n: int) -> dict[str, tuple[float, str]]:
    """Candidate algorithms -> (seconds, bottleneck tier)."""
    lvs = ctx.levels
    out: dict[str, tuple[float, str]] = {}
    if len(lvs) == 1:
        lv = lvs[0]
        name = ctx.tier(lv).name
        out["ring"] = (_ring_single(2, s, n, ctx.bw(lv, "ring"), ctx.alpha(lv, "ring")), name)
        if ctx.has(lv, "tree"):
            # chain inside one node, binary tree over a network or a multi-node NVLink domain
            out["tree"] = (2 * s / ctx.bw(lv, "tree") + _tree_latency(ctx), name)
        if ctx.has(lv, "nvls"):
            out["nvls"] = (s / ctx.bw(lv, "nvls") + 2 * ctx.alpha(lv, "nvls"), name)
        return out
    # Flat ring across tiers: bottleneck bandwidth; each step pays the α of the tier its hop
    # crosses (NCCL's ring latency, ``_ring_latency``).
    terms = [(2 * (n - 1) / n * s / (lv.k_prev_min * ctx.bw(lv, "ring")), ctx.tier(lv).name)
             for lv in lvs]
    bw_s, neck = max(terms)
    out["ring"] = (bw_s + _ring_latency(ctx, n, all_reduce=True), neck)
    outer = lvs[-1]
    if ctx.has(outer, "tree"):
        terms = [(2 * s / (lv.k_prev_min * ctx.bw(lv, "tree")), ctx.tier(lv).name)
                 for lv in lvs]
        bw_s, neck = max(terms)
        out["tree"] = (bw_s + _tree_latency(ctx), neck)
    # Hierarchical: RS in, AR at the top (ring or tree: two variants, each affine in S), AG out.
    # Each stage is sized by the smallest occupied domain below it: its ranks hold the largest
    # shards (12 ranks as 8 + 4: the 4-GPU node's ranks hold S/4 and cross on 4 NICs).
    total, worst = 0.0, (-1.0, "")
    for lv in lvs[:-1]:
        part = 2 * _ring_single(1, s / lv.k_prev_min, lv.m, ctx.bw(lv, "ring"),
                                ctx.alpha(lv, "ring"))
        total += part
        worst = max(worst, (part, ctx.tier(lv).name))
    for top_algo, top in _all_reduce_top(ctx, outer, s / outer.k_prev_min).items():
        neck = max(worst, (top, ctx.tier(outer).name))[1]
        key = "hierarchical" if top_algo == "ring" else f"hierarchical/{top_algo}"
        out[key] = (total + top, neck)
    return out


def _all_reduce_top(ctx: _Ctx, lv: _Level, s: float) -> dict[str, float]:
    """All-reduce among the outermost level's ranks (one per lower domain), any algorithm."""
    out = {"ring": _ring_single(2, s, lv.m, ctx.bw(lv, "ring"), ctx.alpha(lv, "ring"))}
    if ctx.has(lv, "tree"):
        out["tree"] = (2 * s / ctx.bw(lv, "tree")
                       + 2 * math.ceil(math.log2(lv.m)) * ctx.alpha(lv, "tree"))
    return out


def _gather_scatter(ctx: _Ctx, s: float, n: int) -> dict[str, tuple[float, str]]:
    """All-gather or reduce-scatter (same cost, mirrored)."""
    lvs = ctx.levels
    out: dict[str, tuple[float, str]] = {}
    if len(lvs) == 1:
        lv = lvs[0]
        name = ctx.tier(lv).name
        out["ring"] = (_ring_single(1, s, n, ctx.bw(lv, "ring"), ctx.alpha(lv, "ring")), name)
        if ctx.has(lv, "nvls"):
            out["nvls"] = ((n - 1) / n * s / ctx.bw(lv, "nvls") + 2 * ctx.alpha(lv, "nvls"),
                           name)
        return out
    terms = [((n - 1) / n * s / (lv.k_prev_min * ctx.bw(lv, "ring")), ctx.tier(lv).name)
             for lv in lvs]
    bw_s, neck = max(terms)
    out["ring"] = (bw_s + _ring_latency(ctx, n, all_reduce=False), neck)
    # sized by the smallest occupied domain below each stage, as the all-reduce's
    parts = [(_ring_single(1, s / lv.k_prev_min, lv.m, ctx.bw(lv, "ring"),
                           ctx.alpha(lv, "ring")), ctx.tier(lv).name) for lv in lvs]
    out["hierarchical"] = (sum(p for p, _ in parts), max(parts)[1])
    return out


def _all_to_all(ctx: _Ctx, s: float, n: int) -> dict[str, tuple[float, str]]:
    terms, lat = [], 0.0
    for lv in ctx.levels:
        # peers a rank of the smallest lower domain reaches first here (its NICs carry them)
        peers = lv.k - lv.k_prev_min
        terms.append((s * peers / n / ctx.bw(lv, "pairwise"), ctx.tier(lv).name))
        # innermost (switched NVLink) tier: all peers at once; network tiers: per peer
        lat += ctx.alpha(lv, "pairwise") * (1 if lv.tier_idx == 0 else peers)
    bw_s, neck = max(terms)
    return {"pairwise": (bw_s + lat, neck)}


def _send_recv(ctx: _Ctx, s: float) -> dict[str, tuple[float, str]]:
    lv = ctx.levels[-1]
    return {"p2p": (s / ctx.bw(lv, "p2p") + ctx.alpha(lv, "p2p"), ctx.tier(lv).name)}


# id(cluster) -> (cluster, cache); the cluster is kept so its id cannot be reused while the
# entry lives. The cache maps ``(n, stride, concurrent, world, ring)`` to the contexts of the
# distinct placements of that group shape, and ``(levels, concurrent)`` to one ``_Ctx`` (groups
# placed alike share it and its per-kind lines). Bounded: cleared when it grows past
# _MAX_CACHED clusters or _MAX_SHAPES entries.
_CONTEXTS: dict[int, tuple[ClusterSpec, dict[tuple, _Ctx | tuple[_Ctx, ...]]]] = {}
_MAX_CACHED = 64
_MAX_SHAPES = 8192


def _contexts(cluster: ClusterSpec, n: int, stride: int, concurrent_groups: int,
              world_size: int | None = None, *, ring: int = 0) -> tuple[_Ctx, ...]:
    """A ``_Ctx`` per distinct placement of the groups of ``n`` ranks at ``stride`` that tile
    ranks ``0 .. world_size-1`` (``_group_offsets``); the group at rank 0 first. ``ring`` > 0:
    the groups are the send/recv hops of rings of ``ring`` ranks."""
    entry = _CONTEXTS.get(id(cluster))
    if entry is None or entry[0] is not cluster:
        if len(_CONTEXTS) >= _MAX_CACHED:
            _CONTEXTS.clear()
        entry = (cluster, {})
        _CONTEXTS[id(cluster)] = entry
    cache = entry[1]
    conc = max(1, int(concurrent_groups))
    key = (n, stride, conc, world_size, ring)
    hit = cache.get(key)
    if hit is None:
        if len(cache) > _MAX_SHAPES:
            cache.clear()
        sizes = rank_domains(cluster, world_size)
        placements = dict.fromkeys(_levels(n, stride, sizes, o) for o in _group_offsets(
            n, stride, sizes, world_size, ring))
        ctxs = []
        for levels in placements:
            ctx = cache.get((levels, conc))
            if ctx is None:
                ctx = cache[(levels, conc)] = _Ctx(cluster, levels, conc)
            ctxs.append(ctx)
        hit = cache[key] = tuple(ctxs)
    return hit  # type: ignore[return-value]


def _context(cluster: ClusterSpec, n: int, stride: int, concurrent_groups: int) -> _Ctx:
    """The ``_Ctx`` of the group at ranks ``0, stride, ..., (n-1)·stride``."""
    return _contexts(cluster, n, stride, concurrent_groups)[0]


def _world(world_size: int | None, cluster: ClusterSpec) -> int | None:
    """``world_size`` checked: None, or a whole number of ranks the cluster holds."""
    if world_size is None:
        return None
    world = whole_number("world_size", world_size)
    outer = cluster.tiers[-1].num_devices
    if world > outer:
        raise ConfigError(f"`world_size` must be <= {outer} (the devices of cluster "
                          f"{cluster.name}'s outermost tier), but got {world}")
    return world


def estimate_collective(
    kind: OpKind | str,
    nbytes: float,
    group_size: int,
    cluster: ClusterSpec,
    *,
    stride: int = 1,
    algo: str | None = None,
    concurrent_groups: int = 1,
    world_size: int | None = None,
) -> CollectiveEstimate:
    """Like ``collective_time`` but also says which algorithm and tiers were used (those of
    the slowest group when ``world_size`` is given)."""
    k = _kind(kind)
    n = whole_number("group_size", group_size)
    stride = whole_number("stride", stride)
    whole_number("concurrent_groups", concurrent_groups)
    world = _world(world_size, cluster)
    ring = 0
    if k is OpKind.SEND_RECV and n > 1:
        ring, n = n, 2  # one transfer between ranks r and r + stride of a ring of n ranks
    _check_group(n, stride, cluster)
    if not 0 <= nbytes < math.inf:  # also NaN
        raise ConfigError(f"`nbytes >= 0` must hold for a finite number, but got {nbytes!r}")
    if n <= 1 or nbytes == 0:
        return CollectiveEstimate(duration_s=0.0, algorithm="none", tiers=(),
                                  bottleneck_tier="")
    s = float(nbytes)
    worst: tuple[float, _Ctx, tuple[str, float, float, str]] | None = None
    for ctx in _contexts(cluster, n, stride, concurrent_groups, world, ring=ring):
        lines = ctx.lines(k, n)
        if algo is not None:
            lines = tuple(ln for ln in lines if ln[0] == algo)
            if not lines:
                raise ConfigError(
                    f"algorithm {algo!r} is not available for {k.value} over tiers "
                    f"{list(ctx.tier_names)} of cluster {cluster.name}; available: "
                    f"{sorted({ln[0] for ln in ctx.lines(k, n)})}"
                )
        best = min(lines, key=lambda ln: ln[1] + ln[2] * s)
        t = best[1] + best[2] * s
        if worst is None or t > worst[0]:
            worst = (t, ctx, best)
    assert worst is not None  # at least the group at rank 0
    t, ctx, best = worst
    times: dict[str, float] = {}
    for name, a, b, _ in ctx.lines(k, n):
        tn = a + b * s
        times[name] = min(tn, times.get(name, tn))
    return CollectiveEstimate(
        duration_s=t + cluster.calibration.collective_launch_s,
        algorithm=best[0],
        tiers=ctx.tier_names,
        bottleneck_tier=best[3],
        candidates=tuple(sorted(times.items())),
    )


def _fast_time(k: OpKind, s: float, n: int, cluster: ClusterSpec, stride: int,
               concurrent_groups: int, world_size: int | None, ring: int = 0) -> float:
    """``collective_time`` without building a ``CollectiveEstimate`` (algo=None)."""
    entry = _CONTEXTS.get(id(cluster))  # the hot path of ``_contexts``: one dict read
    ctxs = (entry[1].get((n, stride, concurrent_groups, world_size, ring))
            if entry is not None and entry[0] is cluster else None)
    if ctxs is None:
        ctxs = _contexts(cluster, n, stride, concurrent_groups, world_size, ring=ring)
    worst = 0.0
    for ctx in ctxs:  # type: ignore[union-attr]
        best = math.inf
        for _, a, b, _ in ctx.lines(k, n):
            t = a + b * s
            if t < best:
                best = t
        if best > worst:
            worst = best
    return worst + cluster.calibration.collective_launch_s


def collective_time(
    kind: OpKind | str,
    nbytes: float,
    group_size: int,
    cluster: ClusterSpec,
    *,
    stride: int = 1,
    algo: str | None = None,
    concurrent_groups: int = 1,
    world_size: int | None = None,
) -> float:
    """Seconds for one collective of ``nbytes`` per rank among ``group_size`` ranks.

    Args:
        kind: ``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all`` or
            ``send_recv`` (an ``OpKind`` or its string).
        nbytes: message bytes per rank (see the module docstring for each kind).
        group_size: ranks in the group (a send/recv is one transfer between two ranks).
        cluster: topology, bandwidths and calibration.
        stride: distance between consecutive group ranks in global rank order.
        algo: force one of ``ALGORITHMS``; None picks the fastest available (like NCCL).
        concurrent_groups: groups of this shape communicating at the same time (link sharing).
        world_size: ranks of the job (``0 .. world_size-1``), which the groups of this shape
            tile; the slowest group is priced (groups that straddle an NVL72 rack cross the
            network). None: the group at ranks ``0, stride, ...`` only.

    Returns:
        Seconds, including ``calibration.collective_launch_s``; 0.0 for one rank or 0 bytes.

    Raises:
        ConfigError: unknown kind or algorithm, a group or ``world_size`` larger than the
            cluster, ``nbytes`` negative, NaN or infinite, or ``group_size`` / ``stride`` /
            ``concurrent_groups`` / ``world_size`` not a whole number >= 1.

    Example:
        >>> from charon_search.testing import toy_cluster
        >>> t = collective_time("all_reduce", 1e9, 2, toy_cluster(), algo="ring")
        >>> round(t * 1e3, 3)  # 2·(1/2)·1e9 B / (450e9 · 0.8) + 2·1 µs
        2.78
    """
    # Fast path for plain ints and finite positive bytes; anything else (NaN / inf bytes,
    # fractional or numpy sizes) takes the checked path of ``estimate_collective``.
    if (algo is None and type(group_size) is int and type(stride) is int
            and type(concurrent_groups) is int and concurrent_groups >= 1
            and (world_size is None or (type(world_size) is int
                                        and 1 <= world_size <= cluster.tiers[-1].num_devices))):
        k = _KIND_CACHE.get(kind) if isinstance(kind, str) else None
        k = k or _kind(kind)
        n, ring = group_size, 0
        if k is OpKind.SEND_RECV and n > 1:
            ring, n = n, 2
        if n > 1 and 0 < nbytes < math.inf and stride >= 1 and (n - 1) * stride < cluster.tiers[
                -1].num_devices:
            return _fast_time(k, float(nbytes), n, cluster, stride, concurrent_groups,
                              world_size, ring)
    return estimate_collective(kind, nbytes, group_size, cluster, stride=stride, algo=algo,
                               concurrent_groups=concurrent_groups,
                               world_size=world_size).duration_s


_KIND_CACHE: dict[str, OpKind] = {k.value: k for k in COMM_KINDS}


#: nccl-tests bus-bandwidth factor per kind (busbw = algbw × factor).
def _bus_factor(kind: OpKind, n: int) -> float:
    if kind is OpKind.ALL_REDUCE:
        return 2 * (n - 1) / n
    if kind is OpKind.SEND_RECV:
        return 1.0
    return (n - 1) / n


def collective_bus_bandwidth(
    kind: OpKind | str,
    nbytes: float,
    group_size: int,
    cluster: ClusterSpec,
    **kwargs: object,
) -> float:
    """nccl-tests "bus bandwidth" (bytes/s) of the modelled collective: ``factor·S/time``.

    The factor is ``2(n-1)/n`` for all-reduce, ``(n-1)/n`` for all-gather, reduce-scatter and
    all-to-all, 1 for send/recv, so a ring on one tier approaches ``bw·efficiency``.
    """
    k = _kind(kind)
    t = collective_time(k, nbytes, group_size, cluster, **kwargs)  # type: ignore[arg-type]
    n = 2 if k is OpKind.SEND_RECV else int(group_size)
    if t <= 0:
        return 0.0
    return _bus_factor(k, n) * float(nbytes) / t
