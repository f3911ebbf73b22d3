"""Which op shapes to measure: the compute nodes of traced graphs at concrete (b, s, c) points.

``select_shapes(graphs, points)`` evaluates every compute node's shape params at each point and
keeps the unique (op kind, family, dtype, shape) combinations, so a profiling run measures
exactly what the simulator will ask the profile DB for. ``model_graphs`` gets the graphs of a
catalog model: the real frontend (``charon_search.frontend.trace_model``) when available, else
the hand-built synthetic blocks with the model's dimensions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from charon_search.errors import ConfigError
from charon_search.ir.graph import OpGraph

__all__ = ["PROFILED_KINDS", "OpShape", "fp8_training_gemm_grid", "gh100_crosscheck_grid",
           "model_graphs", "parse_points", "select_shapes", "standard_grid",
           "training_attention_grid"]

#: Op kinds the profiler knows how to run, with the params it reads.
PROFILED_KINDS: dict[str, tuple[str, ...]] = {
    "gemm": ("m", "n", "k"),
    "attention": ("batch", "heads", "kv_heads", "q_len", "kv_len", "head_dim"),
    "attention_bwd": ("batch", "heads", "kv_heads", "q_len", "kv_len", "head_dim"),
    "norm": ("rows", "cols"),
    "elementwise": ("numel",),
    "grouped_gemm": ("tokens", "top_k", "num_experts", "n", "k"),
}
#: Dtypes the timer builds tensors for (index/int ops are not profiled).
_DTYPES = ("bf16", "fp16", "fp32")
_ELEMENTWISE_VARIANT = {"residual": "add", "mlp.act": "act", "attn.rope": "rope"}


@dataclass(frozen=True, slots=True, kw_only=True)
class OpShape:
    """One concrete op to measure."""

    op_kind: str
    variant: str
    """``prefill``/``decode`` (attention; a ``prefill`` shape is causal when ``q_len ==
    kv_len``, else a non-causal rectangle), ``add``/``act``/``rope`` (elementwise),
    ``moe_ffn`` (grouped GEMM, one expert GEMM), ``rmsnorm`` (norm), ``""`` (bf16 GEMM),
    ``scaled_mm.tensorwise`` / ``scaled_mm.rowwise`` / ``scaled_mm.rowwise_slowacc`` (fp8 GEMM
    through ``torch._scaled_mm``)."""
    dtype: str
    params: tuple[tuple[str, float], ...]

    def get(self, name: str, default: float = 0.0) -> float:
        return dict(self.params).get(name, default)


def parse_points(text: str) -> list[tuple[float, float, float]]:
    """``"1x4096,8x1:2048"`` -> [(b=1, s=4096, c=4096), (b=8, s=1, c=2048)]."""
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        try:
            b, rest = item.split("x")
            s, _, c = rest.partition(":")
            out.append((float(b), float(s), float(c or s)))
        except ValueError:
            raise ConfigError(f"--points item {item!r}: must look like BxS or BxS:C "
                              "(micro-batch x query tokens [: context length])") from None
    if not out:
        raise ConfigError("--points: give at least one BxS point")
    return out


def select_shapes(graphs: Iterable[OpGraph], points: Sequence[tuple[float, float, float]]
                  ) -> list[OpShape]:
    """Unique profiled-kind shapes of the graphs' compute nodes at ``points`` (stable order)."""
    seen: dict[OpShape, None] = {}
    for graph in graphs:
        for node in graph.nodes:
            kind = str(node.kind)
            if kind == "attention_bwd":
                continue  # priced from the forward (cost/selector.py); see --train-attention
            if node.is_comm or kind not in PROFILED_KINDS or node.dtype not in _DTYPES:
                continue
            for b, s, c in points:
                values = {p: float(node.params[p](b, s, c)) for p in PROFILED_KINDS[kind]
                          if p in node.params}
                if kind == "attention":
                    variant = "decode" if values.get("q_len") == 1 else "prefill"
                elif kind == "elementwise":
                    variant = _ELEMENTWISE_VARIANT.get(str(node.role), "add")
                elif kind == "norm":
                    variant = "rmsnorm"
                elif kind == "grouped_gemm":
                    variant = "moe_ffn"
                else:
                    variant = ""
                if any(v <= 0 for v in values.values()):
                    continue
                shape = OpShape(op_kind=kind, variant=variant, dtype=node.dtype,
                                params=tuple(sorted(values.items())))
                seen.setdefault(shape, None)
    return list(seen)


