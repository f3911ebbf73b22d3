"""Per-request sequence parallelism for prefill attention (Charon's first case study).

A replica has ``sp`` GPUs that split the batch's tokens for the token-linear ops. For attention,
request *i* may run on ``d_i`` of them (a divisor of ``sp``): its causal attention is cut into
``2 d_i`` zigzag chunks so each of the ``d_i`` GPUs gets an equal share of its work, after an
all-gather of the request's KV across the ``d_i`` GPUs. A GPU runs all its chunks in one
variable-length attention launch (as the base model batches an iteration's prefill chunks), so
it pays the kernel's fixed time (``floor_s``) once and each chunk adds its share of the work
above that floor. *Fixed* SP uses ``d_i = sp`` for every request (every GPU pays every
request's all-gather); *dynamic* SP picks each ``d_i`` and the GPUs to keep the batch's
attention latency, the most loaded GPU, low (``plan_dynamic_sp``: a heuristic search, never
worse than fixed SP). Short requests then stay on one GPU and skip the all-gather.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from charon_search.serving.iteration_cost import IterationCostModel, PrefillChunks

__all__ = ["SequenceParallelCostModel", "SpPlan", "fixed_sp_latency", "plan_dynamic_sp"]

AllGatherFn = Callable[[float, int], float]
"""(KV bytes of the request on one GPU, degree) -> seconds of the KV all-gather."""

PAIR_MOVES_MAX_REQUESTS = 16
"""``plan_dynamic_sp`` also changes two requests' degrees together in batches of up to this
many prefill chunks: with few requests on the GPUs a single change often cannot lower the
most loaded GPU, a pair can; the O(n^2) trials are not worth it for larger batches."""
_MAX_PASSES = 8
_EPS = 1e-15


@dataclass(frozen=True, slots=True, kw_only=True)
class SpPlan:
    latency_s: float
    """Batch attention latency: the most loaded GPU."""
    degrees: tuple[int, ...]
    """Chosen SP degree per request (input order)."""


def _degree_options(sp: int) -> list[int]:
    return [d for d in range(1, sp + 1) if sp % d == 0]


def _per_gpu_s(attn_s: float, kv_bytes: float, d: int, all_gather: AllGatherFn,
               floor_s: float) -> float:
    """What a request at degree ``d`` adds to each of its GPUs: its work above the kernel
    floor split ``d`` ways, plus its KV all-gather when ``d > 1``."""
    return max(0.0, attn_s - floor_s) / d + (all_gather(kv_bytes, d) if d > 1 else 0.0)


def fixed_sp_latency(attn_s: Sequence[float], kv_bytes: Sequence[float], sp: int,
                     all_gather: AllGatherFn, *, floor_s: float = 0.0) -> float:
    """Every request split over all ``sp`` GPUs (zigzag): each GPU runs every request's share
    in one launch (one kernel floor ``floor_s``) and every request's all-gather."""
    if not attn_s:
        return 0.0
    return floor_s + float(sum(_per_gpu_s(a, kv, sp, all_gather, floor_s)
                               for a, kv in zip(attn_s, kv_bytes)))


def _makespan(per_gpu_s: Sequence[float], degrees: Sequence[int], sp: int,
              floor_s: float = 0.0) -> float:
    """Max GPU load when each request (longest first) goes to its d least-loaded GPUs; a GPU
    that runs any chunk pays the kernel floor once."""
    loads = [0.0] * sp
    used = [False] * sp
    every = range(sp)
    for i in sorted(range(len(per_gpu_s)), key=lambda j: -per_gpu_s[j]):
        d = degrees[i]
        if d == sp:
            gpus: Sequence[int] = every
        elif d == 1:
            gpus = (min(every, key=loads.__getitem__),)
        else:
            gpus = sorted(every, key=loads.__getitem__)[:d]
        for g in gpus:
            if not used[g]:
                used[g] = True
                loads[g] += floor_s
            loads[g] += per_gpu_s[i]
    return max(loads) if per_gpu_s else 0.0


