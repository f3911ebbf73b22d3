"""ServingReport: latency percentiles, throughput and engine statistics of a serving run.

Metric names are the field names (``ttft_s``, ``tpot_s``, ...); objectives refer to them.
TPOT of a request is ``(e2e - ttft) / (output_tokens - 1)`` (requests with one output token
have none); ``tokens_per_s_per_user`` is ``1 / mean TPOT``. ITL comes per token (``itl_s``:
a decode iteration divided by the tokens it commits, as SGLang's ``bench_serving`` spreads a
streamed chunk's gap over its tokens) and per streamed chunk (``itl_per_chunk_s``: one decode
iteration, as vLLM's ``benchmark_serving`` / ``vllm bench serve`` appends one gap per chunk).
They differ only under speculative decoding, where a step commits ``mean_tokens_per_step``
tokens.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["ServingReport", "latency_stats", "weighted_stats"]

STAT_KEYS = ("mean", "p50", "p90", "p99")


def latency_stats(values: np.ndarray) -> dict[str, float]:
    """``{"mean","p50","p90","p99"}`` of the finite values (NaN when there are none)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return {k: float("nan") for k in STAT_KEYS}
    p50, p90, p99 = np.percentile(v, [50, 90, 99])
    return {"mean": float(v.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def weighted_stats(values: np.ndarray, weights: np.ndarray) -> dict[str, float]:
    """Weighted mean and percentiles (inverted weighted CDF)."""
    v = np.asarray(values, dtype=float)
    w = np.asarray(weights, dtype=float)
    keep = np.isfinite(v) & (w > 0)
    v, w = v[keep], w[keep]
    if v.size == 0:
        return {k: float("nan") for k in STAT_KEYS}
    order = np.argsort(v)
    v, w = v[order], w[order]
    cdf = np.cumsum(w) / w.sum()
    out = {"mean": float(np.average(v, weights=w))}
    for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
        out[name] = float(v[min(int(np.searchsorted(cdf, q)), v.size - 1)])
    return out


@dataclass(frozen=True, kw_only=True)
class ServingReport:
    """Result of ``simulate_serving``. Times in seconds, rates per second."""

    ttft_s: Mapping[str, float]
    """Time to first token: ``{"mean","p50","p90","p99"}``."""
    tpot_s: Mapping[str, float]
    """Time per output token after the first, per request."""
    itl_s: Mapping[str, float]
    """Inter-token latency per token: each decode iteration's duration divided by the tokens
    it commits (``mean_tokens_per_step``), weighted by those tokens (SGLang ``bench_serving``,
    which divides a chunk's gap by its tokens). vLLM's benchmark reports one gap per streamed
    chunk instead: ``itl_per_chunk_s``."""
    e2e_s: Mapping[str, float]
    """End-to-end latency (arrival to last token)."""
    requests_per_s: float
    output_tokens_per_s: float
    tokens_per_s_per_user: float
    """``1 / mean TPOT``."""
    tokens_per_s_per_gpu: float
    """Output tokens per second divided by ``num_gpus``."""
    num_gpus: int
    num_requests: int
    num_completed: int
    num_preemptions: int
    prefix_hit_rate: float
    """Prompt tokens served from the prefix cache at each request's first admission / prompt
    tokens (a recompute after a preemption is not counted again), in [0, 1]."""
    kv_utilization: float
    """Time-averaged used KV blocks / capacity (mean over replicas)."""
    mean_requests_in_system: float
    """Time-averaged requests arrived and not finished over the measurement window."""
    arrival_rate: float
    """Requests per second arriving over the measurement window."""
    goodput_requests_per_s: float
    """Completed requests per second meeting the SLOs (all completed when no SLO is set)."""
    slo_attainment: float
    """Fraction of completed requests meeting the SLOs."""
    duration_s: float
    """Simulated time from the first arrival to the last completion: the window of
    ``requests_per_s``, ``output_tokens_per_s`` and goodput. A closed loop whose first wave
    was ramped in (``WorkloadSpec.ramp_up_s``, by default over one request lifetime) starts
    it at the ramp's last start and counts the tokens streamed inside it, as a benchmark
    client that starts every stream at once would see the loop."""
    num_iterations: int
    kv_capacity_tokens: int
    """KV-cache capacity per replica of the (decode) pool, in tokens held in every KV layer."""
    kv_window_tokens: int = 0
    """Tokens of a request its sliding-window / chunked-attention layers keep at most
    (``ServingConfig.windowed_kv``); 0 = every layer keeps every token."""
    mean_tokens_per_step: float = 1.0
    """Tokens a request commits per decode step (k+1 at full speculative acceptance)."""
    dynamic_sp_saved_s: float = 0.0
    """Prefill-attention time dynamic SP saved against fixed SP, summed over iterations."""
    frontend_busy: float = 0.0
    """Fraction of the run the serving front end spent streaming output tokens (output tokens x
    ``frontend_output_token_s`` plus its streaming cycles' ``frontend_output_stream_s`` per
    request served, / duration, per front end: Dynamo has one per replica): near 1 a
    per-token front end, not the engine, bounds the output rate; a cycling one merges chunks
    and lags instead."""
    config: Mapping[str, Any] = field(default_factory=dict)
    per_request: Mapping[str, Sequence[float]] | None = None
    """Columns ``request_id, arrived_at_s, prompt_tokens, output_tokens, ttft_s, e2e_s,
    tpot_s, num_preemptions, prefix_hit_tokens`` (when kept)."""

    @property
    def itl_per_chunk_s(self) -> dict[str, float]:
        """Inter-token latency per streamed chunk: one decode iteration per request it gives
        tokens to (vLLM ``benchmark_serving``: ``output.itl.append(timestamp -
        most_recent_timestamp)`` per chunk). Each iteration's per-token ITL is its duration /
        ``mean_tokens_per_step`` with weight (requests x ``mean_tokens_per_step``), so the
        per-chunk statistics are exactly ``itl_s`` x ``mean_tokens_per_step``."""
        return {k: v * self.mean_tokens_per_step for k, v in self.itl_s.items()}

    def to_dict(self, *, include_requests: bool = False) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name != "per_request"}
        for k in ("ttft_s", "tpot_s", "itl_s", "e2e_s", "config"):
            out[k] = dict(out[k])
        out["itl_per_chunk_s"] = self.itl_per_chunk_s
        if include_requests and self.per_request is not None:
            out["per_request"] = {k: list(v) for k, v in self.per_request.items()}
        return out

    def to_json(self, path: str | Path) -> None:
        """The report as strict JSON: a quantity without samples (NaN: the TPOT of requests
        with one output token) is ``null``."""
        Path(path).write_text(json.dumps(_nan_to_none(self.to_dict()), indent=2,
                                         default=_jsonable, allow_nan=False) + "\n")

    def write_requests_parquet(self, path: str | Path) -> None:
        """Per-request results as Parquet (needs ``keep_requests=True`` in the simulation)."""
        if self.per_request is None:
            raise ValueError("no per-request results kept; simulate with keep_requests=True")
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({k: np.asarray(v) for k, v in self.per_request.items()}),
                       str(path))

    def summary(self) -> str:
        from charon_search.units import format_seconds as fs

        return (
            f"requests {self.num_completed}/{self.num_requests} on {self.num_gpus} GPUs | "
            f"TTFT mean {fs(self.ttft_s['mean'])} p99 {fs(self.ttft_s['p99'])} | "
            f"TPOT mean {fs(self.tpot_s['mean'])} p99 {fs(self.tpot_s['p99'])} | "
            f"{self.requests_per_s:.2f} req/s, {_rate(self.output_tokens_per_s)} tok/s, "
            f"{_rate(self.tokens_per_s_per_gpu)} tok/s/GPU, {self.tokens_per_s_per_user:.1f} "
            f"tok/s/user | preemptions {self.num_preemptions}, KV util "
            f"{self.kv_utilization:.1%}, prefix hits {self.prefix_hit_rate:.1%}"
            + (f", front end busy {self.frontend_busy:.0%}" if self.frontend_busy else "")
        )


def _rate(x: float) -> str:
    """A token rate for the summary line: whole tokens from 100/s, else three digits (a slow
    run's 0.5 tok/s is not printed as 0)."""
    return f"{x:.0f}" if x >= 100 else f"{x:.3g}"


def _nan_to_none(x: Any) -> Any:
    """``x`` with every NaN float (in dicts, lists and tuples) replaced by None."""
    if isinstance(x, float | np.floating):
        return None if x != x else x
    if isinstance(x, Mapping):
        return {k: _nan_to_none(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_nan_to_none(v) for v in x]
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return _nan_to_none(dataclasses.asdict(x))
    return x


def _jsonable(x: Any) -> Any:
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if dataclasses.is_dataclass(x):
        return dataclasses.asdict(x)  # type: ignore[arg-type]
    return str(x)
