"""Turn two captured fx traces into per-block ``OpGraph``s with symbolic shapes and roles."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from charon_search.catalog.spec import ModelSpec, is_moe_block
from charon_search.errors import PassError
from charon_search.frontend import _ops
from charon_search.frontend._roles import RoleTracker, block_of_path
from charon_search.frontend._symbolic import DimFitter
from charon_search.frontend._trace import NN_MODULE_STACK, Capture
from charon_search.ir import (
    ATTENTION_BWD_FLOP_RATIO,
    DTYPE_BYTES,
    OpKind,
    Phase,
    Poly,
    Role,
    TensorSpec,
    poly_params,
    sym,
)
from charon_search.ir.ops import (
    CAUSAL_CONV_TAG,
    DSA_SCALE_BLOCK,
    DSA_SCALE_BYTES,
    POSITION_TABLE_TAG,
)

__all__ = ["Converter"]


_TORCH_DTYPES = {
    "torch.bfloat16": "bf16", "torch.float32": "fp32", "torch.float16": "fp16",
    "torch.float64": "fp64", "torch.int64": "int64", "torch.int32": "int32",
    "torch.int16": "int16", "torch.int8": "int8", "torch.uint8": "uint8", "torch.bool": "bool",
    "torch.float8_e4m3fn": "fp8", "torch.float8_e5m2": "fp8", "torch.complex64": "fp64",
}


def _dtype(t: Any) -> str:
    return _TORCH_DTYPES.get(str(t.dtype), "fp32")


def _is_tensor(v: Any) -> bool:
    return hasattr(v, "shape") and hasattr(v, "dtype")


@dataclass
class _Op:
    """A retained op before it becomes an IR ``Node``."""

    key: tuple[str, str]
    phase: Phase
    kind: OpKind
    target: str
    base: str
    block: str
    module_path: str
    module_class: str
    role: str
    inputs: list[int]
    outputs: list[int]
    flops: Poly
    reads: dict[int, Poly]
    """Input tensor id -> bytes actually read (views read only their slice)."""
    params: dict[str, Poly]
    dtype: str
    tags: set[str] = field(default_factory=set)


class Converter:
    def __init__(self, spec: ModelSpec, phase: str, caps: tuple[Capture, ...],
                 points: tuple[dict[str, int], ...], layers_path: str,
                 layer_type_of: tuple[str, ...], vocab_table_path: str | None = None) -> None:
        self.spec, self.phase = spec, phase
        #: Module path of the model's input (vocabulary) embedding; a lookup elsewhere is in
        #: another table (``POSITION_TABLE_TAG``). None: told apart by the table's row count.
        self.vocab_table_path = vocab_table_path
        self.caps = caps
        self.c1 = caps[0]
        symbols = ("b", "c") if phase == "decode" else ("b", "s")
        self.fit = DimFitter(points, symbols)
        self.layers_path = layers_path
        self.layer_type_of = layer_type_of
        self.tid: dict[tuple[str, str], int] = {}
        self.alias: dict[tuple[str, str], tuple[str, str]] = {}
        self.tensors: dict[int, TensorSpec] = {}
        self.param_ids: set[int] = set()
        self.param_owner_hint: dict[int, str] = {}
        self.past_ids: set[int] = set()
        self.ops: list[_Op] = []
        self.graph_outputs: set[int] = set()
        self.tokens = sym("b") if phase == "decode" else sym("b") * sym("s")
        self._op_by_key: dict[tuple[str, str], _Op] = {}
        self._others: list[dict[str, dict[str, Any]]] = [
            {"fw": {n.name: n for n in c.fw.graph.nodes},
             "bw": {n.name: n for n in c.bw.graph.nodes} if c.bw is not None else {}}
            for c in caps[1:]
        ]

    # ------------------------------------------------------------------ shapes
    def shape(self, vals: list[Any]) -> tuple[Poly, ...]:
        if len({len(v.shape) for v in vals}) != 1:
            raise PassError("frontend: the traces disagree on a tensor's rank")
        return tuple(self.fit.fit(*(int(v.shape[i]) for v in vals))
                     for i in range(len(vals[0].shape)))

    def vals(self, g: str, node: Any) -> list[Any]:
        """The ``val`` meta of ``node`` in every capture (first: the node's own)."""
        return [node.meta.get("val")] + [o[g][node.name].meta.get("val") for o in self._others]

    def resolve(self, key: tuple[str, str]) -> tuple[str, str]:
        while key in self.alias:
            key = self.alias[key]
        return key

    def new_tensor(self, key: tuple[str, str], vals: list[Any]) -> int:
        tid = len(self.tid)
        self.tid[key] = tid
        self.tensors[tid] = TensorSpec(id=tid, shape=self.shape(vals), dtype=_dtype(vals[0]))
        return tid

    # ------------------------------------------------------------------ main walk
    def _other_table(self, op: _Op, rows: Poly) -> bool:
        """Whether an embedding lookup (or its gradient) reads a table other than the input
        (vocabulary) embedding: learned position embeddings (GPT-2's ``wpe``, OPT's
        ``embed_positions``)."""
        if self.vocab_table_path is not None:
            return op.module_path != self.vocab_table_path
        return rows.is_const() and rows.const_value() not in (0, self.spec.vocab_size)

    def run(self) -> None:
        for cap in self.caps:
            for gm in (cap.fw, cap.bw):
                if gm is not None:
                    # Everything is pure here: random ops (dropout) whose results nobody reads
                    # would otherwise keep the ops feeding them alive.
                    gm.graph.eliminate_dead_code(
                        is_impure_node=lambda n: n.op in ("placeholder", "output"))
        fw1 = list(self.c1.fw.graph.nodes)
        for c in self.caps[1:]:
            self._check_pair(fw1, list(c.fw.graph.nodes), "forward")
        roles = RoleTracker(self.spec)
        fw_info: dict[int, tuple[str, str, str, str]] = {}  # seq_nr -> (block, path, cls, role)
        seen_layer = False
        n_params = len(self.c1.param_names)
        primal_idx = 0
        for a in fw1:
            key = ("fw", a.name)
            if a.op == "placeholder":
                tid = self.new_tensor(key, self.vals("fw", a))
                if primal_idx < n_params:
                    self.param_ids.add(tid)
                    self.param_owner_hint[tid] = self.c1.param_names[primal_idx]
                if primal_idx in self.c1.past_kv_primals:
                    self.past_ids.add(tid)
                primal_idx += 1
                continue
            if a.op == "get_attr":
                self._constant(key, a)
                continue
            if a.op == "output":
                outs = a.args[0]
                for o in outs if isinstance(outs, (list, tuple)) else (outs,):
                    if hasattr(o, "name"):
                        self.graph_outputs.add(self.tid_of(("fw", o.name)))
                continue
            stack = a.meta.get(NN_MODULE_STACK) or {}
            path, cls = next(reversed(stack.values())) if stack else ("", "")
            block, local = block_of_path(path, self.layers_path, self.layer_type_of)
            if block is None:
                block = "lm_head" if seen_layer else "embedding"
            else:
                seen_layer = block not in ("embedding", "lm_head") or seen_layer
            op = self._make_op(key, a, Phase.FORWARD, block, local, cls)
            role = roles.role(block, local, cls, op.kind if op else None, _ops.op_base(a.target))
            seq = a.meta.get("seq_nr")
            if seq is not None and (op is not None or seq not in fw_info):
                if seq not in fw_info or fw_info[seq][3] == "":
                    fw_info[seq] = (block, local, cls, role)
            if op is not None:
                op.role = role
                self.ops.append(op)
        if self.c1.bw is not None:
            self._run_backward(fw_info)
        if self.past_ids:
            self._kv_append()

    def _kv_append(self) -> None:
        """Decode: cost ``cat(past_kv, new_kv)`` as writing the new token into the cache."""
        for op in self.ops:
            if op.base == "cat" and any(t in self.past_ids for t in op.inputs):
                new = [t for t in op.inputs if t not in self.past_ids]
                op.reads = {t: op.reads[t] for t in new}
                op.tags.add("kv_append")
                op.role = Role.ATTN_CORE.value
                op.params = poly_params(numel=sum((self.tensors[t].numel for t in new),
                                                  Poly()))

    def param_blocks(self) -> dict[str, int]:
        """Parameters per block: each parameter counted once, in the first block reading it."""
        owner: dict[int, str] = {}
        for op in self.ops:
            for t in op.inputs:
                if t in self.param_ids and t not in owner:
                    owner[t] = op.block
        out: dict[str, int] = {}
        for t, blk in owner.items():
            out[blk] = out.get(blk, 0) + int(self.tensors[t].numel.const_value())
        return out

    def _run_backward(self, fw_info: dict[int, tuple[str, str, str, str]]) -> None:
        assert self.c1.bw is not None
        bw1 = list(self.c1.bw.graph.nodes)
        for c in self.caps[1:]:
            assert c.bw is not None
            self._check_pair(bw1, list(c.bw.graph.nodes), "backward")
        fw_names = {k[1] for k in self.tid} | {k[1] for k in self.alias}
        prev: tuple[str, str, str, str] | None = None
        pending: list[_Op] = []
        for a in bw1:
            if a.op == "placeholder":
                if a.name in fw_names and not a.name.startswith("tangents"):
                    self.alias[("bw", a.name)] = ("fw", a.name)
                else:
                    self.new_tensor(("bw", a.name), self.vals("bw", a))
                continue
            if a.op == "get_attr":
                self._constant(("bw", a.name), a)
                continue
            if a.op == "output":
                for o in a.args[0]:
                    if hasattr(o, "name"):
                        self.graph_outputs.add(self.tid_of(("bw", o.name)))
                continue
            info = fw_info.get(a.meta.get("seq_nr", -1))
            if a.meta.get("is_gradient_acc"):
                # Gradient accumulation (e.g. of the residual stream) carries the seq_nr of
                # whatever autograd node was running; it belongs where it sits in the graph.
                info = None
            recomputed = not a.meta.get("autograd_backward", False)
            inherited = info is None
            if info is None:
                info = prev
            block, local, cls, role = info if info else ("", "", "", "")
            op = self._make_op(("bw", a.name), a, Phase.BACKWARD, block, local, cls)
            if op is None:
                continue
            if inherited:
                op.module_path, op.module_class = "", ""
                op.role = _fallback_role(block, role)
            else:
                op.role = role
            if recomputed:
                op.tags.add("recomputed")
            if not block or (recomputed and not inherited):
                # Unassigned, or forward ops the partitioner chose to recompute in the backward
                # (masks, position ids...): they belong with the block that consumes them next.
                pending.append(op)
            else:
                for p in pending:
                    p.block = block
                    p.role = p.role or _fallback_role(block)
                pending.clear()
                prev = (block, local, cls, role)
            self.ops.append(op)
        for p in pending:
            p.block, p.role = "embedding", Role.EMBED.value

    def _check_pair(self, n1: list[Any], n2: list[Any], what: str) -> None:
        if len(n1) != len(n2) or any(
            x.op != y.op or str(x.target) != str(y.target) for x, y in zip(n1, n2, strict=True)
        ):
            raise PassError(
                f"frontend: the {what} graph changes structure between the two trace points "
                f"({len(n1)} vs {len(n2)} nodes); shape-dependent control flow is not supported"
            )

    def _constant(self, key: tuple[str, str], a: Any) -> None:
        """A tensor the model builds from Python values during the trace (``torch.tensor(...)``
        in a forward): the tracer stores it on the graph module and reads it with a
        ``get_attr`` node (``_tensor_constant0``). It is an input like any other tensor, not a
        parameter: no op produces it."""
        if _is_tensor(a.meta.get("val")):
            self.new_tensor(key, self.vals(key[0], a))

    def tid_of(self, key: tuple[str, str]) -> int:
        return self.tid[self.resolve(key)]

    def _arg_nodes(self, a: Any) -> list[Any]:
        out: list[Any] = []
        for x in list(a.args) + list(a.kwargs.values()):
            if isinstance(x, (list, tuple)):
                out.extend(y for y in x if hasattr(y, "op"))
            elif hasattr(x, "op"):
                out.append(x)
        return [x for x in out if _is_tensor(x.meta.get("val"))]

    # ------------------------------------------------------------------ one op
    def _make_op(self, key: tuple[str, str], a: Any, phase: Phase, block: str,
                 local: str, cls: str) -> _Op | None:
        g = key[0]
        v1 = a.meta.get("val")
        target = a.target
        if target is _getitem():
            parent = a.args[0]
            pbase = _ops.op_base(parent.target) if parent.op == "call_function" else ""
            if pbase in _ops.VIEW_OPS:
                self.alias[key] = self.resolve((g, parent.name))
            elif _is_tensor(v1):
                tid = self.new_tensor(key, self.vals(g, a))
                if pbase == "_scaled_dot_product_efficient_attention" and a.args[1] == 1:
                    # Its logsumexp is padded to a multiple of 32 rows: call it q_len.
                    q_len = self.shape(self.vals(g, parent.args[0]))[2]
                    spec = self.tensors[tid]
                    self.tensors[tid] = TensorSpec(id=tid, shape=(*spec.shape[:-1], q_len),
                                                   dtype=spec.dtype)
                owner = self._op_by_key.get((g, parent.name))
                if owner is not None:
                    owner.outputs.append(tid)
            return None
        if a.op != "call_function" or not a.users:
            return None  # not an op, or dead (DCE keeps ops it thinks impure)
        base = _ops.op_base(target)
        args = self._arg_nodes(a)
        if base in _ops.VIEW_OPS and args:
            self.alias[key] = self.resolve((g, args[0].name))
            return None
        outputs: list[int] = []
        if _is_tensor(v1):
            outputs.append(self.new_tensor(key, self.vals(g, a)))
        elif not isinstance(v1, (list, tuple)):
            return None  # symbolic scalars, None
        in_moe = is_moe_block(block) and _in_moe_module(local)
        kind = _ops.classify(base, in_moe=in_moe)
        # A fused attention kernel loads a tensor it gets twice once (absorbed MLA passes the
        # latent cache as K and as V: FlashMLA reads it once); other ops read each argument.
        once = kind in (OpKind.ATTENTION, OpKind.ATTENTION_BWD)
        inputs: list[int] = []
        reads: dict[int, Poly] = {}
        arg_vals: list[list[Any]] = []
        for x in args:
            xk = (g, x.name)
            tid = self.tid_of(xk)
            arg_vals.append(self.vals(g, x))
            eff = self._effective_read(xk, arg_vals[-1])
            if tid not in reads:
                inputs.append(tid)
                reads[tid] = eff
            elif once:
                reads[tid] = _larger(reads[tid], eff, self.fit.p1)
            else:
                reads[tid] = reads[tid] + eff
        op = _Op(key=key, phase=phase, kind=kind, target=str(target), base=base, block=block,
                 module_path=local, module_class=cls, role="", inputs=inputs, outputs=outputs,
                 flops=Poly(), reads=reads, params={}, dtype="bf16")
        self._op_by_key[key] = op
        op.dtype = self._compute_dtype(arg_vals, v1)
        self._fill(op, a, arg_vals)
        return op

    def _effective_read(self, xk: tuple[str, str], vals: list[Any]) -> Poly:
        base_key = self.resolve(xk)
        base_spec = self.tensors[self.tid[base_key]]
        v1 = vals[0]
        view_shape = self.shape(vals)
        view_numel = Poly.const(1)
        for d in view_shape:
            view_numel = view_numel * d
        p = self.fit.p1
        base_numel = base_spec.numel
        pick = view_numel if view_numel(p["b"], p["s"], p["c"]) <= base_numel(
            p["b"], p["s"], p["c"]) else base_numel
        return pick * DTYPE_BYTES[_dtype(v1)]

    def _compute_dtype(self, arg_vals: list[list[Any]], out: Any) -> str:
        for v, *_ in arg_vals:
            if v.dtype.is_floating_point:
                return _dtype(v)
        return _dtype(out) if _is_tensor(out) else "fp32"

    # ------------------------------------------------------------------ formulas
    def _fill(self, op: _Op, a: Any, arg_vals: list[list[Any]]) -> None:
        shp = [self.shape(vals) for vals in arg_vals]
        g = op.key[0]
        out_vals = self.vals(g, a)
        if out_vals and isinstance(out_vals[0], (list, tuple)):
            # Multi-output op (native_dropout, topk...): shape params follow the first output.
            out_vals = [v[0] if v and _is_tensor(v[0]) else None for v in out_vals]
        out_shape = self.shape(out_vals) if _is_tensor(out_vals[0]) else None
        out_numel = _numel(out_shape) if out_shape is not None else Poly()
        in_numel = _numel(shp[0]) if shp else Poly()
        k, base = op.kind, op.base
        if k == OpKind.GEMM:
            ma, mb = (shp[1], shp[2]) if base in ("addmm", "_addmm_activation") else (shp[0],
                                                                                     shp[1])
            if base == "linear":
                m, kk, n = _numel(ma[:-1]), ma[-1], mb[0]
            else:
                m, kk, n = ma[0], ma[1], mb[1]
            op.params = poly_params(m=m, n=n, k=kk)
            op.flops = 2 * m * n * kk
        elif k == OpKind.BATCHED_GEMM:
            ma, mb = (shp[1], shp[2]) if base == "baddbmm" else (shp[0], shp[1])
            bt, m, kk, n = ma[0], ma[1], ma[2], mb[2]
            wide = op.inputs[-1] if op.inputs else -1
            if wide in self.param_ids and self.tensors[wide].numel == kk * n:
                # A linear layer on a 3-D non-contiguous input runs as bmm over a broadcast
                # weight; it is one GEMM with m = batch * rows.
                op.kind = OpKind.GEMM
                op.params = poly_params(m=bt * m, n=n, k=kk)
            else:
                op.params = poly_params(batch=bt, m=m, n=n, k=kk)
            op.flops = 2 * bt * m * n * kk
        elif k == OpKind.GROUPED_GEMM:
            self._grouped(op, shp, out_shape)
        elif base in _ops.SPARSE_ATTENTION_OPS:
            self._sparse_attention(op, shp)
        elif k == OpKind.SPARSE_INDEXER:
            self._sparse_indexer(op, shp)
        elif k in (OpKind.ATTENTION, OpKind.ATTENTION_BWD):
            self._attention(op, a, shp)
        elif k in (OpKind.LINEAR_ATTENTION, OpKind.LINEAR_ATTENTION_BWD):
            self._linear_attention(op, a, shp)
        elif k == OpKind.NORM:
            cols = shp[0][-1] if shp and shp[0] else Poly.const(1)
            op.params = poly_params(rows=_numel(shp[0][:-1]) if shp else 1, cols=cols)
            op.flops = in_numel * (5 if op.phase == Phase.FORWARD else 8)
        elif k == OpKind.SOFTMAX:
            cols = shp[0][-1] if shp and shp[0] else Poly.const(1)
            op.params = poly_params(rows=_numel(shp[0][:-1]) if shp else 1, cols=cols)
            op.flops = 5 * in_numel
        elif k == OpKind.EMBEDDING:
            if base == "embedding":
                vocab, hidden = shp[0][0], shp[0][1]
                tokens = _numel(shp[1])
            else:
                hidden = shp[0][-1]
                tokens = _numel(shp[1])
                vocab = out_shape[0] if out_shape else Poly.const(0)
                op.flops = tokens * hidden
            op.params = poly_params(tokens=tokens, hidden=hidden, vocab=vocab)
            if self._other_table(op, vocab):
                op.tags.add(POSITION_TABLE_TAG)  # a position table, not the vocabulary
        elif k == OpKind.MOE_ROUTING:
            op.params = poly_params(tokens=self.tokens, num_experts=self.spec.num_experts,
                                    top_k=self.spec.num_experts_per_token)
            op.flops = in_numel
        elif k == OpKind.REDUCTION:
            op.params = poly_params(numel=in_numel)
            op.flops = in_numel
        elif k == OpKind.COPY:
            op.params = poly_params(numel=out_numel)
        elif base in _ops.CAUSAL_CONV_OPS:
            # Depthwise causal conv over [b, channels, s]: width MACs per output element.
            width = shp[1][-1] if len(shp) > 1 and shp[1] else Poly.const(1)
            op.params = poly_params(numel=out_numel)
            op.tags.add(CAUSAL_CONV_TAG)
            op.flops = 2 * width * (out_numel if base == "causal_conv1d" else in_numel * 2)
        else:  # elementwise
            op.params = poly_params(numel=out_numel)
            if base not in _ops.CAST_OPS and base not in _ops.CREATION_OPS and base not in (
                "clone", "copy", "fill", "masked_fill", "where", "lift_fresh_copy"
            ):
                op.flops = out_numel
        if base in ("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"):
            op.reads = {}
        if base == "nll_loss_forward" and op.inputs and len(shp[0]) == 2:
            # ATen's nll_loss forward kernel reads one log-probability per row,
            # input[i, target[i]], not the [rows, classes] tensor.
            rows = shp[0][0]
            op.reads[op.inputs[0]] = rows * DTYPE_BYTES[_dtype(arg_vals[0][0])]
            op.flops = rows
        elif (k == OpKind.SOFTMAX and op.inputs and shp[0] and shp[0][-1].is_const()
              and _softmax_rows_three_pass(base, a, len(shp[0]), shp[0][-1].const_value(),
                                           DTYPE_BYTES[_dtype(arg_vals[0][0])])):
            # ATen's row softmax keeps a row in registers or shared memory only while it is
            # short; a longer one (an LM head's vocabulary) is read again for each pass.
            op.reads[op.inputs[0]] = op.reads[op.inputs[0]] * (
                3 if base in ("_softmax", "_log_softmax") else 2)
        elif base == "embedding" and op.inputs and k == OpKind.EMBEDDING:
            # A lookup gathers one table row per token (ATen ``embedding`` = ``index_select``
            # of the weight): it reads tokens x hidden of the table, not the whole table.
            op.reads[op.inputs[0]] = (op.params["tokens"] * op.params["hidden"]
                                      * DTYPE_BYTES[_dtype(arg_vals[0][0])])
        elif base == "nll_loss_backward" and len(op.inputs) > 1:
            # grad_input is zero-filled and written at the targets; ``self`` only gives the
            # shape (ATen nll_loss_backward_out: ``grad_input.zero_()`` then one write per row).
            op.reads.pop(op.inputs[1], None)

    def _grouped(self, op: _Op, shp: list[tuple[Poly, ...]], out: tuple[Poly, ...] | None
                 ) -> None:
        top_k = max(self.spec.num_experts_per_token, 1)
        a, w = shp[0], shp[1]
        if len(a) == 2 and len(w) == 3:  # [S, k] x [E, k, n] -> [S, n]
            rows, kk, n, e = a[0], a[1], w[2], w[0]
        elif len(a) == 2 and len(w) == 2 and out is not None and len(out) == 3:
            # weight gradient [k, S] x [S, n] -> [E, k, n]
            rows, kk, n, e = a[1], out[1], out[2], out[0]
        else:
            rows = a[0] if a else Poly.const(0)
            kk = a[-1] if a else Poly.const(0)
            n = out[-1] if out else Poly.const(0)
            e = Poly.const(self.spec.num_experts)
        op.params = poly_params(tokens=rows / top_k, top_k=top_k, num_experts=e, n=n, k=kk)
        op.flops = 2 * rows * n * kk

    def _attention(self, op: _Op, a: Any, shp: list[tuple[Poly, ...]]) -> None:
        first = 0 if op.kind == OpKind.ATTENTION else 1
        q, k, v = shp[first], shp[first + 1], shp[first + 2]
        causal = 0
        schema = getattr(a.target, "_schema", None)
        if schema is not None:
            for i, arg in enumerate(schema.arguments):
                if arg.name == "is_causal":
                    val = a.kwargs.get("is_causal", a.args[i] if i < len(a.args) else False)
                    causal = int(bool(val))
        kv_len = k[2]
        if self.phase != "decode":
            kv_len = kv_len.subs(s=sym("c"))
        op.params = poly_params(batch=q[0], heads=q[1], kv_heads=k[1], q_len=q[2],
                                kv_len=kv_len, head_dim=q[3], v_head_dim=v[3], causal=causal)
        fwd = 2 * q[0] * q[1] * q[2] * kv_len * (q[3] + v[3])
        op.flops = fwd if op.kind == OpKind.ATTENTION else fwd * ATTENTION_BWD_FLOP_RATIO

    def _context(self, keys: Poly) -> Poly:
        """A key count in ``c``: prefill traces ``c = s`` keys as ``s``."""
        return keys if self.phase == "decode" else keys.subs(s=sym("c"))

    def _sparse_attention(self, op: _Op, shp: list[tuple[Poly, ...]]) -> None:
        """Sparse MLA (``frontend._dsa``): absorbed query ``[b, h, s, 576]``, latent cache
        ``[b, 1, c, 576]``, top-k indices ``[b, s, topk]``; value = the latent's first
        ``v_head_dim`` (512) columns. FLOPs ``2 b h s c (576 + 512)`` as dense MLA over ``c``
        keys, carrying ``topk``: cost models and ``OpGraph.evaluate`` take ``min(c, topk)``
        keys (``Node.attended_c``)."""
        q, kv, idx = shp[0], shp[1], shp[2]
        kv_len = self._context(kv[2])
        d_v = Poly.const(int(self.spec.extra["kv_lora_rank"]))
        op.params = poly_params(batch=q[0], heads=q[1], kv_heads=kv[1], q_len=q[2],
                                kv_len=kv_len, head_dim=q[3], v_head_dim=d_v,
                                causal=int(self.phase != "decode"), topk=idx[2])
        op.flops = 2 * q[0] * q[1] * q[2] * kv_len * (q[3] + d_v)

    def _sparse_indexer(self, op: _Op, shp: list[tuple[Poly, ...]]) -> None:
        """Lightning indexer (``frontend._dsa``): queries ``[b, s, H, d]``, the one-head key
        cache ``[b, c, d]``, head weights ``[b, s, H]``. FLOPs ``2 H d`` per (query, key) pair
        over all ``c`` keys (the ``q . k`` products; the ReLU and head-weighted sum are
        ``O(H)`` per pair), counted over the full ``s x c`` product like attention (the node is
        causal in prefill). The kernel runs in fp8 (DeepGEMM ``fp8_mqa_logits``)."""
        q, k = shp[0], shp[1]
        kv_len = self._context(k[1])
        topk = Poly.const((self.spec.extra.get("dsa") or {}).get("index_topk", 0))
        op.params = poly_params(batch=q[0], heads=q[2], q_len=q[1], kv_len=kv_len,
                                head_dim=q[3], topk=topk)
        op.flops = 2 * q[0] * q[1] * kv_len * q[2] * q[3]
        op.dtype = "fp8"
        # What the kernel reads: fp8 queries, the fp8 key cache with one fp32 scale per key
        # (``memory.serving.dsa_indexer_bytes_per_token``: 132 B at d = 128) and fp32 head
        # weights, not the bf16 tensors HF's code traces.
        if len(op.inputs) == 3:
            tq, tk, tw = op.inputs
            d = int(k[2].const_value())
            op.reads = {tq: q[0] * q[1] * q[2] * q[3],
                        tk: q[0] * kv_len * (d + d // DSA_SCALE_BLOCK * DSA_SCALE_BYTES),
                        tw: q[0] * q[1] * q[2] * 4}

    def _linear_attention(self, op: _Op, a: Any, shp: list[tuple[Poly, ...]]) -> None:
        """Gated delta rule (``frontend._linear_attn``): q/k ``[b, s, h_k, d_k]``, v
        ``[b, s, h_v, d_v]``, per value head. FLOPs per token and value head: chunked
        (prefill, training; fla ``chunk_gated_delta_rule``) ``6 d_k d_v`` for the state's
        contributions and updates plus ``2 C (2 d_k + d_v)`` inside a chunk of ``C`` tokens;
        recurrent (decode) ``7 d_k d_v`` (decay, two state-vector products, update, output).
        Inference writes each sequence's final fp32 state (an extra output here); decode also
        reads it (its ``state`` input)."""
        from charon_search.frontend._linear_attn import GDN_CHUNK

        q, v = shp[0], shp[2]
        batch, q_len, k_heads, dk = q
        heads, dv = v[2], v[3]
        fwd = op.kind == OpKind.LINEAR_ATTENTION
        reads_state = int(fwd and len(a.args) > 5 and a.args[5] is not None)
        op.params = poly_params(batch=batch, q_len=q_len, heads=heads, k_heads=k_heads,
                                head_dim=dk, v_head_dim=dv, state=reads_state)
        tokens = batch * q_len * heads
        if self.phase == "decode":
            op.flops = tokens * 7 * dk * dv
        else:
            op.flops = tokens * (6 * dk * dv + 2 * GDN_CHUNK * (2 * dk + dv))
        if not fwd:
            op.flops = op.flops * ATTENTION_BWD_FLOP_RATIO
        elif self.phase != "train":
            g = op.key[0]
            vals = [val[1] for val in self.vals(g, a)]
            op.outputs.append(self.new_tensor((g, f"{a.name}.final_state"), vals))


def _numel(shape: Iterable[Poly]) -> Poly:
    out = Poly.const(1)
    for d in shape:
        out = out * d
    return out


def _larger(a: Poly, b: Poly, point: dict[str, int]) -> Poly:
    """The larger of two byte counts of one tensor (at the trace point)."""
    return a if a(point["b"], point["s"], point["c"]) >= b(point["b"], point["s"],
                                                          point["c"]) else b


def _getitem() -> Any:
    import operator

    return operator.getitem


_MOE_MODULES = ("mlp", "block_sparse_moe", "feed_forward", "moe", "ffn")


def _in_moe_module(local: str) -> bool:
    parts = local.split(".")
    return bool(parts) and parts[0] in _MOE_MODULES and not any("shared" in p for p in parts)


def _fallback_role(block: str, previous: str = "") -> str:
    """The role of an op without a module of its own in ``block``. In the LM head block, a
    backward op without one (a gradient sum: the final RMSNorm's two uses of its input) takes
    the role of the op before it (``previous``), not the loss's: the TP pass shards the loss
    over the vocabulary, not the hidden-size gradient of the final norm."""
    if block == "embedding":
        return Role.EMBED.value
    if block == "lm_head":
        return previous or Role.LOSS.value
    return Role.RESIDUAL.value


#: ATen's last-dimension softmax (``aten/src/ATen/native/cuda/SoftMax.cu``, ``host_softmax``
#: and ``host_softmax_backward`` with ``inner_size == 1``): a row of fewer than
#: ``10 x 1024`` elements stays in registers (``cunn_SoftMaxForwardReg``) and one that fits the
#: block's 48 KiB of static shared memory in shared memory (``cunn_SoftMaxForwardSmem``,
#: ``cunn_SoftMaxBackwardSmem``); both read it once. A longer row takes ``cunn_SoftMaxForward``,
#: which reads the input for the row maximum, again for the sum of exponentials and again to
#: write the result, and ``cunn_SoftMaxBackward``, which reads the gradient for its row sum and
#: again with the output to write the input gradient.
SOFTMAX_REGISTER_ROW = 10 * 1024
SOFTMAX_SMEM_BYTES = 48 * 1024


def _softmax_rows_three_pass(base: str, node: Any, ndim: int, cols: float,
                             elem_bytes: int) -> bool:
    """Whether ``base`` (a softmax or its backward over the last of ``ndim`` dimensions) runs
    ATen's multi-pass kernel for rows of ``cols`` elements of ``elem_bytes`` each."""
    dim_arg = {"_softmax": 1, "_log_softmax": 1, "_softmax_backward_data": 2,
               "_log_softmax_backward_data": 2}.get(base)
    if dim_arg is None or len(node.args) <= dim_arg:
        return False
    dim = node.args[dim_arg]
    if not isinstance(dim, int) or dim not in (-1, ndim - 1):
        return False
    return cols >= SOFTMAX_REGISTER_ROW and cols * elem_bytes >= SOFTMAX_SMEM_BYTES
