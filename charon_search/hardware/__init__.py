"""Hardware as data: GPUs and clusters loaded from ``cluster_specs/*.yaml``.

>>> from charon_search.hardware import load_cluster, load_gpu
>>> load_gpu("h100").hbm_capacity_bytes  # 79.18 GiB, as CUDA reports an H100 80GB
85018877624
"""

from charon_search.hardware.loader import (
    clear_caches,
    cluster_from_dict,
    gpu_from_dict,
    list_clusters,
    list_gpus,
    load_cluster,
    load_gpu,
    resolve_gpu_name,
    spec_dirs,
)
from charon_search.hardware.spec import Calibration, ClusterSpec, GpuSpec, TopologyTier

__all__ = [
    "Calibration",
    "ClusterSpec",
    "GpuSpec",
    "TopologyTier",
    "clear_caches",
    "cluster_from_dict",
    "gpu_from_dict",
    "list_clusters",
    "list_gpus",
    "load_cluster",
    "load_gpu",
    "resolve_gpu_name",
    "spec_dirs",
]
