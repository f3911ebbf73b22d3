"""A configuration naming its engine runs with that engine's own scheduler defaults
(``serving.engine_defaults``): the facts ``validate`` applies to rows launched without flags."""

from __future__ import annotations

import json

import pytest

from charon_search.cli import main
from charon_search.errors import ConfigError
from charon_search.search.serving_bridge import serving_config_from
from charon_search.serving import ServingConfig
from charon_search.serving.engine_defaults import LATEST_RELEASES, engine_serving_config


def test_sglang_chunks_by_gpu_memory_and_schedules_prefill_first() -> None:
    """SGLang's default chunked-prefill size: 8192 tokens on the 141 GB H200 (35-160 GiB),
    16384 on the 180 GB B200 (>= 160 GiB); prompts before decodes, decodes outside the budget,
    the overlap scheduler, its custom all-reduce and its radix cache (on unless a launch passes
    --disable-radix-cache)."""
    h200, prof = engine_serving_config({"engine": "sglang"}, gpu="h200-sxm-141gb",
                                       prompt_tokens=[1024])
    b200, _ = engine_serving_config({"engine": "sglang"}, gpu="b200-sxm-180gb",
                                    prompt_tokens=[1024])
    assert (h200.max_num_batched_tokens, b200.max_num_batched_tokens) == (8192, 16384)
    assert prof is not None and prof.backend == "sglang"
    assert h200.prefill_schedule == "prefill_first" and not h200.decode_in_budget
    assert h200.overlap_scheduler and h200.iteration_overhead_s == 0.0
    assert h200.tp_allreduce == "sglang" and h200.prefix_caching
    # A hybrid linear-attention model runs SGLang without the overlap scheduler.
    hybrid, _ = engine_serving_config({"engine": "sglang"}, gpu="h200-sxm-141gb",
                                      prompt_tokens=[1024], linear_attention=True)
    assert not hybrid.overlap_scheduler and hybrid.iteration_overhead_s is None


def test_fields_the_user_sets_win() -> None:
    cfg, _ = engine_serving_config(
        {"engine": "sglang", "max_num_batched_tokens": 4096, "prefix_caching": False,
         "tp_allreduce": "nccl"}, gpu="h200-sxm-141gb", prompt_tokens=[1024])
    assert (cfg.max_num_batched_tokens, cfg.prefix_caching, cfg.tp_allreduce) == (
        4096, False, "nccl")
    assert cfg.prefill_schedule == "prefill_first"  # the rest stays SGLang's


def test_trtllm_budget_holds_a_decode_batch_and_the_longest_prompt() -> None:
    """TensorRT-LLM does not chunk prompts by default: the budget is max_num_seqs + the
    longest prompt + 1500 (64 + 3000 + 1500 = 4564), and it admits a request only when its
    prompt and output KV fit (GUARANTEED_NO_EVICT)."""
    cfg, _ = engine_serving_config({"engine": "trtllm", "max_num_seqs": 64},
                                   gpu="h100-sxm-80gb", prompt_tokens=[1000, 3000, 2000])
    assert cfg.max_num_batched_tokens == 64 + 3000 + 1500
    assert not cfg.chunked_prefill and cfg.kv_admission == "reserve_max"
    assert cfg.block_size == 32


def test_vllm_release_decides_asynchronous_scheduling() -> None:
    """vLLM schedules asynchronously by default from 0.14: the newest shipped release does,
    0.12 does not (its host time per iteration then comes from the cluster)."""
    new, _ = engine_serving_config({"engine": "vllm"}, gpu="h100-sxm-80gb",
                                   prompt_tokens=[1024])
    old, _ = engine_serving_config({"engine": "vllm"}, gpu="h100-sxm-80gb",
                                   prompt_tokens=[1024], version="0.12.0")
    assert LATEST_RELEASES["vllm"] == "0.19.0"
    assert new.overlap_scheduler and not old.overlap_scheduler
    assert new.prefix_caching and new.max_num_batched_tokens == 8192


def test_without_an_engine_nothing_changes() -> None:
    data = {"tp": 2, "max_num_seqs": 64}
    cfg, prof = engine_serving_config(data, gpu="h100-sxm-80gb", prompt_tokens=[1024])
    assert prof is None and cfg == ServingConfig.from_dict(data)
    with pytest.raises(ConfigError, match=r"engine_version.*needs `engine`"):
        engine_serving_config(data, gpu="h100-sxm-80gb", prompt_tokens=[1], version="0.12.0")


def test_search_configs_take_the_engine_defaults() -> None:
    cfg = serving_config_from({"engine": "sglang", "tp": 2, "model": "llama-3.1-8b",
                               "cluster": "dgx-h200-ib400"}, gpu="b200-sxm-180gb",
                              prompt_tokens=[2048])
    assert cfg.prefill_schedule == "prefill_first" and cfg.max_num_batched_tokens == 16384
    assert cfg.tp == 2


def test_serve_engine_flag_applies_and_names_the_defaults(tmp_path, capsys) -> None:
    out = tmp_path / "s.json"
    rc = main(["serve", "--model", "debug-llama", "--cluster", "h200-sxm-8gpu",
               "--engine", "sglang", "--max-batched-tokens", "2048", "--num-requests", "5",
               "--no-progress", "--json", str(out)])
    assert rc == 0
    err = capsys.readouterr().err
    assert "engine defaults: sglang 0.5.10.post1 (prefill-first schedule" in err
    config = json.loads(out.read_text())["config"]
    assert config["max_num_batched_tokens"] == 2048  # the flag wins
    assert config["prefill_schedule"] == "prefill_first" and config["overlap_scheduler"]
    rc = main(["serve", "--model", "debug-llama", "--cluster", "h200-sxm-8gpu",
               "--engine-version", "0.5.9", "--num-requests", "5", "--no-progress"])
    assert rc == 2
    assert "`engine_version` needs `engine`" in capsys.readouterr().err
