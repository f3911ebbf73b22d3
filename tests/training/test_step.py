"""simulate_training on synthetic traced blocks (no torch): validation, determinism, physics."""

from __future__ import annotations

import math

import numpy as np
import pytest

from charon_search.catalog.spec import ModelSpec
from charon_search.cli import main
from charon_search.errors import ConfigError
from charon_search.layout import Layout
from charon_search.passes.synthetic import synthetic_model
from charon_search.sim.costing import GraphCoster
from charon_search.testing import toy_cluster
from charon_search.training import simulate_training, stage_layers

from .conftest import SPEC, TRACED, FlopsCostModel


def _sim(layout: Layout, **kw):
    return simulate_training(SPEC, toy_cluster(), layout, cost_model=FlopsCostModel(),
                             traced=TRACED, memory=False, **kw)


def test_step_report_fields_and_breakdown_sum() -> None:
    r = _sim(Layout(tp=2, pp=2, schedule="1f1b", global_batch_size=8, seq_len=256))
    d = r.to_dict()
    for key in ("step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "mfu", "hfu",
                "model_flops_per_step", "breakdown", "cost_sources", "memory"):
        assert key in d
    bd = r.breakdown
    parts = (bd.compute_s + bd.exposed_comm_s + bd.pipeline_bubble_s + bd.overlap_slowdown_s
             + bd.optimizer_s + bd.other_s)
    assert parts == pytest.approx(r.step_time_s, rel=1e-6)
    assert r.tokens_per_s == pytest.approx(8 * 256 / r.step_time_s)


def test_deterministic() -> None:
    lay = Layout(tp=2, pp=2, schedule="interleaved-1f1b", vpp=2, global_batch_size=4,
                 seq_len=128)
    a, b = _sim(lay), _sim(lay)
    assert a.to_dict() == b.to_dict()
    ua = [(u.rank, u.op, u.start_s, u.end_s) for u in a.timeline.pipeline.units]
    ub = [(u.rank, u.op, u.start_s, u.end_s) for u in b.timeline.pipeline.units]
    assert ua == ub


@pytest.mark.parametrize(("layout", "gpus", "rule"), [
    (Layout(tp=2, dp=2, global_batch_size=2), 8, "tp * pp * dp * cp == gpus"),
    (Layout(tp=3), None, "`tp` must divide num_attention_heads"),
    (Layout(pp=16, schedule="1f1b", global_batch_size=16), None, "pp * vpp <= num_layers"),
    (Layout(pp=2, vpp=2, schedule="interleaved-1f1b", global_batch_size=3), None,
     "num_micro_batches % pp == 0"),
])
def test_invalid_layouts_raise(layout: Layout, gpus: int | None, rule: str) -> None:
    with pytest.raises(ConfigError, match=rule.replace("*", r"\*")):
        _sim(layout, num_gpus=gpus)


def test_layout_may_be_a_mapping_and_anything_else_is_a_config_error() -> None:
    """The API takes a layout as YAML gives it: a mapping of ``Layout`` fields is the same
    layout; a misspelt key or a cluster name in the layout's place is a ``ConfigError``."""
    fields = {"tp": 2, "pp": 2, "schedule": "1f1b", "global_batch_size": 8, "seq_len": 256}
    assert _sim(fields).to_dict() == _sim(Layout(**fields)).to_dict()
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['tpp'\]; did you mean"):
        _sim({"tpp": 2})
    with pytest.raises(ConfigError, match=r"`layout` must be a Layout or a mapping of its "
                                          r"fields, but got str 'h100-sxm-8gpu' "
                                          r"\(simulate_training takes model, cluster, layout\)"):
        _sim("h100-sxm-8gpu")


def test_ep_needs_moe() -> None:
    with pytest.raises(ConfigError, match="ep > 1"):
        _sim(Layout(dp=2, ep=2, global_batch_size=2))


def test_cli_invalid_layout_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["train", "--model", "debug-llama", "--cluster", "h100-sxm-8gpu", "--gpus", "8",
               "--tp", "3", "--pp", "1"])
    assert rc == 2
    assert "must divide gpus" in capsys.readouterr().err


