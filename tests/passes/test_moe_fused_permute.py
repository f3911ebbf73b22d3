"""Megatron-Core MoE permute / router fusion (``Layout.moe_fused_permute``, issue 8)."""

from __future__ import annotations

import pytest

from charon_search.frontend import trace_model
from charon_search.ir import Role
from charon_search.passes import PassContext, parallelize_block
from charon_search.passes.fusion import MOE_PERMUTE_KINDS, MOE_PERMUTE_ROLES

B, S = 1.0, 4096.0


@pytest.fixture(scope="module")
def moe_block():
    return trace_model("deepseek-v3", phase="train", dtype="bf16").blocks["moe"]


def _local_ops(graph, role):
    return [n for n in graph.nodes if n.role == role and n.kind in MOE_PERMUTE_KINDS]


# The combine's fp32 product / gather / sum over tokens x top_k x hidden collapses to one read of
# the expert outputs; the dispatch was one gather already (its sort / histogram are small).
@pytest.mark.parametrize("role, bytes_ratio", [(Role.MOE_COMBINE, 0.5), (Role.MOE_DISPATCH, 1.0)])
def test_each_run_of_permute_ops_becomes_one_kernel(moe_block, role, bytes_ratio) -> None:
    assert role in MOE_PERMUTE_ROLES
    plain = parallelize_block(moe_block, PassContext())
    fused = parallelize_block(moe_block, PassContext(moe_fused_permute=True))
    for a, b in ((plain.forward, fused.forward), (plain.backward, fused.backward)):
        before, after = _local_ops(a, role), _local_ops(b, role)
        assert 0 < len(after) < len(before)
        # the same work in fewer kernels that only move their external inputs and outputs
        flops = sum(float(n.flops(B, S, S)) for n in before)
        assert sum(float(n.flops(B, S, S)) for n in after) == pytest.approx(flops)
        assert sum(float(n.bytes(B, S, S)) for n in after) < \
            bytes_ratio * sum(float(n.bytes(B, S, S)) for n in before)


def test_expert_gemms_are_untouched(moe_block) -> None:
    plain = parallelize_block(moe_block, PassContext())
    fused = parallelize_block(moe_block, PassContext(moe_fused_permute=True))
    for a, b in ((plain.forward, fused.forward), (plain.backward, fused.backward)):
        ga = [(n.name, n.kind) for n in a.nodes if n.role == Role.MOE_EXPERT]
        gb = [(n.name, n.kind) for n in b.nodes if n.role == Role.MOE_EXPERT]
        assert ga == gb
