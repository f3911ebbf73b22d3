"""Activation memory of one traced block by liveness, summarised once as polynomial arrays.

The walk follows PyTorch's caching semantics: a tensor is allocated when its producer runs and
freed after its last consumer; the forward tensors AOT autograd saves for the backward
(``TracedBlock.saved``) live until their last backward consumer; views (nodes that write no
bytes) alias their input. Every tensor gets a *sharding class* that says how it divides under a
layout:

* ``tp``  - inside a tensor-parallel region (Q/K/V, attention scores, MLP intermediates,
  vocab-parallel logits): divided by ``tp``;
* ``seq`` - the hidden-size stream outside TP regions (norm inputs/outputs, residuals, dropout
  masks, MoE token buffers): divided by ``tp`` only with sequence parallelism;
* ``rep`` - replicated (token ids, tiny per-row statistics created from nothing).

The class is decided at GEMM boundaries by the node's role (column-parallel GEMMs open a TP
region in the forward and close it in the backward, row-parallel GEMMs the other way round),
and every other op inherits the class of its largest activation input. Context parallelism
divides the sequence: sizes are evaluated at ``s / cp`` (and ``c / cp`` for ring attention).

Because peaks are maxima over time of sums of polynomials, the summary keeps the live bytes of
every step as coefficient arrays ``[steps, classes * monomials]``; evaluating a layout is one
matrix-vector product per timeline (microseconds), never a new walk.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from charon_search.ir.graph import DTYPE_BYTES, Node, OpGraph, TracedBlock
from charon_search.ir.ops import OpKind, Phase, Role
from charon_search.ir.symbolic import Poly
from charon_search.passes.tensor_parallel import position_table

__all__ = [
    "CLASSES",
    "BlockActivations",
    "ShardingPoint",
    "block_activations",
]

CLASSES: tuple[str, ...] = ("tp", "seq", "rep")
_TP, _SEQ, _REP = range(3)

#: Roles whose forward GEMM output is TP-sharded (column parallel) - Megatron-LM
#: ``ColumnParallelLinear`` (Shoeybi et al., arXiv 1909.08053, Fig. 3).
_COLUMN = frozenset({Role.ATTN_QKV, Role.MLP_IN, Role.LM_HEAD})
#: Roles whose forward GEMM output is the full hidden size again (row parallel).
_ROW = frozenset({Role.ATTN_OUT, Role.MLP_OUT})
#: Ops strictly inside a TP region: their outputs are TP-sharded whatever their inputs.
_INNER = frozenset({Role.ATTN_QK_NORM, Role.ATTN_ROPE, Role.ATTN_CORE, Role.MLP_ACT})
_SHARDED_WEIGHTS = _COLUMN | _ROW | _INNER | {Role.MOE_SHARED, Role.EMBED}
_GEMMS = frozenset({OpKind.GEMM, OpKind.GROUPED_GEMM})
#: A sample point used only to rank tensors by size when inheriting a class.
_SAMPLE = (2.0, 1024.0, 1024.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardingPoint:
    """Where to evaluate a block: micro-batch, local sequence/context and class divisors."""

    b: float
    s: float
    """Local query tokens per sequence (``seq_len / cp``)."""
    c: float
    """Local key/value length seen by attention."""
    tp: int = 1
    sequence_parallel: bool = False

    def weights(self, monomials: np.ndarray) -> np.ndarray:
        """Flat ``[classes * monomials]`` vector turning coefficient rows into bytes."""
        point = np.array([self.b, self.s, self.c], dtype=float)
        mono = np.prod(point[None, :] ** monomials, axis=1) if len(monomials) else np.zeros(0)
        cls = np.array([1.0 / self.tp, 1.0 / self.tp if self.sequence_parallel else 1.0, 1.0])
        return np.outer(cls, mono).ravel()


@dataclass(frozen=True, kw_only=True)
class BlockActivations:
    """Liveness summary of one block (one layer type, the embedding or the LM head).

    Every ``*_bytes`` array is a row of coefficients over ``CLASSES x monomials``; timelines are
    ``[steps, CLASSES x monomials]``. ``ShardingPoint.weights`` turns them into bytes.
    """

    name: str
    monomials: np.ndarray
    """``[M, 3]`` exponents of ``(b, s, c)``."""
    saved: np.ndarray
    """All tensors saved for the backward (no recompute)."""
    saved_core: np.ndarray
    """Saved tensors produced inside the attention core and used only there: the part
    Megatron's selective recompute drops (Korthikanti et al., arXiv 2205.05198, Sec. 5)."""
    core_inputs: np.ndarray
    """Inputs of the attention core from outside it that are not saved anyway: what selective
    recompute must keep instead of the dropped tensors."""
    saved_gemm_input: np.ndarray
    """Saved tensors some forward GEMM reads (stored as FP8 copies under FP8 training)."""
    block_input: np.ndarray
    """Non-parameter inputs of the forward graph: what full recompute keeps per layer."""
    op_sac_saved: np.ndarray
    """What torchtitan's per-op selective AC stores: the block input, the outputs of every
    other forward ``mm`` (the 1st, 3rd...) and of fused attention
    (``torchtitan/models/llama3/infra/parallelize.py``, ``_custom_policy``)."""
    shared_inputs: np.ndarray
    """Model-wide inputs the block reads (attention mask, RoPE tables): one copy per stage."""
    op_sac_needed: np.ndarray
    """The part of ``op_sac_saved`` a compiled block keeps: AOT autograd's partitioner saves a
    must-save output only if the backward (or the recompute of something it needs) reads it,
    while eager SAC caches every must-save output (``torch/utils/checkpoint.py``,
    ``_CachingTorchDispatchMode``). For a Llama block the difference is the down projection's
    output, read only by the residual add."""
    saved_col_inputs: np.ndarray
    """Saved inputs of column-parallel GEMMs in the ``seq`` class: with sequence parallelism
    DTensor (torchtitan) saves the *all-gathered* copy for the weight gradient, Megatron the
    sharded one (it re-gathers in the backward, Korthikanti et al. Sec. 4.2.2)."""
    fused_delta: np.ndarray
    """Change of ``saved`` when norms and the gated activation run as fused kernels
    (Transformer Engine's RMSNorm/LayerNorm + GEMM, Megatron's ``bias_swiglu``): a norm then
    keeps its bf16 input and per-row statistics instead of the full-width fp32 copy and
    normalised intermediates HF's eager code saves, and the activation keeps its inputs
    (recomputing SiLU/GELU in the backward) instead of its internal outputs. Negative or
    zero."""
    logits_fp32: np.ndarray
    """Bytes of the logits the LM head GEMM hands to the loss, counted at 4 B per element (the
    fp32 copy every loss implementation is measured in); zero outside the LM head."""
    saved_noloss: np.ndarray
    """``saved`` without the tensors of loss ops (the loss is modelled per implementation)."""
    fwd_live_noloss: np.ndarray
    """``fwd_live`` without the tensors of loss ops."""
    bwd_live_noloss: np.ndarray
    """``bwd_live`` without the tensors of loss ops."""
    fwd_live: np.ndarray
    """Live activation bytes after each forward step (saved tensors accumulate)."""
    bwd_live: np.ndarray
    """Live bytes after each backward step, including saved tensors not yet freed."""
    num_saved_tensors: int = 0
    module_saved: dict[str, np.ndarray] = field(default_factory=dict)
    """Per Megatron-Core recompute module (``layout.RECOMPUTE_MODULES``): the saved bytes its
    checkpoint frees. Normal checkpointing frees the tensors the module makes and only it
    reads; output-discarding checkpointing (``layout.OUTPUT_DISCARDING_MODULES``) frees
    everything saved that the module makes, its output included."""
    module_inputs: dict[str, np.ndarray] = field(default_factory=dict)
    """Per recompute module: its inputs from outside it that are not saved anyway, which the
    checkpoint keeps instead (``core_inputs`` for ``core_attn``)."""

    def evaluate(self, point: ShardingPoint) -> dict[str, float]:
        """Bytes of every summary at ``point`` (keys: the array names, ``selective_saved``,
        ``fwd_peak``, ``bwd_peak``)."""
        w = point.weights(self.monomials)
        saved = float(self.saved @ w)
        out = {
            "saved": saved,
            "saved_core": float(self.saved_core @ w),
            "saved_gemm_input": float(self.saved_gemm_input @ w),
            "core_inputs": float(self.core_inputs @ w),
            # Megatron selective recompute keeps everything but the attention core's
            # internals, plus the core's inputs (Korthikanti et al., Sec. 5).
            "selective_saved": saved - float(self.saved_core @ w) + float(self.core_inputs @ w),
            "block_input": float(self.block_input @ w),
            "shared_inputs": float(self.shared_inputs @ w),
            "op_sac_saved": float(self.op_sac_saved @ w),
            "op_sac_needed": float(self.op_sac_needed @ w),
            "fwd_peak": _peak(self.fwd_live, w),
            "bwd_peak": _peak(self.bwd_live, w),
            "logits": float(self.logits_fp32 @ w),
            "fused_delta": float(self.fused_delta @ w),
            "saved_noloss": float(self.saved_noloss @ w),
            "fwd_peak_noloss": _peak(self.fwd_live_noloss, w),
            "bwd_peak_noloss": _peak(self.bwd_live_noloss, w),
        }
        for m, row in self.module_saved.items():
            out[f"module_saved:{m}"] = float(row @ w)
        for m, row in self.module_inputs.items():
            out[f"module_inputs:{m}"] = float(row @ w)
        col = float(self.saved_col_inputs @ w)
        if point.sequence_parallel and point.tp > 1:
            # Bytes the all-gathered copies add over the sharded ones: (tp - 1) x sharded.
            out["col_gather_extra"] = col * (point.tp - 1)
        else:
            out["col_gather_extra"] = 0.0
        return out