def test_cli_unknown_yaml_key_exits_2(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "layout.yaml"
    f.write_text("tp: 2\ntensor_parallel: 2\n")
    rc = main(["train", "--model", "debug-llama", "--cluster", "h100-sxm-8gpu",
               "--layout", str(f)])
    assert rc == 2
    assert "tensor_parallel" in capsys.readouterr().err


def test_ring_allreduce_one_tier_closed_form() -> None:
    cl = toy_cluster()
    coster = GraphCoster(cl, FlopsCostModel(), strides={"tp": 1})
    tier = cl.tiers[0]
    n, nbytes = 2, 64e6
    t, _ = coster.collective("all_reduce", nbytes, n, "tp")
    from charon_search.cost.collectives import collective_time
    ring = collective_time("all_reduce", nbytes, n, cl, algo="ring")
    cal = cl.calibration
    eff = cal.collective_bw_efficiency.get(tier.name, 1.0)
    alpha = cal.collective_alpha_s.get(tier.name, tier.latency_s)
    closed = 2 * (n - 1) / n * nbytes / (tier.bandwidth_bytes_per_s * eff) + 2 * (n - 1) * alpha
    assert ring == pytest.approx(closed + cal.collective_launch_s, rel=1e-6)
    assert t <= ring + 1e-12


def test_stage_layers_uneven_first_last() -> None:
    parts = stage_layers(("dense",) * 10, 4)
    assert [len(p) for p in parts] == [2, 3, 3, 2]
    assert sum(len(p) for p in stage_layers(("dense",) * 61, 16)) == 61


def test_more_dp_overlap_and_zero3_run() -> None:
    for lay in (Layout(dp=4, zero_stage=3, global_batch_size=8, seq_len=128),
                Layout(dp=4, zero_stage=1, global_batch_size=8, seq_len=128),
                Layout(tp=2, cp=2, global_batch_size=2, seq_len=256, recompute="full"),
                Layout(tp=2, pp=2, schedule="zero-bubble", global_batch_size=8, seq_len=128),
                Layout(tp=2, pp=2, schedule="dualpipe", global_batch_size=8, seq_len=128)):
        r = _sim(lay)
        assert r.step_time_s > 0 and 0 < r.mfu < 1


@pytest.mark.slow
def test_real_model_end_to_end_with_memory_and_trace(tmp_path) -> None:
    """debug-llama through the frontend, the fused cost model and the memory model."""
    rc = main(["train", "--model", "debug-llama", "--cluster", "h100-sxm-8gpu", "--gpus", "8",
               "--tp", "2", "--pp", "2", "--sp", "--gbs", "16", "--seq", "256",
               "--json", str(tmp_path / "r.json"), "--trace", str(tmp_path / "t.json")])
    assert rc == 0
    import json
    d = json.loads((tmp_path / "r.json").read_text())
    assert d["memory"] is not None and "peak_reserved_bytes" in d["memory"]
    assert sum(d["cost_sources"].values()) == pytest.approx(1.0)
    trace = json.loads((tmp_path / "t.json").read_text())
    names = {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert any(n.startswith("F mb0") for n in names)
    assert any("self_attn" in n for n in names)  # op-level events carry module paths
    pids = {e["pid"] for e in trace["traceEvents"]}
    assert pids == {0, 1}


def test_recompute_num_layers_between_none_and_full() -> None:
    base = dict(pp=2, schedule="1f1b", global_batch_size=4, seq_len=256)
    none = _sim(Layout(recompute="none", **base)).step_time_s
    part = _sim(Layout(recompute="full", recompute_num_layers=2, **base)).step_time_s
    full = _sim(Layout(recompute="full", **base)).step_time_s
    assert none < part < full
    # 8 layers on pp 2: a chunk holds 4, so a quota of 4 recomputes them all and 40 is a typo.
    assert _sim(Layout(recompute="full", recompute_num_layers=4, **base)).step_time_s == full
    with pytest.raises(ConfigError, match=r"at most the 4 a chunk holds, but got 40"):
        _sim(Layout(recompute="full", recompute_num_layers=40, **base))


MOE_SPEC = ModelSpec(name="synthetic-moe", hf_config={}, model_type="mixtral", num_layers=4,
                     hidden_size=256, num_attention_heads=8, num_key_value_heads=4,
                     head_dim=32, intermediate_size=512, vocab_size=1024, num_experts=8,
                     num_experts_per_token=2, moe_intermediate_size=128,
                     layer_types=("dense",) + ("moe",) * 3)
MOE_TRACED = synthetic_model(MOE_SPEC, layer_types=("dense", "moe"))


def test_moe_ep_imbalance_and_overlap() -> None:
    def sim(**kw: object) -> float:
        # Long sequences: bandwidth-bound all-to-alls (with tiny ones the halves' extra
        # latency makes the overlap lose, which is also what the model says).
        lay = Layout(tp=2, sequence_parallel=True, dp=2, ep=2, pp=1, global_batch_size=4,
                     seq_len=16384, **kw)
        return simulate_training(MOE_SPEC, toy_cluster(), lay, cost_model=FlopsCostModel(),
                                 traced=MOE_TRACED, memory=False).step_time_s
    base = sim()
    assert sim(expert_load_imbalance=2.0) > base
    assert sim(moe_a2a_overlap=True) <= base * 1.0001


def test_timeline_identical_across_processes() -> None:
    import subprocess
    import sys
    code = ("import sys; sys.path.insert(0, '.'); from tests.training import test_step as t; "
            "from charon_search.layout import Layout; "
            "r = t._sim(Layout(tp=2, pp=2, schedule='interleaved-1f1b', vpp=2, "
            "global_batch_size=4, seq_len=128)); "
            "print(repr([(u.rank, u.op.kind, u.op.mb, u.start_s, u.end_s) "
            "for u in r.timeline.pipeline.units]))")
    outs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True).stdout for _ in range(2)]
    assert outs[0] == outs[1] and len(outs[0]) > 100


