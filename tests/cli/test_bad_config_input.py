"""Bad values in layout and serving inputs: one clear error naming the field, exit 2, never a
traceback or a silently different run (``config_fields.typed_kwargs`` and the CLI checks)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from charon_search.cli import main
from charon_search.config_fields import typed_kwargs
from charon_search.errors import ConfigError
from charon_search.hardware import load_gpu
from charon_search.layout import Layout
from charon_search.serving import ServingConfig, WorkloadSpec
from charon_search.serving.workload import read_trace

TRAIN = ["train", "--model", "debug-llama", "--cluster", "h100-sxm-8gpu", "--gpus", "8"]
TRACE = str(Path(__file__).parents[2] / "charon_search" / "data" / "traces"
            / "splitwise_conv_2k.csv")
SERVE = ["serve", "--model", "debug-llama", "--cluster", "h100-sxm-8gpu", "--num-requests", "4",
         "--no-progress"]


@pytest.mark.parametrize("value, needle", [
    ({"sequence_parallel": "false"}, "`sequence_parallel` must be true or false, but got 'false'"),
    ({"async_tp": 5}, "`async_tp` must be true or false"),
    ({"recompute_num_layers": "3"}, "`recompute_num_layers` must be an integer"),
    ({"recompute_modules": 5}, "`recompute_modules` must be a list of strings"),
    ({"expert_load_imbalance": "high"}, "`expert_load_imbalance` must be a number"),
    ({"micro_batch_size": [1, 2]}, "`micro_batch_size` must be an integer"),
    ({"seq_len": 4096.5}, "`seq_len` must be an integer"),
    ({"tensor_paralel": 2}, "did you mean"),
])
def test_layout_values_of_the_wrong_kind(value, needle) -> None:
    with pytest.raises(ConfigError, match=None) as e:
        Layout.from_dict({"tp": 2, **value}, where="l.yaml")
    assert needle in str(e.value) and str(e.value).startswith("l.yaml: ")


def test_the_kinds_a_yaml_file_writes_are_accepted() -> None:
    """YAML integers for float fields, lists for tuples, a space-separated module list."""
    lay = Layout.from_dict({"tp": 2, "sequence_parallel": True, "expert_load_imbalance": 2,
                            "recompute": "selective", "recompute_modules": "layernorm mlp"})
    assert lay.expert_load_imbalance == 2 and lay.recompute_modules == ("layernorm", "mlp")
    assert ServingConfig.from_dict({"cuda_graph_sizes": [1, 2, 4],
                                    "gpu_memory_utilization": 1}).cuda_graph_sizes == (1, 2, 4)
    with pytest.raises(ConfigError, match="must be a mapping of Layout fields"):
        typed_kwargs(Layout, [("tp", 2)], "l.yaml")


@pytest.mark.parametrize("layout, needle", [
    ("hsdp_shard: -2\nzero_stage: 1\n", "`hsdp_shard` must be an integer >= 0, but got -2"),
    ("recompute: full\nrecompute_num_layers: -3\n", "`recompute_num_layers` must be an integer"),
    ("sequence_parallel: maybe\n", "must be true or false, but got 'maybe'"),
])
def test_train_layout_file_errors_exit_2(tmp_path, capsys, layout, needle) -> None:
    f = tmp_path / "layout.yaml"
    f.write_text("tp: 2\n" + layout)
    assert main([*TRAIN, "--layout", str(f)]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


@pytest.mark.parametrize("flag", ["--tp", "--pp", "--cp"])
def test_zero_degree_flags_exit_2(capsys, flag) -> None:
    assert main([*TRAIN, flag, "0"]) == 2
    assert f"`{flag[2:]}` must be a positive integer, but got 0" in capsys.readouterr().err
    assert main(["memory", "--model", "debug-llama", "--cluster", "h100-sxm-8gpu", "--gpus", "8",
                 flag, "0"]) == 2


def test_negative_gpu_count_names_gpus(capsys) -> None:
    assert main([*TRAIN[:-1], "-8"]) == 2
    assert "`--gpus` must be a positive integer, but got -8" in capsys.readouterr().err


@pytest.mark.parametrize("config, needle", [
    ("chunked_prefill: 'no'\n", "`chunked_prefill` must be true or false, but got 'no'"),
    ("gpu_memory_utilization: high\n", "`gpu_memory_utilization` must be a number"),
    ("cuda_graph_sizes: 64\n", "`cuda_graph_sizes` must be a list of integers"),
    ("speculative: 3\n", "`speculative` must be a mapping of SpeculativeConfig fields"),
    ("workload: [1, 2]\n", "`workload` must be a mapping of WorkloadSpec fields"),
    ("workload: {arrival: concurrency, concurency: 4}\n", "did you mean ['concurrency']"),
    ("workload: {concurrency: '4'}\n", "workload: `concurrency` must be an integer"),
    ("workload: {input_len: {kind: fixed, value: '256'}}\n",
     "workload.input_len (serve --input-len): `value` must be an integer"),
    ("workload: {seed: -3}\n",
     "`workload.seed` (serve --seed) must be an integer in [0, 2**32 - 1], but got -3"),
    ("workload: {input_len: {kind: uniform, low: 64, high: 8}}\n",
     "workload.input_len (serve --input-len): `1 <= low <= high` must hold, but got "
     "(low=64, high=8)"),
])
def test_serve_config_file_errors_exit_2(tmp_path, capsys, config, needle) -> None:
    f = tmp_path / "serving.yaml"
    f.write_text(config)
    assert main([*SERVE, "--config", str(f)]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


@pytest.mark.parametrize("argv, needle", [
    (["--tp", "8", "--dp", "4"], "needs more GPUs than cluster 'h100-sxm-8gpu' holds: "
                                 "tp*pp*sp*dp = 32 > 8"),
    (["--disagg", "prefill=4xTP2,decode=2xTP4"], "prefill 4x2 = 8 + decode 2x4 = 8 > 8"),
    (["--disagg", "prefill=1xTP2,decode=1xTP2", "--tp", "4"], "but got --tp too"),
    (["--workload", "poisson", "--concurrency", "4"], "`--concurrency` applies to a concurrency"),
    (["--workload", "concurrency", "--concurrency", "4", "--rate", "2"], "`--rate` applies"),
    (["--spec-acceptance", "0.8"], "`--spec-acceptance` and `--spec-draft` need `--spec-k K`"),
    (["--spec-k", "2", "--spec-acceptance", "1.5"],
     "`speculative.acceptance_rate` (serve --spec-acceptance) must lie in [0, 1] (one number, "
     "or one per draft position), but got 1.5"),
    (["--seed", "-1"], "`workload.seed` (serve --seed) must be an integer in [0, 2**32 - 1], "
                      "but got -1"),
    (["--input-len", "-256"], "workload.input_len (serve --input-len): `length.value >= 1`"),
    (["--workload", "poison"], "a workload is one of ['poisson', 'gamma', 'concurrency', "
                               "'burst'] or a trace file"),
    (["--ep", "2"], "`ep > 1` needs a MoE model"),
    (["--spec-k", "0"], "`--spec-k` must be >= 1 draft tokens"),
    (["--spec-draft", "llama-3.1-8b"], "`--spec-acceptance` and `--spec-draft` need `--spec-k"),
    (["--spec-k", "2", "--model", "llama-3.1-8b"], "'mtp' needs a checkpoint with MTP layers"),
    (["--workload", TRACE, "--input-len", "64"],
     "`--input-len` applies to a poisson or gamma or concurrency or burst workload, but the "
     "workload is the trace"),
])
def test_serve_flag_errors_exit_2(capsys, argv, needle) -> None:
    assert main([*SERVE, *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


@pytest.mark.parametrize("rows, needle", [
    ("0.0,abc,64", "`prompt_tokens` must be a whole number >= 1 in every row, but row 1"),
    ("0.0,,64", "`prompt_tokens` must be a whole number >= 1 in every row, but row 1 holds None"),
    ("0.0,-512,64", "row 1 holds -512"),
    ("0.0,512.7,64", "row 1 holds 512.7"),
    ("0.0,512,-3", "`output_tokens` must be a whole number >= 0"),
])
def test_trace_values_are_checked(tmp_path, rows, needle) -> None:
    f = tmp_path / "t.csv"
    f.write_text(f"arrived_at,prompt_tokens,output_tokens\n{rows}\n0.5,256,32\n")
    with pytest.raises(ConfigError) as e:
        read_trace(f)
    assert needle in str(e.value)


def test_trace_times_are_relative_and_zero_outputs_count_one(tmp_path) -> None:
    f = tmp_path / "t.csv"
    f.write_text("arrived_at,prompt_tokens,output_tokens\n-1.0,512,0\n-0.5,256,32\n")
    reqs = read_trace(f)
    assert [r.arrived_at_s for r in reqs] == [0.0, 0.5]
    assert [r.output_tokens for r in reqs] == [1, 32]
    with pytest.raises(ConfigError, match="time_scale > 0"):
        WorkloadSpec(arrival="trace", trace_path=str(f), time_scale=-1)


def test_gpu_attention_kernel_generation_is_checked() -> None:
    with pytest.raises(ConfigError, match=r"`attention_kernel_gen` of GPU h100-sxm-80gb must be "
                                          r"one of \[1, 2, 3\], but got 9"):
        dataclasses.replace(load_gpu("h100-sxm-80gb"), attention_kernel_gen=9)


def test_unknown_hf_model_type_names_the_close_ones(tmp_path, capsys) -> None:
    """One line with the closest transformers model types, not the ~1,000 it knows."""
    f = tmp_path / "config.json"
    f.write_text('{"model_type": "lamma", "hidden_size": 64}')
    assert main(["trace", str(f), "--seq", "128"]) == 2
    err = capsys.readouterr().err.strip()
    assert "transformers has no model_type 'lamma'; closest: ['llama'" in err
    assert len(err) < 300


def test_spec_errors_show_the_value_as_written(tmp_path, capsys) -> None:
    """A GiB field is checked in bytes but reported in the file's unit."""
    from pathlib import Path

    import charon_search

    shipped = Path(charon_search.__file__).parent / "cluster_specs" / "gpus" / "a100-sxm-80gb.yaml"
    text = shipped.read_text().replace("hbm_capacity_gib: 80", "hbm_capacity_gib: -80", 1)
    assert "hbm_capacity_gib: -80" in text
    f = tmp_path / "a100.yaml"
    f.write_text(text)
    assert main(["specs", "check", str(f)]) == 2
    assert "`hbm_capacity_gib` must be > 0, but got -80\n" in capsys.readouterr().err


