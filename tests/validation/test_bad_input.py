"""Bad input to validate / accuracy / calibrate / profiles: one ConfigError naming the field or
flag (exit 2, no traceback), or a skipped record with the reason; never a silent wrong result.

Every case fails before any simulation, so these tests are fast.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from charon_search.cli import main
from charon_search.errors import ConfigError
from charon_search.validation import result_from_json, run_validation, select_records
from charon_search.validation.records import SILICON_COLUMNS

EMPTY_RUN = {"records": [], "skipped": [], "cases": {}, "summary": {}}


def _write_json(tmp_path, name, doc):
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def _error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


# ------------------------------------------------------------------ 1. --from with bad contents
@pytest.mark.parametrize("command", ["validate", "accuracy"])
@pytest.mark.parametrize(("doc", "expected"), [
    ({"records": 5, "skipped": [], "summary": {}}, "`records` must be a list"),
    ({"records": [{"id": "x"}], "skipped": [], "summary": {}},
     "`records[0]` (id 'x') lacks metric, measured, predicted, error"),
    ({"records": [{"id": "x", "metric": "ttft_s", "measured": "1", "predicted": 1.0,
                   "error": 0.0}], "skipped": [], "cases": {"x": {}}, "summary": {}},
     "`records[0]` (id 'x') has `measured` '1', not a number"),
    ({"records": [{"id": "x", "metric": "ttft_s", "measured": 1.0, "predicted": 1.0,
                   "error": 0.0}], "skipped": [], "summary": {}},
     "(id 'x') has no entry in `cases`"),
    ({"records": [], "skipped": [{"id": "x"}], "summary": {}}, "`skipped[0]` (id 'x') lacks "
                                                               "reason"),
    ({"records": [], "skipped": "none", "summary": {}}, "`skipped` must be a list"),
    ({"records": [], "skipped": [], "cases": [], "summary": {}}, "`cases` must be a mapping"),
    ({"records": [], "skipped": [], "summary": 3}, "`summary` must be a mapping"),
])
def test_from_file_with_wrong_contents(tmp_path, capsys, command, doc, expected):
    src = _write_json(tmp_path, "run.json", doc)
    argv = [command, "--from", str(src)]
    if command == "accuracy":
        argv += ["--out", str(tmp_path / "acc.md")]
    assert main(argv) == 2
    err = _error(capsys)
    assert f"--from {str(src)!r}" in err and expected in err
    assert not (tmp_path / "acc.md").exists()


def test_baseline_with_wrong_contents(tmp_path, capsys):
    run = _write_json(tmp_path, "run.json", EMPTY_RUN)
    bad = _write_json(tmp_path, "old.json", {"records": [{"id": "x"}], "summary": {}})
    assert main(["validate", "--from", str(run), "--baseline", str(bad)]) == 2
    assert "--baseline" in (err := _error(capsys)) and "`records[0]`" in err


def test_result_from_json_checks_the_shape():
    with pytest.raises(ConfigError, match=r"`records\[0\]` \(id 'x'\) lacks metric"):
        result_from_json({"records": [{"id": "x"}]})
    assert result_from_json(EMPTY_RUN).rows == []


def test_summary_of_a_case_without_fields(tmp_path, capsys):
    """A hand-edited case without kind/source is summarized under "None", not a KeyError."""
    doc = {**EMPTY_RUN, "records": [{"id": "x", "metric": "ttft_s", "measured": 1.0,
                                     "predicted": 1.1, "error": 0.1}], "cases": {"x": {}}}
    assert main(["validate", "--from", str(_write_json(tmp_path, "r.json", doc))]) == 0


# ------------------------------------------------------------------ 2. --calibration contents
@pytest.mark.parametrize(("text", "expected"), [
    ("fit: 3\nleave_one_source_out: x\n", "`fit` must be a mapping"),
    ("fit: {values: {a: 1.0}}\nleave_one_source_out: x\n",
     "`leave_one_source_out` must be a list"),
    ("fit: {values: {a: 1.0}}\nleave_one_source_out: [{held_out: A}]\n",
     "`leave_one_source_out[0]` lacks train_records"),
    ("fit: {values: {a: 1.0}}\nleave_one_source_out: [3]\n",
     "`leave_one_source_out[0]` is int 3"),
    ("fit: {values: [1.0]}\n", "`fit.values` must map parameter names to numbers"),
    ("fit: {values: {a: x}}\n", "`fit.values` must map parameter names to numbers"),
    ("fit: {values: {a: 1.0}, objective: low}\n", "`fit.objective` must be a number"),
    ("fit: {values: {a: 1.0}}\nholdout_by: node\n", "`holdout_by` must be one of"),
])
def test_accuracy_calibration_with_wrong_contents(tmp_path, capsys, text, expected):
    src = _write_json(tmp_path, "run.json", EMPTY_RUN)
    cal = tmp_path / "cal.yaml"
    cal.write_text(text)
    assert main(["accuracy", "--from", str(src), "--out", str(tmp_path / "acc.md"),
                 "--calibration", str(cal)]) == 2
    err = _error(capsys)
    assert f"--calibration {str(cal)!r}" in err and expected in err
    assert not (tmp_path / "acc.md").exists()


# ------------------------------------------------------------------ 3. --limit / --rows
@pytest.mark.parametrize(("flags", "expected"), [
    (["--limit", "-1"], "`--limit` must be >= 1"),
    (["--limit", "0"], "`--limit` must be >= 1"),
    (["--rows", "-5"], "`--rows` must be >= 0 (0 = none) or -1 (all), but got -5"),
])
def test_validate_rejects_negative_counts(capsys, flags, expected):
    assert main(["validate", "--ids", "megatron_sc21_t1_1.7b", "--quiet", *flags]) == 2
    assert expected in _error(capsys)


def test_select_records_rejects_a_negative_limit(shipped_records):
    with pytest.raises(ConfigError, match=r"`limit` \(--limit\) must be an integer >= 0"):
        select_records(shipped_records, limit=-1)
    assert select_records(shipped_records, limit=0) == []


# ------------------------------------------------------------------ 4. names and measured values
def _silicon_csv(tmp_path, **cells) -> str:
    row = {c: "" for c in SILICON_COLUMNS}
    row.update(id="row_a", silicon_data_source="silicon_concurrency=8", backend="trtllm",
               backend_version="1.0.0rc3", model_path="meta-llama/Llama-3.1-8B-Instruct",
               system="h100_sxm", mode="agg", isl="1024", osl="128", batch_size="8",
               tp_size="1", pp_size="1", moe_tp_size="1", moe_ep_size="1",
               silicon_ttft_ms="190.9", silicon_tpot_ms="7.9")
    row.update(cells)
    path = tmp_path / "rows.csv"
    path.write_text(",".join(SILICON_COLUMNS) + "\n"
                    + ",".join(row[c] for c in SILICON_COLUMNS) + "\n")
    return str(path)


def test_unknown_backend_is_skipped_with_the_allowed_engines(tmp_path, capsys):
    assert main(["validate", _silicon_csv(tmp_path, backend="trtlm"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert ("unknown backend 'trtlm' (silicon CSV column `backend`): must be one of "
            "['sglang', 'trtllm', 'vllm']; closest: trtllm") in out
    assert "skipped 1" in out


def test_known_names_pass_the_name_check(by_id):
    from charon_search.validation.runner import check_record_names

    check_record_names(by_id["megatron_sc21_t1_1.7b"])
    custom = dataclasses.replace(by_id["megatron_sc21_t1_1.7b"],
                                 model={**by_id["megatron_sc21_t1_1.7b"].model,
                                        "catalog": "my-gpt-0.1b"})
    check_record_names(custom)  # not close to a catalog name: built from the record


def test_known_backend_passes_the_name_check(tmp_path):
    from charon_search.validation.records import load_silicon_csv
    from charon_search.validation.runner import check_record_names

    (rec,) = load_silicon_csv(_silicon_csv(tmp_path))
    check_record_names(rec)


def test_misspelled_catalog_name_is_skipped_with_the_closest_names(by_id):
    rec = by_id["megatron_sc21_t1_1.7b"]
    typo = dataclasses.replace(rec, model={**rec.model, "catalog": "gpt-1.7bb"})
    other = dataclasses.replace(rec, id="other", model={**rec.model, "catalog": "gpt-1.7b"})

    def fake_training(model, cluster, layout):
        return {"step_time_s": 1.0,
                "memory": {"peak_reserved_bytes": 70e9,
                           "stages": [{"params_bytes": 1e9, "grads_bytes": 1e9,
                                       "optimizer_bytes": 2e9, "activations_bytes": 5e9}]}}

    res = run_validation([typo, other], simulate_training=fake_training)
    (skip,) = res.skipped
    assert skip["id"] == rec.id
    assert "unknown model.catalog 'gpt-1.7bb'" in skip["reason"]
    assert "closest: gpt-1.7b" in skip["reason"]
    assert {r["id"] for r in res.rows} == {"other"}  # the other record keeps its result


@pytest.mark.parametrize("value", ["-5", "nan", "inf"])
def test_negative_measured_latency_names_the_row(tmp_path, capsys, value):
    assert main(["validate", _silicon_csv(tmp_path, silicon_ttft_ms=value), "--quiet"]) == 2
    err = _error(capsys)
    assert "(id row_a): column `silicon_ttft_ms` must be a finite number of milliseconds >= 0" \
        in err and repr(value) in err


# ------------------------------------------------------------------ 5. calibrate flags
@pytest.mark.parametrize(("flags", "expected"), [
    (["--sweeps", "0"], "`--sweeps` must be >= 1"),
    (["--sweeps", "-1"], "`--sweeps` must be >= 1"),
    (["--kind", "serving", "--limit", "-1"], "`--limit` must be >= 1"),
    (["--params", "frontend_latency_vllm_s"],
     "`params` (--params): frontend_latency_vllm_s moves only serving records, but the records "
     "are of kind 'training' (--kind)"),
])
def test_calibrate_rejects_bad_flags(tmp_path, capsys, flags, expected):
    out = tmp_path / "cal.yaml"
    argv = ["calibrate", "--kind", "training", "--ids", "megatron_sc21_t1_1.7b", "--no-loso",
            "--out", str(out), "--cache", str(tmp_path / "c.jsonl"), *flags]
    assert main(argv) == 2
    assert expected in _error(capsys)
    assert not out.exists()


def test_calibrate_write_needs_an_existing_folder(tmp_path, capsys):
    missing = tmp_path / "nonexistent" / "dir"
    assert main(["calibrate", "--kind", "training", "--ids", "megatron_sc21_t1_1.7b",
                 "--no-loso", "--sweeps", "1", "--out", str(tmp_path / "cal.yaml"),
                 "--cache", str(tmp_path / "c.jsonl"), "--write", str(missing)]) == 2
    assert f"`--write` {str(missing)!r} must be an existing folder" in _error(capsys)


def test_calibration_library_checks(tmp_path):
    from charon_search.validation.calibration import (
        check_parameters,
        fit_parameters,
        write_cluster_specs,
    )

    with pytest.raises(ConfigError, match=r"`sweeps` \(--sweeps\) must be an integer >= 1"):
        fit_parameters([], ["compute_efficiency"], sweeps=0)
    with pytest.raises(ConfigError, match="must be an existing folder"):
        write_cluster_specs({"clusters": {}}, tmp_path / "nope")
    with pytest.raises(ConfigError, match="moves only serving records"):
        check_parameters(["frontend_latency_vllm_s"], "training")
    with pytest.raises(ConfigError, match="unknown parameter"):
        check_parameters(["no_such_parameter"], "training")
    check_parameters(["compute_efficiency"], "training")


# ------------------------------------------------------------------ 6. profiles eval
@pytest.mark.parametrize("value", ["-5", "0", "3"])
def test_profiles_eval_rejects_too_few_train_rows(capsys, value):
    assert main(["profiles", "eval", "--gpu", "h100", "--op-kind", "norm",
                 "--max-train-rows", value]) == 2
    assert "`--max-train-rows` must be >= 8" in (err := _error(capsys)) and value in err


# ------------------------------------------------------------------ 7. files as users save them
def test_non_utf8_files_are_one_line_errors(tmp_path, capsys):
    """A UTF-16 export or a binary file: an error naming the file, not a UnicodeDecodeError."""
    for name in ("rows.csv", "recs.yaml"):
        path = tmp_path / name
        path.write_bytes(b"\xff\xfe\x00\x01 garbage")
        assert main(["validate", str(path), "--quiet"]) == 2
        assert f"{path}: not UTF-8 text (invalid start byte at byte 0)" in _error(capsys)
    run = tmp_path / "run.json"
    run.write_bytes(b"\xff\xfe\x00")
    for argv in (["validate", "--from", str(run)],
                 ["accuracy", "--from", str(run), "--out", str(tmp_path / "a.md")]):
        assert main(argv) == 2
        assert f"--from {str(run)!r}: not a readable JSON file" in _error(capsys)


def test_a_byte_order_mark_keeps_the_id_column(tmp_path):
    """Excel's "CSV UTF-8" starts with a BOM; the first column (`id`) must keep its name."""
    from charon_search.validation.records import load_silicon_csv

    path = tmp_path / "rows.csv"
    path.write_bytes(b"\xef\xbb\xbf" + open(_silicon_csv(tmp_path), "rb").read())
    (rec,) = load_silicon_csv(path)
    assert rec.id == "row_a"


