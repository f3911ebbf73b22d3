"""Pass infrastructure: ``Pass``, ``PassResult``, ``PassContext``, the ``PASSES`` registry and
``PassManager``.

Follows ``torch/fx/passes/infra/pass_base.py`` and ``pass_manager.py``: a pass checks its
preconditions (``requires``), rewrites (``run`` -> ``PassResult(graph, modified)``) and checks its
postconditions (``ensures``). Ordering is declared with ``must_run_before`` (like
``this_before_that_pass_constraint``), not implied by list position.

Per-rank convention: after the parallelism passes a graph describes the work of ONE
representative rank. ``Node`` FLOPs, bytes and params are per rank; ``TensorSpec`` shapes keep
the logical (unsharded) sizes the frontend traced, and collective message sizes are written into
the comm node's ``bytes`` param.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from charon_search.errors import ConfigError, PassError
from charon_search.ir import OpGraph, check
from charon_search.registry import Registry

if TYPE_CHECKING:
    from charon_search.layout import Layout

__all__ = [
    "PASSES",
    "Pass",
    "PassContext",
    "PassManager",
    "PassResult",
    "must_run_before",
    "ordering_constraints",
]


#: Values per fp32 scale of an fp8 EP dispatch (DeepSeek-V3 report sec. 3.3.2: 1x128 activation
#: tiles, the same granularity as its fp8 GEMM inputs), and the bytes per value it moves.
FP8_DISPATCH_BLOCK = 128
FP8_DISPATCH_BYTES = 1 + 4 / FP8_DISPATCH_BLOCK


@dataclass(frozen=True, slots=True, kw_only=True)
class PassContext:
    """What the passes need to know about the layout (one representative rank)."""

    phase: str = "train"
    """``train``, ``prefill`` or ``decode``."""
    tp: int = 1
    cp: int = 1
    ep: int = 1
    dp: int = 1
    sequence_parallel: bool = False
    sp_wgrad_regather: bool = False
    """SP: re-gather a column GEMM's saved input in the backward (``Layout.sp_wgrad_regather``)."""
    tp_async_allreduce: bool = True
    """Backward TP all-reduce under the wgrad GEMM (``Layout.tp_async_allreduce``)."""
    cp_algo: str = "ring"
    """``ring`` (P2P KV, zigzag), ``allgather`` (Llama 3) or ``ulysses`` (all-to-all heads)."""
    cp_ring_impl: str = "overlapped"
    """``overlapped`` or ``torch_traced`` (see ``passes.context_parallel``)."""
    cp_repeat_kv: bool = False
    """K/V repeated to the query-head count before attention (exchanged at ``heads``)."""
    zero_stage: int = 0
    hsdp_shard: int = 0
    recompute: str = "none"
    selective_policy: str = "attention"
    """``attention`` (attention core) or ``op`` (torchtitan op-level SAC); see ``recompute``."""
    recompute_modules: tuple[str, ...] = ()
    """Megatron-Core ``--recompute-modules`` (overrides ``selective_policy`` when set)."""
    sac_saves_reduce_scatter: bool = True
    """Op-level SAC saves the TP reduce-scatters (``Layout.sac_saves_reduce_scatter``)."""
    precision: str = "bf16"
    fp8_recipe: str = "tensorwise"
    """``tensorwise`` / ``rowwise`` (dynamic scaling), ``delayed`` (TE amax history) or
    ``blockwise`` (1x128 / 128x128 block scales); see ``passes.fusion``."""
    fused_kernels: bool = True
    attention_kernel: str = "flash"
    """``flash`` (fused kernel) or ``eager`` (Megatron's unfused core attention)."""
    norm_impl: str = "fused"
    """``fused``, ``persistent`` (apex ``FastLayerNorm``, ``passes.fusion``) or ``eager``
    (torchtitan's eager ``RMSNorm``, ``passes.eager_norm``)."""
    async_tp: bool = False
    moe_a2a_overlap: bool = False
    ep_dispatch_bytes: float = 0.0
    """Bytes per value an EP dispatch moves; 0 = the activation's dtype. A training layout's
    ``ep_dispatch_fp8`` is ``FP8_DISPATCH_BYTES``; TensorRT-LLM's NVFP4 serving dispatch is the
    format's bytes per value (``serving._graphs``)."""
    moe_fused_permute: bool = False
    """Fuse the router / permute / unpermute op runs into one kernel each (``passes.fusion``)."""
    fsdp_prefetch: bool = True
    fsdp_flat_grad: bool = False
    """FSDP1 ``FlatParameter`` gradient path (``Layout.fsdp_flat_grad``,
    ``passes.data_parallel``)."""
    expert_load_imbalance: float = 1.0
    act_dtype: str = "bf16"
    """Dtype of activations moved by TP/CP/EP collectives."""
    grad_reduce_dtype: str = "fp32"
    """Dtype of gradient reduce-scatter / all-reduce (Megatron and torchtitan reduce in fp32;
    ``Layout.grad_reduce_dtype``)."""
    grad_accum_hook: bool = False
    """Per-micro-batch gradient-buffer accumulation kernel (``Layout.grad_accum_hook``)."""
    embedding_grad_hook: bool = False
    """The same kernel over the parameters no GEMM writes (``Layout.embedding_grad_hook``)."""
    mla_rope_fusion: bool = False
    """Megatron-Core's fused MLA RoPE kernels (``Layout.mla_rope_fusion``, ``passes.mla_rope``)."""
    loss_kernel: str = "eager"
    """``eager`` (the traced cross entropy) or ``fused`` (``Layout.loss_kernel``,
    ``passes.fused_loss``)."""
    param_gather_dtype: str = "bf16"
    debug: bool = False
    """Run ``ir.check`` after every pass."""

    @classmethod
    def from_layout(cls, layout: Layout, **overrides: Any) -> PassContext:
        """The context of a training ``Layout``."""
        kw: dict[str, Any] = dict(
            phase="train", tp=layout.tp, cp=layout.cp, ep=layout.ep, dp=layout.dp,
            sequence_parallel=layout.sequence_parallel,
            sp_wgrad_regather=getattr(layout, "sp_wgrad_regather", False),
            tp_async_allreduce=getattr(layout, "tp_async_allreduce", True),
            cp_algo=layout.cp_algo,
            cp_ring_impl=getattr(layout, "cp_ring_impl", "overlapped"),
            cp_repeat_kv=getattr(layout, "cp_repeat_kv", False),
            zero_stage=layout.zero_stage, hsdp_shard=layout.hsdp_shard,
            recompute=layout.recompute,
            selective_policy=getattr(layout, "selective_policy", "attention"),
            recompute_modules=tuple(getattr(layout, "recompute_modules", ())),
            sac_saves_reduce_scatter=getattr(layout, "sac_saves_reduce_scatter", True),
            precision=layout.precision,
            fused_kernels=layout.fused_kernels,
            attention_kernel=getattr(layout, "attention_kernel", "flash"),
            norm_impl=getattr(layout, "norm_impl", "fused"),
            fp8_recipe=getattr(layout, "fp8_recipe", "tensorwise"), async_tp=layout.async_tp,
            moe_a2a_overlap=layout.moe_a2a_overlap, fsdp_prefetch=layout.fsdp_prefetch,
            fsdp_flat_grad=getattr(layout, "fsdp_flat_grad", False),
            grad_reduce_dtype=getattr(layout, "grad_reduce_dtype", "fp32"),
            grad_accum_hook=getattr(layout, "grad_accum_hook", False),
            embedding_grad_hook=getattr(layout, "embedding_grad_hook", False),
            mla_rope_fusion=getattr(layout, "mla_rope_fusion", False),
            loss_kernel=getattr(layout, "loss_kernel", "eager"),
            moe_fused_permute=getattr(layout, "moe_fused_permute", False),
            ep_dispatch_bytes=(FP8_DISPATCH_BYTES if getattr(layout, "ep_dispatch_fp8", False)
                               else 0.0),
            expert_load_imbalance=layout.expert_load_imbalance,
        )
        kw.update(overrides)
        return cls(**kw)

    def key(self) -> tuple[Any, ...]:
        """Hashable identity (for caches)."""
        return tuple(getattr(self, f.name) for f in fields(self))


