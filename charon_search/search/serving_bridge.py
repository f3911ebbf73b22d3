"""Flat serving-space configs -> ``ServingConfig`` + ``WorkloadSpec`` -> a flat record.

Config keys of a serving space:

* ``model``, ``cluster`` (the default GPU type/cluster), ``workload`` (a ``WorkloadSpec`` mapping).
* ``mode``: ``aggregated`` (replicas of one engine, ``dp`` of them) or ``disaggregated``
  (prefill and decode pools).
* Any ``ServingConfig`` field (``tp``, ``pp``, ``ep``, ``dp``, ``dp_attention``, ``sp``,
  ``dynamic_sp``, ``max_num_seqs``, ``max_num_batched_tokens``, ``chunked_prefill``,
  ``cuda_graph``, ``cuda_graph_sizes``, ``gpu_memory_utilization``...).
* Pool keys ``prefill_<f>`` / ``decode_<f>`` with ``f`` in ``replicas``, ``tp``, ``pp``, ``ep``,
  ``cluster``, ``dp_attention``, ``max_num_seqs``, ``max_num_batched_tokens`` (``PoolConfig``
  fields; disaggregated only: the ``disaggregation`` normalizer drops the top-level ``tp``,
  ``dp_attention``... there), and ``kv_transfer``.
* ``engine`` (a ``ServingConfig`` field): the engine's own scheduler defaults apply to every
  field the config leaves out (``serving.engine_defaults``); ``engine_version`` picks its release.
* ``spec_k`` (speculative draft tokens; 0 = off) and ``spec_acceptance`` (per-token acceptance),
  drafted by the model's MTP layers or by ``spec_draft`` (a catalog model of the same vocabulary).
* ``cuda_graph_max`` (largest captured batch; graphs at 1, 2, 4, 8, 16, 24, ... up to it).
* ``workload_<field>``: overrides one ``WorkloadSpec`` field (e.g. ``workload_concurrency``
  searched as a parameter to trace the throughput-per-GPU vs per-user frontier).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from charon_search.errors import ConfigError, InfeasibleError
from charon_search.search.evaluators import flatten_report

__all__ = ["MODES", "evaluate_serving", "serving_config_from"]

MODES = ("aggregated", "disaggregated")
_POOL_KEYS = {"replicas": "num_replicas", "tp": "tp", "pp": "pp", "ep": "ep", "cluster": "cluster",
              "dp_attention": "dp_attention", "max_num_seqs": "max_num_seqs",
              "max_num_batched_tokens": "max_num_batched_tokens"}
_SEARCH_ONLY = {"model", "cluster", "workload", "mode", "spec_k", "spec_acceptance", "spec_draft",
                "engine_version", "kv_transfer", "cuda_graph_max", "num_gpus", "min_gpus",
                "max_gpus"}


def _cuda_graph_sizes(max_size: int) -> tuple[int, ...]:
    """vLLM's capture list shape: 1, 2, 4, then multiples of 8 up to ``max_size``."""
    sizes = [s for s in (1, 2, 4) if s <= max_size]
    sizes += list(range(8, max_size + 1, 8))
    return tuple(sizes) or (1,)


def serving_config_from(cfg: Mapping[str, Any], *, gpu: str = "",
                        prompt_tokens: Sequence[int] = (), linear_attention: bool = False) -> Any:
    """Build the ``ServingConfig`` a flat search config describes; with an ``engine``, that
    engine's defaults on ``gpu`` for a workload of ``prompt_tokens`` fill what it leaves out
    (``serving.engine_defaults.engine_serving_config``)."""
    from charon_search.serving import ServingConfig
    from charon_search.serving.engine_defaults import engine_serving_config

    mode = cfg.get("mode", "aggregated")
    if mode not in MODES:
        raise ConfigError(f"`mode` must be one of {list(MODES)}, but got {mode!r}")
    fields = {f.name for f in dataclasses.fields(ServingConfig)}
    kw: dict[str, Any] = {}
    for k, v in cfg.items():
        if k in fields:
            kw[k] = v
        elif k in _SEARCH_ONLY or k.startswith(("prefill_", "decode_", "workload_")):
            continue
        else:
            raise ConfigError(
                f"serving config key {k!r} is neither a ServingConfig field nor one of "
                f"{sorted(_SEARCH_ONLY)} or prefill_*/decode_*; allowed fields: {sorted(fields)}"
            )
    _check_search_only(cfg)
    spec_k = int(cfg.get("spec_k", 0) or 0)
    if spec_k > 0:
        kw["speculative"] = {"num_draft_tokens": spec_k,
                             "acceptance_rate": float(cfg.get("spec_acceptance", 0.7))}
        if cfg.get("spec_draft"):
            kw["speculative"].update(method="draft", draft_model=str(cfg["spec_draft"]))
    if cfg.get("cuda_graph_max"):
        kw["cuda_graph_sizes"] = _cuda_graph_sizes(int(cfg["cuda_graph_max"]))
    if mode == "disaggregated":
        pools = {}
        for pool in ("prefill", "decode"):
            pools[pool] = {dst: cfg[f"{pool}_{src}"] for src, dst in _POOL_KEYS.items()
                           if f"{pool}_{src}" in cfg}
        kw["disagg"] = {**pools, "kv_transfer": cfg.get("kv_transfer", "rdma")}
    config, _ = engine_serving_config(kw, gpu=gpu, prompt_tokens=prompt_tokens,
                                      linear_attention=linear_attention,
                                      version=str(cfg.get("engine_version") or ""))
    return config


