"""Predicted vs measured memory of every published record that states one.

The records come from the package copy ``charon_search/data/validation/published-dev.yaml`` and
are mapped to cases exactly as ``charon-search validate`` maps them (``benchmarks/
memory_validation.py``, which prints the full table). torchtitan's ``peak_memory_bytes`` is the
caching allocator's peak *reserved* memory; Korthikanti et al.'s Figure 1 bars are stored
activations and parameter + gradient + optimizer bytes per GPU.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "memory_validation.py"
_spec = importlib.util.spec_from_file_location("memory_validation", _SCRIPT)
mv = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mv)

RECORDS = {r.id: r for r in mv.load_records()}

#: (record, metric) -> tolerance on the relative error.
MODELLED = {
    ("torchtitan_202412_t1_8b_8gpu_fsdp", "peak_memory_bytes"): 0.05,
    ("torchtitan_202412_t1_8b_8gpu_fsdp_compile_fp8", "peak_memory_bytes"): 0.05,
    ("torchtitan_202412_t2_8b_fsdp8_cp1_32k", "peak_memory_bytes"): 0.05,
    ("torchtitan_202412_t2_8b_fsdp2_cp4_128k", "peak_memory_bytes"): 0.05,
    ("torchtitan_202412_t3_8b_128gpu_fsdp_compile", "peak_memory_bytes"): 0.05,
    ("torchtitan_202412_t4_70b_256gpu_fsdp32_tp8_asynctp", "peak_memory_bytes"): 0.05,
    ("torchtitan_202412_t6_405b_fsdp8_cp1_32k", "peak_memory_bytes"): 0.05,
    ("torchtitan_trainy_h200_8b_4nodes", "peak_memory_bytes"): 0.05,
    ("korthikanti_fig1_22b_memory", "activation_memory_bytes"): 0.05,
    ("korthikanti_fig1_22b_memory", "params_grads_optimizer_memory_bytes"): 0.05,
    ("korthikanti_fig1_22b_memory#1", "activation_memory_bytes"): 0.05,
    # Korthikanti's 530B bars are the closed form times the interleaved-schedule factor
    # 1 + (p - 1) / (p v) = 1.324 at p 35, v 3 (the record's vpp from Calculon's Figure 1
    # reproduction config); with plain 1F1B they would be predicted 23 % low.
    ("korthikanti_fig1_530b_memory", "activation_memory_bytes"): 0.05,
    ("korthikanti_fig1_530b_memory#1", "activation_memory_bytes"): 0.05,
}
#: Known gaps, (record, metric) -> (sign of the error, bound on |error|):
#: * the 70B TP8 run without AsyncTP reserves 4.3 GiB more than the same run with AsyncTP at
#:   the same allocated peak (DTensor's 2 GiB all-gather / reduce-scatter blocks in the caching
#:   allocator instead of symmetric memory); the allocator's fragmentation is one fitted ratio;
# * the Figure 1 parameter bars count only the transformer layers (18 B x 12 h^2 L / (t p));
#   stage 0 also holds the embedding;
# * the 405B PP 8 runs: with torchtitan's own split (generate_split_points: 15 of the 126
#   layers on stage 0, the peak stage of 1F1B) the peaks are predicted 4-6 % low (CP 4 at
#   128k: -6.3 %); an earlier split that put 16 layers on stage 0 had hidden it.
KNOWN_GAPS = {
    ("torchtitan_202412_t6_405b_fsdp2_cp4_128k", "peak_memory_bytes"): (-1, 0.10),
    ("torchtitan_202412_t4_70b_256gpu_fsdp32_tp8", "peak_memory_bytes"): (-1, 0.10),
    ("korthikanti_fig1_530b_memory", "params_grads_optimizer_memory_bytes"): (+1, 0.10),
}


def _row(rec_id: str, metric: str) -> dict:
    return next(r for r in mv.predict(RECORDS[rec_id]) if r["metric"] == metric)


def test_every_record_is_classified() -> None:
    have = {(r.id, m) for r in RECORDS.values() for m in mv.METRICS if m in r.measured}
    assert have == set(MODELLED) | set(KNOWN_GAPS)


@pytest.mark.slow
@pytest.mark.validation
@pytest.mark.parametrize(("rec_id", "metric"), sorted(MODELLED))
def test_memory_within_tolerance(rec_id: str, metric: str) -> None:
    row = _row(rec_id, metric)
    assert abs(row["error"]) <= MODELLED[(rec_id, metric)], row


@pytest.mark.slow
@pytest.mark.validation
@pytest.mark.parametrize(("rec_id", "metric"), sorted(KNOWN_GAPS))
def test_known_gaps_have_the_documented_sign(rec_id: str, metric: str) -> None:
    row = _row(rec_id, metric)
    sign, bound = KNOWN_GAPS[(rec_id, metric)]
    assert row["error"] * sign > 0.03 and abs(row["error"]) < bound, row


@pytest.mark.slow
@pytest.mark.validation
def test_allocator_ratio_is_consistent_across_records() -> None:
    """The fitted ``allocator_reserved_factor`` (1.14) is the median reserved/allocated ratio;
    every fully specified record but the 70B non-AsyncTP one lies within 3 % of it."""
    rows = [r for rec in RECORDS.values() for r in mv.predict(rec)]
    fit = mv.fit_allocator(rows)
    assert fit["median"] == pytest.approx(1.14, abs=0.01)
    off = {k for k, v in fit["ratios"].items() if abs(v / fit["median"] - 1) > 0.03}
    assert off == {"torchtitan_202412_t4_70b_256gpu_fsdp32_tp8"}
