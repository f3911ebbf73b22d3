"""NCCL collectives inside one node from the profile DB's measured rows."""

from __future__ import annotations

import math

import pytest

from charon_search.cost.collectives import collective_time
from charon_search.cost.measured_collectives import measured_nccl_s
from charon_search.cost.selector import default_cost_model
from charon_search.hardware.loader import load_cluster
from charon_search.sim.costing import GraphCoster

MIB = 2**20


def test_a100_all_reduce_is_the_measured_row() -> None:
    """aiconfigurator-core a100_sxm nccl_perf.parquet: all_reduce, 8 GPUs, message_size
    134217728 half elements (256 MiB) took 2.1825 ms; 33554432 elements (64 MiB) 0.5953 ms."""
    cl = load_cluster("dgx-a100-superpod")
    assert measured_nccl_s("all_reduce", 256 * MIB, 8, cl) == pytest.approx(2.1825e-3, rel=1e-3)
    assert measured_nccl_s("all_reduce", 64 * MIB, 8, cl) == pytest.approx(0.5953e-3, rel=1e-3)
    # Between two measured sizes: log-log interpolation, so the geometric mean of the sizes
    # costs the geometric mean of the times (64 and 128 MiB: 0.5953 and 1.1691 ms).
    mid = measured_nccl_s("all_reduce", math.sqrt(64 * 128) * MIB, 8, cl)
    assert mid == pytest.approx(math.sqrt(0.5953e-3 * 1.1691e-3), rel=1e-3)
    # Above the largest measured size (512 MiB) the time grows in proportion to the bytes.
    top = measured_nccl_s("all_reduce", 512 * MIB, 8, cl)
    assert top == pytest.approx(4.2259e-3, rel=1e-3)
    assert measured_nccl_s("all_reduce", 1024 * MIB, 8, cl) == pytest.approx(2 * top, rel=1e-9)


def test_the_fitted_line_misses_what_the_table_measures() -> None:
    """The α-β line through all 63 points is off by more than 10 % at 256 MiB on A100
    (the reason to read the table): the measured bus bandwidth there is
    2·7/8·256 MiB / 2.1825 ms = 215 GB/s."""
    cl = load_cluster("dgx-a100-superpod")
    measured = measured_nccl_s("all_reduce", 256 * MIB, 8, cl)
    assert 2 * 7 / 8 * 256 * MIB / measured / 1e9 == pytest.approx(215, abs=1)
    assert collective_time("all_reduce", 256 * MIB, 8, cl) / measured > 1.1


def test_groups_outside_one_nvlink_node_keep_the_model() -> None:
    cl = load_cluster("dgx-h100-ib400")
    assert measured_nccl_s("all_gather", 64 * MIB, 8, cl) is not None
    assert measured_nccl_s("all_gather", 64 * MIB, 8, cl, stride=8) is None  # across nodes
    assert measured_nccl_s("all_gather", 64 * MIB, 16, cl) is None  # no 16-GPU node
    assert measured_nccl_s("all_gather", 64 * MIB, 2, cl, stride=4) is not None  # ranks 0, 4
    assert measured_nccl_s("send_recv", 64 * MIB, 2, cl) is None  # no send/recv rows
    # A PCIe box: consecutive GPUs (the measured placement) use the rows, strided ones not.
    l40s = load_cluster("l40s-8gpu")
    assert measured_nccl_s("all_reduce", 64 * MIB, 2, l40s) == pytest.approx(3.3588e-3)
    assert measured_nccl_s("all_reduce", 64 * MIB, 2, l40s, stride=2) is None
    # NVL72: a 4-GPU tray is measured, 8 GPUs span two trays (the model prices those).
    nvl = load_cluster("gb200-nvl72")
    assert measured_nccl_s("all_reduce", 64 * MIB, 4, nvl) is not None
    assert measured_nccl_s("all_reduce", 64 * MIB, 8, nvl) is None


def test_training_coster_prices_tp_collectives_from_the_table() -> None:
    cl = load_cluster("dgx-a100-superpod")
    coster = GraphCoster(cl, default_cost_model(cl), strides={"tp": 1, "dp": 8})
    t, tier = coster.collective("all_reduce", 256 * MIB, 8, "tp")
    assert (t, tier) == (pytest.approx(2.1825e-3, rel=1e-3), "nvlink")
    # The DP group crosses nodes: the topology model, as before.
    t_dp, _ = coster.collective("all_reduce", 256 * MIB, 8, "dp")
    assert t_dp == pytest.approx(collective_time("all_reduce", 256 * MIB, 8, cl, stride=8))


def test_serving_nccl_path_reads_the_table() -> None:
    """A serving graph priced without an engine's custom all-reduce (``tp_allreduce="nccl"``)
    takes its TP-8 all-reduces inside one H200 node from the NCCL rows, not the line."""
    from charon_search.catalog import load_model
    from charon_search.serving._graphs import serving_graphs
    from charon_search.serving.iteration_cost import collective_s, graph_cost_fn

    cluster = load_cluster("h200-sxm-8gpu")
    _, decode = serving_graphs(load_model("llama-3.1-8b"), tp=8, pp=1, ep=1,
                               dp_attention=False, precision="bf16", engine="vllm")
    graph = decode["dense"]
    reduces = [i for i, n in enumerate(graph.nodes) if n.kind.value == "all_reduce"]
    nbytes = graph.nodes[reduces[0]].param("bytes")(64, 1, 300)
    cost = graph_cost_fn(cluster)(graph, 64, 1, 300)
    table = measured_nccl_s("all_reduce", nbytes, 8, cluster)
    assert table is not None and table != pytest.approx(collective_s("all_reduce", nbytes, 8,
                                                                     cluster))
    assert cost[reduces] == pytest.approx(table)