def _peak(live: np.ndarray, w: np.ndarray) -> float:
    return float((live @ w).max()) if len(live) else 0.0


# ---------------------------------------------------------------------------- the walk
class _Walk:
    """Shared state of one block's walk: aliases, classes, sizes."""

    def __init__(self, block: TracedBlock) -> None:
        self.fwd = block.forward
        self.bwd = block.backward
        self.params: set[int] = set(self.fwd.param_tensors)
        if self.bwd is not None:
            self.params |= set(self.bwd.param_tensors)
        self.tensors = dict(self.fwd.tensors)
        if self.bwd is not None:
            self.tensors.update(self.bwd.tensors)
        self.alias: dict[int, int] = {}
        self.cls: dict[int, int] = {}
        self._sample: dict[int, float] = {}

    def root(self, t: int) -> int:
        while t in self.alias:
            t = self.alias[t]
        return t

    def size(self, t: int) -> Poly:
        return self.tensors[t].nbytes

    def sample(self, t: int) -> float:
        if t not in self._sample:
            self._sample[t] = self.size(t)(*_SAMPLE)
        return self._sample[t]

    def is_const(self, t: int) -> bool:
        return self.tensors[t].numel.is_const()

    def activation_inputs(self, node: Node) -> list[int]:
        return [t for t in node.inputs if t not in self.params]

    def classify(self, graph: OpGraph, phase: Phase) -> None:
        for t in graph.inputs:
            if t in self.params or t in self.cls:
                continue
            integer = self.tensors[t].dtype.startswith(("int", "uint", "bool"))
            self.cls[t] = _REP if integer else _SEQ
        for node in graph.nodes:
            acts = self.activation_inputs(node)
            if _is_view(node, acts, self):
                self.alias[node.outputs[0]] = acts[0]
                self.cls[node.outputs[0]] = self.cls.get(self.root(acts[0]), _SEQ)
                continue
            inherited = _REP
            if acts:
                biggest = max(acts, key=self.sample)
                inherited = self.cls.get(self.root(biggest), _SEQ)
            for t in node.outputs:
                self.cls[t] = _out_class(node, phase, inherited, self.is_const(t))


