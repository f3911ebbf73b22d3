"""A configuration that names its engine runs with that engine's own scheduler defaults.

``charon-search serve --engine sglang`` (or ``engine: sglang`` in a ``--config`` file or a
serving search space) stands for SGLang launched without tuning flags: its prefill-first
schedule, its chunked-prefill size for the GPU's memory, its KV admission (``ratio``), its
CUDA-graph batch sizes, its overlap scheduler, its custom NVLink all-reduce, and its
calibrated host times (TensorRT-LLM's token budget is the exception: aiconfigurator's rule,
``serving.backends.engine_profile``). These are the facts ``validate`` applies to
measured rows whose launch flags are unknown (``serving.backends.engine_profile`` with
``launcher="engine_defaults"``), so the validated error band ``serve`` prints for the engine
describes the configuration it simulated. Every field the user sets wins over the engine's
value; without an engine the generic ``ServingConfig`` defaults apply as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from charon_search.errors import ConfigError
from charon_search.serving.backends import EngineProfile, engine_profile
from charon_search.serving.config import ServingConfig

__all__ = ["LATEST_RELEASES", "describe", "engine_serving_config"]

#: The release a configuration that names an engine stands for unless it names one
#: (``engine_version``): each engine's newest release among the measured serving rows shipped
#: for validation (``charon_search/data/validation/silicon_sample.csv``, ``backend_version``).
#: Of the engine-default facts only vLLM's depends on it (asynchronous scheduling by default
#: from 0.14, ``serving.backends.VLLM_ASYNC_DEFAULT_VERSION``).
LATEST_RELEASES = {"vllm": "0.19.0", "sglang": "0.5.10.post1", "trtllm": "1.3.0rc5"}


def engine_serving_config(data: Mapping[str, Any], *, gpu: str, prompt_tokens: Sequence[int],
                          linear_attention: bool = False, version: str = "",
                          where: str = "serving config",
                          ) -> tuple[ServingConfig, EngineProfile | None]:
    """``ServingConfig.from_dict(data)``, with the named engine's defaults for what ``data``
    leaves out.

    Args:
        data: ``ServingConfig`` fields as the user gave them (a file, flags, a search trial);
            its ``engine`` (``vllm``, ``sglang``, ``trtllm``) selects the defaults.
        gpu: GPU spec name of the cluster (SGLang sizes its prefill chunks by GPU memory).
        prompt_tokens: the workload's prompt lengths (TensorRT-LLM's token budget holds a
            full decode batch plus the longest prompt, as it does not chunk prompts).
        linear_attention: the model has linear-attention layers (SGLang then runs without
            its overlap scheduler).
        version: the engine release; "" = ``LATEST_RELEASES``.
        where: names the input in error messages.

    Returns:
        The config and the engine profile applied (None without an engine).

    Raises:
        ConfigError: a bad field, or ``version`` without an engine.
    """
    given = ServingConfig.from_dict(data, where=where)  # checks the user's own fields first
    if not given.engine:
        if version:
            raise ConfigError(f"{where}: `engine_version` needs `engine` (one of "
                              f"{sorted(LATEST_RELEASES)}), but got engine_version={version!r} "
                              "without one")
        return given, None
    profile = engine_profile(given.engine, isl=max(prompt_tokens, default=0),
                             max_batch_size=given.max_num_seqs,
                             version=version or LATEST_RELEASES[given.engine],
                             launcher="engine_defaults", gpu=gpu, tp=given.tp,
                             linear_attention=linear_attention)
    return ServingConfig.from_dict({**profile.config_kwargs(), **data}, where=where), profile


def describe(config: ServingConfig, profile: EngineProfile, version: str = "") -> str:
    """One line naming the engine defaults a run used (for ``serve``'s output)."""
    parts = [f"{config.prefill_schedule.replace('_', '-')} schedule",
             (f"chunked prefill in {config.max_num_batched_tokens}-token batches"
              if config.chunked_prefill else
              f"whole prompts, {config.max_num_batched_tokens}-token batches"),
             "overlap scheduler" if config.overlap_scheduler else "synchronous scheduler",
             "prefix caching" if config.prefix_caching else "no prefix caching",
             f"{config.tp_allreduce} all-reduce"]
    return (f"engine defaults: {profile.backend} {version or LATEST_RELEASES[profile.backend]} "
            f"({', '.join(parts)}); flags and --config fields override them")
