"""SLO-constrained serving search end to end (review): the serving bridge, its space checks and
validity rules, and what a search writes (SLO feasibility, GPU counts, Pareto front, resume)."""

from __future__ import annotations

import copy
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from charon_search.errors import ConfigError
from charon_search.search import SearchOptions, non_dominated, run_search
from charon_search.search.objective import Objective
from charon_search.search.rules import CONSTRAINTS, RuleContext
from charon_search.search.space import SearchSpace
from charon_search.search.worker import evaluate_config

ROOT = Path(__file__).resolve().parents[2]
SERVING_SPACE = ROOT / "spaces" / "llama3-70b-serving-disagg.yaml"

#: A small serving space: Qwen3-0.6B on one 8-GPU H100 node, aggregated (tp x dp) or
#: disaggregated (prefill and decode pools of 1-2 replicas of TP 1-2), two loads.
SMALL_SPACE = {
    "name": "small-serving", "evaluator": "serving",
    "fixed": {"model": "qwen3-0.6b", "cluster": "h100-sxm-8gpu", "engine": "vllm",
              "min_gpus": 1, "max_gpus": 8,
              "workload": {"arrival": "concurrency", "num_requests": 32,
                           "input_len": {"kind": "fixed", "value": 512},
                           "output_len": {"kind": "fixed", "value": 32}, "seed": 0}},
    "params": {
        "mode": {"type": "categorical", "choices": ["aggregated", "disaggregated"]},
        "tp": {"type": "log_int", "low": 1, "high": 2, "base": 2},
        "dp": {"type": "log_int", "low": 1, "high": 2, "base": 2},
        "prefill_tp": {"type": "log_int", "low": 1, "high": 2, "base": 2},
        "prefill_replicas": {"type": "log_int", "low": 1, "high": 2, "base": 2},
        "decode_tp": {"type": "log_int", "low": 1, "high": 2, "base": 2},
        "decode_replicas": {"type": "log_int", "low": 1, "high": 2, "base": 2},
        "workload_concurrency": {"type": "categorical", "choices": [4, 32]},
    },
    "normalize": ["disaggregation"],
    "constraints": ["serving_gpus_in_range", "tp_within_node", "tp_divides_heads",
                    "gpus_fit_cluster"],
}
TTFT_SLO, TPOT_SLO = 0.1, 0.012
SLO = {"name": "slo", "objectives": [
    {"metric": "tokens_per_s_per_gpu", "direction": "maximize"},
    {"metric": "tokens_per_s_per_user", "direction": "maximize"}],
    "constraints": [f"ttft_s.p90 <= {TTFT_SLO}", f"tpot_s.p90 <= {TPOT_SLO}",
                    "num_gpus <= budget"], "limits": {"budget": 8}}


def _llama(edit) -> dict:
    data = copy.deepcopy(yaml.safe_load(SERVING_SPACE.read_text()))
    edit(data)
    return data


def _expected_gpus(r: dict) -> int:
    if r["mode"] == "disaggregated":
        return r["prefill_replicas"] * r["prefill_tp"] + r["decode_replicas"] * r["decode_tp"]
    return r["tp"] * r["dp"]


@pytest.fixture
def affine_serving(monkeypatch):
    """``simulate_serving`` with a closed-form iteration cost (5 ms + 20 us per token + 0.1 us
    per key read), so the search runs its real scheduler, KV capacity and pools without
    training cost predictors (tens of seconds on a cold cache)."""
    import charon_search.serving as serving
    from charon_search.serving import AffineIterationCostModel

    real = serving.simulate_serving

    def simulate(*args, **kw):
        kw.setdefault("cost_model", AffineIterationCostModel(
            base_s=5e-3, per_token_s=2e-5, per_kv_token_s=1e-7, per_attention_pair_s=0.0))
        return real(*args, **kw)

    monkeypatch.setattr(serving, "simulate_serving", simulate)


