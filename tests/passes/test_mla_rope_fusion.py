"""Megatron-Core's fused MLA RoPE kernels (``Layout.mla_rope_fusion``, ``passes.mla_rope``).

DeepSeek-V3 at tp 1 (128 heads, query/key head 192 = 128 + 64 positional, value head 128,
kv_lora_rank 512): the traced HF attention assembles the query and the per-head key with RoPE,
``copy`` and ``slice_scatter`` ops; the fused kernels read the region's external inputs and
write its external outputs once.
"""

from __future__ import annotations

import pytest

from charon_search.frontend import trace_model
from charon_search.ir import OpKind
from charon_search.passes import PassContext, parallelize_block
from charon_search.passes.mla_rope import JOIN_TARGET, mla_rope_region
from charon_search.validation import default_files, load_files
from charon_search.validation.translate import to_case

B, S = 1.0, 4096.0
H, QK, V, ROPE, LORA = 128, 192, 128, 64, 512
BF16 = 2


@pytest.fixture(scope="module")
def dense_block():
    return trace_model("deepseek-v3", phase="train", dtype="bf16").blocks["dense"]


def _fused(graph):
    return [n for n in graph.nodes if "mla_rope" in n.tags and n.target != JOIN_TARGET]


def _attention(graph, kind):
    return next(n for n in graph.nodes if n.kind == kind)


def test_forward_region_becomes_one_kernel_of_its_external_tensors(dense_block) -> None:
    plain = parallelize_block(dense_block, PassContext(fused_kernels=True))
    fused = parallelize_block(dense_block, PassContext(fused_kernels=True, mla_rope_fusion=True))
    attn = _attention(plain.forward, OpKind.ATTENTION)
    region = mla_rope_region(plain.forward, attn)
    # RoPE (query and shared key) and the key assembly: new_empty, copy, slice_scatter
    assert {n.kind for n in region} <= {OpKind.ELEMENTWISE, OpKind.COPY}
    assert any(n.target.startswith("aten.slice_scatter") for n in region)
    (kernel,) = _fused(fused.forward)
    tok = B * S
    # reads q (H x 192), the kv_a output (512 + 64) and kv (H x (128 + 128)), plus the RoPE
    # tables; writes the roped query and the assembled key (H x 192 each)
    reads = tok * (H * QK + (LORA + ROPE) + H * (QK - ROPE + V)) * BF16
    writes = tok * 2 * H * QK * BF16
    assert float(kernel.bytes_written(B, S, S)) == pytest.approx(writes)
    assert reads <= float(kernel.bytes_read(B, S, S)) < reads * 1.01  # + cos / sin
    before = sum(float(n.bytes(B, S, S)) for n in region)
    assert float(kernel.bytes(B, S, S)) < 0.6 * before
    # the other ops stay as zero-cost joins: the attention reads the same tensors as before
    joins = [n for n in fused.forward.nodes if n.target == JOIN_TARGET]
    assert len(joins) == len(region) - 1
    assert all(float(n.bytes(B, S, S)) == 0 for n in joins)
    assert _attention(fused.forward, OpKind.ATTENTION).inputs == attn.inputs


def test_backward_gradient_chain_becomes_one_kernel(dense_block) -> None:
    plain = parallelize_block(dense_block, PassContext(fused_kernels=True))
    fused = parallelize_block(dense_block, PassContext(fused_kernels=True, mla_rope_fusion=True))
    bwd = _attention(plain.backward, OpKind.ATTENTION_BWD)
    region = mla_rope_region(plain.backward, bwd)
    assert len(region) > 15  # the autograd copy / clone / slice_scatter / cat chain and RoPE
    # nothing outside the chain: no GEMM, norm or collective, no op fed by another input
    assert not any(n.kind in (OpKind.GEMM, OpKind.NORM) or n.is_comm for n in region)
    (kernel,) = _fused(fused.backward)
    tok = B * S
    # dq, dk, dv in; d(kv) (H x 256), d(k_pe) (64) and dq out
    assert float(kernel.bytes_written(B, S, S)) == pytest.approx(
        tok * (H * (QK - ROPE + V) + ROPE + H * QK) * BF16)
    assert float(kernel.bytes_read(B, S, S)) == pytest.approx(
        tok * H * (QK + QK + V) * BF16, rel=0.01)
    # the gradient GEMMs read what they read before
    gemms = [n.inputs for n in plain.backward.nodes if n.kind == OpKind.GEMM]
    assert [n.inputs for n in fused.backward.nodes if n.kind == OpKind.GEMM] == gemms


def test_only_mla_and_only_when_asked() -> None:
    llama = trace_model("debug-llama", phase="train", dtype="bf16").blocks["dense"]
    a = parallelize_block(llama, PassContext(fused_kernels=True))
    b = parallelize_block(llama, PassContext(fused_kernels=True, mla_rope_fusion=True))
    assert [n.name for n in a.forward.nodes] == [n.name for n in b.forward.nodes]
    assert not _fused(b.forward) and not _fused(b.backward)
    recs = {r.id: r for r in load_files(default_files())}
    assert to_case(recs["deepseek_v3_gb200_mcore_final_hybridep"]).layout.mla_rope_fusion
    # DeepSeek's own framework (not Megatron-Core): no source says what it runs
    assert not to_case(recs["deepseek_v3_pretrain_2048_h800"]).layout.mla_rope_fusion


def test_mla_with_equal_head_sizes_is_fused() -> None:
    # GLM-5's MLA: query/key head 192 + 64 = value head 256, so the head sizes alone do not
    # tell it from MHA; its kv_a_proj_with_mqa down-projection does.
    blk = trace_model("glm-5", phase="train", dtype="bf16").blocks["dense"]
    pb = parallelize_block(blk, PassContext(fused_kernels=True, mla_rope_fusion=True, debug=True))
    assert len(_fused(pb.forward)) == 1 and len(_fused(pb.backward)) == 1


def test_fused_under_eager_attention(dense_block) -> None:
    # Megatron's unfused core attention still runs the fused RoPE kernels: the pass must see
    # the attention nodes before eager_attention expands them.
    pb = parallelize_block(dense_block, PassContext(fused_kernels=True, mla_rope_fusion=True,
                                                    attention_kernel="eager", debug=True))
    assert len(_fused(pb.forward)) == 1 and len(_fused(pb.backward)) == 1


def test_refused_without_mla() -> None:
    from charon_search.catalog import load_model
    from charon_search.errors import ConfigError
    from charon_search.layout import Layout

    lay = Layout(mla_rope_fusion=True)
    lay.validate_for(load_model("deepseek-v3"))
    with pytest.raises(ConfigError, match="`mla_rope_fusion` needs multi-latent attention"):
        lay.validate_for(load_model("llama-3.1-8b"))
