"""Calibration review fixes, on synthetic evaluators (no simulation): ``--write`` needs a
held-out check, parameters no record depends on keep their shipped values, the fit starts
from the shipped values, and a record the simulator fails on is not dropped from the
objective."""

from __future__ import annotations

import dataclasses
import math
import shutil
from pathlib import Path

import pytest
import yaml

import charon_search
from charon_search.cli import main
from charon_search.validation.calibration import (
    CalibrationFit,
    _objective,
    calibration_document,
    fit_parameters,
    leave_one_source_out,
    shipped_values,
    write_cluster_specs,
    write_refusal,
)
from charon_search.validation.records import Record
from charon_search.validation.runner import ValidationResult

SPECS = Path(charon_search.__file__).parent / "cluster_specs"
FOUNDRY = ["llmfoundry_h100_80gb_mpt1b_8gpu_seq2048", "llmfoundry_h100_80gb_mpt7b_8gpu_seq2048"]


def _record(i: int, source: str) -> Record:
    return Record(id=f"r{i}", source=source, kind="training", model={"name": "x"},
                  hardware={"gpu": "h100"}, config={}, measured={"tokens_per_s": 1.0},
                  confidence="high")


def _evaluator(error_of):  # type: ignore[no-untyped-def]
    """An ``Evaluate`` whose record ``r`` under ``values`` has relative error
    ``error_of(r, values)`` on tokens_per_s; None: the simulator failed (a skipped row)."""
    def evaluate(records, values):  # type: ignore[no-untyped-def]
        rows, skipped = [], []
        for r in records:
            e = error_of(r, values)
            if e is None:
                skipped.append({"id": r.id, "reason": "simulator error"})
                continue
            m = r.measured["tokens_per_s"]
            rows.append({"id": r.id, "metric": "tokens_per_s", "measured": m,
                         "predicted": m * (1 + e), "error": e})
        return ValidationResult(rows=rows, skipped=skipped, skipped_metrics=[],
                                cases={r.id: {"fully_specified": True} for r in records})
    return evaluate


# ------------------------------------------------------------------ 9: a fixed record set
def test_a_record_the_simulator_fails_on_counts_as_an_infinite_error() -> None:
    """Errors 2, -3, 5, 30, 50 % at the shipped 1.0, each 5 % per unit of slowdown worse
    above it; at 1.3 the two worst records fail. Dropping them scored 1.3 at
    median(|log 1.035|, |log 0.985|, |log 1.065|) = 0.0344 < 0.0488 = |log 1.05|, and the fit
    took it; counted as infinite errors, 1.3 scores |log 1.065| = 0.0630 and the fit keeps
    1.0, on all 5 records."""
    recs = [_record(i, "A") for i in range(5)]
    base = {"r0": 0.02, "r1": -0.03, "r2": 0.05, "r3": 0.30, "r4": 0.50}

    def error(r: Record, values) -> float | None:  # type: ignore[no-untyped-def]
        x = values.get("overlap_compute_slowdown", 1.0)
        if x == 1.3 and r.id in ("r3", "r4"):
            return None
        return base[r.id] + 0.05 * (x - 1.0)

    evaluate = _evaluator(error)
    shipped = evaluate(recs, {})
    scored = frozenset((r.id, "training_time") for r in recs)
    broken = evaluate(recs, {"overlap_compute_slowdown": 1.3})
    assert _objective(broken, scored) == pytest.approx(math.log(1.065), rel=1e-9)
    assert _objective(broken) == pytest.approx(math.log(1.035), rel=1e-9)  # rows present only
    assert _objective(shipped, scored) == pytest.approx(math.log(1.05), rel=1e-9)
    fit = fit_parameters(recs, ["overlap_compute_slowdown"], evaluate=evaluate)
    assert fit.values == {"overlap_compute_slowdown": 1.0}
    assert fit.objective == pytest.approx(math.log(1.05), rel=1e-9)
    assert fit.num_records == 5
    # Most of the scored records failing makes the median infinite.
    assert _objective(broken, frozenset({("r0", "training_time"), ("r3", "training_time"),
                                         ("r4", "training_time")})) == math.inf


