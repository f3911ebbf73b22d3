"""Review fixes to how a training step is timed: DP gradient-sync order under interleaving, the
ZeRO-3 tail reduce-scatter, zero-bubble W placement, and ``run_pipeline``'s ``v`` check."""

from __future__ import annotations

import pytest

from charon_search.errors import ConfigError
from charon_search.layout import Layout
from charon_search.sim.costing import GraphCoster
from charon_search.sim.engine import StreamEngine, Task
from charon_search.sim.layer import UnitCost, _dp_tail
from charon_search.sim.pipeline import run_pipeline
from charon_search.testing import toy_cluster
from charon_search.training import simulate_training

from .conftest import SPEC, TRACED, FlopsCostModel

EMBED_PARAMS = 1024 * 256  # vocab x hidden
FP32 = 4  # gradient reduce dtype


def _sim(layout: Layout):
    return simulate_training(SPEC, toy_cluster(), layout, cost_model=FlopsCostModel(),
                             traced=TRACED, memory=False)


# ------------------------------------------------------------------ F1: ready-order DP syncs
def test_interleaved_dp_syncs_queue_in_ready_order_across_chunks() -> None:
    """pp=2 vpp=2 dp=2, ZeRO-0. Rank 0 holds [embedding, dense, dense] (chunk 0) and
    [dense, dense] (chunk 1). Chunk 1's last backward ends before chunk 0's, so its two buckets
    reduce while chunk 0 computes; chunk 0's buckets follow the backward and only the last one,
    the embedding's all-reduce (issued at the rank's end), is exposed. In chunk order (the old
    chain) chunk 1's buckets queued behind chunk 0's and the exposed DP was the embedding's
    plus two dense all-reduces."""
    r = _sim(Layout(tp=1, pp=2, vpp=2, dp=2, schedule="interleaved-1f1b",
                    global_batch_size=8, seq_len=512, zero_stage=0))
    tl = r.timeline
    rank_end = tl.pipeline.rank_end_s[0]
    coster = GraphCoster(toy_cluster(), FlopsCostModel(), strides={"dpcp": 1})
    t_emb = coster.collective("all_reduce", EMBED_PARAMS * FP32, 2, "dpcp")[0]
    mine = [(n, s, e) for rr, n, s, e in tl.dp_intervals if rr == 0]
    assert [n for n, _, _ in mine][-1] == "grad_sync.embedding"
    # Ready order: starts never go back in time; chunk 1's buckets end before chunk 0 ends.
    assert [s for _, s, _ in mine] == sorted(s for _, s, _ in mine)
    c1_end = tl.pipeline.last_backward[(0, 1)][1]
    assert c1_end < rank_end
    assert mine[1][2] < rank_end  # chunk 1's last bucket, done behind chunk 0's backward
    # Exposed DP on the critical rank 0 = one embedding all-reduce (ring over 2 NVLink ranks).
    assert r.timeline.tail_intervals[0][3] - rank_end == pytest.approx(t_emb, rel=1e-9)
    assert r.breakdown.exposed_comm_by_kind_s["dp"] == pytest.approx(t_emb, rel=1e-9)


def test_dualpipe_dp_syncs_in_ready_order() -> None:
    r = _sim(Layout(tp=1, pp=2, dp=2, schedule="dualpipe", global_batch_size=8,
                    seq_len=512, zero_stage=1))
    tl = r.timeline
    for rank in range(2):
        starts = [s for rr, _, s, _ in tl.dp_intervals if rr == rank]
        assert starts == sorted(starts)


# ------------------------------------------------------------------ F2: ZeRO-3 final RS
def test_dp_tail_of_a_layer_is_the_reduce_scatter_after_its_last_op() -> None:
    """Compute 1.0 s, then a 0.5 s reduce-scatter that reads its output: the layer gates at
    1.0 s and leaves 0.5 s of dp traffic."""
    tasks = [Task(name="bwd", stream="compute", duration_s=1.0),
             Task(name="rs", stream="comm_dp_rs", duration_s=0.5, deps=(0,), is_comm=True,
                  group="dp", tier="net")]
    res = StreamEngine().run(tasks)
    assert res.makespan_s == pytest.approx(1.5)
    assert _dp_tail(res, tasks) == pytest.approx(0.5)


