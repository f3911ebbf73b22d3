"""Megatron tensor parallelism (Shoeybi et al., arXiv 1909.08053) with optional sequence
parallelism (Korthikanti et al., arXiv 2205.05198), keyed on ``Node.role``.

Every tensor carries a TP state while the pass walks the graph in order:

* ``R`` replicated on the TP ranks (sequence-sharded under SP: those ops run on ``s/tp`` tokens),
* ``S`` sharded on the feature/head dim (after a column-parallel GEMM),
* ``P`` a partial sum (after a row-parallel GEMM or a column-parallel dgrad).

Column GEMMs (``attn.qkv``, ``mlp.in``, ``lm_head``, shared-expert gate/up) split their output
features; row GEMMs (``attn.out``, ``mlp.out``, shared-expert down) their input features. A ``P``
tensor consumed by anything but a sum of partials gets an all-reduce (SP: reduce-scatter); under
SP an ``R`` tensor read by a column GEMM fwd or a row GEMM dgrad gets an all-gather first. Per
transformer layer this yields 2 all-reduces of b·s·h forward and 2 backward (SP: the same bytes
as AG + RS).

The loss runs vocabulary-parallel on the LM head's sharded logits (Megatron
``_VocabParallelCrossEntropy``, torchtitan's ``loss_parallel`` on DTensor): each rank reduces its
vocabulary shard and three TP all-reduces of one fp32 value per token make the row statistics
whole: the maximum logit (``ReduceOp.MAX``), the target's logit (zero on the ranks that do not
hold it) and the sum of exponentials. They run after the loss's softmax forward, before the
loss is known; the backward needs none (each rank's gradient is its shard's softmax minus the
one-hot target). Megatron-Core's ``cross_entropy_loss_fusion`` concatenates the last two into
one message; three are counted here.

``sp_wgrad_regather`` (Megatron, Transformer Engine): the backward of a column GEMM all-gathers
its saved sequence shard again for the wgrad, issued with its dgrad and run under it (Megatron
``LinearWithGradAccumulationAndAsyncCommunication.backward``: async ``_all_gather_base``, the
dgrad GEMM, wait, async ``_reduce_scatter_base`` of the dgrad under the wgrad GEMM): 2 more
all-gathers of b·s·h per layer backward. Without it the wgrad reads the gathered copy for free
(DTensor saves the all-gather's output).

``tp_async_allreduce`` off (Megatron-LM 2020-21): a column GEMM's backward all-reduce waits for
its wgrad GEMM too (``sync_after``); on, it starts right after the dgrad and runs under the wgrad.

FP8 under SP: the ``fp8`` pass quantizes a GEMM's input before this pass runs, so by default the
all-gather moves the fp8 copy (torchtitan's ``Float8ColwiseParallel`` for the tensorwise recipe:
the input is cast on its sequence shard and gathered in fp8). torchtitan's rowwise recipes use
plain TP instead, "all-gather happens in high precision" (torchtitan ``parallelize_llama``:
``enable_float8_tensorwise_tp = enable_float8_linear and not float8_is_rowwise``): with
``fp8_recipe == "rowwise"`` the bf16 input is gathered and then quantized whole on every rank.
The rowwise weight-gradient casts (the ``_t`` copies, scaled along the token axis) read the
same whole tensors: torchao's ``matmul_with_hp_or_float8_args.backward`` casts the saved
``input_hp`` (under SP the all-gathered input a ``ColwiseParallel`` linear receives) and the
incoming ``grad_output`` (the all-gathered gradient of a ``RowwiseParallel`` linear's
reduce-scattered output) along dim 0 from bf16: those casts cost the gathered size, not the
shard's, and a row GEMM's output gradient is gathered once for its dgrad and wgrad casts.
With per-tensor scales (``tensorwise``, ``delayed``) the gathered tensors are fp8, and the
weight gradient reads a transpose of the whole gathered fp8 tensor (its operand must be
contiguous along the tokens: torchao's float8 TP, Transformer Engine's ``fp8_transpose`` of the
gathered input), one byte read and one written per element, in place of the ``_t`` cast.

DeepSeek Sparse Attention's lightning indexer (role ``attn.indexer``) is replicated: every rank
runs all its heads over the whole key cache (SGLang ``nsa_indexer.py``: ``ReplicatedLinear``).

MoE blocks: routed experts stay unsharded by TP (expert TP = 1, Megatron's default); with SP the
routed part runs on the sequence shard (Megatron requires SP with TP + MoE).

A q/k norm over all heads (its weight spans more than one head, e.g. MiniMax-M2's
``qk_norm_type: per_layer``) is split with the heads, so its per-token statistic needs a TP
all-reduce before the normalization: one per q/k pair and pass, of both statistics in fp32
(vLLM ``MiniMaxText01RMSNormTP.forward_qk``: ``tensor_model_parallel_all_reduce`` of the
concatenated q and k variances). Per-head norms (Qwen3) need none.
"""