def _is_view(node: Node, acts: list[int], walk: _Walk) -> bool:
    """A node writing no bytes with one activation input and one output of no larger size."""
    if node.bytes_written or len(node.outputs) != 1 or len(acts) != 1:
        return False
    if node.kind not in (OpKind.OTHER, OpKind.COPY, OpKind.ELEMENTWISE):
        return False
    return walk.sample(node.outputs[0]) <= walk.sample(acts[0])


def _out_class(node: Node, phase: Phase, inherited: int, const: bool) -> int:
    role = node.role
    if const:
        # Parameter gradients (and other (b, s)-free tensors): sharded like their weight (a
        # learned position table's gradient is whole on every rank, as the table is).
        return _TP if role in _SHARDED_WEIGHTS and not position_table(node) else _REP
    if role in _INNER:
        return _TP
    if node.kind in _GEMMS or node.kind == OpKind.EMBEDDING:
        forward = phase == Phase.FORWARD
        if node.kind == OpKind.EMBEDDING:
            return _SEQ
        if role in _COLUMN:
            return _TP if forward else _SEQ
        if role in _ROW:
            return _SEQ if forward else _TP
    return inherited


def block_activations(block: TracedBlock) -> BlockActivations:
    """Walk ``block``'s forward (and backward, if any) graph and summarise its liveness.

    Args:
        block: A traced block; ``block.backward`` is ``None`` for inference blocks (then only
            the forward timeline is filled and the saved sets are empty).

    Returns:
        The polynomial summary; evaluate it with ``BlockActivations.evaluate``.
    """
    walk = _Walk(block)
    walk.classify(block.forward, Phase.FORWARD)
    if block.backward is not None:
        walk.classify(block.backward, Phase.BACKWARD)

    fwd = block.forward
    fwd_known = set(fwd.producer) | set(fwd.inputs)
    saved_ids = list(block.saved)
    if block.backward is not None:
        # Any forward tensor the backward reads is saved, listed in ``saved`` or not.
        saved_ids += [t for t in block.backward.inputs if t in fwd_known]
    hidden_in, shared_in = _split_inputs(block, walk)
    rows = _Rows(walk)
    consumers_fwd: dict[int, list[Node]] = {}
    for node in fwd.nodes:
        for t in node.inputs:
            if t not in walk.params:
                consumers_fwd.setdefault(walk.root(t), []).append(node)

    full = _timelines(block, walk, rows, saved_ids, hidden_in, shared_in, skip=frozenset())
    saved_roots, fwd_live, bwd_live = full
    saved_set = set(saved_roots)
    # The loss (HF's fp32 log-softmax + NLL) is summarised apart as well: how much a loss keeps
    # depends on its implementation (eager, DTensor loss parallel, compiled, fused in place).
    loss_nodes = frozenset(n.id for g in (fwd, block.backward) if g is not None
                           for n in g.nodes if n.role == Role.LOSS)
    logits: list[int] = []
    if loss_nodes:
        saved_nl, fwd_nl, bwd_nl = _timelines(block, walk, rows, saved_ids, hidden_in,
                                              shared_in, skip=loss_nodes)
        for node in fwd.nodes:
            if node.kind in _GEMMS and node.role == Role.LM_HEAD:
                logits += [t for t in node.outputs
                           if any(u.id in loss_nodes for u in consumers_fwd.get(t, []))]
    else:
        saved_nl, fwd_nl, bwd_nl = saved_roots, fwd_live, bwd_live

    # ----------------------------------------------------------------- saved subsets
    gemm_in = []
    col_in = []
    for t in saved_roots:
        users = consumers_fwd.get(t, [])
        if any(u.kind in _GEMMS for u in users):
            gemm_in.append(t)
        if walk.cls.get(t) == _SEQ and any(u.kind in _GEMMS and u.role in _COLUMN
                                           for u in users):
            col_in.append(t)
    op_saved = list(hidden_in)
    mm_count = 0
    for node in fwd.nodes:
        if node.kind == OpKind.GEMM:
            mm_count += 1
            if mm_count % 2 == 1:
                op_saved.extend(t for t in node.outputs if t not in walk.alias)
        elif node.kind == OpKind.ATTENTION:
            op_saved.extend(t for t in node.outputs if t not in walk.alias)
    op_saved = list(dict.fromkeys(op_saved))
    module_saved, module_inputs = _module_summaries(fwd, walk, rows, saved_roots, saved_set,
                                                    shared_in, consumers_fwd)
    # Megatron's attention-core selective recompute is the ``core_attn`` module (normal
    # checkpointing): what only the core reads is dropped; tensors entering it from outside are
    # kept even where autograd saved only copies made inside the core (e.g. the q/k/v reshapes
    # HF GPT-2 makes before its bmm).
    none = np.zeros(rows.width)
    return BlockActivations(
        name=block.name,
        monomials=rows.monomials,
        saved=rows.sum(saved_roots),
        saved_core=module_saved.get("core_attn", none),
        saved_gemm_input=rows.sum(gemm_in),
        core_inputs=module_inputs.get("core_attn", none),
        block_input=rows.sum(hidden_in),
        shared_inputs=rows.sum(shared_in),
        op_sac_saved=rows.sum(op_saved),
        op_sac_needed=rows.sum(_needed(fwd, walk, op_saved, saved_roots, shared_in)),
        saved_col_inputs=rows.sum(col_in),
        fused_delta=_fused_delta(fwd, walk, rows, saved_roots, shared_in),
        logits_fp32=sum((rows.row(t) * (4 / DTYPE_BYTES[walk.tensors[t].dtype])
                         for t in dict.fromkeys(logits)), np.zeros(rows.width)),
        saved_noloss=rows.sum(saved_nl),
        fwd_live_noloss=fwd_nl,
        bwd_live_noloss=bwd_nl,
        fwd_live=fwd_live,
        bwd_live=bwd_live,
        num_saved_tensors=len(saved_roots),
        module_saved=module_saved,
        module_inputs=module_inputs,
    )


