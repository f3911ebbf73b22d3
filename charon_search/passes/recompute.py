"""Activation recompute: forward ops re-inserted at the start of the backward graph.

* ``selective`` (Korthikanti et al., arXiv 2205.05198, section 5): the attention core
  (role ``attn.core``: scores, softmax, dropout, context / the fused attention kernel).
* ``selective`` with ``selective_policy="op"`` (torchtitan's op-level selective activation
  checkpointing, ``_custom_policy`` in torchtitan ``parallelize_llama.py``, 2024): the outputs
  of matmuls, attention kernels and reduce-scatters are saved, except every second matmul
  (forward order); everything else (norms, RoPE, activations, elementwise ops, copies, the
  fp8 casts) and those matmuls are re-run. So are the sequence-parallel all-gathers in front
  of the attention and MLP matmuls: torchtitan's save list (``_save_list``: ``mm``, the SDPA
  kernels, ``reduce_scatter_tensor``, ``max``) holds no all-gather, and the backward needs
  the gathered input (the recomputed matmuls read it, the weight gradients of the saved ones
  too), so SAC re-runs the collective, as it re-ran the MoE all-to-alls until torchtitan
  added them to the list (pytorch/torchtitan#1672, 2025-09: DeepSeek-16B EP 4 708 -> 803
  tokens/s once saved). With ``sac_saves_reduce_scatter`` off (torchtitan of spring-summer
  2025: pytorch/torchtitan#965 took ``reduce_scatter_tensor`` out of the list, because a saved
  reduce-scatter broke async TP's matmul-reduce-scatter pattern, pytorch/pytorch#149876) the
  TP reduce-scatters are re-run too, those whose output the backward needs: under
  torch.compile the partitioner recomputes only what the backward reads. That is the
  attention output's (its sum with the residual is the MLP norm's input; "only 1 of the 2
  reduce-scatter nodes has the final return/output node as a 2nd user", pytorch/pytorch#149876),
  with the output-projection matmul feeding it; the MLP's feeds only the block output.
* ``selective`` with ``recompute_modules`` (Megatron-Core ``--recompute-modules``,
  ``megatron/core/transformer/transformer_config.py``): ``core_attn`` the attention core,
  ``moe_act`` the activation between the expert GEMMs, ``layernorm`` the input and pre-MLP
  norms, ``mla_up_proj`` MLA's latent norms, query / key-value up-projections (``q_b_proj``,
  ``kv_b_proj``) and RoPE, ``mlp`` the dense MLP, ``moe`` the whole MoE layer (router,
  dispatch, experts, combine, shared experts), ``shared_experts`` the shared experts; the
  union of the listed modules is re-run, nothing else.
* ``full``: the whole block forward, collectives included (Megatron ``--recompute-granularity
  full``).

No policy re-runs the forward's FSDP parameter all-gathers (``fsdp`` pass, group ``dp``): the
recompute runs inside the layer's backward, after FSDP's pre-backward unshard has gathered the
parameters the backward GEMMs need, and the checkpointed module sits inside the sharded unit
(``fully_shard(checkpoint_wrapper(block))`` in torchtitan, Composer's
``apply_activation_checkpointing`` under FSDP1), so its re-run forward fires no second unshard.
The backward's one all-gather (``fsdp_all_gather_bwd``) serves both.

The backward graph must carry its (already rewritten) forward graph in
``meta["forward_graph"]`` (``parallelize_block`` puts it there). Recomputed nodes get phase
``recompute``, fresh ids and fresh output tensors; backward readers of the original outputs
read the recomputed ones.
"""

from __future__ import annotations

from charon_search.errors import PassError
from charon_search.ir import Node, OpGraph, OpKind, Phase, Role
from charon_search.passes._rewrite import GraphBuilder
from charon_search.passes.base import PASSES, Pass, PassContext, PassResult, must_run_before

__all__ = ["RecomputePass", "module_nodes"]


_SAVED_KINDS = frozenset({OpKind.ATTENTION, OpKind.GROUPED_GEMM, OpKind.EMBEDDING})
#: Megatron-Core recompute module -> the node roles it re-runs (``moe_act``: only the
#: elementwise activation of the routed experts, not their grouped GEMMs).
_MODULE_ROLES: dict[str, frozenset[Role]] = {
    "core_attn": frozenset({Role.ATTN_CORE}),
    "layernorm": frozenset({Role.ATTN_NORM, Role.MLP_NORM}),
    "mlp": frozenset({Role.MLP_IN, Role.MLP_ACT, Role.MLP_OUT}),
    "moe": frozenset({Role.MOE_ROUTER, Role.MOE_DISPATCH, Role.MOE_EXPERT, Role.MOE_COMBINE,
                      Role.MOE_SHARED}),
    "shared_experts": frozenset({Role.MOE_SHARED}),
    "moe_act": frozenset(),
    "mla_up_proj": frozenset(),
}