def test_hsdp_runs_and_differs_from_full_shard() -> None:
    base = dict(dp=4, zero_stage=3, global_batch_size=8, seq_len=512)
    full = _sim(Layout(**base))
    hsdp = _sim(Layout(hsdp_shard=2, **base))
    assert full.step_time_s > 0 and hsdp.step_time_s > 0
    assert hsdp.step_time_s != full.step_time_s


def test_eager_attention_layouts() -> None:
    with pytest.raises(ConfigError, match="attention_kernel"):
        Layout(attention_kernel="flashy")
    with pytest.raises(ConfigError, match="eager"):
        _sim(Layout(cp=2, global_batch_size=1, seq_len=256, attention_kernel="eager"))
    flash = _sim(Layout(tp=2, global_batch_size=4, seq_len=256))
    eager = _sim(Layout(tp=2, global_batch_size=4, seq_len=256, attention_kernel="eager"))
    # Same model FLOPs; the unfused core does the masked half too and round-trips s x s.
    assert eager.model_flops_per_step == pytest.approx(flash.model_flops_per_step)
    assert eager.step_time_s > flash.step_time_s


def test_optimizer_step_bytes_include_grad_norm_read() -> None:
    from charon_search.training.step import _optimizer_node
    n = _optimizer_node(1e9, "adam").nodes[0]
    # fp32 master/m/v/grad reads (16 B) + grad-norm read (4 B); master/m/v + bf16 copy writes.
    assert n.bytes_read(1, 1) == pytest.approx(20e9)
    assert n.bytes_written(1, 1) == pytest.approx(14e9)


