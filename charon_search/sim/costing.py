"""Per-node durations of a per-rank graph: compute from the cost model, collectives from the
topology model, with the rank order deciding which tiers each parallel axis spans."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from charon_search.cost.attention_kernels import attention_time_factor
from charon_search.cost.base import ShapePoint
from charon_search.cost.collectives import estimate_collective
from charon_search.cost.measured_collectives import cost_model_nccl_floor_s, cost_model_nccl_s
from charon_search.cost.roofline import (
    RooflineCostBackend,
    node_compute_efficiency,
    node_peak_flops_per_s,
)
from charon_search.errors import ConfigError
from charon_search.hardware.spec import ClusterSpec
from charon_search.ir import ATTENTION_BWD_FLOP_RATIO, DTYPE_BYTES, OpGraph, OpKind
from charon_search.passes.fusion import PERSISTENT_NORM_TAG
from charon_search.sim.fp8_kernels import FP8_GEMM_KERNELS, cublaslt_over_cutlass
from charon_search.sim.train_attention import training_attention

__all__ = ["CAUSAL_WORK_FRACTION", "COMPUTE_BOUND_KINDS", "CostedGraph", "GraphCoster",
           "axis_strides", "full_square_causal", "kernel_flops"]

#: Provenances of fp8 GEMM times measured with the input cast inside (see
#: ``GraphCoster._without_input_quantize``).
MEASURED_FP8_GEMM_QUANT_PROVENANCE = frozenset({"profile", "predictor"})
#: Kernels whose speed follows the SM clock (tensor-core bound), so a power-limited sustained
#: clock slows them (``GpuSpec.sustained_clock_ratio``); memory-bound ops keep their cost.
COMPUTE_BOUND_KINDS = frozenset({OpKind.GEMM, OpKind.GROUPED_GEMM, OpKind.BATCHED_GEMM,
                                 OpKind.ATTENTION, OpKind.ATTENTION_BWD})


#: Bytes per element of the measured elementwise rows the predictor is trained on (vidur
#: sarathi-serve ``mlp.csv`` profiles of H100 / A100 / A40: RoPE 4 B, residual add and SiLU-and-mul
#: 6 B per element, all bf16). A node outside that range (an fp8 cast reads 2 B and writes 1 B;
#: the transposed copy of a fused cast-transpose only writes 1 B; fp32 ops move 12 B) is
#: priced at the measured time of the nearest bytes-per-element, scaled by its own bytes:
#: a streaming kernel's time at a given element count follows the bytes it moves.
MEASURED_ELEMENTWISE_BYTES_PER_ELEMENT = (4.0, 6.0)

#: Share of the full ``q x kv`` score square a causal fused kernel computes: flash kernels skip
#: the fully masked tiles (FlashAttention-2 paper sec. 3.1.1, "causal masking"); with zigzag
#: context parallelism each rank does 1/(2 cp) of the square, half of its ``q x kv`` rectangle.
CAUSAL_WORK_FRACTION = 0.5


def full_square_causal(node: Any, b: float, s: float, c: float) -> bool:
    """A causal attention node whose FLOPs count the full score square.

    Traced SDPA nodes count the whole ``s x c`` product and carry ``causal=1`` (``frontend
    ._ops``, like ``torch.utils.flop_counter``); the roofline prices those FLOPs as they are,
    while the predictor counts causal pairs. Nodes fused from eager attention (``passes
    .fusion``) already carry halved FLOPs.
    """
    p = node.params
    if "causal" not in p or p["causal"](b, s, c) != 1:
        return False
    try:
        full = 4.0 * p["batch"](b, s, c) * p["heads"](b, s, c) * p["q_len"](b, s, c) \
            * p["kv_len"](b, s, c) * p["head_dim"](b, s, c)
    except KeyError:
        return False
    if node.kind == OpKind.ATTENTION_BWD:
        full *= ATTENTION_BWD_FLOP_RATIO  # dQ, dK, dV, dP and the recomputed P
    return full > 0 and float(node.flops(b, s, c)) > 0.75 * full


def kernel_flops(node: Any, b: float, s: float, c: float) -> float:
    """FLOPs the node's kernel computes: its graph FLOPs, a causal attention's masked half of
    the score square left out where the node counts the full square (``full_square_causal``)."""
    flops = float(node.flops(b, s, c))
    if flops and full_square_causal(node, b, s, c):
        flops *= CAUSAL_WORK_FRACTION  # traced SDPA counts the whole score square
    return flops


def _fp8_grouped_gemm_scale(cluster: ClusterSpec, cost_model: Any) -> float:
    """Time ratio fp8 / bf16 for fp8 expert GEMMs priced from bf16 measurements.

    The shipped MoE expert-FFN rows are bf16 only (aiconfigurator-core inference sweeps), and
    the cost model prices an fp8 grouped GEMM with the bf16 model. Training's expert GEMMs are
    large and compute-bound, so they run at the fp8 tensor-core rate: the bf16 time times
    ``peak(bf16)·eff(bf16) / (peak(fp8)·eff(fp8))`` (datasheet peaks, the GPU's roofline
    efficiencies). 1 when fp8 rows exist or the GPU has no fp8 tensor cores.
    """
    gpu = cluster.gpu
    peaks = getattr(gpu, "peak_flops_per_s", {}) or {}
    if "fp8" not in peaks or "bf16" not in peaks:
        return 1.0
    store, key = getattr(cost_model, "store", None), getattr(cost_model, "gpu_key", None)
    if store is not None and key is not None:
        for fam in ("moe_ffn", "moe_ffn_skew"):
            if store.get(key, "grouped_gemm", fam, "fp8") is not None:
                return 1.0
    eff = dict(getattr(gpu, "compute_efficiency_by_dtype", {}) or {})
    base = float(getattr(gpu, "compute_efficiency", 1.0) or 1.0)
    return (peaks["bf16"] * eff.get("bf16", base)) / (peaks["fp8"] * eff.get("fp8", base))


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
    """Prices graphs at concrete ``(b, s)``; memoizes collectives.

    ``world_size``: the job's ranks; each collective is priced for the slowest of the groups
    of its axis that tile them (an NVL72 job whose EP or DP groups straddle a rack waits for
    the straddling ones). None: the group at rank 0.
    """

    def __init__(self, cluster: ClusterSpec, cost_model: Any, *, strides: Mapping[str, int],
                 concurrent_groups: Mapping[str, int] | None = None,
                 attention_kernel: str = "flash", ep_a2a_scale: float = 1.0,
                 fp8_gemm_kernel: str = "cutlass", world_size: int | None = None) -> None:
        self.cluster = cluster
        self.cost_model = cost_model
        if fp8_gemm_kernel not in FP8_GEMM_KERNELS:
            raise ConfigError(f"`fp8_gemm_kernel` must be one of {list(FP8_GEMM_KERNELS)}, "
                              f"but got {fp8_gemm_kernel!r}")
        # ``Layout.fp8_gemm_kernel``: the shipped fp8 GEMM rows are CUTLASS; ``cublaslt``
        # scales them by the measured cuBLASLt / CUTLASS ratio (``sim.fp8_kernels``).
        self.fp8_gemm_kernel = fp8_gemm_kernel
        self.strides = dict(strides)
        self.world_size = world_size
        self.concurrent = dict(concurrent_groups or {})
        self._comm_memo: dict[tuple, tuple[float, str]] = {}
        # Deduplicating EP all-to-alls (``Layout.ep_node_dedup``): bytes on the bottleneck
        # tier over the routed bytes (``training.step._ep_a2a_byte_scale``).
        self.ep_a2a_scale = float(ep_a2a_scale)
        self._fp8_grouped_scale = _fp8_grouped_gemm_scale(cluster, cost_model)
        gen = int(getattr(cluster.gpu, "attention_kernel_gen", 2) or 2)
        # ``Layout.attention_kernel`` against the generation the costs represent, and the
        # backward's lower FLOP rate than its forward (``cost.attention_kernels``).
        self._attn_factor = {
            OpKind.ATTENTION: attention_time_factor(attention_kernel, gen, backward=False),
            OpKind.ATTENTION_BWD: attention_time_factor(attention_kernel, gen, backward=True)}
        # Dense training kernels measured on this GPU's die (``sim.train_attention``) replace
        # the serving rows and the generation factors where they exist.
        self._train_attn = training_attention(cluster.gpu.name, attention_kernel)

    def _without_input_quantize(self, n: Any, dur: float, b: float, s: float,
                                c: float) -> float:
        """A measured fp8 GEMM row less the input quantize its measurement contains.

        The shipped fp8 GEMM rows (aiconfigurator-core ``gemm_perf`` of vLLM, kernel
        ``CutlassFP8ScaledMMLinearKernel``) time vLLM's ``RowParallelLinear.forward`` on a bf16
        input with ``Fp8Config(activation_scheme="static")`` (aiconfigurator
        ``collector/vllm/collect_gemm.py``): each call casts its ``m x k`` input to fp8 (one
        bf16 read, one fp8 write) before the scaled GEMM. The ``fp8`` pass prices the casts of a
        training GEMM's inputs as their own nodes, so that cast is taken out again here, never
        below the GEMM's own roofline time.
        """
        gpu = self.cluster.gpu
        m, k = n.params.get("m"), n.params.get("k")
        if m is None or k is None:
            return dur
        numel = float(m(b, s, c)) * float(k(b, s, c))
        bw = gpu.hbm_bandwidth_bytes_per_s * gpu.memory_efficiency
        quant_s = numel * (DTYPE_BYTES["bf16"] + DTYPE_BYTES["fp8"]) / bw
        peak = node_peak_flops_per_s(n, gpu) * node_compute_efficiency(n, gpu)
        floor = max(float(n.flops(b, s, c)) / peak, float(n.bytes(b, s, c)) / bw)
        return max(dur - quant_s, floor)

    def _measured_attention(self, n: Any, b: float, s: float, c: float) -> float | None:
        """Seconds of a fused attention node at the measured dense training kernel, or None."""
        if self._train_attn is None:
            return None
        p = n.params
        try:
            bb, h, q, kv, d = (float(p[k](b, s, c)) for k in
                               ("batch", "heads", "q_len", "kv_len", "head_dim"))
        except KeyError:
            return None
        flops = kernel_flops(n, b, s, c)
        if min(bb, h, q, kv, d, flops) <= 0:
            return None
        causal = "causal" in p and float(p["causal"](b, s, c)) == 1.0
        dv = float(p["v_head_dim"](b, s, c)) if "v_head_dim" in p else d
        return self._train_attn.seconds(flops, bb, h, q, kv, d, dv if dv > 0 else d,
                                        causal=causal, backward=n.kind == OpKind.ATTENTION_BWD)

    def _cublaslt_ratio(self, n: Any, b: float, s: float, c: float) -> float:
        """cuBLASLt / CUTLASS time of fp8 GEMM ``n`` (1 where no measured ratio exists)."""
        key = getattr(self.cost_model, "gpu_key", None)
        p = n.params
        if key is None or not all(d in p for d in ("m", "n", "k")):
            return 1.0
        r = cublaslt_over_cutlass(str(key), float(p["m"](b, s, c)), float(p["n"](b, s, c)),
                                  float(p["k"](b, s, c)))
        return 1.0 if r is None else r

    def _elementwise_bytes_scaled(self, n: Any, dur: float, b: float, s: float,
                                  c: float) -> float:
        """A predicted elementwise time at the node's own bytes per element.

        The predictor has seen only 4-6 B per element (``MEASURED_ELEMENTWISE_BYTES_PER_ELEMENT``)
        and returns the time of the nearest of those for other nodes; the part above the launch
        overhead is rescaled by ``bytes / (nearest bytes-per-element x numel)``.
        """
        if "numel" not in n.params:
            return dur
        numel = float(n.params["numel"](b, s, c))
        nbytes = float(n.bytes(b, s, c))
        if numel <= 0 or nbytes <= 0:
            return dur
        lo, hi = MEASURED_ELEMENTWISE_BYTES_PER_ELEMENT
        bpe = nbytes / numel
        seen = min(max(bpe, lo), hi)
        if seen == bpe or bpe > hi:
            # Above the measured range the predictor's time already grows with the node's
            # bytes (the selector passes them as a feature: 10 B/elem costs 10/6 of 6 B/elem);
            # below it, it does not, and the rescale applies.
            return dur
        launch = float(getattr(self.cluster.gpu, "launch_overhead_s", 0.0) or 0.0)
        body = max(dur - launch, 0.0)
        return dur - body + body * bpe / seen

    def collective(self, kind: str, nbytes: float, group_size: int, group: str
                   ) -> tuple[float, str]:
        """(seconds, bottleneck tier) of one collective on mesh axis ``group``."""
        stride = self.strides.get(group, 1)
        if group == "ep" and kind == "all_to_all" and self.ep_a2a_scale != 1.0:
            # A deduplicating dispatch/combine: across nodes the scale-out tier bounds it and
            # its time follows the bytes that cross it (NVLink forwarding inside the node is
            # not the bottleneck); inside one NVLink domain, a token once per target rank.
            nbytes *= self.ep_a2a_scale
        key = (kind, round(nbytes), group_size, stride, group)
        hit = self._comm_memo.get(key)
        if hit is None:
            if group_size <= 1 or nbytes <= 0:
                hit = (0.0, "")
            elif (measured := cost_model_nccl_s(self.cost_model, kind, nbytes, group_size,
                                                self.cluster, stride=stride)) is not None:
                hit = (measured, self.cluster.tiers[0].name)
            else:
                try:
                    est = estimate_collective(
                        kind, nbytes, group_size, self.cluster, stride=stride,
                        concurrent_groups=self.concurrent.get(group, 1),
                        world_size=self.world_size)
                except ConfigError as e:
                    raise ConfigError(f"{group} group of {group_size} ranks (stride {stride}): "
                                      f"{e}") from e
                floor = cost_model_nccl_floor_s(self.cost_model, kind, nbytes, group_size,
                                                self.cluster, stride=stride)
                hit = (max(est.duration_s, floor),
                       est.bottleneck_tier or (est.tiers[-1] if est.tiers else ""))
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
            if n.kind in self._attn_factor:
                measured = self._measured_attention(n, b, s, cc)
                if measured is not None:
                    dur[i], prov[i] = measured / clock, "profile"
                else:
                    dur[i] *= self._attn_factor[n.kind]
                    if prov[i] == "roofline" and full_square_causal(n, b, s, cc):
                        dur[i] *= CAUSAL_WORK_FRACTION
            if n.is_comm:
                # A pass may price a collective on another mesh axis than its scheduling
                # group (``axis:<name>`` tag: FSDP's dp·cp and expert-data-parallel groups).
                axis = next((t[5:] for t in n.tags if t.startswith("axis:")), n.group)
                t, tier = self.collective(n.kind.value, n.params["bytes"](b, s, cc),
                                          int(n.params["group_size"].const_value()), axis)
                dur[i], prov[i], tiers[i] = t, "collective", tier
            elif n.kind == OpKind.OTHER and n.target.startswith("pass:"):
                dur[i] = 0.0  # joins inserted by passes are bookkeeping, not kernels
            else:
                if (n.kind == OpKind.GROUPED_GEMM and n.dtype == "fp8"
                        and prov[i] == "predictor"):
                    dur[i] *= self._fp8_grouped_scale
                if "load_imbalance" in n.params:
                    dur[i] *= n.params["load_imbalance"].const_value()
            if (n.kind == OpKind.GEMM and n.dtype == "fp8" and "fp8" in n.tags
                    and prov[i] in MEASURED_FP8_GEMM_QUANT_PROVENANCE):
                if self.fp8_gemm_kernel == "cublaslt":
                    dur[i] *= self._cublaslt_ratio(n, b, s, cc)
                dur[i] = self._without_input_quantize(n, float(dur[i]), b, s, cc)
            if n.kind == OpKind.ELEMENTWISE and prov[i] == "predictor":
                dur[i] = self._elementwise_bytes_scaled(n, float(dur[i]), b, s, cc)
            if n.kind == OpKind.NORM and PERSISTENT_NORM_TAG in n.tags:
                # apex FastLayerNorm: bandwidth-bound at the roofline (``passes.fusion``), not
                # the measured serving norm kernels the predictor learned
                rc = RooflineCostBackend().cost(n, ShapePoint(b, s, cc), self.cluster.gpu)
                if rc is not None:
                    dur[i], prov[i] = rc.duration_s, rc.provenance
            if "kernel_slowdown" in n.params and not n.is_comm:
                # a slower kernel than the costed one for the same op (passes.fusion)
                dur[i] *= n.params["kernel_slowdown"].const_value()
        dur = np.nan_to_num(dur, nan=0.0)
        return CostedGraph(graph=graph, durations_s=dur, provenance=tuple(prov),
                           tiers=tuple(tiers))
