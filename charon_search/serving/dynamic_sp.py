"""Per-request sequence parallelism for prefill attention (Charon's first case study).

A replica has ``sp`` GPUs that split the batch's tokens for the token-linear ops. For attention,
request *i* may run on ``d_i`` of them (a divisor of ``sp``): its causal attention is cut into
``2 d_i`` zigzag chunks so each of the ``d_i`` GPUs gets equal work (``attn_i / d_i``), after an
all-gather of the request's KV across the ``d_i`` GPUs. *Fixed* SP uses ``d_i = sp`` for every
request (every GPU pays every request's all-gather); *dynamic* SP picks each ``d_i`` and the
GPUs greedily (longest job first, least-loaded GPUs) to minimise the batch's attention latency,
the maximum load over GPUs. Short requests then stay on one GPU and skip the all-gather.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from charon_search.serving.iteration_cost import IterationCostModel, PrefillChunks

__all__ = ["SequenceParallelCostModel", "SpPlan", "fixed_sp_latency", "plan_dynamic_sp"]

AllGatherFn = Callable[[float, int], float]
"""(KV bytes of the request on one GPU, degree) -> seconds of the KV all-gather."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SpPlan:
    latency_s: float
    """Batch attention latency: the most loaded GPU."""
    degrees: tuple[int, ...]
    """Chosen SP degree per request (input order)."""


def _degree_options(sp: int) -> list[int]:
    return [d for d in range(1, sp + 1) if sp % d == 0]


def fixed_sp_latency(attn_s: Sequence[float], kv_bytes: Sequence[float], sp: int,
                     all_gather: AllGatherFn) -> float:
    """Every request split over all ``sp`` GPUs (zigzag): sum of per-request times."""
    if sp == 1:
        return float(sum(attn_s))
    return float(sum(a / sp + all_gather(kv, sp) for a, kv in zip(attn_s, kv_bytes)))


def plan_dynamic_sp(attn_s: Sequence[float], kv_bytes: Sequence[float], sp: int,
                    all_gather: AllGatherFn) -> SpPlan:
    """Greedy per-request degrees and placement minimising the max GPU load.

    Requests are placed longest first; each tries every degree ``d`` dividing ``sp`` on the
    ``d`` least-loaded GPUs and keeps the one giving the smallest resulting maximum (ties: less
    total GPU time). Never worse than fixed SP on one request; O(n sp log sp).
    """
    n = len(attn_s)
    degrees = [1] * n
    loads = [0.0] * sp
    options = _degree_options(sp)
    for i in sorted(range(n), key=lambda j: -attn_s[j]):
        order = sorted(range(sp), key=loads.__getitem__)
        best: tuple[float, float, int] | None = None
        current_max = max(loads)
        for d in options:
            t = attn_s[i] / d + (all_gather(kv_bytes[i], d) if d > 1 else 0.0)
            new_max = max(current_max, loads[order[d - 1]] + t)
            cand = (new_max, t * d, d)
            if best is None or cand < best:
                best = cand
        assert best is not None
        d = best[2]
        t = attn_s[i] / d + (all_gather(kv_bytes[i], d) if d > 1 else 0.0)
        for g in order[:d]:
            loads[g] += t
        degrees[i] = d
    return SpPlan(latency_s=max(loads) if loads else 0.0, degrees=tuple(degrees))


class SequenceParallelCostModel(IterationCostModel):
    """Wraps a replica's cost model with prefill sequence parallelism over ``sp`` GPUs.

    Token-linear ops run on ``ceil(T / sp)`` tokens per GPU; decode requests are spread over the
    ``sp`` GPUs (each keeps whole requests' KV); prefill attention follows the fixed or the
    dynamic plan.
    """

    def __init__(self, base: IterationCostModel, *, sp: int, dynamic: bool,
                 all_gather: AllGatherFn) -> None:
        self.base = base
        self.sp = sp
        self.dynamic = dynamic
        self.all_gather = all_gather
        self.num_kernels = base.num_kernels
        self.last_fixed_s = 0.0
        self.last_dynamic_s = 0.0
        self.saved_s = 0.0
        """Prefill-attention time dynamic SP saved over fixed SP, summed over iterations."""

    def token_linear_s(self, tokens: int, rows: int) -> float:
        return self.base.token_linear_s(-(-tokens // self.sp), -(-rows // self.sp))

    def prefill_attention_s(self, q_len: int, kv_len: int) -> float:
        return self.base.prefill_attention_s(q_len, kv_len)

    def decode_attention_s(self, num: int, kv_sum: float, q: int = 1) -> float:
        if num <= 0:
            return 0.0
        per = -(-num // self.sp)
        return self.base.decode_attention_s(per, kv_sum * per / num, q)

    def kv_bytes_per_token(self) -> float:
        return self.base.kv_bytes_per_token()

    def batch_prefill_attention_s(self, prefill: PrefillChunks) -> float:
        attn = [self.base.prefill_attention_s(q, kv) for q, kv in prefill]
        kvb = [kv * self.base.kv_bytes_per_token() for _, kv in prefill]
        fixed = fixed_sp_latency(attn, kvb, self.sp, self.all_gather)
        if not self.dynamic:
            return fixed
        dyn = plan_dynamic_sp(attn, kvb, self.sp, self.all_gather).latency_s
        self.saved_s += max(0.0, fixed - dyn)
        return min(dyn, fixed)

    def iteration_s(self, prefill: PrefillChunks, num_decode: int, decode_kv_sum: float,
                    decode_q: int = 1, *, padded_decode: int = 0) -> float:
        tokens = sum(q for q, _ in prefill) + max(num_decode, padded_decode) * decode_q
        if tokens == 0:
            return 0.0
        attn = self.batch_prefill_attention_s(prefill) if prefill else 0.0
        attn += self.decode_attention_s(num_decode, decode_kv_sum, decode_q)
        return self.token_linear_s(tokens, len(prefill) + num_decode * decode_q) + attn
