"""Run the HF model on FakeTensors under AOT autograd and capture ATen fx graphs.

One ``capture`` call traces the reduced model (embedding + one decoder layer per layer type +
final norm/LM head[/loss]) at one concrete ``(b, s, c)``; ``_convert`` matches two captures at
different points to recover every dimension as a polynomial in ``b``, ``s``, ``c``.

Training uses ``aot_function`` with ``default_partition``, so the forward/backward split and the
saved activations are exactly what eager autograd keeps. Prefill and decode are forward-only
``make_fx`` traces (``aot_function`` without grads gives the same inference graph).

Decode: the KV cache holds ``c - 1`` past tokens as fake tensors passed in as graph inputs; HF's
``DynamicCache.update`` concatenates the new token's K/V (``_convert`` re-costs that ``cat`` as an
in-place append of one token, as a paged KV cache does), and attention runs over ``c`` keys.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from charon_search.catalog._hf import ReducedModel
from charon_search.errors import ConfigError
from charon_search.frontend._dsa import dsa_patches
from charon_search.frontend._linear_attn import linear_attention_patches
from charon_search.frontend._llama4 import llama4_patches
from charon_search.frontend._mla import absorbed_mla_decode

__all__ = ["Capture", "capture"]

#: fx node meta key we fill with the module stack (same layout as dynamo's).
NN_MODULE_STACK = "nn_module_stack"


@dataclass
class Capture:
    """fx graphs of one trace plus what is needed to interpret their placeholders."""

    fw: Any
    """Forward ``torch.fx.GraphModule`` (training: AOT's partitioned forward)."""
    bw: Any | None
    """Backward ``GraphModule`` (training only)."""
    param_names: tuple[str, ...]
    """Parameter name of each of the first ``len(param_names)`` primals."""
    num_buffers: int
    past_kv_primals: tuple[int, ...] = ()
    """Primal indices of the past K/V cache tensors (decode)."""
    module_class: dict[str, str] = field(default_factory=dict)
    """Module path -> class name."""


@contextlib.contextmanager
def _module_stack_hooks(model: Any) -> Iterator[dict[str, str]]:
    """Record the module stack into fx node meta (aot_function does not, unlike dynamo)."""
    import torch.fx.traceback as fxt

    classes: dict[str, str] = {}
    handles = []

    def make(path: str, cls: str) -> tuple[Any, Any]:
        def pre(mod: Any, args: Any) -> None:
            meta = fxt.current_meta
            stack = dict(meta.get(NN_MODULE_STACK) or {})
            stack[path] = (path, cls)
            meta[NN_MODULE_STACK] = stack

        def post(mod: Any, args: Any, out: Any) -> None:
            meta = fxt.current_meta
            stack = dict(meta.get(NN_MODULE_STACK) or {})
            stack.pop(path, None)
            meta[NN_MODULE_STACK] = stack

        return pre, post

    for path, mod in model.named_modules():
        if not path:
            continue
        cls = type(mod).__name__
        classes[path] = cls
        pre, post = make(path, cls)
        handles.append(mod.register_forward_pre_hook(pre))
        handles.append(mod.register_forward_hook(post, always_call=True))
    try:
        yield classes
    finally:
        for h in handles:
            h.remove()


def _fused_sdpa(query: Any, key: Any, value: Any, attn_mask: Any = None,
                dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                enable_gqa: bool = False) -> Any:
    """``F.scaled_dot_product_attention`` that always lowers to ONE fused attention op.

    On CPU, torch picks the decomposed "math" path (bmm + softmax) whenever the CPU flash kernel
    does not apply (dropout, MLA's d_v != d_qk...). A GPU runs a fused kernel in those cases, so
    for tracing we call the fused op directly: CPU flash (supports GQA, masks, dropout) or, when
    the value head dim differs, memory-efficient attention (the one with d_v != d_qk support).

    A mask over more than one query is the causal mask of the traced causal LM (HF builds one
    whenever it cannot rely on ``is_causal``: Falcon always, a sliding window, GLM-5's training
    path), so it runs as the kernels' causal mode: ``is_causal`` set, no ``s x c`` mask read.
    Sliding windows and chunks are priced downstream (``ModelSpec.sliding_window``).
    """
    import torch

    aten = torch.ops.aten
    if attn_mask is not None and query.shape[-2] > 1:
        attn_mask, is_causal = None, True
    if value.shape[-1] == query.shape[-1]:
        return aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]
    if key.shape[-3] != query.shape[-3]:
        rep = query.shape[-3] // key.shape[-3]
        key = key.repeat_interleave(rep, dim=-3)
        value = value.repeat_interleave(rep, dim=-3)
    return aten._scaled_dot_product_efficient_attention(
        query, key, value, attn_mask, True, dropout_p, is_causal, scale=scale)[0]


