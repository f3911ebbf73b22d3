"""Inference kernel fusion of the serving graphs and the steady-state closed loop."""

from __future__ import annotations

import pytest

from charon_search.catalog import load_model
from charon_search.ir import OpKind
from charon_search.serving import LengthDistribution, ServingConfig, WorkloadSpec, simulate_serving
from charon_search.serving._graphs import serving_graphs

POINT = (4, 1, 300)  # b, s, c of a decode batch


def _flops(graph) -> float:  # type: ignore[no-untyped-def]
    return sum(n.flops(*POINT) for n in graph.nodes)


def _graphs(name: str, fused: bool, tp: int = 1):  # type: ignore[no-untyped-def]
    return serving_graphs(load_model(name), tp=tp, pp=1, ep=1, dp_attention=False,
                          precision="bf16", fused_kernels=fused)


@pytest.mark.parametrize("tp", [1, 2])
def test_dense_fusion_merges_gemms_and_keeps_flops(tp: int) -> None:
    spec = load_model("debug-llama")
    for phase in (0, 1):  # prefill, decode
        raw = _graphs("debug-llama", False, tp)[phase]["dense"]
        fused = _graphs("debug-llama", True, tp)[phase]["dense"]
        assert _flops(fused) == pytest.approx(_flops(raw), rel=1e-12)
        assert len(fused.nodes) < len(raw.nodes)
        gemms = {n.role: n for n in fused.nodes if n.kind == OpKind.GEMM}
        raw_qkv = [n for n in raw.nodes if n.kind == OpKind.GEMM and n.role == "attn.qkv"]
        assert len(raw_qkv) == 3
        # One QKV GEMM whose n is the sum: (heads + 2 kv_heads) * head_dim / tp.
        head_dim = spec.hidden_size // spec.num_attention_heads
        qkv_n = (spec.num_attention_heads + 2 * spec.num_key_value_heads) * head_dim / tp
        assert gemms["attn.qkv"].params["n"](*POINT) == pytest.approx(qkv_n)
        assert gemms["attn.qkv"].params["n"](*POINT) == pytest.approx(
            sum(n.params["n"](*POINT) for n in raw_qkv))
        # One gate_up GEMM of n = 2 * intermediate / tp.
        assert gemms["mlp.in"].params["n"](*POINT) == pytest.approx(
            2 * spec.intermediate_size / tp)
        # The shared activation is read once: bytes drop by (3 - 1) activation reads.
        fused_read = gemms["attn.qkv"].bytes_read(*POINT)
        assert fused_read < sum(n.bytes_read(*POINT) for n in raw_qkv)
        # vLLM's kernels per layer: add+norm, qkv, rope, kv write, attention, o, add+norm,
        # gate_up, silu_and_mul, down (+ 2 all-reduces under TP). The traced prefill graph
        # has no KV write.
        compute = [n for n in fused.nodes if not n.is_comm]
        assert len(compute) == (9, 10)[phase]
        assert sum(1 for n in fused.nodes if n.is_comm) == (2 if tp > 1 else 0)


def test_fused_cost_model_launches_fewer_kernels() -> None:
    from charon_search.serving.simulator import build_cost_model
    from charon_search.testing import toy_cluster

    model, cluster = load_model("debug-llama"), toy_cluster()
    eager = build_cost_model(model, cluster, ServingConfig(fused_kernels=False))
    fused = build_cost_model(model, cluster, ServingConfig())
    assert fused.num_kernels < eager.num_kernels
    # Embedding: one gather (the RoPE table is precomputed); per layer 9 prefill kernels
    # (counted on the prefill graph, the eager case); final norm + LM head.
    assert fused.num_kernels == 1 + 9 * model.num_layers + 2


