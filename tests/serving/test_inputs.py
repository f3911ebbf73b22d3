"""Config, workload, trace and KV-cache building blocks."""

from __future__ import annotations

import numpy as np
import pytest

from charon_search.errors import ConfigError
from charon_search.serving import (
    LengthDistribution,
    RadixPrefixCache,
    ServingConfig,
    WorkloadSpec,
    parse_disagg,
    read_trace,
)
from charon_search.serving.dynamic_sp import fixed_sp_latency, plan_dynamic_sp
from charon_search.serving.kv_cache import BlockPool


def test_config_from_dict_rejects_unknown_keys() -> None:
    with pytest.raises(ConfigError, match="max_num_seq"):
        ServingConfig.from_dict({"max_num_seq": 4})
    cfg = ServingConfig.from_dict({"tp": 4, "disagg": "prefill=2xTP2,decode=1xTP4",
                                   "speculative": {"num_draft_tokens": 2,
                                                   "acceptance_rate": [0.9, 0.5]}})
    assert cfg.disagg.prefill.num_replicas == 2 and cfg.disagg.decode.tp == 4
    assert cfg.num_gpus == 2 * 2 + 4
    assert cfg.speculative.expected_tokens_per_step == pytest.approx(1 + 0.9 + 0.45)


@pytest.mark.parametrize("bad", [{"scheduler": "fifo"}, {"tp": 0}, {"precision": "int3"},
                                 {"gpu_memory_utilization": 1.5}, {"dynamic_sp": True},
                                 {"cuda_graph_sizes": [8, 4]}])
def test_config_bad_values(bad) -> None:
    with pytest.raises(ConfigError):
        ServingConfig.from_dict(bad)


@pytest.mark.parametrize("bad", [{"prefix_offset": -1}, {"cached_prefixes": 5},
                                 {"cached_prefixes": -1}])
def test_workload_prompt_pool_bad_values(bad) -> None:
    with pytest.raises(ConfigError, match=next(iter(bad))):
        WorkloadSpec.from_dict({"shared_prefix_tokens": 64, "num_prefixes": 4, **bad})


def test_parse_disagg() -> None:
    d = parse_disagg("prefill=3xTP2PP2,decode=1xTP8EP8", "nvlink")
    assert (d.prefill.num_replicas, d.prefill.tp, d.prefill.pp) == (3, 2, 2)
    assert (d.decode.tp, d.decode.ep, d.kv_transfer) == (8, 8, "nvlink")
    for bad in ("prefill=2xTP2", "prefill=TP2,decode=1xTP1", "foo=1xTP1,decode=1xTP1"):
        with pytest.raises(ConfigError, match="disagg"):
            parse_disagg(bad)


def test_poisson_and_gamma_arrivals_match_rate_and_cv() -> None:
    for arrival, cv in (("poisson", 1.0), ("gamma", 3.0)):
        wl = WorkloadSpec(arrival=arrival, rate_per_s=10.0, cv=cv, num_requests=20000, seed=5)
        t = np.array([r.arrived_at_s for r in wl.generate()])
        gaps = np.diff(t)
        assert gaps.mean() == pytest.approx(0.1, rel=0.05)
        assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.08)
    a = WorkloadSpec(num_requests=50, seed=1).generate()
    b = WorkloadSpec(num_requests=50, seed=1).generate()
    assert a == b


def test_length_distributions() -> None:
    rng = np.random.default_rng(0)
    ln = LengthDistribution(kind="lognormal", mean=1000, sigma=0.5).sample(20000, rng)
    assert ln.mean() == pytest.approx(1000, rel=0.03)
    un = LengthDistribution(kind="uniform", low=10, high=20).sample(1000, rng)
    assert un.min() == 10 and un.max() == 20
    emp = LengthDistribution(kind="empirical", values=(5, 7)).sample(100, rng)
    assert set(emp) == {5, 7}
    with pytest.raises(ConfigError):
        LengthDistribution(kind="zipf")
    # The longest length each draws: the sampled maxima above, clipped to `maximum`.
    assert un.max() == LengthDistribution(kind="uniform", low=10, high=20).longest == 20
    assert emp.max() == LengthDistribution(kind="empirical", values=(5, 7)).longest == 7
    # A fixed/uniform/empirical length outside [minimum, maximum] is an error, not clipped:
    # 2,000,000 prompt tokens had been served as 1,048,576 (the old default maximum).
    with pytest.raises(ConfigError,
                       match=r"length.value. must lie in \[minimum, maximum\] = \[1, 500\]"):
        LengthDistribution(value=1024, maximum=500)
    with pytest.raises(ConfigError, match=r"workload.input_len: .length.low. must lie"):
        LengthDistribution.coerce({"kind": "uniform", "low": 5, "high": 20, "minimum": 10},
                                  where="workload.input_len")
    with pytest.raises(ConfigError, match="values"):
        LengthDistribution(kind="empirical", values=(5, 70), maximum=64)
    with pytest.raises(ConfigError, match=r"minimum <= length\.maximum"):
        LengthDistribution(minimum=10, maximum=5, value=7)
    assert LengthDistribution(value=2_000_000).sample(2, rng).tolist() == [2_000_000] * 2
    assert LengthDistribution(kind="lognormal", mean=1000).longest is None


