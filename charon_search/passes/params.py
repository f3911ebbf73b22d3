"""Per-rank parameter counts of a traced block under TP/EP (for ZeRO/FSDP, DDP and the
optimizer step)."""

from __future__ import annotations

from dataclasses import dataclass

from charon_search.ir import OpGraph, OpKind, Role
from charon_search.passes.tensor_parallel import COLUMN_ROLES, ROW_ROLES, is_replicated_gemm

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


def local_params(forward: OpGraph, *, tp: int = 1, ep: int = 1,
                 gemm_weights: bool = False) -> LocalParams:
    """Split the forward graph's parameters into per-rank dense and expert counts.

    TP shards the weights of column/row GEMMs, shared experts and the vocab-parallel embedding
    and LM head; EP shards routed expert weights; norms, routers and MLA down-projections are
    replicated. ``gemm_weights``: count only the parameters a GEMM or grouped GEMM reads.
    """
    readers: dict[int, list] = {}
    for n in forward.nodes:
        for t in n.inputs:
            readers.setdefault(t, []).append(n)
    dense = expert = 0.0
    for t in forward.param_tensors:
        numel = forward.tensors[t].numel.const_value()
        users = readers.get(t, [])
        if gemm_weights and not any(u.kind in (OpKind.GEMM, OpKind.GROUPED_GEMM)
                                    for u in users):
            continue
        if any(u.kind == OpKind.GROUPED_GEMM for u in users):
            expert += numel / ep
        elif any(
            (u.kind == OpKind.GEMM and not is_replicated_gemm(u) and (
                u.role in COLUMN_ROLES or u.role in ROW_ROLES or u.role == Role.MOE_SHARED))
            or u.kind == OpKind.EMBEDDING for u in users
        ):
            dense += numel / tp
        else:
            dense += numel
    return LocalParams(dense_numel=dense, expert_numel=expert)
