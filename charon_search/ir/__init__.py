"""The simulator's IR: small, picklable, and free of torch (``frontend/`` produces it)."""

from charon_search.ir.check import check
from charon_search.ir.graph import (
    DTYPE_BYTES,
    INDEX_DTYPES,
    EvaluatedGraph,
    Node,
    OpGraph,
    TensorSpec,
    TracedBlock,
    poly_params,
)
from charon_search.ir.ops import (
    ATTENTION_BWD_FLOP_RATIO,
    COMM_KINDS,
    COMPUTE_KINDS,
    PARAMS_BY_KIND,
    OpKind,
    Phase,
    Role,
)
from charon_search.ir.symbolic import SYMBOLS, Poly, as_poly, sym

__all__ = [
    "ATTENTION_BWD_FLOP_RATIO",
    "COMM_KINDS",
    "COMPUTE_KINDS",
    "DTYPE_BYTES",
    "INDEX_DTYPES",
    "PARAMS_BY_KIND",
    "SYMBOLS",
    "EvaluatedGraph",
    "Node",
    "OpGraph",
    "OpKind",
    "Phase",
    "Poly",
    "Role",
    "TensorSpec",
    "TracedBlock",
    "as_poly",
    "check",
    "poly_params",
    "sym",
]
