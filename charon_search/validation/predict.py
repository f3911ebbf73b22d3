"""Run the simulators on a translated case and turn their reports into the record's metrics.

Training: ``simulate_training(model, cluster, layout)`` gives the step time; every throughput and
FLOP-rate metric is derived from it with the record's ``flop_convention`` (``flops.py``), so the
comparison counts FLOPs the way the source did. Memory metrics come from the ``StepReport``'s
memory block (or ``memory_report``). Serving: ``simulate_serving(model, cluster, config,
workload)`` gives mean TTFT/TPOT and throughput.

Metrics the simulator cannot produce are returned with a reason, never dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from charon_search.validation.flops import (
    convention_peak_flops_per_s,
    hardware_flops_per_step,
    model_flops_per_step,
)
from charon_search.validation.names import Unexpressible
from charon_search.validation.stats import group_of
from charon_search.validation.translate import ServingCase, TrainingCase

__all__ = ["CaseResult", "predict_case", "read_number"]

#: Metrics nothing in the simulator corresponds to, with the reason.
_NOT_MODELLED = {
    "pretraining_gpu_time_s": "whole-run figure: needs the token count, batch ramp and restarts",
    "time_to_train_s": "time-to-train depends on convergence, not only step time",
    "mfu_relative_to_megatron_lm": "relative to an unstated Megatron-LM baseline run",
    "output_tokens_per_s_per_user_min": "per-user speed range of real traffic",
    "output_tokens_per_s_per_user_max": "per-user speed range of real traffic",
    "prefill_step_time_s": "single prefill step of an unstated batch",
}


@dataclass(frozen=True, kw_only=True)
class CaseResult:
    """Predictions of one record."""

    predicted: Mapping[str, float]
    skipped_metrics: Mapping[str, str] = field(default_factory=dict)
    info: Mapping[str, Any] = field(default_factory=dict)
    """Simulator facts worth reporting (step time, cost sources, cluster)."""


def read_number(obj: Any, *path: str) -> float | None:
    """``obj.a.b`` / ``obj["a"]["b"]``; a ``{"mean": x}`` / ``.mean`` leaf gives x."""
    cur = obj
    for key in path:
        if cur is None:
            return None
        if isinstance(cur, Mapping):
            cur = cur.get(key)
        else:
            cur = getattr(cur, key, None)
    if cur is None:
        return None
    if isinstance(cur, Mapping):
        cur = cur.get("mean", cur.get("p50"))
    elif not isinstance(cur, int | float) and hasattr(cur, "mean"):
        cur = cur.mean
    try:
        return float(cur)
    except (TypeError, ValueError):
        return None


def _stages(mem: Any) -> list[Any]:
    stages = mem.get("stages") if isinstance(mem, Mapping) else getattr(mem, "stages", None)
    return list(stages or [])


def _memory_metrics(case: TrainingCase, report: Any,
                    memory_fn: Callable[..., Any] | None) -> tuple[dict[str, float], str | None]:
    mem = report.get("memory") if isinstance(report, Mapping) else getattr(report, "memory", None)
    kwargs: dict[str, Any] = {}
    if memory_fn is None and case.memory_options is not None:
        # The framework's conventions (state recipe, SAC policy, attention kernel) instead of
        # the memory defaults the StepReport was built with.
        mem, kwargs = None, {"options": case.memory_options}
    if mem is None:
        if memory_fn is not None:
            fn = memory_fn
        else:
            try:
                from charon_search.memory import memory_report
            except ImportError as e:
                return {}, f"memory model not available: {e}"
            fn = memory_report
        try:
            mem = fn(case.model, case.layout, case.cluster, **kwargs)
        except Exception as e:
            return {}, f"memory model failed: {type(e).__name__}: {e}"
    out: dict[str, float] = {}
    peak = read_number(mem, "peak_reserved_bytes")
    if peak is not None:
        out["peak_memory_bytes"] = peak
    stages = _stages(mem)
    if stages:
        static = [sum(read_number(s, k) or 0.0 for k in ("params_bytes", "grads_bytes",
                                                          "optimizer_bytes")) for s in stages]
        # Stored activations (no transient), as Korthikanti et al.'s closed forms count them;
        # older memory reports only carry the peak.
        acts = [read_number(s, "saved_activations_bytes") or read_number(s, "activations_bytes")
                or 0.0 for s in stages]
        out["params_grads_optimizer_memory_bytes"] = max(static)
        out["activation_memory_bytes"] = max(acts)
    return out, None


def _training(case: TrainingCase, simulate: Callable[..., Any] | None,
              memory_fn: Callable[..., Any] | None) -> CaseResult:
    rec = case.record
    lay = case.layout
    if simulate is not None:
        sim = simulate
    else:
        try:
            from charon_search.training import simulate_training
        except ImportError as e:
            raise Unexpressible(f"training simulator not available: {e}") from e
        sim = simulate_training
    if simulate is None and memory_fn is None and case.memory_options is not None:
        report = sim(case.model, case.cluster, lay, memory=False)  # memory: framework options
    else:
        report = sim(case.model, case.cluster, lay)
    step = read_number(report, "step_time_s")
    if step is None or not step > 0:
        raise Unexpressible(f"training simulator returned no step time ({step!r})")
    n = lay.num_gpus
    tokens = lay.global_batch_size * lay.seq_len
    conv = rec.flop_convention
    pred: dict[str, float] = {}
    skipped: dict[str, str] = {}
    memory, mem_err = None, None
    for metric in rec.measured:
        if metric in _NOT_MODELLED:
            skipped[metric] = _NOT_MODELLED[metric]
            continue
        try:
            value = (_layer_metric(metric, case, report) if metric.startswith("layer_") else
                     _training_metric(metric, case, step, tokens, n, conv))
        except Unexpressible as e:
            skipped[metric] = str(e)
            continue
        if value is None and metric.endswith("_bytes"):
            if memory is None and mem_err is None:
                memory, mem_err = _memory_metrics(case, report, memory_fn)
            value = (memory or {}).get(metric)
            if value is None:
                skipped[metric] = mem_err or "memory model gave no value for this metric"
                continue
        if value is None:
            skipped[metric] = (f"{metric} is a serving metric; a training record's metrics are "
                               "step times, throughput, FLOP rates and memory"
                               if (group_of(metric) or "").startswith("serving_") else
                               "metric not in the schema vocabulary known to the validator")
            continue
        pred[metric] = value
    info: dict[str, Any] = {"step_time_s": step, "num_gpus": n}
    cs = report.get("cost_sources") if isinstance(report, Mapping) else getattr(
        report, "cost_sources", None)
    if cs:
        info["cost_sources"] = dict(cs)
    return CaseResult(predicted=pred, skipped_metrics=skipped, info=info)


#: Per-layer metrics of the schema -> the ``StepReport.layer_times_s`` entries they add up.
_LAYER_METRICS = {"layer_forward_time_s": ("forward_s",),
                  "layer_backward_time_s": ("backward_s",),
                  "layer_forward_backward_time_s": ("forward_s", "backward_s")}


def _layer_metric(metric: str, case: TrainingCase, report: Any) -> float | None:
    """One transformer layer's time (``StepReport.layer_times_s`` of the model's most common
    block type, steady state in a chain of layers; the backward includes any recompute)."""
    parts = _LAYER_METRICS.get(metric)
    if parts is None:
        return None
    times = (report.get("layer_times_s") if isinstance(report, Mapping)
             else getattr(report, "layer_times_s", None)) or {}
    types = [t for t in (getattr(case.model, "layer_types", None) or ()) if t in times]
    block = max(set(types), key=types.count) if types else (
        "dense" if "dense" in times else None)
    if block is None:
        raise Unexpressible("the training simulator reported no per-layer times")
    return sum(float(times[block][p]) for p in parts)


def _training_metric(metric: str, case: TrainingCase, step: float, tokens: float, n: int,
                     conv: str | None) -> float | None:
    lay = case.layout
    B, s = lay.global_batch_size, lay.seq_len
    if metric == "step_time_s":
        return step
    if metric == "tokens_per_s":
        return tokens / step
    if metric == "tokens_per_s_per_gpu":
        return tokens / step / n
    if metric == "gpu_time_per_trillion_tokens_s":
        return 1e12 / (tokens / step) * n
    if metric == "wall_time_per_trillion_tokens_s":
        return 1e12 / (tokens / step)
    if metric.startswith("reported_tflops"):
        raise Unexpressible("the source does not say how it counts FLOPs (unstated)")
    if metric in ("model_tflops_per_gpu", "model_tflops_total", "mfu",
                  "hardware_tflops_per_gpu", "hardware_tflops_total", "hfu"):
        if conv is None:
            raise Unexpressible("FLOP metric without a flop_convention")
        if metric.startswith("hardware") or metric == "hfu":
            flops = hardware_flops_per_step(conv, case.arch, B, s, lay.recompute)
        else:
            flops = model_flops_per_step(conv, case.arch, B, s)
        per_gpu = flops / step / n
        if metric.endswith("_per_gpu"):
            return per_gpu / 1e12
        if metric.endswith("_total"):
            return per_gpu * n / 1e12
        prec = case.record.config.get("precision")
        return per_gpu / convention_peak_flops_per_s(conv, str(case.record.hardware["gpu"]),
                                                     prec)
    return None


def _serving(case: ServingCase, simulate: Callable[..., Any] | None) -> CaseResult:
    if simulate is not None:
        sim = simulate
    else:
        try:
            from charon_search.serving import simulate_serving
        except ImportError as e:
            raise Unexpressible(f"serving simulator not available: {e}") from e
        sim = simulate_serving
    closed = getattr(case.workload, "closed_loop", False)
    try:
        report = sim(case.model, case.cluster, case.config, case.workload,
                     keep_requests=closed)
    except TypeError:  # a simulator without per-request output
        report = sim(case.model, case.cluster, case.config, case.workload)
    pred: dict[str, float] = {}
    skipped: dict[str, str] = {}
    ttft, tpot = predicted_latencies(case, report)
    values = {
        "ttft_s": ttft,
        "tpot_s": tpot,
        "output_tokens_per_s": read_number(report, "output_tokens_per_s"),
        "requests_per_s": read_number(report, "requests_per_s"),
    }
    tps = values["output_tokens_per_s"]
    if tps is not None:
        values["output_tokens_per_s_per_gpu"] = tps / case.num_gpus
        gpn = case.record.hardware.get("gpus_per_node") or 8
        values["output_tokens_per_s_per_node"] = tps / case.num_gpus * gpn
    for metric in case.record.measured:
        if metric in _NOT_MODELLED:
            skipped[metric] = _NOT_MODELLED[metric]
        elif values.get(metric) is None:
            skipped[metric] = "serving simulator gave no value for this metric"
        else:
            pred[metric] = float(values[metric])  # type: ignore[arg-type]
    info: dict[str, Any] = {"num_gpus": case.num_gpus}
    for k in ("num_completed", "num_requests", "num_preemptions"):
        v = read_number(report, k)
        if v is not None:
            info[k] = v
    return CaseResult(predicted=pred, skipped_metrics=skipped, info=info)


def measured_skip(case: ServingCase) -> int:
    """Simulated requests a closed-loop case leaves out of its means (the benchmark's warm-up,
    else the first wave); 0 for other workloads."""
    if not getattr(case.workload, "closed_loop", False):
        return 0
    return int(case.extra.get("warmup_requests", getattr(case.workload, "concurrency", 0)))


def predicted_latencies(case: ServingCase, report: Any) -> tuple[float | None, float | None]:
    """The (TTFT, TPOT) validate compares with a serving case's measurement: a closed loop's
    settled requests (``_steady_state``), else the report's means."""
    if getattr(case.workload, "closed_loop", False):
        steady = _steady_state(report, measured_skip(case),
                               nominal=int(case.extra.get("measured_requests", 0)),
                               wave=int(case.extra.get("concurrency", 0)),
                               drain=int(case.extra.get("drain_requests", 0)))
        if steady is not None:
            return steady
    return read_number(report, "ttft_s"), read_number(report, "tpot_s")