@pytest.mark.parametrize(("cells", "expected"), [
    ({"isl": "nan"}, "column `isl` must be a non-negative integer, got 'nan'"),
    ({"tp_size": "inf"}, "column `tp_size` must be a non-negative integer, got 'inf'"),
    ({"pp_size": "0"}, "column `pp_size` must be >= 1 or empty, but got 0"),
    ({"id": "row a"}, "column `id` must match [A-Za-z0-9_.-]+"),
    ({"id": "row_a#1"}, "column `id` must match [A-Za-z0-9_.-]+ (`#` names a record's"),
])
def test_silicon_cells_outside_their_domain(tmp_path, capsys, cells, expected):
    assert main(["validate", _silicon_csv(tmp_path, **cells), "--quiet"]) == 2
    assert expected in _error(capsys)


def test_a_backend_with_spaces_is_read(tmp_path):
    from charon_search.validation.records import load_silicon_csv

    (rec,) = load_silicon_csv(_silicon_csv(tmp_path, backend=" trtllm "))
    assert rec.config["framework"] == "trtllm" and rec.extra["backend"] == "trtllm"


def _yaml_record(by_id, tmp_path, **changes) -> str:
    """The shipped llm-foundry MPT-1B record with ``changes`` (dotted keys) applied."""
    import copy

    import yaml

    from charon_search.validation.records import data_dir

    doc = yaml.safe_load((data_dir() / "published-dev.yaml").read_text())
    raw = copy.deepcopy(next(r for r in doc["records"]
                             if r["id"] == "llmfoundry_h100_80gb_mpt1b_8gpu_seq2048"))
    for dotted, value in changes.items():
        head, _, rest = dotted.partition(".")
        if rest:
            raw[head][rest] = value
        else:
            raw[head] = value
    path = tmp_path / "recs.yaml"
    path.write_text(yaml.safe_dump({"schema_version": 1, "records": [raw]}))
    return str(path)


