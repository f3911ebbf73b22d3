"""Kernel fusion by pattern and FP8 quantization.

``fusion`` (on when ``fused_kernels``):

* runs of consecutive ops sharing a fusable role become one kernel: fused RMSNorm
  (``attn.norm``, ``mlp.norm``, ``final_norm``, ``attn.qk_norm``), fused RoPE (``attn.rope``)
  and fused SwiGLU (``mlp.act``). FLOPs add up; HBM bytes become the run's external inputs and
  the outputs used outside it (intermediates stay in registers / shared memory);
* with ``moe_fused_permute`` (Megatron-Core ``--moe-permute-fusion`` and
  ``--moe-router-fusion``: Transformer Engine's ``moe_permute`` / ``moe_unpermute`` with the
  routing probabilities, and the fused router score / top-k kernel) the runs of the router's
  (``moe.router``), the dispatch's (``moe.dispatch``) and the combine's (``moe.combine``)
  local ops (copies, gathers, scatters, products, sums, top-k; not the router GEMM) are one
  kernel each, moving only the run's external inputs and outputs;
* bias-dropout-add: a dropout whose dropped values only feed the next op, a residual add,
  becomes one kernel with it (Megatron-LM's ``bias_dropout_add_fused_train``, a TorchScript
  function fused by the legacy fuser, whose CUDA lowering of dropout is ``rand_like`` for
  fusion, and by nvFuser from PyTorch 1.10; Megatron-Core's ``fused_bias_dropout``; Inductor
  under torch.compile). It reads the input and the residual and writes the sum and the 1-byte
  mask: 7 B per bf16 element instead of 5 + 6 B in two kernels. The fused node is a residual
  add (priced from the measured residual-add kernels at its own bytes);
* ``norm_impl == "persistent"``: the LayerNorms are tagged ``PERSISTENT_NORM_TAG`` and priced
  at the roofline (``sim.costing``): apex ``FastLayerNorm`` (apex PR #1037, 2021: 16-byte
  vectorized loads, the row kept in registers, a backward that reads ``dy`` and ``x`` once)
  measured 1258 GB/s forward and 1163 GB/s backward on GA100 against 896 and 572 GB/s for the
  earlier apex kernel, i.e. ~0.8 of the A100-40GB's 1555 GB/s, the roofline's memory
  efficiency. Megatron-LM's ``MixedFusedLayerNorm`` runs it (``persist_layer_norm``, 2022) for
  the hidden sizes of its ``persist_ln_hidden_sizes`` list;
* eager attention (``attn.core`` batched GEMMs + softmax) becomes one flash-attention kernel
  (``attention`` / ``attention_bwd``). Over a square score block (``q_len == kv_len``: prefill,
  training) its FLOPs are halved for the causal mask, whose masked half flash skips, and the
  node carries ``causal=1``; a decode step (one query over the cache) skips nothing and keeps
  ``causal=0`` and the full FLOPs, as a traced SDPA decode node does.

``fp8`` (on when ``precision == "fp8"``): the GEMMs of attention and MLP blocks (and expert
grouped GEMMs, by the same rules) run in fp8; quantize ops are inserted on their activation
inputs, and a GEMM's reads halve (its fp8 operands; the output stays bf16):

* Hopper fp8 tensor cores only take the "TN" layout (both operands K-major; cuBLASLt fp8
  requirement, NVIDIA cuBLAS docs "cublasLtMatmul ... FP8"), so the weight-gradient GEMM
  ``dW = dY^T X`` needs its own transposed fp8 copies of ``dY`` and of the saved input ``X``:
  a tensor read by a forward/dgrad GEMM and by a wgrad GEMM is quantized once per layout.
* Dynamic scaling (``fp8_recipe`` ``tensorwise`` / ``rowwise``: torchao ``Float8Linear``, as in
  torchtitan) computes the amax of the bf16 tensor right before casting it: two reads of the
  input (amax reduction, then scale-and-cast) and one fp8 write per element. ``delayed``
  (Transformer Engine's amax history, Megatron / llm-foundry) fuses the amax into the cast
  (one read); ``blockwise`` (1x128 / 128x128 scales, DeepSeek-V3) computes the block amax inside
  the cast kernel (one read, 25 % more for the per-block scales). Transformer Engine writes
  the transposed copy in the same kernel (``fp8_cast_transpose_fused``; not with sequence
  parallelism), so under ``delayed`` the ``_t`` quantize only writes.

Not modelled: weight casts (``N x K / tp`` elements per GEMM, small next to ``M x K``
activations at training token counts) and fp8 all-gathers. NB: the LM head, router and
embedding stay bf16, as in Transformer Engine's default recipe.
"""

