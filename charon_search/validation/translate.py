"""Record -> simulation case: model, cluster, ``Layout`` or ``ServingConfig`` + workload.

Every value the simulator needs but the record leaves ``null`` is filled with a stated assumption
(``Case.assumptions``); what the simulator cannot express raises ``Unexpressible`` with the
reason. Record architecture fields take precedence over the catalog (SCHEMA.md, ``model``): a
dense model whose stated shape differs from the catalog entry is simulated with the stated shape.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from charon_search.catalog.spec import is_linear_block, is_moe_block
from charon_search.errors import CharonError
from charon_search.validation import translate_training as _tt
from charon_search.validation.flops import ArchFacts
from charon_search.validation.names import (
    Unexpressible,
    choose_cluster,
    load_catalog_model,
    resolve_gpu,
    resolve_model_name,
)
from charon_search.validation.records import AIC_GAP_SOURCE, HGX_NODE_GPUS, Record

if TYPE_CHECKING:
    from charon_search.catalog.spec import ModelSpec
    from charon_search.hardware.spec import ClusterSpec
    from charon_search.layout import Layout

__all__ = ["ServingCase", "TrainingCase", "arch_facts", "framework_memory_options", "to_case"]

#: SGLang's disaggregated MoE deployments with attention data parallelism run expert
#: parallelism over the same ranks: every NVIDIA/srt-slurm SGLang DeepSeek recipe with
#: ``enable-dp-attention`` sets ``tp-size`` = ``dp-size`` = ``ep-size`` with DeepEP
#: (``recipes/gb200-fp8/1k1k/max-tpt.yaml``: 8/8/8 prefill, 32/32/32 decode; ``mid-curve``:
#: 8/8/8, 48/48/48), and InferenceX's master config "only includes fields actually needed
#: by the runner -- prefill/decode topology details are already encoded in each srt-slurm
#: recipe YAML", so its rows can carry ``moe_ep_size`` 1 beside attention DP.
SGLANG_DP_EP = ("SGLang DP-attention MoE pools run EP over the DP ranks: srt-slurm recipes "
                "set tp-size = dp-size = ep-size (DeepEP); the row's moe_ep_size 1 is the "
                "runner config's default")

#: Measured serving requests simulated per silicon row (after the warm-up): enough turns of the
#: concurrency for the closed loop to settle, capped to keep the full validation cheap. aiperf
#: measures 50 turns after its warm-up; later turns repeat the pattern of the first. InferenceX
#: measures 10 turns from an idle start: every turn is simulated (up to ``MAX_REQUESTS``, or
#: ``TURNS`` waves when the concurrency is larger).
MIN_REQUESTS = 16
TURNS = 2
MAX_REQUESTS = 1024
#: Offline max-throughput records (TRT-LLM perf overview): requests submitted at once.
OFFLINE_REQUESTS = 1024


@dataclass(frozen=True, kw_only=True)
class TrainingCase:
    record: Record
    model: ModelSpec
    cluster: ClusterSpec
    cluster_how: str
    layout: Layout
    arch: ArchFacts
    assumptions: tuple[str, ...] = ()
    memory_options: Any = None
    """``memory.MemoryOptions`` of the record's framework (``None``: the memory defaults)."""


@dataclass(frozen=True, kw_only=True)
class ServingCase:
    record: Record
    model: ModelSpec
    cluster: ClusterSpec
    cluster_how: str
    config: Any
    """``serving.config.ServingConfig``."""
    workload: Any
    """``serving.workload.WorkloadSpec``."""
    num_gpus: int
    assumptions: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------------- model
_HF_KEYS: dict[str, dict[str, str | None]] = {  # ModelSpec field -> HF config key, per family
    "llama": {"num_layers": "num_hidden_layers", "hidden_size": "hidden_size",
              "num_attention_heads": "num_attention_heads",
              "num_key_value_heads": "num_key_value_heads",
              "intermediate_size": "intermediate_size", "vocab_size": "vocab_size"},
    "gpt2": {"num_layers": "n_layer", "hidden_size": "n_embd",
             "num_attention_heads": "n_head", "num_key_value_heads": None,
             "intermediate_size": "n_inner", "vocab_size": "vocab_size"},
}