# ------------------------------------------------------------------ end to end (no fix)
def test_small_serving_grid_slo_gpus_front_and_resume(tmp_path, affine_serving):
    space = SearchSpace.from_dict(SMALL_SPACE, path="small.yaml")
    objective = Objective.from_dict(SLO, path="slo.yaml")
    opts = SearchOptions(trials=1000, workers=0, sampler="grid", out_dir=str(tmp_path),
                         html=False)
    res = run_search(space, objective, opts)
    # aggregated 2 tp x 2 dp x 2 loads = 8, disaggregated 2**4 pools x 2 loads = 32: every
    # one uses 1..8 GPUs, so all 40 are valid and simulated once
    assert res.num_trials == 40 and res.num_invalid == 0 and res.num_evaluations == 40
    rows = pq.read_table(tmp_path / "trials.parquet").to_pylist()
    assert len(rows) == 40
    for r in rows:
        assert r["num_gpus"] == _expected_gpus(r)
        assert r["tokens_per_s_per_gpu"] == pytest.approx(r["output_tokens_per_s"]
                                                          / r["num_gpus"], rel=1e-9)
        meets = r["ttft_s.p90"] <= TTFT_SLO and r["tpot_s.p90"] <= TPOT_SLO
        assert bool(r["feasible"]) == meets
        if not meets:
            assert r["prune_reason"].startswith("constraint: ")
            assert ("ttft_s.p90 <= 0.1" in r["prune_reason"]) == (r["ttft_s.p90"] > TTFT_SLO)
    feasible = [r for r in rows if r["feasible"]]
    assert 0 < len(feasible) < 40
    # both SLOs bind somewhere (a TPOT-only miss too), and budget 8 never does (max_gpus 8)
    assert any("tpot_s.p90 <= 0.012" in (r["prune_reason"] or "") for r in rows)
    assert max(r["num_gpus"] for r in rows) == 8
    # the front written is the one recomputed from trials.parquet
    losses = [[-r["tokens_per_s_per_gpu"], -r["tokens_per_s_per_user"]] for r in feasible]
    front = {feasible[i]["trial_number"] for i in non_dominated(losses)}
    written = pq.read_table(tmp_path / "pareto.parquet").to_pylist()
    assert {r["trial_number"] for r in written} <= front
    assert ({(r["tokens_per_s_per_gpu"], r["tokens_per_s_per_user"]) for r in written}
            == {(feasible[i]["tokens_per_s_per_gpu"], feasible[i]["tokens_per_s_per_user"])
                for i in non_dominated(losses)})
    # the same command again: resumes, nothing new, nothing duplicated
    again = run_search(space, objective, opts)
    assert again.num_trials == 40 and again.num_new_trials == 0
    rows2 = pq.read_table(tmp_path / "trials.parquet").to_pylist()
    assert len(rows2) == 40 and len({r["uid"] for r in rows2}) == 40


def test_model_that_does_not_fit_at_tp1_is_pruned_with_its_weights_in_the_reason():
    space = SearchSpace.from_dict(SMALL_SPACE, path="small.yaml").with_fixed(
        model="llama-3.1-70b")
    cfg, reason = space.config({"mode": "aggregated", "tp": 1, "dp": 1, "prefill_tp": 1,
                                "prefill_replicas": 1, "decode_tp": 1, "decode_replicas": 1,
                                "workload_concurrency": 4})
    assert reason is None
    rec = evaluate_config({}, "serving", cfg)
    assert rec["feasible"] is False and rec["error"] is False
    # 70.6e9 bf16 weights = 131.4 GiB on one 80 GB H100
    assert "leaves no room for KV cache" in rec["prune_reason"]
    assert "131.4 GiB weights per GPU" in rec["prune_reason"]
    assert rec["prune_reason"].startswith("infeasible: ")
    # the pruned record keeps the deployment's columns: 1 GPU, an H100's 79.18 GiB
    assert rec["num_gpus"] == 1 and rec["mode"] == "aggregated"
    assert rec["device_memory_bytes"] == 85018877624


