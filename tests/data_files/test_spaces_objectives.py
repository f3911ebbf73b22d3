"""Every shipped space, objective and sweep file loads and validates; each space's example point
is valid and runs once through its real evaluator (the training/serving simulators)."""

from __future__ import annotations

from pathlib import Path

import pytest

from charon_search.search import RuleContext, load_objective, load_space
from charon_search.search.sweep import load_sweep

ROOT = Path(__file__).resolve().parents[2]
SPACES = sorted((ROOT / "spaces").glob("*.yaml"))
OBJECTIVES = sorted((ROOT / "objectives").glob("*.yaml"))
SWEEPS = sorted((ROOT / "sweeps").glob("*.yaml"))

REQUIRED_SPACES = {"quickstart-llama8b-training", "llama3-405b-training-16k",
                   "deepseek-v3-training-2k", "llama3-70b-serving-disagg",
                   "qwen3-30b-a3b-serving-ep"}


def test_shipped_sets():
    assert REQUIRED_SPACES <= {p.stem for p in SPACES}
    assert {"train-fast-cheap", "slo-ttft1s-tpot50ms"} <= {p.stem for p in OBJECTIVES}
    assert SWEEPS


@pytest.mark.parametrize("path", OBJECTIVES, ids=lambda p: p.stem)
def test_objective_loads(path):
    o = load_objective(path)
    assert o.name == path.stem and o.terms


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_sweep_loads_and_refers_to_shipped_files(path):
    spec = load_sweep(path)
    for e in spec.entries:
        load_space(ROOT / e.space)
        load_objective(ROOT / e.objective)


@pytest.mark.parametrize("path", SPACES, ids=lambda p: p.stem)
def test_space_loads_and_example_is_valid(path):
    s = load_space(path)
    assert s.name == path.stem
    assert s.example, "every shipped space names an example point"
    cfg, reason = s.config(s.example)
    assert reason is None
    assert s.check(cfg, RuleContext()) is None


@pytest.mark.slow
@pytest.mark.parametrize("path", SPACES, ids=lambda p: p.stem)
def test_space_example_runs_through_its_simulator(path):
    from charon_search.search.worker import evaluate_config

    s = load_space(path)
    cfg, _ = s.config(s.example)
    rec = evaluate_config({}, s.evaluator, cfg)
    assert rec["error"] is False, rec["prune_reason"]
    assert rec["feasible"] is True, rec["prune_reason"]
    assert rec["num_gpus"] > 0 and rec["device_memory_bytes"] > 0
    if s.evaluator == "training":
        assert rec["step_time_s"] > 0 and 0 < rec["mfu"] < 1
        assert rec["peak_memory_bytes"] <= rec["device_memory_bytes"]
        assert rec["cost_per_million_tokens_usd"] > 0
    else:
        assert rec["ttft_s.p90"] > 0 and rec["tpot_s.p90"] > 0
        assert rec["tokens_per_s_per_gpu"] > 0
