"""Micro-batches whose activations a pipeline stage holds at its memory peak, per schedule.

Counts are in units of *model chunks times micro-batches*: with interleaving a stage holds
``vpp`` chunks of ``L / (pp * vpp)`` layers, and the count says how many chunk forward passes
are alive at once. Without interleaving a chunk is the whole stage.
"""

from __future__ import annotations

from charon_search.errors import ConfigError

__all__ = ["in_flight_chunks", "params_copies"]


def in_flight_chunks(schedule: str, *, pp: int, stage_idx: int, num_micro_batches: int,
                     vpp: int = 1) -> int:
    """Chunk activations alive at stage ``stage_idx``'s peak.

    * ``none`` (no PP): one micro-batch at a time (gradient accumulation runs them serially).
    * ``gpipe``: all ``m`` forwards run before any backward (Huang et al., arXiv 1811.06965).
    * ``1f1b``: stage ``i`` runs ``p - i`` warm-up forwards before its first backward
      (PipeDream-Flush; Narayanan et al., arXiv 2104.04473, Sec. 2.2), capped at ``m``.
    * ``interleaved-1f1b``: Megatron-LM's warm-up count ``(p - i - 1) * 2 + (v - 1) * p`` plus the
      steady-state one (``megatron/core/pipeline_parallel/schedules.py``,
      ``forward_backward_pipelining_with_interleaving``), capped at ``m * v``; stage 0 therefore
      holds ``p * (1 + (p - 1) / (p * v))`` stage-equivalents (Korthikanti et al., Sec. 4.2.3).
    * ``zero-bubble``: ZB-H1, whose peak equals 1F1B's (Qi et al., arXiv 2401.10241, Sec. 3.1).
    * ``dualpipe``: ``p + 1`` micro-batches of activations per device
      (DeepSeek-V3 technical report, arXiv 2412.19437, Table 2).
    """
    m = num_micro_batches
    if not 0 <= stage_idx < pp:
        raise ConfigError(f"`0 <= stage_idx < pp` must hold, but got ({stage_idx=}, {pp=})")
    if schedule == "none":
        return 1
    if schedule == "gpipe":
        return m
    if schedule in ("1f1b", "zero-bubble"):
        return min(pp - stage_idx, m)
    if schedule == "interleaved-1f1b":
        warmup = (pp - stage_idx - 1) * 2 + (vpp - 1) * pp
        return min(warmup + 1, m * vpp)
    if schedule == "dualpipe":
        return min(pp + 1, 2 * m)
    raise ConfigError(
        "`schedule` must be one of ['none', 'gpipe', '1f1b', 'interleaved-1f1b', 'zero-bubble', "
        f"'dualpipe'], but got {schedule!r}"
    )


def params_copies(schedule: str) -> int:
    """Copies of a stage's parameters per device: DualPipe keeps two (arXiv 2412.19437,
    Table 2)."""
    return 2 if schedule == "dualpipe" else 1