@dataclass(frozen=True, slots=True)
class PassResult:
    graph: OpGraph
    modified: bool


class Pass(ABC):
    """A graph -> graph rewrite. Subclasses register in ``PASSES`` under a short key."""

    name: str = ""

    def enabled(self, ctx: PassContext) -> bool:
        """Whether the pass applies under ``ctx`` (disabled passes are skipped)."""
        return True

    def requires(self, graph: OpGraph, ctx: PassContext) -> None:  # noqa: B027 - optional hook
        """Raise ``PassError`` if ``graph`` does not meet the pass's preconditions."""

    @abstractmethod
    def run(self, graph: OpGraph, ctx: PassContext) -> PassResult:
        """Rewrite ``graph`` (never mutating it) and say whether anything changed."""

    def ensures(self, graph: OpGraph, ctx: PassContext) -> None:  # noqa: B027 - optional hook
        """Raise ``PassError`` if the rewritten graph breaks the pass's postconditions."""

    def __call__(self, graph: OpGraph, ctx: PassContext) -> PassResult:
        self.requires(graph, ctx)
        result = self.run(graph, ctx)
        self.ensures(result.graph, ctx)
        return result


PASSES: Registry[type[Pass]] = Registry("pass", entry_point_group="charon_search.passes")

_BEFORE: set[tuple[str, str]] = set()


