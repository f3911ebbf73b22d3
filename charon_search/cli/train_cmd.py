"""Simulate one training step of a model on a cluster under a parallel layout.

Flags set the layout; ``--layout FILE.yaml`` supplies it (flags given explicitly override the
file). Missing ``--dp`` is derived as gpus / (tp·pp·cp). Writes the StepReport with ``--json``
and a Chrome/Perfetto trace with ``--trace``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from charon_search.cli._common import prepare_outputs, with_flags
from charon_search.errors import ConfigError

_FLAGS = {  # flag dest -> Layout field
    "tp": "tp", "pp": "pp", "cp": "cp", "dp": "dp", "ep": "ep", "vpp": "vpp",
    "schedule": "schedule", "sp": "sequence_parallel", "zero": "zero_stage",
    "mbs": "micro_batch_size", "gbs": "global_batch_size", "seq": "seq_len",
    "recompute": "recompute", "precision": "precision", "cp_algo": "cp_algo",
    "attention_kernel": "attention_kernel", "fp8_recipe": "fp8_recipe",
    "selective_policy": "selective_policy", "fsdp_backward_prefetch": "fsdp_backward_prefetch",
    "fsdp_flat_grad": "fsdp_flat_grad", "grad_reduce_dtype": "grad_reduce_dtype",
    "pp_layout": "pp_layout", "mla_rope_fusion": "mla_rope_fusion",
    "pp_p2p_blocking": "pp_p2p_blocking", "pp_scatter_gather": "pp_scatter_gather",
    "loss_kernel": "loss_kernel",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="catalog name or HF config path")
    p.add_argument("--cluster", required=True, help="cluster name or YAML path")
    add_layout_arguments(p)
    add_framework_arguments(p)
    p.add_argument("--json", default=None, help="write the StepReport as JSON to this file")
    p.add_argument("--trace", default=None,
                   help="write a Chrome/Perfetto trace of the step to this file (open it in "
                        "ui.perfetto.dev)")


def add_layout_arguments(parser: argparse.ArgumentParser) -> None:
    """The layout flags (``--layout`` YAML overridden by individual flags), parsed by
    ``build_layout``; ``charon-search train`` and ``charon-search memory`` share them."""
    from charon_search.layout import PRECISIONS, RECOMPUTE_MODES, SCHEDULES

    g = parser.add_argument_group("layout")
    g.add_argument("--layout", default=None,
                   help="layout YAML (keys of charon_search.Layout, e.g. examples/layouts/); "
                        "flags given explicitly override its keys")
    g.add_argument("--gpus", type=int, default=None,
                   help="GPUs in the job (checked against the degrees); dp defaults to "
                        "gpus/(tp*pp*cp), and without --gpus to 1")
    degrees = {"tp": "tensor-parallel degree (default 1)",
               "pp": "pipeline-parallel stages (default 1)",
               "cp": "context-parallel degree (default 1)",
               "dp": "data-parallel replicas (default gpus/(tp*pp*cp), 1 without --gpus)",
               "ep": "expert-parallel degree of MoE layers (default 1)",
               "vpp": "virtual pipeline stages (model chunks) per pp rank, for "
                      "interleaved-1f1b (default 1)"}
    for flag, text in degrees.items():
        g.add_argument(f"--{flag}", type=int, default=None, help=text)
    g.add_argument("--schedule", choices=SCHEDULES, default=None,
                   help="pipeline schedule (default: none with --pp 1; 1f1b with --pp > 1, "
                        "interleaved-1f1b with --vpp > 1 too)")
    g.add_argument("--sp", action="store_true", default=None,
                   help="sequence parallelism (off by default)")
    g.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=None,
                   help="ZeRO stage (default 0; 3 = FSDP)")
    g.add_argument("--mbs", type=int, default=None,
                   help="micro-batch size, sequences (default 1)")
    g.add_argument("--gbs", type=int, default=None,
                   help="global batch size, sequences (default mbs x dp: one micro-batch)")
    g.add_argument("--seq", type=int, default=None, help="sequence length, tokens (default 2048)")
    g.add_argument("--recompute", choices=RECOMPUTE_MODES, default=None,
                   help="activation recompute (default none)")
    g.add_argument("--precision", choices=PRECISIONS, default=None,
                   help="GEMM precision (default bf16)")
    g.add_argument("--cp-algo", dest="cp_algo", default=None,
                   help="context-parallel attention: ring | allgather | ulysses (default ring)")
    g.add_argument("--attention-kernel", dest="attention_kernel", default=None,
                   help="flash (the GPU's best fused kernel) | flash2 (FlashAttention-2) | "
                        "flash_triton (Triton FlashAttention) | eager (unfused core attention, "
                        "its scores saved); default flash")
    g.add_argument("--fp8-recipe", dest="fp8_recipe", default=None,
                   help="with --precision fp8: tensorwise | rowwise | delayed | blockwise "
                        "(default tensorwise)")
    g.add_argument("--selective-policy", dest="selective_policy", default=None,
                   help="what --recompute selective keeps: attention (re-runs the attention "
                        "core; the default) | op (torchtitan op-level SAC: keeps every second "
                        "matmul)")
    g.add_argument("--fsdp-backward-prefetch", dest="fsdp_backward_prefetch", default=None,
                   help="ZeRO-3 backward all-gather: pre (before the layer's gradients; "
                        "FSDP2; the default) | post (after them, queued with the "
                        "reduce-scatters; FSDP1 BACKWARD_POST, Composer's default)")
    g.add_argument("--fsdp-flat-grad", dest="fsdp_flat_grad", default=None,
                   action=argparse.BooleanOptionalAction,
                   help="ZeRO-3 gradients take PyTorch FSDP1's FlatParameter path: each "
                        "backward concatenates, casts and pre-divides the unit's unsharded "
                        "gradient before its reduce-scatter (FSDP1 / Composer; default off, "
                        "FSDP2)")
    g.add_argument("--grad-reduce-dtype", dest="grad_reduce_dtype", default=None,
                   help="dtype of the data-parallel gradient reduction: fp32 | bf16 | fp16 "
                        "(default fp32; bf16 = FSDP mixed precision reducing in bf16, "
                        "Composer PURE; fp16 = Megatron-LM fp16 without fp32 accumulation)")
    g.add_argument("--loss-kernel", dest="loss_kernel", default=None,
                   help="cross-entropy kernels: eager | fused (default eager: the traced "
                        "fp32 log-softmax and NLL ops; fused = one kernel per direction on the "
                        "bf16 logits: flash-attn's CrossEntropyLoss as in llm-foundry, or the "
                        "loss compiled by torch.compile)")
    g.add_argument("--mla-rope-fusion", dest="mla_rope_fusion", default=None,
                   action=argparse.BooleanOptionalAction,
                   help="multi-latent attention runs Megatron-Core's fused query and key/value "
                        "RoPE kernels (apply_rope_fusion) instead of the HF layer's RoPE and "
                        "copy ops (default off)")
    g.add_argument("--pp-p2p-blocking", dest="pp_p2p_blocking", default=None,
                   action=argparse.BooleanOptionalAction,
                   help="a pipeline stage waits for its sends to finish (Megatron's "
                        "batch_isend_irecv + torch.cuda.synchronize, without "
                        "--overlap-p2p-communication; default off: sends overlap the next "
                        "unit)")
    g.add_argument("--pp-scatter-gather", dest="pp_scatter_gather", default=None,
                   action=argparse.BooleanOptionalAction,
                   help="without sequence parallelism, a stage sends 1/tp of its output and "
                        "the next stage all-gathers it in its TP group (Megatron-LM "
                        "--scatter-gather-tensors-in-pipeline; default off)")
    g.add_argument("--pp-layout", dest="pp_layout", default=None,
                   help="Megatron --pipeline-model-parallel-layout, e.g. 'Et|(tt|)*30L': each "
                        "virtual stage's layers (t), embedding (E, first) and LM head (L, last); "
                        "default: layers split evenly")


def build_layout(args: argparse.Namespace) -> Any:
    from charon_search.config_fields import typed_kwargs
    from charon_search.layout import Layout

    data: dict[str, Any] = {}
    if args.layout:
        import yaml

        path = Path(args.layout)
        try:
            raw = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as e:
            raise ConfigError(f"{path}: cannot read layout YAML: {e}") from e
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: a layout YAML must be a mapping of Layout fields")
        # Unknown keys and values of the wrong kind fail here, naming the file; the layout
        # itself is checked once the flags and defaults (the pipeline schedule) are applied.
        typed_kwargs(Layout, raw, str(path))
        data.update(raw)
    for flag, fld in _FLAGS.items():
        val = getattr(args, flag, None)
        if val is not None:
            data[fld] = val
    args.explicit_fields = frozenset(data)  # set by the YAML or a flag: presets keep them
    if args.gpus is not None and args.gpus < 1:
        raise ConfigError(f"`--gpus` must be a positive integer, but got {args.gpus}")
    if "dp" not in data and args.gpus:
        for k in ("tp", "pp", "cp"):  # degrees >= 1 before dividing by them
            if data.get(k, 1) < 1:
                raise ConfigError(f"`{k}` must be a positive integer, but got {data[k]}")
        denom = data.get("tp", 1) * data.get("pp", 1) * data.get("cp", 1)
        if args.gpus % denom:
            raise ConfigError(f"`tp * pp * cp` must divide gpus, but got (tp*pp*cp={denom}, "
                              f"gpus={args.gpus})")
        data["dp"] = args.gpus // denom
    if data.get("pp", 1) > 1 and "schedule" not in data:
        data["schedule"] = "interleaved-1f1b" if data.get("vpp", 1) > 1 else "1f1b"
    if "global_batch_size" not in data:
        data["global_batch_size"] = data.get("micro_batch_size", 1) * data.get("dp", 1)
    # A flag that only matters under another setting would be ignored without a word.
    needs = (("fp8_recipe", "precision", ("fp8",)),
             ("selective_policy", "recompute", ("selective",)),
             ("fsdp_backward_prefetch", "zero_stage", (3,)))
    for flag, field, values in needs:
        current = data.get(field, Layout.__dataclass_fields__[field].default)
        if getattr(args, flag, None) is not None and current not in values:
            want = " or ".join(repr(v) for v in values)
            raise ConfigError(f"`--{flag.replace('_', '-')}` applies only with `{field}` "
                              f"{want}, but got {field}={current!r}")
    try:
        return Layout.from_dict(data, where=args.layout or "flags")
    except ConfigError as e:
        raise ConfigError(with_flags(str(e), {v: k for k, v in _FLAGS.items()},
                                     getattr(args, "command", None) or "train")) from None


def add_framework_arguments(parser: argparse.ArgumentParser, *, aliases: tuple[str, ...] = ()
                            ) -> None:
    """``--framework`` (a ``frameworks.FRAMEWORKS`` preset), ``--framework-year`` and
    ``--compile / --no-compile``, applied by ``apply_framework``."""
    from charon_search.frameworks import FRAMEWORKS

    g = parser.add_argument_group("framework")
    g.add_argument("--framework", choices=(*FRAMEWORKS, *aliases), default=None,
                   help="simulate the layout as this training framework's code runs it (the "
                        "facts the accuracy report's records of that framework are simulated "
                        "with: pipeline transfers, loss and attention kernels, FSDP gradient "
                        "path, recompute policy, memory conventions...); flags and --layout "
                        "keys given explicitly win. Default: none (framework-neutral)")
    g.add_argument("--framework-year", dest="framework_year", type=int, default=None,
                   help="year of the framework's code (default: the year of its latest "
                        "validation records: megatron-lm 2022, megatron-core and torchtitan "
                        "2025, llm-foundry 2023); rules that changed with a release key on it")
    g.add_argument("--compile", dest="torch_compile", default=None,
                   action=argparse.BooleanOptionalAction,
                   help="with --framework torchtitan: the job runs torch.compile (fused norms "
                        "and kernels, the compiled loss; default on)")


def apply_framework(args: argparse.Namespace, layout: Any, model: Any,
                    framework: str | None = None) -> tuple[Any, Any, tuple[str, ...]]:
    """``(layout, memory options, notes)`` of ``--framework`` (or ``framework``) applied to
    ``layout``, the notes headed by the framework and year; without one,
    ``(layout, None, ())``."""
    from charon_search.frameworks import check_preset_options, framework_layout

    name = framework or args.framework
    check_preset_options(name, year=args.framework_year, torch_compile=args.torch_compile,
                         spelled={"framework": "--framework",
                                  "framework_year": "--framework-year",
                                  "torch_compile": "--compile / --no-compile"})
    if name is None:
        return layout, None, ()
    fl = framework_layout(model, layout, name, year=args.framework_year,
                          torch_compile=args.torch_compile is not False,
                          keep=getattr(args, "explicit_fields", ()))
    head = f"framework {name} ({fl.year}):" + ("" if fl.notes else " no layout fact applies "
                                              "(its memory conventions do)")
    return fl.layout, fl.memory_options, (head, *fl.notes)


def run(args: argparse.Namespace) -> int:
    from charon_search.training import simulate_training
    from charon_search.units import format_seconds

    prepare_outputs(args, {"--json": "json", "--trace": "trace"}, inputs={"--layout": "layout"})
    layout = build_layout(args)
    layout, memory_options, notes = apply_framework(args, layout, args.model)
    report = simulate_training(args.model, args.cluster, layout, num_gpus=args.gpus,
                               memory_options=memory_options)
    d = report.to_dict()
    bd = d["breakdown"]
    rows = [
        ("step time", format_seconds(report.step_time_s)),
        ("tokens/s", f"{report.tokens_per_s:,.0f}"),
        ("tokens/s/GPU", f"{report.tokens_per_s_per_gpu:,.1f}"),
        ("MFU / HFU", f"{report.mfu:.1%} / {report.hfu:.1%}"),
        ("compute", format_seconds(bd["compute_s"])),
        ("exposed comm", format_seconds(bd["exposed_comm_s"]) + "  " + ", ".join(
            f"{k} {format_seconds(v)}" for k, v in bd["exposed_comm_by_kind_s"].items())),
        ("pipeline bubble", format_seconds(bd["pipeline_bubble_s"]) + (
            f"  ({format_seconds(bd['stage_imbalance_s'])} of it from unequal stages)"
            if bd.get("stage_imbalance_s") else "")),
        ("overlap slowdown", format_seconds(bd["overlap_slowdown_s"])),
        ("optimizer", format_seconds(bd["optimizer_s"])),
        ("micro-batches", str(report.num_micro_batches)),
        ("cost sources", ", ".join(f"{k} {v:.0%}" for k, v in report.cost_sources.items())),
    ]
    if report.memory:
        peak = report.memory.get("peak_reserved_bytes")
        device = report.memory.get("peak_device_bytes")
        if peak is not None:
            # ``fits`` compares the device total: reserved plus NCCL buffers outside the
            # caching allocator.
            beside = (f"; {device / 2**30:.1f} GiB with NCCL buffers"
                      if device is not None and device > peak else "")
            rows.append(("peak reserved memory", f"{peak / 2**30:.1f} GiB{beside} (fits: "
                                                 f"{report.memory.get('fits')})"))
    print(f"{report.model} on {report.cluster}, {report.num_gpus} GPUs "
          f"(tp={layout.tp} pp={layout.pp} dp={layout.dp} cp={layout.cp} ep={layout.ep} "
          f"schedule={layout.schedule})")
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")
    if notes:
        print(f"  {notes[0]}")
        for n in notes[1:]:
            print(f"    - {n}")
    for w in report.warnings:
        print(f"  warning: {w}")
    if args.json:
        Path(args.json).write_text(json.dumps(d, indent=2, default=str))
    if args.trace:
        from charon_search.sim.trace import write_chrome_trace
        write_chrome_trace(report.timeline, args.trace)
    return 0
