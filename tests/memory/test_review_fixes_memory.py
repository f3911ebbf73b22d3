"""Fixes of the memory-model review (``/tmp/review_memory/findings.md``): H1, M2, M3, M5, L1, L4.

Every expected number is derived by hand in the test's docstring or comments.
"""

from __future__ import annotations

import pytest

from charon_search.catalog import load_model
from charon_search.cli import main
from charon_search.errors import ConfigError
from charon_search.layout import Layout, shard_groups
from charon_search.memory import MemoryOptions, ShardingPoint, model_profile
from charon_search.memory.report import _kept, _loss_block, fits, memory_report
from charon_search.memory.serving import kv_bytes_per_token, kv_cache_capacity
from charon_search.sim.schedules import schedule_order

GIB = 2**30


# ----------------------------------------------------------------------------- H1: HSDP + EP
def test_hsdp_expert_group_stays_inside_the_shard_group() -> None:
    """Expert group = shard·cp/ep with shard = hsdp_shard or dp (torchtitan dp_shard_mod_ep)."""
    assert shard_groups(dp=8, cp=1, ep=2) == (8, 4)                 # no HSDP: unchanged
    assert shard_groups(dp=8, cp=1, ep=2, hsdp_shard=2) == (2, 1)   # 2·1/2 = 1 (was 8/2 = 4)
    assert shard_groups(dp=8, cp=1, ep=2, hsdp_shard=4) == (4, 2)   # 4/2 = 2
    assert shard_groups(dp=8, cp=2, ep=4, hsdp_shard=4) == (8, 2)   # 4·2/4 = 2
    assert Layout(dp=8, ep=2, hsdp_shard=2, zero_stage=3,
                  global_batch_size=8).shard_groups == (2, 1)


def test_layout_rejects_ep_wider_than_the_hsdp_shard_group() -> None:
    # dp 8, hsdp_shard 2, ep 4: 4 does not divide 2·1 (was accepted with groups (2, 2)).
    with pytest.raises(ConfigError, match=r"hsdp_shard \* cp.*ep=4, hsdp_shard=2, cp=1"):
        Layout(dp=8, ep=4, hsdp_shard=2, zero_stage=3, global_batch_size=8)
    # cp widens the shard group: 2·2 = 4 is divisible by ep 4.
    assert Layout(dp=8, cp=2, ep=4, hsdp_shard=2, zero_stage=3,
                  global_batch_size=8).shard_groups == (4, 1)


def test_mixtral_hsdp_expert_states_are_not_sharded() -> None:
    """Mixtral-8x7B, dp 8, hsdp_shard 2, ep 2, ZeRO-3, mixed-precision Adam (2 + 2 + 12 B).

    Per GPU, by hand (h = 4096, ffn 14336, 8 experts, 32 layers, vocab 32000, kv 8 x 128):
    * dense = embedding 32000·4096 = 131,072,000 + LM head 131,072,000 + final norm 4096
      + 32 x (attention 2·4096² + 2·4096·1024 = 41,943,040, norms 8192, router 8·4096 = 32,768)
      = 1,605,636,096, sharded over the shard group of 2: 802,818,048;
    * experts = 32 x 8 x 3·4096·14336 / ep 2 = 22,548,578,304, expert group 2·1/2 = 1: unsharded.
    params = grads = 2 x (802,818,048 + 22,548,578,304) = 46,702,792,704 B (43.5 GiB);
    optimizer = 12 x 23,351,396,352 = 280,216,756,224 B.
    Before the fix the experts were sharded over dp/ep = 4: params 2 x (802,818,048 +
    5,637,144,576) = 12,879,925,248 B (12.0 GiB), and the layout "fit" 4x too easily.
    """
    layout = Layout(dp=8, ep=2, zero_stage=3, hsdp_shard=2, micro_batch_size=1,
                    global_batch_size=8, seq_len=4096)
    st = memory_report("mixtral-8x7b", layout, "dgx-h100-ib400").stages[0]
    assert st.params_bytes == 46_702_792_704
    assert st.grads_bytes == 46_702_792_704
    assert st.optimizer_bytes == 280_216_756_224
    # hsdp_shard 4: expert group 4/2 = 2, dense group 4 -> 2 x (401,409,024 + 11,274,289,152).
    st4 = memory_report("mixtral-8x7b", layout.replace(hsdp_shard=4), "dgx-h100-ib400").stages[0]
    assert st4.params_bytes == 23_351_396_352
    # No HSDP: unchanged, dense over 8 and experts over 8/2 = 4 ranks:
    # 2 x (200,704,512 + 5,637,144,576) = 11,675,698,176.
    st0 = memory_report("mixtral-8x7b", layout.replace(hsdp_shard=0), "dgx-h100-ib400").stages[0]
    assert st0.params_bytes == 11_675_698_176


