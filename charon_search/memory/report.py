"""Training memory per pipeline stage: ``memory_report`` and the cheap ``fits`` check.

Peak allocated bytes of stage ``i`` = static (parameters, gradients, optimizer states after
TP/PP/EP and ZeRO) + the sharding buffers alive at the peak (FSDP gathered weights and
reduce-scatter copies, or the DDP bucket) + activations (saved bytes of the chunk micro-batches
in flight for the schedule, plus the transient of the block whose forward or backward peaks
highest: a layer, or the LM head with its loss).
Reserved bytes follow the cluster's calibrated allocator model:
``reserved = allocated * allocator_reserved_factor + allocator_reserved_extra_bytes``; NCCL's
communicator buffers lie outside the allocator and are added only for ``fits``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from charon_search.catalog.spec import ModelSpec
from charon_search.errors import ConfigError
from charon_search.hardware.spec import ClusterSpec
from charon_search.ir import DTYPE_BYTES
from charon_search.layout import Layout, as_layout, check_layout_on_cluster
from charon_search.memory.liveness import ShardingPoint
from charon_search.memory.profile import ModelMemoryProfile, model_profile
from charon_search.memory.schedule import in_flight_chunks
from charon_search.memory.static import STATE_RECIPES, StateRecipe, shard_states
from charon_search.units import MIB, format_bytes

__all__ = ["LOSS_IMPLS", "MemoryOptions", "MemoryReport", "StageMemory", "fits",
           "memory_report", "stage_layers", "torchtitan_loss_impl"]

SELECTIVE_POLICIES = ("attention", "op")

#: Peak memory of the loss in units of the fp32 logits ``F`` (tokens x local vocab x 4 B):
#: ``(kept until the backward, forward peak, backward peak)``.
#:
#: * ``eager``: ``cross_entropy(logits.float())`` as traced from the HF code: the fp32 copy and
#:   the log-softmax output live together in the forward (2F), the log-softmax output is kept
#:   (F), and ``nll_loss_backward`` + ``_log_softmax_backward_data`` hold three at once (3F).
#: * ``loss_parallel``: DTensor ``loss_parallel()`` on vocab-sharded logits (torchtitan with
#:   TP): its ``_log_softmax`` handler keeps input, shifted and ``exp`` (3F), and the fused
#:   NLL + log-softmax backward holds the saved output, a zeros buffer, ``exp`` and their sum
#:   (4F) (``torch/distributed/tensor/parallel/loss.py``, ``_log_softmax`` and
#:   ``_nll_loss_and_log_softmax_backward``).
#: * ``compiled``: Inductor-compiled cross entropy (torchtitan compiles the loss with the model
#:   from 2025, ``components/loss.py`` ``build_cross_entropy_loss``): it keeps the bf16 logits
#:   and a per-row log-sum-exp, and writes the bf16 gradient in one fused kernel (0.5F kept,
#:   1F at the backward).
#: * ``fused``: one cross-entropy kernel per direction on the bf16 logits
#:   (``Layout.loss_kernel = "fused"``: flash-attn's ``CrossEntropyLoss``, llm-foundry MPT's
#:   default): the forward keeps the bf16 logits and a per-row log-sum-exp, the backward writes
#:   the bf16 gradient beside them (0.5F kept, 1F at the backward), as the compiled loss.
#: * ``vocab_parallel``: Megatron's ``_VocabParallelCrossEntropy`` on ``output.float()``:
#:   ``exp``, the softmax and its gradient are computed in place in the fp32 copy (kept F; 1.5F
#:   while the bf16 logits or the bf16 gradient exist beside it).
LOSS_IMPLS: dict[str, tuple[float, float, float]] = {
    "eager": (1.0, 2.0, 3.0),
    "loss_parallel": (1.0, 3.0, 4.0),
    "compiled": (0.5, 0.5, 1.0),
    "fused": (0.5, 0.5, 1.0),
    "vocab_parallel": (1.0, 1.5, 1.5),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryOptions:
    """Modelling choices the ``Layout`` does not carry (framework conventions)."""

    recipe: str | StateRecipe | None = None
    """Bytes per parameter of params/grads/optimizer: a key of ``STATE_RECIPES`` or a recipe;
    ``None`` picks ``mixed`` for Adam and ``sgd`` for SGD."""
    selective_policy: str | None = None
    """``attention``: Megatron selective recompute of the attention core; ``op``: torchtitan's
    per-op selective activation checkpointing (store every other mm and fused attention);
    ``None``: the layout's ``selective_policy``, the one its compute cost is priced with."""
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
    FSDP recipe or ZeRO-2 with ``pp > 1`` (the step time then reduce-scatters once per step;
    ZeRO-2 without a pipeline reduce-scatters after every micro-batch instead)."""
    attn_impl: str | None = None
    """``sdpa`` or ``eager``; ``None``: ``eager`` when ``layout.attention_kernel == 'eager'``
    (scores, softmax and dropout mask are saved), else ``sdpa``."""
    compiled: bool | None = None
    """Blocks run under ``torch.compile``: AOT autograd's partitioner saves only what the
    backward reads, so per-op SAC keeps no must-save output that nothing reads (eager SAC caches
    them all). ``None``: ``layout.fused_kernels``."""
    loss_impl: str | None = None
    """How the cross entropy is computed: a key of ``LOSS_IMPLS``. ``None``: the layout's
    ``loss_kernel`` (``fused``, else ``eager``)."""
    fused_saved: bool = False
    """Norms and the gated activation run as fused kernels that save less than HF's eager code
    (Transformer Engine norm + GEMM modules, Megatron's ``bias_swiglu`` fusion): see
    ``BlockActivations.fused_delta``. Applies where a layer keeps its saved set (no recompute,
    attention-core recompute) and to the final norm."""
    sp_saves_gathered_inputs: bool = False
    """With sequence parallelism, autograd keeps the *all-gathered* input of each
    column-parallel GEMM for its weight gradient (DTensor ``ColwiseParallel`` after
    ``SequenceParallel``, torchtitan). Megatron keeps the sharded input and gathers it again in
    the backward (Korthikanti et al., arXiv 2205.05198, Sec. 4.2.2)."""

    @classmethod
    def for_framework(cls, framework: str | None, **overrides: Any) -> MemoryOptions:
        """Conventions of a training framework (``extra.framework`` of a validation record).

        * ``torchtitan``: FSDP2 state (fp32 sharded params/grads, AdamW m + v), per-op
          selective AC (``selective_ac_option = "op"``), torchao float8 saving bf16 inputs,
          DTensor TP keeping all-gathered GEMM inputs. The loss depends on the layout and the
          version (``loss_impl``: ``loss_parallel`` with TP, ``compiled`` from 2025).
        * ``megatron`` / ``megatron-lm`` / ``nemo``: bf16 params with fp32 gradient buffers
          and the distributed optimizer's fp32 master + m + v; attention-core selective
          recompute; Transformer Engine FP8 copies of saved GEMM inputs; fused norm and
          SwiGLU kernels; the in-place vocab-parallel cross entropy.
        * anything else: the defaults (ZeRO-paper mixed precision, attention-core recompute).
        """
        name = (framework or "").lower()
        base: dict[str, Any] = {}
        if name == "torchtitan":
            base = {"recipe": "fsdp2", "selective_policy": "op", "fp8_saved_activations": False,
                    "sp_saves_gathered_inputs": True}
        elif name in ("megatron", "megatron-lm", "megatron-core", "nemo"):
            base = {"recipe": "megatron", "selective_policy": "attention",
                    "fp8_saved_activations": True, "loss_impl": "vocab_parallel",
                    "fused_saved": True}
        return cls(**{**base, **overrides})

    def __post_init__(self) -> None:
        if self.selective_policy is not None and self.selective_policy not in SELECTIVE_POLICIES:
            raise ConfigError(f"`selective_policy` must be one of {list(SELECTIVE_POLICIES)}, "
                              f"but got {self.selective_policy!r}")
        if self.loss_impl is not None and self.loss_impl not in LOSS_IMPLS:
            raise ConfigError(f"`loss_impl` must be one of {list(LOSS_IMPLS)}, "
                              f"but got {self.loss_impl!r}")
        if isinstance(self.recipe, str) and self.recipe not in STATE_RECIPES:
            raise ConfigError(f"`recipe` must be one of {sorted(STATE_RECIPES)}, "
                              f"but got {self.recipe!r}")
        bucket = self.ddp_bucket_bytes
        if (isinstance(bucket, bool) or not isinstance(bucket, (int, float))
                or not math.isfinite(bucket) or bucket < 0):
            raise ConfigError(f"`ddp_bucket_bytes` must be a finite number >= 0, but got "
                              f"{bucket!r}")
        depth = self.fsdp_prefetch_depth
        if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int)
                                  or depth < 0):
            raise ConfigError(f"`fsdp_prefetch_depth` must be None or an integer >= 0, but "
                              f"got {depth!r}")


def torchtitan_loss_impl(tp: int, *, loss_parallel: bool = True,
                         compiled_loss: bool = False) -> str:
    """``MemoryOptions.loss_impl`` of a torchtitan run.

    DTensor ``loss_parallel`` whenever TP is on (torchtitan's default; ``loss_parallel=False``
    for ``disable_loss_parallel``), else the Inductor-compiled loss when the run compiles it
    (torchtitan from 2025), else eager ``cross_entropy`` on fp32 logits.
    """
    if tp > 1 and loss_parallel:
        return "loss_parallel"
    return "compiled" if compiled_loss else "eager"


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
    """FSDP gathered parameters/gradients and reduce-scatter copies, or the DDP bucket, at the
    peak (NCCL's own buffers are in ``device_overhead_bytes``)."""
    peak_allocated_bytes: float
    peak_reserved_bytes: float
    in_flight: int = 1
    """Chunk micro-batches whose activations are held at the peak."""
    saved_activations_bytes: float = 0.0
    """The part of ``activations_bytes`` the in-flight micro-batches keep between forward and
    backward (no transient): the quantity of Korthikanti et al.'s closed forms."""
    device_overhead_bytes: float = 0.0
    """Device memory outside the caching allocator: NCCL communicator buffers (the cluster's
    ``comm_buffer_bytes`` per process group). Not in ``peak_reserved_bytes`` (which is what
    ``torch.cuda.max_memory_reserved`` reports), but counted by ``fits``."""

    @property
    def peak_device_bytes(self) -> float:
        """Reserved plus the memory outside the allocator: what must fit the device."""
        return self.peak_reserved_bytes + self.device_overhead_bytes

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
            "saved_activations_bytes": self.saved_activations_bytes,
            "device_overhead_bytes": self.device_overhead_bytes,
            "peak_device_bytes": self.peak_device_bytes,
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
        return max(self.stages, key=lambda st: st.peak_device_bytes).stage

    @property
    def peak_allocated_bytes(self) -> float:
        return max(st.peak_allocated_bytes for st in self.stages)

    @property
    def peak_reserved_bytes(self) -> float:
        return max(st.peak_reserved_bytes for st in self.stages)

    @property
    def peak_device_bytes(self) -> float:
        """Reserved plus NCCL buffers on the bottleneck stage (what ``fits`` compares)."""
        return max(st.peak_device_bytes for st in self.stages)

    @property
    def fits(self) -> bool:
        return self.peak_device_bytes <= self.device_memory_bytes

    @property
    def reason(self) -> str | None:
        if self.fits:
            return None
        st = self.stages[self.bottleneck_stage]
        return (f"stage {st.stage} needs {format_bytes(st.peak_device_bytes)}, "
                f"the {self.gpu_name} has {format_bytes(self.device_memory_bytes)}")

    def to_dict(self) -> dict[str, Any]:
        """The stable JSON shape of ``charon-search memory --json`` and ``StepReport.memory``."""
        return {
            "stages": [st.to_dict() for st in self.stages],
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "peak_device_bytes": self.peak_device_bytes,
            "device_memory_bytes": self.device_memory_bytes,
            "bottleneck_stage": self.bottleneck_stage,
            "fits": self.fits,
            "reason": self.reason,
        }


# ---------------------------------------------------------------------------- layout helpers
@functools.lru_cache(maxsize=256)
def _stage_layers(layer_types: tuple[str, ...], pp: int, vpp: int,
                  pp_layout: str = "") -> tuple[tuple[str, ...], ...]:
    return tuple(tuple(x) for x in stage_layers(layer_types, pp, vpp, pp_layout))


def stage_layers(layer_types: tuple[str, ...], pp: int, vpp: int = 1,
                 pp_layout: str = "") -> list[list[str]]:
    """Layer types held by each pipeline rank: the ``pp * vpp`` contiguous chunks of the step
    simulator's split, chunk ``j`` on rank ``j % pp``. With ``pp_layout`` (Megatron's explicit
    layout) the chunks are its stages (``training.step.layout_stage_layers``); else
    ``training.step.stage_layers``: as even as possible, the first and last chunk taking one
    layer fewer when it is uneven (torchtitan's ``generate_split_points`` gives the first stage
    the base count and the extra layers to the middle stages; the Llama 3 405B run put one layer
    fewer on the first and last stage)."""
    from charon_search.training.step import layout_stage_layers
    from charon_search.training.step import stage_layers as even_chunks

    chunks = (layout_stage_layers(tuple(layer_types), pp_layout) if pp_layout
              else even_chunks(tuple(layer_types), pp * vpp))
    out: list[list[str]] = [[] for _ in range(pp)]
    for j, part in enumerate(chunks):
        out[j % pp].extend(part)
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


def memory_report(model: ModelSpec | str, layout: Layout | Mapping[str, Any],
                  cluster: ClusterSpec | str, *,
                  options: MemoryOptions | None = None,
                  profile: ModelMemoryProfile | None = None) -> MemoryReport:
    """Per-stage memory of ``layout`` for ``model`` on ``cluster``'s GPU.

    Args:
        model: A ``ModelSpec`` or a catalog name.
        layout: The training layout, a ``Layout`` or a mapping of its fields (validated
            against the model with the step simulator's rules, ``training.step.
            validate_layout``: a layout ``simulate_training`` rejects raises ``ConfigError``
            here too; layouts that merely do not fit return ``fits == False``).
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
    # The simulator's rules (interleaving needs m % pp == 0, DualPipe an even pp, Ulysses heads,
    # eager attention without CP...): a layout the step simulator rejects has no memory either.
    from charon_search.training.step import validate_layout

    layout = as_layout(layout, hint=" (memory_report takes model, layout, cluster)")
    spec, cl = _resolve(model, cluster)
    opts = options or MemoryOptions()
    if opts.loss_impl is None:  # the layout's loss kernel
        opts = dataclasses.replace(
            opts, loss_impl="fused" if layout.loss_kernel == "fused" else "eager")
    validate_layout(spec, layout, None)
    check_layout_on_cluster(layout, cl, gpu_count=False)
    attn_impl = opts.attn_impl or ("eager" if layout.attention_kernel == "eager" else "sdpa")
    compiled = layout.fused_kernels if opts.compiled is None else opts.compiled
    prof = profile or model_profile(spec, phase="train", attn_impl=attn_impl)
    recipe = _recipe(opts, layout)
    policy = opts.selective_policy or layout.selective_policy
    cal = cl.calibration

    per_stage = _stage_layers(_layer_types(spec), layout.pp, layout.vpp, layout.pp_layout)
    m = layout.num_micro_batches
    point = ShardingPoint(
        b=layout.micro_batch_size, s=layout.seq_len / layout.cp,
        c=layout.seq_len / layout.cp if layout.cp_algo == "ring" else layout.seq_len,
        tp=layout.tp, sequence_parallel=layout.sequence_parallel,
    )
    evals = _evaluate(prof, point)
    fp8_saved = (opts.fp8_saved_activations if opts.fp8_saved_activations is not None
                 else layout.precision == "fp8") and layout.precision == "fp8"

    dense_shards, expert_shards = layout.shard_groups
    prefetch = (opts.fsdp_prefetch_depth if opts.fsdp_prefetch_depth is not None
                else int(layout.fsdp_prefetch))
    # Pipelined FSDP (and ZeRO-2, which only FSDP-style frameworks run under a pipeline:
    # DeepSpeed's pipeline engine takes ZeRO-1 at most) accumulates unsharded gradients over the
    # micro-batches and reduce-scatters once, as the step time does.
    no_sync = (opts.fsdp_no_sync_accumulation if opts.fsdp_no_sync_accumulation is not None
               else (recipe.fsdp or layout.zero_stage == 2) and layout.pp > 1)
    num_groups = sum(1 for d in (layout.tp, layout.cp, layout.dp, layout.ep, layout.pp) if d > 1)
    comm_buffers = cal.comm_buffer_bytes * num_groups

    dual = layout.schedule == "dualpipe"
    stages = []
    for i, layers in enumerate(per_stage):
        ends = (0, layout.pp - 1)
        if dual:
            # DualPipe: rank i holds stage i and stage p-1-i (its mirror holds the same two).
            layers = layers + per_stage[layout.pp - 1 - i]
        # (block name, recompute mode) -> layers of that kind on this stage.
        groups: dict[tuple[str, str], int] = {}
        recompute_k = 0
        if layout.recompute == "full":
            # Megatron's --recompute-num-layers counts per model chunk (as the step time
            # does): a rank of v chunks recomputes k layers in each.
            chunks = 2 if layout.schedule == "dualpipe" else layout.vpp
            recompute_k = min(len(layers), layout.recompute_num_layers * chunks) or len(layers)
        for j, name in enumerate(layers):
            mode = layout.recompute
            if mode == "full" and j >= recompute_k:
                mode = "none"
            groups[(name, mode)] = groups.get((name, mode), 0) + 1
        if i == 0 or (dual and i in ends):
            groups[("embedding", "none")] = 1
        if i == layout.pp - 1 or (dual and i in ends):
            groups[("lm_head", "none")] = 1
        # ---- parameters
        dense = expert = 0.0
        unit_max = layer_unit = root = head = 0.0
        for (name, _), count in groups.items():
            d, e = prof.params[name].local(tp=layout.tp, ep=layout.ep, expert_tp=opts.expert_tp)
            dense, expert = dense + count * d, expert + count * e
            unit_max = max(unit_max, d + e)
            if name in ("embedding", "lm_head"):
                root += d + e
                head += (d + e) if name == "lm_head" else 0.0
            else:
                layer_unit = max(layer_unit, d + e)
        if (i == layout.pp - 1 and layout.pp > 1 and spec.tie_word_embeddings
                and prof.params["lm_head"].tp == 0 and not dual):
            # the last stage keeps its own copy of a tied word embedding (its vocab shard; a
            # learned position table, replicated, stays on the first stage)
            dense += prof.params["embedding"].tp / layout.tp
        states = shard_states(dense_params=dense, expert_params=expert,
                              zero_stage=layout.zero_stage if layout.dp * layout.cp > 1 else 0,
                              dense_shards=dense_shards, expert_shards=expert_shards,
                              recipe=recipe)
        if no_sync and layout.dp * layout.cp > 1:
            # Unsharded accumulated gradients replace the sharded ones until the step. FSDP2
            # accumulates them in its reduce dtype (``FSDPParam.to_accumulated_grad_if_needed``;
            # bf16 when it reduces in the parameters' dtype).
            acc_b = ((recipe.reduce_buffer_bytes or recipe.grad_bytes) if recipe.fsdp
                     else recipe.grad_bytes)
            states = dataclasses.replace(states, grads_bytes=(dense + expert) * acc_b)
        # FSDP/DDP buffers (caching-allocator tensors) at the loss peak and at a layer's peak.
        buf_loss, buf_layer = _buffers(layout, recipe, opts, dense_shards=dense_shards,
                                       prefetch=prefetch, unit_max=unit_max,
                                       layer_unit=layer_unit or unit_max, root=root, head=head)

        # ---- activations
        n_flight = in_flight_chunks(layout.schedule, pp=layout.pp, stage_idx=i,
                                    num_micro_batches=m, vpp=layout.vpp)
        saved_stage = 0.0
        head_kept = 0.0  # what the LM head with its loss keeps per micro-batch (last stage)
        top = (0.0, 0.0)  # (transient, buffers) of the block whose peak is the stage's peak
        shared = 0.0  # attention mask / RoPE tables: one copy, referenced by every layer
        for (name, mode), count in groups.items():
            ev = evals.get(name)
            if ev is None:
                continue
            shared = max(shared, ev["shared_inputs"])
            loss = ev["logits"] > 0
            if loss:
                kept, transient = _loss_block(ev, opts.loss_impl)
            else:
                kept = _kept(ev, mode, policy, compiled, layout.recompute_modules)
                transient = _transient(ev, mode, policy, kept)
            keeps_inputs = mode == "none" or (mode == "selective" and policy == "attention")
            if opts.sp_saves_gathered_inputs and keeps_inputs:
                kept += ev["col_gather_extra"]
            if opts.fused_saved and keeps_inputs:
                kept += ev["fused_delta"]
            # The timelines are in the traced dtype; FP8 copies shrink what is kept and what
            # the backward reads alike, so the transient on top is unchanged.
            buf = buf_loss if loss else buf_layer
            if transient + buf > sum(top):
                top = (transient, buf)
            if fp8_saved and keeps_inputs:
                kept -= 0.5 * ev["saved_gemm_input"]  # bf16 -> fp8 copies of GEMM inputs
            saved_stage += count * kept
            if loss:
                head_kept += count * kept
        # A micro-batch in flight holds one of the rank's chunks: saved_stage sums them all.
        n_chunks = 2 if dual else layout.vpp
        saved_total = n_flight * saved_stage / n_chunks
        if head_kept > 0 and n_chunks > 1:
            # The LM head (and its fp32 logits) belongs to one chunk of the rank only: count it
            # for the micro-batches of that chunk alive at the peak, not averaged over chunks
            # (interleaved 1F1B: the last chunk of rank p-1, one micro-batch at its peak;
            # DualPipe: stage p-1, chunk 1 of rank 0 and chunk 0 of rank p-1).
            head_chunk = (0 if dual and i == layout.pp - 1 else n_chunks - 1)
            per_chunk = (saved_stage - head_kept) / n_chunks
            saved_total = max(
                total * per_chunk + alive * head_kept
                for total, alive in _alive_chunk_counts(layout.schedule, layout.pp, m,
                                                        layout.vpp, i, head_chunk))
        activations = saved_total + top[0] + shared
        buffers = top[1] if top != (0.0, 0.0) else max(buf_loss, buf_layer)

        allocated = states.total_bytes + buffers + activations
        reserved = allocated * cal.allocator_reserved_factor + cal.allocator_reserved_extra_bytes
        stages.append(StageMemory(
            stage=i, params_bytes=states.params_bytes, grads_bytes=states.grads_bytes,
            optimizer_bytes=states.optimizer_bytes, activations_bytes=activations,
            buffers_bytes=buffers, peak_allocated_bytes=allocated, peak_reserved_bytes=reserved,
            in_flight=n_flight, saved_activations_bytes=saved_total,
            device_overhead_bytes=comm_buffers,
        ))
    return MemoryReport(
        stages=tuple(stages), device_memory_bytes=cl.gpu.hbm_capacity_bytes,
        gpu_name=cl.gpu.name,
        assumptions={"attn_impl": attn_impl, "recipe": _recipe_name(opts, layout),
                     "selective_policy": policy, "fp8_saved": fp8_saved,
                     "compiled": compiled, "loss_impl": opts.loss_impl,
                     "sp_saves_gathered_inputs": opts.sp_saves_gathered_inputs,
                     "fused_saved": opts.fused_saved,
                     "fsdp_prefetch_depth": prefetch, "fsdp_no_sync_accumulation": no_sync},
    )


@functools.lru_cache(maxsize=1024)
def _alive_chunk_counts(schedule: str, pp: int, num_micro_batches: int, vpp: int, rank: int,
                        chunk: int) -> tuple[tuple[int, int], ...]:
    """``(chunk micro-batches alive, of them on chunk)`` pairs over rank ``rank``'s op order
    (``sim.schedules``, the order the step simulator runs): a forward makes its chunk
    micro-batch alive, its backward frees it. Only the pairs no other pair dominates are kept
    (the peak of ``total * a + on_chunk * b`` for ``a, b >= 0`` is among them)."""
    from charon_search.sim.schedules import schedule_order

    total = on_chunk = 0
    seen = {(0, 0)}
    for op in schedule_order(schedule, pp, num_micro_batches, vpp, rank):
        step = 1 if op.kind == "F" else -1 if op.kind == "B" else 0
        total += step
        on_chunk += step if op.chunk == chunk else 0
        seen.add((total, on_chunk))
    return tuple(sorted(pair for pair in seen
                        if not any(o != pair and o[0] >= pair[0] and o[1] >= pair[1]
                                   for o in seen)))


def _buffers(layout: Layout, recipe: StateRecipe, opts: MemoryOptions, *, dense_shards: int,
             prefetch: int, unit_max: float, layer_unit: float, root: float,
             head: float) -> tuple[float, float]:
    """Sharding buffers in the caching allocator: (at the loss's peak, at a layer's peak).

    PyTorch FSDP2 (``recipe.fsdp``, ZeRO-3): the root module (embedding, final norm, LM head)
    is never resharded after forward (``_lazy_init``: "For the root, do not reshard after
    forward"), torchtitan keeps the last block unsharded after its forward ("FSDP would
    prefetch it immediately", ``apply_fsdp``), and the LM head's bf16 gradient waits for the
    root's reduce-scatter at the end of the backward. A block's backward holds its gathered
    weights, ``prefetch`` more, its unsharded gradients and their fp32 reduce-scatter copy.
    Other ZeRO-3 implementations gather the largest unit (embedding included) the same way.
    """
    gathered = recipe.gathered_param_bytes
    if layout.zero_stage == 3 and dense_shards > 1:
        if recipe.fsdp:
            base = root * gathered
            at_layer = layer_unit * (gathered * (1 + prefetch) + gathered
                                     + recipe.reduce_buffer_bytes)
            return base + layer_unit * gathered, base + head * gathered + at_layer
        # Gathered weights of the unit computing plus those prefetched, and the unsharded
        # gradient of one unit before its reduce-scatter.
        buf = unit_max * (gathered * (1 + prefetch) + gathered + recipe.reduce_buffer_bytes)
        return buf, buf
    if layout.zero_stage == 2 and recipe.fsdp and dense_shards > 1:
        # Weights stay gathered (counted in params); one unit's gradients still pass
        # through the reduce-scatter buffer.
        return 0.0, unit_max * recipe.reduce_buffer_bytes
    if layout.zero_stage <= 1 and layout.dp > 1:
        return opts.ddp_bucket_bytes, opts.ddp_bucket_bytes
    return 0.0, 0.0


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


def _kept(ev: Mapping[str, float], mode: str, policy: str, compiled: bool = False,
          modules: Sequence[str] = ()) -> float:
    """Saved bytes one layer keeps between its forward and backward (traced dtype).

    Selective recompute with Megatron-Core ``recompute_modules`` keeps the layer's saved set
    less what each module's checkpoint frees, plus the module inputs it keeps instead
    (``BlockActivations.module_saved`` / ``module_inputs``; summed per module)."""
    if mode == "full":
        return ev["block_input"]
    if mode == "selective":
        if modules:
            return (ev["saved"]
                    - sum(ev.get(f"module_saved:{m}", 0.0) for m in modules)
                    + sum(ev.get(f"module_inputs:{m}", 0.0) for m in modules))
        if policy == "op":
            return ev["op_sac_needed"] if compiled else ev["op_sac_saved"]
        return ev["selective_saved"]
    return ev["saved"]


def _loss_block(ev: Mapping[str, float], impl: str) -> tuple[float, float]:
    """(kept, transient) of the LM-head block with the loss modelled per ``LOSS_IMPLS``.

    The traced block without its loss ops gives what the final norm and the head GEMM keep;
    the loss adds multiples of the fp32 logits ``F`` (``ev["logits"]``, 4 B per element).
    """
    f32 = ev["logits"]
    kept_f, fwd_f, bwd_f = LOSS_IMPLS[impl]
    base = ev["saved_noloss"]
    kept = base + kept_f * f32
    fwd = max(ev["fwd_peak_noloss"], base + fwd_f * f32)
    bwd = max(ev["bwd_peak_noloss"], base + bwd_f * f32)
    return kept, max(0.0, fwd - kept, bwd - kept)


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
    """The state recipe, with the buffers the gradient reduction fills in
    ``layout.grad_reduce_dtype``: Megatron's DDP gradient buffer (``main_grad``: fp32 with
    ``--accumulate-allreduce-grads-in-fp32``, else the parameters' dtype) and FSDP2's
    reduce-scatter input (``foreach_reduce`` copies the unit's gradients into a buffer of its
    ``reduce_dtype``). The other recipes keep their own gradient dtype."""
    if isinstance(opts.recipe, StateRecipe):
        return opts.recipe
    name = _recipe_name(opts, layout)
    recipe = STATE_RECIPES[name]
    reduce_b = DTYPE_BYTES[layout.grad_reduce_dtype]
    if name == "megatron":
        return dataclasses.replace(recipe, grad_bytes=reduce_b)
    if name == "fsdp2":
        return dataclasses.replace(recipe, reduce_buffer_bytes=reduce_b)
    return recipe


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
