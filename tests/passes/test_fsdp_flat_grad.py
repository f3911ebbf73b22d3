"""PyTorch FSDP1 ``FlatParameter`` gradient path (``Layout.fsdp_flat_grad``): before each
unit's reduce-scatter, the flat gradient is concatenated from the parameters' gradients, cast
to the reduce dtype and pre-divided in place (``torch/distributed/fsdp/_runtime_utils.py``)."""

from __future__ import annotations

import pytest

from charon_search.ir import OpKind
from charon_search.passes import PassContext, local_params, parallelize_block
from charon_search.passes.data_parallel import gradient_predivide_factor
from charon_search.passes.synthetic import synthetic_block


@pytest.mark.parametrize(("world", "factor"), [(2, 2.0), (4, 2.0), (8, 4.0), (16, 4.0),
                                                (32, 8.0), (48, 8.0), (64, 8.0), (128, 16.0)])
def test_predivide_factor_follows_pytorch(world: int, factor: float) -> None:
    # torch.distributed.algorithms._comm_hooks.default_hooks.DefaultState
    # ._get_gradient_predivide_factor: double while it divides the world and factor^2 < world
    assert gradient_predivide_factor(world) == factor


def _backward(**ctx_kw):
    blk = synthetic_block("dense")
    ctx = PassContext(dp=8, zero_stage=3, **ctx_kw)
    return blk, parallelize_block(blk, ctx).backward


def test_flat_grad_passes_are_off_by_default() -> None:
    _, g = _backward()
    assert not [n for n in g.nodes if n.name.startswith("fsdp_grad")]


@pytest.mark.parametrize(("reduce_dtype", "expected"), [
    ("fp32", {"fsdp_grad_flatten": (2, 2), "fsdp_grad_cast": (2, 4),
              "fsdp_grad_predivide": (4, 4)}),
    ("bf16", {"fsdp_grad_flatten": (2, 2), "fsdp_grad_predivide": (2, 2)}),
])
def test_flat_grad_passes_move_the_units_unsharded_gradient(reduce_dtype, expected) -> None:
    blk, g = _backward(fsdp_flat_grad=True, grad_reduce_dtype=reduce_dtype)
    numel = local_params(blk.forward).dense_numel
    kernels = {n.name: n for n in g.nodes if n.name.startswith("fsdp_grad")}
    assert set(kernels) == set(expected)
    for name, (read_b, write_b) in expected.items():
        n = kernels[name]
        assert n.stream == "compute" and not n.is_comm
        assert n.bytes_read(1, 1) == pytest.approx(numel * read_b)
        assert n.bytes_written(1, 1) == pytest.approx(numel * write_b)
    # chained flatten -> (cast ->) predivide -> reduce-scatter of the reduce dtype
    rs = next(n for n in g.nodes if n.kind == OpKind.REDUCE_SCATTER)
    last = kernels["fsdp_grad_predivide"]
    assert set(rs.inputs) == set(last.outputs)
    assert rs.params["bytes"](1, 1) == pytest.approx(numel * (4 if reduce_dtype == "fp32" else 2))


def test_flat_grad_lengthens_the_zero3_step() -> None:
    from charon_search.layout import Layout
    from charon_search.testing import toy_cluster
    from charon_search.training import simulate_training

    cl = toy_cluster(num_nodes=2, gpus_per_node=4)
    base = dict(dp=8, zero_stage=3, global_batch_size=8, micro_batch_size=1, seq_len=256,
                fsdp_backward_prefetch="post")
    steps = [simulate_training("mpt-1b", cl, Layout.from_dict({**base, "fsdp_flat_grad": f}),
                               memory=False).step_time_s for f in (False, True)]
    assert steps[1] > steps[0]


def test_llm_foundry_records_take_the_fsdp1_gradient_path() -> None:
    from charon_search.validation.records import default_files, load_files
    from charon_search.validation.translate import to_case

    recs = {r.id: r for r in load_files(default_files())}
    default = to_case(recs["llmfoundry_h100_80gb_mpt13b_64gpu_seq2048"]).layout  # DEFAULT
    pure = to_case(recs["llmfoundry_a100_40gb_mpt70b_128gpu_seq2048"]).layout  # PURE
    fsdp2 = to_case(recs["torchtitan_202412_t1_8b_8gpu_fsdp"]).layout
    assert default.fsdp_flat_grad and default.grad_reduce_dtype == "fp32"
    assert pure.fsdp_flat_grad and pure.grad_reduce_dtype == "bf16"
    assert not fsdp2.fsdp_flat_grad and fsdp2.grad_reduce_dtype == "fp32"