# ------------------------------------------------------------------ 7: held-out check
def test_write_refusal_needs_two_held_out_groups() -> None:
    better = CalibrationFit(values={"overlap_compute_slowdown": 1.3}, objective=0.0312,
                            uncalibrated_objective=0.0411, num_records=2,
                            sources=("MosaicML llm-foundry",), evaluations=6)
    why = write_refusal(better, [], held_out_by="source")
    assert "one source only" in why and "--no-loso" in why and "\n" not in why
    assert "one gpu only" in write_refusal(better, [], held_out_by="gpu")
    assert write_refusal(better, []) == ""  # no held-out report asked for (--no-loso)
    rows = [{"test_median_abs_log_error": 0.1, "test_median_abs_log_error_uncalibrated": 0.2}]
    assert "--no-loso" in write_refusal(better, rows, held_out_by="source")  # 1 fold < 2
    assert write_refusal(better, rows * 2, held_out_by="source") == ""


def test_leave_one_source_out_of_one_source_is_empty() -> None:
    recs = [_record(0, "A"), _record(1, "A")]
    evaluate = _evaluator(lambda r, v: 0.1)
    assert leave_one_source_out(recs, ["overlap_compute_slowdown"], evaluate=evaluate) == []


@pytest.fixture
def fake_simulation(monkeypatch):  # type: ignore[no-untyped-def]
    """``calibrate`` on a synthetic evaluator: tokens/s is off by overlap slowdown / 1.2 - 1
    (the shipped H100 cluster's 1.1 gives -8.3 %); nothing else moves a prediction. Every
    record's case runs on the shipped dgx-h100-ib400 cluster (as the llm-foundry rows do)."""
    from types import SimpleNamespace

    from charon_search.hardware import load_cluster
    from charon_search.validation import calibration, translate

    def error(r: Record, values) -> float:  # type: ignore[no-untyped-def]
        return values.get("overlap_compute_slowdown", 1.1) / 1.2 - 1

    cluster = load_cluster("dgx-h100-ib400")
    monkeypatch.setattr(calibration, "default_evaluate", lambda **kw: _evaluator(error))
    monkeypatch.setattr(translate, "to_case", lambda record: SimpleNamespace(cluster=cluster))


def _specs(tmp_path):  # type: ignore[no-untyped-def]
    from charon_search.hardware import load_cluster

    specs = tmp_path / "specs"
    specs.mkdir()
    src = load_cluster("dgx-h100-ib400")
    assert src.calibration.overlap_compute_slowdown == 1.1
    assert src.calibration.allocator_reserved_extra_bytes == 2**30
    shutil.copy(SPECS / "dgx-h100-ib400.yaml", specs / "dgx-h100-ib400.yaml")
    return specs