def test_trace_csv(tmp_path) -> None:
    p = tmp_path / "t.csv"
    p.write_text("arrived_at,prompt_tokens,output_tokens,prefix_id\n2.0,100,5,3\n1.0,50,0,\n")
    reqs = read_trace(p)
    assert [r.arrived_at_s for r in reqs] == [0.0, 1.0]
    assert reqs[0].prompt_tokens == 50 and reqs[0].output_tokens == 1  # clamped to >= 1
    assert reqs[1].prefix_id == 3 and reqs[1].prefix_tokens == 99
    bad = tmp_path / "bad.csv"
    bad.write_text("arrived_at,prompt_tokens\n0,10\n")
    with pytest.raises(ConfigError, match="output_tokens"):
        read_trace(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        read_trace(tmp_path / "nope.csv")


def test_shipped_trace_reads() -> None:
    from importlib.resources import files

    path = files("charon_search") / "data" / "traces" / "splitwise_conv_2k.csv"
    reqs = read_trace(str(path))
    assert len(reqs) == 2000
    assert all(r.prompt_tokens >= 1 and r.output_tokens >= 1 for r in reqs)


def test_radix_tree_match_release_and_lru_eviction() -> None:
    tree = RadixPrefixCache()
    a = [("a", i) for i in range(4)]
    b = [("b", i) for i in range(2)]
    assert tree.acquire(a, now_s=1.0) == 4 and tree.acquire(b, now_s=2.0) == 2
    assert tree.match(a) == 4 and tree.match([*a[:2], ("x", 0)]) == 2
    assert tree.num_evictable == 0 and tree.evict(10) == 0  # all pinned
    tree.release(a, now_s=3.0)
    tree.release(b, now_s=4.0)
    assert tree.num_evictable == 6
    assert tree.evict(3) == 3  # the least recently used path (a) goes first, leaves first
    assert tree.match(a) == 1 and tree.match(b) == 2
    pool = BlockPool(10, 16, prefix_caching=True)
    pool.tree.acquire([("p", 0), ("p", 1)], now_s=0.0)
    pool.tree.release([("p", 0), ("p", 1)], now_s=0.0)
    pool.owned_pages = 8
    assert pool.available() == 2 and pool.reserve(2) and pool.tree.num_blocks == 0
    assert not pool.reserve(3)


def test_dynamic_sp_keeps_short_requests_local() -> None:
    def ag(kv_bytes: float, d: int) -> float:
        return 0.1 * (d - 1)

    attn = [100.0, 1.0, 1.0, 1.0]
    kv = [0.0] * 4
    fixed = fixed_sp_latency(attn, kv, 4, ag)
    assert fixed == pytest.approx(103 / 4 + 4 * 0.3)
    plan = plan_dynamic_sp(attn, kv, 4, ag)
    assert plan.degrees == (4, 1, 1, 1)
    assert plan.latency_s == pytest.approx(100 / 4 + 0.3 + 1.0)
    assert plan.latency_s < fixed


def test_requests_longer_than_the_context_are_rejected() -> None:
    """Llama-3.1-8B's config.json gives max_position_embeddings 131072: an engine refuses a
    longer request, so the simulator does too, naming the limit; one that fits runs."""
    from charon_search.catalog import load_model
    from charon_search.serving import simulate_serving
    from charon_search.serving.report import _rate

    assert load_model("llama-3.1-8b").max_context == 131072
    wl = {"concurrency": 1, "num_requests": 1, "input_len": 131000, "output_len": 73}
    with pytest.raises(ConfigError, match=r"131,000 prompt \+ 73 output.*131,072"):
        simulate_serving("llama-3.1-8b", "h100-sxm-8gpu", ServingConfig(), wl)
    rep = simulate_serving("llama-3.1-8b", "h100-sxm-8gpu", ServingConfig(),
                           {**wl, "output_len": 72})
    assert rep.num_completed == 1
    assert (_rate(0.5), _rate(42.25), _rate(12345.6)) == ("0.5", "42.2", "12346")


def test_simulate_serving_takes_trace_rows_a_trace_file_or_request_specs(tmp_path) -> None:
    """The API's workload may be the requests themselves: mappings with a trace's columns run
    exactly as the same rows read from a CSV, and as the ``RequestSpec`` objects they make; a bare
    arrival name or an empty list is a ``ConfigError`` that says what to pass."""
    from charon_search.serving import simulate_serving

    rows = [{"arrived_at": 0.0, "prompt_tokens": 300, "output_tokens": 20},
            {"arrived_at": 0.05, "prompt_tokens": 120, "output_tokens": 0},  # -> 1 token
            {"arrived_at": 0.02, "prompt_tokens": 64, "output_tokens": 8, "prefix_id": 1,
             "prefix_tokens": 32}]
    csv = tmp_path / "t.csv"
    csv.write_text("arrived_at,prompt_tokens,output_tokens,prefix_id,prefix_tokens\n"
                   "0.0,300,20,,\n0.05,120,0,,\n0.02,64,8,1,32\n")

    def run(workload):
        return simulate_serving("debug-llama", "h100-sxm-8gpu", ServingConfig(), workload,
                                keep_requests=True).to_dict()

    from_rows = run(rows)
    assert from_rows == run(csv) == run(str(csv)) == run(read_trace(csv))
    assert from_rows["num_requests"] == 3
    assert [r.output_tokens for r in read_trace(csv)] == [20, 8, 1]  # arrival order
    with pytest.raises(ConfigError, match=r"`workload` 'poisson' needs its parameters: pass a "
                                          r"mapping of WorkloadSpec fields"):
        run("poisson")
    with pytest.raises(ConfigError, match=r"non-empty list of RequestSpec or of trace rows"):
        run([])
    with pytest.raises(ConfigError, match=r"workload rows: missing column\(s\) \['arrived_at'\]"):
        run([{"prompt_tokens": 10, "output_tokens": 5}])
    with pytest.raises(ConfigError, match=r"workload rows: `prompt_tokens` must be a whole "
                                          r"number >= 1 in every row, but row 1 holds 0"):
        run([{"arrived_at": 0, "prompt_tokens": 0, "output_tokens": 5}])
