"""Pipeline schedules: bubble closed forms, GPipe vs 1F1B, determinism."""

from __future__ import annotations

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
