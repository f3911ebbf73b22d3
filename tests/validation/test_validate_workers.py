"""``run_validation(..., workers=N)``: the records simulated by Ray actors give the same result
as in this process (real Ray: the ``local_ray`` fixture's 2-CPU instance)."""

from __future__ import annotations

import pytest

from charon_search.validation import run_validation, select_records

pytestmark = [pytest.mark.ray]

#: Training (Megatron, torchtitan), a silicon serving row, a published serving record and a
#: record the simulator cannot express (its skip reason must survive the trip).
IDS = ["megatron_sc21_t1_1.7b", "torchtitan_202412_t1_8b_8gpu_fsdp",
       "meta_llama_llama_3_1_8b_instruct_meta_llama_llama_3_1_8b_instruct_h100_sxm_trtllm_"
       "agg_1024x512_c8_tp8_epnone_135", "trtllm_llama31_8b_h100_tp1_isl128_osl128"]
#: Not expressible: it ran on TPU v4 (no GPU spec).
SKIPPED = "palm_540b_6144_tpuv4"


def test_workers_reproduce_the_in_process_result(local_ray, by_id):
    records = select_records([by_id[i] for i in [*IDS, SKIPPED]])
    seen: list[str] = []
    local = run_validation(records)
    remote = run_validation(records, workers=2, progress=lambda i, n, rec: seen.append(rec.id))
    assert remote.rows == local.rows and remote.rows
    assert remote.skipped == local.skipped
    assert [s["id"] for s in remote.skipped] == [SKIPPED]
    assert remote.cases == local.cases and remote.summary == local.summary
    assert sorted(seen) == sorted(r.id for r in records)   # progress once per record
    # the pool's workers were separate processes: Ray is still the fixture's, untouched
    assert local_ray.is_initialized()


def test_negative_workers_is_a_clear_error(shipped_records):
    from charon_search.errors import ConfigError

    with pytest.raises(ConfigError, match="`workers` must be >= 0"):
        run_validation(shipped_records[:1], workers=-1)
