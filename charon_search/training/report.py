"""``StepReport``: what one simulated training step yields."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FLOPS_CONVENTION", "StepBreakdown", "StepReport"]

FLOPS_CONVENTION = (
    "model_flops = 3 x forward FLOPs of the traced matmuls (GEMM + expert grouped GEMM, i.e. "
    "6·N_active per token incl. the LM head) + 3 x non-causal attention (QK^T and PV: "
    "4·b·heads·s²·d per layer fwd), as in PaLM (Chowdhery et al. 2022, App. B); "
    "hardware_flops = the FLOPs of every op the simulated ranks run, recompute included, with "
    "attention counted over the full s x s scores (non-causal, as Megatron's HFU and "
    "torch.utils.flop_counter count it, so hfu can exceed mfu without recompute; the step "
    "time prices causal kernels; sliding-window layers at their window, while model_flops "
    "count them at full length as torchtitan does, so a windowed model's hfu can be below its "
    "mfu); mfu/hfu against the GPU's dense bf16 peak."
)


@dataclass(frozen=True, slots=True, kw_only=True)
class StepBreakdown:
    """Where the critical pipeline rank's step time goes; the parts sum to ``step_time_s``."""

    compute_s: float
    exposed_comm_s: float
    exposed_comm_by_kind_s: Mapping[str, float] = field(default_factory=dict)
    """Per axis: ``tp``, ``cp``, ``ep``, ``dp`` (gradient sync / FSDP), ``dp_param_gather``,
    ``pp`` (a stage waiting for its own sends, ``Layout.pp_p2p_blocking``)."""
    pipeline_bubble_s: float = 0.0
    """Idle time of the critical rank inside the pipeline (includes waiting on P2P)."""
    stage_imbalance_s: float = 0.0
    """The part of ``pipeline_bubble_s`` that stages of unequal cost add: how much longer the
    pipeline runs than the same schedule with every rank at the ranks' mean unit costs (the
    same work, evenly split). Inside ``pipeline_bubble_s``, not a separate term of the step."""
    overlap_slowdown_s: float = 0.0
    optimizer_s: float = 0.0
    other_s: float = 0.0
    """Per-step host overhead (calibration ``iteration_cpu_overhead_s``)."""


@dataclass(frozen=True, kw_only=True)
class StepReport:
    """One training step of ``model`` on ``cluster`` under ``layout``."""

    model: str
    cluster: str
    num_gpus: int
    layout: Mapping[str, Any]
    step_time_s: float
    tokens_per_step: int
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    model_flops_per_step: float
    hardware_flops_per_step: float
    mfu: float
    hfu: float
    breakdown: StepBreakdown
    stage_times_s: tuple[float, ...]
    """Per pipeline rank: time until its last backward unit ends."""
    stage_busy_s: tuple[float, ...]
    """Per pipeline rank: sum of its unit durations (compute + exposed comm + slowdown)."""
    micro_batches_in_flight: tuple[int, ...]
    """Per pipeline rank: peak forward units (micro-batch x chunk) whose backward has not run
    yet; with interleaving each unit holds one chunk's activations (activation memory)."""
    num_micro_batches: int
    cost_sources: Mapping[str, float]
    """Share of the step's operator time costed by each source (profile/predictor/...)."""
    layer_times_s: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """Per block type (``dense``, ``moe``, ``embedding``, ``lm_head``): ``forward_s`` and
    ``backward_s`` of one layer in the middle of a chain of them (steady state: prefetched
    collectives hidden, exposed ones counted; the backward includes any recompute)."""
    flops_convention: str = FLOPS_CONVENTION
    warnings: tuple[str, ...] = ()
    memory: Mapping[str, Any] | None = None
    """``memory_report(...)`` as a dict, or None when the memory model is unavailable."""
    timeline: Any = field(default=None, repr=False, compare=False)
    """The simulated timeline (for ``to_chrome_trace``); not serialized."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name == "timeline":
                continue
            v = getattr(self, f.name)
            if dataclasses.is_dataclass(v) and not isinstance(v, type):
                v = dataclasses.asdict(v)
            elif isinstance(v, Mapping):
                v = {k: dict(x) if isinstance(x, Mapping) else x for k, x in v.items()}
            elif isinstance(v, tuple):
                v = list(v)
            out[f.name] = v
        bd = out["breakdown"]
        bd["exposed_comm_by_kind_s"] = dict(bd["exposed_comm_by_kind_s"])
        return out
