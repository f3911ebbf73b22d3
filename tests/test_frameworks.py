"""Framework presets (``frameworks.framework_layout``, ``train --framework``).

A preset applies the rules the validation records of its framework are translated with, so
the layout it gives a record's degrees, batch and precision is the record's own layout.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from charon_search.cli import main
from charon_search.errors import ConfigError
from charon_search.frameworks import framework_layout
from charon_search.layout import Layout
from charon_search.validation import default_files, load_files
from charon_search.validation.translate import to_case

#: What a user states; the rest of a record's layout is framework facts.
STRUCTURE = ("tp", "pp", "dp", "cp", "ep", "vpp", "schedule", "sequence_parallel",
             "zero_stage", "micro_batch_size", "global_batch_size", "seq_len", "recompute",
             "precision", "async_tp", "cp_algo")


@pytest.fixture(scope="module")
def records():
    return {r.id: r for r in load_files(default_files()) if r.kind == "training"}


@pytest.mark.parametrize(("rid", "framework", "year"), [
    ("megatron_sc21_t1_530b", "megatron-lm", 2021),   # synchronous TP all-reduce, grad hook
    ("korthikanti_t5_530b_seqsel", "megatron-lm", 2022),  # persistent LN, SP re-gather
    ("mcore_h100_weak_177b", "megatron-core", None),  # blocking p2p, embedding grad hook
    ("torchtitan_202412_t4_70b_256gpu_fsdp32_tp8", "torchtitan", 2024),  # FA2, op SAC
    ("torchtitan_asynctp_8b_float8_tensorwise_vanillaTP", "torchtitan", 2025),
    ("llmfoundry_h100_80gb_mpt3b_8gpu_seq2048_fp8", "llm-foundry", None),  # TE fp8, FSDP1
])
def test_preset_is_the_validation_translation(records, rid: str, framework: str,
                                              year: int | None) -> None:
    case = to_case(records[rid])
    base = Layout(**{k: getattr(case.layout, k) for k in STRUCTURE})
    fl = framework_layout(case.model, base, framework, year=year)
    diff = {f.name for f in dataclasses.fields(Layout)
            if getattr(fl.layout, f.name) != getattr(case.layout, f.name)}
    assert not diff, {k: (getattr(fl.layout, k), getattr(case.layout, k)) for k in diff}
    assert fl.memory_options == case.memory_options
    assert fl.notes  # each fact says what the framework runs


def test_fields_the_user_set_are_kept() -> None:
    lay = Layout(dp=8, zero_stage=3, micro_batch_size=2, global_batch_size=16, seq_len=8192,
                 attention_kernel="flash")
    fl = framework_layout("llama-3.1-8b", lay, "torchtitan", keep={"attention_kernel"})
    assert fl.layout.attention_kernel == "flash"
    assert fl.layout.loss_kernel == "fused"  # 2025, compiled, no TP
    assert any("kept as set: attention_kernel='flash'" in n for n in fl.notes)
    eager = framework_layout("llama-3.1-8b", lay, "torchtitan", torch_compile=False)
    assert (eager.layout.norm_impl, eager.layout.fused_kernels, eager.layout.loss_kernel) == (
        "eager", False, "eager")


def test_kept_fields_lead_the_facts_that_follow_them() -> None:
    """The memory model takes the caller's recompute policy and loss kernel; the fp8 GEMM
    kernel follows the caller's fp8 recipe."""
    lay = Layout(tp=2, dp=4, sequence_parallel=True, micro_batch_size=1, global_batch_size=4,
                 seq_len=4096, recompute="selective", selective_policy="op", precision="fp8",
                 fp8_recipe="blockwise", loss_kernel="fused")
    keep = {"selective_policy", "fp8_recipe", "loss_kernel"}
    fl = framework_layout("llama-3.1-8b", lay, "megatron-core", keep=keep)
    assert (fl.layout.selective_policy, fl.layout.fp8_recipe, fl.layout.loss_kernel) == (
        "op", "blockwise", "fused")
    assert fl.layout.fp8_gemm_kernel == "cutlass"  # block scales: not the cuBLASLt rows
    assert fl.memory_options.selective_policy is None  # the layout's: op
    assert fl.memory_options.loss_impl is None  # the layout's: fused
    plain = framework_layout("llama-3.1-8b", lay, "megatron-core")
    assert (plain.layout.fp8_recipe, plain.layout.fp8_gemm_kernel) == ("delayed", "cublaslt")
    assert plain.memory_options.loss_impl == "vocab_parallel"


