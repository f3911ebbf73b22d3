"""Bad input to `search`/`sweep`, their spaces, objectives and sweep files: one ConfigError naming
the field (or flag) and the allowed values or close matches, exit 2 from the CLI, before any
trial where the input allows it; never a traceback, a hang or a silently wrong result."""

from __future__ import annotations

import copy
import socket
import sys
import time
from pathlib import Path

import pytest
import yaml

from charon_search.cli import main
from charon_search.errors import ConfigError
from charon_search.search import SearchOptions, load_space, run_search
from charon_search.search.objective import Objective
from charon_search.search.space import SearchSpace
from charon_search.search.sweep import load_sweep

from .conftest import DATA

ROOT = Path(__file__).resolve().parents[2]
TRAINING_SPACE = ROOT / "spaces" / "quickstart-llama8b-training.yaml"
SERVING_SPACE = ROOT / "spaces" / "llama3-70b-serving-disagg.yaml"
OBJECTIVE = ROOT / "objectives" / "train-fast-cheap.yaml"


def _space(path: Path, edit) -> dict:
    data = copy.deepcopy(yaml.safe_load(path.read_text()))
    edit(data)
    return data


def _search(tmp_path: Path, *extra: str, space: Path | str = DATA / "toy-space.yaml",
            objective: Path | str = DATA / "toy-objective.yaml") -> list[str]:
    return ["search", str(space), "--objective", str(objective), "--trials", "2",
            "--workers", "0", "--out", str(tmp_path / "out"), "--quiet", "--no-html", *extra]


def _run_cli(argv: list[str], capsys) -> tuple[int, str]:
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    return rc, err


# ------------------------------------------------------------------ 1. constraint metrics
def _toy_objective(*constraints: str) -> Objective:
    return Objective.from_dict({
        "name": "toy", "objectives": [{"metric": "step_time_s", "direction": "minimize"},
                                      {"metric": "gpu_s_per_token", "direction": "minimize"}],
        "constraints": list(constraints)}, path="toy.yaml")


def test_misspelt_constraint_metric_is_an_error_naming_close_matches(toy_space):
    with pytest.raises(ConfigError, match=r"`constraints\[0\]`.*'peak_memory_byte'.*"
                                          r"did you mean \['peak_memory_bytes'"):
        run_search(toy_space, _toy_objective("peak_memory_byte <= 1"),
                   SearchOptions(trials=40, workers=0, sampler="random", seed=0))


def test_constraint_on_a_metric_pruned_records_lack_is_not_an_error(toy_space):
    # Out-of-memory toy records carry no step time: they stay pruned, the others are checked.
    res = run_search(toy_space, _toy_objective("peak_memory_bytes <= device",
                                               "step_time_s <= 0.9"),
                     SearchOptions(trials=100_000, workers=0, sampler="grid"))
    pruned = [r for r in res.rows if r.get("valid") and r.get("step_time_s") is None]
    assert pruned and not any(r["feasible"] for r in pruned)
    assert all(r["step_time_s"] <= 0.9 for r in res.rows if r["feasible"])
    assert any(str(r.get("prune_reason", "")).startswith("constraint: step_time_s")
               for r in res.rows)


# ------------------------------------------------------------------ 2. the fixed section
@pytest.mark.parametrize(("key", "value", "pattern"), [
    ("seq_lenn", 4096, r"`fixed.seq_lenn`.*did you mean \['seq_len'\]"),
    ("seq_len", -4096, r"`fixed.seq_len`.*`seq_len` must be a positive integer.*-4096"),
    ("seq_len", "long", r"`fixed.seq_len`.*must be an integer, but got 'long'"),
])
def test_training_space_fixed_values_are_checked_up_front(key, value, pattern):
    def edit(d):
        d["fixed"].pop("seq_len")
        d["fixed"][key] = value

    with pytest.raises(ConfigError, match=pattern):
        SearchSpace.from_dict(_space(TRAINING_SPACE, edit), path="s.yaml")


@pytest.mark.parametrize(("edit", "pattern"), [
    (lambda d: d["fixed"]["workload"].update(arival=d["fixed"]["workload"].pop("arrival")),
     r"`fixed.workload`.*unknown key\(s\) \['arival'\]; did you mean \['arrival'\]"),
    (lambda d: d["fixed"].update(engine="vlm"),
     r"`fixed.engine`.*`engine` must be one of \[.*'vllm'.*\], but got 'vlm'"),
    (lambda d: d["fixed"]["workload"].update(seed=-1),
     r"`fixed.workload`.*`workload.seed` must be an integer in \[0, 2\*\*32 - 1\]"),
], ids=["workload-key", "engine", "workload-seed"])
def test_serving_space_fixed_values_are_checked_up_front(edit, pattern):
    with pytest.raises(ConfigError, match=pattern):
        SearchSpace.from_dict(_space(SERVING_SPACE, edit), path="s.yaml")


