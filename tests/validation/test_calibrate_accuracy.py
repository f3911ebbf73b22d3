"""Calibration recovers a known parameter; LOSO reports train/test; accuracy report renders."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from charon_search.cli import main
from charon_search.validation import run_validation, select_records
from charon_search.validation.calibration import (
    PARAMETERS,
    MemoizedEvaluate,
    apply_parameters,
    default_parameters,
    fit_parameters,
    holdout_group,
    leave_one_source_out,
    write_cluster_specs,
)
from charon_search.validation.records import AIC_GAP_SOURCE

IDS = ["megatron_sc21_t1_1.7b", "megatron_sc21_t1_7.5b", "korthikanti_t5_22b_seqsel",
       "korthikanti_t5_22b_full"]


def fake_training(model, cluster, layout):
    """Step time of the hardware FLOPs at compute_efficiency x peak (the fitted parameter)."""
    flops = (8 if layout.recompute == "full" else 6) * model.num_params
    tokens = layout.global_batch_size * layout.seq_len
    rate = cluster.gpu.peak_flops("bf16") * cluster.gpu.compute_efficiency
    return {"step_time_s": flops * tokens / (layout.num_gpus * rate)}


def evaluate(records, values):
    return run_validation(records, simulate_training=fake_training,
                          cluster_transform=lambda c: apply_parameters(c, values))


@pytest.fixture(scope="module")
def synthetic(shipped_records):
    """The slice with measured values replaced by the fake simulator's at efficiency 0.65."""
    recs = select_records(shipped_records, ids=IDS)
    res = evaluate(recs, {"compute_efficiency": 0.65})
    pred = {(r["id"], r["metric"]): r["predicted"] for r in res.rows}
    return [dataclasses.replace(r, measured={m: pred[(r.id, m)] for m in r.measured})
            for r in recs]


def test_fit_recovers_efficiency(synthetic):
    fit = fit_parameters(synthetic, ["compute_efficiency"], evaluate=evaluate)
    assert fit.values == {"compute_efficiency": 0.65}
    assert fit.objective == pytest.approx(0.0, abs=1e-9)
    from charon_search.hardware import load_gpu

    # shipped specs: every step time off by the efficiency ratio (all records on A100s)
    shipped_eff = load_gpu("a100-sxm-80gb").compute_efficiency
    assert fit.uncalibrated_objective == pytest.approx(abs(math.log(shipped_eff / 0.65)))
    assert fit.num_records == 4 and len(fit.sources) == 2


def test_loso_reports_train_and_test(synthetic):
    from charon_search.hardware import load_gpu

    shipped_eff = load_gpu("a100-sxm-80gb").compute_efficiency
    assert shipped_eff != 0.65
    rows = leave_one_source_out(synthetic, ["compute_efficiency"], evaluate=evaluate)
    assert {r["held_out"] for r in rows} == {"Narayanan et al.", "Korthikanti et al."}
    for r in rows:
        assert r["values"] == {"compute_efficiency": 0.65}
        assert r["test_median_abs_log_error"] == pytest.approx(0.0, abs=1e-9)
        # the shipped A100 spec's efficiency is off by log(eff/0.65)
        assert r["test_median_abs_log_error_uncalibrated"] == pytest.approx(
            abs(math.log(shipped_eff / 0.65)), abs=1e-9)


def test_loso_can_hold_out_a_gpu_at_a_time(shipped_records):
    """``by="gpu"``: the four records, two relabelled as H100 runs (their measured values made
    by the fake simulator at 0.65 on their own GPU), give one held-out fit per GPU, each on
    the other GPU's two records; each recovers 0.65 and predicts the held-out pair exactly."""
    from charon_search.errors import ConfigError

    recs = [dataclasses.replace(r, hardware={**r.hardware, "gpu": "h100-sxm-80gb"})
            if i % 2 else r for i, r in enumerate(select_records(shipped_records, ids=IDS))]
    pred = {(r["id"], r["metric"]): r["predicted"]
            for r in evaluate(recs, {"compute_efficiency": 0.65}).rows}
    synth = [dataclasses.replace(r, measured={m: pred[(r.id, m)] for m in r.measured})
             for r in recs]
    rows = leave_one_source_out(synth, ["compute_efficiency"], evaluate=evaluate, by="gpu")
    assert {r["held_out"]: (r["train_records"], r["test_records"]) for r in rows} == {
        "a100-sxm-80gb": (2, 2), "h100-sxm-80gb": (2, 2)}
    for r in rows:
        assert r["values"] == {"compute_efficiency": 0.65}
        assert r["test_median_abs_log_error"] == pytest.approx(0.0, abs=1e-9)
    assert holdout_group(synth[0], "source") == "Narayanan et al."
    with pytest.raises(ConfigError, match="holdout_by"):
        holdout_group(synth[0], "engine")


