"""The training evaluator's memory figure and its handling of layouts the simulator rejects
(review findings M1 and M2, ``/tmp/review_memory/findings.md``)."""

from __future__ import annotations

import pytest

from charon_search.memory import memory_report
from charon_search.search.evaluators import TrainingEvaluator
from charon_search.search.objective import Objective

#: NCCL buffers of one 8-GPU communicator on the H100 clusters (``comm_buffer_bytes``,
#: aiconfigurator's h100_sxm misc.nccl_mem[8]).
NCCL_BYTES = 411_041_792
GIB = 2**30

#: llama-3.1-70b, tp 8, pp 4, dp 2 with SP and ZeRO-1 at seq 14,080: three process groups of
#: more than one rank (tp, dp, pp), so 3 x 411,041,792 = 1,233,125,376 B of NCCL buffers sit
#: outside the allocator; reserved 78.26 GiB + 1.15 GiB = 79.41 GiB > the H100's 79.18 GiB
#: (85,018,877,624 B, as CUDA reports it).
BIG = dict(model="llama-3.1-70b", cluster="dgx-h100-ib400", tp=8, pp=4, dp=2,
           sequence_parallel=True, schedule="1f1b", micro_batch_size=1, global_batch_size=16,
           seq_len=14080, zero_stage=1)


def test_pruned_record_stores_the_device_total_the_prune_compared() -> None:
    rec = TrainingEvaluator().evaluate(BIG)
    assert rec["feasible"] is False
    assert rec["prune_reason"] == ("memory: stage 0 needs 79.4 GiB, the h100-sxm-80gb has "
                                   "79.2 GiB")
    # Before the fix peak_memory_bytes was the reserved 78.26 GiB, below the device's
    # 79.18 GiB, so `peak_memory_bytes <= device` held for a pruned point.
    assert rec["peak_reserved_bytes"] / GIB == pytest.approx(78.26, abs=5e-3)
    assert rec["peak_reserved_bytes"] < rec["device_memory_bytes"]
    assert rec["peak_memory_bytes"] - rec["peak_reserved_bytes"] == 3 * NCCL_BYTES
    assert rec["peak_memory_bytes"] / GIB == pytest.approx(79.41, abs=5e-3)
    assert rec["peak_memory_bytes"] > rec["device_memory_bytes"] == 85_018_877_624
    # So the objective's own constraint agrees with the prune: violated by
    # (79.407 - 79.18) / 79.18 = +0.29 %.
    obj = Objective.from_dict({"name": "m1", "objectives": [{"metric": "step_time_s",
                                               "direction": "minimize"}],
                               "constraints": ["peak_memory_bytes <= device"]})
    (_, violation), = obj.violations(rec)
    assert violation == pytest.approx(0.00286, abs=5e-5)


def test_feasible_record_stores_the_device_total() -> None:
    """Same model at seq 8192, gbs 16: fits; the record's peak_memory_bytes is the report's
    peak_device_bytes, again reserved + 3 x 411,041,792 B."""
    cfg = {**BIG, "seq_len": 8192}
    rec = TrainingEvaluator().evaluate(cfg)
    assert rec["feasible"] is True and rec["step_time_s"] > 0
    mem = memory_report(cfg["model"], {k: v for k, v in cfg.items()
                                       if k not in ("model", "cluster")}, cfg["cluster"])
    assert rec["peak_memory_bytes"] == round(mem.peak_device_bytes)
    assert rec["peak_memory_bytes"] == round(rec["memory.peak_device_bytes"])
    assert rec["peak_memory_bytes"] - rec["peak_reserved_bytes"] == 3 * NCCL_BYTES
    assert rec["peak_memory_bytes"] <= rec["device_memory_bytes"]


def test_layout_the_simulator_rejects_is_an_infeasible_record() -> None:
    """tp 4, pp 2, vpp 2, gbs 3: m = 3 micro-batches is not a multiple of pp = 2, which
    interleaved 1F1B needs. Before the fix the memory check passed and simulate_training's
    ConfigError escaped ``evaluate``."""
    cfg = dict(model="llama-3.1-8b", cluster="h100-sxm-8gpu", tp=4, pp=2, vpp=2, dp=1,
               schedule="interleaved-1f1b", micro_batch_size=1, global_batch_size=3,
               seq_len=4096)
    rec = TrainingEvaluator().evaluate(cfg)
    assert rec["feasible"] is False
    assert rec["prune_reason"] == ("invalid: `num_micro_batches % pp == 0` must hold for "
                                   "interleaved-1f1b, but got (num_micro_batches=3, pp=2)")
    assert rec["num_gpus"] == 8


def test_config_error_from_the_simulator_alone_is_an_infeasible_record() -> None:
    """dp 16 ZeRO-3 on the 8-GPU cluster: the per-GPU memory report only needs the GPU type
    (llama-3.1-8b: 16 B x 8.03 B params / 16 = 8.0 GB of states, fits), but the step simulator
    needs 16 GPUs and raises ConfigError: an infeasible record naming the rule."""
    cfg = dict(model="llama-3.1-8b", cluster="h100-sxm-8gpu", dp=16, zero_stage=3,
               micro_batch_size=1, global_batch_size=16, seq_len=2048)
    rec = TrainingEvaluator().evaluate(cfg)
    assert rec["feasible"] is False
    assert rec["prune_reason"].startswith("invalid: `tp * pp * dp * cp <= cluster GPUs`")
    assert "16 > 8" in rec["prune_reason"]
    assert rec["peak_memory_bytes"] < rec["device_memory_bytes"]