def test_search_cli_bad_fixed_value_exits_2_before_any_trial(tmp_path, capsys):
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(_space(TRAINING_SPACE,
                                           lambda d: d["fixed"].update(seq_len=-4096))))
    rc, err = _run_cli(_search(tmp_path, space=space, objective=OBJECTIVE), capsys)
    assert rc == 2
    assert "`fixed.seq_len`" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out" / "trials.parquet").exists()


def test_shipped_spaces_still_load():
    for path in sorted((ROOT / "spaces").glob("*.yaml")):
        load_space(path)


# ------------------------------------------------------------------ 3. categorical choices
def test_misspelt_training_choice_names_the_choices_not_the_example():
    def edit(d):
        d["params"]["recompute"]["choices"] = ["none", "selectiv", "full"]

    with pytest.raises(ConfigError, match=r"`params.recompute.choices` holds 'selectiv'.*"
                                          r"must be one of \['none', 'selective', 'full'\]"):
        SearchSpace.from_dict(_space(TRAINING_SPACE, edit), path="s.yaml")


def test_misspelt_serving_choice_names_the_choices():
    def edit(d):
        d["params"]["mode"]["choices"] = ["agregated", "disaggregated"]
        d["example"]["mode"] = "agregated"

    with pytest.raises(ConfigError, match=r"`params.mode.choices` holds 'agregated'.*"
                                          r"\['aggregated', 'disaggregated'\]"):
        SearchSpace.from_dict(_space(SERVING_SPACE, edit), path="s.yaml")


@pytest.mark.parametrize(("path", "key"), [(TRAINING_SPACE, "model"), (TRAINING_SPACE, "cluster"),
                                         (SERVING_SPACE, "model")])
def test_a_space_without_model_or_cluster_is_an_error(path: Path, key: str):
    """Every trial simulates one model on one cluster: a space that sets neither is one error
    when it loads, not a KeyError in the first validity rule."""
    with pytest.raises(ConfigError, match=rf"s.yaml: field `{key}` is required by the"):
        SearchSpace.from_dict(_space(path, lambda d: d["fixed"].pop(key)), path="s.yaml")


def test_unknown_model_and_cluster_names_fail_when_the_space_loads():
    """Names the evaluators resolve only in a worker are resolved up front: a fixed model with
    the catalog's closest names, a cluster choice with the shipped clusters."""
    with pytest.raises(ConfigError, match=r"`fixed.model` makes no valid 'training' config: "
                                          r"`model` must be a catalog name.*'llama-3.1-9b'; "
                                          r"closest catalog names: .*llama-3.1-8b"):
        SearchSpace.from_dict(_space(TRAINING_SPACE, lambda d: d["fixed"].update(
            model="llama-3.1-9b")), path="s.yaml")

    def edit(d):
        d["params"]["cluster"]["choices"] = ["dgx-h100-ib400", "dgx-h200-ib40"]

    with pytest.raises(ConfigError, match=r"`params.cluster.choices` holds 'dgx-h200-ib40'.*"
                                          r"`cluster`: unknown cluster 'dgx-h200-ib40'; must be "
                                          r"one of \[.*'dgx-h200-ib400'"):
        SearchSpace.from_dict(_space(SERVING_SPACE, edit), path="s.yaml")


# ------------------------------------------------------------------ 4. log_int base
@pytest.mark.parametrize("base", [0, 1, -2, True])
def test_log_int_base_below_2_is_rejected(base):
    def edit(d):
        d["params"]["num_gpus"]["base"] = base

    with pytest.raises(ConfigError, match=r"`params.num_gpus.base` must be an integer >= 2"):
        SearchSpace.from_dict(_space(TRAINING_SPACE, edit), path="s.yaml")


# ------------------------------------------------------------------ 5. numbers
@pytest.mark.parametrize(("extra", "flag"), [
    (["--seed", "-1"], "--seed"),
    (["--seed", str(2**32)], "--seed"),
    (["--population-size", "-1"], "--population-size"),
    (["--population-size", "0"], "--population-size"),
    (["--trials", "0"], "--trials"),
])
def test_search_cli_bad_numbers_exit_2(tmp_path, capsys, extra, flag):
    rc, err = _run_cli(_search(tmp_path, *extra), capsys)
    assert rc == 2
    assert f"`{flag}` must be an integer" in err and len(err.splitlines()) == 1