from __future__ import annotations

from charon_search.errors import PassError
from charon_search.ir import DTYPE_BYTES, Node, OpGraph, OpKind, Phase, Poly, Role
from charon_search.ir.ops import POSITION_TABLE_TAG
from charon_search.passes._rewrite import GraphBuilder, gemm_kind, scale_node, shard_gemm
from charon_search.passes.base import PASSES, Pass, PassContext, PassResult

__all__ = ["COLUMN_ROLES", "LOSS_STAT_TAG", "NORM_STAT_TAG", "ROW_ROLES", "TensorParallelPass",
           "is_activation_all_reduce", "is_replicated_gemm", "position_table", "tp_sharded_role",
           "vocab_parallel"]

COLUMN_ROLES = frozenset({Role.ATTN_QKV, Role.MLP_IN, Role.LM_HEAD})
ROW_ROLES = frozenset({Role.ATTN_OUT, Role.MLP_OUT})
SHARDED_ROLES = frozenset({Role.ATTN_CORE, Role.ATTN_ROPE, Role.ATTN_QK_NORM, Role.MLP_ACT})
"""Ops between a column and a row GEMM: run on tp-th of the heads / features."""
_GEMMS = (OpKind.GEMM,)
_GATE_ROLES = frozenset({Role.ATTN_NORM, Role.MLP_NORM, Role.FINAL_NORM, Role.RESIDUAL,
                         Role.EMBED})


#: Tag of the small all-reduce of an across-heads q/k norm's statistics (not an activation).
NORM_STAT_TAG = "norm_stat"
#: Tag of the vocabulary-parallel loss's per-token all-reduces (not activations).
LOSS_STAT_TAG = "loss_stat"
#: Per-token statistics the vocabulary-parallel loss all-reduces, in order (fp32 each).
LOSS_STATS = ("max", "target", "sumexp")


def is_activation_all_reduce(node: Node) -> bool:
    """A TP all-reduce of a block's activations (``tokens x hidden`` after a row GEMM), not the
    statistic all-reduce of an across-heads q/k norm."""
    return (node.is_comm and node.group == "tp" and node.kind == OpKind.ALL_REDUCE
            and NORM_STAT_TAG not in node.tags and LOSS_STAT_TAG not in node.tags)


def position_table(node: Node) -> bool:
    """A lookup (or its gradient) in a learned position table: whole on every TP rank."""
    return node.kind == OpKind.EMBEDDING and POSITION_TABLE_TAG in node.tags


def vocab_parallel(node: Node) -> bool:
    """A lookup (or its gradient) in the vocabulary table, which TP shards over the vocabulary
    (Megatron's ``VocabParallelEmbedding``)."""
    return node.kind == OpKind.EMBEDDING and not position_table(node)


def is_replicated_gemm(node: Node) -> bool:
    """MLA down-projections (``q_a_proj``, ``kv_a_proj_with_mqa``) stay replicated (Megatron)."""
    return node.module_path.endswith(("q_a_proj", "kv_a_proj_with_mqa"))


def _keeps_partial(node: Node, act_in: list[int], n_partial: int) -> bool:
    """Whether ``node`` may run on partial sums without reducing them first.

    Only layout copies (views, transposes) and sums of partials (``add`` of two partial
    gradients) commute with the reduction. A one-input elementwise op on a partial sum (bias
    add, dropout, their fused ``bias_dropout_add``) runs after the all-reduce / reduce-scatter
    in Megatron, on the reduced (under SP: sequence-sharded) tensor, and its side outputs
    (the dropout mask) are never communicated. The output rescale of a rowwise fp8 GEMM
    (``fp8_rowwise_rescale_*``: a product with per-row and per-column scales, linear) runs on
    the GEMM's local output, partial sum or not, like the GEMM epilogue it stands for.
    """
    if n_partial != len(act_in):
        return False
    if node.kind == OpKind.COPY:
        return True
    if node.target == "pass:fp8" and node.name.startswith("fp8_rowwise_rescale"):
        return True
    return node.kind == OpKind.ELEMENTWISE and len(act_in) >= 2