def test_a_config_json_must_state_its_sizes(tmp_path, capsys) -> None:
    """A bare {"model_type": "llama"} would be transformers' Llama-2-7B defaults; GPT-2's own
    spellings (n_embd, n_layer, n_head) count as stated."""
    from charon_search.catalog import load_model

    bare = tmp_path / "bare.json"
    bare.write_text('{"model_type": "llama"}')
    assert main(["trace", str(bare), "--seq", "128"]) == 2
    assert ("must state hidden_size, num_hidden_layers, num_attention_heads, vocab_size, "
            "intermediate_size") in capsys.readouterr().err
    # A Llama config without its vocabulary and MLP width had built a 12.6 M-parameter model
    # from Llama-2-7B's 32,000 and 11,008.
    partial = tmp_path / "partial.json"
    partial.write_text('{"model_type": "llama", "hidden_size": 96, "num_hidden_layers": 2, '
                       '"num_attention_heads": 4}')
    assert main(["trace", str(partial), "--seq", "128"]) == 2
    assert "must state vocab_size, intermediate_size" in capsys.readouterr().err
    gpt2 = tmp_path / "gpt2.json"
    gpt2.write_text('{"model_type": "gpt2", "n_embd": 256, "n_layer": 2, "n_head": 4, '
                    '"vocab_size": 1000, "n_positions": 512}')
    spec = load_model(str(gpt2))
    assert (spec.hidden_size, spec.num_layers, spec.num_attention_heads) == (256, 2, 4)


