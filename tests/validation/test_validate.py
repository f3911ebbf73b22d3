"""validate end to end on a small slice: JSON schema, counts, metric derivation."""

from __future__ import annotations

import dataclasses
import json

import pytest

from charon_search.cli import main
from charon_search.validation import run_validation, select_records
from charon_search.validation.flops import hardware_flops_per_step

#: A GLM-5 silicon row (DeepSeek sparse attention); the fixture also adds a copy of it whose
#: model is outside the catalog.
GLM5_ROW = "2026_03_25_glm_5_h200_sxm_sglang_fp8_agg_1024x1024_c4_tp8_0_ep1_0_500"
UNKNOWN_ROW = "unknown-model-copy"
SLICE = [
    "megatron_sc21_t1_1.7b", "korthikanti_t5_22b_seqsel", "torchtitan_202412_t1_8b_8gpu_fsdp",
    "palm_540b_6144_tpuv4", "mcore_h100_weak_1.7b",
    "trtllm_llama31_8b_h100_tp1_isl128_osl128", "deepseek_v3r1_prod_decode_per_node",
    "meta_llama_llama_3_1_8b_instruct_meta_llama_llama_3_1_8b_instruct_h100_sxm_trtllm_agg_"
    "1024x128_c8_tp1_epnone_1",
    GLM5_ROW,
]

SUSTAINED_FLOPS_PER_S = 150e12


def fake_training(model, cluster, layout):
    """Step time of 8·N·tokens (6N + recompute) at 150 TFLOP/s per GPU."""
    n = model.num_params
    tokens = layout.global_batch_size * layout.seq_len
    return {"step_time_s": 8 * n * tokens / (layout.num_gpus * SUSTAINED_FLOPS_PER_S),
            "memory": {"peak_reserved_bytes": 70e9,
                       "stages": [{"params_bytes": 1e9, "grads_bytes": 1e9,
                                   "optimizer_bytes": 2e9, "activations_bytes": 5e9}]}}


def fake_serving(model, cluster, config, workload, **_):
    return {"ttft_s": {"mean": 0.2, "p50": 0.2}, "tpot_s": {"mean": 0.008},
            "output_tokens_per_s": 20000.0}


@pytest.fixture(scope="module")
def result(shipped_records, by_id):
    unknown = dataclasses.replace(by_id[GLM5_ROW], id=UNKNOWN_ROW,
                                  model={"name": "example-org/NotAModel-7B", "catalog": None})
    recs = [*select_records(shipped_records, ids=SLICE), unknown]
    return recs, run_validation(recs, simulate_training=fake_training,
                                simulate_serving=fake_serving)


def test_every_record_predicted_or_skipped(result):
    recs, res = result
    predicted = {r["id"] for r in res.rows}
    skipped = {s["id"] for s in res.skipped}
    assert predicted | skipped == {r.id for r in recs}
    assert not predicted & skipped
    assert all(s["reason"] for s in res.skipped)
    t = res.summary["totals"]
    assert t["expressed"] + t["skipped"] == t["records"] == len(recs)
    reasons = {s["id"]: s["reason"] for s in res.skipped}
    assert "not a GPU" in reasons["palm_540b_6144_tpuv4"]
    assert "real traffic" in reasons["deepseek_v3r1_prod_decode_per_node"]
    assert "unknown model" in reasons[UNKNOWN_ROW]
    assert GLM5_ROW in predicted


def test_json_schema(result):
    _, res = result
    data = json.loads(json.dumps(res.to_json()))
    assert set(data) >= {"records", "skipped", "summary"}
    for row in data["records"]:
        assert set(row) == {"id", "metric", "measured", "predicted", "error"}
        assert row["error"] == pytest.approx((row["predicted"] - row["measured"])
                                             / row["measured"])
    for s in data["skipped"]:
        assert set(s) == {"id", "reason"}
    assert set(data["summary"]["by_kind"]) == {"training", "serving"}