def test_moe_fusion_builds_one_fused_experts_op() -> None:
    spec = load_model("debug-moe")
    flops: dict[int, float] = {}
    for tp in (1, 2):
        raw = _graphs("debug-moe", False, tp)[1]
        fused = _graphs("debug-moe", True, tp)[1]
        block = next(k for k in fused if k not in ("embedding", "lm_head")
                     and any(n.kind == OpKind.GROUPED_GEMM for n in fused[k].nodes))
        experts = [n for n in fused[block].nodes if n.kind == OpKind.GROUPED_GEMM]
        assert len(experts) == 1
        # Whole gated FFN of one expert shard: n = intermediate / moe_tp, k = hidden.
        assert experts[0].params["n"](*POINT) == pytest.approx(
            spec.moe_intermediate_size / tp)
        assert experts[0].params["k"](*POINT) == pytest.approx(spec.hidden_size)
        glue = [n for n in fused[block].nodes if n.role in ("moe.router", "moe.dispatch",
                                                             "moe.combine")]
        # The router GEMM; topk_softmax, moe_align_block_size and moe_sum are inside the
        # fused experts op, as the measured MoE rows time them (``_absorb_moe_routing``).
        assert [n.kind for n in glue] == [OpKind.GEMM]
        raw_glue = [n for n in raw[block].nodes if n.role in ("moe.router", "moe.dispatch",
                                                               "moe.combine")]
        assert len(raw_glue) > 10
        assert _flops(fused[block]) == pytest.approx(_flops(raw[block]), rel=1e-12)
        flops[tp] = experts[0].flops(*POINT)
        if tp > 1:  # expert TP: w13/w2 split over the ranks, the MoE output all-reduced
            assert sum(1 for n in fused[block].nodes if n.is_comm) == 2  # attn + MoE
    assert flops[2] == pytest.approx(flops[1] / 2, rel=0.02)  # GEMMs exactly, the act ~


def _closed(conc: int, n: int, **kw):  # type: ignore[no-untyped-def]
    return WorkloadSpec(arrival="concurrency", concurrency=conc, num_requests=n,
                        input_len=LengthDistribution(value=1000),
                        output_len=LengthDistribution(value=100), **kw)


def test_closed_loop_steady_state_littles_law(affine, cluster) -> None:
    cfg = ServingConfig(num_kv_blocks=20000, iteration_overhead_s=1e-3)
    rep = simulate_serving("debug-llama", cluster, cfg, _closed(8, 800), cost_model=affine,
                           keep_requests=True)
    assert rep.num_completed == 800
    # Closed loop without think time: concurrency = throughput x mean E2E (Little's law),
    # and the time-averaged population is the concurrency.
    assert rep.requests_per_s * rep.e2e_s["mean"] == pytest.approx(8, rel=0.05)
    assert rep.mean_requests_in_system == pytest.approx(8, rel=0.05)
    assert rep.mean_requests_in_system == pytest.approx(
        rep.arrival_rate * rep.e2e_s["mean"], rel=0.05)


def test_closed_loop_staggers_instead_of_waves(affine, cluster) -> None:
    cfg = ServingConfig(num_kv_blocks=20000, iteration_overhead_s=1e-3)
    oh = 1e-3
    steady = simulate_serving("debug-llama", cluster, cfg, _closed(8, 160), cost_model=affine,
                              keep_requests=True)
    waves = simulate_serving("debug-llama", cluster, cfg, _closed(8, 160, ramp_up_s=0.0),
                             cost_model=affine, keep_requests=True)

    def late_ttft(rep) -> float:  # type: ignore[no-untyped-def]
        pr = rep.per_request
        v = [t for i, t in zip(pr["request_id"], pr["ttft_s"], strict=True) if i >= 8]
        return sum(v) / len(v)

    # Synchronized waves: all 8 prompts prefill in one iteration of 8000 tokens.
    wave = affine.iteration_s([(1000, 1000)] * 8, 0, 0.0) + oh
    assert late_ttft(waves) == pytest.approx(wave, rel=1e-6)
    # Steady state: a request waits at most one running iteration, then prefills its own
    # 1000 tokens next to <= 7 decodes.
    decode7 = affine.iteration_s((), 7, 7 * 1100.0, padded_decode=8) + oh
    mixed = affine.iteration_s([(1000, 1000)], 7, 7 * 1100.0) + oh
    assert late_ttft(steady) <= decode7 + mixed + 1e-9
    assert late_ttft(steady) < 0.5 * wave
    # First wave spread over one expected lifetime.
    pr = steady.per_request
    first = sorted(t for i, t in zip(pr["request_id"], pr["arrived_at_s"], strict=True) if i < 8)
    gap = first[1] - first[0]
    assert gap > 0 and first == pytest.approx([i * gap for i in range(8)])