def must_run_before(this: str, that: str) -> None:
    """Declare that pass ``this`` must run before pass ``that`` when both run."""
    _BEFORE.add((this, that))


def ordering_constraints() -> frozenset[tuple[str, str]]:
    return frozenset(_BEFORE)


def _topo_order(names: Sequence[str]) -> list[str]:
    """Order ``names`` to satisfy the declared constraints; ties keep the given order."""
    present = set(names)
    preds: dict[str, set[str]] = {n: set() for n in names}
    for a, b in _BEFORE:
        if a in present and b in present:
            preds[b].add(a)
    out: list[str] = []
    remaining = list(names)
    while remaining:
        for n in remaining:
            if not (preds[n] - set(out)):
                out.append(n)
                remaining.remove(n)
                break
        else:
            raise ConfigError(f"pass ordering constraints form a cycle among {remaining}")
    return out


@dataclass(kw_only=True)
class PassManager:
    """Runs registered passes in a constraint-respecting order.

    Example (a forward graph; ``passes.parallelize_block`` runs a training block's forward and
    then its backward, which ``recompute`` and ZeRO-3 need to see the rewritten forward):
        >>> from charon_search import load_model, trace_model  # doctest: +SKIP
        >>> tm = trace_model(load_model("llama-3.1-8b"), phase="train")  # doctest: +SKIP
        >>> block = tm.blocks["dense"]  # doctest: +SKIP
        >>> pm = PassManager(passes=["tp"])  # doctest: +SKIP
        >>> graph = pm.run(block.forward, PassContext(tp=8))  # doctest: +SKIP
    """

    passes: Sequence[str]
    debug: bool = False
    ran: list[str] = field(default_factory=list)
    snapshots: dict[str, OpGraph] = field(default_factory=dict)
    """Graphs as they were before the passes named in ``run(snapshot_before=...)`` ran."""

    def __post_init__(self) -> None:
        for name in self.passes:
            PASSES.get(name)  # ConfigError naming the valid passes
        self.passes = _topo_order(list(self.passes))

    def run(self, graph: OpGraph, ctx: PassContext,
            snapshot_before: Iterable[str] = ()) -> OpGraph:
        self.ran = []
        self.snapshots = {}
        wanted = frozenset(snapshot_before)
        debug = self.debug or ctx.debug
        for name in self.passes:
            p = PASSES.get(name)()
            if not p.enabled(ctx):
                continue
            if name in wanted:
                self.snapshots[name] = graph
            try:
                result = p(graph, ctx)
            except PassError as e:
                raise PassError(f"pass {name!r} (after {self.ran}) failed: {e}") from e
            graph = result.graph
            if debug and result.modified:
                try:
                    check(graph, where=f"after pass {name!r}")
                except PassError as e:
                    raise PassError(f"{e} (passes run before: {self.ran})") from e
            self.ran.append(name)
        return graph


def run_passes(graph: OpGraph, ctx: PassContext, names: Iterable[str]) -> OpGraph:
    """Convenience: ``PassManager(passes=names).run(graph, ctx)``."""
    return PassManager(passes=list(names), debug=ctx.debug).run(graph, ctx)
