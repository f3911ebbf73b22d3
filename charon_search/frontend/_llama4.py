"""Llama 4 MoE layers traced as the grouped expert kernels engines and trainers run.

transformers' ``Llama4TextMoe`` (Llama 4 Scout / Maverick) computes its routed experts densely:
every token is repeated once per expert, scaled by a router score that is zero for the experts it
was not routed to, and pushed through all experts with two batched matmuls
(``Llama4TextExperts.forward``: ``bmm`` over ``[num_experts, tokens, hidden]``). A trace of that
code would price ``num_experts`` times the expert FLOPs of top-1 routing (16x for Scout, 128x
for Maverick). The kernels that run Llama 4 compute only the routed rows: vLLM's and SGLang's
fused MoE, TensorRT-LLM's MoE plugin and torchtitan's grouped-GEMM experts
(``torch._grouped_mm`` over tokens sorted by expert).

``llama4_patches`` swaps ``Llama4TextMoe.forward`` and ``Llama4TextExperts.forward`` for the
routed form: HF's own router (``Llama4Router``: top-k of the logits, sigmoid of the kept ones),
the token rows scaled by their router score *before* the experts (Llama 4 scales the expert
input, not its output), sorted by expert, two grouped GEMMs over ``gate_up_proj`` /
``down_proj`` (``[experts, in, out]``) with SiLU-and-multiply between them, the rows put back
in token order, and the shared expert added. The ops are the ones transformers' ``grouped_mm``
experts emit for other MoE models, so ``_convert`` prices them the same way (``GROUPED_GEMM``
nodes with ``tokens``, ``top_k`` and ``num_experts``; balanced routing on the cost side).

Three in four layers attend locally (``attention_chunk_size`` 8192: a query attends only the
keys of its own 8192-token chunk). They are traced as causal attention and priced as a sliding
window of the chunk (``ModelSpec.sliding_window``): exact while a sequence fits in one chunk
(every shipped Llama 4 record: 8192 tokens), at most twice the chunked work beyond. Their KV
cache keeps a chunk's blocks per request where the engine pages it so
(``serving.kv_cache.KvWindow``, ``ServingConfig.windowed_kv``).
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from charon_search.frontend._patching import swapped_forwards

__all__ = ["LLAMA4_MODULE", "llama4_patches"]

#: The transformers module whose MoE classes are swapped.
LLAMA4_MODULE = "transformers.models.llama4.modeling_llama4"


def _grouped_mm(x: Any, weight: Any, offs: Any) -> Any:
    import torch
    import torch.nn.functional as F

    fn = getattr(F, "grouped_mm", None) or torch._grouped_mm
    return fn(x, weight, offs=offs)


def _routed_experts(self: Any, hidden_states: Any, top_k_index: Any, top_k_weights: Any) -> Any:
    """``Llama4TextExperts`` on the routed rows only: ``(tokens, hidden)`` -> ``(tokens,
    hidden)``, each token the sum over its ``top_k`` experts of ``expert(score * x)``."""
    import torch

    k = top_k_index.size(-1)
    expert_ids, perm = torch.sort(top_k_index.reshape(-1))
    scores = top_k_weights.reshape(-1)[perm].unsqueeze(-1).to(hidden_states.dtype)
    rows = hidden_states[perm // k] * scores
    # histc rather than bincount, as transformers' grouped_mm experts do (CPU histc wants floats).
    counts = torch.histc(expert_ids.float(), bins=self.num_experts, min=0,
                         max=self.num_experts - 1)
    offs = torch.cumsum(counts, dim=0, dtype=torch.int32)
    gate, up = _grouped_mm(rows, self.gate_up_proj, offs).chunk(2, dim=-1)
    out = _grouped_mm(up * self.act_fn(gate), self.down_proj, offs)
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.numel(), device=perm.device)
    return out[inverse].view(-1, k, out.size(-1)).sum(dim=1)


def _routed_moe(self: Any, hidden_states: Any) -> tuple[Any, Any]:
    """``Llama4TextMoe.forward`` with the experts on their routed rows (module doc)."""
    import torch

    tokens = hidden_states.reshape(-1, self.hidden_dim)
    router_scores, router_logits = self.router(tokens)
    weights, index = torch.topk(router_scores, self.top_k, dim=1)
    out = self.shared_expert(tokens)
    return out + self.experts(tokens, index, weights), router_logits


def llama4_patches() -> contextlib.AbstractContextManager[None]:
    """Swap Llama 4's MoE forwards for the routed form while tracing (when transformers'
    Llama 4 module is loaded; no-op otherwise)."""
    mod = sys.modules.get(LLAMA4_MODULE)
    return swapped_forwards([] if mod is None else [(mod.Llama4TextMoe, _routed_moe),
                                                    (mod.Llama4TextExperts, _routed_experts)])