def _fused_eager_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                           scaling: float, dropout: float = 0.0, **kwargs: Any) -> Any:
    """HF ``eager_attention_forward`` replacement: one fused attention op (see ``_fused_sdpa``).

    Used for models whose HF class has no SDPA path (gpt-oss, because of its attention sinks).
    NB: gpt-oss's per-head sink logit (one extra softmax column) is not modelled.
    """
    mask = attention_mask
    if mask is not None:
        mask = mask[:, :, :, : key.shape[-2]]
    out = _fused_sdpa(query, key, value, attn_mask=mask,
                      dropout_p=dropout if module.training else 0.0,
                      is_causal=query.shape[-2] > 1, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def _fused_mpt_attention(self: Any, hidden_states: Any, position_bias: Any, cache: Any = None,
                         attention_mask: Any = None, **kwargs: Any) -> Any:
    """HF ``MptAttention.forward`` with its core as one fused attention op.

    MPT's HF code has only the eager path (``Q K^T`` + ALiBi bias + mask, softmax, dropout,
    ``P V``), while llm-foundry ran a fused kernel (``attn_impl: triton`` / ``flash``), which
    adds the ALiBi bias inside the kernel from per-head slopes (FlashAttention-2
    ``alibi_slopes``; the Triton kernel's ``(1, heads, 1, s)`` key bias) and so keeps no
    ``s x c`` matrix. The projections, ``clip_qkv`` and the cache update are HF's own.
    """
    batch, seq = hidden_states.shape[:2]
    qkv = self.Wqkv(hidden_states)
    if self.clip_qkv:
        qkv = qkv.clamp(min=-self.clip_qkv, max=self.clip_qkv)
    q, k, v = (t.reshape(batch, seq, self.n_heads, self.head_dim).transpose(1, 2)
               for t in qkv.chunk(3, dim=2))
    if cache is not None:
        k, v = cache.update(k, v, self.layer_idx, kwargs=kwargs)
    out = _fused_sdpa(q, k, v, dropout_p=self.attn_dropout_p if self.training else 0.0,
                      is_causal=seq > 1, scale=self.softmax_scale)
    out = out.permute(0, 2, 1, 3).contiguous().view(batch, seq, -1)
    return self.out_proj(out), None


def _eager_swap(model: Any) -> tuple[Any, str, Any] | None:
    """``(owner, attribute, replacement)`` that turns ``model``'s eager attention into one fused
    op, if HF gives a place to do it: the modeling module's ``eager_attention_forward`` (gpt-oss
    and other models without an SDPA path) or, for MPT, its attention class's ``forward``."""
    import sys

    module = sys.modules.get(type(model).__module__)
    if module is None:
        return None
    if hasattr(module, "eager_attention_forward"):
        return module, "eager_attention_forward", _fused_eager_attention
    if hasattr(module, "MptAttention"):
        return module.MptAttention, "forward", _fused_mpt_attention
    return None


def fusable_eager_module(model: Any) -> Any | None:
    """The object whose eager attention ``capture(fuse_eager=True)`` swaps for one fused op
    (``None``: the model's eager attention stays as traced)."""
    swap = _eager_swap(model)
    return None if swap is None else swap[0]


@contextlib.contextmanager
def _fuse_eager(model: Any, enabled: bool) -> Iterator[None]:
    swap = _eager_swap(model) if enabled else None
    if swap is None:
        yield
        return
    owner, attr, replacement = swap
    saved = getattr(owner, attr)
    setattr(owner, attr, replacement)
    try:
        yield
    finally:
        setattr(owner, attr, saved)


@contextlib.contextmanager
def _hf_patches() -> Iterator[None]:
    """Neutralise data-dependent checks HF runs on plain tensors (they would read fake data),
    route SDPA to one fused op (``_fused_sdpa``), Gated DeltaNet layers to their two kernels
    (``_linear_attn``), DeepSeek Sparse Attention to its indexer and sparse MLA (``_dsa``) and
    Llama 4's dense-over-all-experts MoE to grouped GEMMs over the routed rows (``_llama4``)."""
    import torch.nn.functional as F
    import transformers.integrations.sdpa_attention as hf_sdpa
    import transformers.masking_utils as mu

    saved = (mu.find_packed_sequence_indices, F.scaled_dot_product_attention,
             hf_sdpa.use_gqa_in_sdpa)
    mu.find_packed_sequence_indices = lambda *a, **k: None
    F.scaled_dot_product_attention = _fused_sdpa
    # GQA/MQA K/V heads go to the kernel as they are, as GPU kernels take them: with a mask HF
    # would otherwise repeat them to the query heads (copies, an MHA node) or, for one query,
    # fold the query heads into the query length (a "prefill" of n_rep queries).
    hf_sdpa.use_gqa_in_sdpa = lambda *a, **k: True
    try:
        with linear_attention_patches(), dsa_patches(), llama4_patches():
            yield
    finally:
        (mu.find_packed_sequence_indices, F.scaled_dot_product_attention,
         hf_sdpa.use_gqa_in_sdpa) = saved


def capture(rm: ReducedModel, phase: str, *, b: int, s: int, c: int,
            fuse_eager: bool = False) -> Capture:
    """Trace ``rm`` for ``phase`` at one concrete point and return its fx graphs.

    ``fuse_eager`` swaps HF's eager attention for one fused attention op (models without SDPA).
    """
    import torch
    from torch._functorch.aot_autograd import aot_function
    from torch._functorch.partitioners import default_partition
    from torch._subclasses.fake_tensor import FakeTensorMode

    model = rm.model
    model.train(phase == "train")
    named_params = [(n, p) for n, p in model.named_parameters()]
    named_bufs = [(n, t) for n, t in model.named_buffers()]
    vocab = int(model.config.get_text_config().vocab_size)
    fake = FakeTensorMode(allow_non_fake_inputs=False)
    graphs: dict[str, Any] = {}

    def fw_compiler(gm: Any, example_inputs: Any) -> Any:
        graphs["fw"] = gm
        return gm

    def bw_compiler(gm: Any, example_inputs: Any) -> Any:
        graphs["bw"] = gm
        return gm

    pnames = tuple(n for n, _ in named_params)
    bnames = tuple(n for n, _ in named_bufs)

    with fake:
        params = [
            torch.empty(p.shape, dtype=p.dtype, device="cpu", requires_grad=phase == "train")
            for _, p in named_params
        ]
        bufs = [torch.empty(t.shape, dtype=t.dtype, device="cpu") for _, t in named_bufs]
        q_len = 1 if phase == "decode" else s
        ids = torch.randint(0, vocab, (b, q_len))
        past: list[Any] = []
        if phase == "decode":
            past = _past_kv(model, params, bufs, pnames, bnames, b=b, past_len=c - 1)

    n_past = len(past)

    def run(*flat: Any) -> Any:
        p = dict(zip(pnames, flat[: len(pnames)], strict=True))
        p.update(zip(bnames, flat[len(pnames): len(pnames) + len(bnames)], strict=True))
        rest = flat[len(pnames) + len(bnames):]
        input_ids = rest[0]
        if phase == "train":
            out = torch.func.functional_call(
                model, p, (input_ids,), {"labels": rest[1], "use_cache": False}
            )
            return out.loss
        if phase == "prefill":
            out = torch.func.functional_call(
                model, p, (input_ids,), {"use_cache": False, "logits_to_keep": 1}
            )
            return out.logits
        cache = _cache_from(model, rest[2: 2 + n_past])
        out = torch.func.functional_call(
            model, p, (input_ids,), {"cache": cache, "use_cache": True, "logits_to_keep": 1}
        )
        return out.logits

    compiled = aot_function(
        run, fw_compiler=fw_compiler, bw_compiler=bw_compiler, partition_fn=default_partition
    )
    import warnings

    import torch.fx.traceback as fxt

    with fxt.preserve_node_meta(), _module_stack_hooks(model) as classes, _hf_patches(), \
            _fuse_eager(model, fuse_eager), absorbed_mla_decode(model, phase == "decode"), \
            fake, warnings.catch_warnings():
        # Our compilers only record graphs; AOT's "boxed arguments" advice does not apply.
        warnings.filterwarnings("ignore", message=".*boxed arguments.*")
        if phase == "train":
            loss = compiled(*params, *bufs, ids, ids)
            loss.backward()
        else:
            from torch.fx.experimental.proxy_tensor import make_fx

            # Inference: one make_fx pass (AOT would add a metadata pass for nothing).
            with torch.no_grad():
                graphs["fw"] = make_fx(run)(*params, *bufs, ids, ids, *past)
    if "fw" not in graphs:
        raise ConfigError("tracing produced no forward graph")
    first_past = len(pnames) + len(bnames) + 2
    return Capture(
        fw=graphs["fw"], bw=graphs.get("bw"), param_names=pnames, num_buffers=len(bnames),
        past_kv_primals=tuple(range(first_past, first_past + n_past)), module_class=classes,
    )


def _past_kv(model: Any, params: list[Any], bufs: list[Any], pnames: tuple[str, ...],
             bnames: tuple[str, ...], *, b: int, past_len: int) -> list[Any]:
    """Fake K/V tensors of ``past_len`` tokens per layer, shaped as the model's own cache."""
    import torch

    p = dict(zip(pnames, params, strict=True))
    p.update(zip(bnames, bufs, strict=True))
    with torch.no_grad(), _hf_patches(), absorbed_mla_decode(model, True):
        probe = torch.zeros((b, 2), dtype=torch.long)
        out = torch.func.functional_call(model, p, (probe,), {"use_cache": True,
                                                                "logits_to_keep": 1})
    cache = out.get("cache") if isinstance(out, dict) else None
    if cache is None:
        cache = out.past_key_values
    past: list[Any] = []
    for layer in cache.layers:
        if not _is_kv_layer(layer):
            continue  # linear attention: its state is made inside the traced layer
        for t in _cached_tensors(layer):
            shape = list(t.shape)
            shape[-2] = past_len
            past.append(torch.empty(shape, dtype=t.dtype, device="cpu"))
    return past


def _cached_tensors(layer: Any) -> tuple[Any, ...]:
    """A KV layer's per-token cache tensors (tokens on dim -2): keys, values and, for DeepSeek
    Sparse Attention (``DynamicIndexedLayer``), the indexer keys ``[b, tokens, d]``."""
    extra = getattr(layer, "indexer_keys", None)
    return (layer.keys, layer.values) + (() if extra is None else (extra,))


def _is_kv_layer(layer: Any) -> bool:
    """A cache layer holding keys and values (not a linear-attention state layer)."""
    from transformers.cache_utils import LinearAttentionCacheLayerMixin

    return not isinstance(layer, LinearAttentionCacheLayerMixin)


def _cache_from(model: Any, past: tuple[Any, ...]) -> Any:
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    layer: Any
    kv_layers = [layer for layer in cache.layers if _is_kv_layer(layer)]
    rest = list(past)
    for layer in kv_layers:
        k, v = rest.pop(0), rest.pop(0)
        layer.keys, layer.values = k, v
        if hasattr(layer, "update_indexer"):  # DSA: the indexer key cache follows K and V
            layer.indexer_keys = rest.pop(0)
            layer.is_indexer_initialized = True
            layer.indexer_dtype, layer.indexer_device = k.dtype, k.device
        layer.is_initialized = True
        layer.device = k.device
        layer.dtype = k.dtype
        if hasattr(layer, "cumulative_length"):
            layer.cumulative_length = k.shape[-2]
    return cache