# ----------------------------------------------------------------- M2: the simulator's rules
@pytest.mark.parametrize(("kw", "message"), [
    # m = 3 micro-batches, pp 2: interleaving needs m % pp == 0.
    (dict(tp=4, pp=2, vpp=2, schedule="interleaved-1f1b", global_batch_size=3),
     r"`num_micro_batches % pp == 0` must hold for interleaved-1f1b"),
    (dict(pp=3, schedule="dualpipe", global_batch_size=12), r"dualpipe needs an even pp"),
])
def test_memory_report_and_fits_reject_what_the_simulator_rejects(kw, message) -> None:
    layout = Layout(seq_len=4096, **kw)
    with pytest.raises(ConfigError, match=message):
        memory_report("llama-3.1-8b", layout, "h100-sxm-8gpu")
    with pytest.raises(ConfigError, match=message):
        fits("llama-3.1-8b", layout, "h100-sxm-8gpu")


def test_memory_cli_rejects_the_interleaved_layout_train_rejects(capsys) -> None:
    argv = ["memory", "--model", "llama-3.1-8b", "--cluster", "h100-sxm-8gpu", "--pp", "2",
            "--vpp", "2", "--schedule", "interleaved-1f1b", "--gbs", "3"]
    assert main(argv) == 2
    assert "`num_micro_batches % pp == 0` must hold" in capsys.readouterr().err


# ----------------------------------------------------- M3: the LM head on interleaved ranks
def _kept_per_layer_and_head(seq: int) -> tuple[float, float]:
    spec = load_model("llama-3.1-8b")
    prof = model_profile(spec)
    pt = ShardingPoint(b=1, s=seq, c=seq, tp=1)
    layer = _kept(prof.blocks["dense"].evaluate(pt), "none", "attention")
    head, _ = _loss_block(prof.blocks["lm_head"].evaluate(pt), "eager")
    return layer, head


def test_interleaved_last_rank_keeps_one_lm_head() -> None:
    """llama-3.1-8b (32 layers), p 4, v 2, m 8, seq 8192, tp 1: a chunk holds 32/8 = 4 layers.

    The last rank's peak holds 5 chunk micro-batches (warm-up (p-r-1)·2 + (v-1)·p = 4, plus 1),
    of which only 1 is on its last chunk (the one with the LM head): the replay of the
    simulator's op order (``sim.schedules.interleaved``, rank 3) gives (5, 1) at the peak.
    saved = 5 x 4 x layer + 1 x head = 5 x 4 x 1.532 + 4.16 = 34.81 GiB.
    Before: 5 x (8 x layer + head) / 2 = 41.06 GiB (2.5 copies of the head).
    Rank 0 (embedding, no head) is unchanged: 11 chunks x 4 layers x 1.532 = 67.42 GiB.
    """
    layer, head = _kept_per_layer_and_head(8192)
    assert layer / GIB == pytest.approx(1.532, abs=5e-4)
    assert head / GIB == pytest.approx(4.16, abs=5e-3)
    layout = Layout(pp=4, vpp=2, schedule="interleaved-1f1b", global_batch_size=8, seq_len=8192)
    rep = memory_report("llama-3.1-8b", layout, "h100-sxm-8gpu")
    last = rep.stages[3]
    assert last.in_flight == 5
    assert last.saved_activations_bytes == pytest.approx(5 * 4 * layer + 1 * head, rel=1e-12)
    assert last.saved_activations_bytes / GIB == pytest.approx(34.81, abs=5e-3)
    assert rep.stages[0].saved_activations_bytes / GIB == pytest.approx(67.42, abs=5e-3)