def test_node_dedup_ep_scaleout_bytes_follow_group_limited_routing() -> None:
    # DeepSeek-V3: top-8 of 256 experts in at most topk_group=4 of n_group=8 groups; EP 64 on
    # 8-GPU nodes puts one group per node, so a token crosses IB to at most 4 nodes, once each
    # (DeepEP): 4/8 of the per-expert bytes.
    from charon_search.catalog import load_model
    from charon_search.hardware import load_cluster
    from charon_search.training.step import _ep_a2a_byte_scale, ep_distinct_ranks

    spec = load_model("deepseek-v3")
    cl = load_cluster("h800-cluster")
    assert cl.tiers[0].num_devices == 8
    lay = Layout(dp=64, ep=64, ep_node_dedup=True, global_batch_size=64)
    assert _ep_a2a_byte_scale(spec, cl, lay, {"ep": 1}) == pytest.approx(0.5)
    # EP inside one node: once per target rank, the expected distinct ranks over top-8
    lay8 = Layout(dp=8, ep=8, ep_node_dedup=True, global_batch_size=8)
    assert _ep_a2a_byte_scale(spec, cl, lay8, {"ep": 1}) == pytest.approx(
        ep_distinct_ranks(256, 8, 8, 8, 4) / 8, rel=1e-12)
    # no dedup (e.g. Megatron's all-to-all dispatcher) or a dense model: the routed bytes
    assert _ep_a2a_byte_scale(spec, cl, Layout(dp=64, ep=64, global_batch_size=64),
                              {"ep": 1}) == 1.0
    assert _ep_a2a_byte_scale(load_model("llama-3.1-8b"), cl, lay, {"ep": 1}) == 1.0


@pytest.mark.parametrize("ep,n_group,topk_group",
                         [(32, 8, 4), (16, 8, 4), (8, 8, 4), (4, 8, 4), (8, 0, 0)])
def test_distinct_ranks_of_a_tokens_experts_match_a_sampled_router(ep, n_group, topk_group):
    """DeepSeek-V3 routing (256 experts, top-8, ``topk_group`` of ``n_group`` groups) over
    ``ep`` ranks holding consecutive experts: the closed form against 40,000 sampled tokens
    (EP 32, 4 groups: 16 candidate ranks of 8 experts, 16 * (1 - C(120,8)/C(128,8)) = 6.60)."""

    from charon_search.training.step import ep_distinct_ranks

    rng = np.random.default_rng(0)
    experts, k, tokens = 256, 8, 40_000
    groups = n_group or 1
    per_group = experts // groups
    chosen = np.argsort(rng.random((tokens, groups)), axis=1)[:, :topk_group or 1]
    cand = (chosen[:, :, None] * per_group + np.arange(per_group)).reshape(tokens, -1)
    pick = np.take_along_axis(cand, np.argsort(rng.random(cand.shape), axis=1)[:, :k], axis=1)
    ranks = pick // (experts // ep)
    sampled = np.mean([len(set(r)) for r in ranks])
    assert ep_distinct_ranks(experts, k, ep, n_group, topk_group) == pytest.approx(
        sampled, rel=0.01)
    if (ep, n_group) == (32, 8):
        assert ep_distinct_ranks(experts, k, ep, n_group, topk_group) == pytest.approx(
            16 * (1 - math.comb(120, 8) / math.comb(128, 8)), rel=1e-12)


def test_layer_times_full_recompute_adds_one_forward_to_the_backward() -> None:
    """Per-layer times (steady state, no collectives on one GPU): the forward does not depend
    on recompute; full recompute's backward is the plain backward plus one forward."""
    lay = dict(global_batch_size=4, seq_len=256)
    none = _sim(Layout(recompute="none", **lay)).layer_times_s["dense"]
    full = _sim(Layout(recompute="full", **lay)).layer_times_s["dense"]
    assert full["forward_s"] == pytest.approx(none["forward_s"], rel=1e-9)
    assert full["backward_s"] == pytest.approx(none["backward_s"] + none["forward_s"],
                                               rel=1e-6)
    assert none["backward_s"] > none["forward_s"] > 0
    d = _sim(Layout(recompute="none", **lay)).to_dict()["layer_times_s"]
    assert set(d["dense"]) == {"forward_s", "backward_s"}