def _checkpointed(fwd: OpGraph, walk: _Walk, ids: set[int], discard_output: bool,
                  saved_roots: list[int], saved_set: set[int], shared: set[int],
                  consumers_fwd: dict[int, list[Node]]) -> tuple[list[int], list[int]]:
    """``(freed, kept)`` of checkpointing the forward nodes ``ids``: the saved tensors they make
    that the checkpoint drops (only what they alone read; with ``discard_output``, everything,
    their output included), and their inputs from outside that it keeps instead (not already
    saved, not parameters or model-wide tensors)."""
    freed = []
    for t in saved_roots:
        prod = fwd.producer.get(t)
        if prod is None or prod not in ids:
            continue
        if discard_output or all(u.id in ids for u in consumers_fwd.get(t, [])):
            freed.append(t)
    kept: list[int] = []
    for node in fwd.nodes:
        if node.id not in ids:
            continue
        for t in node.inputs:
            r = walk.root(t)
            if t in walk.params or r in shared or r in saved_set:
                continue
            prod = fwd.producer.get(r)
            if prod is None or prod not in ids:
                kept.append(r)
    return freed, list(dict.fromkeys(kept))


def _module_summaries(fwd: OpGraph, walk: _Walk, rows: _Rows, saved_roots: list[int],
                      saved_set: set[int], shared_in: list[int],
                      consumers_fwd: dict[int, list[Node]],
                      ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """``module_saved`` / ``module_inputs`` of every recompute module with nodes in ``fwd``
    (the nodes ``passes.recompute.module_nodes`` re-runs)."""
    from charon_search.layout import OUTPUT_DISCARDING_MODULES, RECOMPUTE_MODULES
    from charon_search.passes.recompute import module_nodes

    dropped: dict[str, np.ndarray] = {}
    inputs: dict[str, np.ndarray] = {}
    shared = set(shared_in)
    for m in RECOMPUTE_MODULES:
        ids = {n.id for n in module_nodes(fwd, (m,))}
        if not ids:
            continue
        freed, kept_in = _checkpointed(fwd, walk, ids, m in OUTPUT_DISCARDING_MODULES,
                                       saved_roots, saved_set, shared, consumers_fwd)
        dropped[m] = rows.sum(freed)
        inputs[m] = rows.sum(kept_in)
    return dropped, inputs


_NORMS = frozenset({Role.ATTN_NORM, Role.MLP_NORM, Role.FINAL_NORM})


def _fused_delta(fwd: OpGraph, walk: _Walk, rows: _Rows, saved: list[int],
                 shared: list[int]) -> np.ndarray:
    """``saved`` under fused norm and activation kernels minus ``saved`` as traced.

    Per region (the nodes of one norm role, or the gated activation): saved tensors made in
    the region that only the region reads in the forward, and as large as the region's input
    (full-width copies, not per-row statistics), are dropped; the region's activation inputs
    are kept instead when nothing saves them already.
    """
    saved_set = set(saved)
    skip = set(shared)
    consumers: dict[int, list[Node]] = {}
    for node in fwd.nodes:
        for t in node.inputs:
            consumers.setdefault(walk.root(t), []).append(node)
    drop: dict[int, None] = {}
    add: dict[int, None] = {}
    regions: dict[str, list[Node]] = {}
    for node in fwd.nodes:
        if node.role in _NORMS or node.role == Role.MLP_ACT:
            regions.setdefault(str(node.role), []).append(node)
    for nodes in regions.values():
        ids = {n.id for n in nodes}
        made = {t for n in nodes for t in n.outputs if t not in walk.alias}
        inputs = [walk.root(t) for n in nodes for t in n.inputs
                  if t not in walk.params and walk.root(t) not in made
                  and walk.root(t) not in skip]
        width = max((walk.sample(t) for t in inputs), default=0.0)
        for t in made:
            users = consumers.get(t, [])
            if t in saved_set and all(u.id in ids for u in users) and walk.sample(t) >= width:
                drop[t] = None
        for t in inputs:
            if t not in saved_set:
                add[t] = None
    return rows.sum(add) - rows.sum(drop)


def _needed(fwd: OpGraph, walk: _Walk, must_save: list[int], saved: list[int],
            shared: list[int]) -> list[int]:
    """Must-save tensors the backward needs: saved themselves, or on the recompute path of a
    saved tensor (walking producers back from each saved tensor, stopping at must-save ones)."""
    ms = set(must_save)
    skip = set(shared)
    out: dict[int, None] = {}
    seen: set[int] = set()
    stack = list(saved)
    while stack:
        t = stack.pop()
        if t in seen or t in skip:
            continue
        seen.add(t)
        if t in ms:
            out[t] = None
            continue
        prod = fwd.producer.get(t)
        if prod is None:
            continue
        stack.extend(walk.root(i) for i in fwd.node(prod).inputs if i not in walk.params)
    return list(out)


def _timelines(block: TracedBlock, walk: _Walk, rows: _Rows, saved_ids: list[int],
               hidden_in: list[int], shared_in: list[int], *,
               skip: frozenset[int]) -> tuple[list[int], np.ndarray, np.ndarray]:
    """(saved roots, forward live bytes, backward live bytes), ignoring the nodes in ``skip``
    (their outputs are never allocated and their reads never keep a tensor alive)."""
    fwd = block.forward
    fwd_known = set(fwd.producer) | set(fwd.inputs)
    skipped_out = {t for g in (fwd, block.backward) if g is not None for n in g.nodes
                   if n.id in skip for t in n.outputs}
    skipped_in = {walk.root(t) for g in (fwd, block.backward) if g is not None
                  for n in g.nodes if n.id in skip for t in n.inputs}
    saved_roots = list(dict.fromkeys(
        walk.root(t) for t in saved_ids
        if t not in walk.params and t not in shared_in and walk.root(t) not in skipped_out))
    saved_set = set(saved_roots)

    # ----------------------------------------------------------------- forward timeline
    fnodes = [n for n in fwd.nodes if n.id not in skip]
    n_fwd = max(1, len(fnodes))
    last_use_fwd: dict[int, int] = {}
    for i, node in enumerate(fnodes):
        for t in node.inputs:
            if t not in walk.params:
                last_use_fwd[walk.root(t)] = i
    fwd_outputs = {walk.root(t) for t in fwd.outputs} - skipped_out
    fwd_events: list[tuple[int, int, int]] = []  # (alloc step, free step, tensor)
    for t in hidden_in:
        free = n_fwd - 1 if (t in saved_set or t in fwd_outputs) else last_use_fwd.get(t, 0)
        fwd_events.append((0, free, t))
    for i, node in enumerate(fnodes):
        for t in node.outputs:
            if t in walk.alias:
                continue
            if t in saved_set or t in fwd_outputs:
                free = n_fwd - 1
            else:
                free = max(last_use_fwd.get(t, i), i)
            fwd_events.append((i, free, t))
    fwd_live = rows.timeline(n_fwd, fwd_events) if fnodes else np.zeros((0, rows.width))

    # ----------------------------------------------------------------- backward timeline
    bwd = block.backward
    bnodes = [n for n in bwd.nodes if n.id not in skip] if bwd is not None else []
    if bwd is not None and bnodes:
        n_bwd = len(bnodes)
        last_use_bwd: dict[int, int] = {}
        for i, node in enumerate(bnodes):
            for t in node.inputs:
                if t not in walk.params:
                    last_use_bwd[walk.root(t)] = i
        bwd_outputs = {walk.root(t) for t in bwd.outputs}
        bwd_events: list[tuple[int, int, int]] = []
        for t in saved_roots:
            bwd_events.append((0, last_use_bwd.get(t, 0), t))
        for t in bwd.inputs:
            r = walk.root(t)
            if t in walk.params or r in saved_set or r in fwd_known or r in shared_in:
                continue
            if r not in last_use_bwd and r in skipped_in:
                continue  # read only by skipped nodes
            bwd_events.append((0, last_use_bwd.get(r, 0), r))  # incoming gradient
        for i, node in enumerate(bnodes):
            for t in node.outputs:
                if t in walk.alias:
                    continue
                if t in bwd_outputs:
                    # Parameter gradients go to the gradient buffer / reduce-scatter at once;
                    # the input gradient flows on to the previous layer.
                    free = i if walk.is_const(t) else n_bwd - 1
                else:
                    free = max(last_use_bwd.get(t, i), i)
                bwd_events.append((i, free, t))
        bwd_live = rows.timeline(n_bwd, bwd_events)
    else:
        bwd_live = np.zeros((0, rows.width))
    return saved_roots, fwd_live, bwd_live


def _split_inputs(block: TracedBlock, walk: _Walk) -> tuple[list[int], list[int]]:
    """(hidden-state inputs, model-wide shared inputs) of the forward graph.

    The hidden state has the shape of the block's output; other non-parameter inputs (attention
    mask, RoPE cos/sin, position ids) are one tensor for the whole model, referenced by every
    layer, so they are not per-layer memory. Blocks whose output shape matches no input (the
    embedding, the LM head) treat every input as their own.
    """
    fwd = block.forward
    saved = set(block.saved)
    out_shapes = {fwd.tensors[t].shape for t in fwd.outputs if t not in saved}
    acts = [t for t in fwd.inputs if t not in walk.params]
    hidden = [t for t in acts if fwd.tensors[t].shape in out_shapes]
    if not hidden:
        return acts, []
    return hidden, [t for t in acts if t not in hidden]


class _Rows:
    """Builds coefficient rows over ``CLASSES x monomials`` for one block."""

    def __init__(self, walk: _Walk) -> None:
        self.walk = walk
        monos = sorted({e for t in walk.tensors for e, _ in walk.size(t).terms})
        self.col = {e: i for i, e in enumerate(monos)}
        self.monomials = np.array(monos, dtype=float).reshape(len(monos), 3)
        self.width = len(CLASSES) * len(monos)

    def row(self, t: int) -> np.ndarray:
        out = np.zeros(self.width)
        cls = self.walk.cls.get(t, _SEQ)
        base = cls * len(self.col)
        for e, c in self.walk.size(t).terms:
            out[base + self.col[e]] += c
        return out

    def sum(self, ids: Iterable[int]) -> np.ndarray:
        out = np.zeros(self.width)
        for t in ids:
            out += self.row(t)
        return out

    def timeline(self, steps: int, events: list[tuple[int, int, int]]) -> np.ndarray:
        """Live bytes after each step from (alloc, free, tensor) events (inclusive range)."""
        delta = np.zeros((steps + 1, self.width))
        for alloc, free, t in events:
            r = self.row(t)
            delta[alloc] += r
            delta[min(free, steps - 1) + 1] -= r
        return np.cumsum(delta, axis=0)[:steps]