def test_embedding_is_a_gather_of_the_looked_up_rows() -> None:
    spec = load_model("debug-llama")
    raw = _graphs("debug-llama", False)[1]["embedding"]
    fused = _graphs("debug-llama", True)[1]["embedding"]
    emb_raw = next(n for n in raw.nodes if n.kind == OpKind.EMBEDDING)
    (emb,) = [n for n in fused.nodes if not n.is_comm]  # RoPE table ops precomputed
    b, s, _ = POINT
    rows = b * s * spec.hidden_size * 2.0  # bf16 rows gathered
    assert emb.bytes_written(*POINT) == pytest.approx(rows)
    # Reads the gathered rows and the token ids, not the vocab x hidden table, as traced
    # (the engine fusion keeps the lookup as it is).
    assert rows <= emb.bytes_read(*POINT) <= rows + b * s * 8
    assert emb_raw.bytes_read(*POINT) == emb.bytes_read(*POINT)
    assert emb_raw.bytes_read(*POINT) < spec.vocab_size * spec.hidden_size * 2 / 8


@pytest.mark.parametrize("tp", [1, 2])
def test_trtllm_fuses_norm_into_allreduce_and_rope_into_attention(tp: int) -> None:
    from charon_search.serving._fusion import fuse_trtllm

    for phase in (0, 1):
        vllm = _graphs("debug-llama", True, tp)[phase]["dense"]
        trt = fuse_trtllm(vllm, allreduce_norm=tp > 1)
        roles = [n.role for n in trt.nodes if not n.is_comm]
        assert "attn.rope" in [n.role for n in vllm.nodes]
        assert "attn.rope" not in roles  # applied by the attention's QKV preprocessing
        norms = [n for n in trt.nodes if n.kind == OpKind.NORM]
        # TP > 1: both RMSNorms run in the epilogues of the two all-reduces (the leading one
        # in the previous layer's); TP = 1 has no all-reduce and keeps add+RMSNorm kernels.
        assert len(norms) == (0 if tp > 1 else 2)
        assert len(trt.nodes) == len(vllm.nodes) - (3 if tp > 1 else 1)
        assert sum(1 for n in trt.nodes if n.is_comm) == (2 if tp > 1 else 0)


def test_sglang_allreduce_fusion_drops_the_norms_but_keeps_rope() -> None:
    """``--enable-flashinfer-allreduce-fusion``: the RMSNorm after each TP all-reduce runs in the
    all-reduce kernel (two kernels fewer per layer at TP 2), RoPE keeps its kernel; a launch
    without the flag, or at TP 1, keeps every norm."""
    from charon_search.catalog import load_model
    from charon_search.serving.iteration_cost import GraphIterationCostModel
    from charon_search.testing import toy_cluster

    model, cluster = load_model("debug-llama"), toy_cluster()

    def cm(tp: int, fused: bool) -> GraphIterationCostModel:
        return GraphIterationCostModel(model, cluster, tp=tp, tp_allreduce="sglang",
                                       allreduce_norm_fusion=fused)

    plain, fused = cm(2, False), cm(2, True)
    layers = model.num_layers
    assert plain.num_kernels - fused.num_kernels == 2 * layers
    for part in fused._decode_parts:
        roles = [n.role for n in part.linear.nodes] + [n.role for n in part.attention.nodes]
        assert "attn.rope" in roles
        assert not [n for n in part.linear.nodes if n.kind == OpKind.NORM]
    assert fused.linear_s(8) < plain.linear_s(8)
    assert cm(1, True).num_kernels == cm(1, False).num_kernels


def test_graph_replay_floor_replaces_eager_launch_overhead() -> None:
    from charon_search.serving.iteration_cost import GRAPH_KERNEL_FLOOR_S, graph_cost_fn
    from charon_search.testing import toy_cluster

    cluster = toy_cluster()
    from charon_search.cost.selector import default_cost_model

    graph = _graphs("debug-llama", True)[1]["dense"]
    plain = default_cost_model(cluster).cost_graph_detailed(graph, 4, 1, 300)
    serving = graph_cost_fn(cluster)(graph, 4, 1, 300)
    launch = cluster.gpu.launch_overhead_s
    assert launch > GRAPH_KERNEL_FLOOR_S
    for t_plain, t_serv, prov in zip(plain.durations_s, serving, plain.provenance):
        if prov == "roofline":  # bytes / bandwidth + the graph-replay floor
            assert t_serv == pytest.approx(max(t_plain - launch, 0.0) + GRAPH_KERNEL_FLOOR_S)
        elif prov:
            assert t_serv == pytest.approx(t_plain)
    assert any(p == "roofline" for p in plain.provenance)


def _moe_nodes(engine: str, ep: int = 1):  # type: ignore[no-untyped-def]
    _, decode = serving_graphs(load_model("deepseek-r1"), tp=8, pp=1, ep=ep,
                               dp_attention=False, precision="fp8", engine=engine)
    return [n for n in decode["moe"].nodes if str(getattr(n.role, "value", n.role))
            in ("moe.expert", "moe.shared") and not n.is_comm]


