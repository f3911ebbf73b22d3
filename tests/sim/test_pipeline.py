"""Pipeline schedules: bubble closed forms, GPipe vs 1F1B, determinism."""

from __future__ import annotations

import itertools

import pytest

from charon_search.sim.engine import StreamEngine, Task
from charon_search.sim.layer import UnitCost
from charon_search.sim.pipeline import run_pipeline

TF, TB = 1.0, 2.0


def _uniform(v: int = 1):
    def cost(r: int, c: int, kind: str) -> UnitCost:
        d = (TF if kind == "F" else TB) / v
        return UnitCost(duration_s=d, compute_s=d)
    return cost


@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (8, 8), (4, 16)])
def test_1f1b_bubble_fraction(p: int, m: int) -> None:
    res = run_pipeline(schedule="1f1b", p=p, m=m, v=1, cost=_uniform())
    step = max(res.rank_end_s)
    bubble = (step - m * (TF + TB)) / step
    assert bubble == pytest.approx((p - 1) / (m + p - 1))


@pytest.mark.parametrize("v", [2, 4])
def test_interleaved_reduces_bubble_by_vpp(v: int) -> None:
    p, m = 4, 8
    plain = max(run_pipeline(schedule="1f1b", p=p, m=m, v=1, cost=_uniform()).rank_end_s)
    inter = max(run_pipeline(schedule="interleaved-1f1b", p=p, m=m, v=v,
                             cost=_uniform(v)).rank_end_s)
    work = m * (TF + TB)
    assert inter - work == pytest.approx((plain - work) / v)


def test_gpipe_and_1f1b_same_time_different_in_flight() -> None:
    p, m = 4, 8
    g = run_pipeline(schedule="gpipe", p=p, m=m, v=1, cost=_uniform())
    o = run_pipeline(schedule="1f1b", p=p, m=m, v=1, cost=_uniform())
    assert max(g.rank_end_s) == pytest.approx(max(o.rank_end_s))
    assert g.max_in_flight == [m] * p
    assert o.max_in_flight == [p - r for r in range(p)]


@pytest.mark.parametrize(("p", "m"), [(4, 8), (8, 20), (8, 8)])
def test_zero_bubble_h1_bubble_closed_form(p: int, m: int) -> None:
    tf, tb, tw = 1.0, 1.0, 1.0

    def cost(r: int, c: int, kind: str) -> UnitCost:
        d = {"F": tf, "B": tb, "W": tw}[kind]
        return UnitCost(duration_s=d, compute_s=d)
    zb = max(run_pipeline(schedule="zero-bubble", p=p, m=m, v=1, cost=cost,
                          split_w=True).rank_end_s)
    # Qi et al. (arXiv 2401.10241), ZB-H1: bubble (p-1)(T_F + T_B - T_W).
    assert zb == pytest.approx(m * (tf + tb + tw) + (p - 1) * (tf + tb - tw))


def _fbw(r: int, c: int, kind: str) -> UnitCost:
    d = {"F": 1.0, "B": 1.0, "W": 1.0}[kind]
    return UnitCost(duration_s=d, compute_s=d)


@pytest.mark.parametrize(("p", "m"), [(4, 8), (8, 20), (8, 64)])
def test_dualpipe_runs_every_unit_once_and_beats_1f1b(p: int, m: int) -> None:
    res = run_pipeline(schedule="dualpipe", p=p, m=m, v=2, cost=_fbw, split_w=True)
    assert len(res.units) == p * m * 3
    keys = {(u.rank, u.op) for u in res.units}
    assert len(keys) == len(res.units)
    one = run_pipeline(schedule="1f1b", p=p, m=m, v=1, cost=lambda r, c, k: UnitCost(
        duration_s={"F": 1.0, "B": 2.0}[k]))
    assert max(res.rank_end_s) < max(one.rank_end_s)


def test_engine_overlap_slowdown_only_on_overlap() -> None:
    tasks = [Task(name="a", stream="compute", duration_s=1.0),
             Task(name="c", stream="comm_tp", duration_s=0.5, is_comm=True, group="tp",
                  tier="t"),
             Task(name="b", stream="compute", duration_s=1.0, deps=(1,))]
    res = StreamEngine(compute_slowdown=1.25).run(tasks)
    # a runs at 0.8 while c runs (0.5 s -> 0.4 work), then 0.6 alone: ends at 1.1.
    assert res.end_s[0] == pytest.approx(1.1)
    assert res.makespan_s == pytest.approx(2.1)
    assert res.slowdown_s == pytest.approx(0.1)


