"""Fuse decomposed norms, cut the global op list into per-block fwd/bwd ``OpGraph``s."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from charon_search.ir import (
    Node,
    OpGraph,
    OpKind,
    Phase,
    Poly,
    TensorSpec,
    TracedBlock,
    check,
    poly_params,
)

__all__ = ["assemble"]


def _fuse_norms(ops: list[Any], used_outside: dict[int, set[int]], graph_outputs: set[int],
                tensors: dict[int, TensorSpec]) -> list[Any]:
    """Merge consecutive ops of one norm module instance (and phase) into one NORM op.

    HF RMSNorm runs as a decomposed pow/mean/rsqrt/mul chain; a fused kernel reads the input
    once and writes the output once, so the fused node reads the group's external inputs and
    writes only the tensors used outside the group (including saved activations).
    """
    out: list[Any] = []
    i = 0
    while i < len(ops):
        op = ops[i]
        if "Norm" not in op.module_class or op.kind in (OpKind.GEMM,):
            out.append(op)
            i += 1
            continue
        j = i
        while (j + 1 < len(ops) and ops[j + 1].module_class == op.module_class
               and ops[j + 1].module_path == op.module_path and ops[j + 1].block == op.block
               and ops[j + 1].phase == op.phase and ops[j + 1].kind != OpKind.GEMM):
            j += 1
        group = ops[i: j + 1]
        i = j + 1
        if len(group) == 1 and group[0].kind == OpKind.NORM:
            out.append(group[0])
            continue
        idx = {id(g) for g in group}
        produced = {t for g in group for t in g.outputs}
        inputs: list[int] = []
        reads: dict[int, Poly] = {}
        for g in group:
            for t in g.inputs:
                if t in produced:
                    continue
                if t not in reads:
                    inputs.append(t)
                    reads[t] = g.reads[t]
        outs = [t for t in (t for g in group for t in g.outputs)
                if t in graph_outputs or (used_outside.get(t, set()) - idx)]
        main = max(inputs, key=lambda t: tensors[t].numel(3, 13, 13), default=None)
        shape = tensors[main].shape if main is not None else (Poly.const(1),)
        cols = shape[-1] if shape else Poly.const(1)
        rows = Poly.const(1)
        for d in shape[:-1]:
            rows = rows * d
        first = group[0]
        first.kind = OpKind.NORM
        first.inputs, first.outputs, first.reads = inputs, outs, reads
        first.flops = sum((g.flops for g in group), Poly())
        first.params = poly_params(rows=rows, cols=cols)
        first.target = "fused:" + "+".join(dict.fromkeys(g.base for g in group))
        first.tags = {"fused"}
        out.append(first)
    return out


def assemble(conv: Any, *, model_name: str, dtype: str, block_names: Sequence[str],
             param_blocks: dict[str, int]) -> dict[str, TracedBlock]:
    """Per-block ``TracedBlock``s from a run ``_Converter``."""
    ops = conv.ops
    tensors: dict[int, TensorSpec] = conv.tensors
    used: dict[int, set[int]] = {}
    for op in ops:
        for t in op.inputs:
            used.setdefault(t, set()).add(id(op))
    ops = _fuse_norms(ops, used, conv.graph_outputs, tensors)
    # After fusion: who reads what (by block and phase).
    readers: dict[int, set[tuple[str, Phase]]] = {}
    for op in ops:
        for t in op.inputs:
            readers.setdefault(t, set()).add((op.block, op.phase))
    fw_tensor_ids = {tid for key, tid in conv.tid.items() if key[0] == "fw"}
    blocks: dict[str, TracedBlock] = {}
    next_node = 0
    for name in block_names:
        graphs: dict[Phase, OpGraph] = {}
        fw_ops = [o for o in ops if o.block == name and o.phase == Phase.FORWARD]
        bw_ops = [o for o in ops if o.block == name and o.phase == Phase.BACKWARD]
        saved: list[int] = []
        if bw_ops:
            produced_bw = {t for o in bw_ops for t in o.outputs}
            for o in bw_ops:
                for t in o.inputs:
                    if (t not in produced_bw and t in fw_tensor_ids and t not in conv.param_ids
                            and t not in saved):
                        saved.append(t)
        for phase, group in ((Phase.FORWARD, fw_ops), (Phase.BACKWARD, bw_ops)):
            if phase == Phase.BACKWARD and not group:
                continue
            nodes: list[Node] = []
            produced: set[int] = set()
            inputs: list[int] = []
            for o in group:
                for t in o.inputs:
                    if t not in produced and t not in inputs:
                        inputs.append(t)
                produced.update(o.outputs)
                written = sum((tensors[t].nbytes for t in o.outputs), Poly())
                if o.base in ("empty", "empty_like", "empty_strided", "new_empty"):
                    written = Poly()
                if "kv_append" in o.tags:
                    written = sum(o.reads.values(), Poly())
                nodes.append(Node(
                    id=next_node, name=o.key[1], kind=o.kind, target=o.target,
                    module_path=o.module_path, role=o.role, phase=phase,
                    inputs=tuple(o.inputs), outputs=tuple(o.outputs), flops=o.flops,
                    bytes_read=sum(o.reads.values(), Poly()), bytes_written=written,
                    params=o.params, dtype=o.dtype, tags=frozenset(o.tags),
                ))
                next_node += 1
            outputs = [t for t in sorted(produced)
                       if t in conv.graph_outputs
                       or any(r != (name, phase) for r in readers.get(t, ()))]
            if phase == Phase.FORWARD:
                for t in saved:
                    if t not in produced and t not in inputs:
                        inputs.append(t)
                    if t not in outputs:
                        outputs.append(t)
            refs = set(inputs) | produced
            g = OpGraph(
                name=f"{model_name}:{name}:{phase.value}",
                nodes=tuple(nodes),
                tensors={t: tensors[t] for t in sorted(refs)},
                inputs=tuple(inputs), outputs=tuple(outputs),
                param_tensors=tuple(t for t in inputs if t in conv.param_ids),
                meta={"model": model_name, "block": name, "phase": conv.phase,
                      "dtype": dtype, "graph": phase.value},
            )
            check(g, where=f"frontend {g.name}")
            graphs[phase] = g
        blocks[name] = TracedBlock(
            name=name, forward=graphs[Phase.FORWARD], backward=graphs.get(Phase.BACKWARD),
            saved=tuple(saved), num_params=int(param_blocks.get(name, 0)),
        )
    return blocks