def test_notes_of_overridden_facts_give_way_to_kept_lines() -> None:
    """A fact the caller overrode, or one a kept field drops (the 2025 SAC save list under
    another policy), is not also listed as applied; a kept value equal to the framework's keeps
    its note and adds no "kept as set" line."""
    lay = Layout(tp=2, dp=4, sequence_parallel=True, micro_batch_size=1, global_batch_size=4,
                 seq_len=4096, recompute="selective")
    fl = framework_layout("llama-3.1-8b", lay, "torchtitan")
    assert fl.layout.sac_saves_reduce_scatter is False
    assert sum("op SAC" in n or "op-level SAC" in n for n in fl.notes) == 2
    own = framework_layout("llama-3.1-8b", lay.replace(selective_policy="attention"),
                           "torchtitan", keep={"selective_policy"})
    assert not any("SAC" in n for n in own.notes), own.notes
    assert own.notes[-1] == ("kept as set: selective_policy='attention' (the framework's "
                             "would be 'op')")
    tp1 = Layout(dp=8, micro_batch_size=1, global_batch_size=8, seq_len=4096)
    eager = framework_layout("llama-3.1-8b", tp1.replace(loss_kernel="eager"), "torchtitan",
                             keep={"loss_kernel"})
    assert not any("loss compiled" in n for n in eager.notes)
    assert any("kept as set: loss_kernel='eager'" in n for n in eager.notes)
    same = framework_layout("llama-3.1-8b", tp1.replace(loss_kernel="fused"), "torchtitan",
                            keep={"loss_kernel"})
    assert any("loss compiled" in n for n in same.notes)
    assert not any("kept as set" in n for n in same.notes)


def test_a_year_no_rule_reads_is_said_so() -> None:
    lay = Layout(tp=2, dp=4, micro_batch_size=1, global_batch_size=4, seq_len=4096)
    fl = framework_layout("llama-3.1-8b", lay, "megatron-core", year=2024)
    assert fl.notes[-1] == ("framework_year 2024: no fact of the megatron-core preset depends "
                            "on the year (2023-2026 alike)")
    assert fl.layout == framework_layout("llama-3.1-8b", lay, "megatron-core").layout
    assert not any("framework_year" in n
                   for n in framework_layout("llama-3.1-8b", lay, "torchtitan", year=2024).notes)


@pytest.mark.parametrize(("model", "changes", "why"), [
    ("qwen3-30b-a3b", {"ep": 2, "dp": 2}, "MoE layers"),
    ("llama-3.1-8b", {"cp": 2, "dp": 1}, r"cp=2 \(context parallelism\)"),
    ("llama-3.1-8b", {"precision": "fp8"}, "precision='fp8'"),
    ("llama-3.1-8b", {"zero_stage": 3}, "zero_stage=3"),
])
def test_megatron_lm_preset_refuses_what_its_code_did_not_run(model: str, changes: dict,
                                                              why: str) -> None:
    lay = Layout(**{"dp": 2, "micro_batch_size": 1, "global_batch_size": 2, "seq_len": 2048,
                    **changes})
    with pytest.raises(ConfigError, match=f"`framework` 'megatron-lm' \\(2022\\) .* not {why}"):
        framework_layout(model, lay, "megatron-lm")


