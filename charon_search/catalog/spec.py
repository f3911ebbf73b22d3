"""ModelSpec: the architecture facts of one model, read from its HuggingFace ``config.json``.

The frontend traces the real HF model class from ``hf_config``; the typed fields below are what
passes, the memory model and reports need without re-reading the config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ModelSpec", "is_linear_block", "is_moe_block"]


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """One model architecture (no weights)."""

    name: str
    """Catalog name (``llama-3.1-70b``) or the path / module name it was loaded from."""
    hf_config: Mapping[str, Any]
    """The raw ``config.json`` content (plain builtins, picklable)."""
    model_type: str
    """HF ``model_type`` (``llama``, ``qwen3``, ``qwen3_moe``, ``deepseek_v3``, ``gpt2``...)."""
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    """Equal to ``num_attention_heads`` for multi-head attention; for MLA the query heads."""
    head_dim: int
    """Query/key head dimension (for MLA: qk_nope_head_dim + qk_rope_head_dim)."""
    intermediate_size: int
    """FFN hidden size of a dense MLP layer."""
    vocab_size: int
    tie_word_embeddings: bool = False
    gated_mlp: bool = True
    """SwiGLU-style gate+up projection (Llama) vs a plain 2-matrix MLP (GPT)."""
    attention: str = "gqa"
    """``mha``, ``gqa`` or ``mla``."""
    v_head_dim: int = 0
    """Value head dimension; 0 means ``head_dim``."""
    num_experts: int = 0
    """Routed experts per MoE layer; 0 for dense models."""
    num_experts_per_token: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    layer_types: tuple[str, ...] = ()
    """Block type of each decoder layer, e.g. ``("dense",) * 3 + ("moe",) * 58``; a
    linear-attention (Gated DeltaNet) layer's type ends in ``_linear`` (``moe_linear``)."""
    num_params: int = 0
    """Exact parameter count of the HF model class (counted on the meta device); 0 = unknown."""
    params_per_expert: int = 0
    """Parameters of one routed expert as transformers builds it, biases included (gpt-oss);
    0 = unknown (``num_active_params`` then takes ``3 x hidden x moe_intermediate_size``)."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Further facts (MLA ranks, sliding window...)."""

    @property
    def num_active_params(self) -> int:
        """Parameters one token uses: ``num_params`` less, in each MoE layer, the routed experts
        it is not sent to (``num_experts - num_experts_per_token`` of them, each
        ``params_per_expert``: its weights and biases); the input embedding table counts whole,
        as Mixtral's 12.9 B, Qwen3-30B-A3B's 3.3 B and DeepSeek-V3's 37 B do (the convention of
        ``num_active_params_excl_embedding`` is gpt-oss's). Equal to ``num_params`` for a dense
        model."""
        if not self.num_experts or not self.num_params:
            return self.num_params
        moe_layers = (sum(1 for t in self.layer_types if is_moe_block(t)) if self.layer_types
                      else self.num_layers)
        per_expert = self.params_per_expert or (
            (3 if self.gated_mlp else 2) * self.hidden_size * self.moe_intermediate_size)
        idle = self.num_experts - self.num_experts_per_token
        return self.num_params - moe_layers * idle * per_expert

    @property
    def num_active_params_excl_embedding(self) -> int:
        """``num_active_params`` without the input embedding table (``vocab x hidden``, unless
        tied to the LM head, which a token does multiply by): the parameters a token multiplies
        by, half its forward GEMM FLOPs. The gpt-oss model card's convention (OpenAI, "gpt-oss-120b
        & gpt-oss-20b Model Card", arXiv:2508.10925, Table 1: 5.13 B active of 116.83 B)."""
        if not self.num_params:
            return 0
        table = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        return self.num_active_params - table

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def block_types(self) -> tuple[str, ...]:
        """Distinct layer types in first-appearance order."""
        return tuple(dict.fromkeys(self.layer_types))

    def num_layers_of(self, block_type: str) -> int:
        return sum(1 for t in self.layer_types if t == block_type)

    @property
    def max_context(self) -> int:
        """Tokens a sequence may hold, prompt and output together (HF
        ``max_position_embeddings``, GPT-2's ``n_positions``); 0 when the config gives none.
        Serving engines derive their default ``max_model_len`` from it and reject longer
        requests."""
        return int(self.extra.get("max_position_embeddings") or 0)

    @property
    def sliding_window(self) -> int:
        """Keys a sliding-window attention layer sees (HF ``sliding_window``); 0 = none.

        Chunked local attention (Llama 4's ``attention_chunk_size``: a query attends the keys of
        its own chunk, ``position mod chunk + 1`` of them) is priced as a window of the chunk:
        exact while a sequence fits in one chunk, at most 2x the chunked work beyond (a window
        sees ``chunk`` keys, a chunked query ``chunk / 2`` on average)."""
        return int(self.extra.get("sliding_window") or self.extra.get("attention_chunk_size")
                   or 0)

    @property
    def sliding_layers(self) -> tuple[bool, ...]:
        """Per decoder layer: whether its attention uses the sliding window (HF per-layer
        ``layer_types`` ``sliding_attention`` / ``chunked_attention`` / ``full_attention``, kept
        by the catalog as ``extra["attention_layer_types"]``); ``()`` when the model has no
        window, or per-layer types of another length than its layers. A window without
        per-layer types (Mistral-7B-v0.1: HF Mistral windows every layer) applies to every
        layer."""
        kinds = tuple(self.extra.get("attention_layer_types") or ())
        if not self.sliding_window:
            return ()
        if not kinds:
            return (True,) * self.num_layers
        if len(kinds) != self.num_layers:
            return ()
        return tuple(str(k).startswith(("sliding", "chunked")) for k in kinds)

    @property
    def num_kv_layers(self) -> int:
        """Layers holding a KV cache: all but the linear-attention ones (``*_linear``)."""
        if not self.layer_types:
            return self.num_layers
        return sum(1 for t in self.layer_types if not is_linear_block(t))

    @property
    def windowed_kv_layers(self) -> int:
        """KV layers whose attention is windowed (``sliding_layers``): they need at most
        ``sliding_window`` keys of a sequence, the others (``num_kv_layers`` minus these)
        all of them."""
        flags = self.sliding_layers
        types = self.layer_types or ("",) * len(flags)
        return sum(1 for f, t in zip(flags, types, strict=False) if f and not is_linear_block(t))


def is_moe_block(block_type: str) -> bool:
    """``moe`` and ``moe_linear`` blocks route tokens to experts."""
    return block_type == "moe" or block_type.startswith("moe_")


def is_linear_block(block_type: str) -> bool:
    """Blocks whose token mixer is linear attention (Gated DeltaNet): ``*_linear``."""
    return block_type.endswith("_linear")
