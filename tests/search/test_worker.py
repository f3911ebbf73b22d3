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
    """A fake actor: a batch dies whole if the actor was killed or any config names it."""

    def __init__(self, fake: _FakeRay, wid: str, counter: list[int]) -> None:
        self.fake, self.wid, self.counter, self.killed = fake, wid, counter, False
        self.evaluate_batch = self
        self.batches: list[list[int]] = []
        self.calls: list[str] = []
        actor = self

        class _WarmUp:
            def remote(self, name, cfgs):
                actor.calls.append(f"warm {name} {len(cfgs)}")

        self.warm_up = _WarmUp()

    def remote(self, items):
        self.counter[0] += 1
        fut = self.counter[0]
        self.calls.append("batch")
        self.batches.append([cfg["x"] for _, cfg in items])
        dies = self.killed or any(cfg.get("die") == self.wid for _, cfg in items)
        self.fake.results[fut] = _Dead() if dies else [
            {"worker_id": self.wid, "x": cfg["x"]} for _, cfg in items]
        return fut


def _executor(fake: _FakeRay, counter: list[int], *, batch_size: int,
              in_flight: int = 2) -> RayExecutor:
    ex = RayExecutor.__new__(RayExecutor)
    ex._ray, ex._started = fake, False
    ex._init_state(2, in_flight, batch_size)
    actors: dict[str, _Actor] = {}

    class _Remote:
        def options(self, **kw):
            return self

        def remote(self, wid, niceness=None):
            actors[wid] = _Actor(fake, wid, counter)
            return actors[wid]

    ex._remote = _Remote()
    ex._spawn(), ex._spawn()
    ex.fake_actors = actors
    return ex


def test_dead_actor_with_two_queued_batches_is_replaced_once_and_both_rerun():
    fake, counter = _FakeRay(), [0]
    ex = _executor(fake, counter, batch_size=2)
    assert ex.capacity == 2 * 2 * 2
    # worker-0 dies holding two batches (a, b) and (e, f); worker-1 runs (c, d) and (g, h)
    for tag, x in zip("abcdefgh", range(1, 9)):
        ex.submit(tag, "toy", {"x": x, "die": "worker-0" if tag in "abef" else None})
    assert ex.pending() == 8
    # futures: 1 = w0 (a,b), 2 = w1 (c,d), 3 = w0 (e,f), 4 = w1 (g,h); worker-0's first batch
    # fails first, then its second; the 6 re-queued configs go out as batches 5, 6, 7
    fake.order = [[1], [2, 3], [4], [5], [6], [7], [8]]
    done: dict[str, dict] = {}
    while ex.pending():
        for tag, rec in ex.wait():
            assert tag not in done
            done[tag] = rec
    assert sorted(done) == list("abcdefgh")
    assert {done[t]["x"] for t in done} == set(range(1, 9))     # results matched to their tags
    assert all(done[t]["worker_id"] != "worker-0" for t in "abef")
    assert ex.fake_actors["worker-0"].batches == [[1, 2], [5, 6]]
    assert ex.fake_actors["worker-1"].batches[:2] == [[3, 4], [7, 8]]
    assert ex.num_restarts == 1 and ex.num_resubmits == 4
    assert set(ex._actors) == set(ex._load) == {"worker-1", "worker-2"}
    assert all(v == 0 for v in ex._load.values()) and ex.pending() == 0


def test_queue_is_split_evenly_over_free_slots():
    fake, counter = _FakeRay(), [0]
    ex = _executor(fake, counter, batch_size=8)
    for x in range(6):  # 6 configs over 4 free slots: batches of ceil(6/4)=2, 2, then 1, 1
        ex.submit(x, "toy", {"x": x})
    fake.order = [[1, 2, 3, 4]]
    got = ex.wait()
    assert sorted(tag for tag, _ in got) == list(range(6))
    assert ex.fake_actors["worker-0"].batches == [[0, 1], [4]]
    assert ex.fake_actors["worker-1"].batches == [[2, 3], [5]]
    assert ex.pending() == 0


