"""Torch tracing frontend: HF model -> per-block ``OpGraph``s with symbolic ``b``, ``s``, ``c``.

>>> from charon_search.catalog import load_model
>>> from charon_search.frontend import trace_model
>>> tm = trace_model(load_model("debug-llama"), phase="train")
>>> sorted(tm.blocks)
['dense', 'embedding', 'lm_head']

How it works: the HF model class is built on the meta device with one decoder layer per layer
type (``catalog._hf.build_reduced_model``); that reduced model (embedding, those layers, final
norm, LM head, and the loss for training) runs on FakeTensors, under AOT autograd with
``default_partition`` for training (so saved activations are what eager autograd keeps) or
``make_fx`` for inference, once, at a point whose ``b``/``s``/``c`` are primes that divide no
config integer (``_symbolic``). Every fx node is mapped to an ``OpKind`` with ``Poly`` shapes,
FLOPs and bytes (``_ops``, ``_convert``), decomposed RMSNorm chains are fused into one NORM node,
and the ops are cut into blocks by module path; backward ops follow their forward op through
autograd's ``seq_nr`` (``_roles``, ``_assemble``). Results are cached in memory and on disk, so a
new batch or sequence length is arithmetic on the cached graph (``OpGraph.evaluate``).

Modelling choices (what the graphs mean):

* ``sdpa``: ``F.scaled_dot_product_attention`` is routed to ONE fused attention node (CPU flash,
  or memory-efficient attention when d_v != d_qk as in MLA), as a GPU kernel would run it; CPU
  torch would otherwise fall back to bmm + softmax. ``eager`` keeps HF's unfused attention (bmm,
  softmax, dropout). gpt-oss has no SDPA path in HF: with ``sdpa`` its eager attention function
  is swapped for the fused op (its per-head sink logit is not modelled). MPT (ALiBi, own
  attention code) gets its attention class's core swapped the same way: the ALiBi bias is
  added inside the fused kernel, as llm-foundry's Triton / flash kernels do.
* Training runs HF's ``ForCausalLMLoss`` (fp32 logits, log-softmax + NLL). Prefill and decode
  compute logits for the last token only (``logits_to_keep=1``); prefill does not write a cache.
* Decode: one new token per sequence (``s = 1``) attending over ``c`` keys; the KV cache holds
  ``c - 1`` fake tokens passed in as graph inputs, and HF's ``cat(past, new)`` is costed as an
  in-place one-token append (tag ``kv_append``). MLA models (DeepSeek-V3) decode with the
  absorbed formulation serving engines use (``_mla``): one 1-KV-head attention over the
  576-wide latent cache instead of HF's per-step re-expansion of all ``c`` tokens.
* Attention keeps the model's K/V heads (GQA/MQA run natively, as GPU kernels take them) and,
  over more than one query, is causal: a mask HF builds instead (Falcon always; sliding
  windows; GLM-5's training path) becomes the kernel's causal mode (``_trace._fused_sdpa``).
  Windows are priced downstream (``ModelSpec.sliding_window``); a decode step of a
  sliding-window layer (gpt-oss) is traced with its window mask over all ``c`` keys.
* Layers whose token mixer is neither attention nor Gated DeltaNet (a state-space scan, a
  convolution) are refused (``ConfigError``), never priced as MLP-only layers.
* Linear attention (Gated DeltaNet layers of Qwen3-Next / Qwen3.5, block types ``*_linear``)
  traces as the two kernels engines run (``_linear_attn``): one causal-convolution node and one
  ``LINEAR_ATTENTION`` delta-rule node, linear in the tokens; decode reads and writes each
  sequence's fixed-size state instead of attending over ``c`` cached keys.
* MoE: transformers' ``grouped_mm`` experts; ``GROUPED_GEMM`` nodes carry ``tokens = b*s``
  (before top-k duplication), ``top_k`` and ``num_experts``; balanced routing is the cost
  side's assumption. Router top-k/sort/histc/scatter ops are ``MOE_ROUTING``.
* Ops the AOT partitioner recomputes inside the backward (masks, position ids) are tagged
  ``recomputed`` and assigned to the block that consumes them.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import threading
from dataclasses import dataclass, replace
from typing import Any, Literal

from charon_search.cache import cache_dir, sources_fingerprint
from charon_search.catalog import ModelSpec, load_model, spec_hash
from charon_search.errors import CharonError, ConfigError
from charon_search.ir import OpKind, Role, TracedBlock

__all__ = ["FRONTEND_VERSION", "PHASES", "TracedModel", "clear_memory_cache", "trace_model"]

#: Bump when the traced graph format or the op mapping changes (invalidates disk caches).
FRONTEND_VERSION = "5"
PHASES = ("train", "prefill", "decode")
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
ATTN_IMPLS = ("sdpa", "eager")

_MEMORY: dict[str, TracedModel] = {}
_LOCK = threading.Lock()
#: Number of uncached traces run in this process (tests use it to prove cache hits).
TRACE_CALLS = 0


@dataclass(frozen=True, kw_only=True)
class TracedModel:
    """A model traced for one phase: one ``TracedBlock`` per distinct block."""

    spec: ModelSpec
    phase: str
    """``train``, ``prefill`` or ``decode``."""
    dtype: str
    attn_impl: str
    """Attention implementation actually traced (``sdpa`` or ``eager``)."""
    blocks: dict[str, TracedBlock]
    """``embedding``, ``lm_head`` and one entry per type in ``spec.layer_types``."""

    def block_counts(self) -> dict[str, int]:
        """How many times each block runs in one forward pass of the whole model."""
        counts = {"embedding": 1, "lm_head": 1}
        for t in self.spec.block_types:
            counts[t] = self.spec.num_layers_of(t)
        return counts

    def total_flops(self, b: float = 1, s: float = 1, c: float | None = None) -> float:
        """FLOPs of the whole model for one step of the phase (fwd + bwd for training)."""
        return self._total("flops", b, s, c)

    def total_bytes(self, b: float = 1, s: float = 1, c: float | None = None) -> float:
        return self._total("bytes", b, s, c)

    def _total(self, what: str, b: float, s: float, c: float | None) -> float:
        total = 0.0
        for name, n in self.block_counts().items():
            blk = self.blocks[name]
            for g in (blk.forward, blk.backward):
                if g is not None:
                    ev = g.evaluate(b, s, c)
                    total += n * float(getattr(ev, what).sum())
        return total

    def num_params(self) -> int:
        counts = self.block_counts()
        return sum(counts[n] * blk.num_params for n, blk in self.blocks.items())


def _versions() -> str:
    import torch
    import transformers

    # The tracing code's own hash too: a change to the op mapping invalidates the disk cache
    # even when FRONTEND_VERSION was not bumped.
    code = sources_fingerprint("frontend", "ir", "catalog")
    return f"torch{torch.__version__}-tf{transformers.__version__}-fe{FRONTEND_VERSION}-{code}"


def _cache_key(spec: ModelSpec, phase: str, dtype: str, attn_impl: str) -> str:
    # The whole spec, not only its HF config: the trace builds the layers of
    # ``spec.layer_types`` and reads its experts and ``extra`` (a caller may replace them).
    raw = f"{spec_hash(spec)}|{phase}|{dtype}|{attn_impl}|{_versions()}"
    return hashlib.sha256(raw.encode()).hexdigest()[:24]


def clear_memory_cache() -> None:
    """Forget in-memory traces (disk cache untouched)."""
    _MEMORY.clear()


def trace_model(
    model: Any,
    phase: Literal["train", "prefill", "decode"] = "train",
    dtype: str = "bf16",
    *,
    attn_impl: Literal["sdpa", "eager"] = "sdpa",
    use_disk_cache: bool = True,
) -> TracedModel:
    """Trace ``model`` (a ``ModelSpec`` or anything ``load_model`` takes) for ``phase``.

    Args:
        model: ``ModelSpec``, catalog name, config path or HF module.
        phase: ``train`` (forward + backward, loss included), ``prefill`` (forward, c = s, LM
            head on the last token) or ``decode`` (one new token per sequence, ``s = 1``,
            attention over ``c`` keys of which ``c - 1`` come from the KV cache).
        dtype: parameter/activation dtype (``bf16``, ``fp16``, ``fp32``).
        attn_impl: ``sdpa`` (fused attention node) or ``eager`` (bmm + softmax + dropout).
            Models whose HF class has no SDPA path (gpt-oss, MPT) are traced with their eager
            attention swapped for the fused op.
        use_disk_cache: read/write pickles under ``cache_dir("traces")``.

    Raises:
        ConfigError: bad phase, dtype or attn_impl, or a model transformers cannot build.
    """
    spec = load_model(model)
    if phase not in PHASES:
        raise ConfigError(f"`phase` must be one of {list(PHASES)}, but got {phase!r}")
    if dtype not in DTYPES:
        raise ConfigError(f"`dtype` must be one of {list(DTYPES)}, but got {dtype!r}")
    if attn_impl not in ATTN_IMPLS:
        raise ConfigError(f"`attn_impl` must be one of {list(ATTN_IMPLS)}, but got "
                          f"{attn_impl!r}")
    key = _cache_key(spec, phase, dtype, attn_impl)
    hit = _MEMORY.get(key)
    if hit is None and use_disk_cache:
        hit = _load_disk(key)
        if hit is not None:
            _MEMORY[key] = hit
    if hit is None:
        with _LOCK:
            hit = _MEMORY.get(key)
            if hit is None:
                hit = _trace_uncached(spec, phase, dtype, attn_impl)
                _MEMORY[key] = hit
                if use_disk_cache:
                    _store_disk(key, hit)
    if hit.spec is not spec:
        hit = replace(hit, spec=spec)
    return hit


def _disk_path(key: str) -> Any:
    return cache_dir("traces") / f"{key}.pkl"


def _load_disk(key: str) -> TracedModel | None:
    path = _disk_path(key)
    if not path.is_file():
        return None
    try:
        with path.open("rb") as f:
            obj = pickle.load(f)
    except Exception:  # a corrupt or stale pickle is just a cache miss
        return None
    return obj if isinstance(obj, TracedModel) else None


def _store_disk(key: str, tm: TracedModel) -> None:
    path = _disk_path(key)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with tmp.open("wb") as f:
        pickle.dump(tm, f, protocol=pickle.HIGHEST_PROTOCOL)
    tmp.replace(path)


def _trace_uncached(spec: ModelSpec, phase: str, dtype: str, attn_impl: str,
                    *, num_points: int = 1) -> TracedModel:
    """Trace without caches. ``num_points=2`` traces twice at small primes and checks that
    every dim fits one monomial at both points (slower; used by tests to validate the default
    single-point factorisation)."""
    global TRACE_CALLS
    TRACE_CALLS += 1
    import torch

    from charon_search.catalog._hf import build_reduced_model
    from charon_search.frontend._assemble import assemble
    from charon_search.frontend._convert import Converter
    from charon_search.frontend._symbolic import trace_points
    from charon_search.frontend._trace import capture, fusable_eager_module

    fuse_eager = False
    try:
        rm = build_reduced_model(spec, attn_impl=attn_impl)
        used_impl = attn_impl
    except ConfigError:
        if attn_impl != "sdpa":
            raise
        # No SDPA path in HF (gpt-oss, MPT): trace eager with its attention swapped for the
        # fused op (``_trace._eager_swap``); a model with no known swap point stays eager.
        rm = build_reduced_model(spec, attn_impl="eager")
        fuse_eager = fusable_eager_module(rm.model) is not None
        used_impl = "sdpa" if fuse_eager else "eager"
    rm.model.to(getattr(torch, DTYPES[dtype]))
    points = trace_points(phase, num_points, spec.hf_config)
    try:
        caps = tuple(capture(rm, phase, b=p["b"], s=p["s"], c=p["c"], fuse_eager=fuse_eager)
                     for p in points)
    except CharonError:
        raise
    except Exception as e:  # torch / transformers failing on the model's own forward code
        raise ConfigError(f"model {spec.name!r} (model_type {spec.model_type!r}) cannot be "
                          f"traced for {phase}: {_trace_failure(e)}") from e
    conv = Converter(spec, phase, caps, points, rm.layers_path, rm.layer_type_of,
                     vocab_table_path=_input_embedding_path(rm.model))
    conv.run()
    names = ["embedding", *spec.block_types, "lm_head"]
    # Parameters per block: decoder layers count their module's parameters (some may not be
    # read by the traced graph, e.g. gpt-oss sinks under the fused attention); embedding and
    # LM head count the parameters their graphs read (a tied matrix only once).
    param_blocks = conv.param_blocks()
    layers = rm.model.get_submodule(rm.layers_path)
    for layer, t in zip(layers, rm.layer_type_of, strict=True):
        param_blocks[t] = sum(p.numel() for p in layer.parameters())
    blocks = assemble(conv, model_name=spec.name, dtype=dtype, block_names=names,
                      param_blocks=param_blocks)
    _check_token_mixers(spec, blocks, layers, rm.layer_type_of)
    return TracedModel(spec=spec, phase=phase, dtype=dtype, attn_impl=used_impl,
                       blocks=blocks)


#: Node kinds that mix tokens: a decoder layer traces at least one of them.
_MIXER_KINDS = frozenset({OpKind.ATTENTION, OpKind.LINEAR_ATTENTION})


def _mixes_tokens(node: Any) -> bool:
    """A fused (linear) attention node, or the softmax of an unfused (eager) attention."""
    return node.kind in _MIXER_KINDS or (node.kind == OpKind.SOFTMAX
                                         and node.role == Role.ATTN_CORE)


def _input_embedding_path(model: Any) -> str | None:
    """Module path of the model's input (vocabulary) embedding, None where the model does not
    say (``get_input_embeddings``)."""
    try:
        emb = model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    return next((name for name, m in model.named_modules() if m is emb), None)


def _check_token_mixers(spec: ModelSpec, blocks: dict[str, TracedBlock], layers: Any,
                        layer_type_of: tuple[str, ...]) -> None:
    """``ConfigError`` for a decoder layer whose trace holds no attention: its token mixer (a
    state-space or RWKV scan, a convolution...) is not one charon-search prices, and its
    layers would run as MLPs alone."""
    for layer, t in zip(layers, layer_type_of, strict=True):
        if not any(_mixes_tokens(n) for n in blocks[t].forward.nodes):
            parts = ", ".join(f"{name}: {type(m).__name__}" for name, m in layer.named_children())
            raise ConfigError(f"model {spec.name!r} (model_type {spec.model_type!r}): its "
                              f"{t!r} layers ({parts}) trace no attention op; their token "
                              f"mixer is not supported")


def _trace_failure(e: BaseException) -> str:
    """One line on why the model's forward could not be traced."""
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
    )

    if isinstance(e, (DynamicOutputShapeException, DataDependentOutputException)):
        return (f"its HF forward runs `{e}`, whose output shape depends on the data (a loop "
                f"over the experts a batch reaches, say), which fake-tensor tracing cannot "
                f"follow; unsupported")
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:300]}{' ...' if len(text) > 300 else ''}"
