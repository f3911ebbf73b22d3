"""Serving simulation: workloads, continuous batching, paged KV + prefix cache, speculative
decoding, PD disaggregation and dynamic SP, reduced to a ``ServingReport``.

Example:
    >>> from charon_search.serving import ServingConfig, WorkloadSpec, simulate_serving
    >>> report = simulate_serving("llama-3.1-8b", "h100-sxm-8gpu", ServingConfig(tp=1),
    ...                           WorkloadSpec(rate_per_s=4, num_requests=200))  # doctest: +SKIP

A ``ServingConfig`` is taken as given. To serve as an engine would by default (its chunk size,
overlap scheduler, all-reduce kernel, memory fraction: what ``serve --engine`` does), build the
config with ``engine_serving_config``:
    >>> cfg, _ = engine_serving_config({"engine": "sglang", "tp": 1}, gpu="h100-sxm-80gb",
    ...                                prompt_tokens=[1024])  # doctest: +SKIP
"""

from charon_search.serving.config import (
    DEFAULT_CUDA_GRAPH_SIZES,
    DisaggConfig,
    PoolConfig,
    ServingConfig,
    SpeculativeConfig,
    parse_disagg,
)
from charon_search.serving.dynamic_sp import (
    SequenceParallelCostModel,
    fixed_sp_latency,
    plan_dynamic_sp,
)
from charon_search.serving.engine_defaults import engine_serving_config
from charon_search.serving.iteration_cost import (
    AffineIterationCostModel,
    GraphIterationCostModel,
    IterationCostModel,
)
from charon_search.serving.kv_cache import BlockPool, RadixPrefixCache
from charon_search.serving.report import ServingReport
from charon_search.serving.simulator import (
    ServingSimulation,
    build_cost_model,
    kv_capacity_blocks,
    resolve_kv_dtype,
    simulate_serving,
)
from charon_search.serving.workload import (
    LengthDistribution,
    RequestSpec,
    WorkloadSpec,
    read_trace,
    requests_from_rows,
)

__all__ = [
    "DEFAULT_CUDA_GRAPH_SIZES",
    "AffineIterationCostModel",
    "BlockPool",
    "DisaggConfig",
    "GraphIterationCostModel",
    "IterationCostModel",
    "LengthDistribution",
    "PoolConfig",
    "RadixPrefixCache",
    "RequestSpec",
    "SequenceParallelCostModel",
    "ServingConfig",
    "ServingReport",
    "ServingSimulation",
    "SpeculativeConfig",
    "WorkloadSpec",
    "build_cost_model",
    "engine_serving_config",
    "fixed_sp_latency",
    "kv_capacity_blocks",
    "parse_disagg",
    "plan_dynamic_sp",
    "read_trace",
    "requests_from_rows",
    "resolve_kv_dtype",
    "simulate_serving",
]
