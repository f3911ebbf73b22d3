"""Evaluators: turn one search config into a flat record of metrics (dict of builtins).

``EVALUATORS`` maps the space's ``evaluator`` key to a class; a worker instantiates each evaluator
once and keeps it (loaded models, clusters and whatever the simulators cache behind them), so the
first evaluation pays and later ones reuse. ``evaluate(config)`` returns the record; a point that
cannot run (out of memory) is returned with ``feasible=False`` and ``prune_reason`` instead of
raising, after the cheap memory check and before any timeline is built.

* ``training``: ``charon_search.memory.memory_report`` first, then ``charon_search.training.
  simulate_training``; adds derived fields (``tokens_per_s_per_gpu``, ``gpu_s_per_token``,
  ``cost_per_million_tokens_usd``). ``peak_memory_bytes`` is the device total the memory
  check compares (reserved + NCCL buffers, ``MemoryReport.peak_device_bytes``), in pruned and
  feasible records alike; ``peak_reserved_bytes`` the allocator's share alone. A layout the
  simulator rejects (``ConfigError``) is an infeasible record, ``prune_reason`` "invalid: ...".
* ``serving``: ``charon_search.serving.simulate_serving`` (aggregated or disaggregated pools).
* ``validation``: one measured record of ``charon-search validate`` (``validation.runner.
  validate_record``), for ``run_validation(..., workers=N)``.
* ``toy-analytic``: closed-form objectives of the layout parameters. NOT a simulator: it exists to
  test and benchmark the search machinery (sampler, Pareto front, resume, worker loss) on spaces
  whose exhaustive answer is cheap to compute.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

from charon_search.errors import ConfigError, InfeasibleError
from charon_search.registry import Registry
from charon_search.search.rules import RuleContext

__all__ = ["EVALUATORS", "FRAMEWORK_KEYS", "Evaluator", "ValidationEvaluator", "flatten_report",
           "layout_from_config", "training_setup"]


class Evaluator:
    """Interface: ``evaluate(config) -> flat record``. One instance per worker, reused.

    Two optional hooks let a pool of workers keep its caches useful:

    * ``warm_up(configs)``: pay the first-use costs (model tracing, predictor loading) before
      the first trial, on every worker at once; the default does nothing.
    * ``affinity_key(config)``: configs with equal keys share the evaluator's expensive cached
      intermediates, so the pool sends them to the same worker where it can; None = no
      preference (the default).
    """

    #: Config keys that do not change what the evaluator caches between configs (a config's
    #: affinity key is the config without them); empty = no affinity.
    affinity_ignore: tuple[str, ...] = ()
    #: Metrics a feasible record may lack (a price needs the cluster's ``cost_per_gpu_hour``);
    #: any other metric an objective names must be in every feasible record, so a search stops
    #: at the first feasible record without it (a misspelt metric).
    optional_metrics: tuple[str, ...] = ("cost_per_million_tokens_usd",)

    def evaluate(self, cfg: Mapping[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def warm_up(self, cfgs: Sequence[Mapping[str, Any]]) -> None:
        """Load whatever evaluating ``cfgs`` would load first; results are discarded."""

    @classmethod
    def affinity_key(cls, cfg: Mapping[str, Any]) -> tuple | None:
        """Hashable key of the cached intermediates ``cfg`` uses (None = no preference)."""
        if not cls.affinity_ignore:
            return None
        return tuple(sorted((k, repr(v)) for k, v in cfg.items()
                            if k not in cls.affinity_ignore))


EVALUATORS: Registry[type[Evaluator]] = Registry("evaluator", "charon_search.evaluators")


def flatten_report(report: Any, prefix: str = "") -> dict[str, Any]:
    """Dataclass/mapping report -> flat ``{"ttft_s.p90": 0.4, ...}`` of scalars (lists dropped)."""
    if dataclasses.is_dataclass(report) and not isinstance(report, type):
        data: Any = {f.name: getattr(report, f.name) for f in dataclasses.fields(report)}
    elif hasattr(report, "to_dict"):
        data = report.to_dict()
    else:
        data = report
    out: dict[str, Any] = {}
    if not isinstance(data, Mapping):
        return {prefix.rstrip("."): data} if prefix else {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, bool | int | float | str) or v is None:
            out[key] = v
        elif hasattr(v, "item") and callable(v.item) and getattr(v, "ndim", 1) == 0:
            out[key] = v.item()  # numpy scalar
        elif isinstance(v, Mapping) or (dataclasses.is_dataclass(v) and not isinstance(v, type)):
            out.update(flatten_report(v, f"{key}."))
    return out


@functools.cache
def _layout_fields() -> frozenset[str]:
    from charon_search.layout import Layout

    return frozenset(f.name for f in dataclasses.fields(Layout))


def layout_from_config(cfg: Mapping[str, Any]) -> Any:
    """The ``Layout`` fields present in a config (other keys ignored)."""
    from charon_search.layout import Layout

    names = _layout_fields()
    return Layout.from_dict({k: v for k, v in cfg.items() if k in names})


#: Training config keys of a framework preset (``training_setup``), beside the ``Layout``'s.
FRAMEWORK_KEYS = ("framework", "framework_year", "torch_compile")


def training_setup(cfg: Mapping[str, Any], model: Any = None) -> tuple[Any, Any, dict[str, Any]]:
    """``(Layout, memory options, record fields)`` of a training config. With ``framework`` (a
    key of ``frameworks.FRAMEWORKS``; ``framework_year`` and ``torch_compile`` optional) the
    framework's facts fill the layout fields the config does not set and its memory
    conventions apply (``frameworks.framework_layout``); the record fields name the year and
    the facts applied. Without it, ``(layout, None, {})``."""
    from charon_search.frameworks import check_preset_options, framework_layout

    layout = layout_from_config(cfg)
    name = cfg.get("framework")
    compile_ = cfg.get("torch_compile", True)
    if name is not None and not isinstance(compile_, bool):  # (no "but got": choices match it)
        raise ConfigError(f"`torch_compile` must be true or false, not {compile_!r}")
    check_preset_options(name, year=cfg.get("framework_year"),
                         torch_compile=cfg.get("torch_compile"))
    if name is None:
        return layout, None, {}
    fl = framework_layout(model if model is not None else cfg["model"], layout, str(name),
                          year=cfg.get("framework_year"), torch_compile=compile_,
                          keep=set(cfg) & _layout_fields())
    facts = " ".join(f"{k}={v}" for k, v in sorted(fl.applied.items()))
    return fl.layout, fl.memory_options, {"framework_year": fl.year, "framework_facts": facts}


class _Cached(Evaluator, RuleContext):
    """An evaluator with the rules' cached model and cluster lookups."""

    def __init__(self) -> None:
        RuleContext.__init__(self)