def test_search_options_are_checked_in_the_library(toy_space, toy_objective):
    for opts, field in [(dict(seed=-1), "seed"), (dict(population_size=1), "population_size"),
                        (dict(trials=0), "trials")]:
        kw = {"trials": 2, "workers": 0, **opts}
        with pytest.raises(ConfigError, match=f"`{field}` must be an integer"):
            run_search(toy_space, toy_objective, SearchOptions(**kw))


def _sweep_file(tmp_path: Path, **top) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({
        "name": "t", "trials": 2, "workers": 0, **top,
        "runs": [{"space": str(DATA / "toy-space.yaml"),
                  "objective": str(DATA / "toy-objective.yaml"),
                  "models": ["toy"], "gpus": ["toy-cluster"]}]}))
    return path


@pytest.mark.parametrize(("top", "pattern"), [
    ({"trials": "two"}, r"field `trials` must be an integer >= 1, but got 'two'"),
    ({"trials": 0}, r"field `trials` must be an integer >= 1, but got 0"),
    ({"seed": -1}, r"field `seed` must be an integer in \[0, 4294967295\]"),
    ({"workers": "2"}, r"field `workers` must be an integer >= 0"),
])
def test_sweep_file_numbers_are_checked(tmp_path, top, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_sweep(_sweep_file(tmp_path, **top))


@pytest.mark.parametrize(("run", "pattern"), [
    ({"models": ["llama-3.1-8b", "llama-3.1-9b"]},
     r"field `runs\[0\].models\[1\]`: `model` must be a catalog name.*'llama-3.1-9b'"),
    ({"gpus": {"h100": "dgx-h100-ib400", "h200": "dgx-h200-ib40"}},
     r"field `runs\[0\].gpus.h200`: unknown cluster 'dgx-h200-ib40'"),
    ({"gpus": ["dgx-h100-ib40"]}, r"field `runs\[0\].gpus\[0\]`: unknown cluster"),
    ({"space": "spaces/no-such-space.yaml"}, r"field `runs\[0\].space`: .*no such file"),
], ids=["model", "labelled-cluster", "listed-cluster", "space"])
def test_sweep_names_are_checked_before_the_first_search(tmp_path, run, pattern):
    """A training or serving run's models and clusters resolve when the sweep loads: a misspelt
    one would otherwise fail after the sweep's earlier cells had run."""
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "runs": [{
        "space": str(TRAINING_SPACE), "objective": "objectives/train-fast-cheap.yaml",
        "models": ["llama-3.1-8b"], "gpus": {"h100": "dgx-h100-ib400"}, **run}]}))
    with pytest.raises(ConfigError, match=pattern):
        load_sweep(path)


def test_sweep_cli_trials_0_exits_2(tmp_path, capsys):
    rc, err = _run_cli(["sweep", str(_sweep_file(tmp_path)), "--out", str(tmp_path / "ds"),
                        "--trials", "0", "--quiet"], capsys)
    assert rc == 2 and "`--trials` must be an integer >= 1" in err


