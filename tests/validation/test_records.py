"""Loader of published records (SCHEMA.md) and silicon CSV rows: shipped data and bad input."""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import pytest
import yaml

from charon_search.errors import ConfigError
from charon_search.validation import (
    Unexpressible,
    data_dir,
    load_files,
    load_silicon_csv,
    parse_records,
    to_case,
)


@functools.cache
def _parsed():
    text = (data_dir() / "published-dev.yaml").read_text()
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _doc():
    return copy.deepcopy(_parsed())


def test_shipped_counts(shipped_records):
    published = [r for r in shipped_records if r.origin == "published"]
    silicon = [r for r in shipped_records if r.origin == "silicon"]
    # 72 records in published-dev.yaml (SOURCES.md lists 5+7+11+2+9+6+1+1+12+1+1+1+1+1+1+10+2)
    # plus 4 variants.
    assert len([r for r in published if r.parent_id is None]) == 72
    assert len([r for r in published if r.parent_id]) == 4
    assert len(silicon) == 3131
    assert len({r.id for r in shipped_records}) == len(shipped_records)


def test_variant_applies_overrides(by_id):
    v = by_id["korthikanti_530b_2240gpu_mfu#1"]
    assert v.parent_id == "korthikanti_530b_2240gpu_mfu"
    assert v.config["recompute"] == "full" and v.config["sequence_parallel"] is False
    assert v.measured == {"mfu": 0.421}
    assert by_id["korthikanti_530b_2240gpu_mfu"].config["recompute"] == "selective"


def test_silicon_row_units(by_id):
    r = by_id["meta_llama_llama_3_1_8b_instruct_meta_llama_llama_3_1_8b_instruct_h100_sxm_"
              "trtllm_agg_1024x128_c8_tp1_epnone_1"]
    assert r.kind == "serving"
    assert r.measured["ttft_s"] == pytest.approx(190.9545068625e-3)
    assert r.measured["tpot_s"] == pytest.approx(7.94357745e-3)
    assert (r.config["input_len"], r.config["output_len"], r.config["concurrency"]) == (
        1024, 128, 8)
    assert r.hardware["num_gpus"] == 1


def test_silicon_row_degrees_follow_the_row_id(by_id):
    """The 2026-04-06 InferenceX dump writes tp_size = TP x EP (64 for tp8_ep8, on one 8-GPU
    node); the row id's launch degrees are used. Rows whose columns agree are kept as read."""
    r = by_id["2026_04_06_gpt_oss_120b_h200_sxm_trtllm_fp4_agg_8192x1024_c8_tp8_ep8_928"]
    assert (r.config["tp"], r.config["ep"], r.config["moe_tp"]) == (8, 8, 1)
    assert r.hardware["num_gpus"] == 8
    assert "tp_size column 64" in r.extra["layout_note"]
    dpa = by_id["2026_04_06_deepseek_r1_h200_sxm_trtllm_fp8_agg_1024x1024_c128_tp8_ep8_2012"]
    # attention DP: attention_dp_size 64 written for 8 ranks
    assert (dpa.config["tp"], dpa.config["dp"], dpa.config["ep"]) == (1, 8, 8)
    assert dpa.hardware["num_gpus"] == 8 and dpa.config["concurrency"] == 128
    ok = by_id["2026_03_25_deepseek_r1_h200_sxm_trtllm_fp8_agg_1024x8192_c8_tp8_0_ep8_0_1249"]
    assert (ok.config["tp"], ok.config["ep"], ok.config["moe_tp"]) == (8, 8, 1)  # as written
    assert ok.hardware["num_gpus"] == 8 and "layout_note" not in ok.extra