def test_memo_simulates_each_pair_once(synthetic):
    """The held-out fits reuse the main fit's simulations; only the uncalibrated baseline of
    each held-out source is new. Results equal the unmemoized ones (test above)."""
    simulated = []

    def counting(records, values):
        simulated.extend(r.id for r in records)
        return evaluate(records, values)

    memo = MemoizedEvaluate(counting)
    fit = fit_parameters(synthetic, ["compute_efficiency"], evaluate=memo)
    grid = PARAMETERS["compute_efficiency"].grid
    assert fit.evaluations == len(grid)  # the default 0.75 is a grid point
    # every grid vector plus the shipped specs ({}), each on the 4 records once
    assert memo.pairs == len(simulated) == 4 * len(grid) + 4
    rows = leave_one_source_out(synthetic, ["compute_efficiency"], evaluate=memo)
    assert memo.pairs == len(simulated) == 4 * len(grid) + 4  # nothing new to simulate
    assert [r["values"] for r in rows] == [{"compute_efficiency": 0.65}] * 2
    assert all(r["test_median_abs_log_error"] == pytest.approx(0.0, abs=1e-9) for r in rows)
    sub = memo(synthetic[:2], {"compute_efficiency": 0.65})
    assert {r["id"] for r in sub.rows} == {r.id for r in synthetic[:2]}
    assert memo.pairs == 4 * len(grid) + 4


def test_memo_store_resumes_an_interrupted_run(synthetic, tmp_path):
    """Finished simulations survive in the store; a second run with the same fingerprint reruns
    none of them, a changed fingerprint or a changed record reruns them, and the line an
    interruption cut short is ignored."""
    store = tmp_path / "calibrate.jsonl"
    first = MemoizedEvaluate(evaluate, store=store, fingerprint="code-a")
    fit = fit_parameters(synthetic, ["compute_efficiency"], evaluate=first)
    n = 4 * (len(PARAMETERS["compute_efficiency"].grid) + 1)  # grid vectors + shipped specs
    assert first.pairs == n and first.reused == 0
    with store.open("a") as f:
        f.write('[1, 2]\n{"fingerprint": "code-a"}\n')  # not entries: skipped, not a crash
        f.write('{"fingerprint": "code-a", "values": [["compute_eff')  # killed mid-write
    again = MemoizedEvaluate(evaluate, store=store, fingerprint="code-a")
    refit = fit_parameters(synthetic, ["compute_efficiency"], evaluate=again)
    assert again.pairs == 0 and again.reused == n
    assert (refit.values, refit.objective, refit.uncalibrated_objective) == (
        fit.values, fit.objective, fit.uncalibrated_objective)
    stale = MemoizedEvaluate(evaluate, store=store, fingerprint="code-b")
    stale(synthetic, {})
    assert stale.pairs == 4 and stale.reused == 0
    changed = [dataclasses.replace(synthetic[0], measured={
        m: 2 * v for m, v in synthetic[0].measured.items()}), *synthetic[1:]]
    partly = MemoizedEvaluate(evaluate, store=store, fingerprint="code-a")
    partly(changed, {})
    assert partly.pairs == 1 and partly.reused == 3


def test_write_only_touches_calibration_block(tmp_path):
    spec = tmp_path / "c.yaml"
    spec.write_text("name: c\n# keep me\ngpu: h100\ncalibration:\n  overlap_compute_slowdown: 1.1"
                    "\n  iteration_cpu_overhead_ms: 0.5\n  provenance:\n    "
                    "overlap_compute_slowdown: 'default: x'\n    iteration_cpu_overhead_ms: "
                    "'default: y'\ntiers: []\n")
    doc = {"clusters": {"c": {"calibration": {"iteration_cpu_overhead_s": 0.0003},
                              "gpu": {}, "provenance": "fit P"}}}
    write_cluster_specs(doc, tmp_path)
    text = spec.read_text()
    assert text.startswith("name: c\n# keep me\ngpu: h100\n") and text.endswith("tiers: []\n")
    import yaml

    cal = yaml.safe_load(text)["calibration"]
    assert cal["iteration_cpu_overhead_s"] == 0.0003 and "iteration_cpu_overhead_ms" not in cal
    assert cal["overlap_compute_slowdown"] == 1.1
    assert cal["provenance"] == {"overlap_compute_slowdown": "default: x",
                                 "iteration_cpu_overhead_s": "fit P"}