@pytest.mark.parametrize("value", [float("inf"), 5e-324])
def test_a_measured_value_must_be_positive_and_finite(by_id, tmp_path, capsys, value):
    """inf (or a subnormal, whose relative error overflows) turned every summary into nan."""
    path = _yaml_record(by_id, tmp_path, measured={"tokens_per_s": value})
    assert main(["validate", path, "--quiet"]) == 2
    assert ("`measured.tokens_per_s` must be a positive finite number, but got "
            f"{value!r}") in _error(capsys)


def test_variant_errors_name_the_variant_and_need_overrides(by_id, tmp_path, capsys):
    path = _yaml_record(by_id, tmp_path, variants=[
        {"overrides": {"training.tp": 3}, "measured": {"tokens_per_s": 1.0}}])
    assert main(["validate", path, "--quiet"]) == 2
    assert "record llmfoundry_h100_80gb_mpt1b_8gpu_seq2048#1: " in _error(capsys)
    path = _yaml_record(by_id, tmp_path, variants=[
        {"overrides": {}, "measured": {"tokens_per_s": 1.0}}])
    assert main(["validate", path, "--quiet"]) == 2
    assert "`overrides` must be a non-empty mapping of `training.<field>`" in _error(capsys)


def test_a_yaml_record_may_name_a_gpu_spec(by_id, tmp_path, capsys):
    """The CSV's `h100_sxm` / `A100-SXM4-80GB` resolve in YAML records too; a made-up one is
    an error listing SCHEMA.md's keys."""
    from charon_search.validation.names import resolve_gpu
    from charon_search.validation.records import load_records

    for name, spec in (("h100_sxm", "h100-sxm-80gb"), ("A100-SXM4-80GB", "a100-sxm-80gb"),
                       ("b200_sxm", "b200-sxm-180gb")):
        (rec,) = load_records(_yaml_record(by_id, tmp_path, **{"hardware.gpu": name}))
        assert resolve_gpu(rec.hardware["gpu"]).name == spec
    with pytest.raises(ConfigError, match=r"or the name of a GPU spec .* but got 'z100'"):
        load_records(_yaml_record(by_id, tmp_path, **{"hardware.gpu": "z100"}))


