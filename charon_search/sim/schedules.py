"""Pipeline schedules as per-rank op orders: lists of ``PipeOp(kind, mb, chunk)``.

``kind`` is ``F`` (forward), ``B`` (backward; input and weight gradients unless the schedule
splits out ``W``) or ``W`` (weight gradients, zero-bubble). The executor (``sim.pipeline``) runs
each rank's list in order, so a schedule is an order, not a bubble formula.

* ``gpipe`` (Huang et al. 2019): all forwards, then all backwards.
* ``1f1b`` (PipeDream-Flush, Narayanan et al. 2021): ``p - r - 1`` warm-up forwards, then
  one-forward-one-backward, then the cool-down backwards.
* ``interleaved-1f1b`` (Narayanan et al., SC21): ``vpp`` model chunks per rank, Megatron's order
  (warm-up ``(p - r - 1)·2 + (vpp - 1)·p``; needs ``m % p == 0``).
* ``zero-bubble`` ZB-H1 (Qi et al., arXiv 2401.10241): 1F1B with ``W`` split from ``B``; rank
  ``r`` defers up to ``r`` ``W``s and runs them in its bubbles (peak memory within 1F1B's), which
  gives the paper's bubble ``(p - 1)(T_F + T_B - T_W)``.
* ``dualpipe`` (DeepSeek-V3, arXiv 2412.19437): two directions, rank ``r`` holding stage ``r``
  (chunk 0) and stage ``p - 1 - r`` (chunk 1); half the micro-batches enter at each end; the
  reference implementation's 8-step order (forward/backward pairs of opposite directions,
  zero-bubble weight units in the ramps).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from charon_search.errors import ConfigError
from charon_search.registry import Registry

__all__ = ["SCHEDULE_ORDERS", "PipeOp", "schedule_order"]


@dataclass(frozen=True, slots=True, order=True)
class PipeOp:
    kind: str
    """``F``, ``B`` or ``W``."""
    mb: int
    chunk: int = 0
    paired: bool = field(default=False, compare=False)
    """DualPipe: this ``F`` and the ``B`` after it run as one overlapped forward-backward chunk,
    which starts once both inputs have arrived (``DualPipe._forward_backward_chunk`` receives
    the forward's activation and the backward's gradient, then computes)."""


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
def dualpipe(p: int, m: int, v: int, r: int) -> list[PipeOp]:
    """DualPipe's 8-step order for rank ``r`` (``DualPipe.step`` in deepseek-ai/DualPipe).

    Chunk ``c`` is direction ``c``: micro-batches ``[0, m/2)`` enter at rank 0 (chunk 0),
    ``[m/2, m)`` at rank ``p-1`` (chunk 1). ``W`` units follow their ``B`` immediately unless
    the step uses zero-bubble, where they wait for the next ``weight_chunk`` slot. Needs an
    even ``p`` and ``m >= 2p``.
    """
    if p % 2 or m % 2 or m < 2 * p:
        raise ConfigError(f"dualpipe needs an even pp and num_micro_batches >= 2*pp (even), "
                          f"but got (pp={p}, num_micro_batches={m})")
    half_ranks, half_m = p // 2, m // 2
    half_rank = min(r, p - 1 - r)
    second = int(r >= half_ranks)
    middle = r in (half_ranks - 1, half_ranks)
    nxt_f, nxt_b = [0, 0], [0, 0]
    out: list[PipeOp] = []
    zb_queue: list[PipeOp] = []

    def mb(direction: int, i: int) -> int:
        return i if direction == 0 else half_m + i

    def f(phase: int, paired: bool = False) -> None:
        d = phase ^ second
        out.append(PipeOp("F", mb(d, nxt_f[d]), d, paired))
        nxt_f[d] += 1

    def b(phase: int, zb: bool = False) -> None:
        d = phase ^ second
        op = PipeOp("B", mb(d, nxt_b[d]), d)
        nxt_b[d] += 1
        out.append(op)
        w = PipeOp("W", op.mb, d)
        if zb:
            zb_queue.append(w)
        else:
            out.append(w)

    def w() -> None:
        if zb_queue:
            out.append(zb_queue.pop(0))

    for _ in range((half_ranks - half_rank - 1) * 2):  # 1: nF0
        f(0)
    for _ in range(half_rank + 1):  # 2: nF0F1
        f(0)
        f(1)
    for _ in range(half_ranks - half_rank - 1):  # 3: nB1W1F1
        b(1, zb=True)
        w()
        f(1)
    for i in range(half_m - p + half_rank + 1):  # 4: nF0B1F1B0
        # The middle ranks run their first F0 and B1 apart ("to further reduce bubble size").
        f(0, paired=not (i == 0 and middle))
        b(1)
        f(1, paired=True)
        b(0)
    for _ in range(half_ranks - half_rank - 1):  # 5: nB1F1B0
        b(1)
        f(1, paired=True)
        b(0)
    zb = False
    steps6 = half_rank + 1
    for i in range(steps6):  # 6: nB1B0
        if i == steps6 // 2 and half_rank % 2 == 1:
            zb = True
        b(1, zb=zb)
        if i == steps6 // 2 and half_rank % 2 == 0:
            zb = True
        b(0, zb=zb)
    for _ in range(half_ranks - half_rank - 1):  # 7: nWB0
        w()
        b(0, zb=True)
    while zb_queue:  # 8: nW
        w()
    return out


def schedule_order(name: str, p: int, m: int, v: int, r: int) -> list[PipeOp]:
    return SCHEDULE_ORDERS.get(name)(p, m, v, r)