def test_silicon_row_degrees_from_the_columns_on_an_8_gpu_system(by_id):
    """The same dump's ``cfg<n>`` rows carry the TP x EP columns without the degrees in their
    id. This one repeats the measurements of its ``tp8_ep8`` twin exactly (the same run on one
    8-GPU B200 node), so it gets the twin's layout, not TP 64 over eight nodes."""
    twin = by_id["2026_04_06_deepseek_r1_b200_sxm_sglang_fp8_agg_1024x1024_c16_tp8_ep8_1013"]
    r = by_id["dsr1_b200_sglang_fp8_agg_1024x1024_c16_cfg199"]
    assert r.measured == twin.measured
    for rec in (r, twin):
        assert (rec.config["tp"], rec.config["ep"], rec.config["moe_tp"]) == (8, 8, 1)
        assert rec.hardware["num_gpus"] == 8
    assert "moe_tp_size x moe_ep_size (8 x 8)" in r.extra["layout_note"]
    # TP 4 x EP 4 written as tp_size 16: four GPUs.
    r16 = by_id["dsr1_b200_sglang_fp4_agg_1024x1024_c4_cfg202"]
    assert (r16.config["tp"], r16.config["ep"], r16.hardware["num_gpus"]) == (4, 4, 4)
    # An NVL72 rack is one NVLink domain: its columns are kept as read. This row's tp_size 64
    # with MoE TP 64 and no EP is a deployment's GPU count (its siblings write 12-72), which
    # the translation reports as not expressible.
    gb = by_id["2026_04_06_deepseek_r1_gb200_trtllm_fp4_agg_8192x1024_c538_tp64_ep1_113"]
    assert (gb.config["tp"], gb.hardware["num_gpus"]) == (64, 64)
    with pytest.raises(Unexpressible, match="a deployment's GPU count"):
        to_case(gb)


def test_silicon_row_vllm_ep_ranks_written_as_attention_dp(by_id):
    """vLLM ``--tensor-parallel-size 4 --enable-expert-parallel`` (EP 4 on 4 GPUs, id
    ``tp4_ep4``) is written as attention_dp_size 4, moe_ep_size 16, batch_size concurrency / 4;
    its ``cfg635`` twin repeats the measurements and gets the same 4-GPU reading."""
    twin = by_id["2026_04_06_kimi_k2_5_b200_sxm_vllm_fp4_agg_1024x1024_c4_tp4_ep4_1294"]
    r = by_id["kimik2_5_b200_vllm_fp4_agg_1024x1024_c4_cfg635"]
    assert r.measured == twin.measured
    for rec in (r, twin):
        assert (rec.config["tp"], rec.config["dp"], rec.config["ep"],
                rec.config["moe_tp"]) == (4, 1, 4, 1)
        assert rec.hardware["num_gpus"] == 4 and rec.config["concurrency"] == 4
        assert "EP ranks" in rec.extra["layout_note"]


def test_silicon_row_attention_dp_implied_by_the_moe_columns(by_id):
    """aiconfigurator's vLLM rows leave attention_dp_size empty for data-parallel launches;
    moe_tp x moe_ep = tp x attention_dp gives it (Qwen3-235B-FP8 at TP 1 cannot fit one
    H200: 219 GiB of FP8 weights)."""
    r = by_id["qwen_qwen3_235b_a22b_fp8_qwen_qwen3_235b_a22b_fp8_h200_sxm_vllm_agg_2000x500_"
              "c9_tp1_epnone_14"]
    assert (r.config["tp"], r.config["dp"], r.config["moe_tp"], r.config["ep"]) == (1, 2, 2, 1)
    assert r.hardware["num_gpus"] == 2
    assert "2 attention-DP ranks" in r.extra["layout_note"]
    ok = by_id["qwen_qwen3_235b_a22b_fp8_qwen_qwen3_235b_a22b_fp8_h200_sxm_vllm_agg_2000x500_"
               "c16_tp2_epnone_15"]
    assert (ok.config["tp"], ok.config["dp"], ok.hardware["num_gpus"]) == (2, 1, 2)