def test_pp_layout_parses_megatron_notation() -> None:
    from charon_search.layout import pp_layout_stages

    assert pp_layout_stages("Et|(tt|)*2L") == [["E", "t"], ["t", "t"], ["t", "t"], ["L"]]
    assert sum(s.count("t") for s in pp_layout_stages("Et|(tt|)*30L")) == 61  # DeepSeek-V3
    for bad, rule in (("Et|tm|L", "symbols must be one of"), ("tE|ttL", "'E'"),
                      ("Et|Lt", "'L'"), ("E(tt|*2L", "'\\(' must close")):
        with pytest.raises(ConfigError, match=rule):
            pp_layout_stages(bad)
    with pytest.raises(ConfigError, match="pp \\* vpp = 2 stages"):
        Layout(pp=2, schedule="1f1b", global_batch_size=4, pp_layout="Et|tt|ttL")
    with pytest.raises(ConfigError, match="place every decoder layer"):
        _sim(Layout(pp=2, schedule="1f1b", global_batch_size=4, pp_layout="Ettt|tttL"))


def test_pp_layout_sets_each_ranks_layers() -> None:
    """Megatron's --pipeline-model-parallel-layout: rank 0 holds the embedding and 6 of the 8
    layers, rank 1 the other 2 and the LM head; each rank is busy for m micro-batches of its
    blocks' forward + backward (no collectives at pp=2, tp=dp=1)."""
    m = 4
    r = _sim(Layout(pp=2, schedule="1f1b", global_batch_size=m, seq_len=128,
                    pp_layout="Etttttt|ttL"))
    lt = {k: v["forward_s"] + v["backward_s"] for k, v in r.layer_times_s.items()}
    assert r.stage_busy_s[0] == pytest.approx(m * (lt["embedding"] + 6 * lt["dense"]), rel=1e-6)
    assert r.stage_busy_s[1] == pytest.approx(m * (2 * lt["dense"] + lt["lm_head"]), rel=1e-6)
    even = _sim(Layout(pp=2, schedule="1f1b", global_batch_size=m, seq_len=128))
    assert even.stage_busy_s[0] == pytest.approx(m * (lt["embedding"] + 4 * lt["dense"]),
                                                 rel=1e-6)
    assert r.step_time_s > even.step_time_s  # the 6-layer rank is the bottleneck


def test_sliding_window_layers_attend_over_the_window() -> None:
    """gpt-oss alternates 128-key sliding-window and full attention layers (HF
    ``layer_types``): a sliding layer's attention scores each query against the window only,
    unmasked: its attention nodes (forward, recomputed forward, backward) carry w / s of the
    full layer's FLOPs at kv_len = w; full layers are unchanged."""
    import dataclasses

    from charon_search.ir import OpKind
    from charon_search.passes import PassContext, parallelize_block
    from charon_search.training.step import _with_sliding, sliding_layer_types

    w, s = 64, 512
    windowed = dataclasses.replace(SPEC, extra={
        "sliding_window": w, "attention_layer_types": ("sliding_attention", "full_attention") * 4})
    lay = Layout(global_batch_size=2, seq_len=s, recompute="full")
    types = sliding_layer_types(windowed, lay)
    assert types == ("dense@sliding", "dense") * 4
    with_cp = lay.replace(cp=2, global_batch_size=1)
    assert sliding_layer_types(windowed, with_cp) == SPEC.layer_types  # CP keeps full layers
    blocks = {"dense": parallelize_block(TRACED.blocks["dense"], PassContext.from_layout(lay))}
    both = _with_sliding(blocks, types, w)
    for g_full, g_win in ((both["dense"].forward, both["dense@sliding"].forward),
                          (both["dense"].backward, both["dense@sliding"].backward)):
        full = [n for n in g_full.nodes if n.kind in (OpKind.ATTENTION, OpKind.ATTENTION_BWD)]
        win = [n for n in g_win.nodes if n.kind in (OpKind.ATTENTION, OpKind.ATTENTION_BWD)]
        assert len(full) == len(win) > 0
        for f, x in zip(full, win, strict=True):
            assert x.flops(1, s, s) == pytest.approx(f.flops(1, s, s) * w / s)
            assert (x.params["kv_len"](1, s, s), x.params["causal"](1, s, s)) == (w, 0)
    kw = dict(cost_model=FlopsCostModel(), traced=TRACED, memory=False)
    plain = simulate_training(SPEC, toy_cluster(), lay, **kw)
    r = simulate_training(windowed, toy_cluster(), lay, **kw)
    assert r.layer_times_s["dense"] == plain.layer_times_s["dense"]
    assert sum(r.layer_times_s["dense@sliding"].values()) < sum(r.layer_times_s["dense"].values())
    assert r.step_time_s < plain.step_time_s