def plan_dynamic_sp(attn_s: Sequence[float], kv_bytes: Sequence[float], sp: int,
                    all_gather: AllGatherFn, *, floor_s: float = 0.0) -> SpPlan:
    """Per-request degrees for a low batch attention latency (the most loaded GPU).

    A heuristic, not an exhaustive search (that grows as ``divisors ** n``), except for a
    single request, which gets its best degree; placement puts each request, longest first,
    on its d least-loaded GPUs. Start plans: every request at the same degree (one plan per
    divisor of ``sp``, fixed SP among them); the threshold plans, where every request takes
    the fewest GPUs that bring its per-GPU time to a bound T (one plan per distinct T), so a
    request with more attention and more KV never gets fewer GPUs than another; and a greedy
    longest-first choice. Local search (one request's degree at a time, shortest first, until
    a pass changes nothing) runs from the best start, fixed SP, every request on one GPU and
    the greedy plan; the best result is then searched again with pair moves (two requests'
    degrees changed together) for batches of up to ``PAIR_MOVES_MAX_REQUESTS``. Trials that
    cannot beat the current plan (no placement beats the largest per-GPU time, nor the
    GPU-seconds spread evenly over ``sp`` GPUs) are skipped without placing them.

    The plan is never worse than fixed SP. It is not forced to give longer requests at least
    as many GPUs: giving a shorter one more can pack the GPUs better, and the search keeps
    such a plan only when it is faster than every plan it tried.
    """
    n = len(attn_s)
    if n == 0:
        return SpPlan(latency_s=0.0, degrees=())
    search = _Search(attn_s, kv_bytes, sp, all_gather, floor_s)
    if n == 1 or len(search.options) == 1:
        ks = [min(range(len(search.options)), key=lambda k: (search.w[i][k], k))
              for i in range(n)]
        return search.plan(search.span(ks), ks)
    return search.run(sorted(range(n), key=lambda j: attn_s[j]))