def test_engine_shares_tier_bandwidth() -> None:
    tasks = [Task(name=f"c{i}", stream=f"comm_{i}", duration_s=1.0, is_comm=True, group="dp",
                  tier="net") for i in range(2)]
    res = StreamEngine().run(tasks)
    assert res.makespan_s == pytest.approx(2.0)
    assert res.exposed_comm_s["dp"] == pytest.approx(2.0)


def test_pipeline_deterministic() -> None:
    a = run_pipeline(schedule="interleaved-1f1b", p=4, m=8, v=2, cost=_uniform(2))
    b = run_pipeline(schedule="interleaved-1f1b", p=4, m=8, v=2, cost=_uniform(2))
    assert [(u.rank, u.op, u.start_s, u.end_s) for u in a.units] == \
        [(u.rank, u.op, u.start_s, u.end_s) for u in b.units]


def _ep_overlapped(r: int, c: int, kind: str) -> UnitCost:
    # F 1.0 and B 2.0, each with 0.4 of exposed EP all-to-all; a back-to-back F and B of
    # opposite directions hide one of them (DualPipe's overlapped forward-backward chunk).
    d = {"F": 1.0, "B": 2.0, "W": 1.0}[kind] * (1.3 if (r, c) == (0, 0) else 1.0)
    comm = () if kind == "W" else (("ep", 0.4),)
    return UnitCost(duration_s=d, compute_s=d - sum(v for _, v in comm), exposed_comm_s=comm)