def _mla_up_proj(n: Node) -> bool:
    """MLA's up-projection part: latent norms, ``q_b_proj`` / ``kv_b_proj`` and RoPE."""
    if n.role == Role.ATTN_ROPE:
        return True
    if n.role != Role.ATTN_QKV:
        return False
    return n.kind == OpKind.NORM or n.module_path.endswith(("q_b_proj", "kv_b_proj"))


def module_nodes(fwd: OpGraph, modules: tuple[str, ...] | list[str]) -> list[Node]:
    """Forward nodes Megatron-Core ``--recompute-modules`` re-runs (the compute side here; the
    memory model's per-module saved bytes, ``memory.liveness``, use the same selection)."""
    unknown = sorted(set(modules) - set(_MODULE_ROLES))
    if unknown:
        raise PassError(f"recompute_modules must be among {sorted(_MODULE_ROLES)}, got "
                        f"{unknown}")
    roles = frozenset().union(*(_MODULE_ROLES[m] for m in modules))
    out = []
    for n in fwd.nodes:
        if n.role in roles:  # a checkpointed module re-runs its collectives too
            out.append(n)
        elif "mla_up_proj" in modules and _mla_up_proj(n):
            out.append(n)
        elif ("moe_act" in modules and n.role == Role.MOE_EXPERT
              and n.kind == OpKind.ELEMENTWISE and not n.target.startswith("pass:")):
            out.append(n)
    return out


def _is_param_gather(n: Node) -> bool:
    """An FSDP parameter all-gather the ``fsdp`` pass put into the forward."""
    return n.is_comm and n.group == "dp" and "fsdp" in n.tags


def _is_tp_gather(n: Node) -> bool:
    """A sequence-parallel all-gather of activations (not an FSDP parameter gather)."""
    return (n.is_comm and n.kind == OpKind.ALL_GATHER and n.group == "tp"
            and "fsdp" not in n.tags)


def _is_tp_reduce_scatter(n: Node) -> bool:
    """A sequence-parallel reduce-scatter of a row GEMM's partial sums."""
    return n.is_comm and n.kind == OpKind.REDUCE_SCATTER and n.group == "tp"


def _needed(fwd: OpGraph, candidates: set[int], reads: set[int]) -> set[int]:
    """Ids of the ``candidates`` (forward node ids) whose outputs the backward needs: read by
    a backward node (``reads``), or by a needed candidate. Other forward nodes are saved."""
    need, out = set(reads), set()
    for n in reversed(fwd.nodes):
        if n.id in candidates and any(t in need for t in n.outputs):
            out.add(n.id)
            need.update(n.inputs)
    return out


def _op_sac(fwd: OpGraph, bwd: OpGraph | None = None,
            saves_reduce_scatter: bool = True) -> list[Node]:
    """torchtitan op-level SAC: recompute non-saved ops (sequence-parallel all-gathers
    included) and every second (even) matmul; the fp8 casts feeding a recomputed matmul are
    re-run with it. Without ``saves_reduce_scatter``, the TP reduce-scatters whose outputs the
    backward ``bwd`` needs through recomputed ops are re-run as well."""
    out, mm = [], 0
    for n in fwd.nodes:
        if _is_tp_gather(n) or (not saves_reduce_scatter and _is_tp_reduce_scatter(n)):
            out.append(n)
            continue
        # Kernels the fusion pass merged (elementwise runs, the fused bias-dropout-add) are
        # re-run like the ops they merge; other pass-inserted nodes (collectives, fp8 casts,
        # joins) are handled above, below or not at all.
        if n.is_comm or n.kind in _SAVED_KINDS or (
                n.target.startswith("pass:") and n.target != "pass:fusion"):
            continue
        if n.kind == OpKind.GEMM:
            mm += 1
            if mm % 2:
                continue
        out.append(n)
    # The fp8 pass's casts (``pass:fp8``) of a recomputed matmul's inputs.
    rerun_reads = {t for n in out for t in n.inputs}
    casts = {n.id for n in fwd.nodes if n.target == "pass:fp8"
             and any(t in rerun_reads for t in n.outputs)}
    chosen = {n.id for n in out} | casts
    if not saves_reduce_scatter and bwd is not None:
        rs = {n.id for n in fwd.nodes if _is_tp_reduce_scatter(n)}
        # The backward reads forward tensors as its inputs (saved activations); ids the passes
        # gave forward-inserted tensors may also name backward tensors, so only inputs count.
        chosen -= rs - _needed(fwd, chosen, set(bwd.inputs))
    return [n for n in fwd.nodes if n.id in chosen]


