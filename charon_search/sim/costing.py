"""Per-node durations of a per-rank graph: compute from the cost model, collectives from the
topology model, with the rank order deciding which tiers each parallel axis spans."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from charon_search.cost.collectives import estimate_collective
from charon_search.errors import ConfigError
from charon_search.hardware.spec import ClusterSpec
from charon_search.ir import OpGraph, OpKind

__all__ = ["COMPUTE_BOUND_KINDS", "CostedGraph", "GraphCoster", "axis_strides"]

#: Kernels whose speed follows the SM clock (tensor-core bound), so a power-limited sustained
#: clock slows them (``GpuSpec.sustained_clock_ratio``); memory-bound ops keep their cost.
COMPUTE_BOUND_KINDS = frozenset({OpKind.GEMM, OpKind.GROUPED_GEMM, OpKind.BATCHED_GEMM,
                                 OpKind.ATTENTION, OpKind.ATTENTION_BWD})


class CostModel(Protocol):
    def cost_graph(self, graph: OpGraph, b: float, s: float, c: float | None = None
                   ) -> np.ndarray: ...


def axis_strides(rank_order: str, sizes: Mapping[str, int]) -> dict[str, int]:
    """Global-rank distance between consecutive ranks of each mesh axis.

    ``rank_order`` lists axes innermost first (``tp-cp-ep-dp-pp``). EP is carved out of the
    ``cp·dp`` ranks, innermost first, so it takes the stride of the inner one of them.
    """
    axes = rank_order.split("-")
    out: dict[str, int] = {}
    stride = 1
    for ax in axes:
        if ax == "ep":
            continue
        out[ax] = stride
        stride *= sizes.get(ax, 1)
    inner = [a for a in axes if a in ("cp", "dp") and sizes.get(a, 1) > 1]
    out["ep"] = out[inner[0]] if inner else out.get("dp", 1)
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class CostedGraph:
    graph: OpGraph
    durations_s: np.ndarray
    """Seconds per node (standalone), imbalance applied to grouped GEMMs."""
    provenance: tuple[str, ...]
    """``profile``/``predictor``/``roofline``/``collective`` per node."""
    tiers: tuple[str, ...]
    """Bottleneck tier per comm node (empty for compute)."""


class GraphCoster:
    """Prices graphs at concrete ``(b, s)``; memoizes collectives."""

    def __init__(self, cluster: ClusterSpec, cost_model: Any, *, strides: Mapping[str, int],
                 concurrent_groups: Mapping[str, int] | None = None) -> None:
        self.cluster = cluster
        self.cost_model = cost_model
        self.strides = dict(strides)
        self.concurrent = dict(concurrent_groups or {})
        self._comm_memo: dict[tuple, tuple[float, str]] = {}

    def collective(self, kind: str, nbytes: float, group_size: int, group: str
                   ) -> tuple[float, str]:
        """(seconds, bottleneck tier) of one collective on mesh axis ``group``."""
        stride = self.strides.get(group, 1)
        key = (kind, round(nbytes), group_size, stride, group)
        hit = self._comm_memo.get(key)
        if hit is None:
            if group_size <= 1 or nbytes <= 0:
                hit = (0.0, "")
            else:
                try:
                    est = estimate_collective(
                        kind, nbytes, group_size, self.cluster, stride=stride,
                        concurrent_groups=self.concurrent.get(group, 1))
                except ConfigError as e:
                    raise ConfigError(f"{group} group of {group_size} ranks (stride {stride}): "
                                      f"{e}") from e
                hit = (est.duration_s, est.bottleneck_tier or (est.tiers[-1] if est.tiers
                                                                else ""))
            self._comm_memo[key] = hit
        return hit

    def cost(self, graph: OpGraph, b: float, s: float, c: float | None = None) -> CostedGraph:
        cc = s if c is None else c
        cm = self.cost_model
        if hasattr(cm, "cost_graph_detailed"):
            gc = cm.cost_graph_detailed(graph, b, s, cc)
            dur = np.array(gc.durations_s, dtype=float)
            prov = list(gc.provenance)
        else:
            dur = np.array(cm.cost_graph(graph, b, s, cc), dtype=float)
            prov = [getattr(cm, "provenance", "model")] * len(graph.nodes)
        tiers = [""] * len(graph.nodes)
        clock = float(getattr(self.cluster.gpu, "sustained_clock_ratio", 1.0) or 1.0)
        for i, n in enumerate(graph.nodes):
            if clock != 1.0 and n.kind in COMPUTE_BOUND_KINDS:
                dur[i] /= clock
            if n.is_comm:
                t, tier = self.collective(n.kind.value, n.params["bytes"](b, s, cc),
                                          int(n.params["group_size"].const_value()), n.group)
                dur[i], prov[i], tiers[i] = t, "collective", tier
            elif n.kind == OpKind.OTHER and n.target.startswith("pass:"):
                dur[i] = 0.0  # joins inserted by passes are bookkeeping, not kernels
            elif "load_imbalance" in n.params:
                dur[i] *= n.params["load_imbalance"].const_value()
        dur = np.nan_to_num(dur, nan=0.0)
        return CostedGraph(graph=graph, durations_s=dur, provenance=tuple(prov),
                           tiers=tuple(tiers))
