"""Validated error bands: quantiles of measured / predicted, their lookup, an objective's guard,
and `charon-search serve`'s error lines."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from charon_search.cli import main
from charon_search.errors import ConfigError
from charon_search.search.objective import Objective
from charon_search.validation.bands import (
    BAND_LEVELS,
    ErrorBands,
    compute_bands,
    held_out_coverage,
    load_bands,
    metric_family,
)

REPO = Path(__file__).resolve().parents[2]


def _serving(rid, engine, mode, ttft_err):
    return ({"id": rid, "metric": "ttft_s", "measured": 1.0, "predicted": 1.0 + ttft_err,
             "error": ttft_err},
            {"kind": "serving", "engine": engine, "mode": mode})


def _run():
    """40 vLLM aggregated rows, 5 vLLM disaggregated, 10 SGLang; two training records."""
    rows, cases = [], {}
    errs = np.linspace(-0.5, 0.3, 40)
    for i, e in enumerate(errs):
        r, c = _serving(f"v{i}", "vllm", "agg", float(e))
        rows.append(r)
        cases[r["id"]] = c
    for i in range(5):
        r, c = _serving(f"d{i}", "vllm", "disagg", 1.0)
        rows.append(r)
        cases[r["id"]] = c
    for i in range(10):
        r, c = _serving(f"s{i}", "sglang", "agg", -0.2)
        rows.append(r)
        cases[r["id"]] = c
    # A training record printing a step time and an MFU counts once, by its step time; a record
    # printing only an MFU 25 % too high implies a step time 1.25x too short.
    rows += [{"id": "t1", "metric": "step_time_s", "error": 0.25},
             {"id": "t1", "metric": "mfu", "error": -0.2},
             {"id": "t2", "metric": "mfu", "error": 0.25}]
    cases.update(t1={"kind": "training"}, t2={"kind": "training"})
    return {"records": rows, "cases": cases, "generated_at": "test"}


def _band(doc, family, engine, mode):
    return next(b for b in doc["bands"]
                if (b["family"], b["engine"], b["mode"]) == (family, engine, mode))


def test_quantiles_are_those_of_measured_over_predicted_per_group():
    doc = compute_bands(_run(), min_rows=30)
    agg = _band(doc, "serving_ttft", "vllm", "agg")
    want = np.quantile(1.0 / (1.0 + np.linspace(-0.5, 0.3, 40)), BAND_LEVELS)
    assert agg["n"] == 40
    assert agg["ratios"] == pytest.approx(list(want), abs=1e-4)
    # measured 1.0 against a prediction 0.5 (error -0.5): the measurement was 2x the prediction
    assert agg["ratios"][-1] == pytest.approx(np.quantile(1 / (1 + np.linspace(-.5, .3, 40)),
                                                          0.95), abs=1e-4)
    # groups under 30 rows are left to the wider ones; the engine-wide and all-engine bands stay
    groups = {(b["family"], b["engine"], b["mode"]) for b in doc["bands"]}
    assert ("serving_ttft", "vllm", "disagg") not in groups
    assert ("serving_ttft", "sglang", "*") not in groups
    assert _band(doc, "serving_ttft", "vllm", "*")["n"] == 45
    assert _band(doc, "serving_ttft", "*", "*")["n"] == 55
    train = _band(doc, "training_time", "*", "*")
    assert train["n"] == 2                     # t1 once (step time), t2 once (MFU)
    # t1: step time predicted 1.25x measured -> ratio 0.8; t2: MFU 1.25x -> step ratio 1.25
    assert train["ratios"][0] == pytest.approx(0.8 + 0.05 * 0.45, abs=1e-4)
    assert train["ratios"][3] == pytest.approx((0.8 + 1.25) / 2, abs=1e-4)


def test_lookup_falls_back_from_engine_and_mode_to_all_engines():
    bands = ErrorBands(compute_bands(_run(), min_rows=30))
    assert bands.lookup("serving_ttft", "vllm", "aggregated").mode == "agg"
    assert bands.lookup("serving_ttft", "vllm", "disaggregated").mode == "*"   # 5 rows
    b = bands.lookup("serving_ttft", "sglang", "agg")
    assert (b.engine, b.n) == ("*", 55)
    assert bands.lookup("serving_tpot", "vllm") is None
    with pytest.raises(ConfigError, match="levels"):
        ErrorBands({"levels": [0.5], "bands": []})


def test_held_out_coverage_uses_bands_computed_without_the_source():
    """Source A measured exactly the prediction, source B twice it: held out, A's rows sit
    under B's band (all within r50 and r90), B's rows above A's (none within)."""
    rows, cases = [], {}
    for src, err in (("A", 0.0), ("B", -0.5)):
        for i in range(10):
            r, c = _serving(f"{src}{i}", "vllm", "agg", err)
            rows.append(r)
            cases[r["id"]] = {**c, "source": src}
    cov = held_out_coverage({"records": rows, "cases": cases}, (0.5, 0.9), min_rows=5)
    ttft = cov["serving_ttft"]
    assert ttft["n"] == 20 and ttft["within"] == {0.5: 0.5, 0.9: 0.5}
    assert ttft["by_source"]["A"] == {"n": 10, "within": {0.5: 1.0, 0.9: 1.0}}
    assert ttft["by_source"]["B"] == {"n": 10, "within": {0.5: 0.0, 0.9: 0.0}}


