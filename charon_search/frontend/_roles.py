"""Block and role assignment from HF module paths (architecture-neutral ``ir.Role``).

Forward ops get a role from their module path and their position inside the attention / MLP /
MoE module; backward ops inherit the role of the forward op they differentiate (matched by
autograd ``seq_nr``).
"""

from __future__ import annotations

from charon_search.catalog.spec import ModelSpec, is_moe_block
from charon_search.ir import OpKind, Role

__all__ = ["RoleTracker", "block_of_path"]

_ATTN = ("self_attn", "attn", "attention", "self_attention", "linear_attn")
_QKV = ("q_proj", "k_proj", "v_proj", "qkv_proj", "c_attn", "query_key_value", "q_a_proj",
        "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "wq", "wk", "wv", "q_a_layernorm",
        "kv_a_layernorm", "wqkv", "Wqkv",
        # Gated DeltaNet input projections (Qwen3.5; Qwen3-Next fuses them as qkvz / ba).
        "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "in_proj_qkvz", "in_proj_ba")
_OUT = ("o_proj", "c_proj", "dense", "out_proj", "wo", "resid_dropout")
_QK_NORM = ("q_norm", "k_norm")
_MLP = ("mlp", "feed_forward", "block_sparse_moe", "ffn", "moe")
_MLP_IN = ("gate_proj", "up_proj", "c_fc", "w1", "w3", "fc1", "gate_up_proj",
           "dense_h_to_4h")
_MLP_OUT = ("down_proj", "c_proj", "w2", "fc2", "dense_4h_to_h", "dropout")
_ROUTER = ("gate", "router")
_ROPE_OPS = ("mul", "add", "neg", "cat", "sub", "stack")


def block_of_path(path: str, layers_path: str, layer_type_of: tuple[str, ...]
                  ) -> tuple[str | None, str]:
    """(block name, module path inside the block) of an fx node's innermost module path.

    Returns ``(None, path)`` for modules outside the decoder layers (embedding / head side is
    decided by position).
    """
    prefix = layers_path + "."
    if path.startswith(prefix):
        rest = path[len(prefix):]
        idx, _, local = rest.partition(".")
        return layer_type_of[int(idx)], local
    return None, path


class RoleTracker:
    """Assigns roles to forward ops in graph order (keeps per-block position state)."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self._state: dict[str, dict[str, int]] = {}
        self._head_seen = False

    def role(self, block: str, local: str, cls: str, kind: OpKind | None, base: str) -> str:
        if block == "embedding":
            return Role.EMBED.value
        if block == "lm_head":
            return self._head_role(local, cls, kind)
        st = self._state.setdefault(block, {"attn": 0, "core": 0, "mlp_out": 0, "grouped": 0,
                                            "experts": 0})
        parts = local.split(".") if local else []
        top = parts[0] if parts else ""
        sub = parts[1] if len(parts) > 1 else ""
        if not parts:
            # Layer-level ops: the activation of layer-level MLP linears (OPT's fc1 -> relu ->
            # fc2), else residual adds / dropouts.
            if st.get("mlp_in") and not st["mlp_out"] and kind is not None:
                return Role.MLP_ACT.value
            return Role.RESIDUAL.value
        if "Norm" in cls and len(parts) == 1:
            return Role.ATTN_NORM.value if not st["attn"] else Role.MLP_NORM.value
        if top in _ATTN:
            st["attn"] = 1
            if sub == "indexer":  # DSA lightning indexer (frontend._dsa)
                return Role.ATTN_INDEXER.value
            if sub in _QK_NORM:
                return Role.ATTN_QK_NORM.value
            if sub in _QKV:
                return Role.ATTN_QKV.value
            if sub in _OUT:
                return Role.ATTN_OUT.value
            if sub == "rotary_emb":
                return Role.ATTN_ROPE.value
            if kind in (OpKind.ATTENTION, OpKind.BATCHED_GEMM, OpKind.SOFTMAX,
                        OpKind.LINEAR_ATTENTION):
                st["core"] = 1
                return Role.ATTN_CORE.value
            if not st["core"] and (base in _ROPE_OPS or base == "slice"):
                return Role.ATTN_ROPE.value
            return Role.ATTN_CORE.value
        if "dropout" in top:
            # Layer-level dropouts named after their branch (MPT resid_attn_dropout...).
            if "attn" in top:
                return Role.ATTN_OUT.value
            if "ffn" in top or "mlp" in top:
                return Role.MLP_OUT.value
            return Role.RESIDUAL.value
        if top in ("activation_fn", "act", "activation"):
            return Role.MLP_ACT.value
        if top in _MLP_IN or (top in _MLP_OUT and top != "dropout"):
            # MLP linears directly under the layer (OPT fc1/fc2).
            st["attn"] = 1
            if top in _MLP_IN:
                st["mlp_in"] = 1
                return Role.MLP_IN.value
            st["mlp_out"] = 1
            return Role.MLP_OUT.value
        if top in _MLP:
            st["attn"] = 1
            if is_moe_block(block) or self._is_moe_path(parts):
                return self._moe_role(st, parts, kind)
            if sub in _MLP_IN:
                return Role.MLP_IN.value
            if sub in _MLP_OUT:
                if sub != "dropout":
                    st["mlp_out"] = 1
                return Role.MLP_OUT.value
            return Role.MLP_OUT.value if st["mlp_out"] else Role.MLP_ACT.value
        return Role.OTHER.value

    def _is_moe_path(self, parts: list[str]) -> bool:
        return any(p in ("experts", "gate", "router", "shared_experts") for p in parts[1:2])

    def _moe_role(self, st: dict[str, int], parts: list[str], kind: OpKind | None) -> str:
        sub = parts[1] if len(parts) > 1 else ""
        if "shared" in sub:
            return Role.MOE_SHARED.value
        if sub in _ROUTER:
            return Role.MOE_ROUTER.value
        if sub == "experts":
            st["experts"] = 1
            if kind == OpKind.GROUPED_GEMM:
                st["grouped"] += 1
                return Role.MOE_EXPERT.value
            if st["grouped"] == 0:
                return Role.MOE_DISPATCH.value
            if st["grouped"] >= 2:
                return Role.MOE_COMBINE.value
            return Role.MOE_EXPERT.value
        return Role.MOE_COMBINE.value if st["experts"] else Role.MOE_DISPATCH.value

    def _head_role(self, local: str, cls: str, kind: OpKind | None) -> str:
        last = local.split(".")[-1] if local else ""
        if last in ("lm_head", "embed_out", "output"):
            self._head_seen = True
            return Role.LM_HEAD.value
        if self._head_seen:
            return Role.LOSS.value
        return Role.FINAL_NORM.value