def test_recompute_num_layers_counts_per_model_chunk_in_memory_too() -> None:
    """8 layers on pp 2 with vpp 2: a chunk holds 2, so a quota of 2 recomputes every layer in
    memory as in time (the memory model had counted it per rank: half the layers)."""
    from charon_search.memory import memory_report

    base = dict(pp=2, vpp=2, schedule="interleaved-1f1b", global_batch_size=8, seq_len=256)
    act = {k: memory_report(SPEC, Layout(recompute="full", recompute_num_layers=k, **base),
                            toy_cluster()).stages[0].activations_bytes for k in (0, 1, 2)}
    assert act[2] == pytest.approx(act[0])
    assert act[1] > act[2]


def test_stage_imbalance_closed_form() -> None:
    """1F1B, p 2, m 4, rank 1 three times rank 0's cost (F 1/3, B 2/6). The pipeline runs
    39: rank 1's 4 x 9 of work after rank 0's first F (1), then rank 0's last B (2). Evenly
    split (F 2, B 4) it runs (m + p - 1)(F + B) = 30, so unequal stages cost 9."""
    from charon_search.sim.layer import UnitCost
    from charon_search.sim.pipeline import run_pipeline
    from charon_search.training.step import _stage_imbalance_s

    def unit(r: int, c: int, kind: str) -> UnitCost:
        d = {"F": 1.0, "B": 2.0}[kind] * (3.0 if r == 1 else 1.0)
        return UnitCost(duration_s=d, compute_s=d)
    pipe = run_pipeline(schedule="1f1b", p=2, m=4, v=1, cost=unit)
    assert max(pipe.rank_end_s) == pytest.approx(39.0)
    bubble = 39.0 - 4 * 3.0  # rank 0 is critical and busy 12
    assert _stage_imbalance_s(pipe, bubble, schedule="1f1b", p=2, m=4, v=1, unit=unit,
                              p2p_s=0.0, split_w=False, pair_overlap=False) == pytest.approx(9.0)


def test_stage_imbalance_is_inside_the_bubble() -> None:
    flat = _sim(Layout(tp=2, global_batch_size=8, seq_len=256)).breakdown
    assert flat.stage_imbalance_s == 0.0
    # Stage 0 holds the embedding, stage 1 the LM head over a 1024 vocabulary: unequal stages.
    bd = _sim(Layout(tp=2, pp=2, schedule="1f1b", global_batch_size=8, seq_len=256)).breakdown
    assert 0.0 < bd.stage_imbalance_s <= bd.pipeline_bubble_s


def test_full_recompute_reruns_the_transformer_layers_only() -> None:
    """Activation checkpointing wraps the transformer layers (Megatron's TransformerBlock,
    torchtitan's model.layers): full recompute adds one forward of every layer to the hardware
    FLOPs, and nothing of the embedding or of the LM head with its loss."""
    from charon_search.passes import PassContext, parallelize_block
    from charon_search.training.step import UNCHECKPOINTED_BLOCKS

    base = dict(global_batch_size=2, seq_len=256)
    none = _sim(Layout(recompute="none", **base))
    full = _sim(Layout(recompute="full", **base))
    ctx = PassContext.from_layout(Layout(recompute="none", **base))
    b, s = 1, 256
    layer_fwd = {name: sum(n.flops(b, s) for n in parallelize_block(blk, ctx).forward.nodes)
                 for name, blk in TRACED.blocks.items()}
    assert UNCHECKPOINTED_BLOCKS <= set(layer_fwd)
    per_mb = sum(layer_fwd[t] for t in SPEC.layer_types)  # every transformer layer once
    assert full.hardware_flops_per_step - none.hardware_flops_per_step == pytest.approx(
        2 * per_mb, rel=1e-9)  # two micro-batch rows of one sequence each (b 1 x gbs 2)