# --------------------------------------------------------------- review of 2026-12-06
@pytest.mark.parametrize("change, needle", [
    ({"num_hidden_layers": 0}, "field `num_hidden_layers` must be a positive integer, but got 0"),
    ({"num_hidden_layers": -1}, "field `num_hidden_layers` must be a positive integer"),
    ({"vocab_size": 0}, "field `vocab_size` must be a positive integer, but got 0"),
    ({"num_attention_heads": 0}, "field `num_attention_heads` must be a positive integer"),
    ({"num_key_value_heads": 5}, "field `num_key_value_heads` must divide `num_attention_heads` "
                                 "(32), but got 5"),
    ({"num_key_value_heads": 64}, "must divide `num_attention_heads` (32), but got 64"),
])
def test_model_config_sizes_are_checked_before_transformers_builds_them(
        tmp_path, capsys, change, needle) -> None:
    import json

    from charon_search.catalog._loader import _configs_dir

    cfg = json.loads((_configs_dir() / "llama-3.1-8b.json").read_text())
    cfg.update(change)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    for argv in (["trace", str(path), "--seq", "128"],
                 ["serve", "--model", str(path), "--cluster", "h100-sxm-8gpu",
                  "--num-requests", "4", "--no-progress"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert needle in err and len(err.strip().splitlines()) == 1


def test_serving_ep_must_divide_the_replicas_tp(capsys) -> None:
    """Experts are sharded over a replica's GPUs: tp 1 with ep 8 is one GPU holding an eighth
    of the experts, which would fit Mixtral's 93 GB of bf16 weights on one 80 GB GPU."""
    argv = ["serve", "--model", "mixtral-8x7b", "--cluster", "h100-sxm-8gpu", "--tp", "1",
            "--ep", "8", "--num-requests", "4", "--no-progress"]
    assert main(argv) == 2
    assert "`ep` must divide `tp`" in capsys.readouterr().err


def test_training_precision_must_be_a_tensor_core_format_of_the_gpu(capsys) -> None:
    base = ["--model", "debug-llama", "--gpus", "8", "--gbs", "8"]
    assert main(["train", *base, "--cluster", "a100-sxm-8gpu", "--precision", "fp8"]) == 2
    assert ("`precision` 'fp8' is not a tensor-core format of a100-sxm-80gb (cluster "
            "a100-sxm-8gpu); allowed there: ['bf16', 'fp16']") in capsys.readouterr().err
    with pytest.raises(SystemExit):            # fp32 training is not modelled (no fp32 tables)
        main(["train", *base, "--cluster", "h100-sxm-8gpu", "--precision", "fp32"])
    assert "invalid choice: 'fp32'" in capsys.readouterr().err


def test_memory_checks_the_clusters_gpu_count_as_train_does(capsys) -> None:
    argv = ["--model", "debug-llama", "--cluster", "h100-sxm-8gpu", "--gpus", "64", "--gbs", "64"]
    for cmd in ("memory", "train"):
        assert main([cmd, *argv]) == 2
        assert "(64 > 8 in h100-sxm-8gpu)" in capsys.readouterr().err


def test_serving_precision_needs_the_gpus_tensor_cores_unless_weight_only() -> None:
    from charon_search.serving import simulate_serving

    wl = {"arrival": "concurrency", "concurrency": 2, "num_requests": 4,
          "input_len": {"value": 128}, "output_len": {"value": 8}}
    for model, cluster, precision in (("llama-3.1-8b", "h100-sxm-8gpu", "fp4"),
                                      ("llama-3.1-8b", "a100-sxm-8gpu", "fp8")):
        # llama-3.1-8b ships no quantized checkpoint: the message says the one it prices is
        # assumed, not "llama-3.1-8b's fp4 checkpoint".
        with pytest.raises(ConfigError, match=rf"`precision` '{precision}': no {precision} "
                                              r"checkpoint of llama-3.1-8b is shipped, .* has "
                                              r"no tensor cores for"):
            simulate_serving(model, cluster, {"precision": precision}, wl)
    # gpt-oss's fp4 checkpoint quantizes only its experts, in MXFP4 (weight-only on Hopper)
    rep = simulate_serving("gpt-oss-120b", "h100-sxm-8gpu", {"tp": 2, "precision": "fp4"}, wl)
    assert rep.num_completed == 4


def test_a_report_of_one_token_outputs_is_strict_json_with_null_tpot(tmp_path, capsys) -> None:
    import json

    trace = tmp_path / "t.csv"
    trace.write_text("arrived_at,prompt_tokens,output_tokens\n0,64,1\n0.1,64,1\n")
    out = tmp_path / "o.json"
    assert main([*SERVE[:5], "--workload", str(trace), "--no-progress", "--json",
                 str(out)]) == 0
    assert "TPOT mean n/a" in capsys.readouterr().out
    data = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    assert data["tpot_s"]["mean"] is None and data["ttft_s"]["mean"] > 0


def test_a_closed_loop_needs_as_many_requests_as_streams() -> None:
    with pytest.raises(ConfigError, match=r"`workload.concurrency` \(100\) must be <= "
                                          r"`workload.num_requests` \(10\)"):
        WorkloadSpec(arrival="concurrency", concurrency=100, num_requests=10)
    with pytest.raises(ConfigError, match=r"`workload.ramp_up_s` must be >= 0 seconds"):
        WorkloadSpec(arrival="concurrency", concurrency=4, ramp_up_s=-1.0)


def test_layout_flags_and_files_agree_and_contradictions_are_errors(tmp_path, capsys) -> None:
    lay = tmp_path / "lay.yaml"
    lay.write_text("tp: 2\npp: 2\n")
    # a YAML pp > 1 picks 1f1b as the --pp flag does
    assert main(["memory", "--model", "debug-llama", "--cluster", "h100-sxm-8gpu", "--gpus",
                 "4", "--layout", str(lay)]) == 0
    capsys.readouterr()
    for extra, needle in (
            (["--vpp", "2", "--gbs", "16"], "`vpp > 1` (virtual pipeline stages) needs pp > 1"),
            (["--gbs", "8", "--fp8-recipe", "rowwise"],
             "`--fp8-recipe` applies only with `precision` 'fp8', but got precision='bf16'"),
            (["--gbs", "8", "--selective-policy", "op"],
             "`--selective-policy` applies only with `recompute` 'selective'"),
            (["--gbs", "8", "--fsdp-backward-prefetch", "post"],
             "`--fsdp-backward-prefetch` applies only with `zero_stage` 3")):
        assert main([*TRAIN, *extra]) == 2
        assert needle in capsys.readouterr().err


def test_a_sequence_beyond_the_models_context_is_a_warning() -> None:
    from charon_search.catalog import load_model
    from charon_search.training.step import validate_layout

    spec = load_model("llama-3.1-8b")
    warns = validate_layout(spec, Layout(seq_len=262144, global_batch_size=1), None)
    assert any("exceeds llama-3.1-8b's context of 131,072 tokens" in w for w in warns)
    assert not any("context" in w for w in
                   validate_layout(spec, Layout(seq_len=8192, global_batch_size=1), None))


def test_ramp_up_applies_to_closed_loops_and_specs_suggest_close_names(capsys) -> None:
    assert main([*SERVE, "--workload", "poisson", "--rate", "2", "--ramp-up", "5"]) == 2
    assert "`--ramp-up` applies to a concurrency workload" in capsys.readouterr().err
    assert main(["specs", "show", "h100-sxm-8gp"]) == 2
    assert "did you mean ['h100-sxm-8gpu'" in capsys.readouterr().err


def test_no_room_for_kv_names_the_engines_memory_setting(capsys) -> None:
    assert main(["serve", "--model", "llama-3.1-70b", "--cluster", "h100-sxm-8gpu", "--tp", "2",
                 "--engine", "sglang", "--num-requests", "4", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "leaves no room for KV cache" in err and "mem_fraction_static 0.833" in err


def test_without_chunked_prefill_a_prompt_must_fit_the_token_budget(capsys) -> None:
    """vLLM refuses to start with max_num_batched_tokens below max_model_len when chunked
    prefill is off; the simulation had admitted each 1,024-token prompt over a 100-token
    budget."""
    assert main([*SERVE, "--input-len", "1024", "--max-batched-tokens", "100",
                 "--no-chunked-prefill"]) == 2
    assert ("a 1,024-token prompt exceeds `max_num_batched_tokens` 100"
            in capsys.readouterr().err)


def test_catalog_columns_line_up_past_long_model_names(capsys) -> None:
    import re

    assert main(["catalog", "--models-only"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # The (right-aligned) params column ends at one place on every row, the longest name's too.
    ends = {re.match(r"(\S+)\s+(\S+)", line).end(2) for line in lines}
    assert len(ends) == 1, ends
    assert any(line.startswith("llama-4-maverick-17b-128e ") for line in lines)


@pytest.mark.parametrize("argv, needle", [
    (["--workload", "poisson", "--rate", "0"], "`workload.rate_per_s` (serve --rate) must be > 0"),
    (["--input-len", "0"], "workload.input_len (serve --input-len): "),
    (["--seed", "-1"], "`workload.seed` (serve --seed) must be an integer"),
])
def test_serve_errors_name_the_flag_beside_the_field(capsys, argv, needle) -> None:
    assert main([*SERVE, *argv]) == 2
    assert needle in capsys.readouterr().err


def test_train_errors_name_the_flag_beside_the_field(capsys) -> None:
    assert main([*TRAIN, "--gbs", "12"]) == 2
    assert "`global_batch_size` (train --gbs) must be a multiple" in capsys.readouterr().err


def test_a_negative_peak_is_reported_in_the_files_units(tmp_path, capsys) -> None:
    from charon_search.hardware.loader import _SHIPPED_SPECS

    text = (_SHIPPED_SPECS / "gpus" / "h100-sxm-80gb.yaml").read_text()
    bad = tmp_path / "h100.yaml"
    bad.write_text(text.replace("bf16: 989.5", "bf16: -989.5", 1))
    assert main(["specs", "check", str(bad)]) == 2
    assert "`peak_tflops_per_s.bf16` must be > 0, but got -989.5\n" in capsys.readouterr().err


def test_profiles_flags_of_another_action_are_errors(capsys) -> None:
    assert main(["profiles", "info", "--write"]) == 2
    assert "`--write` applies to `profiles fit-collectives`, not to `profiles info`" in \
        capsys.readouterr().err


@pytest.mark.parametrize("experts, top_k, needle", [
    (0, 2, "got 0 experts and top-k 2"),
    (4, 8, "got 4 experts and top-k 8"),
])
def test_a_moe_config_needs_top_k_within_its_experts(tmp_path, capsys, experts, top_k,
                                                     needle) -> None:
    """torch had failed inside the router with "k not in range for dimension"."""
    cfg = {"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "vocab_size": 256, "num_local_experts": experts, "num_experts_per_tok": top_k}
    path = tmp_path / "config.json"
    path.write_text(__import__("json").dumps(cfg))
    assert main(["trace", str(path), "--seq", "64"]) == 2
    err = capsys.readouterr().err
    assert "a MoE needs" in err and needle in err and "Traceback" not in err


def test_a_window_without_layer_types_windows_every_layer(tmp_path) -> None:
    """Mistral-7B-v0.1 states `sliding_window` without per-layer types; HF windows every
    layer. The window had been ignored (the model priced slower than without it)."""
    import json

    from charon_search.catalog import load_model
    from charon_search.hardware import load_cluster
    from charon_search.training import simulate_training

    base = {"model_type": "mistral", "hidden_size": 128, "intermediate_size": 256,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 256, "max_position_embeddings": 32768}
    steps = {}
    for name, extra in (("full", {}), ("window", {"sliding_window": 64}),
                        ("typed", {"sliding_window": 64,
                                   "layer_types": ["sliding_attention"] * 2})):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({**base, **extra}))
        spec = load_model(folder)
        rep = simulate_training(spec, load_cluster("h100-sxm-8gpu"), Layout(seq_len=8192),
                                num_gpus=1)
        steps[name] = (rep.step_time_s, rep.hardware_flops_per_step)
        if extra:
            assert spec.sliding_layers == (True, True)
    assert steps["window"] == pytest.approx(steps["typed"])
    # Executed attention: 64 keys a query instead of all 8,192.
    assert steps["window"][1] < 0.5 * steps["full"][1]