@pytest.mark.parametrize(("framework", "year", "match"), [
    ("deepspeed", None, r"`framework` must be one of \['megatron-lm'"),
    ("megatron-lm", 2024, r"2020\.\.2022 \(later Megatron is 'megatron-core'\)"),
    ("torchtitan", 1999, r"`framework_year` of 'torchtitan' must be one of 2024\.\.2026"),
])
def test_bad_framework_or_year(framework: str, year: int | None, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        framework_layout("llama-3.1-8b", Layout(), framework, year=year)


def test_train_cli_applies_the_preset(tmp_path, capsys) -> None:
    # MPT's ALiBi attention ran the Triton kernel in the 2023 tables: stated here, so that
    # the preset keeps it and only the loss differs
    args = ["train", "--model", "mpt-1b", "--cluster", "h100-sxm-8gpu", "--mbs", "2",
            "--seq", "2048", "--attention-kernel", "flash_triton"]
    plain, preset = tmp_path / "plain.json", tmp_path / "preset.json"
    assert main([*args, "--json", str(plain)]) == 0
    assert main([*args, "--framework", "llm-foundry", "--json", str(preset)]) == 0
    out = capsys.readouterr().out
    assert "framework llm-foundry (2023):" in out and "fused_crossentropy" in out
    t_plain = json.loads(plain.read_text())["step_time_s"]
    t_preset = json.loads(preset.read_text())["step_time_s"]
    # one GPU, no FSDP: only the fused loss applies, 40 bytes per logit less
    # (2 x 2048 x 50368 x 40 B = 8.25 GB at H100 bandwidth: a few milliseconds)
    assert 2e-3 < t_plain - t_preset < 6e-3


@pytest.mark.parametrize(("extra", "message"), [
    (["--framework-year", "2024"], "`--framework-year` applies only with `--framework`"),
    (["--no-compile"], "`--compile / --no-compile` applies only with `--framework`"),
    (["--framework", "megatron-core", "--no-compile"],
     "`--compile / --no-compile` applies only with `--framework torchtitan`"),
])
def test_framework_flags_need_their_framework(capsys, extra: list[str], message: str) -> None:
    assert main(["train", "--model", "mpt-1b", "--cluster", "h100-sxm-8gpu", *extra]) == 2
    assert message in capsys.readouterr().err


def test_search_evaluator_applies_the_preset() -> None:
    from charon_search.search.evaluators import TrainingEvaluator
    from charon_search.search.space import build_config
    from charon_search.training import simulate_training

    cfg = {"model": "llama-3.1-8b", "cluster": "h100-sxm-8gpu", "dp": 8, "zero_stage": 3,
           "micro_batch_size": 1, "global_batch_size": 8, "seq_len": 4096,
           "framework": "torchtitan"}
    rec = TrainingEvaluator().evaluate(cfg)
    assert rec["framework_year"] == 2025
    assert "loss_kernel=fused" in rec["framework_facts"].split()
    fl = framework_layout("llama-3.1-8b", Layout(dp=8, zero_stage=3, micro_batch_size=1,
                                                 global_batch_size=8, seq_len=4096), "torchtitan")
    want = simulate_training("llama-3.1-8b", "h100-sxm-8gpu", fl.layout,
                             memory_options=fl.memory_options)
    assert rec["step_time_s"] == pytest.approx(want.step_time_s)
    assert rec["peak_memory_bytes"] == pytest.approx(want.memory["peak_device_bytes"], abs=1)
    with pytest.raises(ConfigError, match="`framework` must be one of"):
        build_config("training", {**cfg, "framework": "deepspeed"})
    with pytest.raises(ConfigError, match="`torch_compile` applies only with `framework "
                                          "torchtitan`, but got framework megatron-core"):
        build_config("training", {**cfg, "framework": "megatron-core", "torch_compile": False})
    with pytest.raises(ConfigError, match="`framework_year` applies only with `framework`"):
        build_config("training", {k: v for k, v in cfg.items() if k != "framework"}
                     | {"framework_year": 2025})