def tp_sharded_role(node: Node) -> bool:
    """A node of a TP-sharded linear (column, row or shared-expert role, not replicated)."""
    if is_replicated_gemm(node):
        return False
    return node.role in COLUMN_ROLES or node.role in ROW_ROLES or node.role == Role.MOE_SHARED


def _tp_gemm_role(node: Node) -> bool:
    return node.kind in _GEMMS and tp_sharded_role(node)


@PASSES.register("tp")
class TensorParallelPass(Pass):
    """Shard column/row GEMMs and the ops between them; insert TP collectives."""

    name = "tp"

    def enabled(self, ctx: PassContext) -> bool:
        return ctx.tp > 1

    def requires(self, graph: OpGraph, ctx: PassContext) -> None:
        if any(n.group == "tp" for n in graph.nodes):
            raise PassError(f"tp: graph {graph.name!r} already has TP collectives")

    def run(self, graph: OpGraph, ctx: PassContext) -> PassResult:
        fp8 = ctx.precision == "fp8"
        hp = fp8 and ctx.fp8_recipe in HP_GATHER_FP8_RECIPES
        transpose = fp8 and ctx.fp8_recipe in FP8_TRANSPOSE_WGRAD_RECIPES
        return PassResult(_TPWalker(graph, ctx.tp, ctx.sequence_parallel, hp_gather=hp,
                                    fp8_transpose=transpose,
                                    regather=ctx.sp_wgrad_regather,
                                    async_allreduce=ctx.tp_async_allreduce).walk(), True)


#: fp8 recipes whose SP all-gather moves the bf16 input (see the module docstring).
HP_GATHER_FP8_RECIPES = frozenset({"rowwise"})
#: fp8 recipes whose SP all-gather moves the fp8 copy and whose weight gradient then reads a
#: transpose of the gathered fp8 tensor (per-tensor scales survive a transpose; block scales
#: do not): see the module docstring.
FP8_TRANSPOSE_WGRAD_RECIPES = frozenset({"tensorwise", "delayed"})


