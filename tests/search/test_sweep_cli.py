from __future__ import annotations

import json

import pyarrow.dataset as ds
import pytest
import yaml

from charon_search.cli import main
from charon_search.errors import ConfigError
from charon_search.search.sweep import load_sweep, run_sweep

from .conftest import DATA


def test_search_cli_json_and_outputs(tmp_path, capsys):
    out, js = tmp_path / "out", tmp_path / "s.json"
    rc = main(["search", str(DATA / "toy-space.yaml"), "--objective",
               str(DATA / "toy-objective.yaml"), "--trials", "30", "--workers", "0",
               "--out", str(out), "--json", str(js), "--quiet", "--no-html"])
    assert rc == 0
    summary = json.loads(js.read_text())
    for k in ("num_trials", "num_feasible", "num_infeasible", "pareto_size", "wall_s",
              "trials_per_s", "workers", "nodes_used"):
        assert k in summary
    assert summary["num_trials"] == 30
    assert summary["num_feasible"] + summary["num_infeasible"] == 30
    assert (out / "trials.parquet").exists() and (out / "pareto.parquet").exists()
    assert "Pareto front" in capsys.readouterr().out


def test_search_cli_bad_objective_exits_2_with_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"name": "b", "objectives": [
        {"metric": "step_time_s", "direction": "fastest"}]}))
    rc = main(["search", str(DATA / "toy-space.yaml"), "--objective", str(bad),
               "--trials", "3", "--workers", "0", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1
    assert str(bad) in err and "objectives[0].direction" in err and "maximize" in err


def test_sweep_writes_hive_partitions(tmp_path):
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": "toy", "trials": 12, "sampler": "random", "date": "2026-12-01",
        "runs": [{"space": str(DATA / "toy-space.yaml"),
                  "objective": str(DATA / "toy-objective.yaml"),
                  "models": ["m-a", "m-b"], "gpus": {"h100": "c-h100", "h200": "c-h200"}}]}))
    summaries = run_sweep(load_sweep(sweep), tmp_path / "ds", workers=0)
    assert len(summaries) == 4
    dataset = ds.dataset(tmp_path / "ds", partitioning="hive", format="parquet",
                         exclude_invalid_files=True)
    table = dataset.to_table().to_pylist()
    assert len(table) == 4 * 12
    assert {(r["sweep"], r["model"], r["gpu"], r["date"]) for r in table} == {
        ("toy", m, g, "2026-12-01") for m in ("m-a", "m-b") for g in ("h100", "h200")}
    assert {r["cluster"] for r in table if r["gpu"] == "h200"} == {"c-h200"}
    assert any(r["pareto"] for r in table)
    assert (tmp_path / "ds" / "sweep=toy" / "model=m-a" / "gpu=h100" / "date=2026-12-01").is_dir()


def test_sweep_malformed(tmp_path):
    p = tmp_path / "bad-sweep.yaml"
    p.write_text(yaml.safe_dump({"name": "x", "runs": [{"space": "a", "objective": "b",
                                                         "models": ["m"], "gpu": ["h100"]}]}))
    with pytest.raises(ConfigError) as e:
        load_sweep(p)
    assert str(p) in str(e.value) and "'gpu'" in str(e.value) and "gpus" in str(e.value)


def test_sweep_guard_reaches_every_run(tmp_path, capsys):
    """``sweep --guard 0.9``: every run checks its constraints at the validated error's 90th
    percentile; the dataset rows and the summaries say so."""
    from charon_search.validation.bands import load_bands

    m90 = load_bands().lookup("training_memory").ratio(0.9)
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": "toy", "trials": 8, "sampler": "random", "date": "2026-12-05",
        "runs": [{"space": str(DATA / "toy-space.yaml"),
                  "objective": str(DATA / "toy-objective.yaml"),
                  "models": ["m-a"], "gpus": {"h100": "c-h100"}}]}))
    js = tmp_path / "s.json"
    assert main(["sweep", str(sweep), "--out", str(tmp_path / "ds"), "--workers", "0",
                 "--guard", "0.9", "--json", str(js), "--quiet"]) == 0
    assert [s["guard"] for s in json.loads(js.read_text())] == [0.9]
    table = ds.dataset(tmp_path / "ds", partitioning="hive", format="parquet",
                       exclude_invalid_files=True).to_table().to_pylist()
    assert {r["guard"] for r in table} == {0.9}
    guarded = [r for r in table if r.get("guarded.peak_memory_bytes") is not None]
    assert guarded and all(r["guarded.peak_memory_bytes"] == pytest.approx(
        r["peak_memory_bytes"] * m90) for r in guarded)
    assert main(["sweep", str(sweep), "--out", str(tmp_path / "ds2"), "--workers", "0",
                 "--guard", "0.8"]) == 2
    assert "`--guard` must be one of" in capsys.readouterr().err


def _toy_sweep(tmp_path, name="s.yaml", **run):
    sweep = tmp_path / name
    sweep.write_text(yaml.safe_dump({
        "name": "toy", "trials": 6, "sampler": "random",
        "runs": [{"space": str(DATA / "toy-space.yaml"),
                  "objective": str(DATA / "toy-objective.yaml"),
                  "models": ["m-a"], "gpus": {"h100": "c-h100"}, **run}]}))
    return sweep


