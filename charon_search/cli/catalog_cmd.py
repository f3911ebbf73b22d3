"""List the shipped models, GPUs and clusters.

Example:
    charon-search catalog
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from charon_search.catalog.spec import ModelSpec

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models-only", action="store_true", help="list models only")


def _checkpoints(spec: ModelSpec) -> str:
    """The quantized checkpoints a model entry describes (``serve --precision`` values whose
    per-module precision is known), e.g. ``fp8 (MiniMaxAI/MiniMax-M2.5)``; ``-`` for none."""
    shipped = dict(spec.hf_config.get("_charon_checkpoints") or {})
    return ", ".join(f"{p} ({c.get('hf_id', '?')})" for p, c in sorted(shipped.items())) or "-"


def run(args: argparse.Namespace) -> int:
    from charon_search.catalog import list_models, load_model

    print(f"{'model':18s} {'params':>17s} {'layers':>6s} {'hidden':>6s} {'heads':>5s} "
          f"{'kv':>4s} {'experts':>9s} {'type':12s} checkpoints")
    for name in list_models():
        spec = load_model(name)
        experts = (f"{spec.num_experts_per_token}/{spec.num_experts}" if spec.num_experts
                   else "-")
        print(f"{name:18s} {spec.num_params:17,d} {spec.num_layers:6d} {spec.hidden_size:6d} "
              f"{spec.num_attention_heads:5d} {spec.num_key_value_heads:4d} {experts:>9s} "
              f"{spec.model_type:12s} {_checkpoints(spec)}")
    if args.models_only:
        return 0
    try:
        from charon_search.hardware import list_clusters, list_gpus, load_cluster, load_gpu
    except ImportError:
        print("\n(hardware catalog not available)")
        return 0
    from charon_search.units import format_bytes

    print(f"\n{'gpu':22s} {'bf16 TFLOP/s':>12s} {'HBM':>10s} {'HBM TB/s':>9s}")
    for name in list_gpus():
        gpu = load_gpu(name)
        print(f"{name:22s} {gpu.peak_flops('bf16') / 1e12:12.0f} "
              f"{format_bytes(gpu.hbm_capacity_bytes):>10s} "
              f"{gpu.hbm_bandwidth_bytes_per_s / 1e12:9.2f}")
    print(f"\n{'cluster':28s} {'gpu':22s} {'gpus/node':>9s} tiers")
    for name in list_clusters():
        cl = load_cluster(name)
        tiers = " > ".join(t.name for t in cl.tiers)
        print(f"{name:28s} {cl.gpu.name:22s} {cl.gpus_per_node:9d} {tiers}")
    return 0
