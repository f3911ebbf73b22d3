"""Profiler plumbing on CPU: shape selection, row writing, calibration blocks (timer injected)."""

from __future__ import annotations

import pandas as pd
import pytest

from charon_search.cost.profile_db import ProfileDB, write_profile_db
from charon_search.errors import ConfigError
from charon_search.passes.synthetic import synthetic_model
from charon_search.profiling import (
    OpShape,
    overlap_calibration,
    parse_points,
    profile_shapes,
    select_shapes,
    standard_grid,
)


def _graphs():
    m = synthetic_model(hidden=256, heads=8, kv_heads=4, ffn=512, vocab=1024)
    return [blk.forward for blk in m.blocks.values()]


def test_parse_points():
    assert parse_points("1x4096, 8x1:2048") == [(1, 4096, 4096), (8, 1, 2048)]
    with pytest.raises(ConfigError, match="BxS"):
        parse_points("4096")


def test_select_shapes_from_graph_nodes():
    shapes = select_shapes(_graphs(), [(2, 128, 128), (4, 1, 512)])
    gemms = {s.params for s in shapes if s.op_kind == "gemm"}
    # q_proj of the synthetic block: [b*s, 256] x [256, 256].
    assert (("k", 256.0), ("m", 256.0), ("n", 256.0)) in gemms
    assert (("k", 256.0), ("m", 4.0), ("n", 256.0)) in gemms
    attn = [dict(s.params) for s in shapes if s.op_kind == "attention"]
    assert {"batch": 2.0, "heads": 8.0, "kv_heads": 4.0, "q_len": 128.0, "kv_len": 128.0,
            "head_dim": 32.0} in attn
    decode = [s for s in shapes if s.op_kind == "attention" and s.variant == "decode"]
    assert decode and all(s.get("q_len") == 1 and s.get("kv_len") == 512 for s in decode)
    assert len(shapes) == len(set(shapes))  # unique


def test_rows_written_in_db_schema(tmp_path):
    shapes = select_shapes(_graphs(), [(1, 64, 64)]) + standard_grid()[:5]
    # Injected timer: 1 ns per FLOP-ish unit, so rows are checkable.
    timer = lambda s: 1e-6 + 1e-12 * s.get("m", 1) * s.get("n", 1) * s.get("k", 1)  # noqa: E731
    rows = profile_shapes(shapes, timer=timer, gpu="h200-sxm-141gb", kernel="fake",
                          source="test")
    assert len(rows) == len(shapes)
    write_profile_db(pd.DataFrame(rows), tmp_path)
    db = ProfileDB(tmp_path)
    got = db.exact("h200-sxm-141gb", "gemm", "", "bf16", {"m": 64, "n": 256, "k": 256})
    assert got == pytest.approx(1e-6 + 1e-12 * 64 * 256 * 256)
    assert "attention" in db.op_kinds("h200-sxm-141gb")


def test_failing_shapes_are_reported_not_fatal():
    errors = []
    bad = OpShape(op_kind="gemm", variant="", dtype="bf16", params=(("k", 1.0), ("m", 1.0),
                                                                     ("n", 1.0)))

    def timer(shape):
        raise RuntimeError("CUDA out of memory")

    rows = profile_shapes([bad], timer=timer, gpu="g", kernel="k", source="s",
                          on_error=lambda s, e: errors.append(str(e)))
    assert rows == [] and errors == ["CUDA out of memory"]


def test_overlap_calibration_block():
    block = overlap_calibration({"gemm_s": 1.4e-3, "comm_s": 2.8e-3, "gemm_reps": 2.0,
                                 "gemm_overlapped_s": 3.08e-3, "comm_overlapped_s": 2.94e-3,
                                 "comm_kind": "all_reduce", "compute_slowdown": 1.1,
                                 "comm_slowdown": 1.05}, device="H200")
    assert block["overlap_compute_slowdown"] == 1.1
    assert block["overlap_comm_slowdown"] == 1.05
    assert "x2 (1.400 ms each alone)" in block["provenance"]["overlap_compute_slowdown"]


def test_training_attention_grid_covers_squares_and_ring_blocks():
    from charon_search.profiling import training_attention_grid

    grid = training_attention_grid()
    kinds = {s.op_kind for s in grid}
    assert kinds == {"attention", "attention_bwd"}
    fwd = [dict(s.params) for s in grid if s.op_kind == "attention"]
    assert len(fwd) * 2 == len(grid) == 162  # 27 blocks x 3 head counts, fwd and bwd
    squares = [p for p in fwd if p["q_len"] == p["kv_len"]]
    assert all(p["batch"] * p["q_len"] <= 65536 for p in squares)
    # the load-balanced ring-attention steps of CP4 at 128k: 32k x 16k and 16k x 32k
    assert {(p["q_len"], p["kv_len"]) for p in fwd if p["q_len"] != p["kv_len"]} >= {
        (32768.0, 16384.0), (16384.0, 32768.0)}
    mla = training_attention_grid(head_dim=192, v_head_dim=128)
    assert all(dict(s.params)["v_head_dim"] == 128 for s in mla)


