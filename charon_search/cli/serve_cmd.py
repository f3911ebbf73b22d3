"""Simulate serving a model: TTFT/TPOT/throughput under a workload (continuous batching, PD).

Examples:
    charon-search serve --model llama-3.1-70b --cluster h100-sxm-8gpu --tp 4 \\
        --workload poisson --rate 4 --num-requests 2000 --input-len 2000 --output-len 200 \\
        --max-num-seqs 256 --max-batched-tokens 8192 --chunked-prefill --json serve.json
    charon-search serve --model llama-3.1-70b --cluster h100-sxm-8gpu --engine sglang \\
        --workload concurrency --concurrency 8 --num-requests 32 --input-len 2000 \\
        --output-len 200 --disagg prefill=1xTP4,decode=1xTP4 --kv-transfer rdma
    charon-search serve ... --workload trace.csv     # arrived_at, prompt_tokens, output_tokens

Engine knobs beyond these flags go in ``--config serving.yaml`` (the ``ServingConfig`` fields,
plus an optional ``workload:`` section with the ``WorkloadSpec`` fields); flags override it.
``--engine`` stands for that engine launched with its own defaults
(``serving.engine_defaults``), which the flags and the file override field by field.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from charon_search.cli._common import prepare_outputs, with_flags
from charon_search.errors import ConfigError
from charon_search.hardware.spec import SERVING_ENGINES
from charon_search.serving.config import KV_DTYPES, PRECISIONS

#: WorkloadSpec fields -> the serve flags that set them (named in its errors).
_WORKLOAD_FLAGS = {f"workload.{k}": v for k, v in (
    ("rate_per_s", "rate"), ("cv", "cv"), ("concurrency", "concurrency"),
    ("num_requests", "num_requests"), ("ramp_up_s", "ramp_up"), ("input_len", "input_len"),
    ("output_len", "output_len"), ("seed", "seed"))}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="catalog name or HF config path")
    parser.add_argument("--cluster", required=True, help="cluster name or YAML path")
    parser.add_argument("--config", help="serving YAML/JSON (ServingConfig fields + workload:)")
    g = parser.add_argument_group("parallelism")
    g.add_argument("--tp", type=int, help="tensor-parallel degree of a replica (default 1)")
    g.add_argument("--pp", type=int, help="pipeline-parallel degree of a replica (default 1)")
    g.add_argument("--ep", type=int, help="expert-parallel degree, dividing tp (default 1)")
    g.add_argument("--dp", type=int, help="replicas behind the router (default 1)")
    g.add_argument("--sp", type=int, help="prefill sequence-parallel degree (default 1)")
    g.add_argument("--dynamic-sp", action="store_true", default=None,
                   help="choose each prefill request's SP degree per batch (off by default)")
    g.add_argument("--disagg", help="PD disaggregation, e.g. prefill=2xTP2,decode=1xTP4 "
                                    "(replicas x degrees per pool; default: aggregated)")
    g.add_argument("--kv-transfer", choices=("rdma", "nvlink"), default=None,
                   help="with --disagg: the network tier the KV cache crosses, rdma (the "
                        "scale-out NIC) or nvlink (same NVLink domain); default rdma")
    w = parser.add_argument_group("workload")
    w.add_argument("--workload", default=None,
                   help="poisson | gamma | concurrency | burst | a trace file (.csv/.parquet "
                        "with arrived_at [s], prompt_tokens, output_tokens); default poisson")
    w.add_argument("--rate", type=float, help="arrival rate, requests/s (default 1)")
    w.add_argument("--cv", type=float,
                   help="gamma arrivals: coefficient of variation of the gaps (default 1)")
    w.add_argument("--num-requests", type=int, help="requests simulated (default 100)")
    w.add_argument("--input-len", type=int, help="prompt tokens per request (default 1024)")
    w.add_argument("--output-len", type=int, help="output tokens per request (default 128)")
    w.add_argument("--concurrency", type=int,
                   help="closed loop (--workload concurrency, which needs it): requests in "
                        "flight")
    w.add_argument("--seed", type=int, help="workload random seed (default 0)")
    w.add_argument("--prompt-pool", type=int, metavar="N",
                   help="the client draws its prompts from N distinct ones in turn (aiperf's "
                        "default dataset holds 100): with --prefix-caching a repeated prompt "
                        "is a cache hit; needs a fixed --input-len")
    w.add_argument("--ramp-up", type=float, dest="ramp_up_s",
                   help="closed loop: spread the first wave over this many seconds (default: "
                        "one expected request lifetime, the steady state; 0 = all at once)")
    e = parser.add_argument_group("engine")
    e.add_argument("--engine", choices=SERVING_ENGINES,
                   help="serving engine to stand for: its own scheduler defaults (schedule, "
                        "chunk size, overlap scheduler, prefix caching, custom all-reduce; "
                        "flags below override them) and the host times the cluster spec "
                        "calibrates for it (front end, streaming cycle, prompt iterations, "
                        "disaggregated hand-over); default: a generic engine with none")
    e.add_argument("--engine-version", metavar="RELEASE",
                   help="the --engine release whose defaults apply (default: the newest the "
                        "shipped measurements hold, e.g. 0.19.0 for vllm)")
    e.add_argument("--scheduler", choices=("vllm", "static"),
                   help="continuous batching (vllm, default) or the batch-at-a-time baseline "
                        "(static)")
    e.add_argument("--max-num-seqs", type=int,
                   help="requests running at once per replica (default 256, or the engine's)")
    e.add_argument("--max-batched-tokens", type=int,
                   help="token budget of one iteration (default 8192, or the engine's)")
    e.add_argument("--chunked-prefill", action=argparse.BooleanOptionalAction, default=None,
                   help="split long prompts into --max-batched-tokens chunks mixed with "
                        "decodes (default on, or the engine's)")
    e.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction, default=None,
                   help="reuse the KV of a prompt prefix already cached (default off, or the "
                        "engine's)")
    e.add_argument("--memory-fraction", type=float, metavar="F",
                   help="the engine's memory setting, read as the engine reads it: vLLM "
                        "--gpu-memory-utilization (share of the device), SGLang "
                        "--mem-fraction-static (share for weights and KV), TensorRT-LLM "
                        "free_gpu_memory_fraction (share of the memory left free); default: the "
                        "engine's own (`gpu_memory_utilization` in --config)")
    e.add_argument("--precision", choices=PRECISIONS,
                   help="weight/GEMM precision; int4 = 4-bit integer weights (W4A16) of a "
                        "checkpoint the catalog ships (e.g. kimi-k2.5); default bf16")
    e.add_argument("--kv-dtype", choices=KV_DTYPES,
                   help="KV-cache element type; default auto: what an engine launched without "
                        "--kv-cache-dtype stores, the KV-cache quantization the checkpoint "
                        "declares (fp8 for NVIDIA's NVFP4 releases), else bf16")
    e.add_argument("--fused-kernels", action=argparse.BooleanOptionalAction, default=None,
                   help="cost the kernels inference engines fuse (default on)")
    e.add_argument("--spec-k", type=int,
                   help="speculative draft tokens per step (the model's MTP layers, or "
                        "--spec-draft's model); default: no speculation")
    e.add_argument("--spec-draft", default=None, metavar="MODEL",
                   help="draft model (a catalog name) for --spec-k instead of MTP layers")
    e.add_argument("--spec-acceptance", type=float,
                   help="with --spec-k: per-token acceptance rate, 0 to 1 (default 0.7)")
    o = parser.add_argument_group("output")
    o.add_argument("--json", help="write the ServingReport as JSON to this file")
    o.add_argument("--requests-parquet",
                   help="write per-request results (times in s) to this Parquet file")
    o.add_argument("--chrome-trace", help="write the iterations as a Chrome trace to this file")
    o.add_argument("--no-progress", action="store_true",
                   help="no progress bar (it is shown only when stderr is a terminal)")


def _load_file(path: str) -> dict[str, Any]:
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"`--config` file {path!r} does not exist")
    text = p.read_text()
    if p.suffix == ".json":
        data = json.loads(text)
    else:
        import yaml

        data = yaml.safe_load(text) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: must hold a mapping of ServingConfig fields")
    return data


def build_inputs(args: argparse.Namespace, model: Any, cluster: Any) -> tuple[Any, Any, str]:
    """(ServingConfig, WorkloadSpec, a line naming the engine defaults applied or "") from
    ``--config`` plus the flags, for ``model`` (a ``ModelSpec``) on ``cluster`` (a
    ``ClusterSpec``)."""
    from charon_search.catalog.spec import is_linear_block
    from charon_search.serving import SpeculativeConfig, WorkloadSpec
    from charon_search.serving.config import parse_disagg
    from charon_search.serving.engine_defaults import describe, engine_serving_config

    data = _load_file(args.config) if args.config else {}
    wl_data = data.pop("workload", None) or {}
    if not isinstance(wl_data, dict):
        raise ConfigError(f"{args.config}: `workload` must be a mapping of WorkloadSpec fields, "
                          f"but got {wl_data!r}")
    wl_data = dict(wl_data)
    version = str(args.engine_version or data.pop("engine_version", "") or "")
    if version:
        from charon_search.serving.backends import release
        from charon_search.serving.engine_defaults import LATEST_RELEASES

        if not release(version):  # a name would silently stand for the oldest release
            flag = "--engine-version" if args.engine_version else "engine_version"
            newest = ", ".join(f"{k} {v}" for k, v in sorted(LATEST_RELEASES.items()))
            raise ConfigError(f"`{flag}` must be a release number (newest shipped: {newest}), "
                              f"but got {version!r}")
    flags = {
        "tp": args.tp, "pp": args.pp, "ep": args.ep, "dp": args.dp, "sp": args.sp,
        "dynamic_sp": args.dynamic_sp, "engine": args.engine, "scheduler": args.scheduler,
        "max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_batched_tokens,
        "chunked_prefill": args.chunked_prefill, "prefix_caching": args.prefix_caching,
        "precision": args.precision, "kv_dtype": args.kv_dtype,
        "fused_kernels": args.fused_kernels,
        "gpu_memory_utilization": args.memory_fraction,
    }
    data.update({k: v for k, v in flags.items() if v is not None})
    if args.disagg:
        given = [f"--{k}" for k in ("tp", "pp", "dp") if getattr(args, k) is not None]
        if given:
            raise ConfigError(f"`--disagg` gives each pool its own degrees (e.g. "
                              f"prefill=2xTP2,decode=1xTP4PP2), but got {', '.join(given)} too")
        data["disagg"] = parse_disagg(args.disagg, args.kv_transfer or "rdma")
    elif args.kv_transfer:
        raise ConfigError("`--kv-transfer` needs `--disagg`")
    if (args.spec_acceptance is not None or args.spec_draft) and args.spec_k is None:
        raise ConfigError("`--spec-acceptance` and `--spec-draft` need `--spec-k K` "
                          "(speculative draft tokens)")
    if args.spec_k is not None:
        if args.spec_k < 1:
            raise ConfigError(f"`--spec-k` must be >= 1 draft tokens (leave it out for no "
                              f"speculation), but got {args.spec_k}")
        data["speculative"] = SpeculativeConfig(
            num_draft_tokens=args.spec_k,
            acceptance_rate=0.7 if args.spec_acceptance is None else args.spec_acceptance,
            method="draft" if args.spec_draft else "mtp", draft_model=args.spec_draft or "")
    kind = args.workload or wl_data.get("arrival") or "poisson"
    if kind not in ARRIVAL_KINDS:
        wl_data["arrival"] = "trace"
        wl_data["trace_path"] = kind
        wl_data.setdefault("num_requests", 0)
    else:
        wl_data["arrival"] = kind
    for flag, value, kinds in (("--concurrency", args.concurrency, ("concurrency",)),
                               ("--ramp-up", args.ramp_up_s, ("concurrency",)),
                               ("--rate", args.rate, ("poisson", "gamma")),
                               ("--cv", args.cv, ("gamma",)),
                               # a trace file fixes arrivals and lengths
                               *((flag, value, ("poisson", "gamma", "concurrency", "burst"))
                                 for flag, value in (("--input-len", args.input_len),
                                                     ("--output-len", args.output_len),
                                                     ("--seed", args.seed),
                                                     ("--prompt-pool", args.prompt_pool)))):
        if value is not None and wl_data["arrival"] not in kinds:
            raise ConfigError(f"`{flag}` applies to a {' or '.join(kinds)} workload, but the "
                              f"workload is {'the trace ' if kind not in ARRIVAL_KINDS else ''}"
                              f"{kind!r}")
    wl_flags = {"rate_per_s": args.rate, "cv": args.cv, "num_requests": args.num_requests,
                "input_len": args.input_len, "output_len": args.output_len,
                "concurrency": args.concurrency, "seed": args.seed,
                "ramp_up_s": args.ramp_up_s}
    wl_data.update({k: v for k, v in wl_flags.items() if v is not None})
    if args.prompt_pool is not None:
        isl = wl_data.get("input_len", 1024)
        if args.prompt_pool < 1 or not isinstance(isl, int):
            raise ConfigError(f"`--prompt-pool` needs N >= 1 and a fixed `--input-len`, but got "
                              f"(prompt_pool={args.prompt_pool}, input_len={isl!r})")
        wl_data.update(shared_prefix_tokens=isl, num_prefixes=args.prompt_pool)
    try:
        workload = WorkloadSpec.from_dict(wl_data)  # unknown keys first: `concurency: 4`
    except ConfigError as e:
        raise ConfigError(with_flags(str(e), _WORKLOAD_FLAGS, "serve")) from None
    if kind == "concurrency" and "concurrency" not in wl_data:
        raise ConfigError("`--workload concurrency` needs `--concurrency N`")
    config, profile = engine_serving_config(
        data, gpu=cluster.gpu.name, where=args.config or "serve flags", version=version,
        prompt_tokens=[r.prompt_tokens for r in workload.generate()] if data.get("engine")
        else [], linear_attention=any(is_linear_block(t) for t in model.layer_types))
    _check_gpus(config, cluster)
    return config, workload, describe(config, profile, version) if profile else ""


#: `--workload` values that are arrival processes (anything else is a trace file).
ARRIVAL_KINDS = ("poisson", "gamma", "concurrency", "burst", "trace")


def _check_gpus(config: Any, cluster: Any) -> None:
    """The GPUs a configuration deploys fit its cluster (a disaggregated pool placed on a
    cluster of its own, ``@name``, is checked against that one)."""
    from charon_search.hardware import load_cluster

    if config.disagg is None:
        needs = [(cluster, config.num_gpus, f"tp*pp*sp*dp = {config.num_gpus}")]
    else:
        needs = []
        for name in ("prefill", "decode"):
            pool = getattr(config.disagg, name)
            gpus = pool.num_replicas * pool.gpus_per_replica
            needs.append((load_cluster(pool.cluster) if pool.cluster else cluster, gpus,
                          f"{name} {pool.num_replicas}x{pool.gpus_per_replica} = {gpus}"))
        home = [n for n in needs if n[0] is cluster]
        if len(home) == 2:
            needs = [(cluster, home[0][1] + home[1][1], f"{home[0][2]} + {home[1][2]}")]
    for cl, gpus, what in needs:
        if gpus > cl.num_gpus:
            raise ConfigError(f"the configuration needs more GPUs than cluster {cl.name!r} "
                              f"holds: {what} > {cl.num_gpus}")


def _generic_engine_hint(config: Any, cluster: Any) -> str:
    """A note for a run without ``--engine`` on a cluster (``ClusterSpec``) that calibrates
    per-engine host times: none of them applied ("" when there is nothing to say)."""
    if config.engine:
        return ""
    from charon_search.hardware.spec import ENGINE_KEYED_TIMES

    cal = cluster.calibration
    engines = sorted({e for name in ENGINE_KEYED_TIMES for e in getattr(cal, name)
                      if e in SERVING_ENGINES})
    if not engines:
        return ""
    return (f"note: a generic engine; the host times this cluster calibrates for "
            f"{', '.join(engines)} (front end, streaming, prompt iterations, disaggregated "
            f"hand-over) apply with --engine {'|'.join(engines)}")


def run(args: argparse.Namespace) -> int:
    from charon_search.catalog import load_model
    from charon_search.hardware import load_cluster
    from charon_search.serving import simulate_serving

    prepare_outputs(args, {"--json": "json", "--requests-parquet": "requests_parquet",
                           "--chrome-trace": "chrome_trace"},
                    inputs={"--config": "config", "--workload": "workload"})
    # Once each: the inputs, the simulation and the notes below read them.
    model, cluster = load_model(args.model), load_cluster(args.cluster)
    config, workload, defaults = build_inputs(args, model, cluster)
    if defaults:
        print(defaults, file=sys.stderr)
    report = simulate_serving(
        model, cluster, config, workload,
        keep_requests=bool(args.requests_parquet), chrome_trace=args.chrome_trace,
        progress=not args.no_progress and sys.stderr.isatty())
    print(report.summary(), flush=True)
    from charon_search.serving.backends import memory_knob

    kv = report.config.get("kv_dtype", config.kv_dtype)  # ``auto`` resolved by the simulation
    print(f"KV cache {report.kv_capacity_tokens:,} tokens per "
          + (f"decode replica ({kv})" if config.disagg is not None else
             f"replica ({kv}, {memory_knob(config, cluster.gpu)})"), flush=True)
    from charon_search.validation.bands import serving_band_lines

    try:
        band = serving_band_lines(report.ttft_s["mean"], report.tpot_s["mean"],
                                  engine=config.engine,
                                  mode="disagg" if config.disagg is not None else "agg")
    except ConfigError as e:  # a damaged bands file must not cost the finished simulation
        band = []
        print(f"warning: no validated error band: {e}", file=sys.stderr)
    if band:
        print("\n".join(band), flush=True)
    hint = _generic_engine_hint(config, cluster)
    if hint:
        print(hint, file=sys.stderr)
    if args.json:
        report.to_json(args.json)
        print(f"wrote {args.json}")
    if args.requests_parquet:
        report.write_requests_parquet(args.requests_parquet)
        print(f"wrote {args.requests_parquet}")
    if args.chrome_trace:
        print(f"wrote {args.chrome_trace}")
    return 0