@EVALUATORS.register("training")
class TrainingEvaluator(_Cached):
    """Memory check (``memory.memory_report``), then ``training.simulate_training``.

    The simulator caches the parallelized graph of each (model, ``PassContext``) — tp, cp, ep,
    dp, sequence parallel, ZeRO stage, recompute, precision — which costs milliseconds to build
    and is shared by every micro-batch size, sequence length and pipeline schedule of that
    context: those keys are left out of the affinity key.
    """

    affinity_ignore = ("micro_batch_size", "global_batch_size", "seq_len", "schedule", "vpp",
                       "num_micro_batches")

    def warm_up(self, cfgs: Sequence[Mapping[str, Any]]) -> None:
        """Trace each config's model and load the cost predictors its ops use.

        Simulates the step even when the config does not fit in memory (the point is to load
        what the timeline needs); errors are ignored, the trial itself will report them.
        """
        from charon_search.memory import memory_report
        from charon_search.training import simulate_training

        for cfg in cfgs:
            try:
                model, cluster = self.model(cfg["model"]), self.cluster(cfg["cluster"])
                layout, mopts, _ = training_setup(cfg, model)
                memory_report(model, layout, cluster, options=mopts)
                simulate_training(model, cluster, layout, num_gpus=layout.num_gpus,
                                  memory_options=mopts)
            except Exception:  # warming is best effort
                continue

    def evaluate(self, cfg: Mapping[str, Any]) -> dict[str, Any]:
        from charon_search.memory import memory_report
        from charon_search.training import simulate_training

        model, cluster = self.model(cfg["model"]), self.cluster(cfg["cluster"])
        layout, mopts, preset = training_setup(cfg, model)  # ConfigError: worker's "invalid:"
        rec: dict[str, Any] = {
            **preset,
            "num_gpus": layout.num_gpus,
            "device_memory_bytes": float(cluster.gpu.hbm_capacity_bytes),
            "tokens_per_step": layout.global_batch_size * layout.seq_len,
        }
        # A layout the simulator rejects (interleaving with m % pp != 0, DualPipe with an odd
        # pp, ...) is an infeasible point with the rule as its reason, whichever of the memory
        # check and the step simulator finds it (the worker's "invalid:" convention).
        try:
            mem = memory_report(model, layout, cluster, options=mopts)  # micro-milliseconds
        except ConfigError as e:
            return {**rec, "feasible": False, "prune_reason": f"invalid: {e}"}
        # ``peak_memory_bytes`` is the figure the prune compares with the device: reserved
        # plus NCCL buffers outside the allocator (``MemoryReport.peak_device_bytes``), so an
        # objective's ``peak_memory_bytes <= device`` agrees with ``fits``;
        # ``peak_reserved_bytes`` is the allocator's share alone (max_memory_reserved).
        rec["peak_memory_bytes"] = float(round(mem.peak_device_bytes))
        rec["peak_reserved_bytes"] = float(round(mem.peak_reserved_bytes))
        if not mem.fits:
            return {**rec, "feasible": False, "prune_reason": f"memory: {mem.reason}"}
        try:
            report = simulate_training(model, cluster, layout, num_gpus=layout.num_gpus,
                                       memory_options=mopts)
        except InfeasibleError as e:
            return {**rec, "feasible": False, "prune_reason": f"infeasible: {e}"}
        except ConfigError as e:
            return {**rec, "feasible": False, "prune_reason": f"invalid: {e}"}
        rec.update({k: v for k, v in flatten_report(report).items()
                    if not k.startswith("layout.")})
        mem_dict = report.memory or {}
        if mem_dict.get("peak_device_bytes") is not None:
            rec["peak_memory_bytes"] = float(round(mem_dict["peak_device_bytes"]))
        if mem_dict.get("peak_reserved_bytes") is not None:
            rec["peak_reserved_bytes"] = float(round(mem_dict["peak_reserved_bytes"]))
        _derive_training(rec, cluster)
        rec.setdefault("feasible", True)
        rec["feasible"] = True
        rec.setdefault("prune_reason", None)
        return rec


