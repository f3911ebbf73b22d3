"""What the profiler writes: training-attention rows that load, elementwise byte labels, cold
GEMM weights and the rows' provenance (CPU; timers faked or only built, not timed)."""

from __future__ import annotations

import contextlib
import types

import pandas as pd
import pytest

import charon_search.profiling as prof
from charon_search.cli import main
from charon_search.profiling import OpShape, profile_shapes, rows_from_measurements
from charon_search.profiling.runner import CudaEventTimer, db_rows_problems


def _shape(kind, variant, dtype, **params):
    return OpShape(op_kind=kind, variant=variant, dtype=dtype,
                   params=tuple(sorted((k, float(v)) for k, v in params.items())))


@pytest.fixture
def fake_h200(monkeypatch):
    import torch

    class Timer:
        inner, eager_fallbacks, last_note = 10, 0, "timing: eager calls, median of 10"

        def __init__(self, **kw):
            pass

        def __call__(self, shape):  # a distinct, positive time per shape
            p = dict(shape.params)
            return 1e-6 * (1 + p.get("q_len", 1) / 1024 + p.get("head_dim", 0) / 64
                           + (shape.op_kind == "attention_bwd"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(prof, "CudaEventTimer", Timer)


# ------------------------------------------------------------------ item 4: training attention
def test_train_attention_runs_load_into_the_simulator_without_hand_edits(fake_h200, tmp_path,
                                                                         monkeypatch):
    from charon_search.profiling.merge_train_attention import main as merge
    from charon_search.sim import train_attention as ta

    d128, mla = tmp_path / "d128", tmp_path / "mla"
    assert main(["profile", "--train-attention", "--sdpa-backend", "cudnn", "--eager",
                 "--out", str(d128)]) == 0
    assert main(["profile", "--train-attention", "--sdpa-backend", "cudnn", "--eager",
                 "--head-dim", "192", "--v-head-dim", "128", "--out", str(mla)]) == 0
    rows = pd.read_parquet(d128 / "train_attention.parquet")
    assert len(rows) == 162 and (rows.v_head_dim == rows.head_dim).all()  # filled, not NaN
    assert (rows.op_kind == "attention_bwd").sum() == 81  # not collapsed to one
    assert len(pd.read_parquet(d128 / "profile_rows.parquet")) == 0  # kept apart from DB rows
    assert set(pd.read_parquet(mla / "train_attention.parquet").v_head_dim) == {128.0}
    measured = tmp_path / "charon_search" / "data" / "profiles" / "measured"
    measured.mkdir(parents=True)
    merged = measured / "h200-sxm-141gb.train-attention-cudnn.parquet"
    assert merge([str(merged), str(d128), str(mla)]) == 0
    assert merge([str(tmp_path / "x.parquet"), str(d128), str(d128)]) == 2  # a shape twice
    # sim.train_attention reads the merged file as it would the shipped one
    monkeypatch.setattr(ta, "resources", types.SimpleNamespace(
        files=lambda pkg: tmp_path / "charon_search", as_file=contextlib.nullcontext))
    ta._table.cache_clear()
    ta._nearest.cache_clear()
    try:
        t = ta._table("cudnn")
        assert len(t.flops_per_s) == 324 and int(t.backward.sum()) == 162
        rate = ta.TrainingAttention("cudnn", (1.0, 1.0)).flops_per_s(
            1, 32, 4096, 4096, 192, 128, causal=True, backward=True)
        assert rate > 0
    finally:
        ta._table.cache_clear()
        ta._nearest.cache_clear()


def test_db_row_problems_are_named_not_dropped():
    bwd = [_shape("attention_bwd", "prefill", "bf16", batch=1, heads=8, kv_heads=8,
                  q_len=q, kv_len=q, head_dim=192, v_head_dim=128) for q in (1024, 2048)]
    rows = rows_from_measurements([(s, 1e-3) for s in bwd], gpu="g", kernel="k", source="s")
    problems = db_rows_problems(rows)
    assert any("unknown columns ['v_head_dim']" in p for p in problems)
    assert any("'attention_bwd' has no profile-DB lookup key: its 2 rows" in p
               for p in problems)
    ok = rows_from_measurements([(_shape("gemm", "", "bf16", m=1, n=2, k=3), 1e-6)],
                                gpu="g", kernel="k", source="s")
    assert db_rows_problems(ok) == []


# ------------------------------------------------------------------ item 5: elementwise labels
def test_elementwise_bytes_follow_dtype_and_the_timed_kernels():
    shapes = {(v, dt): _shape("elementwise", v, dt, numel=1024)
              for v in ("add", "act", "rope") for dt in ("bf16", "fp32")}
    rows = {(r["variant"], r["dtype"]): r for r in rows_from_measurements(
        [(s, 1e-6) for s in shapes.values()], gpu="g", kernel="torch", source="s")}
    assert rows["add", "bf16"]["bytes"] == 6 * 1024   # read x, y; write out: 3 x 2 B
    assert rows["add", "fp32"]["bytes"] == 12 * 1024  # fp32: 3 x 4 B, not the bf16 6
    assert rows["act", "bf16"]["bytes"] == 10 * 1024  # silu (r1 w1) then mul (r2 w1)
    assert rows["rope", "bf16"]["bytes"] == 6 * 1024  # x * cs: two full-size reads
    assert rows["rope", "fp32"]["bytes"] == 12 * 1024
    assert "2 kernels" in rows["act", "bf16"]["kernel"]
    assert "stand-in" in rows["rope", "bf16"]["kernel"]


# ------------------------------------------------------------------ item 6: cold L2, provenance
def test_decode_sized_gemm_weights_rotate_past_the_l2():
    import torch

    timer = CudaEventTimer(device="cpu", l2_bytes=50 * 10**6)
    small = _shape("gemm", "", "bf16", m=1, n=1024, k=1024)  # 2.1 MB of weights
    fn = timer.build(small)
    assert fn.rotation == 48  # ceil(2 x 50 MB / 2.1 MB): 100.7 MB of copies
    nxt = next(c.cell_contents for c in fn.__closure__ if callable(c.cell_contents))
    ptrs = set()
    for _ in range(48):
        ptrs.add(nxt().data_ptr())
    assert len(ptrs) == 48  # each call of one cycle reads another copy
    assert timer.graph_calls(fn) == 48  # a replay covers the whole rotation
    assert "L2 cold: weights rotated over 48 copies" in timer._l2_note
    assert timer.graph_calls(types.SimpleNamespace(rotation=4)) == 12  # multiple of 4, >= 10
    big = timer.build(_shape("gemm", "", "bf16", m=1, n=8192, k=8192))  # 134 MB > 2 x L2
    assert big.rotation == 1
    fp8 = timer.build(_shape("gemm", "scaled_mm.tensorwise", "fp8", m=16, n=1024, k=1024))
    assert fp8.rotation == 96 and fp8().dtype == torch.bfloat16
    moe = timer.build(_shape("grouped_gemm", "moe_ffn", "bf16", tokens=16, top_k=8,
                             num_experts=128, n=64, k=128))
    assert moe.rotation == 48
    warm = CudaEventTimer(device="cpu", l2_bytes=50 * 10**6, cold_l2=False)
    assert warm.build(small).rotation == 1


def test_rows_source_names_versions_timing_and_l2(monkeypatch):
    import torch

    from charon_search.profiling import runner

    monkeypatch.setattr(runner, "_driver_version", lambda: "580.159.04")
    base = runner.default_source("NVIDIA H200")
    assert "driver 580.159.04" in base and f"torch {torch.__version__}" in base
    assert "CUDA " in base and "cuDNN " in base
    timer = CudaEventTimer(device="cpu", l2_bytes=50 * 10**6)

    def fake_time(fn):
        timer.last_note = "timing: CUDA-graph replay of 48 calls, median of 10, 3 warm-up"
        return 1e-6
    monkeypatch.setattr(timer, "time_fn", fake_time)
    rows = profile_shapes([_shape("gemm", "", "bf16", m=1, n=1024, k=1024),
                           _shape("norm", "rmsnorm", "bf16", rows=4, cols=1024)],
                          timer=timer, gpu="h200-sxm-141gb", kernel="torch", source=base)
    assert rows[0]["source"].startswith(base)
    assert "timing: CUDA-graph replay of 48 calls" in rows[0]["source"]
    assert "L2 cold: weights rotated over 48 copies" in rows[0]["source"]
    assert "L2 warm: operands reused" in rows[1]["source"]