def test_dualpipe_end_ranks_keep_one_lm_head() -> None:
    """llama-3.1-8b, DualPipe p 4, m 8, seq 8192: rank 0 holds stage 0 (chunk 0, 8 layers +
    embedding) and stage 3 (chunk 1, 8 layers + LM head); rank 3 the mirror. At the peak
    p + 1 = 5 chunk micro-batches are alive, 1 of them on the head's chunk:
    saved = 5 x 8 x 1.532 + 1 x 4.16 = 65.46 GiB (before: 5 x (16 x layer + head) / 2 =
    71.70 GiB). Rank 1 (no head) is unchanged: 5 x 8 x 1.532 = 61.29 GiB."""
    layer, head = _kept_per_layer_and_head(8192)
    layout = Layout(pp=4, schedule="dualpipe", global_batch_size=8, seq_len=8192)
    rep = memory_report("llama-3.1-8b", layout, "h100-sxm-8gpu")
    for rank in (0, 3):
        st = rep.stages[rank]
        assert st.in_flight == 5
        # + the embedding's token ids (8192 x 8 B = 64 KiB), averaged: 5/2 x 64 KiB.
        assert st.saved_activations_bytes == pytest.approx(
            5 * 8 * layer + head + 2.5 * 65_536, rel=1e-12)
        assert st.saved_activations_bytes / GIB == pytest.approx(65.46, abs=5e-3)
    assert rep.stages[1].saved_activations_bytes / GIB == pytest.approx(61.29, abs=5e-3)


def test_1f1b_last_rank_is_unchanged() -> None:
    """Without interleaving the last rank holds p - (p-1) = 1 micro-batch: its 8 layers and
    the head once (8 x 1.532 + 4.16 = 16.42 GiB), as before the fix."""
    layer, head = _kept_per_layer_and_head(8192)
    layout = Layout(pp=4, schedule="1f1b", global_batch_size=8, seq_len=8192)
    st = memory_report("llama-3.1-8b", layout, "h100-sxm-8gpu").stages[3]
    assert st.saved_activations_bytes == pytest.approx(8 * layer + head, rel=1e-9)
    assert st.saved_activations_bytes / GIB == pytest.approx(16.42, abs=5e-3)


@pytest.mark.parametrize(("schedule", "p", "v", "m"), [
    ("interleaved-1f1b", 4, 2, 8), ("interleaved-1f1b", 4, 2, 4), ("interleaved-1f1b", 2, 4, 6),
    ("interleaved-1f1b", 8, 2, 16), ("dualpipe", 2, 1, 4), ("dualpipe", 4, 1, 12),
    ("dualpipe", 8, 1, 16),
])
def test_head_rank_matches_a_replay_of_the_schedule(schedule, p, v, m) -> None:
    """The head rank's saved bytes equal the peak over the simulator's op order of
    sum(chunk micro-batches alive x that chunk's kept bytes), with the head on its chunk."""
    layer, head = _kept_per_layer_and_head(2048)
    spec = load_model("llama-3.1-8b")
    dual = schedule == "dualpipe"
    chunks = 2 if dual else v
    # Interleaving splits the layers into p·v chunks; a DualPipe rank holds two whole stages of
    # L/p layers (stage r and its mirror p-1-r).
    per_chunk = spec.num_layers // (p if dual else p * v) * layer
    layout = Layout(pp=p, vpp=v, schedule=schedule, global_batch_size=m, seq_len=2048)
    rep = memory_report(spec, layout, "h100-sxm-8gpu")
    ranks = (0, p - 1) if dual else (p - 1,)
    for rank in ranks:
        kept = [per_chunk] * chunks
        kept[0 if dual and rank == p - 1 else chunks - 1] += head
        alive: dict[tuple[int, int], float] = {}
        peak = 0.0
        for op in schedule_order(schedule, p, m, v, rank):
            if op.kind == "F":
                alive[(op.mb, op.chunk)] = kept[op.chunk]
            elif op.kind == "B":
                alive.pop((op.mb, op.chunk))
            peak = max(peak, sum(alive.values()))
        # DualPipe's end ranks also hold the embedding, whose kept bytes (int64 token ids,
        # 2048 x 8 = 16 KiB per micro-batch) the model averages over the chunks: at most
        # p + 1 micro-batches x 16 KiB above the replay without it.
        got = rep.stages[rank].saved_activations_bytes
        assert peak <= got <= peak + (p + 1) * 16_384 if dual else got == pytest.approx(peak)