def test_an_empty_selection_is_an_error(by_id, tmp_path, capsys):
    """A scheduled check that validates nothing must not pass with empty tables."""
    path = _yaml_record(by_id, tmp_path)
    assert main(["validate", path, "--kind", "serving", "--quiet"]) == 2
    assert ("`--kind serving` selects none of the 1 record(s); their kinds: ['training']"
            in _error(capsys))
    header = tmp_path / "header.csv"
    header.write_text(",".join(SILICON_COLUMNS) + "\n")
    assert main(["validate", str(header), "--quiet"]) == 2
    assert f"no record in {header}: nothing to validate" in _error(capsys)


def test_duplicate_ids_name_their_files(tmp_path, capsys):
    path = _silicon_csv(tmp_path)
    assert main(["validate", path, path, "--quiet"]) == 2
    assert f"record id 'row_a' occurs in {path} twice (is the file given twice?)" in (
        _error(capsys))


def _run_doc() -> dict:
    return {"records": [{"id": "a", "metric": "ttft_s", "measured": 1.0, "predicted": 2.0,
                         "error": 1.0}],
            "skipped": [{"id": "b", "reason": "unknown model"}],
            "cases": {"a": {}, "b": {}}, "summary": {}}


@pytest.mark.parametrize(("change", "expected"), [
    (lambda d: d["records"][0].update(error=5.0),
     "has `error` 5.0, not (predicted - measured) / measured = 1.0"),
    (lambda d: d["records"][0].update(measured=0.0), "the measurement positive"),
    (lambda d: d["skipped"].append({"id": "a", "reason": "x"}),
     "record 'a' is both predicted (`records`) and skipped (`skipped`)"),
    (lambda d: d["cases"].update(c={}),
     "1 record(s) of `cases` are neither predicted nor skipped (first: 'c')"),
])
def test_a_saved_run_must_add_up(tmp_path, capsys, change, expected):
    doc = _run_doc()
    assert main(["validate", "--from", str(_write_json(tmp_path, "ok.json", doc)),
                 "--rows", "0"]) == 0
    capsys.readouterr()
    change(doc)
    assert main(["validate", "--from", str(_write_json(tmp_path, "bad.json", doc))]) == 2
    assert expected in _error(capsys)


