"""Gated DeltaNet (linear attention) layers traced as the fused kernels engines run.

Qwen3-Next and Qwen3.5 interleave full-attention layers with Gated DeltaNet layers
(``*GatedDeltaNet``: Yang et al., "Gated Delta Networks", arXiv 2412.06464). HF's torch fallback
of their core loops over 64-token chunks (prefill) or tokens (decode) in Python, so a trace would
hold ``s / 64`` copies of the chunk body and no polynomial in ``s``. Serving engines run two
kernels instead (flash-linear-attention's Triton kernels in vLLM / SGLang / TensorRT-LLM):

* ``causal_conv1d`` (prefill; ``causal_conv1d_update`` in decode): the depthwise causal
  convolution of width ``linear_conv_kernel_dim`` over the q/k/v channels, with SiLU;
* ``chunk_gated_delta_rule`` (prefill; ``fused_recurrent_gated_delta_rule`` in decode): the
  gated delta rule with the q/k L2 norm inside, reading and writing one ``d_k x d_v`` fp32
  recurrent state per value head and request.

``linear_attention_patches`` swaps the module's ``forward`` for one that runs HF's own projections,
gated RMSNorm and output projection around two ``charon::`` custom ops standing for those kernels,
so each traces as ONE node whose FLOPs and bytes ``_convert`` prices from the shapes. Decode (a
cache is passed and one token is fed) reads and writes the per-request state (made here as an
empty tensor of the state's shape: it is cache memory, not a graph input); prefill writes the
final state once per sequence. Training differentiates through both ops (custom backward ops).
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from charon_search.frontend._patching import swapped_forwards

__all__ = ["GDN_CHUNK", "GDN_MODULES", "linear_attention_patches", "register_ops"]

#: Chunk length of flash-linear-attention's ``chunk_gated_delta_rule`` (``chunk_size = 64``,
#: ``fla/ops/gated_delta_rule/chunk.py``), which sets its intra-chunk FLOPs.
GDN_CHUNK = 64
#: transformers modules whose ``*GatedDeltaNet`` class is swapped (module, class name).
GDN_MODULES = (
    ("transformers.models.qwen3_5_moe.modeling_qwen3_5_moe", "Qwen3_5MoeGatedDeltaNet"),
    ("transformers.models.qwen3_5.modeling_qwen3_5", "Qwen3_5GatedDeltaNet"),
    ("transformers.models.qwen3_next.modeling_qwen3_next", "Qwen3NextGatedDeltaNet"),
)

_REGISTERED = False


def register_ops() -> None:
    """Define the ``charon::`` ops (once per process). They only have fake (meta) kernels: the
    tracer never runs real data through them."""
    global _REGISTERED
    if _REGISTERED:
        return
    import torch
    from torch import Tensor

    # Explicit schemas: this module's annotations are strings (``from __future__``).
    @torch.library.custom_op("charon::gated_delta_rule", mutates_args=(), schema=(
        "(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, Tensor? state)"
        " -> (Tensor, Tensor)"))
    def gated_delta_rule(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                         state: Tensor | None) -> tuple[Tensor, Tensor]:
        raise NotImplementedError("charon::gated_delta_rule is a tracing stand-in")

    @gated_delta_rule.register_fake
    def _(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
          state: Tensor | None) -> tuple[Tensor, Tensor]:
        b, _, hv, dv = v.shape
        return v.new_empty(v.shape), v.new_empty((b, hv, k.shape[-1], dv), dtype=torch.float32)

    @torch.library.custom_op("charon::gated_delta_rule_backward", mutates_args=(), schema=(
        "(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, Tensor grad_out)"
        " -> (Tensor, Tensor, Tensor, Tensor, Tensor)"))
    def gated_delta_rule_backward(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                                  grad_out: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor,
                                                             Tensor]:
        raise NotImplementedError("charon::gated_delta_rule_backward is a tracing stand-in")

    @gated_delta_rule_backward.register_fake
    def _(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
          grad_out: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
                g.new_empty(g.shape), beta.new_empty(beta.shape))

    def _gdr_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.save_for_backward(*inputs[:5])

    def _gdr_backward(ctx: Any, grad_out: Tensor, grad_state: Tensor) -> tuple[Any, ...]:
        q, k, v, g, beta = ctx.saved_tensors
        dq, dk, dv, dg, dbeta = torch.ops.charon.gated_delta_rule_backward(q, k, v, g, beta,
                                                                           grad_out)
        return dq, dk, dv, dg, dbeta, None

    gated_delta_rule.register_autograd(_gdr_backward, setup_context=_gdr_setup)

    @torch.library.custom_op("charon::causal_conv1d", mutates_args=(), schema=(
        "(Tensor x, Tensor weight, Tensor? state) -> Tensor"))
    def causal_conv1d(x: Tensor, weight: Tensor, state: Tensor | None) -> Tensor:
        raise NotImplementedError("charon::causal_conv1d is a tracing stand-in")

    @causal_conv1d.register_fake
    def _(x: Tensor, weight: Tensor, state: Tensor | None) -> Tensor:
        return x.new_empty(x.shape)

    @torch.library.custom_op("charon::causal_conv1d_backward", mutates_args=(), schema=(
        "(Tensor x, Tensor weight, Tensor grad_out) -> (Tensor, Tensor)"))
    def causal_conv1d_backward(x: Tensor, weight: Tensor, grad_out: Tensor
                               ) -> tuple[Tensor, Tensor]:
        raise NotImplementedError("charon::causal_conv1d_backward is a tracing stand-in")

    @causal_conv1d_backward.register_fake
    def _(x: Tensor, weight: Tensor, grad_out: Tensor) -> tuple[Tensor, Tensor]:
        return x.new_empty(x.shape), weight.new_empty(weight.shape)

    def _conv_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.save_for_backward(inputs[0], inputs[1])

    def _conv_backward(ctx: Any, grad_out: Tensor) -> tuple[Any, ...]:
        x, w = ctx.saved_tensors
        dx, dw = torch.ops.charon.causal_conv1d_backward(x, w, grad_out)
        return dx, dw, None

    causal_conv1d.register_autograd(_conv_backward, setup_context=_conv_setup)
    _REGISTERED = True


def _gdn_forward(self: Any, hidden_states: Any, cache: Any = None, attention_mask: Any = None,
                 **kwargs: Any) -> Any:
    """A ``*GatedDeltaNet.forward`` whose convolution and delta-rule core are one op each."""
    import torch
    import torch.nn.functional as F

    if cache is None:
        cache = kwargs.pop("cache_params", None)
    batch, seq_len, _ = hidden_states.shape
    decode = cache is not None and seq_len == 1
    if hasattr(self, "in_proj_qkv"):  # Qwen3.5: separate q/k/v and z projections
        mixed_qkv = self.in_proj_qkv(hidden_states)
        z = self.in_proj_z(hidden_states).reshape(batch, seq_len, -1, self.head_v_dim)
        b = self.in_proj_b(hidden_states)
        a = self.in_proj_a(hidden_states)
    else:  # Qwen3-Next: one qkvz and one ba projection, grouped per key head
        qkvz = self.in_proj_qkvz(hidden_states)
        ba = self.in_proj_ba(hidden_states)
        q, k, v, z, b, a = self.fix_query_key_value_ordering(qkvz, ba)
        q, k, v = (x.reshape(batch, seq_len, -1) for x in (q, k, v))
        mixed_qkv = torch.cat((q, k, v), dim=-1)
    conv_state = None
    if decode:
        conv_state = hidden_states.new_empty((batch, self.conv_dim, self.conv_kernel_size - 1))
    mixed_qkv = torch.ops.charon.causal_conv1d(mixed_qkv.transpose(1, 2),
                                               self.conv1d.weight.squeeze(1), conv_state)
    mixed_qkv = mixed_qkv.transpose(1, 2)
    query, key, value = torch.split(mixed_qkv, [self.key_dim, self.key_dim, self.value_dim],
                                    dim=-1)
    query = query.reshape(batch, seq_len, -1, self.head_k_dim)
    key = key.reshape(batch, seq_len, -1, self.head_k_dim)
    value = value.reshape(batch, seq_len, -1, self.head_v_dim)
    beta = b.sigmoid()
    g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
    state = None
    if decode:
        state = value.new_empty((batch, self.num_v_heads, self.head_k_dim, self.head_v_dim),
                                dtype=torch.float32)
    core, _ = torch.ops.charon.gated_delta_rule(query, key, value, g, beta, state)
    core = core.reshape(-1, self.head_v_dim)
    z = z.reshape(-1, self.head_v_dim)
    core = self.norm(core, z).reshape(batch, seq_len, -1)
    return self.out_proj(core)


def linear_attention_patches() -> contextlib.AbstractContextManager[None]:
    """Swap every known ``*GatedDeltaNet.forward`` for ``_gdn_forward`` (see the module doc)."""
    register_ops()
    classes = [getattr(sys.modules.get(mod_name), cls_name, None)
               for mod_name, cls_name in GDN_MODULES]
    return swapped_forwards((cls, _gdn_forward) for cls in classes if cls is not None)