def _int_field(cfg: Mapping[str, Any], key: str, low: int, what: str) -> int | None:
    """``cfg[key]`` as an integer >= ``low`` (None when absent or null); ``ConfigError`` naming
    the key otherwise."""
    v = cfg.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise ConfigError(f"`{key}` must be an integer >= {low} ({what}), but got {v!r}")
    return v


def _check_search_only(cfg: Mapping[str, Any]) -> None:
    """The search-only integer keys: a bad value would otherwise stop the search in a rule
    (``int('lots')``), be read as "off" (``spec_k: -1``) or make every point invalid
    (``min_gpus`` above ``max_gpus``)."""
    lo = _int_field(cfg, "min_gpus", 1, "the fewest GPUs a deployment may use")
    hi = _int_field(cfg, "max_gpus", 1, "the most GPUs a deployment may use")
    if lo is not None and hi is not None and lo > hi:
        raise ConfigError(f"`min_gpus` must be <= `max_gpus`, but got min_gpus={lo} > "
                          f"max_gpus={hi}: no deployment would be valid")
    _int_field(cfg, "spec_k", 0, "speculative draft tokens per step; 0 = off")
    _int_field(cfg, "cuda_graph_max", 1, "the largest captured batch; `cuda_graph: false` "
                                         "turns graphs off")


def workload_from(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The ``workload`` mapping with ``workload_<field>`` keys (searched or fixed) applied."""
    wl = dict(cfg.get("workload") or {})
    for k, v in cfg.items():
        if k.startswith("workload_"):
            wl[k[len("workload_"):]] = v
    return wl


def evaluate_serving(ev: Any, cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Run ``simulate_serving`` for one flat config; ``ev`` caches models and clusters."""
    from charon_search.catalog.spec import is_linear_block
    from charon_search.serving import WorkloadSpec, simulate_serving

    model, cluster = ev.model(cfg["model"]), ev.cluster(cfg["cluster"])
    workload = WorkloadSpec.from_dict(workload_from(cfg))
    config = serving_config_from(
        cfg, gpu=cluster.gpu.name,
        prompt_tokens=[r.prompt_tokens for r in workload.generate()] if cfg.get("engine") else (),
        linear_attention=any(is_linear_block(t) for t in model.layer_types))
    # ``engine`` and ``mode`` pick the validated error band of an objective's ``guard``.
    rec: dict[str, Any] = {"num_gpus": config.num_gpus, "engine": config.engine or "",
                           "mode": cfg.get("mode", "aggregated"),
                           "device_memory_bytes": float(cluster.gpu.hbm_capacity_bytes)}
    # A deployment the simulator rejects (no room for the KV cache, a rule of the engine) is an
    # infeasible point that keeps its configuration's columns, as a training layout's does.
    try:
        report = simulate_serving(model, cluster, config, workload)
    except InfeasibleError as e:
        return {**rec, "feasible": False, "prune_reason": f"infeasible: {e}"}
    except ConfigError as e:
        return {**rec, "feasible": False, "prune_reason": f"invalid: {e}"}
    flat = flatten_report(report)
    rec.update({k: v for k, v in flat.items() if not k.startswith(("config.", "per_request"))})
    usd_per_s = deployment_usd_per_s(ev, cluster, config)
    tps = float(rec.get("output_tokens_per_s") or 0.0)
    if usd_per_s is not None and usd_per_s > 0 and tps > 0:
        rec["cost_per_million_tokens_usd"] = usd_per_s / tps * 1e6
    rec["feasible"] = True
    rec["prune_reason"] = None
    return rec


def deployment_usd_per_s(ev: Any, cluster: Any, config: Any) -> float | None:
    """Price of the deployment in USD per second: each pool's GPUs at its cluster's price per
    GPU-hour (``ev.cluster`` loads a pool's own cluster); None when a pool's cluster has no
    price, rather than the price of the other pool alone."""
    if config.disagg is None:
        price = _price(cluster)
        return config.num_gpus * price / 3600.0 if price > 0 else None
    usd_per_s = 0.0
    for pool in (config.disagg.prefill, config.disagg.decode):
        price = _price(ev.cluster(pool.cluster) if pool.cluster else cluster)
        if price <= 0:
            return None
        usd_per_s += pool.num_replicas * pool.gpus_per_replica * price / 3600.0
    return usd_per_s


def _price(cluster: Any) -> float:
    return float(getattr(cluster, "cost_per_gpu_hour_usd", 0.0) or 0.0)
