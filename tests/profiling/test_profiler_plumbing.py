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
