"""Training memory per pipeline stage: ``memory_report`` and the cheap ``fits`` check.

Peak allocated bytes of stage ``i`` =
static (parameters, gradients, optimizer states after TP/PP/EP and ZeRO; FSDP gathered buffers;
DDP bucket; communication buffers) + activations (saved bytes of the chunk micro-batches in
flight for the schedule, plus the worst transient of one block's forward or backward on top).
Reserved bytes follow the cluster's calibrated allocator model:
``reserved = allocated * allocator_reserved_factor + allocator_reserved_extra_bytes``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from charon_search.catalog.spec import ModelSpec
from charon_search.errors import ConfigError
from charon_search.hardware.spec import ClusterSpec
from charon_search.layout import Layout
from charon_search.memory.liveness import ShardingPoint
from charon_search.memory.profile import ModelMemoryProfile, model_profile
from charon_search.memory.schedule import in_flight_chunks
from charon_search.memory.static import STATE_RECIPES, StateRecipe, shard_states
from charon_search.units import MIB, format_bytes

__all__ = ["MemoryOptions", "MemoryReport", "StageMemory", "fits", "memory_report",
           "stage_layers"]

SELECTIVE_POLICIES = ("attention", "op")


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryOptions:
    """Modelling choices the ``Layout`` does not carry (framework conventions)."""

    recipe: str | StateRecipe | None = None
    """Bytes per parameter of params/grads/optimizer: a key of ``STATE_RECIPES`` or a recipe;
    ``None`` picks ``mixed`` for Adam and ``sgd`` for SGD."""
    selective_policy: str = "attention"
    """``attention``: Megatron selective recompute of the attention core; ``op``: torchtitan's
    per-op selective activation checkpointing (store every other mm and fused attention)."""
    fp8_saved_activations: bool | None = None
    """Keep FP8 copies of saved GEMM inputs under ``precision='fp8'`` (Transformer Engine does;
    torchao float8 saves the bf16 input). ``None``: True for fp8."""
    fsdp_prefetch_depth: int | None = None
    """ZeRO-3 layers gathered ahead of the one computing; ``None``: 1 if
    ``layout.fsdp_prefetch`` else 0."""
    expert_tp: bool = False
    """Shard expert weights over TP as well as EP (Megatron expert tensor parallelism)."""
    ddp_bucket_bytes: float = 25 * MIB
    """Gradient bucket of unsharded DDP (PyTorch ``bucket_cap_mb=25``)."""
    fsdp_no_sync_accumulation: bool | None = None
    """FSDP gradient sync disabled across micro-batches, so each stage accumulates *unsharded*
    gradients (in ``grad_bytes``, FSDP2's reduce dtype) until the last backward. PyTorch's
    pipelining does this for FSDP stages (``torch/distributed/pipelining/stage.py``,
    ``backward_maybe_with_nosync``: ``set_requires_gradient_sync(False)``). ``None``: on for an
    FSDP recipe with ``pp > 1``."""
    attn_impl: str | None = None
    """``sdpa`` or ``eager``; ``None``: ``sdpa`` with ``layout.fused_kernels`` else ``eager``."""

    @classmethod
    def for_framework(cls, framework: str | None, **overrides: Any) -> MemoryOptions:
        """Conventions of a training framework (``extra.framework`` of a validation record).

        * ``torchtitan``: FSDP2 state (fp32 sharded params/grads, AdamW m + v), per-op
          selective AC (``selective_ac_option = "op"``), torchao float8 saving bf16 inputs.
        * ``megatron`` / ``megatron-lm`` / ``nemo``: bf16 params with fp32 gradient buffers
          and the distributed optimizer's fp32 master + m + v; attention-core selective
          recompute; Transformer Engine FP8 copies of saved GEMM inputs.
        * anything else: the defaults (ZeRO-paper mixed precision, attention-core recompute).
        """
        name = (framework or "").lower()
        base: dict[str, Any] = {}
        if name == "torchtitan":
            base = {"recipe": "fsdp2", "selective_policy": "op", "fp8_saved_activations": False}
        elif name in ("megatron", "megatron-lm", "megatron-core", "nemo"):
            base = {"recipe": "megatron", "selective_policy": "attention",
                    "fp8_saved_activations": True}
        return cls(**{**base, **overrides})

    def __post_init__(self) -> None:
        if self.selective_policy not in SELECTIVE_POLICIES:
            raise ConfigError(f"`selective_policy` must be one of {list(SELECTIVE_POLICIES)}, "
                              f"but got {self.selective_policy!r}")
        if isinstance(self.recipe, str) and self.recipe not in STATE_RECIPES:
            raise ConfigError(f"`recipe` must be one of {sorted(STATE_RECIPES)}, "
                              f"but got {self.recipe!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class StageMemory:
    """Memory of one GPU of pipeline stage ``stage``."""

    stage: int
    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    """Peak activation bytes: saved micro-batches in flight plus one block's transient."""
    buffers_bytes: float
    """FSDP gathered parameters/gradients, DDP bucket and communication buffers."""
    peak_allocated_bytes: float
    peak_reserved_bytes: float
    in_flight: int = 1
    """Chunk micro-batches whose activations are held at the peak."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "params_bytes": self.params_bytes,
            "grads_bytes": self.grads_bytes,
            "optimizer_bytes": self.optimizer_bytes,
            "activations_bytes": self.activations_bytes,
            "buffers_bytes": self.buffers_bytes,
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "in_flight": self.in_flight,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryReport:
    """Per-stage memory of a training layout and whether it fits the device."""

    stages: tuple[StageMemory, ...]
    device_memory_bytes: float
    gpu_name: str
    assumptions: Mapping[str, Any] = field(default_factory=dict)

    @property
    def bottleneck_stage(self) -> int:
        return max(self.stages, key=lambda st: st.peak_reserved_bytes).stage

    @property
    def peak_allocated_bytes(self) -> float:
        return max(st.peak_allocated_bytes for st in self.stages)

    @property
    def peak_reserved_bytes(self) -> float:
        return max(st.peak_reserved_bytes for st in self.stages)

    @property
    def fits(self) -> bool:
        return self.peak_reserved_bytes <= self.device_memory_bytes

    @property
    def reason(self) -> str | None:
        if self.fits:
            return None
        st = self.stages[self.bottleneck_stage]
        return (f"stage {st.stage} needs {format_bytes(st.peak_reserved_bytes)}, "
                f"the {self.gpu_name} has {format_bytes(self.device_memory_bytes)}")

    def to_dict(self) -> dict[str, Any]:
        """The stable JSON shape of ``charon-search memory --json`` and ``StepReport.memory``."""
        return {
            "stages": [st.to_dict() for st in self.stages],
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "device_memory_bytes": self.device_memory_bytes,
            "bottleneck_stage": self.bottleneck_stage,
            "fits": self.fits,
            "reason": self.reason,
        }


# ---------------------------------------------------------------------------- layout helpers
@functools.lru_cache(maxsize=256)
def _stage_layers(layer_types: tuple[str, ...], pp: int, vpp: int) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple(x) for x in stage_layers(layer_types, pp, vpp))


def stage_layers(layer_types: tuple[str, ...], pp: int, vpp: int = 1) -> list[list[str]]:
    """Layer types held by each pipeline rank: ``pp * vpp`` contiguous chunks as even as
    possible (earlier chunks take the remainder), chunk ``j`` on rank ``j % pp``."""
    chunks = pp * vpp
    n = len(layer_types)
    base, extra = divmod(n, chunks)
    out: list[list[str]] = [[] for _ in range(pp)]
    start = 0
    for j in range(chunks):
        size = base + (1 if j < extra else 0)
        out[j % pp].extend(layer_types[start:start + size])
        start += size
    return out


def _resolve(model: ModelSpec | str, cluster: ClusterSpec | str) -> tuple[ModelSpec, ClusterSpec]:
    if isinstance(model, str):
        from charon_search.catalog import load_model

        model = load_model(model)
    if isinstance(cluster, str):
        from charon_search.hardware import load_cluster

        cluster = load_cluster(cluster)
    return model, cluster


def _layer_types(spec: ModelSpec) -> tuple[str, ...]:
    return spec.layer_types or ("dense",) * spec.num_layers


def memory_report(model: ModelSpec | str, layout: Layout, cluster: ClusterSpec | str, *,
                  options: MemoryOptions | None = None,
                  profile: ModelMemoryProfile | None = None) -> MemoryReport:
    """Per-stage memory of ``layout`` for ``model`` on ``cluster``'s GPU.

    Args:
        model: A ``ModelSpec`` or a catalog name.
        layout: The training layout (validated against the model; bad layouts raise
            ``ConfigError``, layouts that merely do not fit return ``fits == False``).
        cluster: A ``ClusterSpec`` or a cluster name (GPU capacity, allocator calibration).
        options: Framework conventions (state recipe, selective-recompute policy...).
        profile: A precomputed ``ModelMemoryProfile`` (else traced and cached).

    Returns:
        The report; ``to_dict()`` is the stable JSON shape.

    Example:
        >>> rep = memory_report("llama-3.1-8b", Layout(dp=8, zero_stage=3, micro_batch_size=1,
        ...                     global_batch_size=8, seq_len=8192), "h100-sxm-8gpu")
        >>> rep.fits, rep.reason  # doctest: +SKIP
    """
    spec, cl = _resolve(model, cluster)
    opts = options or MemoryOptions()
    layout.validate_for(spec)
    attn_impl = opts.attn_impl or ("sdpa" if layout.fused_kernels else "eager")
    prof = profile or model_profile(spec, phase="train", attn_impl=attn_impl)
    recipe = _recipe(opts, layout)
    cal = cl.calibration

    per_stage = _stage_layers(_layer_types(spec), layout.pp, layout.vpp)
    m = layout.num_micro_batches
    point = ShardingPoint(
        b=layout.micro_batch_size, s=layout.seq_len / layout.cp,
        c=layout.seq_len / layout.cp if layout.cp_algo == "ring" else layout.seq_len,
        tp=layout.tp, sequence_parallel=layout.sequence_parallel,
    )
    evals = _evaluate(prof, point)
    fp8_saved = (opts.fp8_saved_activations if opts.fp8_saved_activations is not None
                 else layout.precision == "fp8") and layout.precision == "fp8"

    dense_shards = (layout.hsdp_shard or layout.dp) * layout.cp
    expert_shards = max(1, layout.dp * layout.cp // layout.ep)
    prefetch = (opts.fsdp_prefetch_depth if opts.fsdp_prefetch_depth is not None
                else int(layout.fsdp_prefetch))
    no_sync = (opts.fsdp_no_sync_accumulation if opts.fsdp_no_sync_accumulation is not None
               else recipe.fsdp and layout.pp > 1)
    num_groups = sum(1 for d in (layout.tp, layout.cp, layout.dp, layout.ep, layout.pp) if d > 1)
    comm_buffers = cal.comm_buffer_bytes * num_groups

    stages = []
    for i, layers in enumerate(per_stage):
        # (block name, recompute mode) -> layers of that kind on this stage.
        groups: dict[tuple[str, str], int] = {}
        recompute_k = 0
        if layout.recompute == "full":
            recompute_k = layout.recompute_num_layers or len(layers)
        for j, name in enumerate(layers):
            mode = layout.recompute
            if mode == "full" and j >= recompute_k:
                mode = "none"
            groups[(name, mode)] = groups.get((name, mode), 0) + 1
        if i == 0:
            groups[("embedding", "none")] = 1
        if i == layout.pp - 1:
            groups[("lm_head", "none")] = 1
        # ---- parameters
        dense = expert = 0.0
        unit_max = 0.0
        for (name, _), count in groups.items():
            d, e = prof.params[name].local(tp=layout.tp, ep=layout.ep, expert_tp=opts.expert_tp)
            dense, expert = dense + count * d, expert + count * e
            unit_max = max(unit_max, d + e)
        if (i == layout.pp - 1 and layout.pp > 1 and spec.tie_word_embeddings
                and prof.params["lm_head"].tp == 0):
            tied, _ = prof.params["embedding"].local(tp=layout.tp, ep=1)
            dense += tied  # the last stage keeps its own copy of a tied embedding
        if layout.schedule == "dualpipe":
            dense, expert = 2 * dense, 2 * expert  # stage i and stage p-1-i on one device
        states = shard_states(dense_params=dense, expert_params=expert,
                              zero_stage=layout.zero_stage if layout.dp * layout.cp > 1 else 0,
                              dense_shards=dense_shards, expert_shards=expert_shards,
                              recipe=recipe)
        if no_sync and layout.dp * layout.cp > 1:
            # Unsharded accumulated gradients replace the sharded ones until the step.
            states = dataclasses.replace(
                states, grads_bytes=(dense + expert) * recipe.grad_bytes)
        buffers = comm_buffers
        if layout.zero_stage == 3 and dense_shards > 1:
            # Gathered weights of the unit computing plus those prefetched, and the unsharded
            # gradient of one unit before its reduce-scatter.
            buffers += unit_max * recipe.gathered_param_bytes * (1 + prefetch)
            buffers += unit_max * (recipe.gathered_param_bytes + recipe.reduce_buffer_bytes)
        elif layout.zero_stage == 2 and recipe.fsdp and dense_shards > 1:
            # Weights stay gathered (counted in params); one unit's gradients still pass
            # through the reduce-scatter buffer.
            buffers += unit_max * recipe.reduce_buffer_bytes
        elif layout.zero_stage <= 1 and layout.dp > 1:
            buffers += opts.ddp_bucket_bytes

        # ---- activations
        n_flight = in_flight_chunks(layout.schedule, pp=layout.pp, stage_idx=i,
                                    num_micro_batches=m, vpp=layout.vpp)
        saved_stage = 0.0
        extra = 0.0
        shared = 0.0  # attention mask / RoPE tables: one copy, referenced by every layer
        for (name, mode), count in groups.items():
            ev = evals.get(name)
            if ev is None:
                continue
            shared = max(shared, ev["shared_inputs"])
            kept = _kept(ev, mode, opts.selective_policy)
            # The timelines are in the traced dtype; FP8 copies shrink what is kept and what
            # the backward reads alike, so the transient on top is unchanged.
            extra = max(extra, _transient(ev, mode, opts.selective_policy, kept))
            if fp8_saved and (mode == "none" or (mode == "selective"
                                                 and opts.selective_policy == "attention")):
                kept -= 0.5 * ev["saved_gemm_input"]  # bf16 -> fp8 copies of GEMM inputs
            saved_stage += count * kept
        activations = n_flight * saved_stage / layout.vpp + extra + shared

        allocated = states.total_bytes + buffers + activations
        reserved = allocated * cal.allocator_reserved_factor + cal.allocator_reserved_extra_bytes
        stages.append(StageMemory(
            stage=i, params_bytes=states.params_bytes, grads_bytes=states.grads_bytes,
            optimizer_bytes=states.optimizer_bytes, activations_bytes=activations,
            buffers_bytes=buffers, peak_allocated_bytes=allocated, peak_reserved_bytes=reserved,
            in_flight=n_flight,
        ))
    return MemoryReport(
        stages=tuple(stages), device_memory_bytes=cl.gpu.hbm_capacity_bytes,
        gpu_name=cl.gpu.name,
        assumptions={"attn_impl": attn_impl, "recipe": _recipe_name(opts, layout),
                     "selective_policy": opts.selective_policy, "fp8_saved": fp8_saved,
                     "fsdp_prefetch_depth": prefetch, "fsdp_no_sync_accumulation": no_sync},
    )


_EVAL_CACHE: dict[tuple[int, ShardingPoint], tuple[ModelMemoryProfile, dict]] = {}


def _evaluate(prof: ModelMemoryProfile, point: ShardingPoint) -> dict[str, dict[str, float]]:
    """Block summaries at ``point``, memoised (the search revisits the same shapes)."""
    key = (id(prof), point)
    hit = _EVAL_CACHE.get(key)
    if hit is not None and hit[0] is prof:
        return hit[1]
    out = {name: blk.evaluate(point) for name, blk in prof.blocks.items()}
    if len(_EVAL_CACHE) > 4096:
        _EVAL_CACHE.clear()
    _EVAL_CACHE[key] = (prof, out)
    return out


def _kept(ev: Mapping[str, float], mode: str, policy: str) -> float:
    """Saved bytes one layer keeps between its forward and backward (traced dtype)."""
    if mode == "full":
        return ev["block_input"]
    if mode == "selective":
        if policy == "op":
            return ev["op_sac_saved"]
        return ev["selective_saved"]
    return ev["saved"]


def _transient(ev: Mapping[str, float], mode: str, policy: str, kept: float) -> float:
    """Bytes above the layer's kept activations at its forward or backward peak.

    The backward timeline holds the layer's full saved set (recomputed parts included), so its
    peak minus what the layer kept is what recompute brings back plus the gradients. Full or
    per-op recompute also re-runs the whole forward during the backward.
    """
    bwd = ev["bwd_peak"] - kept
    if mode == "full" or (mode == "selective" and policy == "op"):
        fwd = ev["fwd_peak"] - kept
    else:
        fwd = ev["fwd_peak"] - ev["saved"]
    return max(0.0, fwd, bwd)


def _recipe(opts: MemoryOptions, layout: Layout) -> StateRecipe:
    if isinstance(opts.recipe, StateRecipe):
        return opts.recipe
    return STATE_RECIPES[_recipe_name(opts, layout)]


def _recipe_name(opts: MemoryOptions, layout: Layout) -> str:
    if isinstance(opts.recipe, StateRecipe):
        return "custom"
    if opts.recipe is not None:
        return opts.recipe
    return "sgd" if layout.optimizer == "sgd" else "mixed"


def fits(model: ModelSpec | str, layout: Layout, cluster: ClusterSpec | str, *,
         options: MemoryOptions | None = None) -> tuple[bool, str | None]:
    """Whether ``layout`` fits the device: ``(True, None)`` or ``(False, reason)``.

    Never raises for a valid layout that is merely too big; the reason reads
    "stage 0 needs 93.4 GiB, the h100-sxm-80gb has 80.0 GiB".
    """
    rep = memory_report(model, layout, cluster, options=options)
    return rep.fits, rep.reason
