"""Which ranks share a shard: ZeRO/FSDP over dp·cp, experts over the expert-data-parallel
group (dp·cp / ep, ep ranks apart), ZeRO-2's per-micro-batch reduce-scatters, context-parallel
all-gather gradients, and DualPipe's mirrored stages in memory."""

from __future__ import annotations

import pytest

import charon_search as cs
from charon_search import Layout
from charon_search.errors import ConfigError
from charon_search.hardware import load_cluster

CLUSTER = "dgx-h100-ib400"  # 8 GPUs per node


def _comm(report, block: str, s: float = 1) -> list[tuple[str, str, float, int]]:
    """(name, kind, bytes at sequence length ``s``, group size) of the collectives in one
    block's forward and backward."""
    out = []
    for g in report.timeline.costed_graphs[block]:
        if g is None:
            continue
        for n in g.graph.nodes:
            if n.is_comm:
                out.append((n.name, n.kind.value, n.params["bytes"](1, s, s),
                            int(n.params["group_size"].const_value())))
    return out


def test_fsdp_gathers_dense_weights_over_dp_cp_and_experts_over_their_group() -> None:
    """Mixtral-8x7B, ep = dp = 8, ZeRO-3: each rank holds its whole expert, so FSDP moves only
    the dense weights of a MoE layer: q and o 4096 x 4096, k and v 4096 x 1024, two norms of
    4096 and the 4096 x 8 router = 41,984,000 parameters, 83,968,000 B in bf16 (it had gathered
    the 176,160,768 expert parameters too)."""
    r = cs.simulate_training("mixtral-8x7b", CLUSTER,
                             Layout(dp=8, ep=8, zero_stage=3, global_batch_size=8,
                                    seq_len=4096), memory=False)
    fsdp = [c for c in _comm(r, "moe") if c[0].startswith("fsdp")]
    assert sorted(c[1] for c in fsdp) == ["all_gather", "all_gather", "reduce_scatter"]
    for _name, kind, nbytes, group in fsdp:
        assert group == 8
        assert nbytes == 41_984_000 * (4 if kind == "reduce_scatter" else 2)


def test_zero3_with_context_parallel_shards_over_dp_times_cp() -> None:
    """Llama-3.1-8B at dp = 1, cp = 8: the memory model shards ZeRO-3 parameters 8 ways
    (dp·cp, torchtitan's dp_shard_cp), so FSDP gathers and reduce-scatters over those 8 ranks.
    Without them the CP ranks' gradients were never reduced and ZeRO-3 ran faster than ZeRO-1."""
    def run(zero: int):
        return cs.simulate_training("llama-3.1-8b", CLUSTER,
                                    Layout(dp=1, cp=8, zero_stage=zero, global_batch_size=1,
                                           seq_len=16384))
    z3, z1 = run(3), run(1)
    groups = {c[3] for c in _comm(z3, "dense") if c[0].startswith("fsdp")}
    assert groups == {8}
    assert z3.memory["stages"][0]["params_bytes"] == pytest.approx(
        z1.memory["stages"][0]["params_bytes"] / 8)
    assert z3.step_time_s > z1.step_time_s


def test_expert_optimizer_states_follow_the_expert_data_parallel_group() -> None:
    """Mixtral at dp = 16, ep = 8, ZeRO-1: dense states shard 16 ways, expert states only
    dp / ep = 2 ways. The (memory-bound) Adam step reads the rank's optimizer shard, so its time
    relative to ZeRO-0 follows the optimizer bytes the memory model reports (it had been
    ZeRO-0's over 16)."""
    def run(zero: int):
        return cs.simulate_training("mixtral-8x7b", CLUSTER,
                                    Layout(dp=16, ep=8, zero_stage=zero, global_batch_size=16,
                                           seq_len=4096))
    z0, z1 = run(0), run(1)
    bytes0 = z0.memory["stages"][0]["optimizer_bytes"]
    bytes1 = z1.memory["stages"][0]["optimizer_bytes"]
    assert z1.breakdown.optimizer_s / z0.breakdown.optimizer_s == pytest.approx(
        bytes1 / bytes0, rel=0.02)


def test_expert_gradients_reduce_between_ranks_ep_apart() -> None:
    """With dp = 16, ep = 8 on 8-GPU nodes the two ranks holding the same experts are 8 ranks
    apart, in different nodes: a MoE layer's gradient sync takes at least the cross-node
    all-reduce of its 176,160,768 fp32 expert gradients over those 2 ranks (it had been priced
    over NVLink, 2.1 ms instead of about 15.7)."""
    from charon_search.cost.collectives import estimate_collective

    r = cs.simulate_training("mixtral-8x7b", CLUSTER,
                             Layout(dp=16, ep=8, global_batch_size=16, seq_len=4096),
                             memory=False)
    cross = estimate_collective("all_reduce", 176_160_768 * 4, 2, load_cluster(CLUSTER),
                                stride=8).duration_s
    inside = estimate_collective("all_reduce", 176_160_768 * 4, 2, load_cluster(CLUSTER),
                                 stride=1).duration_s
    assert cross > 3 * inside
    syncs = [e - s for _, name, s, e in r.timeline.dp_intervals if name == "grad_sync.moe"]
    assert syncs and min(syncs) >= cross


