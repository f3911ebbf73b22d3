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
    # valid sizes on a machine without CUDA: the one-line GPU error, not a traceback
    assert main(["profile", "--train-attention", "--out", str(tmp_path)]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