def test_sc21_metrics_follow_convention(result, by_id):
    _recs, res = result
    rec = by_id["megatron_sc21_t1_1.7b"]
    rows = {r["metric"]: r for r in res.rows if r["id"] == rec.id}
    assert set(rows) == {"hardware_tflops_per_gpu", "hfu", "hardware_tflops_total"}
    from charon_search.catalog import load_model

    spec = load_model("gpt-1.7b")
    step = fake_training(spec, None, type("L", (), {"global_batch_size": 512, "seq_len": 2048,
                                                  "num_gpus": 32})())["step_time_s"]
    case = res.cases[rec.id]
    assert case["cluster"] == "dgx-a100-superpod"
    from charon_search.validation.translate import to_case

    arch = to_case(rec).arch
    rate = hardware_flops_per_step("megatron-sc21", arch, 512, 2048, "full") / step / 32
    assert rows["hardware_tflops_per_gpu"]["predicted"] == pytest.approx(rate / 1e12)
    assert rows["hfu"]["predicted"] == pytest.approx(rate / 312e12)
    assert rows["hardware_tflops_total"]["predicted"] == pytest.approx(rate * 32 / 1e12)


def test_assumptions_reported(result):
    _, res = result
    case = res.cases["mcore_h100_weak_1.7b"]
    text = " ".join(case["assumptions"])
    assert "training.micro_batch_size" in text and "training.recompute" in text
    assert case["fully_specified"] is False
    assert res.cases["megatron_sc21_t1_1.7b"]["fully_specified"] is True


