"""One backward/forward attention FLOP ratio for the frontend, the passes and the costs."""

from __future__ import annotations

import subprocess
import sys

from charon_search import ir
from charon_search.ir import ATTENTION_BWD_FLOP_RATIO, OpKind
from charon_search.passes import PassContext, parallelize_block
from charon_search.passes.synthetic import synthetic_block


def test_the_ratio_is_the_flash_attention_2_count() -> None:
    # FlashAttention-2 paper sec. 3.1: 5 backward matmuls (dV, dP, dQ, dK, recomputed P)
    # against the forward's 2
    assert ATTENTION_BWD_FLOP_RATIO == 5 / 2


def test_cost_selector_uses_the_ir_constant() -> None:
    from charon_search.cost import selector

    assert selector.ATTENTION_BWD_FLOP_RATIO is ir.ATTENTION_BWD_FLOP_RATIO


def test_synthetic_backward_is_the_ratio_times_the_forward() -> None:
    pb = parallelize_block(synthetic_block("dense"), PassContext())
    fwd = [n for n in pb.forward.nodes if n.kind == OpKind.ATTENTION]
    bwd = [n for n in pb.backward.nodes if n.kind == OpKind.ATTENTION_BWD]
    assert len(fwd) == len(bwd) == 1
    assert bwd[0].flops(2, 1024) == ATTENTION_BWD_FLOP_RATIO * fwd[0].flops(2, 1024)


def test_passes_do_not_import_the_cost_package() -> None:
    code = ("import sys, charon_search.passes, charon_search.passes.fusion, "
            "charon_search.passes.synthetic; "
            "print(any(m.startswith('charon_search.cost') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