def test_metric_families_of_constrained_fields():
    assert metric_family("ttft_s.p90", serving=True) == ("serving_ttft", False)
    assert metric_family("tpot_s.mean", serving=True) == ("serving_tpot", False)
    assert metric_family("tokens_per_s_per_gpu", serving=True) is None
    assert metric_family("step_time_s", serving=False) == ("training_time", False)
    assert metric_family("tokens_per_s_per_gpu", serving=False) == ("training_time", True)
    assert metric_family("mfu", serving=False) == ("training_time", True)
    assert metric_family("peak_memory_bytes", serving=False) == ("training_memory", False)


def _objective(guard, *constraints):
    return Objective.from_dict({"name": "g", "objectives": [
        {"metric": "tokens_per_s_per_gpu", "direction": "maximize"}],
        "constraints": list(constraints), **({"guard": guard} if guard is not None else {})})


def test_guard_scales_each_banded_constraint_by_the_shipped_quantile():
    bands = load_bands()
    r90 = bands.lookup("serving_ttft", "vllm", "aggregated").ratio(0.9)
    assert r90 > 1.0   # the simulator's TTFT is short of the measurement in > 10 % of the rows
    rec = {"engine": "vllm", "mode": "aggregated", "ttft_s.p90": 0.9 / r90 * 1.01,
           "tpot_s.p90": 0.01, "tokens_per_s_per_gpu": 100.0}
    plain = _objective(None, "ttft_s.p90 <= 0.9")
    guarded = _objective(0.9, "ttft_s.p90 <= 0.9", "tokens_per_s_per_gpu >= 1")
    assert plain.violations(rec)[0][1] < 0                        # feasible as predicted
    assert guarded.violations(rec)[0][1] == pytest.approx(0.01)   # 1 % over at r90
    out = dict(rec)
    guarded.annotate(out)
    assert out["guarded.ttft_s.p90"] == pytest.approx(0.909)
    assert "serving_ttft vllm aggregated" in out["guard_band.ttft_s.p90"]
    assert "guarded.tokens_per_s_per_gpu" not in out           # serving throughput: no band
    # a training throughput floor: measured = predicted / r, checked at r90 of the step time
    t90 = bands.lookup("training_time").ratio(0.9)
    train = _objective(0.9, "tokens_per_s_per_gpu >= 1000")
    assert train.guarded(train.constraints[0], {"tokens_per_s_per_gpu": 1100.0})[0] == \
        pytest.approx(1100.0 / t90)


@pytest.mark.parametrize("guard", [0.8, 0.05, True, "high"])
def test_guard_must_be_a_stored_upper_level(guard):
    with pytest.raises(ConfigError, match=r"`guard` must be one of \[0\.5, 0\.75, 0\.9, 0\.95\]"):
        _objective(guard, "ttft_s.p90 <= 1")


def test_shipped_bands_match_the_accuracy_report():
    """The shipped file and docs/accuracy.md come from the same validate run."""
    shipped = json.loads((REPO / "charon_search" / "data" / "validation" /
                          "error_bands.json").read_text())
    doc = (REPO / "docs" / "accuracy.md").read_text()
    assert shipped["generated_at"] and shipped["generated_at"] in doc
    for b in shipped["bands"]:
        engine = "all" if b["engine"] == "*" else b["engine"]
        mode = {"agg": "aggregated", "disagg": "disaggregated"}.get(b["mode"], "all")
        cells = " | ".join(f"{r:.2f}" for r in b["ratios"])
        assert f"| {b['family']} | {engine} | {mode} | {b['n']} | {cells} |" in doc
    engines = {b["engine"] for b in shipped["bands"] if b["family"] == "serving_ttft"}
    assert {"vllm", "sglang", "trtllm", "*"} <= engines


def test_serve_prints_the_engines_band_around_its_prediction(tmp_path, capsys):
    out = tmp_path / "serve.json"
    assert main(["serve", "--model", "debug-llama", "--cluster", "h100-sxm-8gpu",
                 "--num-requests", "5", "--no-progress", "--engine", "vllm",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    ttft = json.loads(out.read_text())["ttft_s"]["mean"]
    band = load_bands().lookup("serving_ttft", "vllm", "agg")
    lo, hi = band.ratio(0.1), band.ratio(0.9)
    line = next(ln for ln in text.splitlines()
                if ln.strip().startswith("TTFT") and "the prediction" in ln)
    got = re.search(r"= ([\d.]+)-([\d.]+) ms", line)
    assert got is not None
    assert float(got.group(1)) == pytest.approx(ttft * lo * 1e3, abs=0.051)
    assert float(got.group(2)) == pytest.approx(ttft * hi * 1e3, abs=0.051)
    assert "validated error" in text and band.label in line


def test_unreadable_bands_cost_serve_its_line_not_its_result(tmp_path, monkeypatch, capsys):
    import charon_search.validation.bands as bands_mod

    bad = tmp_path / "error_bands.json"
    bad.write_text("{not json")
    monkeypatch.setattr(bands_mod, "bands_path", lambda: bad)
    out = tmp_path / "serve.json"
    assert main(["serve", "--model", "debug-llama", "--cluster", "h100-sxm-8gpu",
                 "--num-requests", "3", "--no-progress", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["num_completed"] == 3
    err = capsys.readouterr().err
    assert "no validated error band" in err and "not JSON" in err