def model_graphs(name: str, phase: str = "prefill") -> list[OpGraph]:
    """Forward (and backward for ``train``) graphs of a catalog model."""
    from charon_search.catalog import load_model

    spec = load_model(name)
    try:
        from charon_search.frontend import trace_model

        traced: Any = trace_model(spec, phase=phase)  # type: ignore[arg-type]
    except Exception:  # frontend missing or failing here: same dims, hand-built blocks
        from charon_search.passes.synthetic import synthetic_model

        dims = {"hidden": spec.hidden_size, "heads": spec.num_attention_heads,
                "kv_heads": spec.num_key_value_heads, "ffn": spec.intermediate_size,
                "vocab": spec.vocab_size}
        layer_types = tuple(spec.layer_types) or ("dense",)
        if spec.num_experts:
            dims.update(num_experts=spec.num_experts, top_k=spec.num_experts_per_token,
                        moe_ffn=spec.moe_intermediate_size or spec.intermediate_size)
        traced = synthetic_model(spec, layer_types=layer_types, train=phase == "train", **dims)
    out = []
    for block in traced.blocks.values():
        out.append(block.forward)
        if phase == "train" and block.backward is not None:
            out.append(block.backward)
    return out


def _shape(kind: str, variant: str, dtype: str, **params: float) -> OpShape:
    """An ``OpShape`` with its params sorted by name (the dedup key)."""
    return OpShape(op_kind=kind, variant=variant, dtype=dtype,
                   params=tuple(sorted((k, float(v)) for k, v in params.items())))


def standard_grid(dtype: str = "bf16") -> list[OpShape]:
    """A compact shape grid on the aiconfigurator collection's grid points, so measured rows
    can be compared one-to-one with the shipped DB: GEMMs m x (n, k), causal prefill and
    decode attention, RMSNorm, elementwise, balanced grouped expert GEMMs."""
    out: list[OpShape] = []

    def add(kind: str, variant: str, **params: float) -> None:
        out.append(_shape(kind, variant, dtype, **params))

    for m in (1, 16, 128, 1024, 4096, 16384):
        for n, k in ((4096, 4096), (6144, 4096), (4096, 12288), (12288, 4096), (8192, 8192),
                     (1024, 8192), (8192, 1024), (3072, 3072)):
            add("gemm", "", m=m, n=n, k=k)
    for heads, kvh, d in ((32, 8, 128), (64, 8, 128), (8, 1, 128), (16, 16, 64)):
        for batch, seq in ((1, 1024), (1, 4096), (4, 2048), (1, 16384)):
            add("attention", "prefill", batch=batch, heads=heads, kv_heads=kvh, q_len=seq,
                kv_len=seq, head_dim=d)
        for batch, kv in ((1, 1024), (16, 4096), (64, 2048), (256, 1024), (64, 16384)):
            add("attention", "decode", batch=batch, heads=heads, kv_heads=kvh, q_len=1,
                kv_len=kv, head_dim=d)
    for rows in (1, 256, 4096, 16384):
        for cols in (4096, 8192):
            add("norm", "rmsnorm", rows=rows, cols=cols)
    for numel in (2**16, 2**20, 2**24, 2**27):
        for variant in ("add", "act", "rope"):
            add("elementwise", variant, numel=numel)
    for tokens in (16, 256, 4096):
        for experts, topk, n, k in ((8, 2, 28672, 4096), (128, 8, 1536, 2048)):
            add("grouped_gemm", "moe_ffn", tokens=tokens, top_k=topk, num_experts=experts,
                n=n, k=k)
    return out


#: Query heads per GPU of the training attention grid: Llama-3 8B unsharded (32 heads;
#: torchtitan repeats the 8 KV heads, so SDPA sees 32/32), 70B at TP8 (8 heads) and 8B at TP8
#: (4 heads); meta-llama/Llama-3.1-8B and -70B config.json (catalog).
_TRAIN_HEADS = (32, 8, 4)


def training_attention_grid(dtype: str = "bf16", *, head_dim: int = 128,
                            v_head_dim: int | None = None) -> list[OpShape]:
    """Training attention, forward and backward, at the shapes the training records run.

    Causal squares (``q_len == kv_len``) of 1k-32k tokens at 1-16 sequences (at most 64k
    tokens), and the per-step blocks of load-balanced ring attention (PyTorch
    ``context_parallel``): at context-parallel degree 4 and 128k tokens a rank holds 32k
    queries as two 16k chunks; the first ring step is the causal 32k square, later steps are
    non-causal rectangles of 32k queries x 16k keys or 16k queries x 32k keys. Each shape is
    emitted as ``attention`` and ``attention_bwd`` (the backward kernel alone). ``v_head_dim``
    (default ``head_dim``) gives MLA-style shapes (DeepSeek-V3: 192 / 128).
    """
    extra = {} if v_head_dim in (None, head_dim) else {"v_head_dim": v_head_dim}
    blocks = [(b, s, s) for s in (1024, 2048, 4096, 8192, 16384, 32768)
              for b in (1, 2, 4, 8, 16) if b * s <= 65536]
    blocks += [(1, 32768, 16384), (1, 16384, 32768), (1, 8192, 16384)]
    out: list[OpShape] = []
    for heads in _TRAIN_HEADS:
        for b, q, kv in blocks:
            for kind in ("attention", "attention_bwd"):
                out.append(_shape(kind, "prefill", dtype, batch=b, heads=heads, kv_heads=heads,
                                  q_len=q, kv_len=kv, head_dim=head_dim, **extra))
    return list(dict.fromkeys(out))