def test_sglang_runs_deepseek_shared_expert_inside_the_routed_moe() -> None:
    """SGLang's shared-expert fusion (DeepSeek-V3/R1: 256 routed + 1 shared expert, no expert
    parallelism): the shared expert is a 257th expert every token picks, top-k 8 + 1; its
    GEMMs disappear and their FLOPs move into the fused node. At 4 decode tokens, TP 8: routed
    2 x 4 x 8 x 3 x 256 x 7168 and shared 2 x 4 x 1 x 3 x 256 x 7168 FLOPs (n = 2048 / 8)."""
    vllm, sglang = _moe_nodes("vllm"), _moe_nodes("sglang")
    (fused,) = sglang
    assert fused.kind == OpKind.GROUPED_GEMM and "fused_shared_experts" in fused.tags
    assert fused.params["top_k"](*POINT) == 9 and fused.params["num_experts"](*POINT) == 257
    gemm = 2 * 4 * 3 * 256 * 7168
    # + the SiLU-and-mul and the routing and combine ops the fused op absorbs
    assert fused.flops(*POINT) == pytest.approx(9 * gemm, rel=2e-3)
    assert sum(n.flops(*POINT) for n in vllm) == pytest.approx(fused.flops(*POINT), rel=1e-12)
    assert len(vllm) > 1  # the shared expert's own GEMMs and activation
    # Expert parallelism disables the fusion (SGLang determine_num_fused_shared_experts).
    assert len(_moe_nodes("sglang", ep=8)) > 1


@pytest.mark.parametrize("engine", ["vllm", "trtllm"])
def test_norm_over_all_heads_all_reduces_its_statistics(engine: str) -> None:
    """MiniMax-M2's q/k RMSNorm spans all heads (weights of 48 x 128 and 8 x 128), so under TP
    each rank holds part of a row and the statistics need one all-reduce per layer: q's and k's
    in one message of 2 fp32 values per token (vLLM ``MiniMaxText01RMSNormTP.forward_qk``).
    Qwen3's per-head norms (weight of head_dim) need none. The MoE-TP all-reduce still copies
    the attention output's all-reduce (tokens x hidden bf16), and TensorRT-LLM's
    all-reduce + norm fusion leaves the k norm after the statistics all-reduce alone."""
    tokens = 16
    _, decode = serving_graphs(load_model("minimax-m2.5"), tp=8, pp=1, ep=1,
                               dp_attention=False, precision="fp8", engine=engine)
    g = decode["moe"]
    stats = [n for n in g.nodes if "norm_stat" in n.tags]
    assert len(stats) == 1 and stats[0].kind == OpKind.ALL_REDUCE
    assert stats[0].params["bytes"](tokens, 1, 1) == 2 * 4 * tokens
    activations = [n for n in g.nodes if n.is_comm and n.kind == OpKind.ALL_REDUCE
                   and "norm_stat" not in n.tags]
    assert {n.params["bytes"](tokens, 1, 1) for n in activations} == {tokens * 3072 * 2}
    assert len(activations) == 2  # attention output and MoE output
    qk_norms = [n for n in g.nodes if n.role == "attn.qk_norm" and n.kind == OpKind.NORM]
    assert len(qk_norms) == 2
    _, qwen = serving_graphs(load_model("qwen3-8b"), tp=4, pp=1, ep=1, dp_attention=False,
                             precision="bf16", engine=engine)
    assert not [n for n in qwen["dense"].nodes if "norm_stat" in n.tags]


def test_deepseek_gate_runs_on_bf16_activations_without_a_cast_kernel() -> None:
    """The HF DeepSeek-V3 gate casts its input and weight to fp32 before the router GEMM; the
    engines run the gate on the bf16 activations, so the cast is dropped and the router GEMM
    reads the post-attention norm's output. What follows the GEMM (sigmoid scoring, grouped
    top-k, sort, top-k sum) is inside the fused experts op."""
    _, decode = serving_graphs(load_model("deepseek-v3"), tp=8, pp=1, ep=1,
                               dp_attention=False, precision="fp8", engine="sglang")
    g = decode["moe"]
    router = [n for n in g.nodes if n.role == "moe.router"]
    assert [n.kind for n in router] == [OpKind.GEMM]
    norm = next(n for n in g.nodes if n.role == "mlp.norm")
    assert set(norm.outputs) & set(router[0].inputs)
    assert not [n for n in g.nodes if n.role == "moe.dispatch"]