def _derive_training(rec: dict[str, Any], cluster: Any) -> None:
    """Throughput and cost per token from step time, GPUs and tokens per step."""
    step = rec.get("step_time_s")
    if not step:
        return
    tokens, n = rec["tokens_per_step"], rec["num_gpus"]
    rec.setdefault("tokens_per_s", tokens / step)
    rec.setdefault("tokens_per_s_per_gpu", tokens / step / n)
    rec["gpu_s_per_token"] = n * step / tokens
    price = float(getattr(cluster, "cost_per_gpu_hour_usd", 0.0) or 0.0)
    if price > 0:
        rec["cost_per_million_tokens_usd"] = rec["gpu_s_per_token"] * 1e6 * price / 3600.0


@EVALUATORS.register("serving")
class ServingEvaluator(_Cached):
    """``serving.simulate_serving`` on one serving config and workload from the space."""

    def evaluate(self, cfg: Mapping[str, Any]) -> dict[str, Any]:
        from charon_search.search.serving_bridge import evaluate_serving

        return evaluate_serving(self, cfg)

    def warm_up(self, cfgs: Sequence[Mapping[str, Any]]) -> None:
        """Simulate each config on a few requests (traces, KV capacity, predictors)."""
        for cfg in cfgs:
            try:
                n = int((cfg.get("workload") or {}).get("num_requests", _WARM_REQUESTS))
                self.evaluate({**cfg, "workload_num_requests": min(n, _WARM_REQUESTS)})
            except Exception:  # warming is best effort
                continue


#: Requests simulated per serving config when a worker warms up (loads, not measures).
_WARM_REQUESTS = 4


# ---------------------------------------------------------------- analytic toy
#: Constants of the toy closed form (arbitrary, chosen so the front is non-trivial).
_TOY_WORK_GPU_S = 64.0  # GPU-seconds of compute per step at perfect scaling
_TOY_SYNC_S = 0.6  # data-parallel gradient sync of unsharded weights, ring limit (dp -> inf)
_TOY_OVERHEAD_S = 0.05  # per-step fixed cost
_TOY_PARAM_BYTES = 320 * 2**30  # weights + grads + optimizer states, unsharded
_TOY_ACT_BYTES = 24 * 2**30  # activations of one micro-batch, unsharded, no recompute
_TOY_DEVICE_BYTES = 80 * 2**30
_TOY_RECOMPUTE = {"none": (1.0, 1.0), "selective": (1.05, 0.5), "full": (1.33, 0.12)}