# ------------------------------------------------------------------ fixes: space loading
def test_misspelt_pool_cluster_names_the_fixed_key():
    # before: loaded fine, then the `gpus_fit_cluster` rule raised in the driver mid-search
    with pytest.raises(ConfigError, match=r"`fixed.decode_cluster`.*unknown cluster 'nope'"):
        SearchSpace.from_dict(_llama(lambda d: d["fixed"].update(decode_cluster="nope")),
                              path="s.yaml")


def test_bad_kv_transfer_is_blamed_on_itself_not_on_the_mode_choice():
    with pytest.raises(ConfigError) as e:
        SearchSpace.from_dict(_llama(lambda d: d["fixed"].update(kv_transfer="pigeon")),
                              path="s.yaml")
    msg = str(e.value)
    assert "`fixed.kv_transfer`" in msg and "'pigeon'" in msg and "['rdma', 'nvlink']" in msg
    assert "params.mode" not in msg and len(msg.splitlines()) == 1


@pytest.mark.parametrize(("key", "value", "pattern"), [
    ("max_gpus", "lots", r"`fixed.max_gpus`.*integer >= 1.*'lots'"),
    ("min_gpus", 128, r"`min_gpus` must be <= `max_gpus`, but got min_gpus=128 > max_gpus=64"),
    ("spec_k", -1, r"`fixed.spec_k`.*integer >= 0.*-1"),
    ("gpu_memory_utilization", 2.0, r"`fixed.gpu_memory_utilization`.*2.0"),
], ids=["max_gpus-str", "min-above-max", "spec_k-negative", "memory-fraction"])
def test_bad_search_only_values_fail_when_the_space_loads(key, value, pattern):
    # before: 'lots' raised ValueError in a rule mid-search; 128 > 64 made all trials
    # invalid; -1 was read as "no speculation"; 2.0 was blamed on "`fixed` (or a range)"
    with pytest.raises(ConfigError, match=pattern):
        SearchSpace.from_dict(_llama(lambda d: d["fixed"].update({key: value})), path="s.yaml")


def test_cuda_graph_max_zero_is_rejected_not_silently_the_default():
    def edit(d):
        d["params"]["cuda_graph_max"]["choices"] = [0, 64]
        d["example"]["cuda_graph_max"] = 64

    with pytest.raises(ConfigError, match=r"`params.cuda_graph_max.choices` holds 0"):
        SearchSpace.from_dict(_llama(edit), path="s.yaml")


def test_misspelt_param_is_named_before_the_example_mismatch():
    def edit(d):
        d["params"]["workload_concurency"] = d["params"].pop("workload_concurrency")

    with pytest.raises(ConfigError, match=r"`params.workload_concurency` is not a config key.*"
                                          r"did you mean \['workload_concurrency'"):
        SearchSpace.from_dict(_llama(edit), path="s.yaml")


# ------------------------------------------------------------------ fixes: validity rules
def test_ep_must_divide_tp_as_the_simulator_requires():
    ctx = RuleContext()
    rule = CONSTRAINTS.get("ep_divides_replica")
    # tp=2, pp=2: ep=4 divided tp*pp=4 (rule passed) but the simulator rejects ep∤tp
    assert rule({"tp": 2, "pp": 2, "ep": 4}, ctx) == "ep=4 must divide tp=2"
    assert rule({"tp": 4, "pp": 2, "ep": 4}, ctx) is None
    assert rule({"decode_tp": 2, "decode_pp": 2, "decode_ep": 4}, ctx) == \
        "decode_ep=4 must divide decode_tp=2"
    cfg = {"model": "qwen3-30b-a3b", "cluster": "h100-sxm-8gpu", "tp": 2, "pp": 2, "ep": 4,
           "workload": {"num_requests": 4, "arrival": "concurrency", "concurrency": 4}}
    rec = evaluate_config({}, "serving", cfg)
    assert rec["prune_reason"].startswith("invalid: `ep` must divide `tp`")


