"""Real Ray: a local 2-node cluster (``ray.cluster_utils.Cluster``), shared by this module.

Never runs `ray stop` (it would kill every Ray process on the machine); the cluster is shut down
by the fixture.
"""

from __future__ import annotations

import os
import signal

import optuna
import pyarrow.parquet as pq
import pytest

from charon_search.search import SearchOptions, run_search
from charon_search.search.study import make_storage

pytestmark = [pytest.mark.ray]


@pytest.fixture(scope="module")
def two_node_cluster():
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():
        ray.shutdown()
    node = {"num_cpus": 1, "object_store_memory": 80 * 2**20}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    cluster.add_node(**node)
    ray.init(address=cluster.address, log_to_driver=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def test_killed_worker_trials_run_exactly_once_on_both_nodes(two_node_cluster, toy_space,
                                                             toy_objective, tmp_path):
    killed: list[int] = []
    per_worker: dict[str, int] = {}

    def kill_a_worker_once(rec):
        # after a worker's 3rd result it still holds a queued trial: kill its process then
        per_worker[rec["worker_id"]] = per_worker.get(rec["worker_id"], 0) + 1
        if not killed and per_worker[rec["worker_id"]] == 3:
            os.kill(int(rec["worker_pid"]), signal.SIGKILL)
            killed.append(int(rec["worker_pid"]))

    out = tmp_path / "ray"
    res = run_search(toy_space, toy_objective,
                     SearchOptions(trials=70, workers=2, sampler="nsga2", seed=0,
                                   out_dir=str(out), html=False),
                     on_record=kill_a_worker_once)
    assert killed, "the worker was never killed"
    assert res.num_worker_restarts >= 1 and res.num_resubmits >= 1
    assert res.workers == 2
    assert res.nodes_used == 2                               # actors spread over both nodes
    storage, _ = make_storage(None, out)
    trials = optuna.load_study(study_name=toy_space.name, storage=storage).trials
    assert len(trials) == 70
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    uids = [t.user_attrs["m:uid"] for t in trials]
    assert len(set(uids)) == 70                              # no trial twice
    rows = pq.read_table(out / "trials.parquet").to_pylist()
    assert sorted(r["uid"] for r in rows) == sorted(uids)
    assert "worker-2" in {r["worker_id"] for r in rows}      # the replacement did work
    assert killed[0] not in {r["worker_pid"] for r in rows if r["worker_id"] == "worker-2"}
    # resume on the same cluster: continues to 90 with no duplicates
    res2 = run_search(toy_space, toy_objective,
                      SearchOptions(trials=90, workers=2, sampler="nsga2", seed=0,
                                    out_dir=str(out), html=False))
    assert res2.num_trials == 90 and res2.num_new_trials == 20
    assert len({r["uid"] for r in res2.rows}) == 90
