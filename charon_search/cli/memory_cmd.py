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
from charon_search.errors import ConfigError
from charon_search.layout import PRECISIONS, RECOMPUTE_MODES, SCHEDULES, Layout
from charon_search.units import format_bytes

__all__ = ["FRAMEWORKS", "add_arguments", "add_layout_arguments", "layout_from_args", "run"]

#: Frameworks ``MemoryOptions.for_framework`` knows conventions for.
FRAMEWORKS = ("torchtitan", "megatron")

def add_layout_arguments(parser: argparse.ArgumentParser) -> None:
    """The layout flags of ``charon-search train`` (same names and meaning; ``--layout`` YAML
    overridden by individual flags), parsed by ``layout_from_args``."""
    g = parser.add_argument_group("layout")
    g.add_argument("--layout", default=None, help="layout YAML (keys of charon_search.Layout)")
    g.add_argument("--gpus", type=int, default=None,
                   help="GPUs in the job; dp defaults to gpus/(tp*pp*cp)")
    for flag in ("tp", "pp", "cp", "dp", "ep", "vpp"):
        g.add_argument(f"--{flag}", type=int, default=None, help=f"{flag} degree")
    g.add_argument("--schedule", choices=SCHEDULES, default=None, help="pipeline schedule")
    g.add_argument("--sp", action="store_true", default=None, help="sequence parallelism")
    g.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=None, help="ZeRO stage")
    g.add_argument("--mbs", type=int, default=None, help="micro-batch size (sequences)")
    g.add_argument("--gbs", type=int, default=None, help="global batch size (sequences)")
    g.add_argument("--seq", type=int, default=None, help="sequence length (tokens)")
    g.add_argument("--recompute", choices=RECOMPUTE_MODES, default=None,
                   help="activation recompute")
    g.add_argument("--precision", choices=PRECISIONS, default=None, help="GEMM precision")
    g.add_argument("--cp-algo", dest="cp_algo", default=None, help="ring | allgather | ulysses")
    g.add_argument("--selective-policy", dest="selective_policy", default=None,
                   help="what --recompute selective keeps: attention (re-runs the attention "
                        "core) | op (torchtitan op-level SAC: keeps every second matmul)")
    g.add_argument("--attention-kernel", dest="attention_kernel", default=None,
                   help="flash | flash2 | flash_triton | eager (eager saves the scores)")
    g.add_argument("--pp-layout", dest="pp_layout", default=None,
                   help="Megatron --pipeline-model-parallel-layout, e.g. 'Et|(tt|)*30L'")


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
    parser.add_argument("--framework", choices=FRAMEWORKS, default=None,
                        help="training framework whose memory conventions apply (optimizer "
                             "state layout, selective-recompute policy, loss implementation); "
                             "default: framework-neutral ZeRO-paper conventions")
    parser.add_argument("--json", type=Path, dest="json_path", help="write the report as JSON")


def run(args: argparse.Namespace) -> int:
    from charon_search.catalog import load_model
    from charon_search.hardware import load_cluster
    from charon_search.memory import memory_report
    from charon_search.memory.report import MemoryOptions, torchtitan_loss_impl

    prepare_outputs(args, {"--json": "json_path"})
    spec = load_model(args.model)
    cluster = load_cluster(args.cluster)
    layout = layout_from_args(args)
    options = None
    if args.framework is not None:
        overrides = ({"loss_impl": torchtitan_loss_impl(layout.tp)}
                     if args.framework == "torchtitan" else {})
        options = MemoryOptions.for_framework(args.framework, **overrides)
    rep = memory_report(spec, layout, cluster, options=options)
    print(f"{spec.name} on {cluster.gpu.name} ({format_bytes(rep.device_memory_bytes)}); "
          f"tp={layout.tp} pp={layout.pp} dp={layout.dp} cp={layout.cp} ep={layout.ep} "
          f"zero={layout.zero_stage} mbs={layout.micro_batch_size} seq={layout.seq_len} "
          f"recompute={layout.recompute}")
    cols = ("params", "grads", "optimizer", "activations", "buffers", "allocated", "reserved")
    print(f"{'stage':>5} " + " ".join(f"{c:>11}" for c in cols))
    for st in rep.stages:
        vals = (st.params_bytes, st.grads_bytes, st.optimizer_bytes, st.activations_bytes,
                st.buffers_bytes, st.peak_allocated_bytes, st.peak_reserved_bytes)
        print(f"{st.stage:>5} " + " ".join(f"{format_bytes(v):>11}" for v in vals))
    verdict = "fits" if rep.fits else f"does not fit: {rep.reason}"
    print(f"peak reserved {format_bytes(rep.peak_reserved_bytes)} "
          f"(stage {rep.bottleneck_stage}); {verdict}")
    if args.json_path is not None:
        args.json_path.write_text(json.dumps(rep.to_dict(), indent=2) + "\n")
    return 0