def test_dp_reduction_after_the_backward_when_not_overlapped() -> None:
    """Megatron-LM 2021 all-reduces the gradient buffer after the last backward: every bucket's
    reduction starts at the rank's end of compute, the buckets run back to back and all of it
    is exposed; overlapped, the first bucket starts before that end."""
    base = dict(dp=2, global_batch_size=4, seq_len=256)
    over = _sim(Layout(**base), num_gpus=2)
    after = _sim(Layout(dp_overlap_grad_reduce=False, **base), num_gpus=2)
    end = after.timeline.pipeline.rank_end_s[0]
    iv = sorted(after.timeline.dp_intervals, key=lambda x: x[2])
    assert iv and iv[0][2] == pytest.approx(end)
    total = sum(e - s0 for _, _, s0, e in iv)
    assert iv[-1][3] == pytest.approx(end + total)  # back to back, nothing hidden
    assert min(s0 for _, _, s0, _ in over.timeline.dp_intervals) < end
    assert after.step_time_s > over.step_time_s


def test_blocking_pipeline_transfers_and_megatron_scatter_gather() -> None:
    """Blocking sends (Megatron's batch_isend_irecv + synchronize) are the critical rank's
    exposed ``pp`` communication, one transfer per unit it sends: rank 0 of a 2-stage 1F1B
    pipeline sends its m forwards. With Megatron-LM's scatter/gather (no SP) a transfer is
    1/tp of the activation over the pipeline link plus an all-gather of the whole of it in the
    receiving TP group."""
    base = dict(tp=2, pp=2, schedule="1f1b", global_batch_size=4, seq_len=256)
    over = _sim(Layout(**base))
    block = _sim(Layout(pp_p2p_blocking=True, **base))
    sg = _sim(Layout(pp_p2p_blocking=True, pp_scatter_gather=True, **base))
    assert "pp" not in over.breakdown.exposed_comm_by_kind_s
    assert block.step_time_s > over.step_time_s
    cl = toy_cluster()
    coster = GraphCoster(cl, FlopsCostModel(), strides={"tp": 1, "pp": 2})
    act = 1 * 256 * SPEC.hidden_size * 2  # one sequence of bf16 hidden states
    whole = coster.collective("send_recv", act, 2, "pp")[0]
    split = (coster.collective("send_recv", act / 2, 2, "pp")[0]
             + coster.collective("all_gather", act, 2, "tp")[0])
    m = 4
    crit = [block, sg]
    for rep, transfer in zip(crit, (whole, split), strict=True):
        pipe = rep.timeline.pipeline
        rank = max(range(2), key=lambda r: pipe.rank_end_s[r])
        sends = sum(1 for u in pipe.units if u.rank == rank
                    and ((rank == 0 and u.op.kind == "F") or (rank == 1 and u.op.kind == "B")))
        assert sends == m
        assert rep.breakdown.exposed_comm_by_kind_s["pp"] == pytest.approx(m * transfer,
                                                                           rel=1e-9)
    assert split != pytest.approx(whole)
    # Sequence parallelism already shards the activation: the option changes nothing.
    sp = dict(base, sequence_parallel=True, pp_p2p_blocking=True)
    assert _sim(Layout(pp_scatter_gather=True, **sp)).step_time_s == pytest.approx(
        _sim(Layout(**sp)).step_time_s)