from __future__ import annotations

from collections.abc import Callable

from charon_search.errors import ConfigError
from charon_search.ir import (
    ATTENTION_BWD_FLOP_RATIO,
    DTYPE_BYTES,
    Node,
    OpGraph,
    OpKind,
    Phase,
    Poly,
    Role,
    sym,
)
from charon_search.passes._rewrite import GraphBuilder, gemm_kind
from charon_search.passes.base import PASSES, Pass, PassContext, PassResult, must_run_before

__all__ = ["FUSABLE_KINDS", "FUSABLE_ROLES", "PERSISTENT_NORM_TAG", "FP8Pass", "FusionPass",
           "attention_params", "bias_dropout_add_pairs", "external_tensors", "square_scores"]

#: Tag of a LayerNorm run by apex's persistent ``FastLayerNorm`` (``norm_impl="persistent"``).
PERSISTENT_NORM_TAG = "persistent_norm"
#: Norm roles that are LayerNorms of the residual stream (the ones ``FastLayerNorm`` replaces).
_LAYER_NORM_ROLES = frozenset({Role.ATTN_NORM, Role.MLP_NORM, Role.FINAL_NORM})

FUSABLE_ROLES = frozenset({Role.ATTN_NORM, Role.MLP_NORM, Role.FINAL_NORM, Role.ATTN_QK_NORM,
                           Role.ATTN_ROPE, Role.MLP_ACT})
FUSABLE_KINDS = frozenset({OpKind.ELEMENTWISE, OpKind.COPY, OpKind.NORM})
#: Roles and kinds fused under ``moe_fused_permute``.
MOE_PERMUTE_ROLES = frozenset({Role.MOE_ROUTER, Role.MOE_DISPATCH, Role.MOE_COMBINE})
MOE_PERMUTE_KINDS = FUSABLE_KINDS | {OpKind.MOE_ROUTING, OpKind.REDUCTION}
_EAGER_ATTN_KINDS = frozenset({OpKind.BATCHED_GEMM, OpKind.SOFTMAX, OpKind.ELEMENTWISE,
                               OpKind.COPY})
#: Reads of the high-precision input per quantize, by recipe (see the module docstring).
FP8_CAST_READS = {"tensorwise": 2.0, "rowwise": 2.0, "delayed": 1.0, "blockwise": 1.25}
FP8_RECIPES = tuple(FP8_CAST_READS)
#: Recipes whose cast kernel also writes the transposed fp8 copy (Transformer Engine).
FP8_CAST_TRANSPOSE_FUSED = frozenset({"delayed"})
FP8_ROLES = frozenset({Role.ATTN_QKV, Role.ATTN_OUT, Role.MLP_IN, Role.MLP_OUT,
                       Role.MOE_SHARED, Role.MOE_EXPERT})
_FLOAT_DTYPES = frozenset({"fp32", "tf32", "bf16", "fp16"})
#: torchao rowwise recipe, forward GEMMs: PyTorch's CUTLASS rowwise ``_scaled_mm`` (fast
#: accumulation) reaches "90-100% of tensor-wise efficiency" on most shapes
#: (pytorch/pytorch#147971, H100, relative to the cuBLAS tensorwise kernel) -> middle 0.95.
ROWWISE_FWD_GEMM_EFFICIENCY = 0.95


