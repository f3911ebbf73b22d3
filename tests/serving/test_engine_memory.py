"""Each engine's KV memory knob and default (``serving.backends.engine_memory``), SGLang's
default ``mem_fraction_static`` against its ``ServerArgs`` rule worked by hand."""

from __future__ import annotations

import dataclasses

import pytest

from charon_search.hardware import load_gpu
from charon_search.serving import ServingConfig
from charon_search.serving.backends import (
    AIC_TRTLLM_FREE_MEMORY_FRACTION,
    engine_memory,
    engine_profile,
    sglang_default_mem_fraction,
)

H100 = load_gpu("h100-sxm-80gb")  # 79.18 GiB = 81080.3 MiB, as CUDA reports it
H200 = load_gpu("h200-sxm-141gb")


def test_sglang_default_fraction_h100_tp1_aiconfigurator_graphs() -> None:
    # reserved = 512 + 1.5 x 8192 + 2 x 16 + 1 x 1 / 8 x 1024 = 12960 MiB (above the 10 GiB floor)
    f = sglang_default_mem_fraction(H100, tp=1, prefill_tokens=8192, cuda_graph_max_bs=16)
    mib = 85_018_877_624 / 2**20
    assert f == round((mib - 12960) / mib, 3) == 0.84


def test_sglang_default_fraction_h100_tp8_default_graphs() -> None:
    # cuda_graph_max_bs defaults to 512 from TP 4 on an 80 GB GPU:
    # 512 + 12288 + 1024 + 1024 = 14848 MiB, (81080.3 - 14848) / 81080.3 = 0.817
    assert sglang_default_mem_fraction(H100, tp=8, prefill_tokens=8192) == 0.817


def test_sglang_default_fraction_floor_dp_attention_and_draft() -> None:
    mib = H200.hbm_capacity_bytes / 2**20
    # 512 + 1.5 x 2048 + 2 x 16 + 128 = 3744 MiB, raised to the 10 GiB floor above 60 GiB.
    assert sglang_default_mem_fraction(H200, tp=1, prefill_tokens=1024, cuda_graph_max_bs=16) \
        == round((mib - 10240) / mib, 3)
    # Attention DP over 8 ranks at the default 512 graphs: + 3 x 512 x 8 + 1.5 x 512 x 8; an
    # EAGLE/MTP draft adds 2 GiB after the floor.
    base = 512 + 1.5 * 8192 + 2 * 512 + 8 / 8 * 1024
    dpa = base + 3 * 512 * 8 + 1.5 * 512 * 8
    assert sglang_default_mem_fraction(H200, tp=8, prefill_tokens=8192, dp_attention=8,
                                       speculative=True) == round((mib - dpa - 2048) / mib, 3)


def test_engine_memory_reads_each_engines_knob() -> None:
    kw = dict(tp=1, pp=1, dp_attention=False)
    assert engine_memory(ServingConfig(), H100, **kw) == ("total", 0.9)
    assert engine_memory(ServingConfig(engine="vllm", gpu_memory_utilization=0.8), H100,
                         **kw) == ("total", 0.8)
    assert engine_memory(ServingConfig(engine="trtllm"), H100, **kw) == ("free", 0.9)
    # SGLang: an explicit --mem-fraction-static is taken as is, else its rule for this launch
    # (default 8192-token chunks on an 80 GB GPU, graphs listed up to 16).
    sg = ServingConfig(engine="sglang", max_num_batched_tokens=8192,
                       cuda_graph_sizes=tuple(range(1, 17)))
    assert engine_memory(sg, H100, **kw) == ("static", 0.84)
    assert engine_memory(dataclasses.replace(sg, gpu_memory_utilization=0.85), H100,
                         **kw) == ("static", 0.85)


def test_aiconfigurator_trtllm_launch_sets_its_template_fraction() -> None:
    prof = engine_profile("trtllm", isl=1024, max_batch_size=64)
    assert prof.config_kwargs()["gpu_memory_utilization"] == AIC_TRTLLM_FREE_MEMORY_FRACTION
    assert "gpu_memory_utilization" not in engine_profile(
        "trtllm", isl=1024, max_batch_size=64, launcher="engine_defaults").config_kwargs()


def test_bad_fraction_names_the_field() -> None:
    from charon_search.errors import ConfigError

    with pytest.raises(ConfigError, match="gpu_memory_utilization"):
        ServingConfig(gpu_memory_utilization=0.0)


@pytest.mark.parametrize(("model", "gpu", "fraction"), [
    ("deepseek-ai/DeepSeek-R1", "h200-sxm-141gb", 0.75),  # dsr1_fp8_h200_trt.sh
    ("deepseek-ai/DeepSeek-R1", "b200", 0.8),  # dsr1_fp4_b200_trt.sh
    ("openai/gpt-oss-120b", "h200-sxm-141gb", 0.85),  # gptoss_fp4_h200_trt.sh
    ("meta-llama/Llama-3.3-70B-Instruct", "h200-sxm-141gb", None),  # none: the 0.9 default
])
def test_inferencex_trtllm_recipes_set_their_free_memory_fraction(model, gpu, fraction) -> None:
    kw = engine_profile("trtllm", isl=1024, osl=1024, max_batch_size=64, tp=8,
                        launcher="inferencex", model=model, gpu=gpu).config_kwargs()
    assert kw.get("gpu_memory_utilization") == fraction