# ------------------------------------------------------------------ 6. names of shipped files
def test_misspelt_shipped_names_list_close_matches(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    rc, err = _run_cli(_search(tmp_path, space="spaces/quickstart-llama8b-training.yaml",
                               objective="train-fast-chea"), capsys)
    assert rc == 2 and "did you mean ['train-fast-cheap']" in err
    rc, err = _run_cli(_search(tmp_path, space="quickstart-llama8b-trainin",
                               objective="train-fast-cheap"), capsys)
    assert rc == 2 and "did you mean ['quickstart-llama8b-training']" in err


def test_missing_absolute_path_builds_no_folder_path(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    missing = tmp_path / "nonexist.yaml"
    rc, err = _run_cli(_search(tmp_path, objective=missing), capsys)
    assert rc == 2 and f"{missing}: no such file" in err
    assert "objectives/" not in err


# ------------------------------------------------------------------ 7. unreachable Ray address
def test_unreachable_ray_address_fails_fast(tmp_path, capsys):
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        pytest.skip("Ray is initialised in this process: the address is not used")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.perf_counter()
    argv = _search(tmp_path, "--ray-address", f"127.0.0.1:{port}")
    argv[argv.index("--workers") + 1] = "1"
    rc, err = _run_cli(argv, capsys)
    assert rc == 2 and f"'127.0.0.1:{port}'" in err and "cannot be reached" in err
    assert time.perf_counter() - t0 < 30


# ------------------------------------------------------------------ review of 2026-12-06
@pytest.mark.parametrize("bound", ["nan", "inf", "-inf", "1e999"])
def test_a_constraint_bound_must_be_finite(bound):
    with pytest.raises(ConfigError, match=r"toy.yaml: field `constraints\[0\]` bound must be "
                                          r"a finite number"):
        _toy_objective(f"step_time_s <= {bound}")


def test_limits_must_be_finite_and_may_not_shadow_device():
    base = {"name": "t", "objectives": [{"metric": "step_time_s", "direction": "minimize"}]}
    with pytest.raises(ConfigError, match=r"`limits.device`: `device` is reserved"):
        Objective.from_dict({**base, "limits": {"device": 1.0},
                             "constraints": ["peak_memory_bytes <= device"]}, path="o.yaml")
    with pytest.raises(ConfigError, match=r"`limits.budget` must be a finite number"):
        Objective.from_dict({**base, "limits": {"budget": float("inf")}}, path="o.yaml")


def test_an_objective_on_a_text_field_is_an_error_naming_the_field():
    obj = Objective.from_dict({"name": "t", "objectives": [
        {"metric": "step_time_s", "direction": "minimize"},
        {"metric": "flops_convention", "direction": "minimize"}]}, path="o.yaml")
    with pytest.raises(ConfigError, match=r"o.yaml: field `objectives\[1\].metric` names "
                                          r"'flops_convention', a str field"):
        obj.values({"step_time_s": 1.0, "flops_convention": "model_flops = 6 N T"})
    assert obj.values({"step_time_s": 1.0, "flops_convention": 2}) == [1.0, 2.0]


@pytest.mark.parametrize("edit, pattern", [
    (lambda d: d.update(derived=["dp"]), r"field `derived` must be a mapping"),
    (lambda d: d.update(fixed=["ab", "cd"]), r"field `fixed` must be a mapping"),
    (lambda d: d.update(example=[1, 2]), r"field `example` must be a mapping"),
    (lambda d: d["params"].update({5: {"type": "categorical", "choices": [1]}}),
     r"field `params` keys must be names, but got 5"),
    (lambda d: d.update(constraints=[{"a": 1}]), r"field `constraints` must list names"),
    (lambda d: d.update(family=7), r"field `family` must be a list of config keys"),
    (lambda d: d["params"].update(num_gpus={"type": "int", "low": 8, "high": 44, "step": 8}),
     r"`high - low` must be a multiple of `step` for `params.num_gpus`"),
])
def test_space_fields_of_the_wrong_type_are_config_errors(edit, pattern):
    data = _space(DATA / "toy-space.yaml", edit)
    with pytest.raises(ConfigError, match=pattern):
        SearchSpace.from_dict(data, path="toy-space.yaml")


def test_family_given_as_one_name_and_a_wide_int_range_load():
    data = _space(DATA / "toy-space.yaml", lambda d: (
        d.update(family="recompute"),
        d["params"].update(num_gpus={"type": "int", "low": 8, "high": 8 * 10**12, "step": 8})))
    space = SearchSpace.from_dict(data, path="toy-space.yaml")   # no MemoryError
    assert space.family == ("recompute",)
    assert space.num_points() > 10**12
    with pytest.raises(ConfigError, match=r"'grid' enumerates every point .* \(at most"):
        run_search(space, _toy_objective(), SearchOptions(trials=1, workers=0, sampler="grid"))


def test_malformed_yaml_is_one_line_with_its_position(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nparams: {tp: [1, 2\n")
    rc, err = _run_cli(_search(tmp_path, space=bad), capsys)
    assert rc == 2 and len(err.splitlines()) == 1
    assert f"{bad}:3:1: not valid YAML:" in err


def test_out_that_is_a_file_and_negative_workers_are_flag_errors(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("")
    argv = _search(tmp_path)
    argv[argv.index("--out") + 1] = str(afile)
    rc, err = _run_cli(argv, capsys)
    assert rc == 2 and f"`--out` '{afile}' is a file; give a folder" in err
    argv = _search(tmp_path)
    argv[argv.index("--workers") + 1] = "-1"
    rc, err = _run_cli(argv, capsys)
    assert rc == 2 and "`--workers` must be >= 0" in err
    assert not (tmp_path / "out").exists()                  # nothing written before the check
