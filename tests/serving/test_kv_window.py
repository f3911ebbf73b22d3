"""KV paging of models with sliding-window / chunked local attention layers, against closed forms.

vLLM's hybrid KV cache manager keeps a windowed layer's blocks only while they hold keys of the
window; the full-attention layers keep every block. gpt-oss-120b: 18 full + 18 windowed layers
(128 keys); Llama 4 Scout: 12 full + 36 chunked layers (8192-token chunks)."""

from __future__ import annotations

import pytest

from charon_search.catalog import load_model
from charon_search.serving import RequestSpec, ServingConfig
from charon_search.serving.kv_cache import BlockPool, KvWindow
from charon_search.serving.simulator import run_simulation


def test_window_paging_of_the_catalog_models() -> None:
    oss = load_model("gpt-oss-120b")
    assert (oss.num_kv_layers, oss.windowed_kv_layers, oss.sliding_window) == (36, 18, 128)
    # 128 keys end anywhere in a block: ceil(127 / 16) + 1 = 9 blocks at most.
    assert KvWindow.for_layers(18, 18, 128, 16) == KvWindow(1, 1, 9)
    scout = load_model("llama-4-scout-17b-16e")
    assert (scout.num_kv_layers, scout.windowed_kv_layers) == (48, 36)
    assert KvWindow.for_layers(12, 36, 8192, 16) == KvWindow(1, 3, 513)
    assert load_model("llama-3.1-8b").windowed_kv_layers == 0
    assert KvWindow.for_layers(32, 0, 0, 16) is None


def test_pages_of_a_request_follow_the_window() -> None:
    pool = BlockPool(1000, 16, prefix_caching=False, window=KvWindow(1, 1, 9))
    assert pool.num_pages == 2000 and pool.capacity_tokens == 16000
    assert pool.pages_for(1000) == 63 + 9      # ceil(1000 / 16) full + the window's 9
    assert pool.pages_for(100) == 7 + 7        # a short request: its whole length in both
    # 60 of the 63 blocks come from the prefix cache: 3 private full blocks; the window is
    # blocks 54..62, of which 54..59 are shared, so 3 private windowed blocks.
    assert pool.private_pages(1000, 60) == 3 + 3
    plain = BlockPool(1000, 16, prefix_caching=False)
    assert plain.pages_for(1000) == 63 and plain.private_pages(1000, 60) == 3


def test_decode_upper_bound_covers_the_exact_pages() -> None:
    pool = BlockPool(10_000, 16, prefix_caching=False, window=KvWindow(1, 3, 513))
    lengths = [100, 5000, 8193, 20_000, 33]
    exact = sum(pool.private_pages(n) for n in lengths)
    in_window = sum(min(n, 513 * 16) for n in lengths)
    upper = pool.decode_pages_upper(sum(lengths), len(lengths), 0, window_tokens=in_window)
    # At most one partial block per request and layer group (1 + 3 pages).
    assert exact <= upper <= exact + 4 * len(lengths)


def _peak_decodes(windowed: bool) -> int:
    # 64 requests of 1,000 + 200 tokens arrive together; 1,000 blocks of 16 tokens in all
    # layers, admitted only when prompt + output fit (TensorRT-LLM's GUARANTEED_NO_EVICT).
    # Every layer holding every token: a request needs ceil(1200 / 16) = 75 blocks, so 13 run
    # at once (1,000 // 75). gpt-oss's windowed half holds 9 blocks of each: 2,000 pages at
    # 75 + 9 = 84 pages a request, 23 at once.
    reqs = [RequestSpec(request_id=i, arrived_at_s=0.0, prompt_tokens=1000, output_tokens=200)
            for i in range(64)]
    cfg = ServingConfig(num_kv_blocks=1000, max_num_seqs=64, windowed_kv=windowed,
                        kv_admission="reserve_max", iteration_overhead_s=1e-3)
    from charon_search.serving import AffineIterationCostModel
    from charon_search.testing import toy_cluster

    affine = AffineIterationCostModel(base_s=5e-3, per_token_s=1e-5, per_kv_token_s=1e-7)
    sim, rep = run_simulation("gpt-oss-120b", toy_cluster(), cfg, reqs, cost_model=affine,
                              record_iterations=True)
    assert rep.num_completed == 64
    assert rep.kv_window_tokens == (144 if windowed else 0)
    return max(it.num_decode for eng in sim.replicas for it in eng.records or ())


