"""``Layout.attention_kernel`` generations (``cost.attention_kernels``) and the roofline's causal
work in the training coster."""

from __future__ import annotations

import numpy as np
import pytest

from charon_search.cost.attention_kernels import BWD_THROUGHPUT_VS_FWD, attention_time_factor
from charon_search.errors import ConfigError
from charon_search.hardware import load_cluster
from charon_search.ir import OpKind
from charon_search.layout import Layout
from charon_search.passes import PassContext, parallelize_block
from charon_search.passes.synthetic import synthetic_block
from charon_search.sim.costing import GraphCoster


def test_generation_ratios_are_the_published_ones() -> None:
    # pytorch/pytorch#142132: SDPA flash (FA2) 329.5 vs FlashAttention-3 631.8 TFLOP/s forward;
    # FA3 paper: backward 1.5-1.75x (geometric middle 1.62); FA2 paper: 1.3-2.5x over the
    # Triton FlashAttention (geometric middle 1.80).
    # Every fused backward also runs at 561/648 of its forward's FLOP rate (FA3 paper, H100,
    # head dim 128, 16k: FA3 648 fwd / 561 bwd TFLOP/s; FA2 370 / 322).
    bwd = 648 / 561
    assert attention_time_factor("flash2", 3, backward=False) == pytest.approx(1.92)
    assert attention_time_factor("flash2", 3, backward=True) == pytest.approx(1.62 * bwd)
    assert attention_time_factor("flash_triton", 3, backward=False) == pytest.approx(1.92 * 1.8)
    assert attention_time_factor("flash_triton", 2, backward=True) == pytest.approx(1.8 * bwd)
    # the GPU's own best kernel, or a kernel as new as the costed one: no generation change
    assert attention_time_factor("flash", 3, backward=False) == 1.0
    assert attention_time_factor("flash2", 2, backward=True) == pytest.approx(bwd)
    assert attention_time_factor("eager", 3, backward=False) == 1.0


def test_backward_runs_slower_per_flop_than_the_forward() -> None:
    # Both generations' published ratios agree within 1 %, so one constant serves both.
    assert BWD_THROUGHPUT_VS_FWD == pytest.approx(561 / 648)
    assert abs(322 / 370 - BWD_THROUGHPUT_VS_FWD) < 0.01
    assert attention_time_factor("flash", 3, backward=True) == pytest.approx(648 / 561)
    with pytest.raises(ConfigError, match="attention_kernel"):
        attention_time_factor("flash4", 3, backward=False)


def test_layout_accepts_the_kernels_and_rejects_others() -> None:
    for k in ("flash", "flash2", "flash_triton", "eager"):
        Layout(attention_kernel=k)
    with pytest.raises(ConfigError, match="attention_kernel"):
        Layout(attention_kernel="flash3")


class _Flat:
    """Every compute node 1 ms, with a fixed provenance (test stand-in)."""

    def __init__(self, provenance: str) -> None:
        self.provenance = provenance

    def cost_graph(self, graph, b, s, c=None):
        return np.array([np.nan if n.is_comm else 1e-3 for n in graph.nodes])


def _attention_ms(cluster: str, kernel: str, provenance: str = "model",
                  flops_scale: float = 1.0) -> dict[OpKind, float]:
    cl = load_cluster(cluster)
    pb = parallelize_block(synthetic_block("dense"), PassContext())
    out = {}
    for g in (pb.forward, pb.backward):
        g = g.with_nodes([n.replace(flops=n.flops * flops_scale)
                          if n.kind in (OpKind.ATTENTION, OpKind.ATTENTION_BWD) else n
                          for n in g.nodes])
        coster = GraphCoster(cl, _Flat(provenance), strides={"tp": 1}, attention_kernel=kernel)
        cg = coster.cost(g, 2, 512)
        clock = cl.gpu.sustained_clock_ratio
        for n, d in zip(g.nodes, cg.durations_s, strict=True):
            if n.kind in (OpKind.ATTENTION, OpKind.ATTENTION_BWD):
                out[n.kind] = d * clock * 1e3  # undo the clock derating
    return out


def test_coster_applies_the_generation_of_the_gpu() -> None:
    # Blackwell costs represent its newest kernels (attention_kernel_gen 3) ... (Hopper
    # training attention is priced from measured kernels instead: test_train_attention.py)
    assert load_cluster("b200-8gpu").gpu.attention_kernel_gen == 3
    h = _attention_ms("b200-8gpu", "flash2")
    assert h[OpKind.ATTENTION] == pytest.approx(1.92)
    assert h[OpKind.ATTENTION_BWD] == pytest.approx(1.62 * 648 / 561)
    assert _attention_ms("b200-8gpu", "flash")[OpKind.ATTENTION] == pytest.approx(1.0)
    # ... the A100's FlashAttention-2 (gen 2): FA2 costs as measured, the Triton kernel 1.8x
    assert load_cluster("dgx-a100-superpod").gpu.attention_kernel_gen == 2
    assert _attention_ms("dgx-a100-superpod", "flash2")[OpKind.ATTENTION] == pytest.approx(1.0)
    a = _attention_ms("dgx-a100-superpod", "flash_triton")
    assert a[OpKind.ATTENTION_BWD] == pytest.approx(1.8 * 648 / 561)


def test_roofline_prices_half_the_causal_square() -> None:
    # Traced SDPA counts the full s x s square with causal=1 (frontend._ops); a flash kernel
    # computes half of it, which the roofline must price. The synthetic block's attention is
    # already halved (like nodes fused from eager attention): scale it back to the full square.
    model = _attention_ms("b200-8gpu", "flash", provenance="model", flops_scale=2.0)
    roof = _attention_ms("b200-8gpu", "flash", provenance="roofline", flops_scale=2.0)
    halved = _attention_ms("b200-8gpu", "flash", provenance="roofline")
    for kind in (OpKind.ATTENTION, OpKind.ATTENTION_BWD):
        assert roof[kind] == pytest.approx(0.5 * model[kind])
        assert halved[kind] == pytest.approx(model[kind])  # not discounted twice


def test_fp8_expert_gemms_from_bf16_rows_run_at_the_fp8_rate() -> None:
    # The shipped MoE expert-FFN rows are bf16 only; training's fp8 expert GEMMs get the
    # datasheet fp8/bf16 rate ratio at the GPU's roofline efficiencies.
    from charon_search.cost.selector import default_cost_model
    from charon_search.sim.costing import _fp8_grouped_gemm_scale

    gb = load_cluster("gb200-nvl72")
    assert _fp8_grouped_gemm_scale(gb, default_cost_model(gb)) == pytest.approx(
        2500 * 0.75 / (5000 * 0.75))
    h = load_cluster("dgx-h100-ib400")
    assert _fp8_grouped_gemm_scale(h, default_cost_model(h)) == pytest.approx(
        989.5 * 0.7 / (1979 * 0.63))
    a = load_cluster("dgx-a100-superpod")  # no fp8 tensor cores
    assert _fp8_grouped_gemm_scale(a, default_cost_model(a)) == 1.0
