"""``validate --baseline``: how a run's errors moved against an earlier run."""

from __future__ import annotations

import json

import pytest

from charon_search.cli import main
from charon_search.validation.compare import compare_runs, regressions, render_comparison


def _row(rid, metric, measured, error):
    return {"id": rid, "metric": metric, "measured": measured,
            "predicted": measured * (1 + error), "error": error}


def _runs():
    cases = {"a": {"kind": "serving", "engine": "vllm"}, "b": {"kind": "serving",
                                                               "engine": "sglang"},
             "c": {"kind": "serving", "engine": "vllm"}, "d": {"kind": "training"},
             "e": {"kind": "serving", "engine": "vllm"}, "f": {"kind": "serving"},
             "g": {"kind": "serving"}}
    base = {"records": [
        _row("a", "ttft_s", 1.0, -0.20),
        _row("b", "ttft_s", 2.0, +0.10),
        _row("c", "tpot_s", 0.01, +0.05),
        # A training record's throughput metrics are one prediction: only the first of
        # METRIC_GROUPS["training_time"] it measures (tokens_per_s_per_gpu) counts.
        _row("d", "tokens_per_s_per_gpu", 100.0, +0.10),
        _row("d", "mfu", 0.4, +0.10),
        _row("e", "ttft_s", 1.0, +0.50),
        _row("f", "ttft_s", 1.0, +0.30),
    ], "skipped": [], "cases": cases}
    new = {"records": [
        _row("a", "ttft_s", 1.0, -0.05),   # better by 0.15
        _row("b", "ttft_s", 2.0, +0.30),   # worse by 0.20
        _row("c", "tpot_s", 0.01, +0.0505),  # moved 0.05 points: unchanged
        _row("d", "tokens_per_s_per_gpu", 100.0, +0.02),  # better by 0.08
        _row("d", "mfu", 0.4, +0.02),
        _row("e", "ttft_s", 1.5, +0.00),   # other measured value: left out
        _row("g", "ttft_s", 1.0, +0.10),   # predicted in the new run only
    ], "skipped": [{"id": "f", "reason": "unknown model"}], "cases": cases}
    return base, new


def test_compare_counts_one_prediction_per_record_and_group():
    base, new = _runs()
    c = compare_runs(base, new, top=5)
    assert c["matched"] == 4 and c["measured_changed"] == 1
    ttft = c["groups"]["serving_ttft"]
    assert ttft["n"] == 2
    assert (ttft["better"], ttft["worse"], ttft["unchanged"]) == (1, 1, 0)
    assert ttft["before"]["median_abs"] == pytest.approx((0.20 + 0.10) / 2)
    assert ttft["after"]["median_abs"] == pytest.approx((0.05 + 0.30) / 2)
    assert ttft["sum_abs_before"] == pytest.approx(0.30)
    assert ttft["sum_abs_after"] == pytest.approx(0.35)
    assert ttft["after"]["bias"] == pytest.approx((-0.05 + 0.30) / 2)
    assert c["groups"]["serving_tpot"]["unchanged"] == 1
    train = c["groups"]["training_time"]
    assert train["n"] == 1 and train["better"] == 1
    assert [m["id"] for m in c["improved"]] == ["a", "d"]  # largest |error| drop first
    assert c["improved"][0]["before"] == pytest.approx(0.8)
    assert c["improved"][0]["after"] == pytest.approx(0.95)
    assert [m["id"] for m in c["regressed"]] == ["b"]
    assert c["only_base"] == [{"id": "f", "reason": "unknown model"}]
    assert c["not_selected"] == 0
    assert c["only_new"] == ["g"]
    # A run of a subset: the records it did not select are counted, not listed as lost.
    subset = {**new, "records": [r for r in new["records"] if r["id"] != "b"]}
    assert compare_runs(base, subset)["not_selected"] == 1
    assert "training_time" in render_comparison(c) and "unknown model" in render_comparison(c)


def test_compare_breaks_down_by_record_fields():
    base, new = _runs()
    by = compare_runs(base, new, group_by=["engine"])["by_fields"]
    assert by["fields"] == ["engine"]
    assert by["groups"]["vllm"]["serving_ttft"]["better"] == 1
    assert by["groups"]["sglang"]["serving_ttft"]["worse"] == 1
    assert by["groups"]["-"]["training_time"]["n"] == 1  # a training record has no engine
    with pytest.raises(Exception, match="group-by fields must be among"):
        compare_runs(base, new, group_by=["colour"])


