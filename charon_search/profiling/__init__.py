"""Measure ops and collectives on a real GPU and write profile-DB rows.

``shapes`` picks what to measure (a traced model's compute nodes at concrete points, or a
standard grid), ``runner`` times it (CUDA events; NCCL over local GPUs; compute/communication
overlap) and writes rows in the ``cost.profile_db`` schema. torch is imported only when timing.
Run it as ``charon-search profile ...`` or ``python -m charon_search.profiling ...``.
"""

from charon_search.profiling.runner import (
    CudaEventTimer,
    measure_collectives,
    measure_overlap,
    overlap_calibration,
    profile_shapes,
    rows_from_measurements,
)
from charon_search.profiling.shapes import (
    PROFILED_KINDS,
    OpShape,
    fp8_training_gemm_grid,
    gh100_crosscheck_grid,
    model_graphs,
    parse_points,
    select_shapes,
    standard_grid,
    training_attention_grid,
)

__all__ = [
    "PROFILED_KINDS",
    "CudaEventTimer",
    "OpShape",
    "fp8_training_gemm_grid",
    "gh100_crosscheck_grid",
    "measure_collectives",
    "measure_overlap",
    "model_graphs",
    "overlap_calibration",
    "parse_points",
    "profile_shapes",
    "rows_from_measurements",
    "select_shapes",
    "standard_grid",
    "training_attention_grid",
]
