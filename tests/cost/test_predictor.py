"""Predictors: held-out-shape accuracy beats roofline, vectorized forest, disk cache."""

from __future__ import annotations

import numpy as np
import pytest

from charon_search.cost import predictor as P
from charon_search.cost.profile_db import default_profile_db, subset_profile_db

GPU = "h100-sxm-80gb"
SMALL_HP = {**P.HYPERPARAMS, "max_iter": 80, "learning_rate": 0.15}


@pytest.fixture(scope="module")
def small_db(tmp_path_factory):
    """Every 6th GEMM/attention row and all norm rows of the shipped H100 tables."""
    return subset_profile_db(default_profile_db(), tmp_path_factory.mktemp("pdb"), gpus=[GPU],
                             op_kinds=["gemm", "attention", "norm"],
                             every={"gemm": 6, "attention": 6})


def test_heldout_split_holds_out_whole_shapes(small_db):
    table = P.rows_for(small_db.table(GPU, "gemm"), "", "bf16")
    train, test = P.heldout_split(table)
    pairs = lambda t: set(zip(t.columns["n"], t.columns["k"]))  # noqa: E731
    assert pairs(train).isdisjoint(pairs(test))
    assert 0.1 < len(test) / len(table) < 0.35


@pytest.mark.parametrize(("kind", "family"), [("gemm", ""), ("attention", "prefill"),
                                              ("attention", "decode"), ("norm", "")])
def test_predictor_beats_roofline_on_heldout_shapes(small_db, kind, family):
    rows = P.heldout_evaluation(small_db, gpus=[GPU], kinds=[kind], dtypes=["bf16"],
                                hyperparams=SMALL_HP,
                                max_train_rows=2500)
    row = next(r for r in rows if r["family"] == family and r["dtype"] == "bf16")
    assert row["num_heldout"] > 20
    # Roofline (cluster_specs GPU peaks x efficiency) misses small-shape and kernel effects.
    assert row["mape_predictor"] < row["mape_roofline"], row
    assert row["mape_predictor"] < 0.12, row


def test_flat_forest_matches_sklearn(small_db):
    table = P.rows_for(small_db.table(GPU, "norm"), "", "bf16")
    pred = P.train_predictor(P.ModelKey(GPU, "norm", "", "bf16"), table, num_sms=132,
                             hyperparams=SMALL_HP)
    X, _, _ = P.feature_matrix("norm", table.columns, len(table), 132)
    np.testing.assert_allclose(pred.flat.predict(X), pred.model.predict(X), rtol=0, atol=1e-12)


def test_store_caches_on_disk(small_db, monkeypatch):
    store = P.PredictorStore(small_db, hyperparams=SMALL_HP)
    first = store.get(GPU, "norm", "", "bf16")
    assert first is not None and first.num_rows == len(
        P.rows_for(small_db.table(GPU, "norm"), "", "bf16"))
    # A second store (another Ray worker) loads the pickle instead of training.
    monkeypatch.setattr(P, "train_predictor", lambda *a, **k: pytest.fail("retrained"))
    again = P.PredictorStore(small_db, hyperparams=SMALL_HP).get(GPU, "norm", "", "bf16")
    cols = {"rows": np.array([1.0, 4096.0]), "cols": np.array([4096.0, 8192.0])}
    np.testing.assert_array_equal(first.predict(cols), again.predict(cols))
    assert P.PredictorStore(small_db, hyperparams=SMALL_HP).get(GPU, "nope", "", "bf16") is None


def test_gemm_flops_and_bytes_closed_form():
    flops, nbytes = P.shape_flops_bytes("gemm", {"m": 4096, "n": 1024, "k": 512}, 1)
    assert flops[0] == 2 * 4096 * 1024 * 512
    assert nbytes[0] == 2 * (4096 * 512 + 512 * 1024 + 4096 * 1024)
    # Causal prefill: q = kv = 4: 4 + 3 + 2 + 1 = 10 score pairs per head.
    flops, _ = P.shape_flops_bytes("attention", {"batch": 1, "heads": 2, "kv_heads": 1,
                                                 "q_len": 4, "kv_len": 4, "head_dim": 8}, 1)
    assert flops[0] == 2 * 2 * 10 * (8 + 8)


def test_cli_profiles_eval_json(small_db, tmp_path):
    import json

    from charon_search.cli import main

    out = tmp_path / "eval.json"
    assert main(["profiles", "eval", "--db", str(small_db.root), "--gpu", "h100",
                 "--op-kind", "norm", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["gpu"], r["op_kind"]) for r in rows] == [(GPU, "norm")]
    r = rows[0]
    assert {"num_heldout", "mape_predictor", "mape_roofline"} <= set(r)
    assert 0 < r["mape_predictor"] < r["mape_roofline"] < 1  # ratios, not percent
    assert main(["profiles", "eval", "--db", str(small_db.root), "--gpu", "l20"]) == 2


def test_elementwise_predictor_knows_the_per_token_width():
    """vidur's H100 SiLU-and-mul rows (one thread block per token) take 15 us for 4 tokens of
    Llama-2-70B at TP 1 (28,672 columns) and 2.4 us for 40 tokens at TP 8 (3,584 columns), a
    larger op. With the token width as a feature the predictor prices both; on numel alone it
    priced Llama-3.1-70B's TP 8 decode activation (8 x 3,584) at 10 us."""
    table = default_profile_db().table(GPU, "elementwise")
    act = P.rows_for(table, "act", "bf16").to_pandas()
    llama = act[act.source.str.contains("Llama-2-70b-hf")]
    wide = llama[(llama.rows == 4) & (llama.cols == 28672)].latency_s.iloc[0]
    narrow = llama[(llama.rows == 40) & (llama.cols == 3584)].latency_s.iloc[0]
    assert wide == pytest.approx(15.2e-6, rel=0.05) and narrow == pytest.approx(2.35e-6, rel=0.1)
    pred = P.PredictorStore(default_profile_db(), use_disk_cache=False).get(
        GPU, "elementwise", "act", "bf16", num_sms=132)
    rows, cols = np.array([4.0, 40.0, 8.0]), np.array([28672.0, 3584.0, 3584.0])
    shape = {"numel": rows * cols, "bytes": 3 * 2 * rows * cols, "rows": rows, "cols": cols}
    p_wide, p_narrow, p_decode = pred.predict(shape, 3)
    assert p_wide == pytest.approx(wide, rel=0.2) and p_narrow == pytest.approx(narrow, rel=0.2)
    assert p_decode < 4e-6  # its measured neighbours at 24-40 tokens: 2.2-2.4 us