def test_silicon_agg_row_concurrency_over_several_workers(by_id):
    """``batch_size`` is one worker's batch; a client concurrency k times it ran k workers
    (GB200: 448 streams = 32 TP-2 workers of 14, the 64 GPUs of the disagg row of that run)."""
    r = by_id["nvidia_qwen3_32b_nvfp4_nvidia_qwen3_32b_nvfp4_gb200_trtllm_agg_15000x500_c448_"
              "tp2_0_epnone_2"]
    assert (r.config["concurrency"], r.config["workers"], r.config["tp"]) == (448, 32, 2)
    assert r.hardware["num_gpus"] == 64
    one = by_id["meta_llama_llama_3_1_8b_instruct_meta_llama_llama_3_1_8b_instruct_h100_sxm_"
                "trtllm_agg_1024x128_c8_tp1_epnone_1"]
    assert "workers" not in one.config and one.config["concurrency"] == 8


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda r: r.pop("notes"), "missing key(s) ['notes']"),
        (lambda r: r.update(stray=1), "unknown key(s) ['stray']"),
        (lambda r: r.update(confidence="great"), "`confidence` must be one of"),
        (lambda r: r["training"].update(tp=3), "`tp * pp * dp * cp == hardware.num_gpus`"),
        (lambda r: r["training"].update(schedule="1f1b"), "`schedule == 'none'`"),
        (lambda r: r["measured"].update(hfu=1.5), "`measured.hfu` must lie in (0, 1]"),
        (lambda r: r["measured"].update(hfu="x"),
         "`measured.hfu` must be a positive finite number"),
        (lambda r: r.update(flop_convention=None), "`flop_convention` must be non-null"),
        (lambda r: r.update(inferred_fields=["training.nope"]), "'training.nope' is not a field"),
        (lambda r: r["hardware"].update(gpu="v100"), "`hardware.gpu` must be one of"),
        (lambda r: r["training"].update(micro_batch_size=2.5),
         "training.micro_batch_size must be an integer"),
    ],
)
def test_malformed_record_raises(mutate, needle):
    doc = _doc()
    rec = copy.deepcopy(doc["records"][0])  # megatron_sc21_t1_1.7b
    mutate(rec)
    with pytest.raises(ConfigError) as e:
        parse_records({"schema_version": 1, "records": [rec]}, where="test.yaml")
    assert needle in str(e.value)
    assert "megatron_sc21_t1_1.7b" in str(e.value) or "record 0" in str(e.value)


def test_duplicate_ids_and_bad_top_level():
    doc = _doc()
    rec = doc["records"][0]
    with pytest.raises(ConfigError, match="not unique"):
        parse_records({"schema_version": 1, "records": [rec, rec]})
    with pytest.raises(ConfigError, match="schema_version"):
        parse_records({"schema_version": 2, "records": []})
    with pytest.raises(ConfigError, match="top level"):
        parse_records({"records": []})


def test_malformed_yaml_file(tmp_path: Path):
    p = tmp_path / "bad.yaml"
    p.write_text("schema_version: 1\nrecords: [\n")
    with pytest.raises(ConfigError, match="malformed YAML"):
        load_files([p])
    other = tmp_path / "x.txt"
    other.write_text("")
    with pytest.raises(ConfigError, match="suffix must be one of"):
        load_files([other])


def test_silicon_csv_errors(tmp_path: Path):
    src = (data_dir() / "silicon_sample.csv").read_text().splitlines()
    p = tmp_path / "s.csv"
    p.write_text(src[0].replace("silicon_tpot_ms", "tpot") + "\n" + src[1] + "\n")
    with pytest.raises(ConfigError, match="missing column"):
        load_silicon_csv(p)
    bad = src[1].rsplit(",", 1)[0] + ",abc"
    p.write_text(src[0] + "\n" + bad + "\n")
    with pytest.raises(ConfigError, match="line 2"):
        load_silicon_csv(p)
