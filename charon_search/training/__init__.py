"""Training simulation: ``simulate_training(model, cluster, layout) -> StepReport``."""

from charon_search.training.report import FLOPS_CONVENTION, StepBreakdown, StepReport
from charon_search.training.step import simulate_training, stage_layers, validate_layout

__all__ = [
    "FLOPS_CONVENTION",
    "StepBreakdown",
    "StepReport",
    "simulate_training",
    "stage_layers",
    "validate_layout",
]
