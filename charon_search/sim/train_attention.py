"""Training attention kernels priced from this project's own H200 measurements.

The shipped Hopper attention rows (aiconfigurator-core) are vLLM's FlashAttention-3 *serving*
kernel: variable-length prefill over a paged KV cache. Training runs the dense kernels of
PyTorch SDPA / Transformer Engine, and at training shapes (2k-8k tokens per sequence, many
sequences) the serving rows are up to 2.3x slower than the dense kernel measured on the same
GPU (``data/profiles/measured/README.md``). ``charon-search profile --train-attention`` timed
the dense kernels on a lent H200: forward and backward alone, causal squares of 1k to 32k
tokens at 1-16 sequences and the non-causal blocks of ring attention, for
SDPA's ``cudnn`` backend (cuDNN fused attention, the warp-specialized Hopper kernel that
Transformer Engine also runs) and its ``flash`` backend (FlashAttention-2).

``TrainingAttention.seconds`` returns a node's time at the measured throughput (FLOP/s, the
node's own causal work) of the nearest measured shape: same causality and direction,
nearest in log2 of ``(q_len, kv_len, batch x heads, head_dim, v_head_dim)``. Measured: head
dims 64, 96, 112, 128, 256 (both backends) and 192 / 128 (MLA; cuDNN only, FlashAttention-2
needs equal dims). A GPU has these kernels when it is a full GH100 (``GH100_GPUS``); others keep
the profile rows with the generation factors of ``cost.attention_kernels``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import numpy as np

from charon_search.cost.attention_kernels import GEN_SLOWDOWN
from charon_search.ir import ATTENTION_BWD_FLOP_RATIO

__all__ = ["GH100_GPUS", "KERNEL_BACKEND", "TrainingAttention", "training_attention"]

#: GPUs with the measured GH100 kernels: the same die with all 132 SMs enabled and the same
#: 1,980 MHz boost clock as the H200 that was measured (NVIDIA H100 / H200 datasheets; the
#: H800 is the export H100 SXM with reduced NVLink). Attention is compute-bound, so the H200's
#: larger HBM does not change it; a part's sustained clock (``GpuSpec.sustained_clock_ratio``,
#: e.g. the 500 W H100) is applied by the coster like for every compute-bound op.
GH100_GPUS = frozenset({"h100-sxm-80gb", "h100-sxm-96gb-500w", "h200-sxm-141gb",
                        "h800-sxm-80gb"})

#: ``Layout.attention_kernel`` -> (measured SDPA backend, extra time factor). ``flash`` (the
#: GPU's best fused kernel) is cuDNN; ``flash_triton`` (the 2022/23 Triton kernel) is
#: FlashAttention-2 times the published FA2-over-Triton speed-up (``GEN_SLOWDOWN[(1, 2)]``).
KERNEL_BACKEND: dict[str, tuple[str, tuple[float, float]]] = {
    "flash": ("cudnn", (1.0, 1.0)),
    "flash2": ("flash", (1.0, 1.0)),
    "flash_triton": ("flash", GEN_SLOWDOWN[(1, 2)]),
}

_FILES = {"cudnn": "h200-sxm-141gb.train-attention-cudnn.parquet",
          "flash": "h200-sxm-141gb.train-attention-flash.parquet"}


def work(batch: float, heads: float, q_len: float, kv_len: float, head_dim: float,
         v_head_dim: float, *, causal: bool, backward: bool) -> float:
    """Matmul FLOPs of a fused attention call: ``2 b h q kv (d + d_v)`` (``Q K^T`` and
    ``P V``), half of it for a causal square (masked tiles are skipped),
    ``ATTENTION_BWD_FLOP_RATIO`` times that backward."""
    f = 2.0 * batch * heads * q_len * kv_len * (head_dim + v_head_dim)
    f *= 0.5 if causal else 1.0
    return f * (ATTENTION_BWD_FLOP_RATIO if backward else 1.0)


#: Feature weights of the nearest-shape match. The kernel's grid is batch x heads x query
#: tiles, so batch x heads is the feature; batch alone only breaks ties between rows of equal
#: batch x heads (4 x 8 heads against 1 x 32), preferring the row of the node's own batch.
_WEIGHTS = np.array([1.0, 1.0, 1.0, 1.0, 1.0, 0.01])


@dataclass(frozen=True)
class _Table:
    features: np.ndarray  # log2 [q_len, kv_len, batch*heads, head_dim, v_head_dim, batch]
    causal: np.ndarray
    backward: np.ndarray
    flops_per_s: np.ndarray


@lru_cache(maxsize=4)
def _table(backend: str) -> _Table:
    import pyarrow.parquet as pq

    path = resources.files("charon_search") / "data" / "profiles" / "measured" / _FILES[backend]
    with resources.as_file(path) as p:
        t = pq.read_table(p).to_pydict()
    q, kv = np.array(t["q_len"]), np.array(t["kv_len"])
    b, h, d = np.array(t["batch"]), np.array(t["heads"]), np.array(t["head_dim"])
    dv = np.array(t["v_head_dim"])
    causal = q == kv  # the profiler's convention: squares causal, rectangles not
    backward = np.array([k == "attention_bwd" for k in t["op_kind"]])
    flops = np.array([work(*row, causal=bool(c), backward=bool(bw)) for *row, c, bw in
                      zip(b, h, q, kv, d, dv, causal, backward, strict=True)])
    feats = np.log2(np.stack([q, kv, b * h, d, dv, b], axis=1)) * _WEIGHTS
    return _Table(features=feats, causal=causal, backward=backward,
                  flops_per_s=flops / np.array(t["latency_s"]))


@dataclass(frozen=True)
class TrainingAttention:
    """Measured dense training attention of one ``Layout.attention_kernel`` on a GH100."""

    backend: str
    factors: tuple[float, float]  # (forward, backward) time factor on the measured backend

    def flops_per_s(self, batch: float, heads: float, q_len: float, kv_len: float,
                    head_dim: float, v_head_dim: float, *, causal: bool, backward: bool
                    ) -> float:
        """Measured throughput of the nearest shape of the same causality and direction."""
        logs = tuple(round(math.log2(max(v, 1.0)) * w, 6) for v, w in zip(
            (q_len, kv_len, batch * heads, head_dim, v_head_dim, batch), _WEIGHTS, strict=True))
        return _nearest(self.backend, logs, causal, backward)

    def seconds(self, flops: float, batch: float, heads: float, q_len: float, kv_len: float,
                head_dim: float, v_head_dim: float, *, causal: bool, backward: bool) -> float:
        """Seconds of a node doing ``flops`` (its causal work) at that shape."""
        rate = self.flops_per_s(batch, heads, q_len, kv_len, head_dim, v_head_dim,
                                causal=causal, backward=backward)
        return flops / rate * self.factors[1 if backward else 0]


@lru_cache(maxsize=65536)
def _nearest(backend: str, logs: tuple[float, ...], causal: bool, backward: bool) -> float:
    t = _table(backend)
    mask = (t.causal == causal) & (t.backward == backward)
    feats = t.features[mask]
    dist = ((feats - np.array(logs)) ** 2).sum(axis=1)
    return float(t.flops_per_s[mask][int(np.argmin(dist))])


def training_attention(gpu_name: str, kernel: str) -> TrainingAttention | None:
    """The measured kernel for ``Layout.attention_kernel`` on ``gpu_name``, or None."""
    if gpu_name not in GH100_GPUS or kernel not in KERNEL_BACKEND:
        return None
    backend, factors = KERNEL_BACKEND[kernel]
    return TrainingAttention(backend=backend, factors=factors)
