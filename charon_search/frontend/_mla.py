"""Absorbed multi-head latent attention (MLA) for decode tracing.

HF's DeepSeek-V3 attention caches the compressed latent but, at every decode step, re-expands
all ``c`` cached tokens through ``kv_b_proj`` and runs 128-head attention over them. Serving
engines (FlashMLA, vLLM, SGLang) instead absorb ``kv_b_proj`` into the query and the output
(DeepSeek-V2 paper, arXiv:2405.04434, section 2.1.2): attention runs directly on the latent
cache as multi-query attention with head dim ``kv_lora_rank + qk_rope_head_dim`` (576) and
value dim ``kv_lora_rank`` (512). For decode we trace that formulation:

    q_lat = q_nope @ W_UK            (bgemm over heads: [b, h, 1, 128] x [h, 128, 512])
    out   = MQA(cat(q_lat, q_rope), latent_cache[576])  (one fused node, 1 KV head)
    o     = out @ W_UV^T             (bgemm over heads) -> o_proj

The latent and its RoPE part are cached as one 576-wide tensor per token (as FlashMLA does), so
the per-step cache write is one token. Prefill and training keep HF's (non-absorbed) code.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from charon_search.frontend._dsa import is_dsa_attention

__all__ = ["absorbed_mla_decode"]


def _absorbed_forward(self: Any, hidden_states: Any, position_embeddings: Any,
                      attention_mask: Any = None, cache: Any = None, **kwargs: Any) -> Any:
    import torch

    hf = sys.modules[type(self).__module__]
    b, sl = hidden_states.shape[:-1]
    nope, rope, rank = self.qk_nope_head_dim, self.qk_rope_head_dim, self.kv_lora_rank
    if self.q_lora_rank is None:
        q = self.q_proj(hidden_states)
    else:
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)))
    q = q.view(b, sl, -1, nope + rope).transpose(1, 2)
    q_pass, q_rot = torch.split(q, [nope, rope], dim=-1)
    compressed = self.kv_a_proj_with_mqa(hidden_states)
    kv_nope, k_rot = torch.split(compressed, [rank, rope], dim=-1)
    kv_nope = self.kv_a_layernorm(kv_nope).view(b, 1, sl, rank)
    k_rot = k_rot.view(b, 1, sl, rope)
    q_rot, k_rot = _rotate(self, hf, q_rot, k_rot, position_embeddings)
    latent = torch.cat((kv_nope, k_rot), dim=-1)  # [b, 1, sl, rank + rope]: the cache entry
    if cache is not None:
        latent, _ = cache.update(latent, latent[..., :0], self.layer_idx, kwargs=kwargs)
    h = self.num_heads
    w = self.kv_b_proj.weight.view(h, nope + self.v_head_dim, rank)
    w_uk, w_uv = w[:, :nope], w[:, nope:]
    # Per-head absorption as bmm over heads (no broadcast copy of the weights).
    q_lat = torch.bmm(q_pass.transpose(0, 1).reshape(h, b * sl, nope), w_uk)
    q_lat = q_lat.view(h, b, sl, rank).transpose(0, 1)  # [b, h, sl, rank]
    query = torch.cat((q_lat, q_rot), dim=-1)
    mask = attention_mask[:, :, :, : latent.shape[-2]] if attention_mask is not None else None
    # One MQA kernel over the 576-wide latent cache (values = its first 512 columns). The CPU
    # flash op's meta needs d_v = d_qk, so V is passed 576 wide and the output sliced: FLOPs
    # count 2·b·h·c·(576 + 576), 6 % above FlashMLA's (576 + 512). The latent, K and V at
    # once, is read once (``_convert``: a fused kernel's repeated input), as FlashMLA does.
    out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, latent, latent, 0.0, bool(sl > 1 and mask is None), attn_mask=mask,
        scale=self.scaling)[0][..., :rank]
    out = torch.bmm(out.transpose(0, 1).reshape(h, b * sl, rank), w_uv.transpose(1, 2))
    out = out.view(h, b, sl, self.v_head_dim).permute(1, 2, 0, 3).reshape(b, sl, -1)
    return self.o_proj(out), None


def _rotate(attn: Any, hf: Any, q_rot: Any, k_rot: Any, position_embeddings: Any
            ) -> tuple[Any, Any]:
    """RoPE on the query and key rotary parts as the module's own HF code applies it:
    DeepSeek-V2 (``deepseek_v2``: V2, V2-Lite, V2.5, Coder-V2) passes one complex ``freqs_cis``
    tensor to ``apply_rotary_emb``; DeepSeek-V3 and Kimi pass ``(cos, sin)`` to
    ``apply_rotary_pos_emb`` (``_interleave`` with ``rope_interleave``)."""
    if not isinstance(position_embeddings, (tuple, list)):
        return hf.apply_rotary_emb(q_rot, k_rot, position_embeddings.to(q_rot.device))
    cos, sin = position_embeddings
    if getattr(attn.config, "rope_interleave", False):
        return hf.apply_rotary_pos_emb_interleave(q_rot, k_rot, cos, sin)
    return hf.apply_rotary_pos_emb(q_rot, k_rot, cos, sin)


def _mla_classes(model: Any) -> list[Any]:
    """Dense MLA attention classes (DSA ones are traced by ``frontend._dsa``)."""
    classes: list[Any] = []
    for mod in model.modules():
        if hasattr(mod, "kv_b_proj") and hasattr(mod, "kv_a_proj_with_mqa") and hasattr(
            mod, "kv_lora_rank"
        ) and not is_dsa_attention(mod) and type(mod) not in classes:
            classes.append(type(mod))
    return classes


@contextlib.contextmanager
def absorbed_mla_decode(model: Any, enabled: bool) -> Iterator[None]:
    """Swap MLA attention modules' forward for the absorbed formulation while tracing."""
    classes = _mla_classes(model) if enabled else []
    saved = [(cls, cls.forward) for cls in classes]
    for cls in classes:
        cls.forward = _absorbed_forward
    try:
        yield
    finally:
        for cls, fwd in saved:
            cls.forward = fwd