def test_regressions_name_the_groups_that_grew_past_the_threshold():
    base, new = _runs()
    c = compare_runs(base, new)
    # serving_ttft: median 15.0 % -> 17.5 % (+2.5 points), p90 19.0 % -> 27.5 % (+8.5).
    # Record f lost its prediction (skipped by the new run): that fails the gate at any
    # threshold, so a simulator raising on every record cannot pass it.
    lost = ("1 record(s) predicted in the baseline are skipped by this run (first: f: "
            "unknown model)")
    assert regressions(c, 2.0) == [
        lost,
        "serving_ttft median |error| 15.0% -> 17.5% (+2.5 points > 2)",
        "serving_ttft p90 |error| 19.0% -> 27.5% (+8.5 points > 2)"]
    assert [line.split()[1] for line in regressions(c, 5.0)[1:]] == ["p90"]
    assert regressions(c, 10.0) == [lost]  # training and TPOT improved or held


def test_compare_with_top_zero_lists_no_movers():
    base, new = _runs()
    c = compare_runs(base, new, top=0)
    assert c["improved"] == [] and c["regressed"] == []


IDS = ["megatron_sc21_t1_1.7b", "korthikanti_t5_22b_full"]


def test_cli_baseline_of_the_same_simulator_moves_nothing(tmp_path, capsys):
    old = tmp_path / "old.json"
    assert main(["validate", "--ids", *IDS, "--rows", "0", "--quiet", "--json",
                 str(old)]) == 0
    capsys.readouterr()
    new = tmp_path / "new.json"
    assert main(["validate", "--ids", *IDS, "--rows", "0", "--quiet", "--baseline", str(old),
                 "--json", str(new)]) == 0
    out = capsys.readouterr().out
    # The simulator is deterministic: the same records against themselves move by nothing.
    assert "training_time" in out and "0 / 0 / 2" in out
    cmp = json.loads(new.read_text())["summary"]["against_baseline"]
    assert cmp["baseline"] == str(old)
    assert cmp["groups"]["training_time"]["unchanged"] == 2

    # Two saved runs, compared without simulating: one prediction made 10 % larger.
    doc = json.loads(old.read_text())
    moved = next(r for r in doc["records"] if r["id"] == IDS[1])
    before = moved["error"]
    moved["predicted"] *= 1.1
    moved["error"] = (moved["predicted"] - moved["measured"]) / moved["measured"]
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(doc))
    assert main(["validate", "--from", str(edited), "--baseline", str(old), "--rows", "0"]) == 0
    out = capsys.readouterr().out
    direction = "regressions" if abs(moved["error"]) > abs(before) else "improvements"
    assert f"largest {direction}" in out and IDS[1] in out

    # A gate for scheduled re-validation: one record 50 points worse fails it, exit 1.
    moved["predicted"] = moved["measured"] * (1 + abs(before) + 0.5)
    moved["error"] = abs(before) + 0.5
    edited.write_text(json.dumps(doc))
    gate = ["validate", "--from", str(edited), "--baseline", str(old), "--rows", "0"]
    assert main([*gate, "--max-regression", "0.5"]) == 1
    assert "regression: training_time median |error|" in capsys.readouterr().err
    assert main([*gate, "--max-regression", "60"]) == 0


def test_cli_baseline_and_from_bad_input(tmp_path, capsys):
    assert main(["validate", "--baseline", str(tmp_path / "missing.json")]) == 2
    assert "--baseline" in capsys.readouterr().err
    not_a_run = tmp_path / "x.json"
    not_a_run.write_text(json.dumps({"rows": []}))
    assert main(["validate", "--from", str(not_a_run)]) == 2
    assert "must be the output of `charon-search validate --json`" in capsys.readouterr().err
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"records": [], "skipped": [], "cases": {}, "summary": {}}))
    assert main(["validate", "--from", str(run), "--ids", IDS[0]]) == 2
    assert "`--from` re-reads a saved run and simulates nothing, so it takes no --ids" in (
        capsys.readouterr().err)
    assert main(["validate", "--from", str(run), "--top", "-1"]) == 2
    assert "`--top` must be >= 0" in capsys.readouterr().err
    assert main(["validate", "--from", str(run), "--max-regression", "1"]) == 2
    assert "`--max-regression` needs `--baseline`" in capsys.readouterr().err
