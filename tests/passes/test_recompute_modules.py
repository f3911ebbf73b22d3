"""Megatron-Core ``--recompute-modules`` under selective recompute (issue 8)."""

from __future__ import annotations

import pytest

from charon_search.errors import ConfigError
from charon_search.frontend import trace_model
from charon_search.ir import OpKind, Phase, Role
from charon_search.layout import Layout
from charon_search.passes import PassContext, parallelize_block
from charon_search.passes.synthetic import synthetic_block


def _recomputed(kind: str, **kw) -> list:
    pb = parallelize_block(synthetic_block(kind), PassContext(recompute="selective", **kw))
    return [n for n in pb.backward.nodes if n.phase == Phase.RECOMPUTE]


def test_default_selective_recomputes_the_attention_core_only() -> None:
    nodes = _recomputed("dense")
    assert nodes and {n.role for n in nodes} == {Role.ATTN_CORE}


def test_mlp_and_moe_act_leave_the_attention_core_saved() -> None:
    dense = _recomputed("dense", recompute_modules=("mlp", "moe_act"))
    assert {n.role for n in dense} == {Role.MLP_IN, Role.MLP_ACT, Role.MLP_OUT}
    assert sum(n.kind == OpKind.GEMM for n in dense) == 3  # gate, up, down
    moe = _recomputed("moe", recompute_modules=("mlp", "moe_act"))
    assert moe, "the experts' activation is re-run"
    assert all(n.role == Role.MOE_EXPERT and n.kind == OpKind.ELEMENTWISE for n in moe)
    assert not any(n.kind in (OpKind.ATTENTION, OpKind.GROUPED_GEMM) for n in moe)


def test_core_attn_module_is_the_default_policy() -> None:
    a = [(n.name, n.role) for n in _recomputed("dense", recompute_modules=("core_attn",))]
    b = [(n.name, n.role) for n in _recomputed("dense")]
    assert a == b


def test_unknown_module_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="recompute_modules"):
        Layout(recompute="selective", recompute_modules=("attention",))


def test_mla_up_proj_and_layernorm_recompute_the_deepseek_v3_report_modules() -> None:
    # DeepSeek-V3 report sec. 3.2.3: "Recomputation of RMSNorm and MLA Up-Projection"
    block = trace_model("deepseek-v3", phase="train", dtype="bf16").blocks["dense"]
    ctx = PassContext(recompute="selective", recompute_modules=("layernorm", "mla_up_proj"))
    pb = parallelize_block(block, ctx)
    nodes = [n for n in pb.backward.nodes if n.phase == Phase.RECOMPUTE]
    gemms = sorted(n.module_path.rsplit(".", 1)[-1] for n in nodes if n.kind == OpKind.GEMM)
    assert gemms == ["kv_b_proj", "q_b_proj"]
    norms = {str(n.role) for n in nodes if n.kind == OpKind.NORM}
    assert norms == {"attn.norm", "mlp.norm", "attn.qkv"}  # input, pre-MLP and latent norms
    assert any(n.role == Role.ATTN_ROPE for n in nodes)
    assert not any(n.role == Role.ATTN_CORE for n in nodes)
