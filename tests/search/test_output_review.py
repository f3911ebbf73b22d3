"""Search outputs under review: non-finite metrics, Pareto at scale, empty studies, Ctrl-C,
JSON config values, sweep ``pareto`` flags and part-file types, HTML size and axis units."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time

import numpy as np
import optuna
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from charon_search.errors import ConfigError
from charon_search.search import SearchOptions, non_dominated, read_sweep, run_search
from charon_search.search.evaluators import ToyAnalyticEvaluator
from charon_search.search.objective import Objective
from charon_search.search.results import (
    axis_title,
    front_flags,
    pareto_rows,
    split_attrs,
    to_table,
    write_pareto_html,
    write_parquet,
)
from charon_search.search.study import SearchInterrupted, make_storage
from charon_search.search.sweep import _known_types, _uniform_types, load_sweep, run_sweep

from .conftest import DATA


def _objective(*constraints: str, metric: str = "step_time_s",
               directions: tuple[str, str] = ("minimize", "minimize")) -> Objective:
    return Objective.from_dict({
        "name": "toy", "objectives": [{"metric": metric, "direction": directions[0]},
                                      {"metric": "gpu_s_per_token", "direction": directions[1]}],
        "constraints": list(constraints)}, path="toy.yaml")


def _stored_trials(out) -> list[optuna.trial.FrozenTrial]:
    storage, _ = make_storage(None, out)
    summaries = optuna.get_all_study_summaries(storage)
    return [t for s in summaries
            for t in optuna.load_study(study_name=s.study_name, storage=storage).trials]


# ---------------------------------------------------------------- F1 non-finite metrics
class _InfEvaluator(ToyAnalyticEvaluator):
    """The toy record, with an infinite extra metric on pp=1 layouts, an infinite step time on
    16 GPUs without tensor parallelism, a NaN cost on 24 GPUs without it, and a NaN metric
    everywhere."""

    def evaluate(self, cfg):
        rec = super().evaluate(cfg)
        if rec["feasible"]:
            rec["bubble_ratio"] = math.inf if int(cfg["pp"]) == 1 else -math.inf
            rec["nan_metric"] = math.nan
            if int(cfg["num_gpus"]) == 16 and int(cfg["tp"]) == 1:
                rec["step_time_s"] = math.inf
            if int(cfg["num_gpus"]) == 24 and int(cfg["tp"]) == 1:
                rec["gpu_s_per_token"] = math.nan
        return rec


def test_infinite_metrics_stay_float64_in_parquet_and_the_study_resumes(toy_space,
                                                                        toy_objective,
                                                                        tmp_path):
    out = tmp_path / "inf"
    opts = dict(workers=0, sampler="grid", out_dir=str(out), html=False)
    res = run_search(toy_space, toy_objective, SearchOptions(trials=100_000, **opts),
                     evaluator=_InfEvaluator())
    ev = ToyAnalyticEvaluator()
    evaluated = [cfg for _, cfg in toy_space.enumerate_valid() if ev.evaluate(cfg)["feasible"]]
    n_pp1 = sum(1 for c in evaluated if c["pp"] == 1)
    n_inf_step = sum(1 for c in evaluated if c["num_gpus"] == 16 and c["tp"] == 1)
    n_nan_cost = sum(1 for c in evaluated if c["num_gpus"] == 24 and c["tp"] == 1)
    assert n_pp1 > 0 and n_inf_step > 0 and n_nan_cost > 0

    table = pq.read_table(out / "trials.parquet")
    for col in ("step_time_s", "bubble_ratio", "nan_metric", "gpu_s_per_token"):
        assert table.schema.field(col).type == pa.float64(), col
    rows = table.to_pylist()
    assert sum(1 for r in rows if r["bubble_ratio"] == math.inf) == n_pp1
    assert sum(1 for r in rows if r["bubble_ratio"] == -math.inf) == len(evaluated) - n_pp1
    assert sum(1 for r in rows if r["step_time_s"] == math.inf) == n_inf_step
    assert all(r["nan_metric"] is None for r in rows)          # NaN is stored as null
    inf_rows = [r for r in rows if r["step_time_s"] == math.inf]
    assert {r["prune_reason"] for r in inf_rows} == {
        "non-finite objective value step_time_s=inf"}
    assert not any(r["feasible"] for r in inf_rows)
    nan_reasons = [r["prune_reason"] for r in rows if r["num_gpus"] == 24 and r["tp"] == 1
                   and r["step_time_s"] is not None]
    assert nan_reasons == ["non-finite objective value gpu_s_per_token=nan"] * n_nan_cost
    assert all(math.isfinite(r["step_time_s"]) for r in res.pareto)

    # the study storage holds the infinity as a JSON object and gives it back as a float
    stored = _stored_trials(out)
    attr = next(t.user_attrs["m:step_time_s"] for t in stored
                if isinstance(t.user_attrs.get("m:step_time_s"), dict))
    assert attr == {"__float__": "inf"}
    assert sum(split_attrs(t.user_attrs)[1].get("step_time_s") == math.inf
               for t in stored) == n_inf_step

    # resuming reads the infinite values back as numbers (it used to fail on "inf" strings)
    again = run_search(toy_space, toy_objective, SearchOptions(trials=res.num_trials, **opts),
                       evaluator=_InfEvaluator())
    assert again.num_new_trials == 0 and again.num_trials == res.num_trials
    assert pq.read_table(out / "trials.parquet").schema.field("step_time_s").type == \
        pa.float64()


def test_infinity_strings_of_older_studies_read_as_floats():
    cfg, rec = split_attrs({"c:tp": 2, "m:step_time_s": "inf", "m:x": "-inf",
                            "m:prune_reason": "memory: ...", "m:y": {"__float__": "inf"}})
    assert cfg == {"tp": 2}
    assert rec == {"step_time_s": math.inf, "x": -math.inf, "prune_reason": "memory: ...",
                   "y": math.inf}
    table = to_table([{"trial_number": 0, **rec}, {"trial_number": 1, "step_time_s": 1.5}])
    assert table.schema.field("step_time_s").type == pa.float64()
    assert table.column("step_time_s").to_pylist() == [math.inf, 1.5]


def test_an_infinite_constrained_metric_is_a_bounded_violation():
    obj = _objective("ttft_s <= 2", "rate >= 4")
    (_, v_up), (_, v_low) = obj.violations({"ttft_s": math.inf, "rate": math.inf})
    assert (v_up, v_low) == (1e6, -1e6)               # violated / satisfied, both finite
    (_, v_up), (_, v_low) = obj.violations({"ttft_s": 3.0, "rate": -math.inf})
    assert (v_up, v_low) == (0.5, 1e6)


# ---------------------------------------------------------------- F2 non-dominated filter
def _all_pairs(losses) -> list[int]:
    """The former O(n^2) filter, kept as the reference."""
    pts = np.asarray(losses, dtype=float)
    if pts.size == 0:
        return []
    keep = []
    for i, p in enumerate(pts):
        le = np.all(pts <= p, axis=1)
        lt = np.any(pts < p, axis=1)
        if not np.any(le & lt):
            keep.append(i)
    return keep


def test_non_dominated_hand_checked_2d_with_ties():
    # (1,6) loses to (1,5) on y at equal x; (2,5) and (3,3) lose to (2,2); (6,6) to all;
    # the two (2,2) do not dominate each other.
    pts = [[1, 5], [2, 2], [5, 1], [3, 3], [2, 2], [6, 6], [1, 6], [2, 5]]
    assert non_dominated(pts) == [0, 1, 2, 4] == _all_pairs(pts)


def test_non_dominated_hand_checked_3d_with_ties():
    # (1,3,3) loses to (1,2,3); (2,2,3) to (2,2,2); (2,2,2) survives (3 > 2 on z)
    pts = [[1, 2, 3], [1, 2, 3], [3, 2, 1], [2, 2, 2], [1, 3, 3], [2, 2, 3], [0, 9, 9]]
    assert non_dominated(pts) == [0, 1, 2, 3, 6] == _all_pairs(pts)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_non_dominated_equals_the_all_pairs_reference(k):
    rng = np.random.default_rng(k)
    special = [0.0, 1.0, 2.0, math.inf, -math.inf, math.nan]
    for case in range(300):
        n = int(rng.integers(0, 40))
        if case % 3 == 0:
            pts = rng.integers(0, 3, size=(n, k)).astype(float)     # many equal values
        elif case % 3 == 1:
            pts = rng.choice(special, size=(n, k))
        else:
            pts = rng.normal(size=(n, k))
        assert non_dominated(pts) == _all_pairs(pts), pts


@pytest.mark.parametrize(("k", "n"), [(2, 50_000), (3, 20_000)])
def test_non_dominated_is_fast_at_scale(k, n):
    # all-pairs took ~110 s (2 objectives, 50k points) and ~16 s (20k) on 2 cores
    rng = np.random.default_rng(0)
    x = rng.uniform(0.1, 10, n)
    pts = np.c_[x, 1 / x * rng.uniform(1, 1.5, n), rng.uniform(0, 1, (n, k - 2))]
    t = time.perf_counter()
    front = non_dominated(pts)
    assert time.perf_counter() - t < 5.0
    assert 0 < len(front) < n
    sub = rng.choice(n, 2000, replace=False)           # agrees with the reference on a sample
    assert non_dominated(pts[sub]) == _all_pairs(pts[sub])


def test_memo_hits_reach_the_durable_storage_in_batches(toy_space, toy_objective, tmp_path,
                                                       monkeypatch):
    """Trials that finish without an evaluation (a known point from the memo, or one that
    breaks the space's rules) are stored every ``flush_every`` trials like evaluated ones,
    not held in memory until the next evaluation returns (a killed run would lose them)."""
    from charon_search.search.study import _Loop

    waiting: list[int] = []
    finish = _Loop.finish

    def counted(self, *args, **kwargs):
        ok = finish(self, *args, **kwargs)
        waiting.append(len(self.unflushed))
        return ok

    monkeypatch.setattr(_Loop, "finish", counted)
    res = run_search(toy_space, toy_objective, SearchOptions(
        trials=4000, workers=0, sampler="random", seed=0, out_dir=str(tmp_path / "memo"),
        flush_every=8, flush_interval_s=3600.0, html=False))
    # Most of the 4,000 finish without an evaluation (the space has 1,296 points): repeats
    # of known points, or points that break its rules.
    assert res.num_trials == 4000 and res.num_memo_hits + res.num_invalid > 3000
    assert max(waiting) <= 8


# ---------------------------------------------------------------- F3 empty studies
def test_an_objective_rejected_before_any_trial_is_replaced_by_the_fixed_one(toy_space,
                                                                            toy_objective,
                                                                            tmp_path):
    out = tmp_path / "typo"
    # grid order starts with out-of-memory layouts; flush_every=1 stores them before the
    # first scored record rejects the constraint, and the rejection removes them again
    opts = dict(workers=0, sampler="grid", out_dir=str(out), flush_every=1, html=False)
    with pytest.raises(ConfigError, match="peak_memroy_bytes"):
        run_search(toy_space, _objective("peak_memroy_bytes <= device"),
                   SearchOptions(trials=40, **opts))
    assert _stored_trials(out) == []
    res = run_search(toy_space, toy_objective, SearchOptions(trials=40, **opts))
    assert res.num_trials == 40 and res.num_feasible > 0
    storage, _ = make_storage(None, out)
    study = optuna.load_study(study_name=toy_space.name, storage=storage)
    assert study.user_attrs["objective_definition"]["constraints"] == [
        ["peak_memory_bytes", "<=", "device_memory_bytes"]]


def test_an_empty_study_takes_new_directions(toy_space, toy_objective, tmp_path):
    out = tmp_path / "dirs"
    opts = dict(workers=0, sampler="random", seed=0, out_dir=str(out), html=False)
    with pytest.raises(ConfigError, match="step_tme_s"):
        run_search(toy_space, _objective(metric="step_tme_s",
                                         directions=("maximize", "minimize")),
                   SearchOptions(trials=20, **opts))
    res = run_search(toy_space, toy_objective, SearchOptions(trials=20, **opts))
    assert res.num_trials == 20
    # a study that holds trials still refuses another objective
    with pytest.raises(ConfigError, match="different objective"):
        run_search(toy_space, _objective("peak_memory_bytes <= 1e12"),
                   SearchOptions(trials=30, **opts))


def test_a_sweep_resumes_after_a_misspelt_objective_is_fixed(tmp_path):
    obj = tmp_path / "obj.yaml"
    body = {"name": "o", "objectives": [{"metric": "step_time_s", "direction": "minimize"},
                                        {"metric": "gpu_s_per_token", "direction": "minimize"}]}
    obj.write_text(yaml.safe_dump({**body, "constraints": ["peak_memroy_bytes <= device"]}))
    run = {"space": str(DATA / "toy-space.yaml"), "models": ["m-a"], "gpus": {"h100": "c"}}
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": "toy", "trials": 6, "sampler": "random", "date": "2026-02-01",
        "runs": [{**run, "objective": str(DATA / "toy-objective.yaml")},
                 {**run, "objective": str(obj)}]}))
    with pytest.raises(ConfigError, match="peak_memroy_bytes"):
        run_sweep(load_sweep(sweep), tmp_path / "ds", workers=0)
    obj.write_text(yaml.safe_dump({**body, "constraints": ["peak_memory_bytes <= device"]}))
    summaries = run_sweep(load_sweep(sweep), tmp_path / "ds", workers=0)
    assert [s["num_trials"] for s in summaries] == [6, 6]
    assert [s["num_new_trials"] for s in summaries] == [0, 6]


# ---------------------------------------------------------------- F13 Ctrl-C
def test_interrupt_writes_the_outputs_of_the_stored_trials(toy_space, toy_objective, tmp_path):
    out = tmp_path / "i"
    seen = []

    def stop_after_25(rec):
        seen.append(rec)
        if len(seen) == 25:
            raise KeyboardInterrupt

    with pytest.raises(SearchInterrupted) as e:
        run_search(toy_space, toy_objective,
                   SearchOptions(trials=80, workers=0, sampler="tpe", seed=2,
                                 out_dir=str(out)), on_record=stop_after_25)
    stored = len(_stored_trials(out))
    assert e.value.num_stored == stored >= 25 and e.value.trials == 80
    assert str(e.value) == (f"interrupted: {stored}/80 trials stored in {out}/study.journal; "
                            f"outputs for them written to {out}; run the same command to "
                            f"resume")
    assert pq.read_table(out / "trials.parquet").num_rows == stored
    assert (out / "pareto.parquet").exists() and (out / "pareto.html").exists()


def test_search_cli_sigint_says_how_many_trials_are_stored(tmp_path):
    out = tmp_path / "sig"
    cmd = [sys.executable, "-c", "import sys; from charon_search.cli import main; "
           "sys.exit(main())", "search", str(DATA / "toy-space.yaml"),
           "--objective", str(DATA / "toy-objective.yaml"), "--trials", "1000000",
           "--workers", "0", "--sampler", "random", "--out", str(out), "--quiet", "--no-html"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    journal = out / "study.journal"
    deadline = time.monotonic() + 120
    while (not journal.exists() or journal.stat().st_size < 200_000) and \
            time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    stored = pq.read_table(out / "trials.parquet").num_rows
    assert stored > 0
    assert f"{stored}/1000000 trials stored in {journal}" in err
    assert "run the same command to resume" in err


# ---------------------------------------------------------------- F10 JSON config values
def test_mapping_and_list_values_are_written_as_json(tmp_path):
    workload = {"num_requests": 400, "input_len": {"kind": "fixed", "value": 2048},
                "stream": True, "seed": None}
    write_parquet([{"trial_number": 0, "workload": workload, "rates": [1.5, 2]},
                   {"trial_number": 1, "workload": None, "rates": [3]}], tmp_path / "t.parquet")
    rows = pq.read_table(tmp_path / "t.parquet").to_pylist()
    assert rows[0]["workload"] == ('{"input_len": {"kind": "fixed", "value": 2048}, '
                                   '"num_requests": 400, "seed": null, "stream": true}')
    assert json.loads(rows[0]["workload"]) == workload
    assert [r["rates"] for r in rows] == ["[1.5, 2]", "[3]"]


# ---------------------------------------------------------------- F11 sweep pareto flags
def test_front_flags_mark_equivalent_configs_and_memo_hits():
    obj = _objective()
    rows = [
        {"trial_number": 0, "tp": 1, "feasible": True, "step_time_s": 1.0, "gpu_s_per_token": 2.0},
        {"trial_number": 1, "tp": 2, "feasible": True, "step_time_s": 1.0, "gpu_s_per_token": 2.0},
        {"trial_number": 2, "tp": 1, "feasible": True, "step_time_s": 1.0, "gpu_s_per_token": 2.0,
         "memo_hit": True},
        {"trial_number": 3, "tp": 4, "feasible": True, "step_time_s": 2.0, "gpu_s_per_token": 1.0},
        {"trial_number": 4, "tp": 8, "feasible": True, "step_time_s": 3.0, "gpu_s_per_token": 3.0},
        {"trial_number": 5, "tp": 16, "feasible": False, "step_time_s": 1.0,
         "gpu_s_per_token": 2.0},
    ]
    front = pareto_rows(rows, obj, ["tp"])
    assert [(r["trial_number"], r["num_equivalent"]) for r in front] == [(0, 2), (3, 1)]
    assert front_flags(rows, front, obj) == [True, True, True, True, False, False]


def test_sweep_pareto_column_marks_every_row_on_the_front(tmp_path):
    """Minimising (num_gpus, dp): every feasible 8-GPU dp=1 layout (tp*pp = 8, any micro-batch,
    recompute or ZeRO stage) is on the front, with one and the same objective vector."""
    obj = tmp_path / "gpus-dp.yaml"
    obj.write_text(yaml.safe_dump({
        "name": "gpus-dp", "constraints": ["peak_memory_bytes <= device"],
        "objectives": [{"metric": "num_gpus", "direction": "minimize"},
                       {"metric": "dp", "direction": "minimize"}]}))
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": "toy", "trials": 100_000, "sampler": "grid", "date": "2026-03-01",
        "runs": [{"space": str(DATA / "toy-space.yaml"), "objective": str(obj),
                  "models": ["m-a"], "gpus": {"h100": "c-h100"}}]}))
    run_sweep(load_sweep(sweep), tmp_path / "ds", workers=0)
    rows = read_sweep(tmp_path / "ds").to_pylist()
    flagged = {r["trial_number"] for r in rows if r["pareto"]}
    expected = {r["trial_number"] for r in rows
                if r["feasible"] and r["num_gpus"] == 8 and r["dp"] == 1}
    assert flagged == expected and len(expected) > 1
    feas = [r for r in rows if r["feasible"]]                # the brute-force front agrees
    assert flagged == {feas[i]["trial_number"] for i in _all_pairs(
        [[r["num_gpus"], r["dp"]] for r in feas])}
    reps = [r for r in rows if r["pareto_representative"]]
    assert [r["trial_number"] for r in reps] == [min(expected)]
    # F8: the per-combination studies write no pareto.html (each embedded plotly.js)
    assert not list((tmp_path / "ds").rglob("*.html"))


# ---------------------------------------------------------------- F12 part-file types
def test_empty_columns_take_their_types_so_dates_unify(tmp_path):
    root = tmp_path / "ds"
    full = pa.table({"trial_number": [0, 1], "error": [False, True],
                     "memory.reason": ["fits", None], "x": [1.0, 2.0]})
    empty = pa.table({"trial_number": [0], "error": pa.array([None], pa.null()),
                      "memory.reason": pa.array([None], pa.null()),
                      "x": pa.array([None], pa.null())})
    a = root / "date=a" / "p.parquet"
    a.parent.mkdir(parents=True)
    pq.write_table(_uniform_types(full, frozenset({"trial_number"})), a)
    typed = _uniform_types(empty, frozenset({"trial_number"}), _known_types(root))
    assert typed.schema.field("error").type == pa.bool_()
    assert typed.schema.field("memory.reason").type == pa.string()
    assert typed.schema.field("x").type == pa.float64()
    # with nothing known: bookkeeping types, text by name, numbers otherwise
    alone = _uniform_types(empty, frozenset({"trial_number"}))
    assert [alone.schema.field(c).type for c in ("error", "memory.reason", "x")] == [
        pa.bool_(), pa.string(), pa.float64()]


def test_read_sweep_reads_files_whose_empty_columns_were_typed_apart(tmp_path):
    # as older sweeps wrote them: an all-empty `error` as string, `memory.reason` as double
    root = tmp_path / "ds"
    for date, table in (
            ("a", pa.table({"trial_number": [0, 1], "error": [False, True],
                            "memory.reason": ["fits", None]})),
            ("b", pa.table({"trial_number": [0], "error": pa.array([None], pa.string()),
                            "memory.reason": pa.array([None], pa.float64())}))):
        path = root / f"date={date}" / "part.parquet"
        path.parent.mkdir(parents=True)
        pq.write_table(table, path)
    table = read_sweep(root)
    assert table.schema.field("error").type == pa.bool_()
    assert table.schema.field("memory.reason").type == pa.string()
    assert sorted(zip(table.column("date").to_pylist(), table.column("error").to_pylist(),
                      strict=True), key=str) == [("a", False), ("a", True), ("b", None)]


# ---------------------------------------------------------------- F9 axis units
@pytest.mark.parametrize(("metric", "title"), [
    ("step_time_s", "step_time_s [s] (minimize)"),
    ("cost_per_million_tokens_usd", "cost_per_million_tokens_usd [USD] (minimize)"),
    ("peak_memory_bytes", "peak_memory_bytes [GiB] (minimize)"),
    ("ttft_s.p90", "ttft_s.p90 [s] (minimize)"),
    ("tokens_per_s_per_gpu", "tokens_per_s_per_gpu (minimize)"),
    ("tokens_per_s", "tokens_per_s (minimize)"),
])
def test_axis_titles_carry_units_from_the_name(metric, title):
    assert axis_title(metric, "minimize") == title


def test_pareto_html_scales_bytes_and_notes_unplotted_objectives(tmp_path):
    obj = Objective.from_dict({"name": "o", "objectives": [
        {"metric": "peak_memory_bytes", "direction": "minimize"},
        {"metric": "step_time_s", "direction": "minimize"},
        {"metric": "gpu_s_per_token", "direction": "minimize"}]})
    rows = [{"trial_number": 0, "feasible": True, "peak_memory_bytes": 3 * 2**30,
             "step_time_s": 1.25, "gpu_s_per_token": 0.5}]
    path = tmp_path / "p.html"
    write_pareto_html(rows, rows, obj, [], path, "t")
    html = path.read_text()
    assert "peak_memory_bytes [GiB] (minimize)" in html and "step_time_s [s] (minimize)" in html
    assert "3 objectives, the first 2 plotted" in html and "gpu_s_per_token" in html
    assert '"x":[3.0]' in html and '"y":[1.25]' in html       # bytes plotted as GiB