def test_configs_follow_their_affinity_key_to_the_worker_that_took_it_first():
    fake, counter = _FakeRay(), [0]
    ex = _executor(fake, counter, batch_size=2, in_flight=1)
    for x, key in ((1, "A"), (2, "A"), (3, "B"), (4, "B")):
        ex.submit(x, "toy", {"x": x}, key)
    fake.order = [[1, 2], [3, 4]]
    assert sorted(t for t, _ in ex.wait()) == [1, 2, 3, 4]
    assert ex.fake_actors["worker-0"].batches == [[1, 2]]      # took A
    assert ex.fake_actors["worker-1"].batches == [[3, 4]]      # took B
    # queue order B, A: without affinity worker-0 would take the B config
    ex.submit(5, "toy", {"x": 5}, "B")
    ex.submit(6, "toy", {"x": 6}, "A")
    ex.submit(7, "toy", {"x": 7}, None)                        # no key: any worker
    assert sorted(t for t, _ in ex.wait()) == [5, 6, 7]
    assert ex.fake_actors["worker-0"].batches[1][0] == 6
    assert ex.fake_actors["worker-1"].batches[1][0] == 5
    # a worker with a free slot takes another worker's key rather than idle
    ex.submit(8, "toy", {"x": 8}, "A")
    ex.submit(9, "toy", {"x": 9}, "A")
    fake.order = [[5, 6]]
    assert sorted(t for t, _ in ex.wait()) == [8, 9]
    assert ex.fake_actors["worker-0"].batches[2] == [8]
    assert ex.fake_actors["worker-1"].batches[2] == [9]


def test_every_actor_and_its_replacement_warms_up_before_its_first_batch():
    fake, counter = _FakeRay(), [0]
    ex = _executor(fake, counter, batch_size=1, in_flight=1)
    ex.warm_up("toy", [{"x": 0}])
    ex.submit("a", "toy", {"x": 1, "die": "worker-0"})
    ex.submit("b", "toy", {"x": 2})
    fake.order = [[1, 2], [3]]
    done = {}
    while ex.pending():
        done.update(ex.wait())
    assert sorted(done) == ["a", "b"]
    assert ex.fake_actors["worker-0"].calls == ["warm toy 1", "batch"]     # died on "a"
    assert ex.fake_actors["worker-1"].calls == ["warm toy 1", "batch", "batch"]
    assert ex.fake_actors["worker-2"].calls == ["warm toy 1"]     # the replacement, warmed


def test_evaluate_config_records_errors_instead_of_raising():
    rec = evaluate_config({}, "toy-analytic", {"num_gpus": 8, "tp": 2, "zero_stage": 1})
    assert rec["error"] is False and rec["feasible"] is True and rec["eval_wall_s"] >= 0
    rec = evaluate_config({}, "toy-analytic", {"tp": 1})       # missing num_gpus -> KeyError
    assert rec["error"] is True and rec["feasible"] is False
    assert rec["prune_reason"].startswith("error: KeyError")


def test_training_affinity_key_ignores_only_the_non_graph_keys():
    from charon_search.search.evaluators import EVALUATORS

    ev = EVALUATORS.get("training")
    base = {"model": "llama-3.1-8b", "num_gpus": 16, "tp": 2, "pp": 2, "dp": 4,
            "micro_batch_size": 1, "recompute": "none", "zero_stage": 1}
    assert ev.affinity_key(base) == ev.affinity_key({**base, "micro_batch_size": 4,
                                                     "schedule": "interleaved"})
    assert ev.affinity_key(base) != ev.affinity_key({**base, "tp": 4, "dp": 2})
    assert ev.affinity_key(base) != ev.affinity_key({**base, "recompute": "full"})
    assert EVALUATORS.get("toy-analytic").affinity_key(base) is None     # no preference
    ev().warm_up([{"model": "no-such-model", "cluster": "nowhere"}])    # best effort: no raise