@pytest.mark.parametrize(("windowed", "expected"), [(False, 1000 // 75), (True, 2000 // 84)])
def test_kv_bound_concurrency_follows_the_window(windowed: bool, expected: int) -> None:
    assert _peak_decodes(windowed) == expected


def test_window_bound_tracks_requests_through_the_window(monkeypatch) -> None:
    # Prompts of 60-140 tokens cross gpt-oss's 144-token window bound while they decode, some
    # are preempted and come back: at every step the O(1) bound on the decode set's pages
    # must cover the exact count, and the pool must never hold more pages than it has.
    from charon_search.serving import AffineIterationCostModel
    from charon_search.serving.engine import ReplicaEngine
    from charon_search.testing import toy_cluster

    checked = []
    start = ReplicaEngine.start_iteration

    def checked_start(self, now_s, **kw):  # type: ignore[no-untyped-def]
        d = start(self, now_s, **kw)
        if self.decoding:
            exact = self._decode_pages_exact(0)
            assert self._decode_pages_upper(0) >= exact
            assert self._decode_pages_upper(0) <= exact + 2 * len(self.decoding)
        assert self.pool.used_pages <= self.pool.num_pages
        checked.append(len(self.decoding))
        return d

    monkeypatch.setattr(ReplicaEngine, "start_iteration", checked_start)
    reqs = [RequestSpec(request_id=i, arrived_at_s=0.001 * i, prompt_tokens=60 + (i * 7) % 81,
                        output_tokens=150 + (i * 13) % 100) for i in range(120)]
    affine = AffineIterationCostModel(base_s=5e-3, per_token_s=1e-5, per_kv_token_s=1e-7)
    runs = {}
    for windowed in (True, False):
        checked.clear()
        cfg = ServingConfig(num_kv_blocks=150, max_num_seqs=128, iteration_overhead_s=1e-3,
                            windowed_kv=windowed)
        _, rep = run_simulation("gpt-oss-120b", toy_cluster(), cfg, reqs, cost_model=affine)
        assert rep.num_completed == 120 and rep.num_preemptions > 0
        runs[windowed] = (sum(checked) / len(checked), rep.num_preemptions)
    # Past the window a request stops growing in half the layers: more of them decode at once
    # and fewer are preempted.
    assert runs[True][0] > runs[False][0] and runs[True][1] < runs[False][1]


@pytest.mark.parametrize(("engine", "windowed", "paged", "blocks"), [
    ("vllm", None, True, 1000), ("trtllm", None, True, 1000), ("vllm", False, False, 1000),
    ("sglang", True, True, 1000),
    # SGLang's own pools: the full-attention one holds 36 / (18 + 0.8 x 18) = 1.11 x the
    # tokens of a window-less cache, and requests use only it.
    ("sglang", None, False, 1111), ("sglang", False, False, 1000)])
def test_which_engines_page_windowed_layers(engine: str, windowed: bool | None, paged: bool,
                                            blocks: int) -> None:
    from charon_search.serving import AffineIterationCostModel
    from charon_search.testing import toy_cluster

    cfg = ServingConfig(engine=engine, windowed_kv=windowed, num_kv_blocks=1000)
    sim, _ = run_simulation("gpt-oss-120b", toy_cluster(), cfg,
                            [RequestSpec(request_id=0, arrived_at_s=0.0, prompt_tokens=500,
                                         output_tokens=4)],
                            cost_model=AffineIterationCostModel(base_s=1e-3))
    pool = sim.replicas[0].pool
    assert (pool.window == KvWindow(1, 1, 9)) is paged
    assert pool.num_blocks == blocks


def test_a_disaggregated_hand_over_sends_the_window_of_windowed_layers() -> None:
    # 1,000 prompt tokens of gpt-oss: the 18 full layers send all of them, the 18 windowed
    # layers the 144 tokens of their window: 1e5 x (500 + 72) bytes instead of 1e5 x 1,000.
    from dataclasses import replace

    from charon_search.serving import AffineIterationCostModel
    from charon_search.serving.iteration_cost import collective_s
    from charon_search.testing import toy_cluster

    cluster = toy_cluster()
    cm = replace(AffineIterationCostModel(base_s=5e-3, per_token_s=1e-5, per_kv_token_s=1e-7),
                 kv_token_bytes=1e5)
    one = [RequestSpec(request_id=0, arrived_at_s=0.0, prompt_tokens=1000, output_tokens=10)]
    ttft = {}
    for windowed in (True, False):
        cfg = ServingConfig(num_kv_blocks=20000, iteration_overhead_s=1e-3, windowed_kv=windowed,
                            disagg={"prefill": "1xTP1", "decode": "1xTP1",
                                    "kv_transfer": "rdma"})
        ttft[windowed] = run_simulation("gpt-oss-120b", cluster, cfg, one,
                                        cost_model=cm)[1].ttft_s["mean"]

    def xfer(nbytes: float) -> float:
        return collective_s("send_recv", nbytes, 2, cluster, stride=cluster.gpus_per_node)

    assert ttft[False] - ttft[True] == pytest.approx(xfer(1000 * 1e5) - xfer(572 * 1e5))


def test_sglang_does_not_scale_llama4_chunked_pools() -> None:
    from charon_search.serving import AffineIterationCostModel
    from charon_search.testing import toy_cluster

    cfg = ServingConfig(engine="sglang", num_kv_blocks=1000)
    sim, _ = run_simulation("llama-4-scout-17b-16e", toy_cluster(), cfg,
                            [RequestSpec(request_id=0, arrived_at_s=0.0, prompt_tokens=500,
                                         output_tokens=4)],
                            cost_model=AffineIterationCostModel(base_s=1e-3))
    pool = sim.replicas[0].pool
    assert pool.window is None and pool.num_blocks == 1000
