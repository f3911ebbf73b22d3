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