def test_dualpipe_pairs_wait_for_both_inputs_and_send_together() -> None:
    """deepseek-ai/DualPipe ``_forward_backward_chunk``: receive the forward's activation and
    the backward's gradient, compute both, then send both."""
    p, m, lat = 8, 32, 0.3
    res = run_pipeline(schedule="dualpipe", p=p, m=m, v=2, cost=_ep_overlapped, split_w=True,
                       pair_overlap=True, p2p_s=lat)
    by_key = {(u.op.kind, u.op.mb, u.rank, u.op.chunk): u for u in res.units}
    per_rank = {r: [u for u in res.units if u.rank == r] for r in range(p)}
    pairs = 0
    for r, units in per_rank.items():
        for u, nxt in itertools.pairwise(units):
            if not u.op.paired:
                continue
            pairs += 1
            assert nxt.op.kind == "B" and nxt.start_s == pytest.approx(u.end_s)
            # The paired backward's gradient comes from the next stage of its direction.
            src_rank = r + 1 if nxt.op.chunk == 0 else r - 1
            src = by_key.get(("B", nxt.op.mb, src_rank, nxt.op.chunk))
            if src is not None:
                assert u.start_s >= src.end_s + lat - 1e-9
            # Whoever takes this forward's activation starts after the pair's end + transfer.
            dst_rank = r + 1 if u.op.chunk == 0 else r - 1
            dst = by_key.get(("F", u.op.mb, dst_rank, u.op.chunk))
            if dst is not None:
                assert dst.start_s >= nxt.end_s + lat - 1e-9
    # Step 4 pairs both directions, step 5 one: 2 (m/2 - p + h + 1) + (p/2 - h - 1) per rank,
    # less the middle ranks' first F0 / B1, which run apart.
    expected = sum(2 * (m // 2 - p + min(r, p - 1 - r) + 1) + (p // 2 - min(r, p - 1 - r) - 1)
                   - (r in (p // 2 - 1, p // 2)) for r in range(p))
    assert pairs == expected


def test_dualpipe_bubble_closed_form_at_four_ranks() -> None:
    """DeepSeek-V3 report, Table 2: DualPipe's bubble (p/2 - 1)(F&B + B - 3W), here with
    F&B = F + B - 0.4 (the hidden all-to-all): 1.6 at p = 4 on the edge ranks."""
    def cost(r: int, c: int, kind: str) -> UnitCost:
        d = {"F": 1.0, "B": 2.0, "W": 1.0}[kind]
        comm = () if kind == "W" else (("ep", 0.4),)
        return UnitCost(duration_s=d, compute_s=d - sum(v for _, v in comm), exposed_comm_s=comm)
    p, m = 4, 16
    res = run_pipeline(schedule="dualpipe", p=p, m=m, v=2, cost=cost, split_w=True,
                       pair_overlap=True)
    idle = [res.rank_end_s[r] - sum(u.end_s - u.start_s for u in res.units if u.rank == r)
            for r in range(p)]
    assert max(idle) == pytest.approx((p / 2 - 1) * ((1.0 + 2.0 - 0.4) + 2.0 - 3 * 1.0))


def test_blocking_sends_by_hand() -> None:
    # p=2, m=2, F=1, B=2, transfer c=0.5. Overlapped sends (times worked out by hand):
    #   r0 F0 [0,1] F1 [1,2]; r1 F0 [1.5,2.5] B0 [2.5,4.5] F1 [4.5,5.5] B1 [5.5,7.5];
    #   r0 B0 [5,7] B1 [8,10]  -> 10.
    # Blocking sends (Megatron's batch_isend_irecv + synchronize): r0 F0 [0,1.5] F1 [1.5,3];
    #   r1 F0 [1.5,2.5] B0 [2.5,5] F1 [5,6] B1 [6,8.5]; r0 B0 [5,7] B1 [8.5,10.5] -> 10.5.
    c = 0.5
    free = run_pipeline(schedule="1f1b", p=2, m=2, v=1, cost=_uniform(), p2p_s=c)
    block = run_pipeline(schedule="1f1b", p=2, m=2, v=1, cost=_uniform(), p2p_s=c,
                         p2p_blocking=True)
    assert max(free.rank_end_s) == pytest.approx(10.0)
    assert max(block.rank_end_s) == pytest.approx(10.5)
    # The wait is the unit's exposed "pp" communication: r0 sends its forwards, r1 its backwards.
    pp = {r: sum(v for u in block.units if u.rank == r for g, v in u.cost.exposed_comm_s
                 if g == "pp") for r in range(2)}
    assert pp == {0: pytest.approx(2 * c), 1: pytest.approx(2 * c)}


@pytest.mark.parametrize(("schedule", "p", "m", "v"), [("1f1b", 4, 8, 1),
                                                        ("interleaved-1f1b", 4, 8, 2)])
def test_blocking_sends_add_one_transfer_per_send(schedule: str, p: int, m: int, v: int) -> None:
    # Each unit whose output another rank reads keeps its rank busy for one transfer: the
    # first rank sends its forwards (and with v > 1 its backwards of later chunks too), a middle
    # rank every unit, the last rank its backwards (and forwards of earlier chunks).
    c = 0.05
    res = run_pipeline(schedule=schedule, p=p, m=m, v=v, cost=_uniform(v), p2p_s=c,
                       p2p_blocking=True)
    for r in range(p):
        mine = [u for u in res.units if u.rank == r]
        busy = sum(u.end_s - u.start_s for u in mine)
        sends = sum(1 for u in mine
                    if not (u.op.kind == "B" and r == 0 and u.op.chunk == 0)
                    and not (u.op.kind == "F" and r == p - 1 and u.op.chunk == v - 1))
        assert busy == pytest.approx(m * (TF + TB) + sends * c)
    overlapped = run_pipeline(schedule=schedule, p=p, m=m, v=v, cost=_uniform(v), p2p_s=c)
    assert max(res.rank_end_s) > max(overlapped.rank_end_s)


def test_last_backward_ends_with_the_compute_not_the_blocking_send() -> None:
    # Rank 1 of p=2 sends its backwards: its gradients exist when the compute ends, a
    # transfer before the unit (which waits for the send) does.
    c = 0.5
    res = run_pipeline(schedule="1f1b", p=2, m=2, v=1, cost=_uniform(), p2p_s=c,
                       p2p_blocking=True)
    last = max((u for u in res.units if u.rank == 1 and u.op.kind == "B"),
               key=lambda u: u.end_s)
    assert res.last_backward[(1, 0)] == (pytest.approx(last.start_s),
                                         pytest.approx(last.end_s - c))
    first_rank = max((u for u in res.units if u.rank == 0 and u.op.kind == "B"),
                     key=lambda u: u.end_s)  # rank 0 sends no backward: no wait to take off
    assert res.last_backward[(0, 0)][1] == pytest.approx(first_rank.end_s)