def _runs(graph: OpGraph, key: Callable[[Node], object]) -> list[tuple[int, int]]:
    """Maximal index ranges ``[i, j)`` of consecutive nodes with equal non-None ``key``."""
    out, i, n = [], 0, len(graph.nodes)
    while i < n:
        k = key(graph.nodes[i])
        j = i + 1
        if k is not None:
            while j < n and key(graph.nodes[j]) == k:
                j += 1
            if j - i > 1:
                out.append((i, j))
        i = j
    return out


def external_tensors(graph: OpGraph, nodes: list[Node]) -> tuple[list[int], list[int]]:
    """(inputs, outputs) of ``nodes`` as one kernel: the tensors they read that none of them
    writes, and those they write that the graph returns or another node reads."""
    produced = {t for n in nodes for t in n.outputs}
    ext_in = list(dict.fromkeys(t for n in nodes for t in n.inputs if t not in produced))
    inside = {n.id for n in nodes}
    graph_out = set(graph.outputs)
    ext_out = [t for n in nodes for t in n.outputs
               if t in graph_out or any(c not in inside for c in graph.consumers.get(t, ()))]
    return ext_in, ext_out


def _merge(graph: OpGraph, nodes: list[Node], *, kind: OpKind, name: str,
           params: dict[str, Poly], flops: Poly | None = None) -> Node:
    ext_in, ext_out = external_tensors(graph, nodes)
    if not ext_out:
        ext_out = list(nodes[-1].outputs)
    first = nodes[0]
    return first.replace(
        name=name, kind=kind, inputs=tuple(ext_in), outputs=tuple(ext_out),
        flops=flops if flops is not None else sum((n.flops for n in nodes), Poly()),
        bytes_read=sum((graph.tensors[t].nbytes for t in ext_in), Poly()),
        bytes_written=sum((graph.tensors[t].nbytes for t in ext_out), Poly()),
        params=params, target="pass:fusion", tags=first.tags | {"fused"})


def bias_dropout_add_pairs(graph: OpGraph) -> list[int]:
    """Indices ``i`` where node ``i`` is a dropout whose dropped values feed only node
    ``i + 1``, a residual add (Megatron's bias-dropout-add)."""
    nodes, consumers = graph.nodes, graph.consumers
    out = []
    for i, n in enumerate(nodes[:-1]):
        nxt = nodes[i + 1]
        if (n.kind != OpKind.ELEMENTWISE or not n.target.startswith("aten.native_dropout.")
                or not n.outputs or nxt.kind != OpKind.ELEMENTWISE
                or nxt.role != Role.RESIDUAL):
            continue
        y = n.outputs[0]
        if y in nxt.inputs and tuple(consumers.get(y, ())) == (nxt.id,) \
                and y not in graph.outputs:
            out.append(i)
    return out


def _fuse_bias_dropout_add(graph: OpGraph, drop: Node, add: Node) -> Node:
    """One kernel for ``drop`` (dropout) and ``add`` (residual add of its dropped values): it
    reads the dropout's and the add's other inputs and writes the add's output and the mask."""
    y = drop.outputs[0]
    ins = tuple(dict.fromkeys((*drop.inputs, *(t for t in add.inputs if t != y))))
    outs = (*add.outputs, *drop.outputs[1:])
    return add.replace(
        name=f"fused_bias_dropout_add_{drop.name}", inputs=ins, outputs=outs,
        flops=drop.flops + add.flops,
        bytes_read=sum((graph.tensors[t].nbytes for t in ins), Poly()),
        bytes_written=sum((graph.tensors[t].nbytes for t in outs), Poly()),
        target="pass:fusion", tags=add.tags | {"fused", "bias_dropout_add"})


def _numel(n: Node) -> Poly:
    """Elements of a fusable node (``numel``; ``tokens`` for routing ops)."""
    return n.params.get("numel", n.params.get("tokens", Poly()))