def test_the_gate_fails_when_predictions_are_lost(tmp_path, capsys):
    """A simulator that now raises on every record must not pass --max-regression."""
    base = _write_json(tmp_path, "base.json", _run_doc())
    lost = _run_doc()
    lost["skipped"].append({"id": "a", "reason": "simulator error: boom"})
    lost["records"] = []
    new = _write_json(tmp_path, "new.json", lost)
    assert main(["validate", "--from", str(new), "--baseline", str(base),
                 "--max-regression", "5", "--rows", "0"]) == 1
    err = capsys.readouterr().err
    assert "1 record(s) predicted in the baseline are skipped by this run (first: a: " \
           "simulator error: boom)" in err
    assert "no row of this run matches the baseline" in err
    assert main(["validate", "--from", str(base), "--baseline", str(base),
                 "--max-regression", "5", "--rows", "0"]) == 0
    for value in ("nan", "inf"):
        assert main(["validate", "--from", str(base), "--baseline", str(base),
                     "--max-regression", value]) == 2
        assert "a finite value >= 0" in _error(capsys)


def test_outputs_never_overwrite_inputs(tmp_path, capsys):
    """`accuracy --out` equal to its `--from` replaced 9 minutes of validate output with
    markdown."""
    run = _write_json(tmp_path, "run.json", _run_doc())
    before = run.read_text()
    assert main(["accuracy", "--from", str(run), "--out", str(run)]) == 2
    assert f"`--out` {str(run)!r} is a file the command reads with `--from`" in _error(capsys)
    out = tmp_path / "a.md"
    assert main(["accuracy", "--from", str(run), "--out", str(out), "--bands", str(out)]) == 2
    assert "is a file the command also writes with `--out`" in _error(capsys)
    csv_path = _silicon_csv(tmp_path)
    assert main(["validate", csv_path, "--json", csv_path]) == 2
    assert "is a file the command reads;" in _error(capsys)
    assert main(["validate", csv_path, "--html", f"{csv_path}/r.html"]) == 2
    assert f"is under the file {csv_path!r}" in _error(capsys)
    assert run.read_text() == before


