"""Static memory per GPU: parameters, gradients, optimizer states and persistent buffers.

Parameters are split into sharding groups once per block (from the roles of the nodes that read
each weight): ``tp`` weights (QKV/out/MLP/shared-expert projections, vocab-parallel embedding and
LM head) divide by ``tp``; ``rep`` weights (norms, router, learned position embeddings) are
replicated; ``expert`` weights divide by ``ep``. ZeRO then shards over the data-parallel
group: stage 1 the optimizer states, stage 2 also the gradients, stage 3 also the parameters
(Rajbhandari et al., arXiv 1910.02054, Fig. 1: ``(2 + 2 + K) Ψ`` with ``K = 12`` for
mixed-precision Adam).
"""

from __future__ import annotations

from dataclasses import dataclass

from charon_search.catalog.spec import ModelSpec, is_moe_block
from charon_search.errors import ConfigError
from charon_search.ir.graph import TracedBlock
from charon_search.ir.ops import Role
from charon_search.passes.tensor_parallel import is_replicated_gemm, position_table

__all__ = [
    "STATE_RECIPES",
    "ParamGroups",
    "StateRecipe",
    "StateTriple",
    "analytic_param_groups",
    "shard_states",
    "traced_param_groups",
]

_TP_WEIGHT_ROLES = frozenset({
    Role.ATTN_QKV, Role.ATTN_OUT, Role.MLP_IN, Role.MLP_OUT, Role.MOE_SHARED, Role.EMBED,
    Role.LM_HEAD,
})


@dataclass(frozen=True, slots=True, kw_only=True)
class StateRecipe:
    """Bytes per parameter of each kind of training state."""

    param_bytes: float = 2.0
    """Working (compute-dtype) parameter copy."""
    grad_bytes: float = 2.0
    """Gradient buffer."""
    optimizer_bytes: float = 12.0
    """Optimizer states: fp32 master + Adam m + v = 4 + 4 + 4."""
    gathered_param_bytes: float = 2.0
    """ZeRO-3/FSDP: bytes of one all-gathered (unsharded) parameter in flight."""
    reduce_buffer_bytes: float = 0.0
    """Bytes per parameter of the reduce-scatter input buffer of one unit (FSDP2's
    ``foreach_reduce`` copies the unit's gradients into a buffer of its ``reduce_dtype``, fp32
    or the parameters' bf16 alike: ``torch/distributed/fsdp/_fully_shard/
    _fsdp_collectives.py``; ``memory.report`` sizes it in ``Layout.grad_reduce_dtype``)."""
    fsdp: bool = False
    """PyTorch FSDP semantics: ``param_bytes`` is the sharded storage (sharded from stage 2 on),
    and stage 2 (no reshard after forward) also holds every gathered ``gathered_param_bytes``
    copy for the whole step."""