def test_disaggregated_pools_fit_their_own_clusters():
    ctx = RuleContext()
    rule = CONSTRAINTS.get("gpus_fit_cluster")
    cfg = {"mode": "disaggregated", "cluster": "dgx-h100-ib400",
           "prefill_cluster": "h100-sxm-8gpu", "prefill_replicas": 1, "prefill_tp": 8,
           "decode_replicas": 2, "decode_tp": 8, "num_gpus": 24}
    # 8 prefill GPUs on the 8-GPU node, 16 decode GPUs on the 8,192-GPU cluster: fits
    # (before: all 24 were compared with the 8-GPU node)
    assert rule(cfg, ctx) is None
    assert rule({**cfg, "prefill_replicas": 2, "num_gpus": 32}, ctx) == \
        "16 GPUs exceed cluster h100-sxm-8gpu's 8"
    # both pools on one cluster count together: 8 + 8 > 8
    one = {**cfg, "cluster": "h100-sxm-8gpu", "prefill_cluster": None, "decode_replicas": 1,
           "num_gpus": 16}
    assert rule(one, ctx) == "16 GPUs exceed cluster h100-sxm-8gpu's 8"


# ------------------------------------------------------------------ fixes: the price
def test_disaggregated_price_counts_each_pool_on_its_cluster_or_none():
    import dataclasses

    from charon_search.search.serving_bridge import deployment_usd_per_s, serving_config_from

    ctx = RuleContext()
    h100 = ctx.cluster("h100-sxm-8gpu")  # $2.99 per GPU-hour
    cfg = {"mode": "disaggregated", "prefill_replicas": 1, "prefill_tp": 2,
           "decode_replicas": 2, "decode_tp": 1, "decode_cluster": "h200-sxm-8gpu"}  # $3.79
    config = serving_config_from(cfg)
    # 2 x $2.99 + 2 x $3.79 = $13.56 per hour
    assert deployment_usd_per_s(ctx, h100, config) * 3600 == pytest.approx(13.56)
    # an unpriced decode cluster: no price (before: the prefill pool's $5.98/h alone)
    unpriced = RuleContext(clusters={"h200-sxm-8gpu": dataclasses.replace(
        ctx.cluster("h200-sxm-8gpu"), cost_per_gpu_hour_usd=0.0)})
    assert deployment_usd_per_s(unpriced, h100, config) is None
    assert deployment_usd_per_s(ctx, h100, serving_config_from({"tp": 2, "dp": 3})) * 3600 \
        == pytest.approx(6 * 2.99)


# ------------------------------------------------------------------ fixes: pool keys
def test_pool_batching_and_dp_attention_are_searchable_per_pool():
    from charon_search.search.serving_bridge import serving_config_from

    def edit(d):
        d["params"]["decode_max_num_seqs"] = {"type": "categorical", "choices": [256, 512]}
        d["fixed"]["prefill_max_num_batched_tokens"] = 16384
        d["example"]["decode_max_num_seqs"] = 512

    # before: "`params.decode_max_num_seqs` is not a config key of the 'serving' evaluator"
    space = SearchSpace.from_dict(_llama(edit), path="s.yaml")
    cfg, reason = space.config(space.example)
    assert reason is None and cfg["mode"] == "disaggregated"
    config = serving_config_from({**cfg, "decode_dp_attention": True})
    assert config.disagg.decode.max_num_seqs == 512
    assert config.disagg.prefill.max_num_batched_tokens == 16384
    assert config.disagg.decode.dp_attention is True and config.disagg.prefill.dp_attention is None
    assert config.num_gpus == 1 * 4 + 1 * 4
