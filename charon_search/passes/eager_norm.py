"""Unfused ("eager") RMSNorm, as torchtitan runs it without torch.compile.

The frontend fuses each norm module into one ``norm`` node per direction (a fused kernel reads
the input once and writes the output once). Without torch.compile, torchtitan's Llama runs its
own ``RMSNorm`` module (``torchtitan/models/norms.py`` of Dec 2024, ``norm_type = "rmsnorm"``
in ``train_configs/llama3_8b.toml``)::

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        output = self._norm(x.float()).type_as(x)
        return output * self.weight

in eager mode, one CUDA kernel per op. With ``R`` rows, ``C`` columns, activations of ``a``
bytes (bf16: 2) and fp32 intermediates (4 bytes), bytes per element read + written:

forward (8 kernels)
    ``x.float()`` a + 4, ``pow(2)`` 4 + 4, ``mean(-1)`` 4 (+ 4/C), ``+ eps`` and ``rsqrt``
    (``R`` elements each), ``x * rstd`` 4 + 4, ``type_as(x)`` 4 + a, ``* weight`` a + a.
backward (autograd formulas of ``tools/autograd/derivatives.yaml``, 14 kernels, plus the
``x.float()`` backward cast that the frontend already keeps as its own node)
    ``* weight``: ``grad * weight`` a + a, ``grad * output`` 2a + a and its ``sum_to_size`` over
    the rows a; ``type_as``: cast to fp32 a + 4; ``x * rstd``: ``grad * rstd`` 4 + 4,
    ``grad * x`` 8 + 4 and its sum over the columns 4; ``rsqrt`` backward
    (``-0.5 * grad * result.pow(3)``) and ``mean`` backward (``grad.expand(...) / C``: writes 4);
    ``pow(2)`` backward (``pow_backward``: ``grad * (2 * x.pow(1))``, three kernels: 8, 8, 8 + 4);
    the two gradients of ``x.float()`` summed (8 + 4).

Forward 36 B and backward 86 B per element for bf16, against 10 B and 22 B for the fused
kernels the frontend traced. Kernels that only touch ``R`` (per-row) elements are kept: each
costs a launch. LayerNorm nodes (``native_layer_norm``, one ATen kernel in eager mode too) are
left alone. The kernels stand for traced ops (target ``eager_norm:<op>``, not ``pass:``), so
torchtitan's op-level SAC re-runs them in the backward as it did the fused node
(``passes.recompute``). Enable with ``Layout.norm_impl = "eager"``.
"""

from __future__ import annotations

from charon_search.ir import DTYPE_BYTES, Node, OpGraph, OpKind, Phase, Poly
from charon_search.passes._rewrite import GraphBuilder, expand_nodes
from charon_search.passes.base import PASSES, Pass, PassContext, PassResult, must_run_before

__all__ = ["EAGER_RMSNORM_BWD", "EAGER_RMSNORM_FWD", "EagerNormPass", "eager_norm_nodes"]

_F32 = 4.0
#: ``(name, bytes read per element, bytes written per element, per-row kernel)`` with ``a`` for
#: the activation dtype's size (see the module docstring); per-row kernels move 4 B per row.
EAGER_RMSNORM_FWD: tuple[tuple[str, str, str, bool], ...] = (
    ("to_fp32", "a", "4", False),
    ("pow", "4", "4", False),
    ("mean", "4", "0", False),
    ("add_eps", "4", "4", True),
    ("rsqrt", "4", "4", True),
    ("mul_rstd", "4", "4", False),
    ("type_as", "4", "a", False),
    ("mul_weight", "a", "a", False),
)
EAGER_RMSNORM_BWD: tuple[tuple[str, str, str, bool], ...] = (
    ("grad_mul_weight", "a", "a", False),
    ("grad_weight_mul", "2a", "a", False),
    ("grad_weight_sum", "a", "0", False),
    ("grad_to_fp32", "a", "4", False),
    ("grad_mul_rstd", "4", "4", False),
    ("grad_rstd_mul", "8", "4", False),
    ("grad_rstd_sum", "4", "0", False),
    ("rsqrt_bwd_pow", "4", "4", True),
    ("rsqrt_bwd_mul", "8", "4", True),
    ("mean_bwd", "0", "4", False),
    ("pow_bwd_pow", "4", "4", False),
    ("pow_bwd_scale", "4", "4", False),
    ("pow_bwd_mul", "8", "4", False),
    ("grad_accumulate", "8", "4", False),
)
#: The ``x.float()`` backward cast (fp32 -> activation dtype), appended when the graph does not
#: already hold it as its own node (the traced backward does: ``fused:_to_copy``).
_CAST_BACK = ("grad_to_input_dtype", "4", "a", False)
_STANDALONE_CAST = "fused:_to_copy"
NORM_ROLES_SKIPPED_TARGETS = ("layer_norm", "group_norm")


