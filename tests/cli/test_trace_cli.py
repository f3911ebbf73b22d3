"""`charon-search trace` and `charon-search catalog`."""

from __future__ import annotations

import json

import pytest

from charon_search.cli import main
from charon_search.frontend import trace_model


def test_trace_json(tmp_path, capsys) -> None:
    out = tmp_path / "trace.json"
    rc = main(["trace", "debug-llama", "--phase", "train", "--seq", "128", "--mbs", "2",
               "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert set(doc) == {"model", "phase", "params", "active_params", "totals", "traced_totals",
                        "nodes"}
    assert doc["model"] == "debug-llama" and doc["phase"] == "train"
    assert doc["params"] == doc["active_params"] == 119104  # dense: every parameter is active
    tm = trace_model("debug-llama", "train")
    assert doc["traced_totals"]["flops"] == pytest.approx(tm.total_flops(2, 128))
    assert doc["traced_totals"]["bytes"] == pytest.approx(tm.total_bytes(2, 128))
    # The totals count the causal half of each (s x s) attention square, forward and backward,
    # and leave out the RoPE table ops of the embedding block (precomputed, as in serving).
    layers = tm.block_counts()["dense"]
    attn = sum(n["flops"] for n in doc["nodes"] if n["kind"].startswith("attention"))
    emb = tm.blocks["embedding"].forward
    rope = sum(n.flops(2, 128, 128) for n in emb.nodes
               if n.role == "embed" and n.kind in ("elementwise", "copy"))
    assert doc["totals"]["flops"] == pytest.approx(
        tm.total_flops(2, 128) - layers * attn / 2 - rope)
    gemms = [n for n in doc["nodes"] if n["kind"] == "gemm"]
    assert gemms and all(n["role"] for n in gemms)
    q = next(n for n in gemms if n["module_path"] == "self_attn.q_proj" and n["graph"] == "fwd")
    assert q["params"] == {"m": 256, "n": 64, "k": 64}
    assert q["flops"] == 2 * 256 * 64 * 64
    printed = capsys.readouterr().out
    assert "whole model" in printed and "self_attn.q_proj" in printed


def test_trace_decode_uses_ctx(tmp_path) -> None:
    out = tmp_path / "d.json"
    assert main(["trace", "debug-llama", "--phase", "decode", "--mbs", "4", "--ctx", "512",
                 "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    attn = next(n for n in doc["nodes"] if n["kind"] == "attention")
    assert attn["params"]["kv_len"] == 512 and attn["params"]["q_len"] == 1


@pytest.mark.parametrize(
    "argv",
    [
        ["trace", "no-such-model"],
        ["trace", "/no/such/config.json"],
        ["trace", "debug-llama", "--gpu", "no-such-gpu"],
        ["trace", "debug-llama", "--seq", "0"],
        ["trace", "debug-llama", "--phase", "train", "--seq", "64", "--ctx", "100000"],
        ["trace", "debug-llama", "--phase", "prefill", "--seq", "64", "--ctx", "8"],
        ["profiles", "fit-collectives", "--gpu", "h100"],
        ["profiles", "eval", "--gpu", "a40", "--op-kind", "attention"],
    ],
)
def test_bad_input_exits_2(argv, capsys) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error" in err[0]


def test_malformed_config_exits_2(tmp_path, capsys) -> None:
    bad = tmp_path / "config.json"
    bad.write_text("{oops")
    assert main(["trace", str(bad)]) == 2
    assert "not valid JSON" in capsys.readouterr().err


def test_catalog_lists_models(capsys) -> None:
    assert main(["catalog", "--models-only"]) == 0
    out = capsys.readouterr().out
    assert "llama-3.1-70b" in out and "deepseek-v3" in out and "8/256" in out
    # Mixtral's active parameters: 46,702,792,704 less 32 layers x (8 - 2) idle experts x
    # 3 x 4096 x 14336 = 12,879,925,248 (Mistral AI: 12.9 B active).
    assert "46,702,792,704    12,879,925,248" in out
    # the quantized checkpoints whose per-module precision the entry states
    assert "int4 (moonshotai/Kimi-K2.5)" in out and "fp4 (openai/gpt-oss-120b)" in out