def test_calibrate_write_refuses_one_source_before_fitting(fake_simulation, tmp_path,
                                                           capsys) -> None:
    """Two llm-foundry records, one source: --write without --no-loso is a one-line error
    naming --no-loso, and the spec is untouched; without --write the fit runs and warns."""
    specs = _specs(tmp_path)
    before = (specs / "dgx-h100-ib400.yaml").read_text()
    args = ["calibrate", "--kind", "training", "--ids", *FOUNDRY, "--params",
            "overlap_compute_slowdown", "--cache", str(tmp_path / "store.jsonl")]
    out = tmp_path / "cal.yaml"
    assert main([*args, "--out", str(out), "--write", str(specs)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--no-loso" in err[0] and "MosaicML llm-foundry" in err[0]
    assert (specs / "dgx-h100-ib400.yaml").read_text() == before and not out.exists()
    assert main([*args, "--out", str(out)]) == 0
    assert "warning: the records come from one source only" in capsys.readouterr().err
    assert yaml.safe_load(out.read_text())["leave_one_source_out"] == []


# ------------------------------------------------------------------ 8: no-effect parameters
def test_calibrate_write_keeps_shipped_values_the_records_do_not_move(fake_simulation,
                                                                      tmp_path, capsys) -> None:
    """The fit starts from the shipped 1.1 and reaches 1.2 (error 0); the allocator's extra
    reserved memory moves no prediction (the records have no memory metric), so its shipped
    1 GiB stays in the spec (it was written as 0, its grid default) and the output lists it."""
    specs = _specs(tmp_path)
    out = tmp_path / "cal.yaml"
    assert main(["calibrate", "--kind", "training", "--ids", *FOUNDRY, "--params",
                 "overlap_compute_slowdown", "allocator_reserved_extra_bytes", "--no-loso",
                 "--cache", str(tmp_path / "store.jsonl"), "--out", str(out),
                 "--write", str(specs)]) == 0
    stdout = capsys.readouterr().out
    assert "no record's prediction moves with allocator_reserved_extra_bytes" in stdout
    doc = yaml.safe_load(out.read_text())
    assert doc["fit"]["values"] == {"overlap_compute_slowdown": 1.2,
                                    "allocator_reserved_extra_bytes": 2**30}
    assert doc["fit"]["no_effect"] == ["allocator_reserved_extra_bytes"]
    assert doc["fit"]["uncalibrated_objective"] == pytest.approx(math.log(1.2 / 1.1))
    assert doc["clusters"]["dgx-h100-ib400"]["calibration"] == {"overlap_compute_slowdown": 1.2}
    cal = yaml.safe_load((specs / "dgx-h100-ib400.yaml").read_text())["calibration"]
    assert cal["overlap_compute_slowdown"] == 1.2
    assert cal["allocator_reserved_extra_gib"] == 1.0
    assert "allocator_reserved_extra_bytes" not in cal
    assert cal["provenance"]["allocator_reserved_extra_gib"].startswith("default:")


def test_fit_starts_from_the_shipped_values(tmp_path) -> None:
    """``shipped_values``: the clusters' common value (an engine missing from a mapping: 0;
    the bandwidth scale: 1); a value the clusters disagree on is left to the grid default."""
    from charon_search.testing import toy_cluster

    a = toy_cluster()
    a = dataclasses.replace(a, calibration=dataclasses.replace(
        a.calibration, overlap_compute_slowdown=1.1, allocator_reserved_extra_bytes=2**30,
        frontend_latency_s={"sglang": 0.02}))
    b = dataclasses.replace(a, calibration=dataclasses.replace(a.calibration,
                                                               overlap_compute_slowdown=1.0))
    names = ["overlap_compute_slowdown", "allocator_reserved_extra_bytes",
             "collective_bw_scale", "frontend_latency_sglang_s", "frontend_latency_vllm_s"]
    assert shipped_values(names, [a]) == {
        "overlap_compute_slowdown": 1.1, "allocator_reserved_extra_bytes": 2**30,
        "collective_bw_scale": 1.0, "frontend_latency_sglang_s": 0.02,
        "frontend_latency_vllm_s": 0.0}
    assert "overlap_compute_slowdown" not in shipped_values(names, [a, b])
    # A parameter with no effect keeps its start and is not written.
    recs = [_record(0, "A"), _record(1, "B")]
    evaluate = _evaluator(lambda r, v: v.get("overlap_compute_slowdown", 1.1) / 1.2 - 1)
    fit = fit_parameters(recs, ["overlap_compute_slowdown", "allocator_reserved_extra_bytes"],
                         evaluate=evaluate, start=shipped_values(names, [a]))
    assert fit.values == {"overlap_compute_slowdown": 1.2,
                          "allocator_reserved_extra_bytes": 2**30}
    assert fit.no_effect == ("allocator_reserved_extra_bytes",)
    doc = calibration_document(fit, {"c": a}, [])
    assert doc["clusters"]["c"]["calibration"] == {"overlap_compute_slowdown": 1.2}
    assert "allocator" not in doc["clusters"]["c"]["provenance"]
    spec = tmp_path / "c.yaml"
    spec.write_text("name: c\ngpu: h100\ncalibration:\n  allocator_reserved_extra_gib: 1.0\n"
                    "tiers: []\n")
    write_cluster_specs(doc, tmp_path)
    cal = yaml.safe_load(spec.read_text())["calibration"]
    assert cal["allocator_reserved_extra_gib"] == 1.0 and cal["overlap_compute_slowdown"] == 1.2
