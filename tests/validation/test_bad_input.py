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
