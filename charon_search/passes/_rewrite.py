"""Small helpers passes share: node scaling, GEMM classification, and a graph builder that
inserts communication nodes and rewires later readers."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from charon_search.ir import DTYPE_BYTES, Node, OpGraph, OpKind, Phase, Poly, TensorSpec, sym
from charon_search.ir.symbolic import as_poly

__all__ = [
    "COUNT_PARAMS",
    "GraphBuilder",
    "expand_nodes",
    "fold_region",
    "gemm_bytes",
    "gemm_kind",
    "scale_node",
]

#: The param of each kind that counts "how much" work the node does (scaled when sharding).
COUNT_PARAMS: dict[OpKind, tuple[str, ...]] = {
    OpKind.ELEMENTWISE: ("numel",),
    OpKind.REDUCTION: ("numel",),
    OpKind.COPY: ("numel",),
    OpKind.OPTIMIZER: ("numel",),
    OpKind.NORM: ("rows",),
    OpKind.SOFTMAX: ("rows",),
    OpKind.BATCHED_GEMM: ("batch",),
    OpKind.ATTENTION: ("heads", "kv_heads"),
    OpKind.ATTENTION_BWD: ("heads", "kv_heads"),
    OpKind.LINEAR_ATTENTION: ("heads", "k_heads"),
    OpKind.LINEAR_ATTENTION_BWD: ("heads", "k_heads"),
    OpKind.EMBEDDING: ("tokens",),
    OpKind.MOE_ROUTING: ("tokens",),
    OpKind.GROUPED_GEMM: ("tokens",),
}


def fold_region(region: Iterable[Node], carrier: Node, *, join_target: str, tag: str,
                **kernel: Any) -> dict[int, Node]:
    """Replacement nodes for a run of ops that become one kernel: ``carrier`` takes the fields
    ``kernel`` gives (its price) and the tags ``fused`` and ``tag``; every other node of
    ``region`` becomes a zero-cost join (kind ``OTHER``, target ``join_target``, tag ``tag``)
    that keeps the data flow."""
    out: dict[int, Node] = {}
    for n in region:
        if n.id == carrier.id:
            out[n.id] = n.replace(**kernel, tags=n.tags | {"fused", tag})
        else:
            out[n.id] = n.replace(kind=OpKind.OTHER, target=join_target, flops=Poly(),
                                  bytes_read=Poly(), bytes_written=Poly(), params={},
                                  tags=n.tags | {tag})
    return out


def gemm_kind(node: Node) -> str:
    """``fwd`` (m = tokens), ``dgrad`` (backward, m = tokens) or ``wgrad`` (k = tokens).

    Linear backward: dgrad ``[tokens, out] x [out, in]``; wgrad ``[out, tokens] x [tokens, in]``.
    """
    if node.phase in (Phase.FORWARD, Phase.RECOMPUTE):
        return "fwd"
    k = node.params.get("k")
    if k is not None and k.degree("b") > 0:
        return "wgrad"
    return "dgrad"


def gemm_bytes(m: Poly, n: Poly, k: Poly, dtype: str) -> Poly:
    """HBM bytes of one GEMM: read A [m,k] and B [k,n], write C [m,n]."""
    return (m * k + k * n + m * n) * DTYPE_BYTES.get(dtype, 2)


def _div_count(p: Poly, f: float) -> Poly:
    return p / f


def scale_node(node: Node, f: float, *, params: Iterable[str] | None = None) -> Node:
    """Divide a node's FLOPs, bytes and its count params by ``f`` (one of ``f`` shards).

    ``kv_heads`` never drops below one head: with more shards than K/V heads (tp > kv_heads)
    each rank holds one whole, replicated head, so an attention node keeps
    ``max(kv_heads / f, 1) / kv_heads`` of its K/V reads (``_kv_read_bytes``), not ``1 / f``.
    """
    if f == 1:
        return node
    names = tuple(params) if params is not None else COUNT_PARAMS.get(node.kind, ())
    new_params = dict(node.params)
    for name in names:
        if name not in new_params:
            continue
        v = new_params[name]
        if name == "kv_heads" and v.is_const():
            new_params[name] = Poly.const(max(v.const_value() / f, 1.0))
        else:
            new_params[name] = _div_count(v, f)
    bytes_read = node.bytes_read / f
    kv = node.params.get("kv_heads")
    if "kv_heads" in names and kv is not None and kv.is_const() and kv.const_value() < f:
        # The K/V share: 1/f of it came off above, max(kv/f, 1)/kv = 1/kv stays.
        bytes_read = bytes_read + _kv_read_bytes(node) * (1.0 / kv.const_value() - 1.0 / f)
    return node.replace(
        flops=node.flops / f, bytes_read=bytes_read,
        bytes_written=node.bytes_written / f, params=new_params,
    )


def _kv_read_bytes(node: Node) -> Poly:
    """The K/V cache bytes an attention node reads.

    Forward: all it reads but the queries (``batch x q_len x heads x head_dim``): K and V, a
    latent read once as both (absorbed MLA), and what every head shares (a decode mask, DSA's
    top-k indices), which a rank reads whole as well. Backward: K and V from the shape params
    (its other inputs, the output and its gradient, are per query head)."""
    p = node.params
    dtype_bytes = DTYPE_BYTES.get(node.dtype, 2)
    if node.kind == OpKind.ATTENTION_BWD:
        return (p["batch"] * p["kv_len"] * p["kv_heads"] * (p["head_dim"] + p["v_head_dim"])
                * dtype_bytes)
    queries = p["batch"] * p["q_len"] * p["heads"] * p["head_dim"] * dtype_bytes
    return node.bytes_read - queries


def shard_gemm(node: Node, dim: str, f: float) -> Node:
    """Divide GEMM dim ``dim`` (``m``, ``n`` or ``k``) by ``f``; FLOPs scale, bytes recomputed."""
    if f == 1:
        return node
    p = dict(node.params)
    p[dim] = p[dim] / f
    return node.replace(
        flops=node.flops / f,
        bytes_read=(p["m"] * p["k"] + p["k"] * p["n"]) * DTYPE_BYTES.get(node.dtype, 2),
        bytes_written=p["m"] * p["n"] * DTYPE_BYTES.get(node.dtype, 2),
        params=p,
    )


def subs_node(node: Node, **values: Poly | float) -> Node:
    """Substitute symbols in a node's FLOPs, bytes and params (``s=sym('s')/cp``)."""
    return node.replace(
        flops=node.flops.subs(**values),
        bytes_read=node.bytes_read.subs(**values),
        bytes_written=node.bytes_written.subs(**values),
        params={k: v.subs(**values) for k, v in node.params.items()},
    )