def _steady_state(report: Any, skip: int, *, nominal: int = 0, wave: int = 0,
                  drain: int = 0) -> tuple[float, float] | None:
    """Mean TTFT/TPOT of a closed loop without its first ``skip`` (warm-up) requests.

    Silicon rows: the benchmark's warm-up requests (``ServingCase.extra["warmup_requests"]``)
    are not measured; other closed loops: the first wave (the concurrency), whose requests all
    arrive at t = 0. They are left out when enough later requests exist.

    When the benchmark measured ``nominal`` requests but fewer were simulated, the first
    measured wave (``wave`` requests) keeps its weight ``wave / nominal`` in the mean and the
    simulated rest stands for the remaining turns (they repeat the settled pattern).
    The last ``drain`` simulated requests (a turn simulated past the measured window) run while
    arrivals stop, as the benchmark's own last turn does: they keep that turn's weight
    ``drain / nominal`` and are not counted as settled.
    """
    per = report.get("per_request") if isinstance(report, Mapping) else getattr(
        report, "per_request", None)
    if not per or skip < 0 or (skip == 0 and not nominal):
        return None
    import numpy as np

    rid = np.asarray(per["request_id"], dtype=float)
    ttft = np.asarray(per["ttft_s"], dtype=float)
    tpot = np.asarray(per["tpot_s"], dtype=float)
    keep = rid >= skip
    if keep.sum() < max(1, min(max(skip, wave), 16) // 2):
        return None
    tail = rid >= rid.max() + 1 - drain if drain else np.zeros(rid.shape, dtype=bool)
    out = []
    for t in (ttft, tpot):
        ok = keep & np.isfinite(t)
        if not ok.any():
            return None
        first = ok & (rid < skip + wave)
        last = ok & tail & ~first
        rest = ok & ~first & ~last
        if 0 < wave < nominal and nominal > (ok & ~tail).sum() and first.any() and rest.any():
            w = wave / nominal
            mean = w * t[first].mean()
            w_last = 0.0
            if last.any():
                w_last = min(drain, nominal - wave) / nominal
                mean += w_last * t[last].mean()
            out.append(float(mean + (1.0 - w - w_last) * t[rest].mean()))
        else:
            out.append(float(t[ok].mean()))
    return out[0], out[1]


def predict_case(case: TrainingCase | ServingCase, *,
                 simulate_training: Callable[..., Any] | None = None,
                 simulate_serving: Callable[..., Any] | None = None,
                 memory_report: Callable[..., Any] | None = None) -> CaseResult:
    """Predict every measured metric of a case (simulators injectable for tests).

    Raises:
        Unexpressible: the simulator is missing, or rejected the configuration.
    """
    from charon_search.errors import CharonError

    try:
        if isinstance(case, TrainingCase):
            return _training(case, simulate_training, memory_report)
        return _serving(case, simulate_serving)
    except CharonError as e:
        raise Unexpressible(f"simulator rejected the configuration: {type(e).__name__}: "
                            f"{e}") from e