#: Linear layers (in, out) per GPU at tensor parallelism 8 with sequence parallelism:
#: Llama-3.1-8B (hidden 4096, 32/8 heads x 128, ffn 14336) and -70B (8192, 64/8 x 128,
#: 28672) (catalog config.json); tokens per GEMM = micro-batch x sequence of the torchtitan
#: AsyncTP records (8B: 12 x 8192, 70B: 16 x 8192).
_FP8_LINEARS = ((12 * 8192, ((4096, 768), (512, 4096), (4096, 3584), (1792, 4096))),
                (16 * 8192, ((8192, 1280), (1024, 8192), (8192, 7168), (3584, 8192))))


def fp8_training_gemm_grid() -> list[OpShape]:
    """The forward, input-gradient and weight-gradient GEMMs of those linears, each as a bf16
    ``F.linear`` and as fp8 ``torch._scaled_mm`` (tensorwise with fast accumulation; rowwise
    with and without), so fp8 / bf16 time ratios come from one run."""
    out: list[OpShape] = []
    for tokens, linears in _FP8_LINEARS:
        for k_in, n_out in linears:
            for m, n, k in ((tokens, n_out, k_in), (tokens, k_in, n_out), (n_out, k_in, tokens)):
                out.append(_shape("gemm", "", "bf16", m=m, n=n, k=k))
                for variant in ("scaled_mm.tensorwise", "scaled_mm.rowwise",
                                "scaled_mm.rowwise_slowacc"):
                    out.append(_shape("gemm", variant, "fp8", m=m, n=n, k=k))
    return out


#: (n, k) of the shipped GEMM tables (aiconfigurator-core, vLLM 0.24.0 ``gemm_perf``) for the
#: H100 / H200 cross-check. The first two are shapes where the two parts' fp8 rows nearly
#: agree; the last three are where they disagree most. At m 1,024-16,384 the H200's fp8 time
#: is 0.56-0.88x the H100's there (4,096 x 51,200 x 51,200: 687 TFLOP/s in the H100 table,
#: 1,230 in the H200 one), while their bf16 rows agree within 0.95-1.15x
#: (``docs/calibration/README.md``, session 54).
GH100_CROSSCHECK_NK = ((4096, 4096), (8192, 8192), (16384, 12288), (65536, 12288),
                       (51200, 51200))
#: Token counts of the cross-check GEMMs (grid points of both tables).
GH100_CROSSCHECK_M = (1024, 4096, 16384)
#: Decode-shaped small ops of the cross-check: RMSNorm rows (tokens of a decode batch) x hidden
#: sizes of gpt-oss-120b (2,880), Llama-3.1-8B (4,096) and DeepSeek-V3 (7,168), and the same
#: sizes as residual adds and activations. Timed by CUDA-graph replay, as decode steps run.
GH100_CROSSCHECK_ROWS = (1, 4, 16, 64, 256)
GH100_CROSSCHECK_COLS = (2880, 4096, 7168)


def gh100_crosscheck_grid() -> list[OpShape]:
    """What one run on an H100 and one on an H200 compare (``run_gh100_crosscheck.sh``): the
    GEMMs of ``GH100_CROSSCHECK_NK`` x ``GH100_CROSSCHECK_M`` as bf16 ``F.linear`` and as fp8
    ``torch._scaled_mm`` (tensorwise, fast accumulation), and decode-sized RMSNorms, adds and
    activations. The two parts are one GH100 die at 700 W, so equal compute-bound times would
    say the shipped tables' fp8 gap is the measurement's (a throttled run), not the die's."""
    out: list[OpShape] = []
    for n, k in GH100_CROSSCHECK_NK:
        for m in GH100_CROSSCHECK_M:
            out.append(_shape("gemm", "", "bf16", m=m, n=n, k=k))
            out.append(_shape("gemm", "scaled_mm.tensorwise", "fp8", m=m, n=n, k=k))
    for rows in GH100_CROSSCHECK_ROWS:
        for cols in GH100_CROSSCHECK_COLS:
            out.append(_shape("norm", "rmsnorm", "bf16", rows=rows, cols=cols))
            for variant in ("add", "act"):
                out.append(_shape("elementwise", variant, "bf16", numel=rows * cols))
    return out
