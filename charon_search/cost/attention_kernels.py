"""Which fused-attention kernel a framework ran, relative to the one the costs represent.

Fused attention kernels come in generations with very different speed on the same GPU:

* generation 3 - warp-specialized, asynchronous (TMA / wgmma) kernels: FlashAttention-3,
  cuDNN fused attention and TRT-LLM/FlashInfer kernels on Hopper and Blackwell;
* generation 2 - FlashAttention-2 (the ``flash`` backend of PyTorch SDPA), the best kernel on
  Ampere and Ada;
* generation 1 - the Triton FlashAttention kernel of 2022/23 (``flash_attn_triton``, which
  MPT/llm-foundry ran as ``attn_impl: triton`` to get ALiBi).

``GpuSpec.attention_kernel_gen`` states the generation the GPU's attention costs represent
(profile rows, predictor and roofline alike: the H100/H200 profiles measured vLLM's
FlashAttention-3, the A100 profile FlashAttention-2, and the roofline prices attention at the
GEMM efficiency, which only the newest kernel of an architecture reaches). ``Layout
.attention_kernel`` states what the framework ran: ``flash`` (the GPU's best fused kernel),
``flash2`` or ``flash_triton``. A kernel older than the costed one is slower by the published
speed ratio between the generations; a newer one is never assumed faster than measured.
"""

from __future__ import annotations

from charon_search.errors import ConfigError

__all__ = ["ATTENTION_KERNEL_GEN", "BWD_THROUGHPUT_VS_FWD", "GEN_SLOWDOWN",
           "attention_time_factor"]

#: ``Layout.attention_kernel`` -> kernel generation (``None``: the GPU's own best kernel).
ATTENTION_KERNEL_GEN: dict[str, int | None] = {"flash": None, "flash2": 2, "flash_triton": 1}

#: (older generation, newer generation) -> (forward, backward) time ratio older / newer.
GEN_SLOWDOWN: dict[tuple[int, int], tuple[float, float]] = {
    # Forward: pytorch/pytorch#142132 (H100, torch 2.6.0.dev20241204, tritonbench, batch 1,
    # 24 heads, seq 4608, head dim 128): SDPA flash backend (FlashAttention-2) 329.5 TFLOP/s,
    # cuDNN 631.3, FlashAttention-3 631.8 -> 1.92x. Backward: FlashAttention-3 paper (Shah et
    # al., arXiv 2407.08608, sec. 4.1) "1.5-1.75x faster than FlashAttention-2" -> geometric
    # middle 1.62x.
    (2, 3): (1.92, 1.62),
    # FlashAttention-2 paper (Dao, arXiv 2307.08691, sec. 4.1, A100, forward + backward):
    # "1.3-2.5x faster than FlashAttention in Triton" -> geometric middle 1.80x, both passes.
    (1, 2): (1.80, 1.80),
}


#: Backward over forward attention throughput (FLOP/s, the backward counted as 2.5x the
#: forward's matmul FLOPs) of one fused kernel. The costs price a backward as its forward times
#: the FLOP ratio (``ir.ATTENTION_BWD_FLOP_RATIO``; the roofline at the forward's
#: efficiency), but the backward runs slower per FLOP: FlashAttention-3 paper (Shah et al.,
#: arXiv 2407.08608, Fig. "Attention forward/backward speed, head dim 128 (H100 80GB SXM5)",
#: seq 16k): FlashAttention-3 forward 648 / backward 561 TFLOP/s (0.866), FlashAttention-2
#: 370 / 322 (0.870); same ratio for both generations, so one constant.
BWD_THROUGHPUT_VS_FWD = 561.0 / 648.0


def attention_time_factor(kernel: str, gpu_gen: int, *, backward: bool) -> float:
    """Multiplier on the costed attention time for the ``kernel`` a framework ran.

    Args:
        kernel: ``Layout.attention_kernel`` (``flash``, ``flash2``, ``flash_triton``; ``eager``
            has no fused-attention node and gets 1).
        gpu_gen: ``GpuSpec.attention_kernel_gen`` (the generation the costs represent).
        backward: price the backward kernel (``attention_bwd``); includes
            ``1 / BWD_THROUGHPUT_VS_FWD`` (the backward's lower throughput per FLOP).
    """
    if kernel == "eager":
        return 1.0  # no fused-attention node (the bmm/softmax ops are costed as they are)
    if kernel not in ATTENTION_KERNEL_GEN:
        raise ConfigError(f"attention_kernel must be one of {sorted(ATTENTION_KERNEL_GEN)} or "
                          f"'eager', got {kernel!r}")
    want = ATTENTION_KERNEL_GEN[kernel]
    factor = 1.0 / BWD_THROUGHPUT_VS_FWD if backward else 1.0
    if want is None:
        return factor
    for gen in range(want, gpu_gen):
        fwd, bwd = GEN_SLOWDOWN[(gen, gen + 1)]
        factor *= bwd if backward else fwd
    return factor