def test_accuracy_command(tmp_path, shipped_records):
    recs = select_records(shipped_records, ids=[*IDS, "palm_540b_6144_tpuv4"])
    res = run_validation(recs, simulate_training=fake_training)
    src = tmp_path / "v.json"
    src.write_text(json.dumps(res.to_json()))
    out = tmp_path / "docs" / "accuracy.md"
    cal = tmp_path / "cal.yaml"
    cal.write_text(
        "fit: {values: {compute_efficiency: 0.65}, objective: 0.0, num_records: 4, "
        "sources: [A, B], evaluations: 7}\nleave_one_source_out:\n- {held_out: A, "
        "train_records: 2, test_records: 2, values: {compute_efficiency: 0.65}, "
        "train_median_abs_log_error: 0.0, test_median_abs_log_error: 0.01, "
        "test_median_abs_log_error_uncalibrated: 0.2}\nclusters: {}\n")
    cal2 = tmp_path / "cal2.yaml"
    cal2.write_text("kind: serving\nfit: {values: {iteration_cpu_overhead_s: 0.001}, "
                    "objective: 0.1, num_records: 3, sources: [C], evaluations: 5}\n"
                    "leave_one_source_out: []\nclusters: {}\n")
    cal3 = tmp_path / "cal3.yaml"
    cal3.write_text("kind: serving\nholdout_by: gpu\nfit: {values: {disagg_handoff_vllm_s: "
                    "0.2}, objective: 0.1, num_records: 3, sources: [C], evaluations: 5}\n"
                    "leave_one_source_out:\n- {held_out: gb200, train_records: 2, "
                    "test_records: 1, values: {disagg_handoff_vllm_s: 0.2}, "
                    "train_median_abs_log_error: 0.1, test_median_abs_log_error: 0.3, "
                    "test_median_abs_log_error_uncalibrated: 0.2}\nclusters: {}\n")
    bands = tmp_path / "bands.json"
    assert main(["accuracy", "--from", str(src), "--out", str(out), "--calibration",
                 str(cal), "--calibration", str(cal2), "--calibration", str(cal3),
                 "--bands", str(bands)]) == 0
    text = out.read_text()
    # the quoted command reproduces both outputs (report and bands of the same run)
    assert f"--calibration {cal3} --bands {bands}`" in text
    assert json.loads(bands.read_text())["bands"]
    assert "## Calibration (leave-one-gpu-out, serving: disagg_handoff_vllm_s)" in text
    assert "| held-out gpu | train n |" in text
    assert "beats the shipped specs on 0 of 1 GPUs." in text  # 0.3 > 0.2
    assert "## Calibration (leave-one-source-out)" in text
    assert "## Calibration (leave-one-source-out, serving: iteration_cpu_overhead_s)" in text
    assert "Held out, the fit beats the shipped specs on 1 of 1 sources." in text  # 0.01 < 0.2
    assert "iteration_cpu_overhead_s = 1 ms" in text  # seconds shown as ms
    assert f"--calibration {cal} --calibration {cal2}" in text  # the command is quoted whole
    # median |log err| 0.2 is a 22.1 % relative error: exp(0.2) - 1
    assert ("| A | 2 | 2 | compute_efficiency = 0.65 | 0.000 (0.0 %) | 0.010 (1.0 %) "
            "| 0.200 (22.1 %) |") in text
    assert "## Per source" in text and "Narayanan et al." in text
    assert "![training](img/accuracy_training.png)" in text
    assert (tmp_path / "docs" / "img" / "accuracy_training.png").stat().st_size > 1000
    assert "`palm_540b_6144_tpuv4`" in text  # listed as not expressible
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    assert main(["accuracy", "--from", str(bad), "--out", str(out)]) == 2
    assert main(["accuracy", "--from", str(src), "--out", str(out), "--calibration",
                 str(bad)]) == 2  # not a calibrate output: a clear error, no traceback