def test_uncatalogued_dense_model_is_built_from_the_record(by_id):
    from charon_search.validation.translate import to_case

    rec = by_id["megatron_sc21_t1_1.7b"]
    model = {**rec.model, "catalog": "my-gpt-0.1b", "num_layers": 4, "hidden_size": 512,
             "num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 2048}
    case = to_case(dataclasses.replace(rec, id="custom", model=model))
    assert case.model.num_layers == 4 and case.model.hidden_size == 512
    assert "'my-gpt-0.1b' is not in the catalog" in " ".join(case.assumptions)


def test_serving_rows(result):
    _, res = result
    rows = [r for r in res.rows if r["id"].startswith("meta_llama_llama_3_1_8b")]
    assert {r["metric"] for r in rows} == {"ttft_s", "tpot_s"}
    ttft = next(r for r in rows if r["metric"] == "ttft_s")
    assert ttft["predicted"] == 0.2 and ttft["measured"] == pytest.approx(0.1909545068625)


def test_request_latency_is_derived_from_the_ttft_tpot_pair(result):
    """E2E = TTFT + (osl - 1) x TPOT on both sides; the report shows it next to the split."""
    from charon_search.validation.accuracy import render_accuracy
    from charon_search.validation.stats import request_latency_rows

    _, res = result
    rid = next(r["id"] for r in res.rows if r["id"].startswith("meta_llama_llama_3_1_8b"))
    case = res.cases[rid]
    assert case["output_len"] == 128 and case["engine"] == "trtllm"
    # the workload and load that validation.ranking groups configurations by
    assert (case["input_len"], case["concurrency"]) == (1024, 8)
    e2e = {r["id"]: r for r in request_latency_rows(res.rows, res.cases)}
    # the CSV row: TTFT 190.95 ms, TPOT 7.944 ms; fake_serving: 200 ms, 8 ms
    assert e2e[rid]["measured"] == pytest.approx(0.1909545068625 + 127 * 0.00794357745)
    assert e2e[rid]["predicted"] == pytest.approx(0.2 + 127 * 0.008)
    assert e2e[rid]["error"] == pytest.approx(1.216 / 1.19976 - 1, abs=1e-4)  # +1.35 %
    # training records (no TTFT/TPOT pair) are not given one
    assert all(res.cases[i]["kind"] == "serving" for i in e2e)
    text = render_accuracy(res)
    assert "## Serving request latency (derived)" in text
    # with a single silicon row per group: the "all" line carries it (groups need 5 records)
    line = next(x for x in text.splitlines() if x.startswith("| all |"))
    assert line.startswith(f"| all | {len(e2e)} |")
    from charon_search.validation.report import render_text

    assert f"(derived, {len(e2e)} records)" in render_text(res)  # the validate CLI's summary


def test_cli_json(tmp_path, capsys):
    out = tmp_path / "v.json"
    rc = main(["validate", "--ids", "palm_540b_6144_tpuv4", "mcore_h100_strong_gpt3_177b_96gpu",
               "--json",
               str(out), "--quiet", "--html", str(tmp_path / "v.html")])
    assert rc == 0
    data = json.loads(out.read_text())
    assert {s["id"] for s in data["skipped"]} == {"palm_540b_6144_tpuv4",
                                                  "mcore_h100_strong_gpt3_177b_96gpu"}
    assert data["summary"]["totals"] == {"records": 2, "expressed": 0, "skipped": 2,
                                         "predicted_metrics": 0, "repeated_measurements": 0,
                                         "repeated_other_setup": 0}
    assert "not expressed: 2 records" in capsys.readouterr().out
    assert "<table>" in (tmp_path / "v.html").read_text()


def test_cli_bad_file(tmp_path, capsys):
    assert main(["validate", str(tmp_path / "missing.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_cli_unknown_id_is_an_error_naming_the_closest(capsys):
    # A mistyped id must not run nothing and exit 0.
    assert main(["validate", "--ids", "megatron_sc21_t1_530", "--kind", "training"]) == 2
    err = capsys.readouterr().err
    assert "no record has the id 'megatron_sc21_t1_530'" in err
    assert "megatron_sc21_t1_530b" in err


def _rec(rid, measured, *, model="m", tp=1, version=""):
    from charon_search.validation.records import Record

    return Record(id=rid, source="s", kind="serving", model={"name": model, "catalog": None},
                  hardware={"gpu": "h200_sxm", "num_gpus": tp},
                  config={"tp": tp, "framework_version": version}, measured=measured)


def test_repeated_measurements_are_found():
    from charon_search.validation.records import repeated_measurements

    pair = {"ttft_s": 0.25, "tpot_s": 0.011}
    recs = [_rec("a", pair, version="1.0"),
            _rec("b", dict(pair)),                        # same run, version left empty
            _rec("c", dict(pair), model="other"),         # the same numbers, another model
            _rec("d", {"ttft_s": 0.25, "tpot_s": 0.012}),  # one value differs
            _rec("e", {"tpot_s": 0.5}), _rec("f", {"tpot_s": 0.5})]  # a single number
    assert repeated_measurements(recs) == {"b": ("a", True), "c": ("a", False)}


def test_shipped_repeats_are_reported_not_dropped(shipped_records):
    from charon_search.validation.report import render_text

    # The same SGLang 0.5.9 H200 run in two InferenceX dumps: the db dump names the model
    # DeepSeek-V3, the dated CSV DeepSeek-R1.
    first = "dsr1_h200_sglang_fp8_agg_8192x1024_c4_cfg81"
    again = "2026_03_25_deepseek_r1_h200_sxm_sglang_fp8_agg_8192x1024_c4_tp8_0_ep1_0_268"
    recs = select_records(shipped_records, ids=[first, again])
    res = run_validation(recs, simulate_serving=fake_serving)
    assert res.cases[again]["repeats"] == first and not res.cases[again]["repeats_same_setup"]
    assert "repeats" not in res.cases[first]
    t = res.summary["totals"]
    assert (t["repeated_measurements"], t["repeated_other_setup"]) == (1, 1)
    assert {r["id"] for r in res.rows} == {first, again}  # both still predicted
    assert "repeated measurements: 1 records" in render_text(res)


def test_independent_reruns_are_found():
    from charon_search.validation.records import independent_reruns

    def run(rid, ttft, date, **kw):
        rec = _rec(rid, {"ttft_s": ttft, "tpot_s": 0.01}, version="0.19.0", **kw)
        return dataclasses.replace(rec, extra={"measured_date": date})

    recs = [run("a", 0.200, "2026-04-03"),
            run("b", 0.210, "2026-04-03"),            # same day: not counted as another run
            run("c", 0.180, "2026-04-22"),            # another day: reruns a
            run("d", 0.180, "2026-04-22"),            # c shipped again: not a run
            run("e", 0.300, "2026-04-22", tp=2),      # another layout
            run("f", 0.190, "2026-05-01"),            # a third run: paired with the first
            dataclasses.replace(run("g", 0.2, "x"), extra={})]  # no date
    assert independent_reruns(recs) == {"c": "a", "f": "a"}


def test_run_to_run_spread_of_two_shipped_runs(shipped_records):
    """vLLM 0.19.0 MiniMax-M2.5 FP8 on 4 B200, 8k/1k at concurrency 4, measured on 2026-04-03
    (TTFT 207.520 ms, TPOT 8.9588 ms) and again on 2026-04-22 (188.246 ms, 8.6452 ms): spreads
    19.275 / 197.883 = 9.74 % and 0.3136 / 8.8020 = 3.56 %."""
    from charon_search.validation.report import render_text

    first = "minimaxm2_5_b200_vllm_fp8_agg_8192x1024_c4_cfg634"
    again = "2026_03_25_minimax_m2_5_b200_sxm_vllm_fp8_agg_8192x1024_c4_tp4_0_ep1_0_86"
    res = run_validation(select_records(shipped_records, ids=[first, again]),
                         simulate_serving=fake_serving)
    assert res.cases[again]["reruns"] == first and "reruns" not in res.cases[first]
    r2r = res.summary["run_to_run"]
    assert r2r["serving_ttft"]["pairs"] == 1 and r2r["serving_ttft"]["records"] == 2
    assert r2r["serving_ttft"]["median"] == pytest.approx(0.0974, abs=5e-4)
    assert r2r["serving_tpot"]["median"] == pytest.approx(0.0356, abs=5e-4)
    assert "run to run (serving_ttft): 1 pairs" in render_text(res)


def test_validate_predicts_the_same_numbers_in_every_process(tmp_path) -> None:
    """A disaggregated row (1 prefill and 3 decode replicas of TRT-LLM on GB200, 552 streams)
    whose replicas start iterations at the same instant: they start in pool order, so the
    prediction does not depend on the process (string-hash seed, memory addresses). Ordered by
    ``id()`` its TPOT moved by ~1.5e-5 between hash seeds 1 and 2."""
    import os
    import subprocess
    import sys

    row = ("nvidia_qwen3_32b_nvfp4_nvidia_qwen3_32b_nvfp4_gb200_trtllm_disagg_15000x500_c552_"
           "tp_epnone_4")
    got = []
    for seed in ("1", "2"):
        out = tmp_path / f"seed{seed}.json"
        argv = ["validate", "--ids", row, "--json", str(out), "--rows", "0", "--quiet"]
        code = f"import sys; from charon_search.cli import main; sys.exit(main({argv!r}))"
        subprocess.run([sys.executable, "-c", code], check=True,
                       env={**os.environ, "PYTHONHASHSEED": seed}, capture_output=True)
        recs = json.loads(out.read_text())["records"]
        got.append({r["metric"]: r["predicted"] for r in recs})
    assert set(got[0]) == {"ttft_s", "tpot_s"}
    assert got[0] == got[1]


def test_group_by_splits_the_records_and_their_errors(result):
    """``--group-by``: every record in exactly one group, and a group's statistics are those of
    its own records' representative rows (fake simulators: known errors)."""
    from charon_search.validation.stats import (
        error_stats,
        group_of,
        grouped_summary,
        representative_rows,
    )

    recs, res = result
    g = grouped_summary(res.rows, res.cases, ["kind", "origin"])
    assert g["fields"] == ["kind", "origin"]
    assert sum(b["total"] for b in g["groups"].values()) == len(recs)
    assert sum(b["expressed"] for b in g["groups"].values()) == len(
        {r["id"] for r in res.rows})
    silicon = g["groups"]["serving / silicon"]
    ids = {i for i, c in res.cases.items() if c["kind"] == "serving" and c["origin"] == "silicon"}
    want = error_stats([r["error"] for r in representative_rows(res.rows)
                        if r["id"] in ids and group_of(r["metric"]) == "serving_tpot"])
    assert silicon["groups"]["serving_tpot"] == want and want["n"] >= 1
    with pytest.raises(Exception, match="group-by fields must be among"):
        grouped_summary(res.rows, res.cases, ["colour"])


def test_group_by_engine_build_and_campaign(by_id):
    """Silicon rows split by the engine build, the month of measurement and the precision they
    state (``--group-by engine_version measured_month precision``): two campaigns of Kimi-K2.5
    at TP 4 on vLLM 0.17.0 (2026-03-27 with EP 4, 2026-04-20 with MoE TP 4) and a Llama row that
    names no version ("-")."""
    from charon_search.validation.stats import grouped_summary

    ids = ["kimik2_5_b200_vllm_fp4_agg_1024x1024_c8_cfg635",
           "kimik2_5_b200_vllm_fp4_agg_1024x1024_c8_cfg811",
           "2026_04_06_llama_3_1_70b_h100_sxm_vllm_fp8_agg_1024x8192_c4_tp4_ep1_265"]
    res = run_validation([by_id[i] for i in ids], simulate_serving=fake_serving)
    assert [res.cases[i]["measured_month"] for i in ids] == ["2026-03", "2026-04", "2025-10"]
    assert res.cases[ids[2]]["engine_version"] == ""
    g = grouped_summary(res.rows, res.cases, ["engine_version", "measured_month", "precision"])
    assert sorted(g["groups"]) == ["- / 2025-10 / fp8", "0.17.0 / 2026-03 / fp4",
                                   "0.17.0 / 2026-04 / fp4"]
    # The fake simulator's 200 ms against the 2026-04-20 row's measured 91.26 ms.
    april = g["groups"]["0.17.0 / 2026-04 / fp4"]["groups"]["serving_ttft"]
    assert april["n"] == 1 and april["bias"] == pytest.approx(0.2 / 0.09125674542738125 - 1)
    # The accuracy report's per-build table: both Kimi rows under vLLM 0.17.0, the Llama one
    # under "-" (the fake 200 ms against 91.26 and 179.80 ms: +119.2 % and +11.2 %).
    from charon_search.validation.accuracy import render_accuracy

    text = render_accuracy(res)
    section = text.split("## Serving per engine build", 1)[1].split("\n## ", 1)[0]
    assert "| vllm / 0.17.0 | 2/2 | serving_ttft | 2 | 65.2% |" in section
    assert "| vllm / - | 1/1 | serving_ttft | 1 |" in section


def test_cli_group_by(tmp_path, capsys):
    out = tmp_path / "g.json"
    assert main(["validate", "--ids", "megatron_sc21_t1_1.7b", "megatron_sc21_t1_7.5b",
                 "--group-by", "source", "--rows", "0", "--quiet", "--json", str(out)]) == 0
    assert "by source\n" in capsys.readouterr().out
    by = json.loads(out.read_text())["summary"]["by_fields"]
    assert by["groups"]["Narayanan et al."]["groups"]["training_time"]["n"] == 2
    assert main(["validate", "--group-by", "colour"]) == 2


def test_published_serving_records_name_their_engine(result):
    """A published record names its engine in ``framework``: TensorRT-LLM's trtllm-bench rows
    group with its silicon rows under ``trtllm`` (``--group-by engine``); DeepSeek's in-house
    system names none of the engines."""
    from charon_search.validation.stats import grouped_summary

    _, res = result
    assert res.cases["trtllm_llama31_8b_h100_tp1_isl128_osl128"]["engine"] == "trtllm"
    assert res.cases["deepseek_v3r1_prod_decode_per_node"]["engine"] == ""
    trtllm = grouped_summary(res.rows, res.cases, ["engine"])["groups"]["trtllm"]["groups"]
    # fake_serving's 20,000 tokens/s against the perf overview's 28,312 (H100, 128/128).
    assert trtllm["serving_throughput"]["n"] == 1
    assert trtllm["serving_throughput"]["bias"] == pytest.approx(20000 / 28312 - 1)
    assert trtllm["serving_ttft"]["n"] == 1
