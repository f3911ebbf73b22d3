"""Training layout: how one model is laid over GPUs, and the rules between the degrees.

``Layout`` is the "plan" input of ``simulate_training`` and ``memory_report`` (model, plan and
hardware vary independently, as in calculon). Validation names the rule and the values.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from charon_search.config_fields import typed_kwargs
from charon_search.errors import ConfigError

if TYPE_CHECKING:
    from charon_search.catalog.spec import ModelSpec

__all__ = [
    "LOSS_KERNELS",
    "NORM_IMPLS",
    "OUTPUT_DISCARDING_MODULES",
    "PP_LAYOUT_TOKENS",
    "PRECISIONS",
    "RECOMPUTE_MODES",
    "RECOMPUTE_MODULES",
    "SCHEDULES",
    "Layout",
    "as_layout",
    "check_layout_on_cluster",
    "pp_layout_stages",
    "shard_groups",
]

SCHEDULES = ("none", "gpipe", "1f1b", "interleaved-1f1b", "zero-bubble", "dualpipe")
RECOMPUTE_MODES = ("none", "selective", "full")
#: ``Layout.norm_impl`` choices (``passes.fusion`` for ``persistent``, ``passes.eager_norm``).
NORM_IMPLS = ("fused", "persistent", "eager")
#: ``Layout.loss_kernel`` choices (``passes.fused_loss`` for ``fused``).
LOSS_KERNELS = ("eager", "fused")
#: Megatron-Core ``--recompute-modules`` choices
#: (``megatron/core/transformer/transformer_config.py``).
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe",
                     "shared_experts")
#: Recompute modules whose checkpoint also frees the module's *output* after its consumers ran
#: (re-made before their backward), not only its internals: Megatron-Core
#: ``TransformerConfig.recompute_modules`` ("moe_act", "layernorm", and "mla_up_proj" use
#: output-discarding checkpointing, "core_attn", "mlp", "moe", and "shared_experts" use normal
#: checkpointing).
OUTPUT_DISCARDING_MODULES = frozenset({"moe_act", "layernorm", "mla_up_proj"})
#: Mixed-precision GEMM formats of a training step (weights kept in fp32 by the optimizer, as
#: the memory model counts them). Pure fp32 training is not modelled: no fp32 GEMM tables are
#: shipped and the memory model counts 2-byte weights.
PRECISIONS = ("bf16", "fp16", "fp8")
CP_ALGOS = ("ring", "allgather", "ulysses")
CP_RING_IMPLS = ("overlapped", "torch_traced")
#: ``Layout.fp8_gemm_kernel``: ``cutlass`` (the shipped fp8 rows as they are) or ``cublaslt``
#: (scaled by the measured cuBLASLt / CUTLASS ratio, ``sim.fp8_kernels``).
FP8_GEMM_KERNELS = ("cutlass", "cublaslt")
RANK_ORDERS = ("tp-cp-ep-dp-pp", "tp-cp-dp-pp", "tp-dp-cp-pp", "tp-dp-pp", "tp-pp-dp")



def shard_groups(*, dp: int, cp: int, ep: int, hsdp_shard: int = 0) -> tuple[int, int]:
    """``(dense, expert)``: the ranks ZeRO / FSDP shard a rank's states over, one rule for the
    memory model, the step time and the FSDP pass. Dense weights over the dp·cp ranks
    (torchtitan's ``dp_shard_cp``; HSDP: the shard group's dp ranks x cp), routed experts over
    the ranks *of that same shard group* holding the same experts: ``shard·cp / ep`` with
    ``shard = hsdp_shard or dp`` (torchtitan takes EP out of ``dp_shard``: ``dp_shard_mod_ep =
    dp_shard·cp / ep``, and ``dp_replicate`` replicates experts as it replicates dense weights;
    Megatron's partial distributed optimizer shards the expert-DP group inside its
    distributed-optimizer instance the same way), at least 1.

    >>> shard_groups(dp=8, cp=1, ep=2)  # experts over the 4 ranks holding the same experts
    (8, 4)
    >>> shard_groups(dp=8, cp=1, ep=2, hsdp_shard=2)  # shard group of 2 = one EP group
    (2, 1)
    """
    shard = hsdp_shard or dp
    return shard * cp, max(1, shard * cp // ep)

@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """Parallel layout and batch of one training job. Degrees of 1 mean "not used"."""

    tp: int = 1
    """Tensor-parallel degree."""
    pp: int = 1
    """Pipeline-parallel degree (pipeline ranks)."""
    dp: int = 1
    """Data-parallel degree, including ZeRO/FSDP shards."""
    cp: int = 1
    """Context-parallel degree."""
    ep: int = 1
    """Expert-parallel degree; experts are sharded inside dp*cp, so ep divides dp*cp (with HSDP
    inside one shard group: ep divides hsdp_shard*cp)."""
    vpp: int = 1
    """Virtual pipeline chunks per pipeline rank (interleaved 1F1B); 1 = no interleaving."""
    sequence_parallel: bool = False
    """Megatron SP: norms/dropout sharded over the TP group; AG/RS instead of all-reduce."""
    sp_wgrad_regather: bool = False
    """With ``sequence_parallel``: the backward of a column-parallel GEMM all-gathers its saved
    sequence-sharded input again for the weight gradient, issued before and overlapped with
    the dgrad GEMM (Megatron ``LinearWithGradAccumulationAndAsyncCommunication`` saves the
    shard, not the gathered copy; Transformer Engine's ``Linear`` does the same). False: the
    gathered input is kept for the backward (autograd saving the all-gather's output, as
    DTensor sequence parallelism does). See ``passes.tensor_parallel``."""
    sac_saves_reduce_scatter: bool = True
    """torchtitan op-level SAC (``selective_policy="op"``): the TP reduce-scatters' outputs are
    in the save list (``_save_list`` holds ``_c10d_functional.reduce_scatter_tensor``, 2024).
    False: torchtitan of spring-summer 2025 (pytorch/torchtitan#965 took the reduce-scatter
    out of the list so that async TP's matmul-reduce-scatter fusion still matches): the
    backward re-runs each reduce-scatter whose output it needs, with its matmul (the
    attention output's, whose sum with the residual feeds the MLP norm). See
    ``passes.recompute``."""
    tp_async_allreduce: bool = True
    """Without SP: a column-parallel GEMM's backward all-reduce of its input gradient starts
    after the dgrad GEMM and runs under the wgrad GEMM (Megatron
    ``--async-tensor-model-parallel-allreduce``, on by default from early 2022). False:
    Megatron-LM of 2020-21 (``copy_to_tensor_model_parallel_region`` + ``F.linear``), where it
    starts after both GEMMs. See ``passes.tensor_parallel``."""
    zero_stage: int = 0
    """0 DDP, 1 optimizer states, 2 + gradients, 3 + parameters (FSDP FULL_SHARD)."""
    hsdp_shard: int = 0
    """HSDP: shard inside groups of this many DP ranks, replicate across; 0 = shard over dp."""
    schedule: str = "none"
    """Pipeline schedule, one of ``SCHEDULES``; ``none`` exactly when pp == 1."""
    micro_batch_size: int = 1
    global_batch_size: int = 1
    """Sequences per optimizer step over all DP ranks."""
    seq_len: int = 2048
    recompute: str = "none"
    """``none``, ``selective`` (attention core) or ``full`` (whole layers)."""
    recompute_num_layers: int = 0
    """With ``full``: layers recomputed per model chunk (Megatron ``--recompute-num-layers``;
    0 = all; at most the chunk's layers)."""
    precision: str = "bf16"
    """GEMM precision: ``bf16``, ``fp16`` or ``fp8`` (``PRECISIONS``; fp32 training is not
    modelled: no fp32 GEMM tables are shipped)."""
    cp_algo: str = "ring"
    """Context parallel algorithm: ``ring`` (P2P KV), ``allgather`` (Llama 3), ``ulysses``."""
    cp_ring_impl: str = "overlapped"
    """With ``cp_algo="ring"``: ``overlapped`` (K/V and dK/dV hops overlap the attention
    kernels, bf16) or ``torch_traced`` (PyTorch ``context_parallel`` traced by torch.compile:
    K/V all-gathered, dK/dV passed around the ring in fp32, each collective waited on right
    after it is issued). See ``passes.context_parallel``."""
    cp_repeat_kv: bool = False
    """The model repeats K/V to the query-head count before attention (torchtitan's Llama
    ``repeat_kv``), so context parallelism moves K/V and dK/dV at ``heads``, not
    ``kv_heads``."""
    async_tp: bool = False
    """Overlap TP collectives with GEMM chunks."""
    moe_a2a_overlap: bool = False
    """Two-micro-batch overlap of EP all-to-all with compute (DeepSeek-style)."""
    ep_node_dedup: bool = False
    """EP dispatch/combine send each token once per target node over the scale-out network
    and forward it over NVLink once per target rank (DeepEP normal kernels, Megatron-Core's
    flex dispatcher, DeepSeek-V3 report sec. 3.2.2), not once per routed expert. With the
    model's group-limited routing on node-aligned expert groups, a token reaches at most
    ``topk_group`` nodes instead of ``top_k`` experts; inside one NVLink domain it reaches the
    expected number of distinct ranks holding its experts (``training.step.ep_distinct_ranks``)."""
    ep_dispatch_fp8: bool = False
    """EP dispatch all-to-alls carry fp8 with one fp32 scale per 128 values: the forward
    dispatch and the backward all-to-all that sends gradients into the experts; both combines
    stay bf16 (DeepSeek-V3 report sec. 3.3.2, "Low-Precision Communication")."""
    moe_fused_permute: bool = False
    """Megatron-Core ``--moe-permute-fusion`` / ``--moe-router-fusion`` (Transformer Engine's
    fused token permute, unpermute-with-probabilities and router kernels): each run of the
    router's, the dispatch's and the combine's local ops is one kernel (``passes.fusion``)."""
    fsdp_prefetch: bool = True
    """ZeRO-3: prefetch the next layer's all-gather during the current layer."""
    fsdp_backward_prefetch: str = "pre"
    """ZeRO-3 backward, named like PyTorch FSDP's ``BackwardPrefetch``: ``pre`` issues the next
    layer's all-gather before this layer's gradient computation (FSDP2, FSDP1's default);
    ``post`` only after it, ahead of this layer's reduce-scatter on the same process group, so
    every backward all-gather waits for a layer's compute and for the reduce-scatter issued
    before it (FSDP1 ``BACKWARD_POST``, Composer's default). With ``post`` the gradient
    reduce-scatters share the all-gathers' NCCL stream, as FSDP1's single process group does."""
    fsdp_flat_grad: bool = False
    """ZeRO-3 gradients take PyTorch FSDP1's ``FlatParameter`` path: every backward of an FSDP
    unit concatenates its parameters' gradients into the unit's flat gradient (autograd's
    ``split`` backward, ``torch.cat``), casts it to ``grad_reduce_dtype`` when that differs
    from the bf16 compute dtype and divides it in place by the gradient pre-divide factor
    before the reduce-scatter (``torch/distributed/fsdp/_runtime_utils.py``
    ``_post_backward_hook`` / ``_reduce_grad``); three memory-bound passes over the unit's
    unsharded gradient per micro-batch (``passes.data_parallel``). Composer's FSDP (llm-foundry)
    is FSDP1."""
    grad_reduce_dtype: str = "fp32"
    """Dtype of the data-parallel gradient reduction (reduce-scatter / all-reduce): ``fp32``
    (Megatron, torchtitan, FSDP ``reduce_dtype=float32``), ``bf16`` (FSDP mixed precision
    with a bf16 ``reduce_dtype``, e.g. Composer's ``PURE``) or ``fp16`` (Megatron-LM fp16
    runs without ``--accumulate-allreduce-grads-in-fp32``, whose gradient buffer is fp16)."""
    grad_accum_hook: bool = False
    """Each micro-batch's backward adds every parameter's fresh gradient into the
    data-parallel gradient buffer of ``grad_reduce_dtype`` in a separate elementwise kernel
    (Megatron-LM's DDP ``param_hook``: ``param.main_grad.add_(param.grad.data)``, before
    ``--gradient-accumulation-fusion`` folded it into the weight-gradient GEMM in 2022): one
    read of the gradient, one read and one write of the buffer per local parameter and
    micro-batch (``passes.data_parallel``), with ZeRO stage 0 or 1 (an unsharded buffer).
    False: the accumulation is fused into the GEMM (Megatron-Core / Transformer Engine) or
    runs on sharded gradients (FSDP)."""
    embedding_grad_hook: bool = False
    """With the accumulation fused into the weight-gradient GEMMs (they add into the fp32
    ``main_grad`` and set ``grad_added_to_main_grad``), Megatron's DDP hook still runs
    ``param.main_grad.add_(param.grad.data)`` every micro-batch for the parameters no
    weight-gradient GEMM writes: the embedding tables (``F.embedding``'s dense ``[V/tp, h]``
    gradient), norm weights, linear biases and router weights (Megatron-Core
    ``distributed/distributed_data_parallel.py`` ``_make_param_hook``, r0.8; Megatron-LM
    ``model/distributed.py`` of 2022). One kernel per such tensor, reading the bf16 gradient and
    reading and writing the ``grad_reduce_dtype`` buffer, per micro-batch
    (``passes.data_parallel``), ZeRO stage 0 or 1. ``grad_accum_hook`` adds every parameter."""
    mla_rope_fusion: bool = False
    """Multi-latent attention runs Megatron-Core's fused RoPE kernels
    (``apply_rope_fusion``, its default: ``fused_apply_mla_rope_for_q`` /
    ``fused_apply_mla_rope_for_kv`` in ``megatron/core/fusions/fused_mla_yarn_rope_apply.py``),
    one kernel per direction for the query and one for the key and value, instead of the
    traced HF layer's RoPE, ``slice_scatter`` and copy ops and their autograd chain
    (``passes.mla_rope``). Only multi-latent attention is touched; ``validate_for`` refuses it
    for a model without MLA."""
    pp_p2p_blocking: bool = False
    """Pipeline transfers block the sending stage: Megatron's batched point-to-point path
    (``batch_isend_irecv``, ``req.wait()``, then ``torch.cuda.synchronize()`` "to protect
    against race condition", in Megatron-LM's ``p2p_communication._communicate`` of 2020-22
    and Megatron-Core's with ``batch_p2p_comm`` and ``batch_p2p_sync``, which Megatron-LM's
    training arguments use whenever the schedule is not interleaved). A stage that sends an
    activation or a gradient to another stage runs nothing until the transfer ends: one
    transfer per unit whose output another stage reads (the interleaved steady state sends a
    pair's forward output and backward gradient in one call, to the next and to the previous
    stage, both out of the rank's one network interface). Not with the ``dualpipe`` schedule.
    False: the transfer overlaps the sender's next unit (Megatron-Core ``overlap_p2p_comm``,
    torch.distributed.pipelining); the receiver waits for it either way. See
    ``sim.pipeline``."""
    pp_scatter_gather: bool = False
    """Without sequence parallelism and with TP: Megatron-LM's scatter/gather optimization
    (Narayanan et al., SC21, Section 4.1; ``--scatter-gather-tensors-in-pipeline``, on by
    default in Megatron-LM of 2021-22): each TP rank sends 1/tp of the stage's output over
    the network and the receiving stage all-gathers it inside its TP group (charged with the
    transfer). False: every TP rank sends the whole activation. Sequence parallelism already
    shards it (no gather); with it, or without TP or PP, the option changes nothing."""
    dp_overlap_grad_reduce: bool = True
    """DDP / ZeRO-1/2: each gradient bucket's data-parallel reduction starts when the last
    backward produces it, overlapped with the rest of the backward (Megatron-Core
    ``--overlap-grad-reduce``, PyTorch DDP's bucketed hooks). False: every reduction starts
    after the rank's last backward (Megatron-LM of 2020-21: ``train_step`` calls
    ``allreduce_gradients()`` after ``forward_backward_func``). See ``training.step``."""
    expert_load_imbalance: float = 1.0
    """max/mean tokens per expert (1.0 = perfectly balanced routing)."""
    rank_order: str = "tp-cp-ep-dp-pp"
    """Mesh axes innermost first: TP ranks are adjacent, PP ranks are farthest apart."""
    optimizer: str = "adam"
    """``adam`` (fp32 master + m + v) or ``sgd``."""
    fused_kernels: bool = True
    """Flash attention and fused norm/SwiGLU/RoPE kernels (fusion pass)."""
    fp8_recipe: str = "tensorwise"
    """With ``precision="fp8"``: ``tensorwise`` / ``rowwise`` (dynamic scaling, torchao),
    ``delayed`` (Transformer Engine amax history) or ``blockwise`` (DeepSeek-V3 1x128 tiles)."""
    selective_policy: str = "attention"
    """What ``recompute="selective"`` re-runs: ``attention`` (the attention core, Megatron /
    Korthikanti et al.) or ``op`` (torchtitan's op-level SAC: every op except matmuls,
    attention kernels and their collectives, plus every second matmul)."""
    recompute_modules: tuple[str, ...] = ()
    """With ``recompute="selective"``: Megatron-Core ``--recompute-modules`` (``core_attn``,
    ``moe_act``, ``layernorm``, ``mla_up_proj``, ``mlp``, ``moe``, ``shared_experts``); empty = the
    ``selective_policy`` decides. See ``passes.recompute``."""
    fp8_gemm_kernel: str = "cutlass"
    """Kernel family of fp8 GEMMs: ``cutlass`` (the shipped fp8 rows, vLLM's CUTLASS kernel) or
    ``cublaslt`` (Transformer Engine and torchao ``torch._scaled_mm``: the rows scaled by the
    measured cuBLASLt / CUTLASS ratio at the nearest shape, ``sim.fp8_kernels``; H100/H200)."""
    norm_impl: str = "fused"
    """``fused`` (one kernel per norm and direction: Megatron / Transformer Engine / Apex fused
    norms, or torch.compile; priced from the measured norm kernels), ``persistent`` (apex
    ``FastLayerNorm``, Megatron-LM's ``persist_layer_norm`` of 2022: one bandwidth-bound kernel
    per direction, priced at the roofline; see ``passes.fusion``) or ``eager`` (torchtitan's
    ``RMSNorm`` without torch.compile: one eager kernel per op of
    ``_norm(x.float()).type_as(x) * weight`` and one per autograd formula in the backward; see
    ``passes.eager_norm``)."""
    pp_layout: str = ""
    """Megatron-Core ``--pipeline-model-parallel-layout``: what each virtual pipeline stage holds,
    stages in order separated by ``|`` (stage ``i`` is chunk ``i // pp`` of rank ``i % pp``):
    ``t`` one decoder layer, ``E`` the embedding (first stage), ``L`` the LM head and loss (last
    stage); ``(...)*n`` repeats. ``"Et|(tt|)*30L"``: 32 stages, a 61-layer model with the
    embedding beside one layer and the LM head alone. Empty = an even split
    (``training.step.stage_layers``)."""
    loss_kernel: str = "eager"
    """How the cross entropy runs: ``eager`` (the traced ``nn.CrossEntropyLoss`` under
    autocast: an fp32 copy of the logits, ATen's multi-pass log-softmax, NLL, and their
    backward, about 48 bytes per logit) or ``fused`` (one kernel per direction on the bf16
    logits, about 8 bytes per logit: flash-attn's ``CrossEntropyLoss``, llm-foundry MPT's
    default ``loss_fn``, or the loss compiled by Inductor, torchtitan from 2025). See
    ``passes.fused_loss``; the memory model counts the matching loss buffers."""
    attention_kernel: str = "flash"
    """``flash`` (the GPU's best fused attention kernel), ``flash2`` (FlashAttention-2, PyTorch
    SDPA's flash backend), ``flash_triton`` (the 2022/23 Triton FlashAttention kernel) or
    ``eager`` (unfused QK^T / softmax / dropout / PV, as Megatron-LM before flash attention,
    2023). See ``cost.attention_kernels``."""

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def shard_groups(self) -> tuple[int, int]:
        """``(dense, expert)`` ranks ZeRO / FSDP shard states over (``shard_groups``)."""
        return shard_groups(dp=self.dp, cp=self.cp, ep=self.ep, hsdp_shard=self.hsdp_shard)

    @property
    def num_micro_batches(self) -> int:
        """Micro-batches per DP rank per step."""
        return self.global_batch_size // (self.micro_batch_size * self.dp)

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch_size",
                     "global_batch_size", "seq_len"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"`{name}` must be a positive integer, but got {v!r}")
        for f in dataclasses.fields(self):
            if f.type in ("bool", bool) and not isinstance(getattr(self, f.name), bool):
                raise ConfigError(f"`{f.name}` must be true or false, but got "
                                  f"{getattr(self, f.name)!r}")
        for name in ("hsdp_shard", "recompute_num_layers"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ConfigError(f"`{name}` must be an integer >= 0, but got {v!r}")
        _choice("schedule", self.schedule, SCHEDULES)
        _choice("recompute", self.recompute, RECOMPUTE_MODES)
        _choice("precision", self.precision, PRECISIONS)
        _choice("cp_algo", self.cp_algo, CP_ALGOS)
        _choice("cp_ring_impl", self.cp_ring_impl, CP_RING_IMPLS)
        _choice("rank_order", self.rank_order, RANK_ORDERS)
        _choice("optimizer", self.optimizer, ("adam", "sgd"))
        _choice("fp8_recipe", self.fp8_recipe, ("tensorwise", "rowwise", "delayed", "blockwise"))
        _choice("selective_policy", self.selective_policy, ("attention", "op"))
        _choice("fsdp_backward_prefetch", self.fsdp_backward_prefetch, ("pre", "post"))
        _choice("grad_reduce_dtype", self.grad_reduce_dtype, ("fp32", "bf16", "fp16"))
        # Framework facts that only exist with another setting: refused rather than ignored.
        if self.fsdp_flat_grad and self.zero_stage != 3:
            raise ConfigError("`fsdp_flat_grad` (FSDP1's FlatParameter gradients) needs "
                              f"`zero_stage` 3, but got zero_stage={self.zero_stage}")
        if self.grad_accum_hook and self.zero_stage > 1:
            raise ConfigError("`grad_accum_hook` (Megatron's unsharded gradient buffer) needs "
                              f"`zero_stage` 0 or 1, but got zero_stage={self.zero_stage}")
        if self.embedding_grad_hook and self.zero_stage > 1:
            raise ConfigError("`embedding_grad_hook` (Megatron's unsharded gradient buffer) "
                              f"needs `zero_stage` 0 or 1, but got zero_stage={self.zero_stage}")
        if self.pp_p2p_blocking and self.schedule == "dualpipe":
            raise ConfigError("`pp_p2p_blocking` (Megatron's batched, synchronized transfers) "
                              "does not go with schedule 'dualpipe', which overlaps its "
                              "transfers with the paired chunk by design; use another "
                              "schedule or pp_p2p_blocking=false")
        if self.sp_wgrad_regather and not self.sequence_parallel:
            raise ConfigError("`sp_wgrad_regather` needs `sequence_parallel` true (it re-gathers "
                              "sequence-sharded inputs), but got sequence_parallel=false")
        if isinstance(self.recompute_modules, str):  # "mlp moe_act" (CLI / YAML)
            object.__setattr__(self, "recompute_modules", tuple(self.recompute_modules.split()))
        object.__setattr__(self, "recompute_modules", tuple(self.recompute_modules))
        for mod in self.recompute_modules:
            _choice("recompute_modules", mod, RECOMPUTE_MODULES)
        _choice("norm_impl", self.norm_impl, NORM_IMPLS)
        _choice("loss_kernel", self.loss_kernel, LOSS_KERNELS)
        _choice("fp8_gemm_kernel", self.fp8_gemm_kernel, FP8_GEMM_KERNELS)
        _choice("attention_kernel", self.attention_kernel,
                ("flash", "flash2", "flash_triton", "eager"))
        if self.zero_stage not in (0, 1, 2, 3):
            raise ConfigError(
                f"`zero_stage` must be one of [0, 1, 2, 3], but got {self.zero_stage!r}"
            )
        if self.vpp > 1 and self.pp == 1:
            raise ConfigError(f"`vpp > 1` (virtual pipeline stages) needs pp > 1 and schedule "
                              f"'interleaved-1f1b', but got (vpp={self.vpp}, pp=1)")
        if (self.pp == 1) != (self.schedule == "none"):
            raise ConfigError(
                f"`schedule == 'none'` must hold exactly when pp == 1, but got "
                f"(pp={self.pp}, schedule={self.schedule!r})"
            )
        if self.vpp > 1 and self.schedule != "interleaved-1f1b":
            raise ConfigError(
                f"`vpp > 1` needs schedule 'interleaved-1f1b', but got "
                f"(vpp={self.vpp}, schedule={self.schedule!r})"
            )
        if self.sequence_parallel and self.tp == 1:
            raise ConfigError("`sequence_parallel` needs tp > 1, but got tp=1")
        if (self.dp * self.cp) % self.ep:
            raise ConfigError(
                f"`ep` must divide dp * cp, but got (ep={self.ep}, dp={self.dp}, cp={self.cp})"
            )
        if self.global_batch_size % (self.micro_batch_size * self.dp):
            raise ConfigError(
                "`global_batch_size` must be a multiple of micro_batch_size * dp, but got "
                f"(global_batch_size={self.global_batch_size}, "
                f"micro_batch_size={self.micro_batch_size}, dp={self.dp})"
            )
        if self.hsdp_shard and (self.dp % self.hsdp_shard or self.zero_stage == 0):
            raise ConfigError(
                f"`hsdp_shard` must divide dp and needs zero_stage >= 1, but got "
                f"(hsdp_shard={self.hsdp_shard}, dp={self.dp}, zero_stage={self.zero_stage})"
            )
        if self.hsdp_shard and (self.hsdp_shard * self.cp) % self.ep:
            # Experts shard (and EP groups form) inside one HSDP shard group; the replica
            # groups hold copies (torchtitan's dp_shard_mod_ep = dp_shard * cp / ep).
            raise ConfigError(
                f"with hsdp_shard > 0, `ep` must divide hsdp_shard * cp (expert parallelism "
                f"lives inside one HSDP shard group), but got (ep={self.ep}, "
                f"hsdp_shard={self.hsdp_shard}, cp={self.cp})"
            )
        if self.pp_layout:
            stages = pp_layout_stages(self.pp_layout)
            if self.schedule == "dualpipe":
                raise ConfigError("`pp_layout` needs a schedule other than 'dualpipe' (whose "
                                  "ranks hold two mirrored stages), but got 'dualpipe'")
            if len(stages) != self.pp * self.vpp:
                raise ConfigError(
                    f"`pp_layout` must list pp * vpp = {self.pp * self.vpp} stages, but got "
                    f"{len(stages)} in {self.pp_layout!r}")
        if (isinstance(self.expert_load_imbalance, bool)
                or not isinstance(self.expert_load_imbalance, (int, float))
                or not math.isfinite(self.expert_load_imbalance)
                or self.expert_load_imbalance < 1.0):
            raise ConfigError(
                f"`expert_load_imbalance` must be a finite number >= 1, but got "
                f"{self.expert_load_imbalance!r}")
        if self.recompute_num_layers and self.recompute != "full":
            raise ConfigError(
                f"`recompute_num_layers` applies to recompute 'full' only, but got "
                f"(recompute_num_layers={self.recompute_num_layers}, "
                f"recompute={self.recompute!r})")

    def validate_for(self, model: ModelSpec, num_gpus: int | None = None,
                     *, allow_uneven_pp: bool = True) -> None:
        """Check the rules between this layout, a model and a GPU count; raise ``ConfigError``."""
        if num_gpus is not None and self.num_gpus != num_gpus:
            raise ConfigError(
                f"`tp * pp * dp * cp == gpus` must hold, but got (tp={self.tp}, pp={self.pp}, "
                f"dp={self.dp}, cp={self.cp}, product={self.num_gpus}, gpus={num_gpus})"
            )
        if model.num_attention_heads % self.tp:
            raise ConfigError(
                f"`tp` must divide num_attention_heads, but got "
                f"(tp={self.tp}, num_attention_heads={model.num_attention_heads})"
            )
        if model.attention != "mla" and (
            model.num_key_value_heads % self.tp and self.tp % model.num_key_value_heads
        ):
            raise ConfigError(
                f"`tp` must divide num_key_value_heads (or be a multiple of it), but got "
                f"(tp={self.tp}, num_key_value_heads={model.num_key_value_heads})"
            )
        chunks = self.pp * self.vpp
        if chunks > model.num_layers:
            raise ConfigError(
                f"`pp * vpp <= num_layers` must hold, but got "
                f"(pp={self.pp}, vpp={self.vpp}, num_layers={model.num_layers})"
            )
        if model.num_layers % chunks and not allow_uneven_pp:
            raise ConfigError(
                f"`pp * vpp` must divide num_layers, but got "
                f"(pp={self.pp}, vpp={self.vpp}, num_layers={model.num_layers})"
            )
        # A model chunk holds at most ceil(L / (pp * vpp)) layers (any number of them with an
        # explicit pp_layout): a larger quota is a typo, not "recompute more".
        most = model.num_layers if self.pp_layout else -(-model.num_layers // chunks)
        if self.recompute_num_layers > most:
            raise ConfigError(
                f"`recompute_num_layers` (layers recomputed per model chunk) must be at most "
                f"the {most} a chunk holds, but got {self.recompute_num_layers} "
                f"(num_layers={model.num_layers}, pp={self.pp}, vpp={self.vpp}; 0 recomputes "
                f"them all)")
        if self.ep > 1 and not model.is_moe:
            raise ConfigError(f"`ep > 1` needs a MoE model, but {model.name} is dense")
        if self.mla_rope_fusion and model.attention != "mla":
            raise ConfigError(f"`mla_rope_fusion` needs multi-latent attention, but "
                              f"{model.name} has attention={model.attention!r}")
        if model.is_moe and model.num_experts % self.ep:
            raise ConfigError(
                f"`ep` must divide num_experts, but got "
                f"(ep={self.ep}, num_experts={model.num_experts})"
            )
        if self.pp_layout:
            layers = sum(st.count("t") for st in pp_layout_stages(self.pp_layout))
            if layers != model.num_layers:
                raise ConfigError(
                    f"`pp_layout` must place every decoder layer (num_layers="
                    f"{model.num_layers}), but {self.pp_layout!r} places {layers}")
        if self.seq_len % (2 * self.cp) and self.cp > 1:
            raise ConfigError(
                f"`seq_len` must be divisible by 2*cp (zigzag chunks), but got "
                f"(seq_len={self.seq_len}, cp={self.cp})"
            )

    # ------------------------------------------------------------------ I/O
    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, where: str = "layout") -> Layout:
        """Build from a mapping (YAML), rejecting unknown keys with the allowed ones and values
        of the wrong kind (``config_fields.typed_kwargs``)."""
        return cls(**typed_kwargs(cls, data, where))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> Layout:
        return dataclasses.replace(self, **changes)


def check_layout_on_cluster(layout: Layout, cluster: Any, *, gpu_count: bool = True) -> None:
    """``layout`` fits ``cluster`` (a ``ClusterSpec``): its GPUs are at most the cluster's
    (unless not ``gpu_count``: a per-GPU memory report only needs the GPU type) and its GEMM
    precision is a tensor-core format of the cluster's GPU (no fp8 on an A100).

    Raises:
        ConfigError: naming the field, the cluster and what it allows.
    """
    if gpu_count and layout.num_gpus > cluster.num_gpus:
        raise ConfigError(f"`tp * pp * dp * cp <= cluster GPUs` must hold, but got "
                          f"({layout.num_gpus} > {cluster.num_gpus} in {cluster.name})")
    peaks = set(cluster.gpu.peak_flops_per_s)
    if peaks & {"bf16", "fp16"}:  # 16-bit formats stand in for each other (GpuSpec.peak_flops)
        peaks |= {"bf16", "fp16"}
    if layout.precision not in peaks:
        formats = [p for p in PRECISIONS if p in peaks]
        raise ConfigError(f"`precision` {layout.precision!r} is not a tensor-core format of "
                          f"{cluster.gpu.name} (cluster {cluster.name}); allowed there: "
                          f"{formats}")


def as_layout(value: Any, *, hint: str = "") -> Layout:
    """``value`` as a ``Layout``: a ``Layout`` as is, a mapping through ``Layout.from_dict``;
    ``ConfigError`` for anything else (``hint`` is added to the message, e.g. the call's
    argument order)."""
    if isinstance(value, Layout):
        return value
    if isinstance(value, Mapping):
        return Layout.from_dict(value)
    got = f"str {value!r}" if isinstance(value, str) else type(value).__name__
    raise ConfigError(f"`layout` must be a Layout or a mapping of its fields, but got "
                      f"{got}{hint}")


#: Tokens of ``Layout.pp_layout`` (Megatron-Core's ``PipelineParallelLayerLayout`` symbols this
#: simulator places; its ``m``, an MTP layer, is not simulated).
PP_LAYOUT_TOKENS = ("E", "t", "L")


def pp_layout_stages(text: str) -> list[list[str]]:
    """The stages of a ``Layout.pp_layout`` string, each a list of ``E`` / ``t`` / ``L``.

    ``(...)*n`` repeats its contents ``n`` times (nesting allowed); spaces are ignored.

    >>> [len(s) for s in pp_layout_stages("Et|(tt|)*2L")]
    [2, 2, 2, 1]
    """
    def expand(src: str) -> str:
        out, i = [], 0
        while i < len(src):
            ch = src[i]
            if ch == "(":
                depth, j = 1, i + 1
                while j < len(src) and depth:
                    depth += {"(": 1, ")": -1}.get(src[j], 0)
                    j += 1
                if depth or not src[j:j + 1] == "*":
                    raise ConfigError(f"`pp_layout`: '(' must close and be followed by '*n', "
                                      f"but got {text!r}")
                k = j + 1
                while k < len(src) and src[k].isdigit():
                    k += 1
                if k == j + 1:
                    raise ConfigError(f"`pp_layout`: '*' must be followed by a count, but got "
                                      f"{text!r}")
                out.append(expand(src[i + 1:j - 1]) * int(src[j + 1:k]))
                i = k
            else:
                out.append(ch)
                i += 1
        return "".join(out)

    flat = expand("".join(str(text).split()))
    stages = [list(part) for part in flat.split("|")]
    bad = sorted({tok for st in stages for tok in st if tok not in PP_LAYOUT_TOKENS})
    if bad:
        raise ConfigError(f"`pp_layout` symbols must be one of {list(PP_LAYOUT_TOKENS)} (and "
                          f"'|', '(...)*n'), but got {bad} in {text!r}")
    for i, st in enumerate(stages):
        if "E" in st and (i != 0 or st.index("E") != 0 or st.count("E") > 1):
            raise ConfigError(f"`pp_layout`: 'E' (embedding) must open the first stage, but "
                              f"got {text!r}")
        if "L" in st and (i != len(stages) - 1 or st[-1] != "L" or st.count("L") > 1):
            raise ConfigError(f"`pp_layout`: 'L' (LM head) must close the last stage, but got "
                              f"{text!r}")
    return stages


def _choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"`{name}` must be one of {list(allowed)}, but got {value!r}")