class _Search:
    """``plan_dynamic_sp``'s state: per-GPU time ``w[i][k]`` of request ``i`` at degree
    ``options[k]``, and its GPU-seconds ``dw[i][k]``; plans are lists of indices ``k``."""

    def __init__(self, attn_s: Sequence[float], kv_bytes: Sequence[float], sp: int,
                 all_gather: AllGatherFn, floor_s: float) -> None:
        self.sp = sp
        self.floor_s = floor_s
        self.options = _degree_options(sp)
        self.w = [[_per_gpu_s(a, kv, d, all_gather, floor_s) for d in self.options]
                  for a, kv in zip(attn_s, kv_bytes)]
        self.dw = [[d * t for d, t in zip(self.options, row)] for row in self.w]

    def plan(self, latency_s: float, ks: Sequence[int]) -> SpPlan:
        return SpPlan(latency_s=latency_s, degrees=tuple(self.options[k] for k in ks))

    def span(self, ks: Sequence[int]) -> float:
        return _makespan([self.w[i][k] for i, k in enumerate(ks)],
                         [self.options[k] for k in ks], self.sp, self.floor_s)

    def bound(self, ks: Sequence[int]) -> float:
        """No placement of ``ks`` is faster: the largest per-GPU time, or all GPU-seconds
        spread evenly over the GPUs."""
        return self.floor_s + max(max(self.w[i][k] for i, k in enumerate(ks)),
                                  sum(self.dw[i][k] for i, k in enumerate(ks)) / self.sp)

    def starts(self) -> tuple[list[tuple[float, tuple[int, ...]]], tuple[int, ...]]:
        """``(bound, plan)`` of the uniform, threshold and greedy plans; and the greedy one."""
        n, m = len(self.w), len(self.options)
        out = [(self.bound((k,) * n), (k,) * n) for k in range(m)]
        # Threshold plans: request i joins at T = its smallest per-GPU time, and moves to
        # fewer GPUs each time T reaches the time of a degree below its current one.
        events = []
        for i, row in enumerate(self.w):
            cur = m
            for k in sorted(range(m), key=lambda k: (row[k], k)):
                if k < cur:
                    events.append((row[k], i, k))
                    cur = k
        events.sort()
        deg = [-1] * n
        work, ready = 0.0, 0
        for j, (t, i, k) in enumerate(events):
            if deg[i] < 0:
                ready += 1
            else:
                work -= self.dw[i][deg[i]]
            deg[i] = k
            work += self.dw[i][k]
            if ready == n and (j + 1 == len(events) or events[j + 1][0] > t):
                out.append((self.floor_s + max(t, work / self.sp), tuple(deg)))
        # Greedy: longest first, the degree that least raises the most loaded GPU (then the
        # fewest GPU-seconds).
        greedy = [0] * n
        loads = [0.0] * self.sp
        for i in sorted(range(n), key=lambda j: -self.w[j][0]):
            order = sorted(range(self.sp), key=loads.__getitem__)
            k = min(range(m), key=lambda k: (
                max(max(loads), loads[order[self.options[k] - 1]] + self.w[i][k]),
                self.dw[i][k]))
            for g in order[:self.options[k]]:
                loads[g] += self.w[i][k]
            greedy[i] = k
        out.append((self.bound(greedy), tuple(greedy)))
        return out, tuple(greedy)

    def run(self, shortest_first: list[int]) -> SpPlan:
        n, m = len(self.w), len(self.options)
        candidates, greedy = self.starts()
        best: tuple[float, tuple[int, ...]] = (float("inf"), greedy)
        for lb, ks in sorted(candidates, key=lambda c: c[0]):
            if lb >= best[0] - _EPS:
                break  # sorted by bound: no later start can beat the best
            t = self.span(ks)
            if t < best[0] - _EPS:
                best = (t, ks)
        result = (best[0], list(best[1]))
        for ks in dict.fromkeys((best[1], (m - 1,) * n, (0,) * n, greedy)):
            r = self.descend(list(ks), self.span(ks), shortest_first, pairs=False)
            if r[0] < result[0] - _EPS:
                result = r
        if n <= PAIR_MOVES_MAX_REQUESTS:
            result = self.descend(result[1], result[0], shortest_first, pairs=True)
        return self.plan(*result)

    def descend(self, ks: list[int], cur: float, order: list[int], *, pairs: bool
                ) -> tuple[float, list[int]]:
        """Local search from ``ks`` (latency ``cur``): single moves in ``order``, and pair
        moves when a pass of single moves changes nothing."""
        w, dw, floor_s, sp = self.w, self.dw, self.floor_s, self.sp
        m = len(self.options)
        for _ in range(_MAX_PASSES):
            changed = False
            total = sum(dw[i][k] for i, k in enumerate(ks))
            top = sorted((w[i][k] for i, k in enumerate(ks)), reverse=True)[:3] + [0.0] * 3
            for i in order:
                # The largest per-GPU time of the other requests.
                others = top[1] if w[i][ks[i]] >= top[0] else top[0]
                for k in range(m):
                    if k == ks[i] or floor_s + max(others, w[i][k], (
                            total - dw[i][ks[i]] + dw[i][k]) / sp) >= cur - _EPS:
                        continue
                    trial = ks.copy()
                    trial[i] = k
                    t = self.span(trial)
                    if t < cur - _EPS:
                        total += dw[i][k] - dw[i][ks[i]]
                        cur, ks, changed = t, trial, True
                        top = sorted((w[j][kj] for j, kj in enumerate(ks)),
                                     reverse=True)[:3] + [0.0] * 3
                        others = top[1] if w[i][ks[i]] >= top[0] else top[0]
            if not changed and pairs:
                moved = self._pair_move(ks, cur, total, top)
                if moved is not None:
                    cur, ks, changed = *moved, True
            if not changed:
                break
        return cur, ks

    def _pair_move(self, ks: list[int], cur: float, total: float, top: list[float]
                   ) -> tuple[float, list[int]] | None:
        """The first change of two requests' degrees that lowers the latency, if any."""
        w, dw, floor_s, sp = self.w, self.dw, self.floor_s, self.sp
        n, m = len(ks), len(self.options)
        for a in range(n):
            for b in range(a + 1, n):
                rest = top[:3]
                for x in (w[a][ks[a]], w[b][ks[b]]):
                    if x in rest:
                        rest.remove(x)
                others = rest[0] if rest else 0.0
                base = total - dw[a][ks[a]] - dw[b][ks[b]]
                for ka in range(m):
                    if ka == ks[a]:
                        continue
                    for kb in range(m):
                        if kb == ks[b] or floor_s + max(others, w[a][ka], w[b][kb], (
                                base + dw[a][ka] + dw[b][kb]) / sp) >= cur - _EPS:
                            continue
                        trial = ks.copy()
                        trial[a], trial[b] = ka, kb
                        t = self.span(trial)
                        if t < cur - _EPS:
                            return t, trial
        return None