def test_zero2_reduce_scatters_every_micro_batch() -> None:
    """ZeRO-2 keeps only its gradient shard, so each of the m = 4 micro-batches' backward
    reduce-scatters the gradients: 3 early reduce-scatters per layer beside the last one, which
    take time that ZeRO-1 (one reduce-scatter after accumulating) does not."""
    def layout(zero: int, **kw) -> Layout:
        return Layout(zero_stage=zero, seq_len=4096, **({"dp": 16, "global_batch_size": 64}
                                                         | kw))

    z1, z2 = (cs.simulate_training("llama-3.1-8b", CLUSTER, layout(z)) for z in (1, 2))
    assert z2.num_micro_batches == 4
    last = {name.split(".", 1)[1]: e - s for _, name, s, e in z2.timeline.dp_intervals
            if name.startswith("grad_sync.")}
    early = {name.split(".", 1)[1]: e - s for _, name, s, e in z2.timeline.dp_intervals
             if name.startswith("grad_sync_early.")}
    assert early.keys() == last.keys()
    for block, t in early.items():
        assert t == pytest.approx(3 * last[block])
    assert not any(name.startswith("grad_sync_early.") for _, name, *_ in z1.timeline.dp_intervals)
    assert z2.step_time_s > z1.step_time_s
    assert z2.memory["stages"][0]["grads_bytes"] < z1.memory["stages"][0]["grads_bytes"]
    # Under a pipeline the micro-batches accumulate unsharded gradients and reduce-scatter once
    # (Llama 3's FSDP, arXiv 2407.21783 Sec. 3.3.4), in memory and in time alike.
    piped = layout(2, dp=8, pp=2, schedule="1f1b")
    run = cs.simulate_training("llama-3.1-8b", CLUSTER, piped, memory=False)
    assert not any(name.startswith("grad_sync_early.")
                   for _, name, *_ in run.timeline.dp_intervals)
    assert cs.memory_report("llama-3.1-8b", piped, CLUSTER).assumptions[
        "fsdp_no_sync_accumulation"] is True


def test_context_parallel_all_gather_returns_dk_and_dv_at_their_widths() -> None:
    """cp_algo allgather, Llama-3.1-8B at s = 16384: the backward gathers K and V of the whole
    context, 16384 x 8 heads x 128 x 2 x 2 B = 67,108,864 B, and reduce-scatters dK and dV, each
    half of that (each had been sized as K + V)."""
    r = cs.simulate_training("llama-3.1-8b", CLUSTER,
                             Layout(dp=2, cp=4, cp_algo="allgather", global_batch_size=2,
                                    seq_len=16384), memory=False)
    cp = [c for c in _comm(r, "dense", 16384) if c[0].startswith("cp_")]
    assert sorted((c[1], c[2]) for c in cp) == [
        ("all_gather", 67_108_864), ("all_gather", 67_108_864),
        ("reduce_scatter", 33_554_432), ("reduce_scatter", 33_554_432)]


def test_dualpipe_ranks_hold_a_stage_and_its_mirror() -> None:
    """DualPipe, p = 4: rank i holds stage i and stage 3 - i, so ranks 0 and 3 (stages 0 and 3:
    the embedding and the LM head) report the same memory, as do ranks 1 and 2, and rank 0's
    parameters are stage 0's plus stage 3's of the 1F1B split."""
    common = {"pp": 4, "global_batch_size": 8, "seq_len": 2048}
    dual = cs.memory_report("llama-3.1-8b", Layout(schedule="dualpipe", **common), CLUSTER)
    plain = cs.memory_report("llama-3.1-8b", Layout(schedule="1f1b", **common), CLUSTER)
    d = [s.params_bytes for s in dual.stages]
    p = [s.params_bytes for s in plain.stages]
    assert d[0] == d[3] == pytest.approx(p[0] + p[3])
    assert d[1] == d[2] == pytest.approx(p[1] + p[2])
    peaks = [s.peak_reserved_bytes for s in dual.stages]
    assert peaks[0] == pytest.approx(peaks[3]) and peaks[1] == pytest.approx(peaks[2])


@pytest.mark.parametrize(("kw", "message"), [
    ({"expert_load_imbalance": float("nan")}, "`expert_load_imbalance` must be a finite number"),
    ({"expert_load_imbalance": float("inf")}, "`expert_load_imbalance` must be a finite number"),
    ({"tp": 2, "sequence_parallel": "no"}, "`sequence_parallel` must be true or false"),
    ({"recompute": "full", "recompute_num_layers": 1.5},
     "`recompute_num_layers` must be an integer >= 0"),
    ({"recompute_num_layers": 4}, "`recompute_num_layers` applies to recompute 'full' only"),
])
def test_layout_rejects_values_it_cannot_simulate(kw, message) -> None:
    with pytest.raises(ConfigError, match=message):
        Layout(**kw)


def test_hsdp_all_reduces_expert_gradients_across_replica_groups() -> None:
    """Mixtral, dp = 8, HSDP shard groups of 2, ep = 2, ZeRO-3: one shard group is one EP group,
    so each rank holds its 4 experts whole (4 x 3 x 4096 x 14336 = 704,643,072 parameters a
    layer) and the 4 replica groups must all-reduce those fp32 gradients, 2,818,572,288 B, over
    4 ranks spaced 2 apart; a MoE layer's gradient sync takes at least that."""
    from charon_search.cost.collectives import estimate_collective

    lay = Layout(dp=8, hsdp_shard=2, ep=2, zero_stage=3, global_batch_size=8, seq_len=4096)
    assert lay.shard_groups == (2, 1)
    r = cs.simulate_training("mixtral-8x7b", CLUSTER, lay, memory=False)
    ar = estimate_collective("all_reduce", 704_643_072 * 4, 4, load_cluster(CLUSTER),
                             stride=2).duration_s
    syncs = [e - s for _, name, s, e in r.timeline.dp_intervals if name == "grad_sync.moe"]
    assert syncs and min(syncs) >= ar
