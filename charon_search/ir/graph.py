"""OpGraph, Node and TensorSpec: the simulator's small, picklable, torch-free IR.

A graph is a topologically ordered tuple of ``Node``s over ``TensorSpec``s identified by integer
ids. Shapes, FLOPs and bytes are ``Poly`` values in the symbols ``b``, ``s``, ``c`` so one traced
graph serves every batch and sequence length (``OpGraph.evaluate``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from charon_search.ir.ops import COMM_KINDS, SPARSE_TOPK_PARAM, OpKind, Phase
from charon_search.ir.symbolic import SYMBOLS, Poly, PolyLike, as_poly

__all__ = ["DTYPE_BYTES", "EvaluatedGraph", "Node", "OpGraph", "TensorSpec", "TracedBlock"]

#: Bytes per element of the dtypes the IR names.
DTYPE_BYTES: dict[str, float] = {
    "fp64": 8, "fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "fp4": 0.5,
    "int64": 8, "int32": 4, "int16": 2, "uint8": 1, "bool": 1,
}
#: Element types of indices and masks (token ids, labels, expert ids, row positions), not
#: data. ``int8`` is not among them (it can be a quantized activation or weight).
INDEX_DTYPES = frozenset({"int64", "int32", "int16", "uint8", "bool"})


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorSpec:
    """One tensor value: its symbolic shape and dtype."""

    id: int
    shape: tuple[Poly, ...]
    dtype: str
    """A key of ``DTYPE_BYTES``."""

    @property
    def numel(self) -> Poly:
        out = Poly.const(1)
        for d in self.shape:
            out = out * d
        return out

    @property
    def nbytes(self) -> Poly:
        return self.numel * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    """One operator."""

    id: int
    name: str
    """Unique within the graph (the fx node name for traced ops)."""
    kind: OpKind
    target: str = ""
    """The ATen op (``aten.mm.default``) or the pass that created the node."""
    module_path: str = ""
    """Module path inside the traced block, e.g. ``self_attn.q_proj``; empty for glue ops."""
    role: str = ""
    """Architecture-neutral role of the op (``ir.ops.Role``), which passes key on: TP shards
    ``attn.qkv`` column-wise and ``attn.out`` row-wise whatever the HF module is called."""
    phase: Phase = Phase.FORWARD
    inputs: tuple[int, ...] = ()
    """Tensor ids read by the node."""
    outputs: tuple[int, ...] = ()
    """Tensor ids written by the node."""
    flops: Poly = field(default_factory=Poly)
    bytes_read: Poly = field(default_factory=Poly)
    bytes_written: Poly = field(default_factory=Poly)
    params: Mapping[str, Poly] = field(default_factory=dict)
    """Shape parameters of the kind, see ``ir.ops.PARAMS_BY_KIND``."""
    dtype: str = "bf16"
    """Compute dtype (GEMM input dtype) used to pick a peak FLOP/s rate."""
    stream: str = "compute"
    """Stream the engine runs the node on: ``compute``, ``comm``, ``comm_<axis>``..."""
    group: str = ""
    """Parallel axis of a collective (``tp``, ``cp``, ``ep``, ``dp``, ``pp``); empty otherwise."""
    tags: frozenset[str] = frozenset()
    """Free labels set by passes: ``fused``, ``fp8``, ``recompute``, ``overlap_tp``..."""

    def param(self, name: str) -> Poly:
        try:
            return self.params[name]
        except KeyError:
            raise KeyError(f"node {self.name} ({self.kind}) has no param {name!r}") from None

    @property
    def is_comm(self) -> bool:
        return self.kind in COMM_KINDS

    @property
    def sparse_topk(self) -> float | None:
        """Keys per query of a sparse (top-k) attention node (``SPARSE_TOPK_PARAM``), else None."""
        p = self.params.get(SPARSE_TOPK_PARAM) if self.kind == OpKind.ATTENTION else None
        return None if p is None else p.const_value()

    def attended_c(self, c: float) -> float:
        """The context length the node's cost sees at context ``c``: ``min(c, topk)`` for sparse
        attention (its FLOPs and bytes are linear in ``c``, one term per attended key), else
        ``c``."""
        k = self.sparse_topk
        return c if k is None else min(c, k)

    @property
    def bytes(self) -> Poly:
        return self.bytes_read + self.bytes_written

    def replace(self, **changes: Any) -> Node:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, kw_only=True)
class EvaluatedGraph:
    """Per-node numbers of a graph at one concrete ``(b, s, c)`` (numpy arrays, node order)."""

    flops: np.ndarray
    bytes: np.ndarray
    b: float
    s: float
    c: float


@dataclass(frozen=True, kw_only=True)
class OpGraph:
    """A topologically ordered operator graph.

    Attributes are immutable; derived indexes are computed once (``cached_property``), so keep a
    graph and rewrite it into a new one (``with_nodes``) rather than mutating it.
    """

    name: str
    nodes: tuple[Node, ...]
    tensors: Mapping[int, TensorSpec]
    inputs: tuple[int, ...] = ()
    """Tensor ids that come from outside (block input, parameters, saved activations)."""
    outputs: tuple[int, ...] = ()
    """Tensor ids the graph returns (block output, saved activations, gradients)."""
    param_tensors: tuple[int, ...] = ()
    """Ids (among ``inputs``) that are model parameters."""
    meta: Mapping[str, Any] = field(default_factory=dict)
    """Plain-builtin metadata (model name, phase, dtype, layer type)."""

    # ------------------------------------------------------------------ construction
    def with_nodes(self, nodes: Iterable[Node], **changes: Any) -> OpGraph:
        """A new graph with ``nodes`` (and any other field changed); tensors are kept."""
        return dataclasses.replace(self, nodes=tuple(nodes), **changes)

    # ------------------------------------------------------------------ indexes
    @cached_property
    def node_index(self) -> dict[int, int]:
        return {n.id: i for i, n in enumerate(self.nodes)}

    @cached_property
    def producer(self) -> dict[int, int]:
        """Tensor id -> id of the node that writes it."""
        return {t: n.id for n in self.nodes for t in n.outputs}

    @cached_property
    def consumers(self) -> dict[int, tuple[int, ...]]:
        """Tensor id -> ids of the nodes that read it."""
        out: dict[int, list[int]] = {}
        for n in self.nodes:
            for t in n.inputs:
                out.setdefault(t, []).append(n.id)
        return {t: tuple(v) for t, v in out.items()}

    def node(self, node_id: int) -> Node:
        return self.nodes[self.node_index[node_id]]

    # ------------------------------------------------------------------ evaluation
    @cached_property
    def _coeff_matrices(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        monos = sorted(
            {e for n in self.nodes for p in (n.flops, n.bytes_read, n.bytes_written)
             for e, _ in p.terms}
        )
        col = {e: i for i, e in enumerate(monos)}
        flops = np.zeros((len(self.nodes), len(monos)))
        nbytes = np.zeros((len(self.nodes), len(monos)))
        for i, n in enumerate(self.nodes):
            for e, c in n.flops.terms:
                flops[i, col[e]] += c
            for p in (n.bytes_read, n.bytes_written):
                for e, c in p.terms:
                    nbytes[i, col[e]] += c
        exps = np.array(monos, dtype=float).reshape(len(monos), len(SYMBOLS))
        return flops, nbytes, exps

    def evaluate(self, b: float = 1, s: float = 1, c: float | None = None) -> EvaluatedGraph:
        """FLOPs and bytes of every node at ``(b, s, c)`` (``c`` defaults to ``s``).

        One matrix-vector product per quantity: this is the "re-evaluate, never re-trace" path.
        """
        cc = s if c is None else c
        flops, nbytes, exps = self._coeff_matrices
        point = np.array([b, s, cc], dtype=float)
        monomials = np.prod(point[None, :] ** exps, axis=1) if len(exps) else np.zeros(0)
        f, by = flops @ monomials, nbytes @ monomials
        for i, topk in self._sparse_rows:
            if cc > topk:  # sparse attention: evaluated at its attended keys, min(c, topk)
                capped = np.prod(np.array([b, s, topk], dtype=float)[None, :] ** exps, axis=1)
                f[i], by[i] = flops[i] @ capped, nbytes[i] @ capped
        return EvaluatedGraph(flops=f, bytes=by, b=b, s=s, c=cc)

    @cached_property
    def _sparse_rows(self) -> tuple[tuple[int, float], ...]:
        """(row, topk) of the sparse-attention nodes (``Node.attended_c``)."""
        return tuple((i, k) for i, n in enumerate(self.nodes)
                     if (k := n.sparse_topk) is not None)

    def total_flops(self, b: float = 1, s: float = 1, c: float | None = None) -> float:
        return float(self.evaluate(b, s, c).flops.sum())

    def total_bytes(self, b: float = 1, s: float = 1, c: float | None = None) -> float:
        return float(self.evaluate(b, s, c).bytes.sum())

    def flops_poly(self) -> Poly:
        out = Poly()
        for n in self.nodes:
            out = out + n.flops
        return out

    def param_bytes(self) -> float:
        """Bytes of the parameters the graph reads (constant in b, s, c)."""
        return float(sum(self.tensors[t].nbytes.const_value() for t in self.param_tensors))

    def num_params(self) -> int:
        return int(sum(self.tensors[t].numel.const_value() for t in self.param_tensors))

    def next_ids(self) -> tuple[int, int]:
        """Fresh (node id, tensor id) for a pass adding nodes and tensors."""
        return (max((n.id for n in self.nodes), default=-1) + 1,
                max(self.tensors, default=-1) + 1)


@dataclass(frozen=True, kw_only=True)
class TracedBlock:
    """One traced block (decoder layer type, embedding or LM head) of a model.

    For training, ``forward`` and ``backward`` are AOT autograd's partition of the joint graph,
    and ``saved`` lists the forward tensors kept for the backward (the saved activations); both
    graphs share tensor ids, so ``saved`` ids are outputs of ``forward`` and inputs of
    ``backward``. Inference blocks have ``backward=None`` and an empty ``saved``.
    """

    name: str
    """``embedding``, ``lm_head`` or the decoder layer type (``dense``, ``moe``...)."""
    forward: OpGraph
    backward: OpGraph | None = None
    saved: tuple[int, ...] = ()
    num_params: int = 0
    """Parameters held by one instance of this block (exact, counted on the meta device)."""

    def saved_bytes(self) -> Poly:
        out = Poly()
        for t in self.saved:
            out = out + self.forward.tensors[t].nbytes
        return out


def poly_params(**kwargs: PolyLike) -> dict[str, Poly]:
    """Helper for building ``Node.params``: converts numbers to ``Poly``."""
    return {k: as_poly(v) for k, v in kwargs.items()}