def square_scores(q_len: Poly, kv_len: Poly) -> bool:
    """Whether an attention's queries are its keys (``q_len == kv_len``, a prefill or training
    sequence attending to itself; traced key counts may read ``c`` where the queries read
    ``s``, equal there), so a causal mask leaves out half the score square. A decode step (one
    query over ``c`` cached keys) is not square."""
    c = sym("c")
    return q_len.subs(s=c) == kv_len.subs(s=c)


def attention_params(bmm1: Node, bmm2: Node) -> dict[str, Poly] | None:
    """Flash-attention params of an eager ``scores = Q K^T`` / ``P V`` pair; ``causal`` is 1
    over a square score block (``square_scores``: the LM's causal mask), 0 otherwise."""
    batch = bmm1.params["batch"]
    terms = dict(batch.terms)
    if len(terms) != 1 or (1, 0, 0) not in terms:
        return None  # batch is not heads*b
    heads = terms[(1, 0, 0)]
    q_len, kv_len = bmm1.params["m"], bmm1.params["n"]
    return {"batch": Poly.from_dict({(1, 0, 0): 1.0}), "heads": Poly.const(heads),
            "kv_heads": Poly.const(heads), "q_len": q_len,
            "kv_len": kv_len, "head_dim": bmm1.params["k"],
            "v_head_dim": bmm2.params["n"],
            "causal": Poly.const(1 if square_scores(q_len, kv_len) else 0)}


def _eager_attention_params(nodes: list[Node]) -> dict[str, Poly] | None:
    """Flash-attention params of a run of eager attention-core ops (None: not attention)."""
    bmms = [n for n in nodes if n.kind == OpKind.BATCHED_GEMM]
    if len(bmms) < 2 or not any(n.kind == OpKind.SOFTMAX for n in nodes):
        return None
    return attention_params(bmms[0], bmms[1])


@PASSES.register("fusion")
class FusionPass(Pass):
    name = "fusion"

    def enabled(self, ctx: PassContext) -> bool:
        return ctx.fused_kernels

    def run(self, graph: OpGraph, ctx: PassContext) -> PassResult:
        replace: dict[int, Node] = {}  # first index of a run -> fused node
        drop: set[int] = set()

        def role_key(n: Node) -> str | None:
            if n.role in FUSABLE_ROLES and n.kind in FUSABLE_KINDS:
                return n.role
            if (ctx.moe_fused_permute and n.role in MOE_PERMUTE_ROLES
                    and n.kind in MOE_PERMUTE_KINDS):
                return n.role
            return None

        for i, j in _runs(graph, role_key):
            nodes = list(graph.nodes[i:j])
            norm = next((n for n in nodes if n.kind == OpKind.NORM), None)
            if norm is not None:
                kind, params = OpKind.NORM, dict(norm.params)
            else:
                kind = OpKind.ELEMENTWISE
                big = max(nodes, key=lambda n: _numel(n)(1, 1, 1))
                params = {"numel": _numel(big)}
            replace[i] = _merge(graph, nodes, kind=kind, name=f"fused_{nodes[0].name}",
                                params=params)
            drop.update(range(i + 1, j))

        def attn_key(n: Node) -> str | None:
            if n.role == Role.ATTN_CORE and n.kind in _EAGER_ATTN_KINDS:
                return "bwd" if n.phase.value == "bwd" else "fwd"
            return None

        # The backward's first two batched GEMMs are dV = P^T dO and dP = dO V^T, whose
        # (m, n, k) are not the forward's (q_len, kv_len, head_dim): a backward run takes the
        # shape of the forward's attention of the same index (the forward is already fused).
        fwd_graph = graph.meta.get("forward_graph")
        fwd_params = [] if fwd_graph is None else [
            dict(n.params) for n in fwd_graph.nodes
            if n.kind == OpKind.ATTENTION and n.role == Role.ATTN_CORE]
        bwd_runs = 0
        for i, j in _runs(graph, attn_key):
            nodes = list(graph.nodes[i:j])
            bmms = [n for n in nodes if n.kind == OpKind.BATCHED_GEMM]
            bwd = attn_key(nodes[0]) == "bwd"
            attn_params = _eager_attention_params(nodes)
            if bwd and attn_params is not None:
                if bwd_runs < len(fwd_params) and fwd_params[bwd_runs] is not None:
                    attn_params = fwd_params[bwd_runs]
                else:  # a backward is training's: its sequence attends to itself, causally
                    attn_params["causal"] = Poly.const(1)
                bwd_runs += 1
            if attn_params is None:
                continue
            fwd_flops = sum((n.flops for n in bmms[:2]), Poly())
            if attn_params["causal"].const_value() == 1:
                fwd_flops = fwd_flops / 2  # causal square: flash skips the masked half
            replace[i] = _merge(graph, nodes,
                                kind=OpKind.ATTENTION_BWD if bwd else OpKind.ATTENTION,
                                name=f"flash_{nodes[0].name}", params=attn_params,
                                flops=fwd_flops * ATTENTION_BWD_FLOP_RATIO if bwd
                                else fwd_flops)
            drop.update(range(i + 1, j))
        for i in bias_dropout_add_pairs(graph):
            if i in replace or i in drop or i + 1 in replace or i + 1 in drop:
                continue
            replace[i] = _fuse_bias_dropout_add(graph, graph.nodes[i], graph.nodes[i + 1])
            drop.add(i + 1)
        if ctx.norm_impl == "persistent":
            for i, n in enumerate(graph.nodes):
                if (i not in replace and i not in drop and n.kind == OpKind.NORM
                        and n.role in _LAYER_NORM_ROLES):
                    replace[i] = n.replace(tags=n.tags | {PERSISTENT_NORM_TAG})
        if not replace:
            return PassResult(graph, False)
        nodes = [replace.get(i, n) for i, n in enumerate(graph.nodes) if i not in drop]
        return PassResult(graph.with_nodes(nodes), True)