def _synthesized(record: Record, why: Unexpressible, assumptions: list[str]) -> ModelSpec:
    """A GPT-2-style spec built from a dense record's stated architecture (no catalog entry)."""
    m = record.model
    need = ("num_layers", "hidden_size", "num_attention_heads", "vocab_size")
    if m.get("arch") != "dense" or any(m.get(k) is None for k in need):
        raise why
    if m.get("num_key_value_heads") not in (None, m["num_attention_heads"]):
        raise why  # GPT-2 blocks are multi-head; GQA shapes need a catalog entry
    h = int(m["hidden_size"])
    ffn = int(m.get("intermediate_size") or 4 * h)
    seq = int(record.config.get("seq_len") or 2048)
    cfg = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
           "n_layer": int(m["num_layers"]), "n_embd": h, "n_head": int(m["num_attention_heads"]),
           "n_inner": ffn, "n_positions": seq, "vocab_size": int(m["vocab_size"]),
           "activation_function": "gelu_new", "tie_word_embeddings": True,
           "_charon_source": f"synthesized by charon-search validate from record {record.id}"}
    try:
        from charon_search.catalog import spec_from_config
    except ImportError as e:
        raise why from e
    name = str(m.get("catalog") or record.id)
    try:
        spec = _synth_cache(name, json.dumps(cfg, sort_keys=True), spec_from_config)
    except CharonError as e:
        raise Unexpressible(f"{why}; synthesizing a GPT block failed: {e}") from e
    assumptions.append(
        f"{name!r} is not in the catalog: simulated as a GPT-2-style dense block built from the "
        f"record (layers {m['num_layers']}, hidden {h}, heads {m['num_attention_heads']}, "
        f"ffn {ffn}, vocab {m['vocab_size']}; LayerNorm + GELU MLP)"
    )
    return spec


_SYNTH: dict[tuple[str, str], Any] = {}


def _synth_cache(name: str, blob: str, build: Any) -> ModelSpec:
    key = (name, blob)
    if key not in _SYNTH:
        _SYNTH[key] = build(name, json.loads(blob))
    return _SYNTH[key]


def _model_for(record: Record, assumptions: list[str]) -> ModelSpec:
    name = record.model.get("catalog") or record.model.get("name")
    try:
        cat = resolve_model_name(str(name) if name else None)
    except Unexpressible as why:
        if record.origin != "published":
            raise
        return _synthesized(record, why, assumptions)
    spec = load_catalog_model(cat)
    if cat != name:
        assumptions.append(f"model {name!r} simulated as catalog {cat!r}")
    if record.origin != "published":
        return spec
    diffs = {}
    for k in ("num_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
              "intermediate_size", "vocab_size", "num_experts", "num_experts_per_token"):
        v = record.model.get(k)
        if v is None:
            continue
        have = getattr(spec, k)
        if k == "intermediate_size" and spec.is_moe:
            continue  # MoE per-expert size lives in extra.moe_intermediate_size
        if v != have:
            diffs[k] = (have, v)
    if not diffs:
        return spec
    return _patched(spec, {k: v[1] for k, v in diffs.items()}, record, assumptions)


def _patched(spec: ModelSpec, changes: dict[str, int], record: Record,
             assumptions: list[str]) -> ModelSpec:
    family = "gpt2" if "n_layer" in spec.hf_config else "llama"
    keys: dict[str, str | None] = _HF_KEYS[family]
    if spec.is_moe or any(k not in keys for k in changes):
        raise Unexpressible(
            f"record architecture differs from catalog {spec.name!r} in "
            f"{sorted(changes)} and the catalog entry cannot be re-shaped"
        )
    hf = dict(spec.hf_config)
    for k, v in changes.items():
        if keys[k] is None:
            if v != spec.num_attention_heads:
                raise Unexpressible(f"catalog {spec.name!r} has no GQA key for {k}={v}")
            continue
        hf[str(keys[k])] = v
    tag = hashlib.sha1(json.dumps(changes, sort_keys=True).encode()).hexdigest()[:8]
    try:
        from charon_search.catalog import spec_from_config

        new = _synth_cache(f"{spec.name}~{tag}", json.dumps(hf, sort_keys=True),
                           spec_from_config)
    except (ImportError, CharonError) as e:
        raise Unexpressible(f"re-shaping catalog {spec.name!r} failed: {e}") from e
    assumptions.append(
        "record architecture overrides catalog " + spec.name + ": "
        + ", ".join(f"{k}={v}" for k, v in sorted(changes.items()))
    )
    return new


