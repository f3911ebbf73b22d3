"""Training attention priced from the measured H200 kernels (``sim.train_attention``)."""

from __future__ import annotations

from importlib import resources

import numpy as np
import pandas as pd
import pytest

from charon_search.hardware import load_cluster
from charon_search.ir import OpKind
from charon_search.passes import PassContext, parallelize_block
from charon_search.passes.synthetic import synthetic_block
from charon_search.sim.costing import GraphCoster
from charon_search.sim.train_attention import GH100_GPUS, training_attention, work

_MEASURED = resources.files("charon_search") / "data" / "profiles" / "measured"


def _rows(backend: str) -> pd.DataFrame:
    with resources.as_file(_MEASURED / f"h200-sxm-141gb.train-attention-{backend}.parquet") as p:
        return pd.read_parquet(p)


def _latency(backend: str, kind: str, *, batch: int, heads: int, seq: int, d: int = 128
             ) -> float:
    df = _rows(backend)
    hit = df[(df.op_kind == kind) & (df.batch == batch) & (df.heads == heads)
             & (df.q_len == seq) & (df.kv_len == seq) & (df.head_dim == d)]
    assert len(hit) == 1
    return float(hit.latency_s.iloc[0])


class _Flat:
    """Every compute node 1 ms (the serving-row path must not be used for attention)."""

    def cost_graph(self, graph, b, s, c=None):
        return np.array([np.nan if n.is_comm else 1e-3 for n in graph.nodes])


def _attention_s(cluster: str, kernel: str, *, batch: int, seq: int, heads: int = 32,
                 head_dim: int = 128) -> dict[OpKind, tuple[float, str]]:
    cl = load_cluster(cluster)
    blk = synthetic_block("dense", hidden=heads * head_dim, heads=heads, kv_heads=heads,
                          ffn=512)
    pb = parallelize_block(blk, PassContext())
    out = {}
    for g in (pb.forward, pb.backward):
        cg = GraphCoster(cl, _Flat(), strides={"tp": 1}, attention_kernel=kernel).cost(
            g, batch, seq)
        for n, d, prov in zip(g.nodes, cg.durations_s, cg.provenance, strict=True):
            if n.kind in (OpKind.ATTENTION, OpKind.ATTENTION_BWD):
                out[n.kind] = (d * cl.gpu.sustained_clock_ratio, prov)  # undo clock derating
    return out


def test_work_is_the_matmul_flops() -> None:
    # Q K^T and P V: 2 b h q kv d each; a causal square does half; the backward 2.5x.
    assert work(2, 32, 4096, 4096, 128, 128, causal=False, backward=False) == \
        4 * 2 * 32 * 4096 * 4096 * 128
    assert work(2, 32, 4096, 4096, 128, 128, causal=True, backward=True) == \
        2.5 * 2 * 2 * 32 * 4096 * 4096 * 128
    # MLA (DeepSeek-V3): query/key 192 wide, value 128
    assert work(1, 128, 4096, 4096, 192, 128, causal=False, backward=False) == \
        2 * 128 * 4096 * 4096 * (192 + 128)


@pytest.mark.parametrize("kernel, backend, factor", [("flash", "cudnn", 1.0),
                                                     ("flash2", "flash", 1.0),
                                                     ("flash_triton", "flash", 1.8)])
def test_a_measured_shape_costs_its_measured_time(kernel: str, backend: str,
                                                  factor: float) -> None:
    # Llama-3 8B attention (32 heads of 128) at 4 x 8192 tokens is a measured shape: the
    # coster returns the measured seconds (sustained clock aside), FA2 for flash2, FA2 times
    # the published FA2-over-Triton 1.8x for the Triton kernel.
    got = _attention_s("dgx-h100-ib400", kernel, batch=4, seq=8192)
    for kind, name in ((OpKind.ATTENTION, "attention"), (OpKind.ATTENTION_BWD, "attention_bwd")):
        secs, prov = got[kind]
        assert prov == "profile"
        assert secs == pytest.approx(
            factor * _latency(backend, name, batch=4, heads=32, seq=8192), rel=1e-9)


def test_unmeasured_shapes_run_at_the_nearest_measured_rate() -> None:
    # 3 x 8192 lies between the measured 2 x and 4 x 8192 rows: its time is its own work at
    # the rate of a neighbour, so between the two measured times.
    lo = _latency("cudnn", "attention", batch=2, heads=32, seq=8192)
    hi = _latency("cudnn", "attention", batch=4, heads=32, seq=8192)
    secs, _ = _attention_s("dgx-h100-ib400", "flash", batch=3, seq=8192)[OpKind.ATTENTION]
    assert lo < secs < hi


def test_only_gh100_parts_use_the_measured_kernels() -> None:
    assert {"h100-sxm-80gb", "h200-sxm-141gb"} <= GH100_GPUS
    for gpu in ("a100-sxm-80gb", "b200-sxm-180gb", "h20-96gb"):
        assert training_attention(gpu, "flash") is None
    assert training_attention("h100-sxm-80gb", "eager") is None
    _, prov = _attention_s("dgx-a100-superpod", "flash2", batch=4, seq=2048)[OpKind.ATTENTION]
    assert prov == "model"  # the profile/predictor path with the generation factors


def test_serving_rows_are_slower_than_the_dense_kernel_at_short_sequences() -> None:
    # Why training does not use the shipped vLLM FlashAttention-3 rows: at 16 x 2048 tokens
    # the serving kernel (aiconfigurator-core, same H200) takes 1.45x the dense cuDNN kernel;
    # at 2 x 16384 the two agree within 5 %.
    from charon_search.cost.profile_db import default_profile_db

    db = default_profile_db()

    def serving(b: int, s: int) -> float:
        t = db.exact("h200-sxm-141gb", "attention", "prefill", "bf16",
                     {"batch": b, "heads": 32, "kv_heads": 32, "q_len": s, "kv_len": s,
                      "head_dim": 128})
        assert t is not None
        return t

    assert serving(16, 2048) / _latency("cudnn", "attention", batch=16, heads=32, seq=2048) \
        == pytest.approx(1.45, abs=0.05)
    assert serving(2, 16384) / _latency("cudnn", "attention", batch=2, heads=32, seq=16384) \
        == pytest.approx(1.0, abs=0.05)


@pytest.mark.parametrize("head_dim", [64, 96, 112, 256])
def test_each_measured_head_dim_is_used_as_measured(head_dim: int) -> None:
    # Head dim changes the kernel's rate (cuDNN backward at 16-32k tokens: 427 TFLOP/s at 64,
    # 526 at 128, 376 at 256), so a node matches rows of its own head dim.
    got = _attention_s("dgx-h100-ib400", "flash", batch=4, seq=8192, heads=8,
                       head_dim=head_dim)
    for kind, name in ((OpKind.ATTENTION, "attention"), (OpKind.ATTENTION_BWD, "attention_bwd")):
        assert got[kind][0] == pytest.approx(
            _latency("cudnn", name, batch=4, heads=8, seq=8192, d=head_dim), rel=1e-9)