def test_merge_json_adds_runs_and_states_coverage(shipped_records):
    from charon_search.errors import ConfigError
    from charon_search.validation import merge_json, result_from_json
    from charon_search.validation.accuracy import render_accuracy

    a = run_validation(select_records(shipped_records, ids=IDS[:2]),
                       simulate_training=fake_training).to_json()
    b = run_validation(select_records(shipped_records, ids=[*IDS[2:], "palm_540b_6144_tpuv4"]),
                       simulate_training=fake_training).to_json()
    merged = merge_json([(a, "SC21 rows"), (b, "Korthikanti rows + PaLM")])
    assert len(merged["records"]) == len(a["records"]) + len(b["records"])
    assert merged["summary"]["totals"]["records"] == 5
    assert merged["summary"]["totals"]["skipped"] == 1  # PaLM: TPU
    assert merged["coverage"][0].startswith("SC21 rows (validate run of ")
    text = render_accuracy(result_from_json(merged))
    assert "- Korthikanti rows + PaLM (validate run of " in text
    with pytest.raises(ConfigError, match="unique"):
        merge_json([(a, "x"), (a, "y")])


def test_calibrate_rejects_unknown_system_and_unwritable_store(tmp_path, capsys):
    out = tmp_path / "cal.yaml"
    assert main(["calibrate", "--kind", "serving", "--systems", "h100", "--no-loso",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--systems" in err and "h100_sxm" in err  # names the field and the allowed values
    assert not out.exists()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main(["calibrate", "--kind", "training", "--ids", IDS[0], "--no-loso",
                 "--cache", str(blocker / "store.jsonl"), "--out", str(out)]) == 2
    assert "--cache" in capsys.readouterr().err and not out.exists()


@pytest.mark.slow
def test_calibrate_cli_resumes_from_its_store(tmp_path, capsys):
    """Real simulators: a second `calibrate` with the same store simulates nothing again."""
    import yaml

    args = ["calibrate", "--kind", "training", "--ids", *IDS[:2], "--params",
            "overlap_compute_slowdown", "--no-loso", "--cache", str(tmp_path / "store.jsonl")]
    assert main([*args, "--out", str(tmp_path / "a.yaml")]) == 0
    first = capsys.readouterr().out
    assert "the baseline reused 0 of its 2 record simulations" in first
    assert main([*args, "--out", str(tmp_path / "b.yaml")]) == 0
    second = capsys.readouterr().out
    assert "the baseline reused 2 of its 2 record simulations" in second  # both records
    assert ", 0 record simulations)" in second  # and every fitted vector came from the store
    a, b = (yaml.safe_load((tmp_path / f).read_text())["fit"] for f in ("a.yaml", "b.yaml"))
    assert a == b


def test_per_engine_parameter_touches_its_engines_records_only(shipped_records):
    """A front-end latency fit sets one entry of the cluster's mapping, and re-simulates the
    records of its engine only: the others are simulated once for all of its values."""
    from charon_search.testing import toy_cluster

    cluster = toy_cluster()
    cal = apply_parameters(cluster, {"frontend_latency_trtllm_s": 0.04,
                                     "frontend_latency_vllm_s": 0.01}).calibration
    assert cal.frontend_latency_s == {"trtllm": 0.04, "vllm": 0.01}
    rows = [r for r in shipped_records if r.origin == "silicon"]
    pick = [next(r for r in rows if (r.extra or {}).get("backend") == b)
            for b in ("trtllm", "vllm")]
    calls = []

    def counting(records, values):
        calls.append((sorted(r.id for r in records), dict(values)))
        return run_validation(records, simulate_serving=lambda *a, **k: None)

    memo = MemoizedEvaluate(counting)
    for v in (0.0, 0.02, 0.04):
        memo(pick, {"frontend_latency_trtllm_s": v})
    assert memo.pairs == 4  # the vLLM row once, the TensorRT-LLM row three times
    assert [ids for ids, _ in calls].count([pick[1].id]) == 1
    assert PARAMETERS["frontend_latency_trtllm_s"].moves(pick[0])
    assert not PARAMETERS["frontend_latency_trtllm_s"].moves(pick[1])
    # A record naming no engine of ours (a published trtllm-bench run) is re-simulated.
    bench = next(r for r in shipped_records if r.kind == "serving" and r.origin == "published")
    assert PARAMETERS["frontend_latency_trtllm_s"].moves(bench)
    # The front-end times are keyed by the process that takes the request: a TensorRT-LLM row
    # served through Dynamo (aiconfigurator's gap analysis) moves with Dynamo's entries, not
    # with trtllm-serve's; the engine's own host time still moves it.
    gap = next(r for r in rows if (r.extra or {}).get("backend") == "trtllm"
               and AIC_GAP_SOURCE in (r.notes or ""))
    assert AIC_GAP_SOURCE not in (pick[0].notes or "")
    for name in ("frontend_latency_trtllm_s", "frontend_prompt_token_trtllm_s",
                 "frontend_output_token_trtllm_s", "frontend_output_stream_trtllm_s"):
        assert PARAMETERS[name].moves(pick[0]) and not PARAMETERS[name].moves(gap), name
    for name in ("frontend_prompt_token_dynamo_s", "frontend_output_token_dynamo_s",
                 "frontend_output_stream_dynamo_s"):
        assert PARAMETERS[name].moves(gap) and not PARAMETERS[name].moves(pick[0]), name
    assert PARAMETERS["prefill_overhead_trtllm_s"].moves(gap)
    # The prompt-iteration overhead is a second per-engine mapping of the same kind.
    cal = apply_parameters(cluster, {"prefill_overhead_sglang_s": 0.008}).calibration
    assert cal.prefill_iteration_overhead_s == {"sglang": 0.008}
    assert cal.frontend_latency_s == cluster.calibration.frontend_latency_s
    assert not PARAMETERS["prefill_overhead_sglang_s"].moves(pick[0])
    eager = apply_parameters(cluster, {"eager_kernel_host_vllm_s": 7e-5}).calibration
    assert eager.eager_kernel_host_s == {"vllm": 7e-5}
    assert eager.prefill_iteration_overhead_s == cluster.calibration.prefill_iteration_overhead_s
    # The disaggregated hand-over time moves only its engine's disaggregated rows.
    handoff = apply_parameters(cluster, {"disagg_handoff_trtllm_s": 0.075}).calibration
    assert handoff.disagg_handoff_s == {"trtllm": 0.075}
    split = next(r for r in rows if (r.extra or {}).get("backend") == "trtllm"
                 and r.config.get("mode") == "disagg")
    assert PARAMETERS["disagg_handoff_trtllm_s"].moves(split)
    assert not PARAMETERS["disagg_handoff_sglang_s"].moves(split)
    whole = next(r for r in rows if (r.extra or {}).get("backend") == "trtllm"
                 and r.config.get("mode") == "agg")
    assert not PARAMETERS["disagg_handoff_trtllm_s"].moves(whole)


def test_default_parameters_leave_gpu_factors_to_the_caller():
    """One shared compute_efficiency would overwrite the A100's 0.80 and the Hopper parts' 0.70:
    GPU-level factors are fitted only when named."""
    assert default_parameters("training") == [
        "collective_bw_scale", "overlap_compute_slowdown", "allocator_reserved_factor",
        "allocator_reserved_extra_bytes"]
    assert default_parameters("serving") == [
        "iteration_cpu_overhead_s", "frontend_latency_trtllm_s", "frontend_latency_sglang_s",
        "frontend_latency_vllm_s", "frontend_prompt_token_trtllm_s",
        "frontend_prompt_token_sglang_s", "frontend_prompt_token_vllm_s",
        "frontend_prompt_token_dynamo_s", "frontend_output_token_trtllm_s",
        "frontend_output_token_sglang_s", "frontend_output_token_vllm_s",
        "frontend_output_stream_trtllm_s", "frontend_output_stream_sglang_s",
        "frontend_output_stream_vllm_s", "frontend_output_stream_dynamo_s",
        "frontend_output_token_dynamo_s",
        "prefill_overhead_trtllm_s", "prefill_overhead_sglang_s",
        "prefill_overhead_vllm_s", "disagg_handoff_trtllm_s", "disagg_handoff_sglang_s",
        "disagg_handoff_vllm_s", "eager_kernel_host_trtllm_s", "eager_kernel_host_sglang_s",
        "eager_kernel_host_vllm_s"]
    assert all(not PARAMETERS[n].target.startswith("gpu.")
               for k in ("training", "serving") for n in default_parameters(k))


def test_fitted_values_are_written_in_their_units():
    """The report's fitted vectors: seconds as ms, below a millisecond as us (a per-token time
    of 4e-6 s must not read "0.004 ms"), bytes as GiB, ratios as they are."""
    from charon_search.validation.accuracy import _fitted

    assert _fitted({"frontend_latency_trtllm_s": 0.02, "frontend_prompt_token_trtllm_s": 4e-6,
                    "eager_kernel_host_sglang_s": 7e-5, "prefill_overhead_vllm_s": 0.0,
                    "allocator_reserved_extra_bytes": 2 * 2**30,
                    "overlap_compute_slowdown": 1.1}) == (
        "frontend_latency_trtllm_s = 20 ms, frontend_prompt_token_trtllm_s = 4 us, "
        "eager_kernel_host_sglang_s = 70 us, prefill_overhead_vllm_s = 0 ms, "
        "allocator_reserved_extra_bytes = 2 GiB, overlap_compute_slowdown = 1.1")
