"""DeepSeek Sparse Attention (DSA: GLM-5 ``glm_moe_dsa``) traced as the kernels engines run.

GLM-5 (transformers ``GlmMoeDsaAttention``) is MLA attention whose queries each attend only
``index_topk`` (2048) past tokens, picked by a "lightning indexer" (DeepSeek-V3.2-Exp technical
report, sec. 2.1, DeepSeek Sparse Attention). HF's eager/SDPA path scatters the top-k indices
into an ``s x c`` boolean mask and runs dense attention over all ``c`` keys with it, so a trace
would price dense attention plus an ``s x c`` mask. Serving engines (SGLang
``--attention-backend nsa``: ``python/sglang/srt/layers/attention/nsa_backend.py`` and
``nsa/nsa_indexer.py``) run:

* the indexer: replicated (not TP-sharded) projections ``wq_b`` / ``wk`` / ``weights_proj``
  (``ReplicatedLinear`` in ``nsa_indexer.py``), a LayerNorm'd one-head key cached per token,
  then the fp8 logits kernel over every cached key (DeepGEMM ``fp8_mqa_logits`` in prefill,
  ``fp8_paged_mqa_logits`` in decode: ``sum_h w_h relu(q_h . k)``, ``2 x index_n_heads x
  index_head_dim`` FLOPs per (query, key) pair) and a top-k (``fast_topk_transform_fused``);
* the sparse MLA kernel (FlashMLA ``flash_mla_sparse_fwd``, FlashMLA README "sparse
  attention"): absorbed MLA (one 576-wide latent KV head, value = its first 512 columns, as
  ``frontend._mla``) over the ``min(kv_len, index_topk)`` selected keys of each query.

``dsa_patches`` swaps the attention and indexer modules' ``forward`` (inference only: training
keeps HF's code) for ones that run HF's projections, norms and RoPE around two ``charon::``
custom ops: ``dsa_indexer`` (one ``SPARSE_INDEXER`` node, logits + top-k, role
``attn.indexer``) and ``sparse_mla`` (one ``ATTENTION`` node with a ``topk`` param,
``ir.ops.SPARSE_TOPK_PARAM``: its FLOPs and bytes are linear in ``c`` and evaluated at
``min(c, topk)``, ``Node.attended_c``). Prefill and decode both use the absorbed form
(FlashMLA's sparse kernels take the absorbed query in both). Decode appends the token's latent
and indexer key to their caches. Layers whose ``indexer_types`` entry is ``"shared"`` reuse the
previous layer's indices and trace no indexer node.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from charon_search.frontend._patching import swapped_forwards

__all__ = ["DSA_MODULES", "dsa_patches", "is_dsa_attention", "register_ops"]

#: transformers modules whose sparse-attention and indexer classes are swapped (module,
#: attention class, indexer class).
DSA_MODULES = (
    ("transformers.models.glm_moe_dsa.modeling_glm_moe_dsa", "GlmMoeDsaAttention",
     "GlmMoeDsaIndexer"),
)

_REGISTERED = False


def register_ops() -> None:
    """Define the ``charon::`` DSA ops (once per process), fake (meta) kernels only."""
    global _REGISTERED
    if _REGISTERED:
        return
    import torch
    from torch import Tensor

    @torch.library.custom_op("charon::dsa_indexer", mutates_args=(), schema=(
        "(Tensor q, Tensor k, Tensor weights, int topk) -> Tensor"))
    def dsa_indexer(q: Tensor, k: Tensor, weights: Tensor, topk: int) -> Tensor:
        raise NotImplementedError("charon::dsa_indexer is a tracing stand-in")

    @dsa_indexer.register_fake
    def _(q: Tensor, k: Tensor, weights: Tensor, topk: int) -> Tensor:
        b, s = q.shape[0], q.shape[1]
        return q.new_empty((b, s, topk), dtype=torch.int32)

    @torch.library.custom_op("charon::sparse_mla", mutates_args=(), schema=(
        "(Tensor q, Tensor kv, Tensor indices, float scale, int v_head_dim) -> Tensor"))
    def sparse_mla(q: Tensor, kv: Tensor, indices: Tensor, scale: float,
                   v_head_dim: int) -> Tensor:
        raise NotImplementedError("charon::sparse_mla is a tracing stand-in")

    @sparse_mla.register_fake
    def _(q: Tensor, kv: Tensor, indices: Tensor, scale: float, v_head_dim: int) -> Tensor:
        return q.new_empty((*q.shape[:-1], v_head_dim))

    _REGISTERED = True


def is_dsa_attention(module: Any) -> bool:
    """An MLA attention module with a DSA indexer slot (``indexer`` may be None: shared)."""
    return hasattr(module, "indexer") and hasattr(module, "kv_b_proj")


def _indexer_forward(idx: Any, hidden_states: Any, q_resid: Any, position_embeddings: Any,
                     attention_mask: Any = None, position_ids: Any = None, cache: Any = None
                     ) -> Any:
    """HF ``GlmMoeDsaIndexer.forward`` with its scores and top-k as one ``charon`` op (called
    as the module, so its ops trace under ``self_attn.indexer``: role ``attn.indexer``)."""
    if idx.training:
        return _HF_FORWARD[type(idx)](idx, hidden_states, q_resid, position_embeddings,
                                      attention_mask, position_ids, cache=cache)
    import torch

    hf = sys.modules[type(idx).__module__]
    cos, sin = position_embeddings
    layer_idx = idx.layer_idx
    b, sl = hidden_states.shape[:-1]
    rope = idx.qk_rope_head_dim
    q = idx.wq_b(q_resid).view(b, sl, idx.n_heads, idx.head_dim)
    q_rot, q_pass = torch.split(q, [rope, idx.head_dim - rope], dim=-1)
    k = idx.k_norm(idx.wk(hidden_states)).unsqueeze(2)
    k_rot, k_pass = torch.split(k, [rope, idx.head_dim - rope], dim=-1)
    q_rot, k_rot = hf.apply_rotary_pos_emb_interleave(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
    q = torch.cat([q_rot, q_pass], dim=-1)
    k = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)  # [b, sl, d]: the indexer key cache entry
    if cache is not None:
        k = cache.update_indexer(k, layer_idx)
    weights = idx.weights_proj(hidden_states)  # [b, sl, heads]
    return torch.ops.charon.dsa_indexer(q, k, weights, idx.index_topk)


def _dsa_forward(self: Any, hidden_states: Any, position_embeddings: Any,
                 attention_mask: Any = None, cache: Any = None, position_ids: Any = None,
                 prev_topk_indices: Any = None, **kwargs: Any) -> Any:
    """``GlmMoeDsaAttention.forward`` as the engines' indexer + absorbed sparse MLA."""
    if self.training:
        return _HF_FORWARD[type(self)](self, hidden_states, position_embeddings,
                                       attention_mask, cache, position_ids,
                                       prev_topk_indices, **kwargs)
    import torch

    hf = sys.modules[type(self).__module__]
    b, sl = hidden_states.shape[:-1]
    nope, rope, rank = self.qk_nope_head_dim, self.qk_rope_head_dim, self.kv_lora_rank
    q_resid = self.q_a_layernorm(self.q_a_proj(hidden_states))
    q = self.q_b_proj(q_resid).view(b, sl, -1, nope + rope).transpose(1, 2)
    q_pass, q_rot = torch.split(q, [nope, rope], dim=-1)
    kv_nope, k_rot = torch.split(self.kv_a_proj_with_mqa(hidden_states), [rank, rope], dim=-1)
    kv_nope = self.kv_a_layernorm(kv_nope).view(b, 1, sl, rank)
    k_rot = k_rot.view(b, 1, sl, rope)
    cos, sin = position_embeddings
    q_rot, k_rot = hf.apply_rotary_pos_emb_interleave(q_rot, k_rot, cos, sin)
    latent = torch.cat((kv_nope, k_rot), dim=-1)  # [b, 1, sl, rank + rope]: the cache entry
    if cache is not None:
        latent, _ = cache.update(latent, latent[..., :0], self.layer_idx, kwargs=kwargs)
    if self.indexer is not None:
        topk = self.indexer(hidden_states, q_resid, position_embeddings, cache=cache)
    elif prev_topk_indices is not None:
        topk = prev_topk_indices
    else:
        raise ValueError("a shared DSA layer needs the top-k indices of a previous layer")
    h = self.num_heads
    w = self.kv_b_proj.weight.view(h, nope + self.v_head_dim, rank)
    w_uk, w_uv = w[:, :nope], w[:, nope:]
    q_lat = torch.bmm(q_pass.transpose(0, 1).reshape(h, b * sl, nope), w_uk)
    query = torch.cat((q_lat.view(h, b, sl, rank).transpose(0, 1), q_rot), dim=-1)
    out = torch.ops.charon.sparse_mla(query, latent, topk, float(self.scaling), rank)
    out = torch.bmm(out.transpose(0, 1).reshape(h, b * sl, rank), w_uv.transpose(1, 2))
    out = out.view(h, b, sl, self.v_head_dim).permute(1, 2, 0, 3).reshape(b, sl, -1)
    return self.o_proj(out), None, topk


_HF_FORWARD: dict[type, Any] = {}


def dsa_patches() -> contextlib.AbstractContextManager[None]:
    """Swap every known DSA attention ``forward`` for ``_dsa_forward`` (see the module doc)."""
    register_ops()
    swaps: list[tuple[type, Any]] = []
    for mod_name, attn_name, indexer_name in DSA_MODULES:
        mod = sys.modules.get(mod_name)
        if mod is None:
            continue
        for cls, fwd in ((getattr(mod, attn_name), _dsa_forward),
                         (getattr(mod, indexer_name), _indexer_forward)):
            _HF_FORWARD[cls] = cls.forward
            swaps.append((cls, fwd))
    return swapped_forwards(swaps)
