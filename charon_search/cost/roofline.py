"""Roofline cost backend: the analytical fallback for every compute node.

time = max(FLOPs / (peak(dtype) · compute_efficiency), bytes / (HBM bandwidth · memory_efficiency))
       + launch overhead

``compute_efficiency`` may be overridden per dtype (``compute_efficiency_by_dtype``, e.g. FP8).
Peaks and efficiencies come from the ``GpuSpec`` (``cluster_specs/gpus/*.yaml``). Matmul-like
kinds (GEMM, batched GEMM, attention, linear attention, grouped GEMM) run on tensor cores at
the node's dtype; every other kind (norms, elementwise, softmax, reductions...) runs on the CUDA
cores at the non-tensor ``fp32`` rate. NB: not modelled here: wave quantization, tile padding,
L2 reuse, small-shape inefficiency (the profile and predictor backends cover those).

Communication nodes are not priced here (``cost`` returns None; ``roofline_times`` gives 0 for
them): collectives are priced by ``cost.collectives`` from the cluster topology.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import numpy as np

from charon_search.cost.base import COST_BACKENDS, CostBackend, NodeCost, ShapePoint
from charon_search.ir.ops import OpKind

if TYPE_CHECKING:
    from charon_search.hardware.spec import GpuSpec
    from charon_search.ir.graph import Node, OpGraph

__all__ = [
    "TENSOR_CORE_KINDS",
    "RooflineCostBackend",
    "node_compute_efficiency",
    "node_peak_flops_per_s",
    "roofline_times",
]

#: Kinds whose FLOPs run on tensor cores at the node's dtype.
TENSOR_CORE_KINDS = frozenset(
    {OpKind.GEMM, OpKind.BATCHED_GEMM, OpKind.ATTENTION, OpKind.ATTENTION_BWD,
     OpKind.GROUPED_GEMM, OpKind.LINEAR_ATTENTION, OpKind.LINEAR_ATTENTION_BWD,
     OpKind.SPARSE_INDEXER}
)
#: dtype used for the CUDA-core (non-tensor) rate of every other kind.
VECTOR_DTYPE = "fp32"


def node_peak_flops_per_s(node: Node, gpu: GpuSpec) -> float:
    """Peak FLOP/s the roofline uses for ``node`` on ``gpu`` (before efficiency)."""
    if node.kind in TENSOR_CORE_KINDS:
        return gpu.peak_flops(node.dtype)
    return gpu.peak_flops(VECTOR_DTYPE)


def node_compute_efficiency(node: Node, gpu: GpuSpec) -> float:
    """Fraction of the peak the roofline assumes: the GPU's per-dtype override for tensor-core
    kinds (``compute_efficiency_by_dtype``) of the dtype whose tensor cores run the node
    (``GpuSpec.compute_dtype``: an fp4 GEMM on Hopper runs at the bf16 rate and efficiency),
    else ``compute_efficiency``."""
    if node.kind in TENSOR_CORE_KINDS:
        by_dtype = gpu.compute_efficiency_by_dtype
        if not by_dtype:
            return gpu.compute_efficiency
        dtype = node.dtype if node.dtype in gpu.peak_flops_per_s else gpu.compute_dtype(
            node.dtype)
        return by_dtype.get(dtype, gpu.compute_efficiency)
    return gpu.compute_efficiency


def _roofline_s(flops: float, nbytes: float, peak: float, gpu: GpuSpec) -> tuple[float, str]:
    """``peak`` is the effective peak (peak FLOP/s times compute efficiency)."""
    compute_s = flops / peak
    memory_s = nbytes / (gpu.hbm_bandwidth_bytes_per_s * gpu.memory_efficiency)
    if compute_s >= memory_s:
        return compute_s + gpu.launch_overhead_s, "compute"
    return memory_s + gpu.launch_overhead_s, "memory"


@COST_BACKENDS.register("roofline")
class RooflineCostBackend(CostBackend):
    """Prices any compute node from its FLOPs and bytes; never returns None for one.

    Example:
        >>> from charon_search.testing import toy_cluster, gemm_node
        >>> from charon_search.cost.base import ShapePoint
        >>> gpu = toy_cluster().gpu
        >>> node = gemm_node(4096, 4096, 4096)
        >>> cost = RooflineCostBackend().cost(node, ShapePoint(1, 1, 1), gpu)
        >>> cost.provenance, cost.detail
        ('roofline', 'compute')
    """

    name = "roofline"

    def cost(self, node: Node, point: ShapePoint, gpu: GpuSpec) -> NodeCost | None:
        if node.is_comm:
            return None
        c = node.attended_c(point.c)  # sparse attention: its top-k keys
        flops = node.flops(point.b, point.s, c)
        nbytes = node.bytes_read(point.b, point.s, c) + node.bytes_written(point.b, point.s, c)
        peak = node_peak_flops_per_s(node, gpu) * node_compute_efficiency(node, gpu)
        duration_s, bound = _roofline_s(flops, nbytes, peak, gpu)
        return NodeCost(duration_s=duration_s, provenance="roofline", detail=bound)


# (id(graph), id(gpu)) -> (weakref to graph, gpu, effective peak per node, compute mask). The GPU
# object is held so its id is not reused, and compared by identity: a spec rebuilt with another
# efficiency (calibration) is a new object and gets its own entry.
_NODE_CONSTANTS: dict[tuple[int, int], tuple[weakref.ref, GpuSpec, np.ndarray, np.ndarray]] = {}


def _node_constants(graph: OpGraph, gpu: GpuSpec) -> tuple[np.ndarray, np.ndarray]:
    key = (id(graph), id(gpu))
    hit = _NODE_CONSTANTS.get(key)
    if hit is not None and hit[0]() is graph and hit[1] is gpu:
        return hit[2], hit[3]
    compute = np.array([not n.is_comm for n in graph.nodes], dtype=bool)
    peak = np.array(
        [node_peak_flops_per_s(n, gpu) * node_compute_efficiency(n, gpu) if c else 1.0
         for n, c in zip(graph.nodes, compute)],
        dtype=float,
    )
    if len(_NODE_CONSTANTS) > 4096:
        _NODE_CONSTANTS.clear()
    _NODE_CONSTANTS[key] = (weakref.ref(graph), gpu, peak, compute)
    return peak, compute


def roofline_times(
    graph: OpGraph, gpu: GpuSpec, b: float, s: float, c: float | None = None
) -> np.ndarray:
    """Roofline seconds of every node of ``graph`` at ``(b, s, c)`` (node order), vectorized.

    Equals ``RooflineCostBackend().cost(node, ...)`` for each compute node; communication
    nodes get 0.0 (price them with ``cost.collectives``).
    """
    peak, compute = _node_constants(graph, gpu)
    ev = graph.evaluate(b, s, c)
    compute_s = ev.flops / peak
    memory_s = ev.bytes / (gpu.hbm_bandwidth_bytes_per_s * gpu.memory_efficiency)
    out = np.maximum(compute_s, memory_s) + gpu.launch_overhead_s
    return np.where(compute, out, 0.0)
