"""Eager RMSNorm (torchtitan without torch.compile): one kernel per op (``passes.eager_norm``)."""

from __future__ import annotations

import pytest

from charon_search.errors import ConfigError
from charon_search.ir import OpKind
from charon_search.layout import Layout
from charon_search.passes import PassContext, parallelize_block
from charon_search.passes.synthetic import synthetic_block

B, S, H = 2, 128, 256  # synthetic_block: hidden 256
ROWS = B * S
NORM_ROLES = ("attn.norm", "mlp.norm")


def _norm_nodes(graph, role):
    return [n for n in graph.nodes if n.role == role]


def test_fused_default_keeps_one_norm_kernel_per_direction() -> None:
    pb = parallelize_block(synthetic_block("dense"), PassContext(debug=True))
    for role in NORM_ROLES:
        assert [n.kind for n in _norm_nodes(pb.forward, role)] == [OpKind.NORM]
        assert [n.kind for n in _norm_nodes(pb.backward, role)] == [OpKind.NORM]


def test_eager_rmsnorm_runs_one_kernel_per_op_with_the_bytes_each_moves() -> None:
    pb = parallelize_block(synthetic_block("dense"), PassContext(norm_impl="eager", debug=True))
    for role in NORM_ROLES:
        fwd, bwd = _norm_nodes(pb.forward, role), _norm_nodes(pb.backward, role)
        # forward: x.float(), pow, mean, + eps, rsqrt, * rstd, type_as, * weight
        assert len(fwd) == 8 and all(n.kind == OpKind.ELEMENTWISE for n in fwd)
        # bf16 full-size kernels: (2+4) + (4+4) + 4 + (4+4) + (4+2) + (2+2) = 36 B per element;
        # + eps and rsqrt read and write 4 B per row each
        fwd_bytes = sum(n.bytes(B, S) for n in fwd)
        assert fwd_bytes == pytest.approx(36 * ROWS * H + 16 * ROWS)
        # backward: 14 autograd kernels + the x.float() backward cast (4 + 2 B)
        assert len(bwd) == 15
        assert sum(n.bytes(B, S) for n in bwd) == pytest.approx((86 + 6) * ROWS * H + 20 * ROWS)


def test_eager_rmsnorm_costs_more_bytes_than_the_fused_kernel() -> None:
    fused = parallelize_block(synthetic_block("dense"), PassContext())
    eager = parallelize_block(synthetic_block("dense"), PassContext(norm_impl="eager"))
    for role in NORM_ROLES:
        f = sum(n.bytes(B, S) for n in _norm_nodes(fused.forward, role))
        e = sum(n.bytes(B, S) for n in _norm_nodes(eager.forward, role))
        assert e > 3 * f


def test_layout_norm_impl_is_checked() -> None:
    assert Layout().norm_impl == "fused"
    with pytest.raises(ConfigError, match="norm_impl"):
        Layout(norm_impl="triton")


def test_op_sac_recomputes_the_eager_norm_kernels() -> None:
    # torchtitan op-level SAC saves only matmul / SDPA outputs: the norm's ops are re-run
    pb = parallelize_block(synthetic_block("dense"),
                           PassContext(norm_impl="eager", recompute="selective",
                                       selective_policy="op", debug=True))
    rc = [n for n in pb.backward.nodes if n.phase.value == "recompute" and n.role in NORM_ROLES]
    assert len(rc) == 2 * 8
    assert sum(n.bytes(B, S) for n in rc) == pytest.approx(2 * (36 * ROWS * H + 16 * ROWS))