@EVALUATORS.register("validation")
class ValidationEvaluator(Evaluator):
    """One record of ``charon-search validate``: ``{"part": validate_record(...)}``.

    The config carries the ``Record`` itself (``record``), its ``repeat`` entry and the keyword
    arguments of ``validate_record`` (``overrides``: the simulator overrides and cluster
    transform of ``run_validation``). Records of one model on one GPU share the traced model
    and the loaded tables, so they prefer the same worker (``affinity_key``).
    """

    def evaluate(self, cfg: Mapping[str, Any]) -> dict[str, Any]:
        from charon_search.validation.runner import validate_record

        return {"part": validate_record(cfg["record"], cfg.get("repeat"),
                                        **cfg.get("overrides", {}))}

    @classmethod
    def affinity_key(cls, cfg: Mapping[str, Any]) -> tuple | None:
        rec = cfg["record"]
        model = rec.model.get("catalog") or rec.model.get("name")
        return (rec.kind, str(model), str(rec.hardware.get("gpu") or rec.hardware.get("system")))


@EVALUATORS.register("toy-analytic")
class ToyAnalyticEvaluator(Evaluator):
    """Closed-form stand-in for a training step, for testing the search itself (not a simulator).

    With n = num_gpus, dp = n/(tp*pp*cp), m = global_batch_size/(micro_batch_size*dp):

    * compute_s = W/n · (1 + 0.06·log2 tp + 0.04·log2 cp) · recompute_factor
      · (1 + 0.25/micro_batch_size)                               (small GEMMs are less efficient)
    * bubble_s = compute_s · (pp−1)/m
    * comm_s = S·(1 − 1/dp)·(1 + 0.5·[zero_stage ≥ 3])/(tp·pp)
    * step_time_s = compute_s + bubble_s + comm_s + overhead
    * peak_memory_bytes = P/(tp·pp·z) + A·micro_batch_size·act_factor/(tp·cp)
      with z = dp for zero_stage ≥ 1 (sharded states) else 1.
    """

    def evaluate(self, cfg: Mapping[str, Any]) -> dict[str, Any]:
        n, tp, pp = int(cfg["num_gpus"]), int(cfg.get("tp", 1)), int(cfg.get("pp", 1))
        cp = int(cfg.get("cp", 1))
        dp = n // (tp * pp * cp)
        mbs, gbs = int(cfg.get("micro_batch_size", 1)), int(cfg.get("global_batch_size", 1024))
        zero = int(cfg.get("zero_stage", 0))
        slow, act = _TOY_RECOMPUTE[str(cfg.get("recompute", "none"))]
        m = max(gbs // (mbs * dp), 1)
        compute = (_TOY_WORK_GPU_S / n * (1 + 0.06 * math.log2(tp) + 0.04 * math.log2(cp))
                   * slow * (1 + 0.25 / mbs))
        bubble = compute * (pp - 1) / m
        comm = _TOY_SYNC_S * (1 - 1 / dp) * (1.0 + 0.5 * (zero >= 3)) / (tp * pp)
        step = compute + bubble + comm + _TOY_OVERHEAD_S
        shard = dp if zero >= 1 else 1
        peak = _TOY_PARAM_BYTES / (tp * pp * shard) + _TOY_ACT_BYTES * mbs * act / (tp * cp)
        tokens = gbs * int(cfg.get("seq_len", 4096))
        rec = {
            "num_gpus": n, "dp": dp, "step_time_s": step, "compute_s": compute,
            "bubble_s": bubble, "comm_s": comm, "peak_memory_bytes": float(round(peak)),
            "device_memory_bytes": float(_TOY_DEVICE_BYTES), "tokens_per_step": tokens,
            "tokens_per_s_per_gpu": tokens / step / n, "gpu_s_per_token": n * step / tokens,
        }
        if peak > _TOY_DEVICE_BYTES:
            return {"num_gpus": n, "peak_memory_bytes": float(round(peak)),
                    "device_memory_bytes": float(_TOY_DEVICE_BYTES), "feasible": False,
                    "prune_reason": f"memory: needs {peak / 2**30:.1f} GiB but the device has "
                                    f"{_TOY_DEVICE_BYTES / 2**30:.1f} GiB"}
        return {**rec, "feasible": True, "prune_reason": None}


@EVALUATORS.register("table")
class TableEvaluator(Evaluator):
    """Looks records up in a table of earlier results (benchmarks replaying an exhaustive run).

    Only usable in-process: construct it with the table and pass it to ``run_search``.
    """

    def __init__(self, table: Mapping[tuple, Mapping[str, Any]] | None = None) -> None:
        self.table = dict(table or {})

    def evaluate(self, cfg: Mapping[str, Any]) -> dict[str, Any]:
        from charon_search.search.space import config_key

        return dict(self.table[config_key(cfg)])