# ------------------------------------------------------------- M5: micro-batches in the CLI
def test_memory_cli_prints_micro_batches_in_flight_and_warns(capsys) -> None:
    """pp 2 without --gbs: gbs = mbs·dp = 1, so m = 1 < pp: one micro-batch in flight on every
    stage, and a warning that a runnable 1F1B plan needs m >= 2 (--gbs >= 1·1·2 = 2)."""
    base = ["memory", "--model", "debug-llama", "--cluster", "h100-sxm-8gpu", "--pp", "2",
            "--schedule", "1f1b", "--seq", "512"]
    assert main(base) == 0
    out = capsys.readouterr().out
    assert "gbs=1 micro-batches=1" in out
    assert "warning: only 1 micro-batch(es) per step for pp=2" in out
    assert "set --gbs to at least mbs*dp*pp = 2" in out
    rows = [ln.split() for ln in out.splitlines() if ln.split()[:1] in (["0"], ["1"])]
    assert [r[-1] for r in rows] == ["1", "1"]
    # gbs 8: m = 8 >= 2, no warning; 1F1B stage 0 holds p - 0 = 2, stage 1 holds 1.
    assert main([*base, "--gbs", "8"]) == 0
    out = capsys.readouterr().out
    assert "micro-batches=8" in out and "warning" not in out
    rows = [ln.split() for ln in out.splitlines() if ln.split()[:1] in (["0"], ["1"])]
    assert [r[-1] for r in rows] == ["2", "1"]


# ------------------------------------------------------------------ L1: the serving KV API
def test_kv_bytes_per_token_accepts_the_serving_dtypes() -> None:
    """llama-3.1-8b: 2 (K, V) x 32 layers x 8 KV heads x 128 x 2 B = 131,072 B at tp 1;
    fp8 halves it; tp 2 halves the heads."""
    spec = load_model("llama-3.1-8b")
    assert kv_bytes_per_token(spec, tp=1) == 131_072
    assert kv_bytes_per_token(spec, tp=1, kv_dtype="fp16") == 131_072
    assert kv_bytes_per_token(spec, tp=1, kv_dtype="fp8") == 65_536
    assert kv_bytes_per_token(spec, tp=2) == 65_536
    assert kv_bytes_per_token(spec, tp=1, num_layers=0) == 0


@pytest.mark.parametrize(("kw", "message"), [
    (dict(tp=1, kv_dtype="bool"), r"`kv_dtype` must be one of \['bf16', 'fp16', 'fp8'\]"),
    (dict(tp=1, kv_dtype="int64"), r"`kv_dtype` must be one of"),
    (dict(tp=1, kv_dtype="fp4"), r"`kv_dtype` must be one of"),
    (dict(tp=0), r"`tp` must be a positive integer, but got 0"),
    (dict(tp=-1), r"`tp` must be a positive integer, but got -1"),
    (dict(tp=2.0), r"`tp` must be a positive integer, but got 2.0"),
    (dict(tp=1, num_layers=-3), r"`num_layers` must be None or an integer >= 0, but got -3"),
    (dict(tp=1, num_layers=1.5), r"`num_layers` must be None or an integer >= 0"),
])
def test_kv_bytes_per_token_rejects_bad_input(kw, message) -> None:
    with pytest.raises(ConfigError, match=message):
        kv_bytes_per_token(load_model("llama-3.1-8b"), **kw)


