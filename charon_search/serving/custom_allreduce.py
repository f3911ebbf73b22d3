"""Tensor-parallel all-reduce as serving engines run it: custom NVLink kernels, not NCCL.

vLLM (``custom_all_reduce``), SGLang (the same kernel family) and TensorRT-LLM (``AllReduce``
with its one-shot/two-shot strategies) replace NCCL for the activation all-reduces of a tensor-
parallel group inside one NVLink node: each rank reads its peers' buffers directly, so a small
message costs a few microseconds instead of NCCL's launch + ring steps. Their latency is a
measured fact of each engine and GPU: aiconfigurator-core's ``custom_allreduce_perf`` tables
(``data/serving/custom_allreduce.csv``, converted with the command in that file's header),
interpolated log-log in message size. Groups that leave the node, GPUs or engines without a
table, and sizes outside it fall back to the cluster's NCCL model (``None`` here).

Multi-node NVLink (GB200/GB300 NVL72): the racks' trays hold 4 GPUs, but all 72 share one NVLink
switch fabric. TensorRT-LLM runs its own NVLink all-reduce across trays there (the ``MNNVL``
all-reduce strategy); vLLM and SGLang keep their custom kernel inside one node and use NCCL
beyond. No table measures the cross-tray kernel, so ``mnnvl_allreduce_s`` reads the 8-GPU table
of the HGX board with the same GPU and NVLink 5 generation (``MNNVL_PROXY``): its 2- and 4-GPU
rows agree with the NVL72 GPU's own within 15 % from 256 B to 8 MiB (0.86-1.14 x,
``tests/serving/test_engine_policies.py``).
"""

from __future__ import annotations

import csv
from functools import lru_cache
from pathlib import Path

from charon_search.cost.measured_collectives import Curve, loglog_curve, loglog_interp

__all__ = ["ENGINES", "MNNVL_ENGINES", "MNNVL_PROXY", "custom_allreduce_s", "mnnvl_allreduce_s",
           "table_gpus"]

ENGINES = ("vllm", "sglang", "trtllm")
#: Engines whose NVLink all-reduce spans the trays of an NVL72 domain (TensorRT-LLM
#: ``AllReduceStrategy.MNNVL``); vLLM's and SGLang's custom all-reduce stays inside one node.
MNNVL_ENGINES = ("trtllm",)
#: NVL72 GPU -> the HGX GPU of the same silicon and NVLink generation whose 8-GPU table stands
#: in for groups beyond one 4-GPU tray (GB200 / B200 and GB300 / B300: NVLink 5, 900 GB/s per
#: direction; NVIDIA GB200 NVL72 and HGX B200 / B300 datasheets).
MNNVL_PROXY = {"gb200": "b200-sxm-180gb", "gb300": "b300-sxm-288gb"}
_TABLE = Path(__file__).resolve().parent.parent / "data" / "serving" / "custom_allreduce.csv"


@lru_cache(maxsize=1)
def _load() -> dict[tuple[str, str, int], Curve]:
    rows: dict[tuple[str, str, int], list[tuple[float, float]]] = {}
    with _TABLE.open() as f:
        for row in csv.DictReader(line for line in f if not line.startswith("#")):
            key = (row["gpu"], row["framework"], int(row["num_gpus"]))
            rows.setdefault(key, []).append((float(row["bytes"]), float(row["latency_s"])))
    return {key: loglog_curve(pts) for key, pts in rows.items()}


def table_gpus() -> set[str]:
    """GPU names with a measured table."""
    return {k[0] for k in _load()}


def custom_allreduce_s(engine: str, gpu: str, group_size: int, nbytes: float) -> float | None:
    """Seconds of one bf16 all-reduce of ``nbytes`` over ``group_size`` NVLink peers by
    ``engine``'s custom kernel on ``gpu``; None when no measurement covers it."""
    table = _load().get((gpu, engine, int(group_size)))
    if table is None or nbytes <= 0:
        return None
    return loglog_interp(table, nbytes, beyond="none")


def mnnvl_allreduce_s(engine: str, gpu: str, group_size: int, nbytes: float) -> float | None:
    """Seconds of one bf16 all-reduce of ``nbytes`` over ``group_size`` GPUs of one NVL72
    NVLink domain that span more than one tray, by ``engine``'s NVLink kernel; None when the
    engine uses NCCL there or no proxy table covers the group (see the module docstring)."""
    proxy = MNNVL_PROXY.get(gpu)
    if engine not in MNNVL_ENGINES or proxy is None:
        return None
    return custom_allreduce_s(engine, proxy, group_size, nbytes)
