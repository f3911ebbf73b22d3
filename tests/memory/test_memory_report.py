"""memory_report / fits: pipeline in-flight counts, recompute, allocator, the JSON shape."""

from __future__ import annotations

import pytest

from charon_search.errors import ConfigError
from charon_search.hardware.spec import Calibration
from charon_search.layout import Layout
from charon_search.memory import (
    MemoryOptions,
    ShardingPoint,
    fits,
    in_flight_chunks,
    memory_report,
    stage_layers,
)
from charon_search.testing import toy_cluster
from charon_search.units import GIB

from .conftest import GPT3_A, GPT3_H, gpt_spec

S = 2048


@pytest.mark.parametrize(("schedule", "want"), [
    ("none", [1]),
    ("gpipe", [16, 16, 16, 16]),
    ("1f1b", [4, 3, 2, 1]),
    ("zero-bubble", [4, 3, 2, 1]),
    ("dualpipe", [5, 5, 5, 5]),
])
def test_in_flight_per_schedule(schedule: str, want: list[int]) -> None:
    pp = len(want)
    got = [in_flight_chunks(schedule, pp=pp, stage_idx=i, num_micro_batches=16)
           for i in range(pp)]
    assert got == want


def test_interleaved_matches_korthikanti_factor() -> None:
    # Stage 0 holds p * (1 + (p - 1) / (p * v)) stage-equivalents (arXiv 2205.05198, Sec 4.2.3).
    p, v = 8, 3
    chunks = in_flight_chunks("interleaved-1f1b", pp=p, stage_idx=0, num_micro_batches=64, vpp=v)
    assert chunks / v == pytest.approx(p * (1 + (p - 1) / (p * v)))
    # Few micro-batches cap the count.
    assert in_flight_chunks("1f1b", pp=8, stage_idx=0, num_micro_batches=2) == 2


def test_stage_layers_even_and_interleaved() -> None:
    # The step simulator's split: the first and last stage take one layer fewer (torchtitan's
    # generate_split_points: "Middle stages get an extra layer if there are any remaining").
    assert [len(x) for x in stage_layers(("d",) * 10, 4)] == [2, 3, 3, 2]
    assert [len(x) for x in stage_layers(("d",) * 126, 8)] == [15, 16, 16, 16, 16, 16, 16, 15]
    types = tuple(f"l{i}" for i in range(8))
    assert stage_layers(types, 2, 2) == [["l0", "l1", "l4", "l5"], ["l2", "l3", "l6", "l7"]]


def _report(profile, **layout_kw):
    kw = {"micro_batch_size": 1, "global_batch_size": 8, "seq_len": S}
    kw.update(layout_kw)
    return memory_report(gpt_spec(), Layout(**kw), toy_cluster(), profile=profile)


def test_1f1b_activations_follow_in_flight(gpt3_profile) -> None:
    rep = _report(gpt3_profile, tp=8, pp=4, sequence_parallel=True, schedule="1f1b",
                  recompute="selective")
    blk = gpt3_profile.blocks["dense"].evaluate(
        ShardingPoint(b=1, s=S, c=S, tp=8, sequence_parallel=True))
    per_layer = blk["selective_saved"]
    assert per_layer == pytest.approx(34 * S * GPT3_H / 8, rel=0.05)
    # Middle stages hold (p - i) micro-batches of 24 layers plus one layer's transient.
    for st in rep.stages[1:3]:
        steady = st.in_flight * 24 * per_layer
        assert steady < st.activations_bytes < steady + 3 * per_layer + 5 * GPT3_A * S * S
    # Stage 0 holds the most.
    assert rep.bottleneck_stage == 0


def test_layout_as_a_mapping_and_the_argument_order_hint(gpt3_profile) -> None:
    kw = {"micro_batch_size": 1, "global_batch_size": 8, "seq_len": S, "tp": 8, "pp": 4,
          "schedule": "1f1b"}
    as_map = memory_report(gpt_spec(), kw, toy_cluster(), profile=gpt3_profile)
    assert as_map.to_dict() == _report(gpt3_profile, **kw).to_dict()
    with pytest.raises(ConfigError, match=r"but got ClusterSpec \(memory_report takes "
                                          r"model, layout, cluster\)"):
        memory_report(gpt_spec(), toy_cluster(), Layout(**kw), profile=gpt3_profile)


def test_full_recompute_keeps_inputs_only(gpt3_profile) -> None:
    rep = _report(gpt3_profile, tp=8, pp=4, sequence_parallel=True, schedule="1f1b",
                  recompute="full")
    st = rep.stages[1]
    inputs = st.in_flight * 24 * 2 * S * GPT3_H / 8
    assert st.activations_bytes > inputs
    # The transient on top is about one layer's full activations and its gradients.
    assert st.activations_bytes - inputs < 4 * S * GPT3_H * (34 + 5 * GPT3_A * S / GPT3_H) / 8


def test_fp8_halves_saved_gemm_inputs(gpt3_profile) -> None:
    bf16 = _report(gpt3_profile, tp=8, sequence_parallel=True, recompute="selective")
    fp8 = _report(gpt3_profile, tp=8, sequence_parallel=True, recompute="selective",
                  precision="fp8")
    blk = gpt3_profile.blocks["dense"].evaluate(
        ShardingPoint(b=1, s=S, c=S, tp=8, sequence_parallel=True))
    saving = 96 * 0.5 * blk["saved_gemm_input"]
    assert bf16.stages[0].activations_bytes - fp8.stages[0].activations_bytes == pytest.approx(
        saving, rel=1e-6)