def test_trace_draws_blocking_sends_on_their_own_track() -> None:
    """A unit that waits for its own send ends with that wait: the trace draws it on a
    ``comm_pp`` track, inside the unit's span, as long as its exposed ``pp`` time."""
    from charon_search.sim.trace import chrome_trace

    rep = _sim(Layout(tp=2, pp=2, schedule="1f1b", pp_p2p_blocking=True,
                      global_batch_size=4, seq_len=256))
    ev = chrome_trace(rep.timeline)["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in ev if e.get("name") == "thread_name"}
    sends = [e for e in ev if e.get("ph") == "X" and names.get(e["tid"]) == "comm_pp"]
    units = {e["name"]: e for e in ev if e.get("ph") == "X" and names.get(e["tid"]) == "compute"
             and e["pid"] == 0}
    mine = [e for e in sends if e["pid"] == 0]
    assert len(mine) == 4  # rank 0 sends its 4 forwards
    for e in mine:
        unit = units[e["name"].removeprefix("send ")]
        assert e["ts"] + e["dur"] == pytest.approx(unit["ts"] + unit["dur"])
        assert e["dur"] == pytest.approx(unit["args"]["exposed_comm_s"]["pp"] * 1e6)


@pytest.mark.parametrize(("tp", "pp", "dp", "zero", "vpp"), [
    (1, 2, 1, 0, 1), (2, 2, 1, 0, 1), (1, 4, 1, 0, 1), (1, 4, 1, 0, 2), (1, 2, 2, 2, 1)])
def test_tied_embeddings_all_reduce_their_gradient_between_the_pipeline_ends(
        tp: int, pp: int, dp: int, zero: int, vpp: int) -> None:
    """Megatron ``_allreduce_word_embedding_grads``: with tied input and output embeddings the
    first and the last stage each hold the word embedding (V x h / tp) and all-reduce its
    fp32 gradient between them after the data-parallel sync, before the optimizer step (under
    ZeRO-2 each data-parallel rank its shard of it)."""
    import dataclasses

    from charon_search.cost.collectives import collective_time

    tied = dataclasses.replace(SPEC, tie_word_embeddings=True)
    layout = Layout(tp=tp, pp=pp, dp=dp, zero_stage=zero, vpp=vpp,
                    schedule="interleaved-1f1b" if vpp > 1 else "1f1b",
                    global_batch_size=8 * dp, seq_len=256)
    cl = toy_cluster()

    def run(spec):
        return simulate_training(spec, cl, layout, cost_model=FlopsCostModel(), traced=TRACED,
                                 memory=False)

    with_tie, without = run(tied), run(SPEC)
    assert "pp_tied_embedding" not in without.breakdown.exposed_comm_by_kind_s
    got = with_tie.breakdown.exposed_comm_by_kind_s["pp_tied_embedding"]
    # Megatron's tp-dp-pp rank order: stage ranks sit tp x dp apart, the two ends (pp - 1)
    # times that, and one such pair runs per (tp, dp) coordinate at once; the stage that
    # finishes first idles until the other can join (counted in its bubble)
    nbytes = SPEC.vocab_size * SPEC.hidden_size / tp * 4 / (dp if zero >= 2 else 1)
    assert got == pytest.approx(collective_time(
        "all_reduce", nbytes, 2, cl, stride=tp * dp * (pp - 1), concurrent_groups=tp * dp,
        world_size=tp * dp * pp), rel=1e-6)
    # the step grows by the all-reduce (and the two ends' optimizer steps now start together)
    assert with_tie.step_time_s == pytest.approx(without.step_time_s + got, rel=1e-4)
    bd = with_tie.breakdown
    parts = (bd.compute_s + bd.exposed_comm_s + bd.pipeline_bubble_s + bd.overlap_slowdown_s
             + bd.optimizer_s + bd.other_s)
    assert parts == pytest.approx(with_tie.step_time_s, rel=1e-9)
    tracks = [x for x in with_tie.timeline.tail_intervals if x[2].startswith("tied")]
    assert sorted(r for r, *_ in tracks) == [0, pp - 1]
    assert {x[1] for x in tracks} == {"comm_tied"}
    one_stage = simulate_training(tied, cl, Layout(tp=tp, pp=1, dp=dp, zero_stage=zero,
                                                   global_batch_size=8 * dp, seq_len=256),
                                  cost_model=FlopsCostModel(), traced=TRACED, memory=False)
    assert "pp_tied_embedding" not in one_stage.breakdown.exposed_comm_by_kind_s
