"""FLOP-counting conventions of the published sources (``flop_convention`` in SCHEMA.md).

A source's ``mfu`` / ``*_tflops_*`` numbers are only comparable with a prediction when the
prediction counts FLOPs the way the source does. Each convention below turns a predicted step time
into the source's FLOP rate: ``rate = flops_per_step(convention) / (step_time_s * num_gpus)``, and
utilisation divides by the peak the convention names (``convention_peak_flops_per_s``).

Symbols: ``B`` sequences per step, ``s`` sequence length, ``l`` layers, ``h`` hidden size,
``V`` vocabulary, ``N`` parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

from charon_search.validation.names import Unexpressible

__all__ = [
    "ArchFacts",
    "convention_peak_flops_per_s",
    "hardware_flops_per_step",
    "megatron_core_flops",
    "model_flops_per_step",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class ArchFacts:
    """Architecture numbers the FLOP conventions need (record fields over catalog values)."""

    num_layers: int
    hidden_size: int
    vocab_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    gated_mlp: bool
    params: float
    """Total parameters N (as the source states it, else the catalog count)."""
    num_experts: int = 0
    num_experts_per_token: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    num_dense_layers: int = 0
    """Layers with a dense MLP; ``num_layers - num_dense_layers`` are MoE layers."""
    mla: bool = False
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0


def _megatron_model(a: ArchFacts, B: float, s: float, *, v_div: float = 12.0) -> float:
    """Korthikanti et al. eq. (appendix): 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h))."""
    l, h, V = a.num_layers, a.hidden_size, a.vocab_size  # noqa: E741 - the papers' symbols
    return 72.0 * B * s * l * h**2 * (1 + s / (6 * h) + V / (v_div * l * h))


def megatron_core_flops(a: ArchFacts, B: float, s: float) -> float:
    """``num_floating_point_operations`` of Megatron-Core's training loop (3 × forward GEMMs).

    Dense GQA/MHA models follow the r0.8 formula (core attention counted over the full s×s score
    matrix): ``12·B·s·l·h²·[(1 + g/a + s/h)·(a·d/h) + (ffn/h)·gated + V/(2·l·h)]`` with
    gated = 3/2 for SwiGLU. MoE and MLA models follow the later version that counts dense and MoE
    layers apart, shared experts, MLA's low-rank projections, and halves core attention for the
    causal mask (MLA support only exists in those versions).
    """
    h, s_, V = a.hidden_size, s, a.vocab_size
    gated = 1.5 if a.gated_mlp else 1.0
    if not a.mla and not a.num_experts:
        q_ratio = a.num_attention_heads * a.head_dim / h
        g_over_a = a.num_key_value_heads / a.num_attention_heads
        per = ((1 + g_over_a + s_ / h) * q_ratio + (a.intermediate_size / h) * gated
               + V / (2 * a.num_layers * h))
        return 12.0 * B * s_ * a.num_layers * h * h * per
    ffn_factor = 3 if a.gated_mlp else 2
    num_moe = a.num_layers - a.num_dense_layers if a.num_experts else 0
    num_dense = a.num_layers - num_moe
    mlp = 6 * h * (a.intermediate_size * ffn_factor * num_dense
                   + a.moe_intermediate_size * a.num_experts_per_token * ffn_factor * num_moe
                   + a.moe_intermediate_size * a.num_shared_experts * ffn_factor * num_moe)
    heads = a.num_attention_heads
    if a.mla:
        qk = a.qk_nope_head_dim + a.qk_rope_head_dim
        q_term = (a.q_lora_rank * (h + heads * qk + 1) if a.q_lora_rank else h * heads * qk)
        attn = 6 * (q_term + a.kv_lora_rank * (h + heads * (a.qk_nope_head_dim + a.v_head_dim)
                                               + 1)
                    + h * a.qk_rope_head_dim + heads * a.v_head_dim * h
                    + s_ * heads * qk / 2 + s_ * heads * a.v_head_dim / 2)
    else:
        qp = a.head_dim * heads
        kvp = a.head_dim * a.num_key_value_heads
        attn = 6 * (h * (qp + 2 * kvp) + qp * s_ / 2 * 2 + qp * h)
    return B * s_ * (mlp + attn * a.num_layers + 6 * h * V)


def _six_n_plus_attention(a: ArchFacts, B: float, s: float) -> float:
    """PaLM appendix B: 6N + 12·l·H·Q·s FLOPs per token (H·Q = heads × head dim)."""
    per_token = 6 * a.params + 12 * a.num_layers * a.num_attention_heads * a.head_dim * s
    return per_token * B * s


def _foundry(a: ArchFacts, B: float, s: float, passes: int) -> float:
    """llm-foundry: per sequence (2·N·s + 4·l·h·s²), counted ``passes`` times."""
    return passes * B * (2 * a.params * s + 4 * a.num_layers * a.hidden_size * s * s)


def model_flops_per_step(convention: str, a: ArchFacts, B: float, s: float) -> float:
    """Model FLOPs (no recompute) of one step of ``B`` sequences of ``s`` tokens.

    Raises:
        Unexpressible: the convention does not define model FLOPs (``unstated``) or is unknown.
    """
    if convention in ("megatron-sc21", "megatron-2022"):
        return _megatron_model(a, B, s)
    if convention == "megatron-core":
        return megatron_core_flops(a, B, s)
    if convention in ("llama3", "palm"):
        return _six_n_plus_attention(a, B, s)
    if convention == "llm-foundry":
        return _foundry(a, B, s, 3)
    raise Unexpressible(f"flop_convention {convention!r} does not say how FLOPs are counted")


def hardware_flops_per_step(convention: str, a: ArchFacts, B: float, s: float,
                            recompute: str) -> float:
    """FLOPs actually executed per step, including recomputation, as the convention counts them.

    - ``megatron-sc21``: 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) (the paper always recomputes).
    - ``megatron-2022``: full recompute as SC21; selective recompute
      72·B·s·l·h²·(1 + s/(3h) + V/(12·l·h)) (Korthikanti et al., appendix; reproduces the
      paper's HFU/MFU ratios 0.437/0.415 and 0.57/0.56); none = model FLOPs.
    - ``llm-foundry``: 4 passes with activation checkpointing, else 3.
    - others: model FLOPs (those sources report no recompute-inclusive figure).
    """
    l, h, V = a.num_layers, a.hidden_size, a.vocab_size  # noqa: E741 - the papers' symbols
    if convention == "megatron-sc21" or (convention == "megatron-2022" and recompute == "full"):
        return 96.0 * B * s * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h))
    if convention == "megatron-2022" and recompute == "selective":
        return 72.0 * B * s * l * h**2 * (1 + s / (3 * h) + V / (12 * l * h))
    if convention == "llm-foundry":
        return _foundry(a, B, s, 4 if recompute == "full" else 3)
    return model_flops_per_step(convention, a, B, s)


#: Peak dense TFLOP/s each convention divides by (SCHEMA.md, `flop_convention` table).
_PEAKS_TFLOPS: dict[tuple[str, str], float] = {
    ("a100", "bf16"): 312.0,   # A100 SXM fp16/bf16 dense tensor core (NVIDIA A100 datasheet)
    ("h100", "bf16"): 989.0,   # H100 SXM dense BF16 (NVIDIA H100 datasheet, 989.4 rounded)
    ("h100", "fp8"): 1979.0,   # H100 SXM dense FP8 (llm-foundry's FP8 rows)
    ("tpu-v4", "bf16"): 275.0,  # TPU v4 peak bf16 (PaLM paper, appendix B)
}


def convention_peak_flops_per_s(convention: str, gpu_key: str, precision: str | None) -> float:
    """Peak FLOP/s the convention's ``mfu``/``hfu`` are relative to.

    Megatron SC21/2022 use the A100's 312 TFLOP/s, Megatron-Core and Llama 3 the H100's 989 (BF16
    MFU even for FP8 runs), llm-foundry 312 / 989 / 1979 (A100, H100 BF16, H100 FP8), PaLM the
    TPU v4's 275.
    """
    key = gpu_key.lower()
    family = ("a100" if key.startswith("a100") else "h100" if key.startswith(("h100", "h800"))
              else "tpu-v4" if key.startswith("tpu-v4") else key)
    prec = "fp8" if (convention == "llm-foundry" and precision in ("fp8", "mxfp8")) else "bf16"
    if convention in ("megatron-sc21", "megatron-2022"):
        family = "a100"
    elif convention in ("megatron-core", "llama3"):
        family = "h100" if family not in ("a100",) else family
    peak = _PEAKS_TFLOPS.get((family, prec))
    if peak is None:
        raise Unexpressible(f"no published peak for flop_convention {convention!r} on "
                            f"{gpu_key!r} ({prec})")
    return peak * 1e12