def arch_facts(record: Record, spec: ModelSpec) -> ArchFacts:
    """Architecture numbers for the FLOP conventions: record fields over the catalog."""
    m, x = record.model, dict(record.model.get("extra") or {})
    ex = dict(spec.extra or {})

    def pick(key: str, default: Any) -> Any:
        v = m.get(key)
        return default if v is None else v

    heads = int(pick("num_attention_heads", spec.num_attention_heads))
    hidden = int(pick("hidden_size", spec.hidden_size))
    params = m.get("params") or spec.num_params
    if not params:
        raise Unexpressible(f"parameter count of {spec.name} unknown (record and catalog)")
    mla = spec.attention == "mla"
    head_dim = int(x.get("head_dim") or spec.head_dim or hidden // heads)
    return ArchFacts(
        num_layers=int(pick("num_layers", spec.num_layers)), hidden_size=hidden,
        vocab_size=int(pick("vocab_size", spec.vocab_size)), num_attention_heads=heads,
        num_key_value_heads=int(pick("num_key_value_heads", spec.num_key_value_heads)),
        head_dim=head_dim,
        intermediate_size=int(spec.intermediate_size if spec.is_moe
                              else pick("intermediate_size", spec.intermediate_size)),
        gated_mlp=bool(spec.gated_mlp), params=float(params),
        num_experts=int(pick("num_experts", spec.num_experts) or 0),
        num_experts_per_token=int(pick("num_experts_per_token", spec.num_experts_per_token) or 0),
        moe_intermediate_size=int(x.get("moe_intermediate_size") or spec.moe_intermediate_size),
        num_shared_experts=int(x.get("n_shared_experts") or spec.num_shared_experts),
        num_dense_layers=sum(1 for t in spec.layer_types if not is_moe_block(t)) if spec.is_moe
        else int(pick("num_layers", spec.num_layers)),
        mla=mla, q_lora_rank=int(x.get("q_lora_rank") or ex.get("q_lora_rank") or 0),
        kv_lora_rank=int(x.get("kv_lora_rank") or ex.get("kv_lora_rank") or 0),
        qk_nope_head_dim=int(ex.get("qk_nope_head_dim") or 0),
        qk_rope_head_dim=int(x.get("qk_rope_head_dim") or ex.get("qk_rope_head_dim") or 0),
        v_head_dim=int(spec.v_head_dim or head_dim),
    )


# ----------------------------------------------------------------------------- training
def _training_case(record: Record) -> TrainingCase:
    from charon_search.errors import ConfigError
    from charon_search.layout import Layout

    t = dict(record.config)
    ex = dict(t.get("extra") or {})
    notes: list[str] = []
    if any(t[k] is None for k in ("tp", "pp", "dp", "cp")):
        raise Unexpressible("parallel layout not stated (tp/pp/dp/cp null)")
    if t["seq_len"] is None:
        raise Unexpressible("sequence length not stated")
    tp, pp, dp, cp, ep = (int(t[k]) for k in ("tp", "pp", "dp", "cp", "ep"))
    num_gpus = int(record.hardware["num_gpus"])
    if tp * pp * dp * cp != num_gpus:
        raise Unexpressible(f"stated degrees tp*pp*dp*cp={tp * pp * dp * cp} do not match "
                            f"num_gpus={num_gpus} (as printed by the source)")
    model = _model_for(record, notes)

    def assume(key: str, value: Any, why: str) -> Any:
        notes.append(f"training.{key} = {value!r} assumed ({why})")
        return value

    schedule = t["schedule"]
    vpp = t["vpp"]
    if pp == 1:
        schedule = "none"
    elif schedule is None:
        schedule = assume("schedule", "interleaved-1f1b" if vpp else "1f1b",
                          "not stated; Megatron default")
    if schedule == "interleaved-1f1b" and vpp is None:
        layers = model.num_layers
        vpp = next((v for v in (2, 3, 4) if layers % (pp * v) == 0), 2)
        assume("vpp", vpp, "interleaved schedule without a stated virtual-stage count")
    mbs = t["micro_batch_size"]
    local = ex.get("local_batch_size") or ex.get("batch_size_per_dp")
    if mbs is None:
        mbs = assume("micro_batch_size", 1, "not stated; 1 is the Megatron/torchtitan PP "
                     "default")
    gbs = t["global_batch_size"]
    if gbs is None:
        if local:
            gbs = assume("global_batch_size", int(local) * dp, "per-DP batch x dp")
        else:
            gbs = assume("global_batch_size", mbs * dp * (4 * pp if pp > 1 else 1),
                         "not stated; 4 x pp micro-batches per DP rank" if pp > 1 else
                         "not stated; one micro-batch per DP rank (no pipeline)")
    sp = t["sequence_parallel"]
    if sp is None:
        sp = assume("sequence_parallel", tp > 1, "not stated; on with TP as in Megatron/"
                    "torchtitan")
    zero = t["zero_stage"]
    if zero is None:
        zero = assume("zero_stage", 1 if dp > 1 else 0, "not stated; distributed optimizer")
    recompute = t["recompute"]
    if recompute is None:
        recompute = assume("recompute", "none", "not stated")
    precision = t["precision"]
    if precision is None:
        precision = assume("precision", "bf16", "not stated; fp16 and bf16 have the same "
                           "tensor-core rate")
    if precision == "mxfp8":
        precision = "fp8"
        notes.append("training.precision mxfp8 simulated as fp8 (block-scaled GEMMs at the fp8 "
                     "tensor-core rate)")
    async_tp = t["async_tp"]
    if async_tp is None:
        async_tp = assume("async_tp", False, "not stated")
    fused = True
    if ex.get("framework") == "torchtitan" and ex.get("torch_compile") is False:
        fused = False
        notes.append("torchtitan without torch.compile: norm/SwiGLU/RoPE kernels unfused")
    cp_algo = "allgather" if "all-gather" in str(ex.get("cp_impl", "")) else "ring"
    kw: dict[str, Any] = dict(
        tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, vpp=int(vpp or 1), sequence_parallel=bool(sp),
        zero_stage=int(zero), schedule=schedule, micro_batch_size=int(mbs),
        global_batch_size=int(gbs), seq_len=int(t["seq_len"]), recompute=recompute,
        precision=precision, async_tp=bool(async_tp), cp_algo=cp_algo, fused_kernels=fused,
    )
    kw.update(_tt.framework_facts(record, t, ex, notes))
    kernel = _tt.attention_kernel(record, ex, model)
    if kernel is not None and kw.get("attention_kernel", "flash") == "flash":
        kw["attention_kernel"] = kernel[0]
        notes.append(f"attention kernel {kernel[0]!r} ({kernel[1]})")
    try:
        layout = Layout(**kw)
        layout.validate_for(model, num_gpus)
    except ConfigError as e:
        raise Unexpressible(f"layout not expressible: {e}") from e
    choice = choose_cluster(record, num_gpus)
    return TrainingCase(record=record, model=model, cluster=choice.cluster,
                        cluster_how=choice.how, layout=layout, arch=arch_facts(record, model),
                        assumptions=tuple(notes),
                        memory_options=framework_memory_options(ex, layout))


def framework_memory_options(ex: Mapping[str, Any], layout: Layout) -> Any:
    """``MemoryOptions.for_framework`` of the record's framework, matched to the layout.

    torchtitan's loss: DTensor ``loss_parallel`` whenever TP is on (its default, the
    ``disable_loss_parallel`` flag is off), the Inductor-compiled loss for compiled runs from
    2025, else eager ``cross_entropy`` on fp32 logits.
    """
    try:
        from charon_search.memory.report import MemoryOptions, torchtitan_loss_impl
    except ImportError:
        return None
    fw = _tt.framework(ex).lower()
    name = ("megatron-core" if fw.startswith("megatron-core")
            else "megatron-lm" if fw == "megatron-lm"
            else "torchtitan" if fw == "torchtitan" else fw)
    over: dict[str, Any] = {}
    if layout.attention_kernel == "eager":
        over["attn_impl"] = "eager"  # scores and dropout mask are saved activations
    if str(ex.get("selective_ac_option", "")).lower() == "op":
        over["selective_policy"] = "op"
    if name == "torchtitan":
        # the compiled loss is the layout's fused loss kernel (``framework_facts``)
        over["loss_impl"] = torchtitan_loss_impl(
            layout.tp, loss_parallel=not ex.get("disable_loss_parallel"),
            compiled_loss=layout.loss_kernel == "fused")
    return MemoryOptions.for_framework(name or None, **over)


# ----------------------------------------------------------------------------- serving
_PRECISION = {"bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "fp4": "fp4", "nvfp4": "fp4",
              "mxfp8": "fp8", "int4": "int4"}


def _serving_precision(raw: str | None, notes: list[str]) -> str:
    if not raw:
        notes.append("precision not in the row: bf16 assumed (unquantized checkpoint)")
        return "bf16"
    if raw not in _PRECISION:
        raise Unexpressible(f"unsupported feature: {raw} weight quantization not modelled")
    return _PRECISION[raw]


def _serving_case(record: Record) -> ServingCase:
    from charon_search.errors import ConfigError
    from charon_search.serving._graphs import AUTO_KV_SOURCE
    from charon_search.serving.backends import (
        AIPERF_AIC,
        BACKENDS,
        INFERENCEX,
        engine_profile,
        inferencex_prompt_inflation,
        inferencex_spec_decoding_unknown,
    )
    from charon_search.serving.config import DisaggConfig, PoolConfig, ServingConfig
    from charon_search.serving.custom_allreduce import MNNVL_ENGINES
    from charon_search.serving.simulator import resolve_kv_dtype
    from charon_search.serving.workload import LengthDistribution, WorkloadSpec

    c = dict(record.config)
    ex = dict(c.get("extra") or {})
    notes: list[str] = []
    if c.get("input_len") is None or c.get("output_len") is None:
        raise Unexpressible("real traffic: input/output lengths not stated")
    if ex.get("pd_disaggregated") and ex.get("phase"):
        raise Unexpressible(f"one side ({ex['phase']}) of a production PD deployment with "
                            "unstated lengths")
    model = _model_for(record, notes)
    precision = _serving_precision(c.get("precision"), notes)
    kv_dtype = "fp8" if precision in ("fp8", "fp4") else "bf16"
    notes.append(f"KV cache {kv_dtype} assumed (follows the checkpoint precision)")
    isl, osl = int(c["input_len"]), int(c["output_len"])
    extra: dict[str, Any] = {}
    engine_kw: dict[str, Any] = {}
    if record.origin == "silicon":
        if (record.extra or {}).get("layout_note"):
            notes.append(str(record.extra["layout_note"]))
        conc = c.get("concurrency")
        if not conc:
            raise Unexpressible("closed-loop concurrency not in the row")
        conc = int(conc)
        workers = int(c.get("workers") or 1)
        if workers > 1:
            # A closed loop of identical streams spreads evenly over the router's workers:
            # each runs its share, and every request sees one worker.
            notes.append(f"{workers} aggregated workers behind the router (client concurrency "
                         f"{conc} = {workers} x the row's per-worker batch): one worker "
                         f"simulated at its {conc // workers} streams")
            conc //= workers
        max_seqs = max(conc, 1)
        backend = str((record.extra or {}).get("backend") or "")
        aic = AIC_GAP_SOURCE in (record.notes or "")  # else: an InferenceX dump
        inflation, inflation_why = 1.0, ""
        if not aic:
            facts = dict(backend=backend, model=str(record.model.get("name") or ""),
                         mode=str(c.get("mode", "agg")),
                         measured=str((record.extra or {}).get("measured_date") or ""))
            why = inferencex_spec_decoding_unknown(
                **facts, gpu=str(record.hardware.get("gpu") or ""),
                precision=str(c.get("precision") or ""), tp=int(c.get("tp") or 1),
                ep=int(c.get("ep") or 1))
            if why:
                raise Unexpressible(why)
            longer = inferencex_prompt_inflation(
                version=str(c.get("framework_version") or ""), **facts)
            if longer:
                inflation, inflation_why = longer
                notes.append(inflation_why)
        if backend in BACKENDS:
            # Disaggregated InferenceX rows ran Dynamo recipes whose flags we do not have: the
            # engine's own defaults apply there.
            launcher = ("aiconfigurator" if aic else "engine_defaults"
                        if c.get("mode", "agg") == "disagg" else "inferencex")
            prof = engine_profile(backend, isl=isl, max_batch_size=max_seqs,
                                  version=str(c.get("framework_version") or ""),
                                  launcher=launcher,
                                  osl=osl, tp=int(c.get("tp") or 1),
                                  model=str(record.model.get("name") or ""),
                                  gpu=resolve_gpu(str(record.hardware.get("gpu"))).name,
                                  attention_dp=(int(c.get("dp") or 1)
                                                if c.get("mode", "agg") != "disagg" else 1),
                                  precision=str(c.get("precision") or ""),
                                  linear_attention=any(is_linear_block(t)
                                                       for t in model.layer_types))
            engine_kw = prof.config_kwargs()
            notes.extend(f"{backend}: {line}" for line in prof.sources)
            notes.append(f"{backend}: TP all-reduces inside a node by the engine's custom NVLink "
                         "kernel (measured latency, serving.custom_allreduce)"
                         + ("; across the trays of an NVL72 domain by its MNNVL kernel, priced "
                            "from the HGX 8-GPU table of the same NVLink generation"
                            if backend in MNNVL_ENGINES else ""))
        # Waves from a synchronized start: see ``serving.backends.BenchmarkProtocol``.
        bench = AIPERF_AIC if aic else INFERENCEX
        # A drained warm-up leaves an idle engine: the measured phase is simulated from there.
        warm = 0 if bench.warmup_drains else bench.warmup_turns * conc
        nominal = bench.measured_turns * conc
        # After a warm-up the loop has settled and later turns repeat the first measured ones;
        # without one the mean holds the transient from the idle start: simulate every turn.
        settled = max(MIN_REQUESTS, TURNS * conc) if warm else nominal
        # At least TURNS waves even past MAX_REQUESTS: fewer requests than the concurrency
        # would run a lighter load than the benchmark's C streams.
        n = warm + min(nominal, settled, max(MAX_REQUESTS, TURNS * conc))
        # The benchmark keeps its C streams busy until its last turn; a simulation cut short
        # of that drains (no new arrivals) during its own last turn, whose requests then decode
        # without the prefills of their successors. One more turn is simulated when the run is
        # cut short: it stands for the benchmark's final, draining turn (see
        # ``predict._steady_state``) and keeps the load on the turns before it.
        drain = conc if n - warm < nominal else 0
        n += drain
        # The client's drawn lengths; prompts as the server tokenized them.
        lo_i, hi_i = (round(x * inflation) for x in bench.length_bounds(isl))
        lo_o, hi_o = bench.length_bounds(osl)
        lengths = [LengthDistribution(value=lo) if lo == hi else
                   LengthDistribution(kind="uniform", low=lo, high=hi)
                   for lo, hi in ((lo_i, hi_i), (lo_o, hi_o))]
        pool_kw: dict[str, Any] = {}
        if bench.prompt_pool and lo_i == hi_i:
            # Requests draw the pool's prompts in turn; a drained warm-up drew the first ones
            # (and left them cached), the simulated requests continue after it.
            drawn = bench.warmup_turns * conc if bench.warmup_drains else 0
            pool_kw = dict(shared_prefix_tokens=isl, num_prefixes=bench.prompt_pool,
                           prefix_offset=drawn % bench.prompt_pool,
                           cached_prefixes=min(drawn, bench.prompt_pool))
            caching = bool(engine_kw.get("prefix_caching"))
            notes.append(f"prompt pool of {bench.prompt_pool}: "
                         + ("the engine caches prefixes, so a repeated prompt is a cache hit "
                            f"and the {pool_kw['cached_prefixes']} warm-up prompts start "
                            "cached" if caching else
                            "no prefix caching in this launch: every prompt is prefilled"))
        workload = WorkloadSpec(arrival="concurrency", concurrency=conc, num_requests=n,
                                ramp_up_s=0.0, input_len=lengths[0], output_len=lengths[1],
                                seed=0, **pool_kw)
        extra["warmup_requests"] = warm
        extra["drain_requests"] = drain
        extra["measured_requests"] = nominal
        extra["concurrency"] = conc
        if inflation != 1.0:
            extra["prompt_scale"] = inflation
            extra["prompt_scale_why"] = inflation_why
        notes.extend(f"client ({bench.name}): {line}" for line in bench.sources)
        if bench.warmup_drains and bench.warmup_turns:
            notes.append(f"{bench.warmup_turns * conc} warm-up requests drained before the "
                         "measured phase (not simulated: it starts on an idle engine)")
        notes.append(f"closed loop: concurrency {conc} starting together, {warm} warm-up + "
                     f"{n - warm - drain} simulated of {nominal} measured requests"
                     + (f" + a draining turn of {drain}" if drain else "") + ", prompts "
                     f"{lo_i}..{hi_i} and outputs {lo_o}..{hi_o} tokens")
    else:
        max_seqs = int(c.get("max_batch_size") or 0) or 512
        n = OFFLINE_REQUESTS
        if _trtllm_bench(record, c):
            engine_kw, n = _perf_overview(record, model, c, isl, osl, precision, kv_dtype,
                                          notes)
            max_seqs = int(engine_kw["max_num_seqs"])
        elif not c.get("max_batch_size"):
            notes.append("max_num_seqs = 512 assumed (engine batch limit not stated)")
        workload = WorkloadSpec(arrival="burst", num_requests=n,
                                input_len=LengthDistribution(value=isl),
                                output_len=LengthDistribution(value=osl), seed=0)
        notes.append(f"offline throughput: {n} requests submitted at t=0")
    mode = c.get("mode", "agg")
    kw: dict[str, Any] = dict(precision=precision, kv_dtype=kv_dtype, max_num_seqs=max_seqs,
                              max_num_batched_tokens=max(8192, isl))
    kw.update(engine_kw)
    # A launch that passes no KV-cache dtype (``auto``) is resolved with the configuration.
    if engine_kw.get("kv_dtype") not in (None, "", "auto", kv_dtype):
        notes.append(f"KV cache {engine_kw['kv_dtype']} as the launch sets it, not the "
                     f"{kv_dtype} the checkpoint precision suggests")
    if mode == "disagg":
        pre, dec = c["prefill"], c["decode"]
        if not pre.get("num_workers") or not dec.get("num_workers"):
            raise Unexpressible("disaggregated row without prefill/decode worker counts")
        pools = {}
        backend = str((record.extra or {}).get("backend") or "")
        for name, p in (("prefill", pre), ("decode", dec)):
            adp = int(p.get("attention_dp_size") or 1)
            # TensorRT-LLM limits each attention-DP rank's own batch ("--max_batch_size: Max
            # batch size in each rank. --max_num_tokens: Max num tokens in each rank",
            # docs/source/blogs/Best_perf_practice_on_DeepSeek-R1_in_TensorRT-LLM.md); SGLang
            # divides its chunked-prefill size over the DP ranks (server_args.py).
            per_rank = backend == "trtllm" and adp > 1
            ep = int(p.get("moe_ep_size") or 1)
            if (backend == "sglang" and adp > 1 and ep == 1
                    and model.num_experts):
                ep = int(p["tp_size"]) * adp
                notes.append(f"{name} pool: EP {ep} = the attention-DP ranks ({SGLANG_DP_EP})")
            pools[name] = PoolConfig(
                num_replicas=int(p["num_workers"]), tp=int(p["tp_size"]) * adp,
                pp=int(p.get("pp_size") or 1), ep=ep,
                dp_attention=adp > 1,
                max_num_batched_tokens=adp * int(kw["max_num_batched_tokens"]) if per_rank else 0)
            if per_rank:
                notes.append(f"{name} pool: TensorRT-LLM token budget per attention-DP rank, "
                             f"x{adp} ranks per worker")
        kw["disagg"] = DisaggConfig(prefill=pools["prefill"], decode=pools["decode"])
        adps = [int(p.get("attention_dp_size") or 1) for p in (pre, dec)]
        if any(a > 1 for a in adps):
            kw["dp_attention"] = True  # per pool: PoolConfig.dp_attention
        num_gpus = sum(pl.num_replicas * pl.gpus_per_replica for pl in pools.values())
        per_node = max(pl.gpus_per_replica for pl in pools.values())
    else:
        tp, adp = int(c["tp"]), int(c.get("dp") or 1)
        if (record.origin == "silicon" and model.num_experts and tp * adp > HGX_NODE_GPUS
                and int(c.get("ep") or 1) == 1 and int(c.get("moe_tp") or 1) == tp * adp):
            # The 2026-04-06 InferenceX dump's GB200 "agg" rows of DeepSeek-R1 write tp_size
            # 12, 20, 24, 28, 36, 48, 52, 64 and 72 with MoE TP equal to it and no EP: most do
            # not divide the model's 128 attention heads, and no engine spreads a MoE over
            # that many GPUs without expert parallelism. The column is the deployment's GPU
            # count (workers x their degrees), not a launch's TP.
            raise Unexpressible(f"tp_size {tp * adp} with MoE TP {tp * adp} and no expert "
                                "parallelism: a deployment's GPU count, not a launch degree "
                                "(workers and their degrees not in the row)")
        if record.origin == "silicon":
            kw.update(tp=tp * adp, pp=int(c.get("pp") or 1), ep=int(c.get("ep") or 1),
                      dp_attention=adp > 1)
        else:  # schema serving: dp = replicas
            kw.update(tp=tp, pp=int(c.get("pp") or 1), ep=int(c.get("ep") or 1), dp=adp)
        num_gpus = int(record.hardware["num_gpus"])
        per_node = num_gpus // int(c.get("workers") or 1)
    try:
        config = ServingConfig(**kw)
        if config.kv_dtype == "auto":
            config = resolve_kv_dtype(model, config)
            notes.append(f"KV cache {config.kv_dtype}: {AUTO_KV_SOURCE}")
    except ConfigError as e:
        raise Unexpressible(f"serving config not expressible: {e}") from e
    choice = choose_cluster(record, per_node if mode != "disagg" else num_gpus)
    return ServingCase(record=record, model=model, cluster=choice.cluster,
                       cluster_how=choice.how, config=config, workload=workload,
                       num_gpus=num_gpus, assumptions=tuple(notes), extra=extra)


def _trtllm_bench(record: Record, c: Mapping[str, Any]) -> bool:
    """A TensorRT-LLM row measured by ``trtllm-bench throughput`` with the limits it picks
    itself (the perf overview: no max_batch_size in the record)."""
    return ("trtllm-bench" in record.source and "tensorrt-llm" in str(c.get("framework") or "")
            and not c.get("max_batch_size") and c.get("mode", "agg") != "disagg")


def _perf_overview(record: Record, model: ModelSpec, c: Mapping[str, Any], isl: int, osl: int,
                   precision: str, kv_dtype: str, notes: list[str]) -> tuple[dict[str, Any], int]:
    """Engine fields and request count of a ``trtllm-bench throughput`` row."""
    from charon_search.serving.trtllm_bench import perf_overview_engine, perf_overview_num_requests

    tp, pp = int(c.get("tp") or 1), int(c.get("pp") or 1)
    cluster = choose_cluster(record, tp * pp).cluster
    kw, lines = perf_overview_engine(model, cluster, tp=tp, pp=pp, isl=isl, osl=osl,
                                     precision=precision, kv_dtype=kv_dtype)
    notes.extend(f"trtllm-bench: {line}" for line in lines)
    n = perf_overview_num_requests(isl, osl)
    if n is None:
        n = OFFLINE_REQUESTS
        notes.append(f"{n} requests assumed (no $num_requests row for {isl}/{osl})")
    else:
        notes.append(f"{n} requests of exactly {isl}/{osl} tokens ($num_requests of the perf "
                     "overview)")
    return kw, n


_CASES: dict[str, TrainingCase | ServingCase | Unexpressible] = {}


def to_case(record: Record) -> TrainingCase | ServingCase:
    """Translate a record; raises ``Unexpressible`` with the reason when it cannot be.

    Results (and reasons) are memoized per record content, so calibration sweeps that simulate
    the same records many times translate each once.
    """
    # notes and extra: a silicon row's pipeline, engine and measurement date
    key = json.dumps([record.id, record.model, record.hardware, record.config, record.notes,
                      record.extra], sort_keys=True, default=str)
    if key not in _CASES:
        try:
            _CASES[key] = _to_case(record)
        except Unexpressible as e:
            _CASES[key] = e
    hit = _CASES[key]
    if isinstance(hit, Unexpressible):
        raise Unexpressible(str(hit))
    return hit


def _to_case(record: Record) -> TrainingCase | ServingCase:
    try:
        resolve_gpu(str(record.hardware.get("gpu")))  # hardware first: the most basic reason
        if record.kind == "training":
            return _training_case(record)
        return _serving_case(record)
    except ImportError as e:
        raise Unexpressible(f"simulator part not available: {e}") from e
    except CharonError as e:
        raise Unexpressible(f"{type(e).__name__}: {e}") from e
