"""Pipeline schedules as per-rank op orders: lists of ``PipeOp(kind, mb, chunk)``.

``kind`` is ``F`` (forward), ``B`` (backward; input and weight gradients unless the schedule
splits out ``W``) or ``W`` (weight gradients, zero-bubble). The executor (``sim.pipeline``) runs
each rank's list in order, so a schedule is an order, not a bubble formula.

* ``gpipe`` (Huang et al. 2019): all forwards, then all backwards.
* ``1f1b`` (PipeDream-Flush, Narayanan et al. 2021): ``p - r - 1`` warm-up forwards, then
  one-forward-one-backward, then the cool-down backwards.
* ``interleaved-1f1b`` (Narayanan et al., SC21): ``vpp`` model chunks per rank, Megatron's order
  (warm-up ``(p - r - 1)·2 + (vpp - 1)·p``; needs ``m % p == 0``).
* ``zero-bubble`` ZB-H1 (Qi et al., arXiv 2401.10241): 1F1B with ``W`` split from ``B``; a rank
  defers up to ``p - r - 1`` ``W``s and runs them in its bubbles (same peak memory as 1F1B).
* ``dualpipe`` (DeepSeek-V3, arXiv 2412.19437): two directions, rank ``r`` holding stage ``r``
  (chunk 0) and stage ``p - 1 - r`` (chunk 1); half the micro-batches enter at each end. Its
  order is built by the executor greedily (backward first, at most ``p - position`` forwards in
  flight per direction), then recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from charon_search.errors import ConfigError
from charon_search.registry import Registry

__all__ = ["SCHEDULE_ORDERS", "PipeOp", "schedule_order"]


@dataclass(frozen=True, slots=True, order=True)
class PipeOp:
    kind: str
    """``F``, ``B`` or ``W``."""
    mb: int
    chunk: int = 0


OrderFn = Callable[[int, int, int, int], list[PipeOp]]
SCHEDULE_ORDERS: Registry[OrderFn] = Registry("pipeline schedule")


@SCHEDULE_ORDERS.register("gpipe")
def gpipe(p: int, m: int, v: int, r: int) -> list[PipeOp]:
    return [PipeOp("F", i) for i in range(m)] + [PipeOp("B", i) for i in range(m)]


@SCHEDULE_ORDERS.register("1f1b")
def one_f_one_b(p: int, m: int, v: int, r: int) -> list[PipeOp]:
    warm = min(p - r - 1, m)
    out = [PipeOp("F", i) for i in range(warm)]
    for i in range(m - warm):
        out += [PipeOp("F", warm + i), PipeOp("B", i)]
    out += [PipeOp("B", i) for i in range(m - warm, m)]
    return out


@SCHEDULE_ORDERS.register("none")
def no_pipeline(p: int, m: int, v: int, r: int) -> list[PipeOp]:
    """pp == 1: forward then backward of each micro-batch (gradient accumulation)."""
    out: list[PipeOp] = []
    for i in range(m):
        out += [PipeOp("F", i), PipeOp("B", i)]
    return out


@SCHEDULE_ORDERS.register("interleaved-1f1b")
def interleaved(p: int, m: int, v: int, r: int) -> list[PipeOp]:
    if m % p:
        raise ConfigError(f"interleaved-1f1b needs micro-batches divisible by pp, but got "
                          f"(num_micro_batches={m}, pp={p})")
    total = m * v

    def fwd(k: int) -> PipeOp:
        return PipeOp("F", (k // (p * v)) * p + k % p, (k // p) % v)

    def bwd(k: int) -> PipeOp:
        return PipeOp("B", (k // (p * v)) * p + k % p, v - 1 - (k // p) % v)

    warm = min((p - r - 1) * 2 + (v - 1) * p, total)
    out = [fwd(k) for k in range(warm)]
    for k in range(total - warm):
        out += [fwd(warm + k), bwd(k)]
    out += [bwd(k) for k in range(total - warm, total)]
    return out


@SCHEDULE_ORDERS.register("zero-bubble")
def zero_bubble_h1(p: int, m: int, v: int, r: int) -> list[PipeOp]:
    out: list[PipeOp] = []
    for op in one_f_one_b(p, m, v, r):
        out.append(op)
        if op.kind == "B":
            out.append(PipeOp("W", op.mb))
    return out


@SCHEDULE_ORDERS.register("dualpipe")
def dualpipe_pool(p: int, m: int, v: int, r: int) -> list[PipeOp]:
    """The rank's ops (both directions); the executor orders them greedily."""
    out: list[PipeOp] = []
    half = m // 2
    for i in range(m):
        chunk = 0 if i < half else 1
        out += [PipeOp("F", i, chunk), PipeOp("B", i, chunk)]
    return out


def schedule_order(name: str, p: int, m: int, v: int, r: int) -> list[PipeOp]:
    return SCHEDULE_ORDERS.get(name)(p, m, v, r)
