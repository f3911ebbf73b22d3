"""Static memory closed forms: ZeRO paper (Rajbhandari et al., arXiv 1910.02054, Fig. 1).

Mixed-precision Adam holds 2 (fp16/bf16 params) + 2 (grads) + 12 (fp32 master, m, v) bytes per
parameter: 16 unsharded; ZeRO-1 2 + 2 + 12/d; ZeRO-2 2 + (2 + 12)/d; ZeRO-3 (2 + 2 + 12)/d.
"""

from __future__ import annotations

import pytest

from charon_search.layout import Layout
from charon_search.memory import MemoryOptions, memory_report
from charon_search.memory.static import StateRecipe, shard_states
from charon_search.testing import toy_cluster

from .conftest import gpt_spec

D = 8


def _states(rep) -> tuple[float, float, float]:
    st = rep.stages[0]
    return st.params_bytes, st.grads_bytes, st.optimizer_bytes


def _num_params(profile) -> float:
    p = profile.params
    return p["embedding"].total + p["lm_head"].total + 96 * p["dense"].total


@pytest.mark.parametrize(("zero", "per_param"), [
    (0, (2, 2, 12)),
    (1, (2, 2, 12 / D)),
    (2, (2, 2 / D, 12 / D)),
    (3, (2 / D, 2 / D, 12 / D)),
])
def test_zero_stages_closed_form(gpt3_profile, zero: int, per_param: tuple) -> None:
    layout = Layout(dp=D, zero_stage=zero, micro_batch_size=1, global_batch_size=D, seq_len=2048)
    rep = memory_report(gpt_spec(), layout, toy_cluster(), profile=gpt3_profile)
    n = _num_params(gpt3_profile)
    assert n == pytest.approx(174.6e9, rel=0.01)  # GPT-3 175B incl. embedding and head
    for got, want in zip(_states(rep), per_param, strict=True):
        assert got == pytest.approx(want * n, rel=1e-9)
    assert sum(_states(rep)) == pytest.approx(
        {0: 16, 1: 4 + 12 / D, 2: 2 + 14 / D, 3: 16 / D}[zero] * n, rel=1e-9)


def test_unsharded_16_bytes_per_param(gpt3_profile) -> None:
    rep = memory_report(gpt_spec(), Layout(), toy_cluster(), profile=gpt3_profile)
    assert sum(_states(rep)) == pytest.approx(16 * _num_params(gpt3_profile), rel=1e-9)


def test_tensor_and_pipeline_sharding(gpt3_profile) -> None:
    layout = Layout(tp=8, pp=4, schedule="1f1b", micro_batch_size=1, global_batch_size=8)
    rep = memory_report(gpt_spec(), layout, toy_cluster(), profile=gpt3_profile)
    dense = gpt3_profile.params["dense"]
    per_layer = dense.tp / 8 + dense.rep
    emb = gpt3_profile.params["embedding"].tp / 8
    head = gpt3_profile.params["lm_head"].tp / 8 + gpt3_profile.params["lm_head"].rep
    want = [24 * per_layer + emb, 24 * per_layer, 24 * per_layer, 24 * per_layer + head]
    assert [st.params_bytes / 2 for st in rep.stages] == pytest.approx(want, rel=1e-9)
    # Norm weights are replicated, projections split: 12h^2/8 + 2h + ... per layer.
    h = 12288
    assert dense.rep == 2 * h
    assert dense.tp == 12 * h * h


def test_fsdp_gathered_buffers(gpt3_profile) -> None:
    layout = Layout(dp=D, zero_stage=3, micro_batch_size=1, global_batch_size=D)
    rep = memory_report(gpt_spec(), layout, toy_cluster(), profile=gpt3_profile,
                        options=MemoryOptions(fsdp_prefetch_depth=1))
    # Largest unit (embedding, V*h) gathered for the unit computing + 1 prefetched, plus its
    # unsharded gradient, all in 2-byte dtype.
    unit = max(gpt3_profile.params[n].total for n in ("embedding", "dense", "lm_head"))
    assert rep.stages[0].buffers_bytes == pytest.approx(unit * 2 * 3)


def test_custom_recipe_and_expert_shards() -> None:
    recipe = StateRecipe(param_bytes=2, grad_bytes=4, optimizer_bytes=12)
    st = shard_states(dense_params=100.0, expert_params=80.0, zero_stage=1, dense_shards=8,
                      expert_shards=2, recipe=recipe)
    assert st.params_bytes == 360
    assert st.grads_bytes == 720
    assert st.optimizer_bytes == pytest.approx(100 * 12 / 8 + 80 * 12 / 2)


def test_framework_recipes(gpt3_profile) -> None:
    n = _num_params(gpt3_profile)
    layout = Layout(dp=D, zero_stage=1, micro_batch_size=1, global_batch_size=D)
    # Megatron bf16 + distributed optimizer: 2 (bf16) + 4 (fp32 grads) + 12/d (Megatron-Core
    # distributed optimizer docs: "bf16 param, fp32 grads: 6 + 12/d").
    mega = memory_report(gpt_spec(), layout, toy_cluster(), profile=gpt3_profile,
                         options=MemoryOptions.for_framework("megatron"))
    assert sum(_states(mega)) == pytest.approx((6 + 12 / D) * n, rel=1e-9)
    # torchtitan FSDP2 (zero 3): fp32 sharded params + fp32 sharded grads + AdamW m, v = 16/d.
    tt = MemoryOptions.for_framework("torchtitan")
    assert (tt.recipe, tt.selective_policy, tt.fp8_saved_activations) == ("fsdp2", "op", False)
    fsdp = memory_report(gpt_spec(), layout.replace(zero_stage=3), toy_cluster(),
                         profile=gpt3_profile, options=tt)
    assert _states(fsdp) == pytest.approx((4 * n / D, 4 * n / D, 8 * n / D), rel=1e-9)
    # FSDP without resharding after forward (zero 2) also holds every bf16 weight whole.
    z2 = memory_report(gpt_spec(), layout.replace(zero_stage=2), toy_cluster(),
                       profile=gpt3_profile, options=tt)
    assert _states(z2)[0] == pytest.approx(4 * n / D + 2 * n, rel=1e-9)