@PASSES.register("fp8")
class FP8Pass(Pass):
    name = "fp8"

    def enabled(self, ctx: PassContext) -> bool:
        return ctx.precision == "fp8"

    def run(self, graph: OpGraph, ctx: PassContext) -> PassResult:
        gb = GraphBuilder(graph)
        params = set(graph.param_tensors)
        fwd = graph.meta.get("forward_graph")
        if fwd is not None:
            params |= set(fwd.param_tensors)
        if ctx.fp8_recipe not in FP8_CAST_READS:
            raise ConfigError(f"`fp8_recipe` must be one of {list(FP8_RECIPES)}, but got "
                              f"{ctx.fp8_recipe!r}")
        reads = FP8_CAST_READS[ctx.fp8_recipe]
        # Transformer Engine (delayed recipe) writes the wgrad's transposed copy in the same
        # kernel as the forward / dgrad copy, reading the bf16 tensor once
        # (``fp8_cast_transpose_fused`` in TE ``Linear`` / ``LayerNormLinear``, except with
        # sequence parallelism): the transposed copy costs only its fp8 write.
        reads_t = 0.0 if ctx.fp8_recipe in FP8_CAST_TRANSPOSE_FUSED and \
            not ctx.sequence_parallel else reads
        quantized: dict[tuple[int, str], int] = {}
        changed = False
        for node in graph.nodes:
            if node.kind not in (OpKind.GEMM, OpKind.GROUPED_GEMM) or node.role not in FP8_ROLES:
                gb.add(node)
                continue
            changed = True
            # wgrad contracts over tokens: its operands need a transposed (token-major) copy.
            layout = "t" if _is_wgrad(node, gb) else "n"
            new_inputs = []
            for t in node.inputs:
                if t in params or gb.tensors[t].dtype not in _FLOAT_DTYPES:
                    # weights are cast once per step; integer inputs (a grouped GEMM's
                    # per-expert offsets) are not quantized
                    new_inputs.append(t)
                    continue
                key = (t, layout)
                if key not in quantized:
                    spec = gb.tensors[t]
                    out = gb.new_tensor(shape=spec.shape, dtype="fp8")
                    numel = spec.numel
                    suffix = "_t" if layout == "t" else ""
                    r = reads_t if layout == "t" else reads
                    gb.nodes.append(Node(
                        id=gb.fresh_id(),
                        name=gb.unique_name(f"fp8_quantize{suffix}_{node.name}"),
                        kind=OpKind.ELEMENTWISE, target="pass:fp8",
                        module_path=node.module_path, role=node.role, phase=node.phase,
                        inputs=(gb.rename.get(t, t),), outputs=(out,),
                        flops=numel * 3 * max(r, 1.0 / 3),
                        bytes_read=numel * DTYPE_BYTES.get(spec.dtype, 2) * r,
                        bytes_written=numel * 1.0, params={"numel": numel},
                        tags=frozenset({"fp8"})))
                    quantized[key] = out
                new_inputs.append(quantized[key])
            half = {"bytes_read": node.bytes_read / 2}
            kind = gemm_kind(node) if node.kind == OpKind.GEMM else "fwd"
            extra = {}
            if ctx.fp8_recipe == "rowwise" and node.kind == OpKind.GEMM and kind == "fwd":
                extra = {"params": {**node.params, "kernel_slowdown": Poly.const(
                    1.0 / ROWWISE_FWD_GEMM_EFFICIENCY)}}
            new = gb.add(node.replace(inputs=tuple(new_inputs), dtype="fp8",
                                      tags=node.tags | {"fp8"}, **half, **extra))
            if ctx.fp8_recipe == "rowwise" and node.kind == OpKind.GEMM and kind != "fwd":
                _rowwise_rescale(gb, new)
        if not changed:
            return PassResult(graph, False)
        return PassResult(gb.finish(), True)