class GraphBuilder:
    """Accumulates a rewritten node list with fresh ids and tensor renames."""

    def __init__(self, graph: OpGraph) -> None:
        self.graph = graph
        self.next_node_id, self.next_tensor_id = graph.next_ids()
        self.tensors: dict[int, TensorSpec] = dict(graph.tensors)
        self.nodes: list[Node] = []
        self.rename: dict[int, int] = {}
        self.names = {n.name for n in graph.nodes}

    # ---------------------------------------------------------------- tensors and nodes
    def new_tensor(self, like: TensorSpec | None = None, *, shape: tuple[Poly, ...] = (),
                   dtype: str = "bf16") -> int:
        tid = self.next_tensor_id
        self.next_tensor_id += 1
        if like is not None:
            shape, dtype = like.shape, like.dtype
        self.tensors[tid] = TensorSpec(id=tid, shape=shape, dtype=dtype)
        return tid

    def unique_name(self, base: str) -> str:
        name, i = base, 1
        while name in self.names:
            i += 1
            name = f"{base}_{i}"
        self.names.add(name)
        return name

    def fresh_id(self) -> int:
        nid = self.next_node_id
        self.next_node_id += 1
        return nid

    def mapped(self, tids: Iterable[int]) -> tuple[int, ...]:
        return tuple(self.rename.get(t, t) for t in tids)

    def add(self, node: Node) -> Node:
        """Append ``node`` with its inputs renamed through the current rename map."""
        node = node.replace(inputs=self.mapped(node.inputs))
        self.nodes.append(node)
        return node

    def add_comm(self, kind: OpKind, *, group: str, group_size: int, nbytes: Poly | float,
                 reads: Iterable[int], like: int | None, phase: Phase, module_path: str = "",
                 name: str, rewire: bool = True, tags: Iterable[str] = ()) -> int:
        """Append a collective reading ``reads``; returns its output tensor id.

        With ``rewire`` the output replaces tensor ``like`` for every later reader and in the
        graph outputs (the collective sits between ``like``'s producer and its consumers).
        """
        like_spec = self.tensors[like] if like is not None else None
        out = self.new_tensor(like_spec, shape=(Poly.const(1),), dtype="bf16")
        node = Node(
            id=self.fresh_id(), name=self.unique_name(name), kind=kind,
            target=f"pass:{group}", module_path=module_path, role="comm", phase=phase,
            inputs=self.mapped(reads), outputs=(out,), params={
                "bytes": as_poly(nbytes), "group_size": Poly.const(group_size)},
            stream=f"comm_{group}", group=group, tags=frozenset(tags),
        )
        self.nodes.append(node)
        if rewire and like is not None:
            self.rename[like] = out
        return out

    def finish(self, *, outputs: tuple[int, ...] | None = None,
               meta: Mapping[str, object] | None = None) -> OpGraph:
        outs = self.mapped(self.graph.outputs if outputs is None else outputs)
        new_meta = dict(self.graph.meta)
        if meta:
            new_meta.update(meta)
        return self.graph.with_nodes(self.nodes, tensors=self.tensors, outputs=outs,
                                     meta=new_meta)


def expand_nodes(graph: OpGraph, expand: Callable[[Node, GraphBuilder], list[Node] | None]
                 ) -> OpGraph:
    """``graph`` with every node for which ``expand`` returns a kernel chain replaced by that
    chain (``None`` keeps the node); ``expand`` allocates the chain's ids and tensors from the
    builder it is given."""
    gb = GraphBuilder(graph)
    for node in graph.nodes:
        chain = expand(node, gb)
        for new in (node,) if chain is None else chain:
            gb.add(new)
    return gb.finish()


def tokens_sym(f: float) -> dict[str, Poly]:
    """Substitution dividing the query-token dimension ``s`` by ``f``."""
    return {"s": sym("s") / f}
