"""Fixtures and contract test suites that backends, passes and plugins inherit.

Dependency-light on purpose (no torch, no pytest import at module level), so a plugin's own test
suite can ``from charon_search.testing import CostBackendContract, toy_cluster``.

* ``toy_cluster()``: 2 nodes x 2 GPUs, two tiers (``nvlink`` inside a node, ``net`` across),
  H100 GPU spec, simple calibration with no per-collective launch cost, so closed forms hold.
* ``gemm_node(m, n, k)``, ``comm_node(kind, nbytes, group_size)``: one-node building blocks.
* ``CostBackendContract``: subclass as ``TestMyBackend(CostBackendContract)`` and set
  ``backend_factory``; checks non-negative, deterministic, ``None`` for comm nodes, monotone in
  FLOPs.
* ``PassContract``: subclass, set ``pass_factory`` and override ``input_graph()`` (and
  ``context()``); checks ``ir.check`` after the run, that ``requires``/``ensures`` are called,
  that the input graph is not mutated and that the rewrite is deterministic.

Example:
    >>> from charon_search.testing import toy_cluster
    >>> c = toy_cluster()
    >>> c.num_gpus, [t.name for t in c.tiers]
    (4, ['nvlink', 'net'])
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from charon_search.cost.base import PROVENANCES, CostBackend, ShapePoint
from charon_search.hardware.spec import Calibration, ClusterSpec, TopologyTier
from charon_search.ir.graph import Node, OpGraph, TensorSpec, poly_params
from charon_search.ir.ops import OpKind
from charon_search.ir.symbolic import PolyLike, as_poly

if TYPE_CHECKING:
    from charon_search.hardware.spec import GpuSpec
    from charon_search.passes.base import Pass, PassContext

__all__ = [
    "TOY_CALIBRATION",
    "CostBackendContract",
    "PassContract",
    "comm_node",
    "gemm_graph",
    "gemm_node",
    "toy_cluster",
]

#: Calibration of ``toy_cluster``: round α and efficiencies, no launch cost, no slowdowns.
TOY_CALIBRATION = Calibration(
    collective_alpha_s={"nvlink": 1e-6, "net": 5e-6},
    collective_bw_efficiency={"nvlink": 0.8, "net": 0.9},
    collective_launch_s=0.0,
    overlap_compute_slowdown=1.0,
    overlap_comm_slowdown=1.0,
    iteration_cpu_overhead_s=0.0,
    allocator_reserved_factor=1.0,
    allocator_reserved_extra_bytes=0.0,
    comm_buffer_bytes=0.0,
    provenance={"collective_alpha_s": "test fixture", "collective_bw_efficiency": "test fixture"},
)


def toy_cluster(
    *,
    num_nodes: int = 2,
    gpus_per_node: int = 2,
    calibration: Calibration | None = None,
    gpu: str = "h100-sxm-80gb",
) -> ClusterSpec:
    """A small cluster for tests: ``num_nodes`` x ``gpus_per_node`` GPUs, two tiers.

    Tier ``nvlink``: ``gpus_per_node`` devices at 450 GB/s per direction, 1 µs.
    Tier ``net``: all devices at 50 GB/s per direction (400 Gb/s), 5 µs.
    The GPU is loaded from ``cluster_specs/gpus`` (H100 SXM by default).
    """
    from charon_search.hardware.loader import load_gpu

    tiers = (
        TopologyTier(name="nvlink", num_devices=gpus_per_node, bandwidth_bytes_per_s=450e9,
                     latency_s=1e-6, algorithms=("ring", "tree"),
                     source="toy: H100 NVLink 4 per direction"),
        TopologyTier(name="net", num_devices=num_nodes * gpus_per_node,
                     bandwidth_bytes_per_s=50e9, latency_s=5e-6, algorithms=("ring", "tree"),
                     source="toy: 400 Gb/s NIC per GPU"),
    )
    return ClusterSpec(
        name="toy",
        gpu=load_gpu(gpu),
        num_gpus=num_nodes * gpus_per_node,
        gpus_per_node=gpus_per_node,
        tiers=tiers,
        calibration=TOY_CALIBRATION if calibration is None else calibration,
        cost_per_gpu_hour_usd=2.0,
        source="test fixture",
        sources={"cost_per_gpu_hour_usd": "test fixture"},
    )


def gemm_node(
    m: PolyLike, n: PolyLike, k: PolyLike, *, dtype: str = "bf16", node_id: int = 0,
    name: str | None = None,
) -> Node:
    """A GEMM ``[m, k] x [k, n]``: 2mnk FLOPs; reads A and B, writes C (``dtype`` bytes each)."""
    from charon_search.ir.graph import DTYPE_BYTES

    mm, nn, kk = as_poly(m), as_poly(n), as_poly(k)
    eb = DTYPE_BYTES[dtype]
    return Node(
        id=node_id, name=name or f"gemm{node_id}", kind=OpKind.GEMM, target="test",
        flops=2 * mm * nn * kk, bytes_read=(mm * kk + kk * nn) * eb, bytes_written=mm * nn * eb,
        params=poly_params(m=mm, n=nn, k=kk), dtype=dtype,
    )


def comm_node(kind: OpKind | str, nbytes: PolyLike, group_size: int, *, node_id: int = 0,
              group: str = "tp") -> Node:
    """A collective node carrying ``bytes`` and ``group_size`` params."""
    k = OpKind(kind)
    return Node(
        id=node_id, name=f"{k.value}{node_id}", kind=k, target="test",
        params=poly_params(bytes=nbytes, group_size=group_size), stream="comm", group=group,
    )


def gemm_graph(m: PolyLike, n: PolyLike, k: PolyLike, *, dtype: str = "bf16") -> OpGraph:
    """A one-GEMM graph with tensors wired (input, weight -> output)."""
    mm, nn, kk = as_poly(m), as_poly(n), as_poly(k)
    tensors = {
        0: TensorSpec(id=0, shape=(mm, kk), dtype=dtype),
        1: TensorSpec(id=1, shape=(kk, nn), dtype=dtype),
        2: TensorSpec(id=2, shape=(mm, nn), dtype=dtype),
    }
    node = gemm_node(mm, nn, kk, dtype=dtype).replace(inputs=(0, 1), outputs=(2,))
    return OpGraph(name="gemm", nodes=(node,), tensors=tensors, inputs=(0, 1), outputs=(2,),
                   param_tensors=(1,))


# ----------------------------------------------------------------------------- contracts
class CostBackendContract:
    """Contract every ``CostBackend`` satisfies. Subclass as ``Test...`` and set the factory.

    Attributes:
        backend_factory: zero-argument callable returning the backend under test.
        covers_all_compute: the backend prices every compute node (never None); roofline does.
    """

    backend_factory: ClassVar[Callable[[], CostBackend]]
    covers_all_compute: ClassVar[bool] = False

    # Hooks a subclass may override.
    def gpu(self) -> GpuSpec:
        return toy_cluster().gpu

    def sample_nodes(self) -> Sequence[Node]:
        """Compute nodes the backend is asked about (GEMMs of several sizes and dtypes)."""
        return [
            gemm_node(4096, 4096, 4096, node_id=0),
            gemm_node(1, 4096, 4096, node_id=1),
            gemm_node(8192, 28672, 8192, node_id=2),
            gemm_node(2048, 1024, 512, dtype="fp8", node_id=3),
        ]

    def sample_points(self) -> Sequence[ShapePoint]:
        return [ShapePoint(1, 1, 1), ShapePoint(2, 4096, 4096)]

    def _backend(self) -> CostBackend:
        factory = type(self).backend_factory
        return factory()

    def test_non_negative_and_finite(self) -> None:
        backend, gpu = self._backend(), self.gpu()
        for node in self.sample_nodes():
            for point in self.sample_points():
                cost = backend.cost(node, point, gpu)
                if cost is None:
                    assert not self.covers_all_compute, f"{node.name} not priced"
                    continue
                assert math.isfinite(cost.duration_s) and cost.duration_s >= 0, cost
                assert cost.provenance in PROVENANCES, cost.provenance

    def test_deterministic(self) -> None:
        gpu = self.gpu()
        a, b = self._backend(), self._backend()
        for node in self.sample_nodes():
            for point in self.sample_points():
                assert a.cost(node, point, gpu) == a.cost(node, point, gpu)
                assert a.cost(node, point, gpu) == b.cost(node, point, gpu)

    def test_comm_nodes_are_not_priced(self) -> None:
        backend, gpu = self._backend(), self.gpu()
        for kind in (OpKind.ALL_REDUCE, OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER,
                     OpKind.ALL_TO_ALL, OpKind.SEND_RECV):
            node = comm_node(kind, 2**20, 8)
            assert backend.cost(node, ShapePoint(1, 1, 1), gpu) is None, kind

    def test_monotone_in_flops(self) -> None:
        """More work of the same shape family never takes less time."""
        backend, gpu = self._backend(), self.gpu()
        point = ShapePoint(1, 1, 1)
        previous = 0.0
        for m in (256, 1024, 4096, 16384):
            cost = backend.cost(gemm_node(m, 8192, 8192), point, gpu)
            if cost is None:
                assert not self.covers_all_compute
                continue
            assert cost.duration_s >= previous, (m, cost.duration_s, previous)
            previous = cost.duration_s


class PassContract:
    """Contract every graph ``Pass`` satisfies. Subclass as ``Test...``.

    Attributes:
        pass_factory: zero-argument callable returning the pass under test.
    Override ``input_graph()`` (a graph the pass applies to) and ``context()``.
    """

    pass_factory: ClassVar[Callable[[], Pass]]

    def input_graph(self) -> OpGraph:
        raise NotImplementedError("PassContract subclasses override input_graph()")

    def context(self) -> PassContext:
        from charon_search.passes.base import PassContext

        return PassContext()

    def _run(self) -> tuple[Any, OpGraph, Any]:
        p = type(self).pass_factory()
        graph = self.input_graph()
        return p, graph, p(graph, self.context())

    def test_result_passes_ir_check(self) -> None:
        from charon_search.ir.check import check
        from charon_search.passes.base import PassResult

        p, _, result = self._run()
        assert isinstance(result, PassResult)
        check(result.graph, where=f"after pass {p.name or type(p).__name__}")

    def test_requires_and_ensures_are_called(self) -> None:
        p = type(self).pass_factory()
        calls: list[str] = []
        requires, ensures = p.requires, p.ensures

        def spy_requires(graph: OpGraph, ctx: Any) -> None:
            calls.append("requires")
            requires(graph, ctx)

        def spy_ensures(graph: OpGraph, ctx: Any) -> None:
            calls.append("ensures")
            ensures(graph, ctx)

        p.requires = spy_requires  # type: ignore[method-assign]
        p.ensures = spy_ensures  # type: ignore[method-assign]
        p(self.input_graph(), self.context())
        assert calls == ["requires", "ensures"], calls

    def test_input_graph_is_not_mutated(self) -> None:
        p = type(self).pass_factory()
        graph = self.input_graph()
        nodes_before, tensors_before = graph.nodes, dict(graph.tensors)
        p(graph, self.context())
        assert graph.nodes == nodes_before
        assert dict(graph.tensors) == tensors_before

    def test_deterministic(self) -> None:
        _, _, first = self._run()
        _, _, second = self._run()
        assert first.graph.nodes == second.graph.nodes
        assert first.modified == second.modified
