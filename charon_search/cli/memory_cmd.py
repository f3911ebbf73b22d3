"""Per-GPU memory of a training layout, per pipeline stage, without timing.

Example::

    charon-search memory --model llama-3.1-70b --cluster dgx-h100-ib400 \\
        --gpus 64 --tp 8 --pp 4 --dp 2 --schedule 1f1b --sp --zero 1 \\
        --mbs 1 --gbs 64 --seq 8192 --recompute selective --json mem.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from charon_search.cli._common import prepare_outputs
from charon_search.cli.train_cmd import (
    add_framework_arguments,
    add_layout_arguments,
    apply_framework,
)
from charon_search.errors import ConfigError
from charon_search.layout import Layout
from charon_search.units import format_bytes

__all__ = ["FRAMEWORK_ALIASES", "add_arguments", "add_layout_arguments", "layout_from_args",
           "run"]

#: ``--framework`` names besides the presets (``frameworks.FRAMEWORKS``): ``megatron`` is
#: Megatron-Core's.
FRAMEWORK_ALIASES = {"megatron": "megatron-core"}

def layout_from_args(args: argparse.Namespace) -> Layout:
    """``Layout`` from the flags, with the rules of ``charon-search train`` (one parser:
    ``cli.train_cmd.build_layout``); also checks ``--gpus`` against the degrees."""
    from charon_search.cli.train_cmd import build_layout

    layout: Layout = build_layout(args)
    if args.gpus is not None and layout.num_gpus != args.gpus:
        raise ConfigError(f"`tp * pp * dp * cp == gpus` must hold, but got "
                          f"(product={layout.num_gpus}, gpus={args.gpus})")
    return layout


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="catalog name or HF config path")
    parser.add_argument("--cluster", required=True, help="cluster name or YAML path")
    add_layout_arguments(parser)
    add_framework_arguments(parser, aliases=tuple(FRAMEWORK_ALIASES))
    parser.add_argument("--json", type=Path, dest="json_path", help="write the report as JSON")


def run(args: argparse.Namespace) -> int:
    from charon_search.catalog import load_model
    from charon_search.hardware import load_cluster
    from charon_search.layout import check_layout_on_cluster
    from charon_search.memory import memory_report

    prepare_outputs(args, {"--json": "json_path"}, inputs={"--layout": "layout"})
    spec = load_model(args.model)
    cluster = load_cluster(args.cluster)
    layout = layout_from_args(args)
    check_layout_on_cluster(layout, cluster)  # as `train`: the GPUs must be the cluster's
    # the framework's facts and memory conventions (optimizer state layout, recompute policy,
    # loss implementation); without one, framework-neutral ZeRO-paper conventions
    layout, options, notes = apply_framework(
        args, layout, spec, FRAMEWORK_ALIASES.get(args.framework, args.framework))
    rep = memory_report(spec, layout, cluster, options=options)
    m = layout.num_micro_batches
    print(f"{spec.name} on {cluster.gpu.name} ({format_bytes(rep.device_memory_bytes)}); "
          f"tp={layout.tp} pp={layout.pp} dp={layout.dp} cp={layout.cp} ep={layout.ep} "
          f"zero={layout.zero_stage} mbs={layout.micro_batch_size} "
          f"gbs={layout.global_batch_size} micro-batches={m} seq={layout.seq_len} "
          f"recompute={layout.recompute}")
    if layout.pp > 1 and m < layout.pp:
        print(f"warning: only {m} micro-batch(es) per step for pp={layout.pp}, so each stage "
              f"holds at most {m} in flight; a runnable {layout.schedule} plan needs at least "
              f"pp={layout.pp} micro-batches (set --gbs to at least mbs*dp*pp = "
              f"{layout.micro_batch_size * layout.dp * layout.pp}) and then holds more "
              f"activations than shown here")
    cols = ("params", "grads", "optimizer", "activations", "buffers", "allocated", "reserved")
    print(f"{'stage':>5} " + " ".join(f"{c:>11}" for c in cols) + f" {'in-flight':>9}")
    for st in rep.stages:
        vals = (st.params_bytes, st.grads_bytes, st.optimizer_bytes, st.activations_bytes,
                st.buffers_bytes, st.peak_allocated_bytes, st.peak_reserved_bytes)
        print(f"{st.stage:>5} " + " ".join(f"{format_bytes(v):>11}" for v in vals)
              + f" {st.in_flight:>9}")
    print("in-flight: chunk micro-batches whose activations the stage holds at its peak")
    verdict = "fits" if rep.fits else f"does not fit: {rep.reason}"
    st = rep.stages[rep.bottleneck_stage]
    beside = (f", {format_bytes(st.peak_device_bytes)} with "
              f"{format_bytes(st.device_overhead_bytes)} of NCCL buffers outside the allocator"
              if st.device_overhead_bytes > 0 else "")
    print(f"peak reserved {format_bytes(rep.peak_reserved_bytes)} "
          f"(stage {rep.bottleneck_stage}{beside}); {verdict}")
    for i, n in enumerate(notes):
        print(n if i == 0 else f"  - {n}")
    if args.json_path is not None:
        args.json_path.write_text(json.dumps(rep.to_dict(), indent=2) + "\n")
    return 0
