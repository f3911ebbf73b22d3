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

    names = list_models()
    specs = [load_model(n) for n in names]
    w = max(len("model"), *(len(n) for n in names))          # columns fit the longest name
    t = max(len("type"), *(len(sp.model_type) for sp in specs))
    print(f"{'model':{w}s} {'params':>17s} {'active':>17s} {'layers':>6s} {'hidden':>6s} "
          f"{'heads':>5s} {'kv':>4s} {'experts':>9s} {'type':{t}s} checkpoints")
    for name, spec in zip(names, specs):
        experts = (f"{spec.num_experts_per_token}/{spec.num_experts}" if spec.num_experts
                   else "-")
        print(f"{name:{w}s} {spec.num_params:17,d} {spec.num_active_params:17,d} "
              f"{spec.num_layers:6d} {spec.hidden_size:6d} "
              f"{spec.num_attention_heads:5d} {spec.num_key_value_heads:4d} {experts:>9s} "
              f"{spec.model_type:{t}s} {_checkpoints(spec)}")
    if args.models_only:
        return 0
    try:
        from charon_search.hardware import list_clusters, list_gpus, load_cluster, load_gpu
    except ImportError:
        print("\n(hardware catalog not available)")
        return 0
    from charon_search.units import format_bytes

    gpus = list_gpus()
    g = max(len("gpu"), *(len(n) for n in gpus))
    print(f"\n{'gpu':{g}s} {'bf16 TFLOP/s':>12s} {'HBM':>10s} {'HBM TB/s':>9s}")
    for name in gpus:
        gpu = load_gpu(name)
        print(f"{name:{g}s} {gpu.peak_flops('bf16') / 1e12:12.0f} "
              f"{format_bytes(gpu.hbm_capacity_bytes):>10s} "
              f"{gpu.hbm_bandwidth_bytes_per_s / 1e12:9.2f}")
    clusters = [load_cluster(n) for n in list_clusters()]
    c = max(len("cluster"), *(len(cl.name) for cl in clusters))
    cg = max(len("gpu"), *(len(cl.gpu.name) for cl in clusters))
    print(f"\n{'cluster':{c}s} {'gpu':{cg}s} {'gpus/node':>9s} tiers")
    for cl in clusters:
        tiers = " > ".join(t.name for t in cl.tiers)
        print(f"{cl.name:{c}s} {cl.gpu.name:{cg}s} {cl.gpus_per_node:9d} {tiers}")
    return 0