def test_skipped_records_are_listed_with_their_ids(capsys):
    from charon_search.validation.report import render_text
    from charon_search.validation.runner import ValidationResult
    from charon_search.validation.stats import summarize

    skipped = [{"id": f"r{i}", "reason": f"reason {i % 30}"} for i in range(40)]
    cases = {s["id"]: {} for s in skipped}
    res = ValidationResult(rows=[], skipped=skipped, cases=cases,
                           skipped_metrics=[{"id": "r0", "metric": "foo_s", "reason": "why"}],
                           summary=summarize([], skipped, cases))
    text = render_text(res, max_rows=0)
    assert "id  metric" not in text  # --rows 0: no empty table
    assert "      2 x reason 0  [r0, r30]" in text
    assert "... 5 more under 5 other reason(s) (use --json for all)" in text
    assert "measured metrics not compared: 1" in text and "[r0 foo_s]" in text


def test_calibrate_writes_only_a_fit_that_beats_the_specs(tmp_path):
    """A parameter the records do not depend on must not replace a shipped value and its
    provenance; nor a fit that does not carry over to held-out sources."""
    from charon_search.validation.calibration import CalibrationFit, write_refusal

    fit = CalibrationFit(values={"iteration_cpu_overhead_s": 0.0}, objective=0.1627,
                         uncalibrated_objective=0.1627, num_records=3, sources=("s",),
                         evaluations=5)
    assert "does not beat the shipped specs' 0.1627 on the same 3 records" in write_refusal(
        fit, [])
    better = dataclasses.replace(fit, objective=0.12)
    assert write_refusal(better, []) == ""
    rows = [{"test_median_abs_log_error": t, "test_median_abs_log_error_uncalibrated": 0.2}
            for t in (0.1, 0.3, 0.25)]
    assert "lowers the held-out error of only 1 of 3" in write_refusal(better, rows)
    assert write_refusal(better, [*rows[:2], rows[0]]) == ""


def test_calibrate_write_refuses_a_file_that_is_not_a_cluster_spec(tmp_path):
    from charon_search.validation.calibration import write_cluster_specs

    (tmp_path / "c.yaml").write_text("hello: 1\n")
    doc = {"clusters": {"c": {"calibration": {"iteration_cpu_overhead_s": 0.001},
                              "gpu": {}, "provenance": "fit P"}}}
    with pytest.raises(ConfigError, match=r"c\.yaml is not a cluster spec"):
        write_cluster_specs(doc, tmp_path)
    assert (tmp_path / "c.yaml").read_text() == "hello: 1\n"


def test_a_per_engine_fit_keeps_the_other_engines_provenance(tmp_path):
    import yaml

    from charon_search.validation.calibration import write_cluster_specs

    spec = tmp_path / "c.yaml"
    spec.write_text("name: c\ngpu: h100\ntiers: []\ncalibration:\n  frontend_latency_s:\n"
                    "    vllm: 0.01\n  provenance:\n    frontend_latency_s: vLLM fit V\n")
    doc = {"clusters": {"c": {"calibration": {"frontend_latency_s": {"vllm": 0.01,
                                                                      "trtllm": 0.002}},
                              "gpu": {}, "provenance": "trtllm fit T"}}}
    write_cluster_specs(doc, tmp_path)
    cal = yaml.safe_load(spec.read_text())["calibration"]
    assert cal["frontend_latency_s"] == {"vllm": 0.01, "trtllm": 0.002}
    assert cal["provenance"]["frontend_latency_s"] == "trtllm fit T; its other entries: vLLM fit V"


def test_a_non_finite_prediction_skips_the_record_and_the_json_still_adds_up(by_id):
    """Every metric predicted nan: the record is skipped with the reason (it had been in neither
    list, so `validate --json` wrote a file its own --from refused)."""
    from charon_search.validation.runner import check_result_json

    rec = by_id["korthikanti_fig1_22b_memory"]
    nan = float("nan")

    def nan_memory(model, layout, cluster, **kw):
        return {"peak_reserved_bytes": nan,
                "stages": [{"params_bytes": nan, "grads_bytes": nan, "optimizer_bytes": nan,
                            "activations_bytes": nan}]}

    res = run_validation([rec], simulate_training=lambda *a, **k: {"step_time_s": 1.0},
                         memory_report=nan_memory)
    assert res.rows == []
    (skip,) = res.skipped
    assert skip["id"] == rec.id and "simulator error: predicted nan" in skip["reason"]
    check_result_json(res.to_json(), "run")