class _TPWalker:
    def __init__(self, graph: OpGraph, tp: int, sp: bool, *, hp_gather: bool = False,
                 fp8_transpose: bool = False, regather: bool = False,
                 async_allreduce: bool = True) -> None:
        self.graph, self.tp, self.sp = graph, tp, sp
        self.fp8_transpose = fp8_transpose
        self.async_allreduce = async_allreduce
        # SP, Megatron: the backward re-gathers each column GEMM's saved input (``regather``).
        self.wgrad_of: dict[str, Node] = {}
        if sp and regather:
            for n in graph.nodes:
                if (_tp_gemm_role(n) and n.role in COLUMN_ROLES and gemm_kind(n) == "wgrad"
                        and n.module_path):
                    self.wgrad_of.setdefault(n.module_path, n)
        self.regathered: dict[int, dict[int, int]] = {}  # wgrad id -> {saved input: gathered}
        self.regathered_input: dict[int, int] = {}
        self.orig_producer: dict[int, Node] = {o: n for n in graph.nodes for o in n.outputs}
        # rowwise fp8: quantize output -> its (unsharded) quantize node, to gather its bf16 input
        self.quant_of: dict[int, Node] = {
            n.outputs[0]: n for n in graph.nodes
            if hp_gather and n.target == "pass:fp8" and n.name.startswith("fp8_quantize")
            and len(n.inputs) == 1 and len(n.outputs) == 1}
        self.gb = GraphBuilder(graph)
        self.state: dict[int, str] = {t: "R" for t in graph.inputs}
        self.state.update({t: "S" for t in graph.meta.get("tp_sharded_inputs", ())})
        fwd = graph.meta.get("forward_graph")
        self.params = set(graph.param_tensors) | set(fwd.param_tensors if fwd else ())
        self.gathered: dict[int, int] = {}  # SP: tensor -> its all-gathered copy
        self.fp8_gathered: dict[int, int] = {}  # bf16 shard -> all-gathered copy of its fp8 cast
        self.hp_gathered: dict[int, int] = {}  # rowwise fp8: bf16 tensor -> its all-gather
        self.hp_gather = hp_gather
        self.reduced: dict[int, int] = {}  # partial tensor -> its reduced copy

    def st(self, t: int) -> str:
        return self.state.get(t, "R")

    def cur(self, t: int) -> int:
        return self.gb.rename.get(t, t)

    def reduce(self, t: int, node: Node) -> None:
        """Insert AR (SP: RS) on partial tensor ``t`` before ``node`` reads it."""
        if t in self.reduced:
            self.gb.rename[t] = self.reduced[t]
            return
        kind = OpKind.REDUCE_SCATTER if self.sp else OpKind.ALL_REDUCE
        out = self.gb.add_comm(
            kind, group="tp", group_size=self.tp, nbytes=self.gb.tensors[t].nbytes,
            reads=(t, *self.sync_after(t, node, kind)),
            like=t, phase=node.phase, module_path=node.module_path,
            name=f"tp_{kind.value}_{node.name}")
        self.reduced[t] = out
        self.state[out] = "R"

    def gather(self, t: int, node: Node) -> int:
        """SP: the all-gathered copy of sequence-sharded ``t`` (inserted once per tensor)."""
        if not self.sp or self.st(t) != "R" or t in self.params:
            return t
        if t not in self.gathered and t in self.quant_of:
            self.gathered[t] = self._gather_then_quantize(t, node)
        if t not in self.gathered:
            self.gathered[t] = self._all_gather(t, node)
            cast = self.orig_producer.get(t)
            if cast is not None and cast.target == "pass:fp8" and len(cast.inputs) == 1:
                self.fp8_gathered[self.cur(cast.inputs[0])] = self.gathered[t]
        return self.gathered[t]

    def _all_gather(self, t: int, node: Node, *, after: tuple[int, ...] = (),
                    name: str = "") -> int:
        """A TP all-gather of sequence-sharded ``t`` (also waiting for ``after``) issued with
        ``node``; its output is whole (state ``F``)."""
        g = self.gb.add_comm(
            OpKind.ALL_GATHER, group="tp", group_size=self.tp,
            nbytes=self.gb.tensors[t].nbytes, reads=(t, *after), like=t, phase=node.phase,
            module_path=node.module_path, name=name or f"tp_all_gather_{node.name}",
            rewire=False)
        self.state[g] = "F"
        return g

    def sync_after(self, t: int, node: Node, kind: OpKind) -> tuple[int, ...]:
        """Extra tensors a backward all-reduce of dgrad ``t`` waits for (``tp_async_allreduce``
        off): the outputs of every backward GEMM of the module that produced ``t``.

        Megatron-LM before its asynchronous column-linear backward (``ColumnParallelLinear``
        of 2020-21: ``copy_to_tensor_model_parallel_region(input_)`` then ``F.linear``)
        all-reduces the input gradient in the backward of the copy, the autograd node after
        ``F.linear``'s, which computed the dgrad and the wgrad GEMMs: the all-reduce starts
        when both are done and no compute of the layer is left to hide it.
        """
        if (self.async_allreduce or kind != OpKind.ALL_REDUCE
                or node.phase != Phase.BACKWARD):
            return ()
        producer = {o: n for n in self.gb.nodes for o in n.outputs}
        modules: set[str] = set()
        todo, seen = [t], set()
        while todo:  # the dgrad GEMMs behind t, through sums of partial dgrads (q + k + v)
            u = todo.pop()
            n = producer.get(u)
            if n is None or u in seen:
                continue
            seen.add(u)
            if n.kind == OpKind.GEMM and n.module_path:
                modules.add(n.module_path)
            elif n.kind == OpKind.ELEMENTWISE:
                todo.extend(i for i in n.inputs if self.st(i) == "P")
        return tuple(dict.fromkeys(
            o for n in self.gb.nodes if n.kind == OpKind.GEMM and n.phase == Phase.BACKWARD
            and n.module_path in modules for o in n.outputs if o not in seen))

    def _saved_inputs(self, node: Node) -> list[int]:
        """Inputs of column wgrad ``node`` that are a saved, sequence-sharded (state R) forward
        activation, or the fp8 pass's cast of one; never its output gradient (which is sharded
        over features, not sequence), whatever state the walker gives a tensor it has not
        reached yet."""
        saved, out = set(self.graph.inputs), []
        for t in node.inputs:
            if t in self.params:
                continue
            q = self.orig_producer.get(t)
            src = q.inputs[0] if q is not None and q.target == "pass:fp8" and q.inputs else t
            if src in saved and self.st(self.cur(src)) == "R":
                out.append(t)
        return out

    def regather(self, node: Node) -> None:
        """SP, Megatron: all-gather the saved input shard of the column GEMM whose dgrad
        ``node`` is, before that dgrad (see ``Layout.sp_wgrad_regather``).

        Megatron's ``LinearWithGradAccumulationAndAsyncCommunication.backward`` (sequence
        parallel) saved the shard in the forward; it issues ``_all_gather_base(input)`` with
        ``async_op=True``, runs the dgrad GEMM ``grad_output.matmul(weight)``, waits, then
        reduce-scatters the dgrad under the wgrad GEMM. So the all-gather reads the saved shard
        and the output gradient (it starts with the linear's backward, beside its dgrad) and
        queues on the TP stream before that dgrad's reduce-scatter; the wgrad reads its output.
        """
        wgrad = self.wgrad_of.get(node.module_path)
        if wgrad is None:
            return
        grads = tuple(self.cur(t) for t in node.inputs
                      if t not in self.params and self.st(self.cur(t)) != "R")
        got = self.regathered.setdefault(wgrad.id, {})
        made = {o for n in self.gb.nodes for o in n.outputs} | set(self.graph.inputs)
        for t in self._saved_inputs(wgrad):
            if t in got or self.cur(t) not in made:
                continue  # produced later in the walk (an fp8 cast): gathered at the wgrad
            if t not in self.regathered_input:  # one gather per saved input: Megatron's QKV
                self.regathered_input[t] = self._all_gather(  # and fc1 are one linear each
                    self.cur(t), node, after=grads, name=f"tp_all_gather_wgrad_{wgrad.name}")
            got[t] = self.regathered_input[t]

    def _gather_then_quantize(self, t: int, node: Node) -> int:
        """Rowwise fp8: all-gather the bf16 input of quantize ``t``, then quantize it whole.

        The sequence-shard quantize already in the graph costs ``1/tp`` of the whole one; the
        node added after the gather carries the other ``(tp - 1)/tp``.
        """
        q = self.quant_of[t]
        full = self._hp_all_gather(q.inputs[0], node)
        rest = (self.tp - 1) / self.tp
        out = self.gb.new_tensor(self.gb.tensors[t])
        self.gb.nodes.append(q.replace(
            id=self.gb.fresh_id(), name=self.gb.unique_name(f"{q.name}_gathered"),
            inputs=(full,), outputs=(out,), flops=q.flops * rest,
            bytes_read=q.bytes_read * rest, bytes_written=q.bytes_written * rest))
        self.state[out] = "F"
        return out

    def _hp_all_gather(self, t: int, node: Node) -> int:
        """Rowwise fp8: the all-gather of sequence-sharded bf16 tensor ``t`` (one per tensor,
        shared by its forward/dgrad cast and its weight-gradient cast)."""
        src = self.cur(t)
        if src not in self.hp_gathered:
            self.hp_gathered[src] = self._all_gather(src, node)
        return self.hp_gathered[src]

    def _whole_wgrad_cast(self, node: Node, act_in: list[int]) -> tuple[int, ...] | None:
        """Rowwise fp8 under SP: the inputs of weight-gradient cast ``node`` (an fp8 pass
        ``fp8_quantize_t_*`` of a sequence-sharded bf16 tensor), which casts the whole gathered
        tensor (module docstring); ``None`` for any other node.

        An output gradient (one this graph makes, or the block's incoming one) is gathered
        once for this cast and the dgrad's; a saved activation's gathered copy lives in the
        forward graph (DTensor saves the all-gather's output, the input the linear saw), so the
        cast keeps its input.
        """
        if not (self.hp_gather and self._gathered_wgrad_cast(node, act_in)):
            return None
        t = act_in[0]
        fwd = self.graph.meta.get("forward_graph")
        saved = t in self.graph.inputs and fwd is not None and t in fwd.tensors
        if self.cur(t) in self.hp_gathered or not saved:
            return (self._hp_all_gather(t, node),)
        return node.inputs

    def _gathered_wgrad_cast(self, node: Node, act_in: list[int]) -> bool:
        """Under SP: ``node`` is the fp8 pass's weight-gradient copy (``fp8_quantize_t_*``) of a
        sequence-sharded tensor of a TP-sharded linear (ColwiseParallel / RowwiseParallel),
        whose weight gradient reads the tensor all-gathered. A routed expert's or a replicated
        MLA down-projection's copy reads the tensor its GEMM reads, with no TP all-gather."""
        if not (self.sp and node.target == "pass:fp8" and node.name.startswith("fp8_quantize_t")
                and len(act_in) == 1 and self.st(self.cur(act_in[0])) == "R"):
            return False
        return tp_sharded_role(node)

    def _fp8_transpose(self, node: Node, act_in: list[int]) -> Node | None:
        """Per-tensor-scaled fp8 under SP (``FP8_TRANSPOSE_WGRAD_RECIPES``): the weight
        gradient's copy of a gathered input or output gradient is a transpose of the whole
        all-gathered fp8 tensor (one byte read, one written per element: torchao's float8 TP
        gathers the fp8 copy and ``_scaled_mm`` needs the transposed operand contiguous;
        Transformer Engine's ``fp8_transpose`` of the gathered input), not a cast of the
        rank's shard; ``None`` for any other node."""
        if not (self.fp8_transpose and self._gathered_wgrad_cast(node, act_in)
                and "numel" in node.params):
            return None
        numel = node.params["numel"]
        # An output gradient's fp8 copy was gathered for the dgrad (walked first,
        # ``_dgrad_first``): the transpose reads that gathered tensor.
        src = self.cur(act_in[0])
        inputs = tuple(self.fp8_gathered.get(src, t) if t == act_in[0] else t
                       for t in node.inputs)
        return node.replace(flops=Poly(), bytes_read=numel * DTYPE_BYTES["fp8"],
                            bytes_written=numel * DTYPE_BYTES["fp8"], inputs=inputs,
                            name=node.name.replace("fp8_quantize_t", "fp8_transpose", 1))

    def flush_dangling(self, node: Node) -> tuple[int, ...]:
        """Reduce partial sums no op in this graph reads (their sum was traced elsewhere or
        dropped) with one collective before ``node``; returns its output to gate ``node``."""
        dangling = [t for t in self.partial_order if t not in self.reduced
                    and not self.consumers.get(t)]
        if not dangling:
            return ()
        big = max(dangling, key=lambda t: self.gb.tensors[t].numel(1, 1, 1))
        self.reduce(big, node)
        out = self.reduced[big]
        for t in dangling:
            self.reduced[t] = out
        return (out,)

    def _norm_across_heads(self, node: Node, head_dim: float) -> bool:
        """A q/k norm whose weight spans more than one head (its statistic is split by TP)."""
        if node.role != Role.ATTN_QK_NORM or node.kind != OpKind.NORM or not head_dim:
            return False
        widths = [self.graph.tensors[t].numel(1, 1, 1) for t in node.inputs if t in self.params]
        return bool(widths) and max(widths) > head_dim

    def norm_stat_all_reduce(self, node: Node) -> None:
        """The TP all-reduce of an across-heads q/k norm's per-token statistics (q and k in one
        message: 2 fp32 values per row), after the first norm of each q/k pair."""
        out = node.outputs[0]
        rows = node.params.get("rows")
        nbytes = rows * 8.0 if rows is not None else 8.0
        self.gb.add_comm(OpKind.ALL_REDUCE, group="tp", group_size=self.tp, nbytes=nbytes,
                         reads=(out,), like=out, phase=node.phase,
                         module_path=node.module_path, name=f"tp_norm_stat_{node.name}",
                         tags=(NORM_STAT_TAG,))

    def loss_stat_all_reduces(self, node: Node) -> None:
        """The vocabulary-parallel loss's three per-token fp32 all-reduces, chained after its
        softmax forward ``node``; the loss's later forward ops wait for the last one
        (``loss_gate``, an extra input), and the tensors they read keep their ids."""
        rows = node.params.get("rows")
        if rows is None:
            return
        last = node.outputs[0]
        for stat in LOSS_STATS:
            last = self.gb.add_comm(OpKind.ALL_REDUCE, group="tp", group_size=self.tp,
                                    nbytes=rows * float(DTYPE_BYTES["fp32"]), reads=(last,),
                                    like=None, phase=node.phase, module_path=node.module_path,
                                    name=f"tp_loss_{stat}_{node.name}", rewire=False,
                                    tags=(LOSS_STAT_TAG,))
        self.loss_gate = last

    def walk(self) -> OpGraph:
        tp, sp, gb = self.tp, self.sp, self.gb
        self.consumers = self.graph.consumers
        self.partial_order: list[int] = []
        head_dim = next((float(n.params["head_dim"](1, 1, 1)) for n in self.graph.nodes
                         if n.kind == OpKind.ATTENTION and "head_dim" in n.params), 0.0)
        paired: dict[Phase, int] = {}  # across-heads q/k norms seen per phase
        self.loss_gate: int | None = None  # the loss's all-reduces, once added
        for node in self._dgrad_first(self.graph.nodes) if sp else self.graph.nodes:
            act_in = [t for t in node.inputs if t not in self.params]
            extra: tuple[int, ...] = ()
            if node.role in _GATE_ROLES or node.kind in (OpKind.NORM, OpKind.EMBEDDING):
                extra = self.flush_dangling(node)
            if (self.loss_gate is not None and node.role == Role.LOSS
                    and node.phase == Phase.FORWARD):
                extra = (*extra, self.loss_gate)
            if _tp_gemm_role(node):
                if self.wgrad_of and gemm_kind(node) in ("dgrad", "wgrad"):
                    self.regather(node)
                new, out_state, inputs = self.gemm(node, act_in)
            else:
                partial = [t for t in act_in if self.st(self.cur(t)) == "P"]
                if partial and not _keeps_partial(node, act_in, len(partial)):
                    for t in partial:
                        self.reduce(self.cur(t), node)
                states = {self.st(self.cur(t)) for t in act_in}
                whole = self._whole_wgrad_cast(node, act_in)
                transposed = None if whole is not None else self._fp8_transpose(node, act_in)
                if whole is not None:
                    out_state, new = "F", node  # the gathered tensor's cast, unscaled
                elif transposed is not None:
                    out_state, new = "F", transposed  # the gathered fp8 tensor's transpose
                elif position_table(node):
                    # whole on every rank; under SP its gradient is taken from the gathered
                    # full-sequence gradient (Megatron adds the positions before scattering to
                    # the sequence-parallel region), so it is not sequence-sharded either
                    out_state, new = "R", node
                elif vocab_parallel(node) and node.phase == Phase.FORWARD:
                    out_state, new = "P", node  # vocab-parallel lookup: partial rows per rank
                elif vocab_parallel(node):
                    out_state, new = "S", scale_node(node, tp)  # grad of the vocab shard
                elif "P" in states:
                    out_state, new = "P", node
                elif node.role == Role.ATTN_INDEXER:
                    out_state, new = "R", node  # DSA indexer: replicated on every TP rank
                elif "S" in states or node.role in SHARDED_ROLES or node.role in (
                        Role.LOSS, Role.LM_HEAD):
                    out_state, new = "S", scale_node(node, tp)
                else:
                    out_state = "R"
                    new = scale_node(node, tp) if sp else node
                inputs = (whole if whole is not None else
                          transposed.inputs if transposed is not None else node.inputs)
            for t in node.outputs:
                self.state[t] = out_state
                if out_state == "P":
                    self.partial_order.append(t)
            gb.add(new.replace(inputs=tuple(inputs) + extra))
            if (self.loss_gate is None and node.role == Role.LOSS
                    and node.kind == OpKind.SOFTMAX and node.phase == Phase.FORWARD):
                self.loss_stat_all_reduces(node)
            if self._norm_across_heads(node, head_dim):
                paired[node.phase] = paired.get(node.phase, 0) + 1
                if paired[node.phase] % 2:
                    self.norm_stat_all_reduce(node)
        # Partial sums leaving the graph (e.g. the block's input gradient) are reduced at the end.
        if self.graph.nodes:
            self.flush_dangling(self.graph.nodes[-1])
        meta = {"tp_sharded_inputs": tuple(t for t, s in self.state.items() if s == "S"),
                "tp": tp, "sequence_parallel": sp}
        return gb.finish(meta=meta)

    def _dgrad_first(self, nodes: tuple[Node, ...] | list[Node]) -> list[Node]:
        """The backward's nodes with each row-parallel linear's weight-gradient GEMM after the
        dgrad GEMM that reads the same output gradient, where the trace put it before.

        Under SP that gradient arrives sequence-sharded and both GEMMs read its all-gathered
        copy: Megatron all-gathers it in ``_ReduceScatterToSequenceParallelRegion.backward``
        and its linear backward then runs the dgrad before the wgrad (``LinearWithGrad
        AccumulationAndAsyncCommunication.backward``); autograd's ``mm`` backward computes
        ``mat1``'s gradient (the input's) before ``mat2``'s (the weight's), and async TP fuses
        the gather with that dgrad (``fused_all_gather_matmul``). The gather is inserted before
        its first reader, so the wgrad must not come first.

        Under fp8 the two GEMMs read two casts of that gradient (the fp8 pass's
        ``fp8_quantize_t_*`` for the wgrad): they are matched through the casts, and the
        wgrad's own casts move with it (float8 TP casts the shard, gathers the fp8 copy once
        and transposes the gathered tensor for the wgrad: ``_fp8_transpose``). A rowwise
        wgrad whose output is rescaled before the dgrad keeps its place; its casts read the
        gathered bf16 tensor already (``_whole_wgrad_cast``)."""
        out = list(nodes)

        def cast_of(t: int) -> Node | None:
            n = self.orig_producer.get(t)
            return n if n is not None and n.target == "pass:fp8" and len(n.inputs) == 1 else None

        def sources(n: Node) -> set[int]:
            return {c.inputs[0] if (c := cast_of(t)) is not None else t
                    for t in n.inputs if t not in self.params}

        moved: set[int] = set()
        i = 0
        while i < len(out):
            node = out[i]
            if (node.id not in moved and node.phase == Phase.BACKWARD and _tp_gemm_role(node)
                    and node.role not in COLUMN_ROLES and gemm_kind(node) == "wgrad"
                    and (node.role != Role.MOE_SHARED or self._shared_row_wgrad(node))):
                grads = sources(node)
                # Its own fp8 casts (read by nothing else) travel with it.
                own = [c for t in node.inputs if t not in self.params
                       and (c := cast_of(t)) is not None
                       and len(self.consumers.get(t, ())) == 1]
                moving = {id(n) for n in (*own, node)}
                mine = {o for n in (*own, node) for o in n.outputs}
                for j in range(i + 1, len(out)):
                    other = out[j]
                    if id(other) in moving:
                        continue
                    if mine & set(other.inputs):
                        break  # something else reads what moves first: keep the order
                    if (other.kind == OpKind.GEMM and gemm_kind(other) == "dgrad"
                            and other.module_path == node.module_path
                            and other.phase == Phase.BACKWARD and grads & sources(other)):
                        group = [n for n in out if id(n) in moving]  # in their trace order
                        rest = [n for n in out if id(n) not in moving]
                        at = rest.index(other) + 1
                        out = rest[:at] + group + rest[at:]
                        moved.add(node.id)
                        i = -1  # the casts before it moved too: scan again from the start
                        break
            i += 1
        return out

    def _shared_row_wgrad(self, node: Node) -> bool:
        """A shared expert's down-projection wgrad (row-parallel, like ``mlp.out``): no input
        of it comes from the shared MLP's own backward ops, as the gate/up wgrads' gradient
        (the activation function's backward) does."""
        made_by = self.orig_producer
        return not any(made_by[t].role == Role.MOE_SHARED for t in node.inputs
                       if t not in self.params and t in made_by)

    def gemm(self, node: Node, act_in: list[int]) -> tuple[Node, str, tuple[int, ...]]:
        tp, sp = self.tp, self.sp
        sub = gemm_kind(node)
        s_in = any(self.st(self.cur(t)) == "S" for t in act_in)
        if node.role == Role.MOE_SHARED:
            column = not s_in if sub == "fwd" else s_in
        else:
            column = node.role in COLUMN_ROLES
        inputs = node.inputs
        needs_full = (sub == "fwd" and column) or (sub == "dgrad" and not column) or sub == "wgrad"
        if sp and needs_full:
            if sub == "wgrad" and node.id in self.regathered:
                got = self.regathered[node.id]
                inputs = tuple(got.get(t, self.gathered.get(self.cur(t), t))
                               for t in node.inputs)
            elif sub == "wgrad":  # reads the gathered copy when one exists (no extra collective)
                inputs = tuple(self.gathered.get(self.cur(t), t) for t in node.inputs)
            else:
                inputs = tuple(self.gather(self.cur(t), node) if t in act_in else t
                               for t in node.inputs)
        if sub == "fwd":
            return shard_gemm(node, "n" if column else "k", tp), ("S" if column else "P"), inputs
        if sub == "dgrad":
            return shard_gemm(node, "k" if column else "n", tp), ("P" if column else "S"), inputs
        return shard_gemm(node, "m" if column else "n", tp), "S", inputs