def _is_wgrad(node: Node, gb: GraphBuilder) -> bool:
    """A weight-gradient GEMM (it contracts over the tokens): a dense one by its shape
    (``gemm_kind``); a grouped one (``dW[e] = X_e^T dY_e``, the ``[E, k, n]`` gradient of the
    experts' weights) is the backward grouped GEMM whose outputs have no token dimension."""
    if node.kind == OpKind.GEMM:
        return gemm_kind(node) == "wgrad"
    return (node.kind == OpKind.GROUPED_GEMM and node.phase == Phase.BACKWARD
            and bool(node.outputs)
            and all(gb.tensors[t].numel.degree("b") == 0 and gb.tensors[t].numel.degree("s") == 0
                    for t in node.outputs))


def _rowwise_rescale(gb: GraphBuilder, gemm: Node) -> None:
    """The separate output-rescale kernel of a rowwise backward GEMM.

    torchao runs rowwise-scaled GEMMs without fast accumulation (the backward ones) as the
    cuBLAS tensorwise kernel with unit scales and multiplies the output by the row and column
    scales afterwards, because PyTorch's CUTLASS rowwise kernel is too slow without fast
    accumulation (pytorch/ao#1325, ``torchao/float8/float8_ops.py``); under torch.compile that
    is "at least one extra triton kernel per GEMM" (pytorch/ao#2184): read and write the bf16
    output once more.
    """
    out = gemm.outputs[0]
    spec = gb.tensors[out]
    numel = spec.numel
    new = gb.new_tensor(spec)
    gb.nodes.append(Node(
        id=gb.fresh_id(), name=gb.unique_name(f"fp8_rowwise_rescale_{gemm.name}"),
        kind=OpKind.ELEMENTWISE, target="pass:fp8", module_path=gemm.module_path,
        role=gemm.role, phase=gemm.phase, inputs=(out,), outputs=(new,), flops=numel * 2,
        bytes_read=numel * DTYPE_BYTES.get(spec.dtype, 2),
        bytes_written=numel * DTYPE_BYTES.get(spec.dtype, 2), params={"numel": numel},
        tags=frozenset({"fp8"})))
    gb.rename[out] = new


must_run_before("fusion", "fp8")
for _after in ("tp", "ep"):
    must_run_before("fusion", _after)
    must_run_before("fp8", _after)
