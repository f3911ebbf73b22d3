"""Predicted vs measured peak memory of every published record that states one.

The records (torchtitan runs; ``peak_memory_bytes`` is the caching allocator's peak reserved
memory) come from the package copy ``charon_search/data/validation/published-dev.yaml``. The
layout mapping lives in ``benchmarks/memory_validation.py``, which prints the full table.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "memory_validation.py"
_spec = importlib.util.spec_from_file_location("memory_validation", _SCRIPT)
mv = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mv)

RECORDS = {r["id"]: r for r in mv.load_records()}

#: Records whose configuration the model covers: FSDP2 state, per-op SAC / full AC, flash
#: attention, the fp32 loss, FSDP2 reduce buffers, PP no-sync gradient accumulation. Tolerance on
#: peak reserved memory.
MODELLED = {
    "torchtitan_202412_t1_8b_8gpu_fsdp": 0.06,
    "torchtitan_202412_t1_8b_8gpu_fsdp_compile_fp8": 0.06,
    "torchtitan_202412_t2_8b_fsdp8_cp1_32k": 0.06,
    "torchtitan_202412_t2_8b_fsdp2_cp4_128k": 0.06,
    "torchtitan_202412_t3_8b_128gpu_fsdp_compile": 0.06,
    "torchtitan_202412_t6_405b_fsdp8_cp1_32k": 0.06,
    "torchtitan_202412_t6_405b_fsdp2_cp4_128k": 0.06,
}
#: Known gaps (see the memory report): DTensor TP+SP keeps all-gathered GEMM inputs and
#: float8/TP workspaces the model does not trace (under-predicted by ~20-25 %); the June-2025
#: torchtitan compiles the loss, which no longer saves fp32 log-softmax logits (over-predicted).
KNOWN_GAPS = {
    "torchtitan_202412_t4_70b_256gpu_fsdp32_tp8": -1,
    "torchtitan_202412_t4_70b_256gpu_fsdp32_tp8_asynctp": -1,
    "torchtitan_trainy_h200_8b_4nodes": +1,
}


def test_every_record_is_classified() -> None:
    assert set(RECORDS) == set(MODELLED) | set(KNOWN_GAPS)


@pytest.mark.slow
@pytest.mark.validation
@pytest.mark.parametrize("rec_id", sorted(MODELLED))
def test_peak_reserved_within_tolerance(rec_id: str) -> None:
    row = mv.predict(RECORDS[rec_id])
    assert abs(row["error"]) <= MODELLED[rec_id], row


@pytest.mark.slow
@pytest.mark.validation
@pytest.mark.parametrize("rec_id", sorted(KNOWN_GAPS))
def test_known_gaps_have_the_documented_sign(rec_id: str) -> None:
    row = mv.predict(RECORDS[rec_id])
    assert row["error"] * KNOWN_GAPS[rec_id] > 0.1, row