@pytest.mark.parametrize(("model", "kw", "message"), [
    ("llama-3.1-8b", dict(tp=1, kv_dtype="bool"), r"`kv_dtype` must be one of"),
    ("mixtral-8x7b", dict(tp=1, ep=3),
     r"`ep` must divide num_experts, but got \(ep=3, num_experts=8\); allowed: \[1, 2, 4, 8\]"),
    ("llama-3.1-8b", dict(tp=1, ep=4), r"`ep > 1` needs a MoE model"),
    ("llama-3.1-8b", dict(tp=1, pp=0), r"`pp` must be a positive integer"),
    ("llama-3.1-8b", dict(tp=True), r"`tp` must be a positive integer"),
])
def test_kv_cache_capacity_rejects_bad_input(model, kw, message) -> None:
    with pytest.raises(ConfigError, match=message):
        kv_cache_capacity(model, "h100-sxm-8gpu", **kw)


# ---------------------------------------------------------------------- L4: MemoryOptions
@pytest.mark.parametrize(("kw", "message"), [
    (dict(ddp_bucket_bytes=-1e12), r"`ddp_bucket_bytes` must be a finite number >= 0"),
    (dict(ddp_bucket_bytes=float("inf")), r"`ddp_bucket_bytes` must be a finite number >= 0"),
    (dict(fsdp_prefetch_depth=-1), r"`fsdp_prefetch_depth` must be None or an integer >= 0"),
    (dict(fsdp_prefetch_depth=1.5), r"`fsdp_prefetch_depth` must be None or an integer >= 0"),
])
def test_memory_options_reject_negative_sizes(kw, message) -> None:
    with pytest.raises(ConfigError, match=message):
        MemoryOptions(**kw)


def test_memory_options_accept_zero() -> None:
    """A zero bucket and no prefetch are valid: DDP dp 8 llama-3.1-8b with a 0-byte bucket
    holds 25 MiB = 26,214,400 B less than with the default bucket."""
    layout = Layout(dp=8, global_batch_size=8, seq_len=2048)
    base = memory_report("llama-3.1-8b", layout, "h100-sxm-8gpu").stages[0]
    zero = memory_report("llama-3.1-8b", layout, "h100-sxm-8gpu",
                         options=MemoryOptions(ddp_bucket_bytes=0,
                                               fsdp_prefetch_depth=0)).stages[0]
    assert base.peak_allocated_bytes - zero.peak_allocated_bytes == pytest.approx(26_214_400)


def test_mla_down_projections_are_replicated_weights() -> None:
    """DeepSeek-V3's MLA down-projections, q_a_proj 7168 x 1536 = 11,010,048 and
    kv_a_proj_with_mqa 7168 x 576 = 4,128,768 parameters, run whole on every TP rank (the TP
    pass keeps them replicated, as Megatron, vLLM and SGLang do), so their weights are
    replicated, not divided by TP: 15,138,816 parameters of the attention's projections."""
    import charon_search.memory.profile as prof
    from charon_search.catalog import load_model
    from charon_search.memory.static import traced_param_groups

    traced = prof._trace(load_model("deepseek-v3"), "decode", "sdpa")
    by_role = {r: (tp, rep, ex) for r, tp, rep, ex in traced_param_groups(traced.blocks["moe"])
               .by_role}
    assert by_role["attn.qkv"][1] == 11_010_048 + 4_128_768


def test_attention_dp_rank_holds_nccl_buffers() -> None:
    """An attention-DP rank of DeepSeek-V3 (tp 1, ep 8) runs its MoE over the EP group, so it
    holds NCCL's buffers like a TP-8 rank: allocator extra + comm buffers (1 GiB + 392 MiB on
    the H200 box) outside the KV pool."""
    from charon_search.hardware import load_cluster
    from charon_search.memory.serving import kv_cache_capacity

    cal = load_cluster("h200-sxm-8gpu").calibration
    cap = kv_cache_capacity("deepseek-v3", "h200-sxm-8gpu", tp=1, ep=8, weight_dtype="fp8")
    assert cap.non_torch_bytes == cal.allocator_reserved_extra_bytes + cal.comm_buffer_bytes