class SequenceParallelCostModel(IterationCostModel):
    """Wraps a replica's cost model with prefill sequence parallelism over ``sp`` GPUs.

    Token-linear ops run on ``ceil(T / sp)`` tokens per GPU; decode requests are spread over the
    ``sp`` GPUs (each keeps whole requests' KV), and so are their MTP draft steps; prefill
    attention follows the fixed or the dynamic plan, each GPU paying the base model's
    attention kernel floor once per iteration.
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
        """Prefill-attention time dynamic SP saved over fixed SP, summed over iterations (of
        one simulation: ``ServingSimulation`` sets it to 0 when it takes the model from a
        shared cost cache)."""
        self._floor_s: float | None = None

    @property
    def floor_s(self) -> float:
        """The attention kernel's fixed time that one launch over several prefill chunks pays
        once: what the base model saves by batching two one-token prompts (its time for one
        such prompt when it batches, as ``GraphIterationCostModel``; 0 when it sums chunks)."""
        if self._floor_s is None:
            one = self.base.prefill_attention_s(1, 1)
            self._floor_s = max(0.0, 2 * one - self.base.prefill_attention_total_s([one, one]))
        return self._floor_s

    def token_linear_s(self, tokens: int, rows: int) -> float:
        return self.base.token_linear_s(-(-tokens // self.sp), -(-rows // self.sp))

    def prefill_attention_s(self, q_len: int, kv_len: int) -> float:
        return self.base.prefill_attention_s(q_len, kv_len)

    def decode_attention_s(self, num: int, kv_sum: float, q: int = 1) -> float:
        if num <= 0:
            return 0.0
        per = -(-num // self.sp)
        return self.base.decode_attention_s(per, kv_sum * per / num, q)

    def mtp_step_s(self, num_decode: int, decode_kv_sum: float) -> float:
        """One MTP draft step: each GPU drafts for its share of the decoding requests (as in
        ``decode_attention_s``)."""
        if num_decode <= 0:
            return 0.0
        per = -(-num_decode // self.sp)
        return self.base.mtp_step_s(per, decode_kv_sum * per / num_decode)

    def mtp_prefill_s(self, prefill: PrefillChunks) -> float:
        """The MTP layer's pass over the prompt chunks, its tokens and attention split over the
        ``sp`` GPUs like every other layer's."""
        return self.base.mtp_prefill_s(prefill) / self.sp

    def kv_bytes_per_token(self) -> float:
        return self.base.kv_bytes_per_token()

    def batch_prefill_attention_s(self, prefill: PrefillChunks) -> float:
        attn = [self.base.prefill_attention_s(q, kv) for q, kv in prefill]
        kvb = [kv * self.base.kv_bytes_per_token() for _, kv in prefill]
        floor_s = self.floor_s
        fixed = fixed_sp_latency(attn, kvb, self.sp, self.all_gather, floor_s=floor_s)
        if not self.dynamic:
            return fixed
        dyn = plan_dynamic_sp(attn, kvb, self.sp, self.all_gather, floor_s=floor_s).latency_s
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