def _bytes(expr: str, a: float) -> float:
    """``"2a"`` -> ``2 * a``, ``"a"`` -> ``a``, ``"4"`` -> ``4.0``."""
    if expr.endswith("a"):
        return float(expr[:-1] or 1) * a
    return float(expr)


def eager_norm_nodes(node: Node, gb: GraphBuilder, *, with_cast: bool) -> list[Node]:
    """The eager kernel chain replacing fused RMSNorm node ``node`` (its inputs feed the first
    kernel, its outputs come out of the last)."""
    rows, cols = node.params["rows"], node.params["cols"]
    numel = rows * cols
    a = DTYPE_BYTES.get(node.dtype or "bf16", 2)
    if node.phase == Phase.BACKWARD:
        steps = EAGER_RMSNORM_BWD + ((_CAST_BACK,) if with_cast else ())
    else:
        steps = EAGER_RMSNORM_FWD
    out: list[Node] = []
    prev: tuple[int, ...] = tuple(node.inputs)
    for i, (name, rd, wr, per_row) in enumerate(steps):
        n = rows if per_row else numel
        last = i == len(steps) - 1
        outs = tuple(node.outputs) if last else (
            gb.new_tensor(shape=(rows, Poly.const(1) if per_row else cols), dtype="fp32"),)
        ins = prev if i == 0 else prev + ((node.inputs[0],) if node.inputs else ())
        out.append(node.replace(
            id=gb.fresh_id(), name=gb.unique_name(f"{node.name}.{name}"),
            kind=OpKind.ELEMENTWISE, inputs=tuple(dict.fromkeys(ins)), outputs=outs,
            flops=n * 1.0, bytes_read=n * _bytes(rd, a), bytes_written=n * _bytes(wr, a),
            params={"numel": n}, target=f"eager_norm:{name}",
            tags=(node.tags - {"fused"}) | {"eager_norm"}))
        prev = outs
    return out


def _expandable(node: Node) -> bool:
    return node.kind == OpKind.NORM and node.target != _STANDALONE_CAST and not any(
        t in node.target for t in NORM_ROLES_SKIPPED_TARGETS)


@PASSES.register("eager_norm")
class EagerNormPass(Pass):
    """Replace fused RMSNorm kernels with torchtitan's eager ``RMSNorm`` kernels."""

    name = "eager_norm"

    def enabled(self, ctx: PassContext) -> bool:
        return ctx.norm_impl == "eager"

    def run(self, graph: OpGraph, ctx: PassContext) -> PassResult:
        if not any(_expandable(n) for n in graph.nodes):
            return PassResult(graph, False)
        has_cast = {n.module_path for n in graph.nodes
                    if n.kind == OpKind.NORM and n.target == _STANDALONE_CAST}
        return PassResult(expand_nodes(graph, lambda node, gb: eager_norm_nodes(
            node, gb, with_cast=node.module_path not in has_cast)
            if _expandable(node) else None), True)


must_run_before("fusion", "eager_norm")
for _after in ("tp", "cp", "recompute", "fp8"):
    must_run_before("eager_norm", _after)