#: Named recipes. ``mixed``: ZeRO paper mixed-precision Adam (16 B/param). ``megatron``:
#: Megatron-LM
#: with bf16 and fp32 gradient accumulation (``accumulate_allreduce_grads_in_fp32``, 18 B/param,
#: Megatron-Core distributed-optimizer docs). ``fsdp2``: FSDP2 with fp32 sharded parameters and
#: ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` (torchtitan): 4 + 4 + 8.
#: ``sgd``: fp32 master + momentum.
STATE_RECIPES: dict[str, StateRecipe] = {
    "mixed": StateRecipe(),
    "megatron": StateRecipe(grad_bytes=4.0),
    "fsdp2": StateRecipe(param_bytes=4.0, grad_bytes=4.0, optimizer_bytes=8.0,
                         reduce_buffer_bytes=4.0, fsdp=True),
    "sgd": StateRecipe(optimizer_bytes=8.0),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ParamGroups:
    """Parameter counts of one block instance by sharding group."""

    tp: float = 0.0
    rep: float = 0.0
    expert: float = 0.0
    source: str = "traced"
    """``traced`` (from weight consumers) or ``analytic`` (from the config's shapes)."""
    by_role: tuple[tuple[str, float, float, float], ...] = ()
    """(role, tp, rep, expert) parameters per role of the node that reads them (traced
    blocks only; ``()`` = not known): what a quantized checkpoint stores per GEMM role."""

    @property
    def total(self) -> float:
        return self.tp + self.rep + self.expert

    def local(self, *, tp: int, ep: int, expert_tp: bool = False) -> tuple[float, float]:
        """(dense, expert) parameters held by one GPU."""
        return self.tp / tp + self.rep, self.expert / ep / (tp if expert_tp else 1)


def traced_param_groups(block: TracedBlock) -> ParamGroups:
    """Group ``block``'s weights by the roles of the forward nodes that read them."""
    fwd = block.forward
    tp = rep = expert = 0.0
    by_role: dict[str, list[float]] = {}
    for t in fwd.param_tensors:
        numel = fwd.tensors[t].numel
        n = numel.const_value() if numel.is_const() else 0.0
        users = [fwd.node(nid) for nid in fwd.consumers.get(t, ())]
        roles = {u.role for u in users}
        if users and all(is_replicated_gemm(u) or position_table(u) for u in users):
            # MLA down-projections and learned position tables: every TP rank holds them
            # whole (the TP pass keeps them replicated, as Megatron, vLLM and SGLang do).
            rep += n
            role, group = users[0].role, 1
        elif Role.MOE_EXPERT in roles:
            expert += n
            role, group = Role.MOE_EXPERT, 2
        elif roles & _TP_WEIGHT_ROLES:
            tp += n
            role, group = min(roles & _TP_WEIGHT_ROLES, key=str), 0
        else:
            rep += n
            role, group = (min(roles, key=str) if roles else ""), 1
        by_role.setdefault(str(getattr(role, "value", role)), [0.0, 0.0, 0.0])[group] += n
    return ParamGroups(tp=tp, rep=rep, expert=expert,
                       by_role=tuple((r, *v) for r, v in sorted(by_role.items())))


def analytic_param_groups(spec: ModelSpec, block_name: str) -> ParamGroups:
    """Parameter groups from a ``ModelSpec``'s shapes (when a traced block lists no weights).

    Standard decoder shapes: Q/K/V/O projections, a (gated) MLP or routed + shared experts with a
    router, two norms; the embedding and the LM head (+ final norm). MLA and biases are not
    modelled here; the traced path covers them.
    """
    h = spec.hidden_size
    heads, kv, d = spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim
    v_d = spec.v_head_dim or d
    mats = 3 if spec.gated_mlp else 2
    if block_name == "embedding":
        return ParamGroups(tp=spec.vocab_size * h, source="analytic")
    if block_name == "lm_head":
        tied = spec.tie_word_embeddings
        return ParamGroups(tp=0 if tied else spec.vocab_size * h, rep=h,
                           source="analytic")
    attn = h * heads * d + 2 * h * kv * d + heads * v_d * h
    if is_moe_block(block_name):
        e, ffn = spec.num_experts, spec.moe_intermediate_size
        shared = spec.num_shared_experts * mats * h * ffn
        return ParamGroups(tp=attn + shared, rep=2 * h + e * h, expert=e * mats * h * ffn,
                           source="analytic")
    return ParamGroups(tp=attn + mats * h * spec.intermediate_size, rep=2 * h,
                       source="analytic")


def shard_states(*, dense_params: float, expert_params: float, zero_stage: int,
                 dense_shards: int, expert_shards: int, recipe: StateRecipe) -> StateTriple:
    """Bytes of (params, grads, optimizer) after ZeRO sharding.

    Args:
        dense_params: Non-expert parameters on this GPU (after TP/PP).
        expert_params: Expert parameters on this GPU (after EP).
        zero_stage: 0-3.
        dense_shards: Data-parallel ranks the dense states are sharded over (dp * cp, or the
            HSDP shard group).
        expert_shards: Ranks expert states are sharded over (the expert-data-parallel group).
        recipe: Bytes per parameter.
    """
    if zero_stage not in (0, 1, 2, 3):
        raise ConfigError(f"`zero_stage` must be one of [0, 1, 2, 3], but got {zero_stage!r}")
    out = [0.0, 0.0, 0.0]
    for n, d in ((dense_params, dense_shards), (expert_params, expert_shards)):
        d = max(1, d)
        if recipe.fsdp and zero_stage == 2:
            out[0] += n * recipe.param_bytes / d + n * recipe.gathered_param_bytes
        else:
            out[0] += n * recipe.param_bytes / (d if zero_stage >= 3 else 1)
        out[1] += n * recipe.grad_bytes / (d if zero_stage >= 2 else 1)
        out[2] += n * recipe.optimizer_bytes / (d if zero_stage >= 1 else 1)
    return StateTriple(params_bytes=out[0], grads_bytes=out[1], optimizer_bytes=out[2])


@dataclass(frozen=True, slots=True, kw_only=True)
class StateTriple:
    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes
