"""`charon-search serve` end to end on the debug model (traced graphs, fused cost model)."""

from __future__ import annotations

import json

import pytest

from charon_search.cli import main

REQUIRED = ("ttft_s", "tpot_s", "itl_s", "e2e_s", "requests_per_s", "output_tokens_per_s",
            "tokens_per_s_per_user", "tokens_per_s_per_gpu", "num_gpus", "num_requests",
            "num_completed", "num_preemptions", "prefix_hit_rate", "kv_utilization",
            "mean_requests_in_system", "arrival_rate")


@pytest.mark.slow
def test_serve_writes_report(tmp_path, capsys) -> None:
    out = tmp_path / "serve.json"
    trace = tmp_path / "trace.json"
    rc = main(["serve", "--model", "debug-llama", "--cluster", "h100-sxm-8gpu", "--tp", "2",
               "--workload", "poisson", "--rate", "50", "--num-requests", "50",
               "--input-len", "200", "--output-len", "20", "--max-num-seqs", "16",
               "--json", str(out), "--chrome-trace", str(trace)])
    assert rc == 0
    data = json.loads(out.read_text())
    for key in REQUIRED:
        assert key in data, key
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        assert set(data[key]) == {"mean", "p50", "p90", "p99"}
    assert data["num_completed"] == data["num_requests"] == 50
    assert data["num_gpus"] == 2
    assert data["ttft_s"]["mean"] > 0 and data["tpot_s"]["mean"] > 0
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("name") == "decode" for e in events)
    out = capsys.readouterr().out
    assert "TTFT" in out
    # No engine named: vLLM's accounting, 0.9 of the device; the default kv_dtype ``auto``
    # is the bf16 checkpoint's bf16.
    assert data["config"]["kv_dtype"] == "bf16"
    assert (f"KV cache {data['kv_capacity_tokens']:,} tokens per replica "
            "(bf16, gpu_memory_utilization 0.9)") in out


@pytest.mark.slow
def test_serve_disagg_and_trace(tmp_path) -> None:
    out = tmp_path / "d.json"
    rc = main(["serve", "--model", "debug-llama", "--cluster", "h100-sxm-8gpu",
               "--workload", "splitwise_conv_2k.csv", "--num-requests", "100",
               "--disagg", "prefill=2xTP1,decode=1xTP2", "--kv-transfer", "nvlink",
               "--json", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["num_gpus"] == 4 and data["num_completed"] == 100


def test_serve_engine_flag_takes_the_clusters_hand_over_time(tmp_path) -> None:
    """``--engine sglang`` on h100-sxm-8gpu: one disaggregated request's TTFT carries the
    spec's calibrated SGLang hand-over (200 ms, docs/calibration/serving-disagg-handoff.yaml):
    exactly that much more than the same run with the hand-over set to 0 in ``--config``."""
    from charon_search.hardware import load_cluster

    handoff = load_cluster("h100-sxm-8gpu").calibration.disagg_handoff_s["sglang"]
    assert handoff == pytest.approx(0.2)
    zero = tmp_path / "zero.yaml"
    zero.write_text("disagg_handoff_s: 0.0\n")
    ttft = []
    for extra in ([], ["--config", str(zero)]):
        out = tmp_path / f"r{len(ttft)}.json"
        rc = main(["serve", "--model", "debug-llama", "--cluster", "h100-sxm-8gpu",
                   "--engine", "sglang", "--disagg", "prefill=1xTP1,decode=1xTP1",
                   "--kv-transfer", "nvlink", "--workload", "concurrency", "--concurrency", "1",
                   "--num-requests", "1", "--input-len", "512", "--output-len", "8",
                   "--no-progress", "--json", str(out), *extra])
        assert rc == 0
        ttft.append(json.loads(out.read_text())["ttft_s"]["mean"])
    assert ttft[0] - ttft[1] == pytest.approx(handoff, rel=1e-6)
    with pytest.raises(SystemExit) as exc:  # argparse names the flag and its choices
        main(["serve", "--model", "debug-llama", "--cluster", "h100-sxm-8gpu",
              "--engine", "tgi"])
    assert exc.value.code == 2


def test_serve_without_engine_says_which_host_times_it_leaves_out(capsys) -> None:
    """h100-sxm-8gpu calibrates host times for all three engines: a generic run names them
    and the flag that applies them; a run with ``--engine`` says nothing."""
    base = ["serve", "--model", "debug-llama", "--cluster", "h100-sxm-8gpu",
            "--num-requests", "5", "--no-progress"]
    assert main(base) == 0
    err = capsys.readouterr().err
    assert "generic engine" in err and "--engine sglang|trtllm|vllm" in err
    assert main([*base, "--engine", "vllm"]) == 0
    assert "generic engine" not in capsys.readouterr().err


@pytest.mark.parametrize("argv, needle", [
    (["--disagg", "prefill=2"], "disagg"),
    (["--tp", "3"], "tp"),
    (["--workload", "missing.csv"], "does not exist"),
    (["--prompt-pool", "0"], "--prompt-pool"),
])
def test_serve_bad_input_exits_2(argv, needle, capsys) -> None:
    rc = main(["serve", "--model", "debug-llama", "--cluster", "h100-sxm-8gpu",
               "--num-requests", "5", *argv])
    assert rc == 2
    assert needle in capsys.readouterr().err


def test_serve_prompt_pool_hits_the_prefix_cache(tmp_path) -> None:
    """A closed loop of 40 requests over a pool of 8 prompts of 512 tokens: the first 8 miss,
    the other 32 reuse 31 of their 32 blocks (the last block of a full hit is recomputed)."""
    out = tmp_path / "pool.json"
    rc = main(["serve", "--model", "debug-llama", "--cluster", "h100-sxm-8gpu",
               "--workload", "concurrency", "--concurrency", "4", "--num-requests", "40",
               "--input-len", "512", "--output-len", "4", "--prompt-pool", "8",
               "--prefix-caching", "--no-progress", "--json", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["prefix_hit_rate"] == pytest.approx(32 * 496 / (40 * 512))


def test_serve_memory_fraction_is_read_as_the_engines_setting(capsys) -> None:
    """``--memory-fraction 0.8`` with ``--engine sglang`` is SGLang's static fraction (weights
    and KV): the printed setting says so, and a bad value names the field."""
    base = ["serve", "--model", "debug-llama", "--cluster", "h100-sxm-8gpu", "--engine",
            "sglang", "--workload", "concurrency", "--concurrency", "2", "--num-requests", "4",
            "--input-len", "64", "--output-len", "4", "--no-progress"]
    assert main([*base, "--memory-fraction", "0.8"]) == 0
    assert "(bf16, mem_fraction_static 0.8)" in capsys.readouterr().out
    assert main([*base, "--memory-fraction", "1.5"]) == 2
    assert "gpu_memory_utilization" in capsys.readouterr().err

