"""Graph -> graph rewrites: TP/SP, CP, EP, FSDP, recompute, fusion, FP8 and overlap passes.

Importing this package registers the built-in passes in ``PASSES``. Entry points:
``parallelize_block`` (training, forward + backward) and ``parallelize_inference`` (serving).
"""

from charon_search.passes import (  # noqa: F401 - registration side effects
    context_parallel,
    data_parallel,
    eager_attention,
    eager_norm,
    expert_parallel,
    fused_loss,
    fusion,
    mla_rope,
    overlap,
    recompute,
    tensor_parallel,
)
from charon_search.passes.base import (
    PASSES,
    Pass,
    PassContext,
    PassManager,
    PassResult,
    must_run_before,
    ordering_constraints,
    run_passes,
)
from charon_search.passes.parallelize import (
    DEFAULT_PASSES,
    ParallelBlock,
    parallelize_block,
    parallelize_inference,
)
from charon_search.passes.params import LocalParams, local_params

__all__ = [
    "DEFAULT_PASSES",
    "PASSES",
    "LocalParams",
    "ParallelBlock",
    "Pass",
    "PassContext",
    "PassManager",
    "PassResult",
    "local_params",
    "must_run_before",
    "ordering_constraints",
    "parallelize_block",
    "parallelize_inference",
    "run_passes",
]