def test_timer_builds_backward_and_fp8_ops_on_cpu():
    import torch

    from charon_search.profiling import CudaEventTimer, fp8_training_gemm_grid

    timer = CudaEventTimer(device="cpu")
    bwd = OpShape(op_kind="attention_bwd", variant="prefill", dtype="fp32",
                  params=tuple(sorted({"batch": 1.0, "heads": 2.0, "kv_heads": 2.0,
                                       "q_len": 64.0, "kv_len": 64.0, "head_dim": 24.0,
                                       "v_head_dim": 16.0}.items())))
    fn = timer.build(bwd)
    for _ in range(2):  # the forward is kept: every call replays the backward alone
        dq, _dk, dv = fn()
        assert dq.shape == (1, 2, 64, 24) and dv.shape == (1, 2, 64, 16)
    grid = fp8_training_gemm_grid()
    assert len(grid) == 96 and {s.variant for s in grid} == {
        "", "scaled_mm.tensorwise", "scaled_mm.rowwise", "scaled_mm.rowwise_slowacc"}
    small = OpShape(op_kind="gemm", variant="scaled_mm.rowwise", dtype="fp8",
                    params=(("k", 64.0), ("m", 32.0), ("n", 48.0)))
    fn = timer.build(small)
    inputs = [c.cell_contents for c in fn.__closure__ or ()
              if isinstance(c.cell_contents, torch.Tensor)]
    nxt = next(c.cell_contents for c in fn.__closure__ or () if callable(c.cell_contents))
    inputs.append(nxt())  # the (rotated, cold-L2) weight operand
    assert sum(t.dtype == torch.float8_e4m3fn for t in inputs) == 2  # not a bf16 F.linear
    assert fn().dtype == torch.bfloat16
    with pytest.raises(ValueError, match="sdpa_backend"):
        CudaEventTimer(device="cpu", sdpa_backend="flash3")


def test_profile_cli_rejects_bad_sizes_before_looking_for_a_gpu(tmp_path, capsys):
    from charon_search.cli import main

    assert main(["profile", "--train-attention", "--head-dim", "0", "--out",
                 str(tmp_path)]) == 2
    assert "--head-dim must be a positive integer, got 0" in capsys.readouterr().err
    assert main(["profile", "--repeats", "0", "--out", str(tmp_path)]) == 2
    assert "--repeats must be a positive integer" in capsys.readouterr().err
    # What the command measures is checked before the GPU too: a bad command fails the same
    # on a machine without one.
    assert main(["profile", "--out", str(tmp_path)]) == 2
    assert "nothing to measure: give --model NAME" in capsys.readouterr().err
    assert main(["profile", "--model", "llama-3.1-8bb", "--out", str(tmp_path)]) == 2
    assert "closest catalog names: llama-3.1-405b, llama-3.1-70b, llama-3.1-8b" in (
        capsys.readouterr().err)
    assert main(["profile", "--model", "llama-3.1-8b", "--points", "1x", "--out",
                 str(tmp_path)]) == 2
    assert "--points item '1x'" in capsys.readouterr().err
    # valid sizes on a machine without CUDA: the one-line GPU error, not a traceback
    assert main(["profile", "--train-attention", "--out", str(tmp_path)]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_gh100_crosscheck_grid_is_on_both_shipped_tables_where_fp8_disagrees():
    """The H100 / H200 cross-check times shapes both shipped GEMM tables hold, so one run per
    part compares one-to-one; at its last three (n, k) the tables' fp8 rows disagree (H200 time
    0.56-0.88x the H100's) while their bf16 rows agree (0.95-1.15x)."""
    import torch

    from charon_search.cost.profile_db import default_profile_db
    from charon_search.profiling import CudaEventTimer, gh100_crosscheck_grid
    from charon_search.profiling.shapes import GH100_CROSSCHECK_NK

    grid = gh100_crosscheck_grid()
    gemms = [s for s in grid if s.op_kind == "gemm"]
    assert len(gemms) == 30 and {s.variant for s in gemms} == {"", "scaled_mm.tensorwise"}
    db = default_profile_db()
    tables = {gpu: db.table(gpu, "gemm").to_pandas() for gpu in ("h100-sxm-80gb",
                                                                  "h200-sxm-141gb")}

    def latency(gpu: str, dtype: str, m: float, n: float, k: float) -> float:
        df = tables[gpu]
        hit = df[(df.dtype == dtype) & (df.m == m) & (df.n == n) & (df.k == k)
                 & df.kernel.isin(["torch.nn.functional.linear",
                                   "CutlassFP8ScaledMMLinearKernel"])]
        assert len(hit) == 1, (gpu, dtype, m, n, k)
        return float(hit.latency_s.iloc[0])

    for s in gemms:
        dtype = "bf16" if s.variant == "" else "fp8"
        m, n, k = s.get("m"), s.get("n"), s.get("k")
        ratio = latency("h200-sxm-141gb", dtype, m, n, k) / latency("h100-sxm-80gb", dtype,
                                                                     m, n, k)
        if dtype == "bf16":
            assert 0.95 <= ratio <= 1.15, (m, n, k, ratio)
        elif (n, k) in GH100_CROSSCHECK_NK[2:]:
            assert 0.55 <= ratio <= 0.89, (m, n, k, ratio)
    # the decode-sized small ops build and run (here on the CPU)
    timer = CudaEventTimer(device="cpu")
    small = [s for s in grid if s.op_kind != "gemm"]
    assert len(small) == 45 and {s.op_kind for s in small} == {"norm", "elementwise"}
    out = timer.build(next(s for s in small if s.op_kind == "norm" and s.get("rows") == 4))()
    assert isinstance(out, torch.Tensor) and out.shape == (4, 2880)