def test_fits_reason_and_allocator() -> None:
    from charon_search.memory import ModelMemoryProfile

    from .gpt_graph import gpt_block

    spec = gpt_spec(h=4096, a=32, layers=32)
    prof = ModelMemoryProfile.from_blocks(spec, {"dense": gpt_block(4096, 32)})
    cal = Calibration(allocator_reserved_factor=1.1, allocator_reserved_extra_bytes=GIB)
    cluster = toy_cluster(calibration=cal)
    small = Layout(dp=4, zero_stage=3, micro_batch_size=1, global_batch_size=4, seq_len=1024,
                   recompute="full")
    rep = memory_report(spec, small, cluster, profile=prof)
    assert rep.fits and rep.reason is None
    st = rep.stages[0]
    assert st.peak_reserved_bytes == pytest.approx(st.peak_allocated_bytes * 1.1 + GIB)
    # 6.9B params unsharded with Adam: 16 B/param = 110 GB > the H100's 79.2 GiB.
    big = Layout(micro_batch_size=1, global_batch_size=1, seq_len=1024)
    rep = memory_report(spec, big, cluster, profile=prof)
    ok, reason = rep.fits, rep.reason
    assert not ok
    assert reason == (f"stage 0 needs {rep.stages[0].peak_reserved_bytes / GIB:.1f} GiB, "
                      "the h100-sxm-80gb has 79.2 GiB")
    d = rep.to_dict()
    assert set(d) >= {"stages", "peak_allocated_bytes", "peak_reserved_bytes",
                      "device_memory_bytes", "fits", "reason"}
    assert set(d["stages"][0]) >= {"stage", "params_bytes", "grads_bytes", "optimizer_bytes",
                                   "activations_bytes", "peak_allocated_bytes",
                                   "peak_reserved_bytes"}
    assert d["fits"] is False and d["device_memory_bytes"] == 85_018_877_624


def test_fits_never_raises_for_infeasible_but_rejects_bad_layout(gpt3_profile) -> None:
    from charon_search.errors import ConfigError

    with pytest.raises(ConfigError, match="tp"):
        _report(gpt3_profile, tp=5)
    with pytest.raises(ConfigError, match="selective_policy"):
        MemoryOptions(selective_policy="bogus")


def test_fits_wrapper_uses_report(monkeypatch, gpt3_profile) -> None:
    import charon_search.memory.report as mr

    monkeypatch.setattr(mr, "model_profile", lambda spec, **kw: gpt3_profile)
    ok, reason = fits(gpt_spec(), Layout(seq_len=S), toy_cluster())
    assert not ok and reason.startswith("stage 0 needs ")


def test_interleaved_and_dualpipe_in_report(gpt3_profile) -> None:
    kw = {"tp": 8, "pp": 4, "sequence_parallel": True, "recompute": "selective",
          "micro_batch_size": 1, "global_batch_size": 16, "seq_len": S}
    plain = memory_report(gpt_spec(), Layout(**kw, schedule="1f1b"), toy_cluster(),
                          profile=gpt3_profile)
    inter = memory_report(gpt_spec(), Layout(**kw, schedule="interleaved-1f1b", vpp=3),
                          toy_cluster(), profile=gpt3_profile)
    # Same layers per rank; stage 0 holds 15 chunks = p * (1 + (p-1)/(p*v)) = 5
    # stage-equivalents instead of 4.
    assert inter.stages[0].in_flight == 2 * 3 + 2 * 4 + 1
    assert inter.stages[0].params_bytes == pytest.approx(plain.stages[0].params_bytes)
    assert inter.stages[0].activations_bytes > plain.stages[0].activations_bytes
    dual = memory_report(gpt_spec(), Layout(**kw, schedule="dualpipe"), toy_cluster(),
                         profile=gpt3_profile)
    assert dual.stages[1].params_bytes == pytest.approx(2 * plain.stages[1].params_bytes)
    assert dual.stages[1].in_flight == 5


def test_pp_layout_moves_layers_between_ranks(gpt3_profile) -> None:
    """An explicit Megatron pipeline layout: rank 0 keeps the embedding and 40 of the 96
    layers instead of 48, rank 1 the other 56 and the LM head; each moved layer carries one
    layer's weights (and their gradients and optimizer state) from rank 0 to rank 1."""
    kw = {"tp": 8, "pp": 2, "schedule": "1f1b", "sequence_parallel": True,
          "micro_batch_size": 1, "global_batch_size": 8, "seq_len": S}
    even = memory_report(gpt_spec(), Layout(**kw), toy_cluster(), profile=gpt3_profile)
    moved = memory_report(gpt_spec(), Layout(**kw, pp_layout="E(t)*40|(t)*56L"),
                          toy_cluster(), profile=gpt3_profile)
    per_layer = 12 * GPT3_H * GPT3_H / 8 * 2  # fp16 weights of one GPT layer over tp 8
    assert even.stages[0].params_bytes - moved.stages[0].params_bytes == pytest.approx(
        8 * per_layer, rel=0.01)
    assert moved.stages[1].params_bytes - even.stages[1].params_bytes == pytest.approx(
        8 * per_layer, rel=0.01)


def test_hsdp_shards_inside_groups(gpt3_profile) -> None:
    kw = {"dp": 8, "zero_stage": 3, "micro_batch_size": 1, "global_batch_size": 8}
    full = memory_report(gpt_spec(), Layout(**kw), toy_cluster(), profile=gpt3_profile)
    hsdp = memory_report(gpt_spec(), Layout(**kw, hsdp_shard=2), toy_cluster(),
                         profile=gpt3_profile)
    assert hsdp.stages[0].optimizer_bytes == pytest.approx(4 * full.stages[0].optimizer_bytes)
