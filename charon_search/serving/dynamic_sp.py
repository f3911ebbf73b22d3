"""Per-request sequence parallelism for prefill attention (Charon's first case study).

A replica has ``sp`` GPUs that split the batch's tokens for the token-linear ops. For attention,
request *i* may run on ``d_i`` of them (a divisor of ``sp``): its causal attention is cut into
``2 d_i`` zigzag chunks so each of the ``d_i`` GPUs gets equal work (``attn_i / d_i``), after an
all-gather of the request's KV across the ``d_i`` GPUs. *Fixed* SP uses ``d_i = sp`` for every
request (every GPU pays every request's all-gather); *dynamic* SP picks each ``d_i`` and the
GPUs (local search from fixed SP, placing longest first on the least-loaded GPUs) to minimise
the batch's attention latency, the maximum load over GPUs. Short requests then stay on one GPU
and skip the all-gather.
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


def _makespan(per_gpu_s: Sequence[float], degrees: Sequence[int], sp: int) -> float:
    """Max GPU load when each request (longest first) goes to its d least-loaded GPUs."""
    loads = [0.0] * sp
    for i in sorted(range(len(per_gpu_s)), key=lambda j: -per_gpu_s[j]):
        for g in sorted(range(sp), key=loads.__getitem__)[: degrees[i]]:
            loads[g] += per_gpu_s[i]
    return max(loads) if loads else 0.0


def plan_dynamic_sp(attn_s: Sequence[float], kv_bytes: Sequence[float], sp: int,
                    all_gather: AllGatherFn) -> SpPlan:
    """Per-request degrees minimising the batch's attention latency (max GPU load).

    Local search (one request's degree at a time, shortest requests first, until a pass changes
    nothing; placement longest first onto the least-loaded GPUs) from three starts: fixed SP
    (every request at ``sp``), every request on one GPU, and a greedy longest-first choice.
    The fixed-SP start makes the plan never worse than fixed SP.
    """
    n = len(attn_s)
    options = _degree_options(sp)

    def per_gpu(i: int, d: int) -> float:
        return attn_s[i] / d + (all_gather(kv_bytes[i], d) if d > 1 else 0.0)

    table = [{d: per_gpu(i, d) for d in options} for i in range(n)]

    def span(degs: Sequence[int]) -> float:
        return _makespan([table[i][degs[i]] for i in range(n)], degs, sp)

    def local_search(degs: list[int]) -> tuple[float, list[int]]:
        cur = span(degs)
        for _ in range(4):
            changed = False
            for i in sorted(range(n), key=lambda j: attn_s[j]):
                for d in options:
                    if d == degs[i]:
                        continue
                    trial = degs.copy()
                    trial[i] = d
                    t = span(trial)
                    if t < cur - 1e-15:
                        cur, degs, changed = t, trial, True
            if not changed:
                break
        return cur, degs

    # Multi-start: fixed SP, everything local, and a greedy longest-first placement.
    greedy = [1] * n
    loads = [0.0] * sp
    for i in sorted(range(n), key=lambda j: -attn_s[j]):
        order = sorted(range(sp), key=loads.__getitem__)
        d = min(options, key=lambda dd: (max(max(loads), loads[order[dd - 1]] + table[i][dd]),
                                         dd * table[i][dd]))
        for g in order[:d]:
            loads[g] += table[i][d]
        greedy[i] = d
    best, degrees = local_search([sp] * n)
    for start in ([1] * n, greedy):
        t, degs = local_search(start)
        if t < best - 1e-15:
            best, degrees = t, degs
    return SpPlan(latency_s=best, degrees=tuple(degrees))


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
        self.num_attention_kernels = base.num_attention_kernels
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
        return dyn

    def iteration_s(self, prefill: PrefillChunks, num_decode: int, decode_kv_sum: float,
                    decode_q: int = 1, *, padded_decode: int = 0) -> float:
        tokens = sum(q for q, _ in prefill) + max(num_decode, padded_decode) * decode_q
        if tokens == 0:
            return 0.0
        attn = self.batch_prefill_attention_s(prefill) if prefill else 0.0
        attn += self.decode_attention_s(num_decode, decode_kv_sum, decode_q)
        return self.token_linear_s(tokens, len(prefill) + num_decode * decode_q) + attn
