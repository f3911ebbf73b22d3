"""RayExecutor bookkeeping when an actor dies with several trials queued (no Ray needed)."""

from __future__ import annotations

import pytest

from charon_search.search.worker import RayExecutor, evaluate_config

ray = pytest.importorskip("ray")


class _Dead(ray.exceptions.RayActorError):
    def __init__(self) -> None:
        Exception.__init__(self, "actor died")


class _FakeRay:
    """Just enough of the ``ray`` module: futures resolve in the order given to ``script``."""

    exceptions = ray.exceptions

    def __init__(self) -> None:
        self.results: dict[int, object] = {}
        self.order: list[list[int]] = []

    def wait(self, futs, num_returns=1, timeout=None):
        if timeout == 0:
            batch = [f for f in futs if f in self.order[0]]
            self.order.pop(0)
            return batch, [f for f in futs if f not in batch]
        return futs[:1], futs[1:]

    def get(self, fut):
        r = self.results[fut]
        if isinstance(r, Exception):
            raise r
        return r

    def kill(self, actor, no_restart=True):
        actor.killed = True


class _Actor:
    def __init__(self, fake: _FakeRay, wid: str, counter: list[int]) -> None:
        self.fake, self.wid, self.counter, self.killed = fake, wid, counter, False
        self.evaluate = self

    def remote(self, name, cfg):
        self.counter[0] += 1
        fut = self.counter[0]
        self.fake.results[fut] = _Dead() if self.killed or cfg.get("die") == self.wid else {
            "worker_id": self.wid, "x": cfg["x"]}
        return fut


def test_dead_actor_with_two_queued_trials_is_replaced_once_and_both_rerun():
    fake, counter = _FakeRay(), [0]
    ex = RayExecutor.__new__(RayExecutor)
    ex._ray, ex._started, ex.num_workers, ex.capacity = fake, False, 2, 4
    ex.num_restarts = ex.num_resubmits = ex._next_id = 0
    ex._actors, ex._load, ex._futures, ex._resubmit_later = {}, {}, {}, []

    class _Remote:
        def options(self, **kw):
            return self

        def remote(self, wid):
            return _Actor(fake, wid, counter)

    ex._remote = _Remote()
    ex._spawn(), ex._spawn()
    # worker-0 dies while holding trials a and c; worker-1 runs b and d
    for tag, x in (("a", 1), ("b", 2), ("c", 3), ("d", 4)):
        ex.submit(tag, "toy", {"x": x, "die": "worker-0"})
    assert ex._load == {"worker-0": 2, "worker-1": 2}
    fake.order = [[1], [3, 2], [4], [5], [6], [7], [8]]   # futures: a=1 b=2 c=3 d=4
    done = {}
    while ex.pending():
        for tag, rec in ex.wait():
            assert tag not in done
            done[tag] = rec
    assert sorted(done) == ["a", "b", "c", "d"]
    assert ex.num_restarts == 1 and ex.num_resubmits == 2
    assert set(ex._actors) == set(ex._load) == {"worker-1", "worker-2"}
    assert all(v >= 0 for v in ex._load.values())


def test_evaluate_config_records_errors_instead_of_raising():
    rec = evaluate_config({}, "toy-analytic", {"num_gpus": 8, "tp": 2, "zero_stage": 1})
    assert rec["error"] is False and rec["feasible"] is True and rec["eval_wall_s"] >= 0
    rec = evaluate_config({}, "toy-analytic", {"tp": 1})       # missing num_gpus -> KeyError
    assert rec["error"] is True and rec["feasible"] is False
    assert rec["prune_reason"].startswith("error: KeyError")