def test_zero3_final_reduce_scatter_is_charged_before_the_optimizer() -> None:
    """pp=1 dp=4 ZeRO-3: the embedding is the last layer of the backward. Its backward
    all-gather and reduce-scatter share the NVLink/net tier (their sum), its compute runs
    under them, so ``AG + RS - compute`` runs past the backward; the optimizer starts then."""
    r = _sim(Layout(tp=1, pp=1, dp=4, schedule="none", global_batch_size=4, seq_len=512,
                    zero_stage=3))
    tl = r.timeline
    _, cb = tl.costed_graphs["embedding"]
    comm = {n.name: float(d) for n, d in zip(cb.graph.nodes, cb.durations_s, strict=True)
            if n.is_comm}
    gate = tl.layer_costs["embedding"][1].first.duration_s
    tail = comm["fsdp_all_gather_bwd"] + comm["fsdp_reduce_scatter"] - gate
    assert tail > 0
    rank_end = tl.pipeline.rank_end_s[0]
    assert tl.dp_intervals == [(0, "grad_sync_tail.embedding", rank_end, pytest.approx(
        rank_end + tail, rel=1e-9))]
    opt_start = tl.tail_intervals[0][3]
    assert opt_start - rank_end == pytest.approx(tail, rel=1e-9)
    opt = r.breakdown.optimizer_s
    assert r.step_time_s == pytest.approx(rank_end + tail + opt + r.breakdown.other_s, rel=1e-12)


# ------------------------------------------------------------------ F4: ZB-H1 W fits the gap
@pytest.mark.parametrize(("tf", "tb", "tw", "p", "m", "closed"), [
    (1.0, 1.5, 0.7, 4, 8, 31.0),
    (1.0, 1.5, 0.7, 8, 16, 63.8),
    (1.3, 2.1, 0.9, 8, 16, 86.3),
    (1.0, 1.0, 1.0, 4, 8, 27.0),
])
def test_zero_bubble_h1_fills_a_gap_only_with_a_w_that_fits(tf, tb, tw, p, m, closed) -> None:
    """Qi et al. (arXiv 2401.10241), ZB-H1: m(T_F+T_B+T_W) + (p-1)(T_F+T_B-T_W). Starting a
    deferred W in a wait shorter than T_W delayed the next F/B; the first three cases then
    took 31.4, 65.0 and 87.8."""
    d = {"F": tf, "B": tb, "W": tw}

    def cost(r: int, c: int, kind: str) -> UnitCost:
        return UnitCost(duration_s=d[kind], compute_s=d[kind])
    res = run_pipeline(schedule="zero-bubble", p=p, m=m, v=1, cost=cost, split_w=True)
    assert m * (tf + tb + tw) + (p - 1) * (tf + tb - tw) == pytest.approx(closed)
    assert max(res.rank_end_s) == pytest.approx(closed, rel=1e-12)
    assert res.max_in_flight == [p - r for r in range(p)]


# ------------------------------------------------------------------ F5: v with 1-chunk orders
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "zero-bubble", "none"])
def test_single_chunk_schedules_reject_v_above_one(schedule: str) -> None:
    def cost(r: int, c: int, kind: str) -> UnitCost:
        return UnitCost(duration_s=1.0, compute_s=1.0)
    with pytest.raises(ConfigError, match="takes v=1"):
        run_pipeline(schedule=schedule, p=4, m=4, v=2, cost=cost,
                     split_w=schedule == "zero-bubble")


# ------------------------------------------------------------------ F3: pipelined FSDP syncs
def test_zero3_under_a_pipeline_syncs_once_per_step() -> None:
    """pp=2 dp=2 1F1B: torchtitan keeps the gathered parameters after the forward under PP, and
    PyTorch's pipelining reduce-scatters an FSDP stage's gradients once after its last backward.
    So ZeRO-3 costs exactly what ZeRO-2 under a pipeline costs (same shards, one reduce-scatter
    per layer, one parameter all-gather), and its exposed DP does not grow with the
    micro-batches (it grew linearly when every micro-batch gathered and reduce-scattered)."""
    def run(zero: int, gbs: int):
        return _sim(Layout(tp=1, pp=2, dp=2, schedule="1f1b", global_batch_size=gbs,
                           seq_len=512, zero_stage=zero))
    z3, z3_double = run(3, 8), run(3, 16)
    z2 = run(2, 8)
    assert z3.step_time_s == pytest.approx(z2.step_time_s, rel=1e-12)
    dp3 = z3.breakdown.exposed_comm_by_kind_s.get("dp", 0.0)
    assert dp3 == pytest.approx(z3_double.breakdown.exposed_comm_by_kind_s.get("dp", 0.0),
                                rel=1e-12)
    assert z3.breakdown.overlap_slowdown_s == pytest.approx(
        z3_double.breakdown.overlap_slowdown_s, rel=1e-12)
    # One reduce-scatter per layer of each rank: 1 + 4 layers on rank 0, 4 + 1 on rank 1.
    names = [n for r, n, _, _ in z3.timeline.dp_intervals]
    assert len(names) == 10 and all(n.startswith("grad_sync.") for n in names)
