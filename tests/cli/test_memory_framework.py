"""``charon-search memory --framework``: the framework's optimizer-state layout, in closed form."""

from __future__ import annotations

import json

import pytest

from charon_search.catalog import load_model
from charon_search.cli import main

ARGS = ["memory", "--model", "debug-llama", "--cluster", "h100-sxm-8gpu", "--gpus", "8",
        "--mbs", "1", "--gbs", "8", "--seq", "512", "--zero", "3"]


def _stage0(tmp_path, *extra: str) -> dict:
    out = tmp_path / "mem.json"
    assert main([*ARGS, *extra, "--json", str(out)]) == 0
    return json.loads(out.read_text())["stages"][0]


@pytest.mark.parametrize(("framework", "param_b", "grad_b", "optim_b"), [
    # ZeRO paper mixed precision: bf16 params and grads, fp32 master + m + v (12 B).
    (None, 2, 2, 12),
    # torchtitan FSDP2: fp32 sharded params and grads, AdamW m + v in fp32 (8 B).
    ("torchtitan", 4, 4, 8),
    # Megatron distributed optimizer: bf16 params, fp32 main grads, fp32 master + m + v.
    ("megatron", 2, 4, 12),
])
def test_framework_state_bytes_per_param(tmp_path, framework, param_b, grad_b, optim_b) -> None:
    shard = load_model("debug-llama").num_params / 8  # ZeRO-3 over dp = 8
    st = _stage0(tmp_path, *(["--framework", framework] if framework else []))
    assert st["params_bytes"] == pytest.approx(param_b * shard, rel=1e-6)
    assert st["grads_bytes"] == pytest.approx(grad_b * shard, rel=1e-6)
    assert st["optimizer_bytes"] == pytest.approx(optim_b * shard, rel=1e-6)


def test_unknown_framework_is_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main([*ARGS, "--framework", "deepspeed"])
    assert exc.value.code == 2
    assert "torchtitan" in capsys.readouterr().err