@PASSES.register("recompute")
class RecomputePass(Pass):
    name = "recompute"

    def enabled(self, ctx: PassContext) -> bool:
        return ctx.recompute != "none" and ctx.phase == "train"

    def requires(self, graph: OpGraph, ctx: PassContext) -> None:
        if graph.meta.get("direction", "backward") == "forward":
            return
        if "forward_graph" not in graph.meta:
            raise PassError(f"recompute: backward graph {graph.name!r} lacks "
                            "meta['forward_graph']")

    def run(self, graph: OpGraph, ctx: PassContext) -> PassResult:
        if graph.meta.get("direction", "backward") == "forward":
            return PassResult(graph, False)
        fwd: OpGraph = graph.meta["forward_graph"]
        if ctx.recompute == "full":
            chosen = list(fwd.nodes)
        elif ctx.recompute_modules:
            chosen = module_nodes(fwd, ctx.recompute_modules)
        elif ctx.selective_policy == "op":
            chosen = _op_sac(fwd, graph, ctx.sac_saves_reduce_scatter)
        else:
            chosen = [n for n in fwd.nodes if n.role == Role.ATTN_CORE]
        # Parameter all-gathers are not re-run (module docstring): their outputs, read by the
        # recomputed GEMMs, are dropped from those nodes' inputs.
        gathered = {t for n in chosen if _is_param_gather(n) for t in n.outputs}
        chosen = [n for n in chosen if not _is_param_gather(n)]
        if not chosen:
            return PassResult(graph, False)
        gb = GraphBuilder(graph)
        # Fresh ids must not collide with the forward graph either.
        fid, ftid = fwd.next_ids()
        gb.next_node_id = max(gb.next_node_id, fid)
        gb.next_tensor_id = max(gb.next_tensor_id, ftid)
        gb.names |= {n.name for n in fwd.nodes}
        for t, spec in fwd.tensors.items():
            gb.tensors.setdefault(t, spec)
        # Tensors the passes inserted into the forward (collective / cast outputs) have ids of
        # the forward graph that may name a different tensor of the backward graph: such
        # forward tensors get fresh ids here. Saved activations (backward inputs) keep theirs.
        bwd_made = {t for n in graph.nodes for t in n.outputs}
        bwd_in = set(graph.inputs)
        # Collective outputs and fp8 casts are fresh tensors of the forward: an id of theirs that
        # the backward also uses (its output gradient, say) names another tensor there.
        inserted = {t for n in fwd.nodes if n.is_comm or n.target == "pass:fp8"
                    for t in n.outputs}
        relabel: dict[int, int] = {}

        def fwd_id(t: int) -> int:
            if (t in bwd_made and t not in bwd_in) or (t in inserted and t in graph.tensors):
                if t not in relabel:
                    relabel[t] = gb.new_tensor(fwd.tensors[t])
                return relabel[t]
            return t

        for n in chosen:
            outs = tuple(gb.new_tensor(fwd.tensors[t]) for t in n.outputs)
            new = n.replace(id=gb.fresh_id(), name=gb.unique_name(f"recompute_{n.name}"),
                            phase=Phase.RECOMPUTE, outputs=outs,
                            inputs=tuple(fwd_id(t) for t in n.inputs if t not in gathered),
                            tags=n.tags | {"recompute"})
            gb.add(new)
            for old, t in zip(n.outputs, outs, strict=True):
                gb.rename[fwd_id(old)] = t
        for n in graph.nodes:
            gb.add(n)
        # Recomputed nodes read forward tensors: make them visible as graph inputs.
        produced = {t for n in gb.nodes for t in n.outputs}
        extra = tuple(sorted({t for n in gb.nodes for t in n.inputs
                              if t not in produced and t not in graph.inputs}))
        out = gb.finish()
        out = out.with_nodes(out.nodes, inputs=graph.inputs + extra)
        return PassResult(out, True)


for _before in ("tp", "cp", "ep", "fusion", "fp8"):
    must_run_before(_before, "recompute")
