"""Per-rank parameter counts of a traced block under TP/EP (for ZeRO/FSDP, DDP and the
optimizer step)."""

from __future__ import annotations

from dataclasses import dataclass

from charon_search.ir import OpGraph, OpKind, Role
from charon_search.passes.tensor_parallel import tp_sharded_role, vocab_parallel

__all__ = ["LocalParams", "local_params"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LocalParams:
    """Parameters one rank holds for one block instance."""

    dense_numel: float
    """Non-expert parameters (after TP sharding): gradients reduced over dp * cp."""
    expert_numel: float
    """Routed-expert parameters (after EP sharding): gradients reduced over dp * cp / ep."""

    @property
    def numel(self) -> float:
        return self.dense_numel + self.expert_numel


def local_params(forward: OpGraph, *, tp: int = 1, ep: int = 1) -> LocalParams:
    """Split the forward graph's parameters into per-rank dense and expert counts.

    TP shards the weights of column/row GEMMs, shared experts and the vocab-parallel embedding
    and LM head; EP shards routed expert weights; norms, routers, MLA down-projections and
    learned position embeddings are replicated.
    """
    dense = expert = 0.0
    for numel, is_expert, _ in local_param_tensors(forward, tp=tp, ep=ep):
        if is_expert:
            expert += numel
        else:
            dense += numel
    return LocalParams(dense_numel=dense, expert_numel=expert)


def local_param_tensors(forward: OpGraph, *, tp: int = 1, ep: int = 1
                        ) -> list[tuple[float, bool, bool]]:
    """``(local elements, routed expert, fused-accumulation weight)`` of each parameter tensor
    of the forward graph, sharded as ``local_params`` shards them. The last flag marks the
    matrices whose weight-gradient GEMM can add into a gradient buffer itself (Megatron's
    ``--gradient-accumulation-fusion``: a column / row / shared-expert or routed-expert weight
    read by a (grouped) GEMM); biases, norm weights, embedding tables and router weights get
    their gradients from other kernels."""
    readers: dict[int, list] = {}
    for n in forward.nodes:
        for t in n.inputs:
            readers.setdefault(t, []).append(n)
    out: list[tuple[float, bool, bool]] = []
    for t in forward.param_tensors:
        spec = forward.tensors[t]
        numel = spec.numel.const_value()
        users = readers.get(t, [])
        matrix = len(spec.shape) >= 2
        if any(u.kind == OpKind.GROUPED_GEMM for u in users):
            out.append((numel / ep, True, matrix))
            continue
        gemm = matrix and any(u.kind == OpKind.GEMM and u.role != Role.MOE_ROUTER
                              for u in users)
        if any((u.kind == OpKind.GEMM and tp_sharded_role(u)) or vocab_parallel(u)
               for u in users):
            out.append((numel / tp, False, gemm))
        else:
            out.append((numel, False, gemm))
    return out