def test_a_dataset_of_two_dates_reads_back_as_one_table(tmp_path):
    """Each part file gives a column one type (config keys and trial numbers integers, other
    numbers float64, empty text columns strings), so the plain pyarrow call reads a dataset
    whose dates differ in which columns happen to be empty; ``read_sweep`` also takes the
    union of the columns."""
    from charon_search.search import read_sweep

    spec = load_sweep(_toy_sweep(tmp_path))
    run_sweep(spec, tmp_path / "ds", workers=0, date="2026-01-01", trials=3)
    run_sweep(spec, tmp_path / "ds", workers=0, date="2026-01-02", trials=9, guard=0.9)
    table = ds.dataset(tmp_path / "ds", partitioning="hive").to_table()
    assert table.num_rows == 12
    assert table.schema.field("trial_number").type == "int64"
    assert table.schema.field("step_time_s").type == "double"
    assert table.schema.field("guard").type == "double"
    assert table.schema.field("prune_reason").type == "string"
    whole = read_sweep(tmp_path / "ds")
    assert whole.num_rows == 12
    assert sorted(set(whole.column("date").to_pylist())) == ["2026-01-01", "2026-01-02"]
    assert set(whole.column("guard").to_pylist()) == {None, 0.9}


def test_partition_values_read_back_as_written(tmp_path):
    """Labels are URI-encoded path segments: an HF model id reads back with its slash, and
    labels that differ only in a slash and an underscore stay two partitions."""
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": "toy", "trials": 4, "sampler": "random", "date": "2026/01/03",
        "runs": [{"space": str(DATA / "toy-space.yaml"),
                  "objective": str(DATA / "toy-objective.yaml"),
                  "models": ["org/m-a"], "gpus": {"a/b": "c-h100", "a_b": "c-h200"}}]}))
    run_sweep(load_sweep(sweep), tmp_path / "ds", workers=0)
    rows = ds.dataset(tmp_path / "ds", partitioning="hive").to_table().to_pylist()
    assert len(rows) == 8
    assert {(r["model"], r["gpu"], r["cluster"], r["date"]) for r in rows} == {
        ("org/m-a", "a/b", "c-h100", "2026/01/03"), ("org/m-a", "a_b", "c-h200", "2026/01/03")}


def test_two_objectives_of_one_space_keep_their_own_studies_and_files(tmp_path):
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({
        "name": "toy-fast-small", "objectives": [
            {"metric": "step_time_s", "direction": "minimize"},
            {"metric": "peak_memory_bytes", "direction": "minimize"}]}))
    sweep = tmp_path / "s.yaml"
    run = {"space": str(DATA / "toy-space.yaml"), "models": ["m-a"],
           "gpus": {"h100": "c-h100"}}
    sweep.write_text(yaml.safe_dump({
        "name": "toy", "trials": 5, "sampler": "random", "date": "2026-01-04",
        "runs": [{**run, "objective": str(DATA / "toy-objective.yaml")},
                 {**run, "objective": str(other)}]}))
    run_sweep(load_sweep(sweep), tmp_path / "ds", workers=0)
    rows = ds.dataset(tmp_path / "ds", partitioning="hive").to_table().to_pylist()
    assert len(rows) == 10
    assert {r["objective"] for r in rows} == {"toy-fast-cheap", "toy-fast-small"}
    # the same (space, objective, model, gpu) twice would share a study and a file
    sweep.write_text(yaml.safe_dump({
        "name": "toy", "runs": [{**run, "objective": str(other)},
                                {**run, "objective": str(other), "trials": 9}]}))
    with pytest.raises(ConfigError, match=r"`runs\[0\]` and `runs\[1\]` both search"):
        load_sweep(sweep)


@pytest.mark.parametrize("run, pattern", [
    ({"gpus": {}}, r"field `runs\[0\].gpus` must name at least one cluster"),
    ({"sampler": "cmaes"}, r"field `runs\[0\].sampler` must be one of"),
])
def test_sweep_run_fields_are_checked_when_the_file_loads(tmp_path, run, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_sweep(_toy_sweep(tmp_path, **run))


def test_a_bad_objective_of_a_later_run_fails_before_the_first_search(tmp_path):
    sweep = tmp_path / "s.yaml"
    good = {"space": str(DATA / "toy-space.yaml"), "objective": str(DATA / "toy-objective.yaml"),
            "models": ["m-a"], "gpus": {"h100": "c-h100"}}
    sweep.write_text(yaml.safe_dump({"name": "toy", "trials": 3, "runs": [
        good, {**good, "objective": str(tmp_path / "missing.yaml")}]}))
    with pytest.raises(ConfigError, match=r"field `runs\[1\].objective`: .*missing.yaml"):
        run_sweep(load_sweep(sweep), tmp_path / "ds", workers=0)
    assert not (tmp_path / "ds").exists()


def test_a_shipped_sweep_loads_from_any_working_directory(tmp_path, monkeypatch):
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(tmp_path)
    spec = load_sweep(root / "sweeps" / "training-gpus.yaml")
    assert all(Path(e.space).is_file() and Path(e.objective).is_file() for e in spec.entries)
