#!/usr/bin/env python
"""Convert the measured peer tables (``../shared/data/peers``) into the shipped profile DB.

Usage::

    python scripts/import_peers.py [--peers /work/shared/data/peers]
                                   [--out charon_search/data/profiles]

Sources (see ``charon_search/data/profiles/ATTRIBUTION.md``):

* aiconfigurator-core 0.12.0 (Apache-2.0): ``systems/data/<system>/<family>/<backend>/<ver>/``.
  ``latency`` is **milliseconds**; NCCL ``message_size`` is **elements** of ``nccl_dtype``;
  DeepEP ``*_us`` columns are **microseconds**. We read the vLLM backend at the default slot of
  ``systems/query_versions.yaml`` (0.24.0; A100 0.14.0) and keep one kernel family per op, dtype
  and GPU (the family with the most rows): GEMM bf16 = ``torch.nn.functional.linear``
  (``vllm_default`` on A100), GEMM fp8 = ``CutlassFP8ScaledMMLinearKernel`` (per-tensor fp8),
  GEMM fp4 = the NVFP4 linear kernel where the table has one (Blackwell:
  ``FlashInferCuteDslNvFp4LinearKernel``); block-scaled fp8 GEMMs per engine (SGLang and
  TensorRT-LLM at their ``current`` slot, ``BLOCK_FP8_GEMM_ENGINES``),
  attention = the vLLM default FlashAttention/FlashInfer kernel with a bf16 KV cache and no
  sliding window; decode, MLA decode and prompt attention over an fp8 KV cache per engine
  (vLLM, SGLang and TensorRT-LLM at their ``current`` slot, the engine's default kernel:
  ``convert_attention`` / ``convert_mla_decode`` with ``engine``, variants ``decode.<engine>``,
  ``decode_mla.<engine>``, ``prefill.<engine>``, dtype ``fp8``), since the engines' fp8-cache
  kernels gain very differently over their bf16 ones; MoE = the unquantized fused-MoE kernel,
  balanced routing (``moe_ffn``) plus power-law 1.01 skew (``moe_ffn_skew``); NCCL = the newest
  NCCL folder per GPU.
  Gated DeltaNet (linear attention, ``linear_attention/sglang``): the chunked and recurrent
  delta-rule kernels and the causal convolutions, per TP rank's heads (``convert_gdn``).
  DeepSeek Sparse Attention of GLM-5 (``sparse_attention/sglang``): the indexer's logits and
  top-k and the sparse MLA kernel (``convert_dsa``).
  Quantized MoE (``QUANT_MOE_DTYPES``: per-tensor ``fp8``, 128x128 ``fp8_block``,
  ``w4a16_mxfp4``, ``w4a8_mxfp4_mxfp8`` (MXFP4 weights with MXFP8 activations, Blackwell),
  ``int4_wo``, ``nvfp4`` (NVFP4 weights and activations, Blackwell)) is read per engine,
  since each engine ships its own MoE kernels:
  vLLM, TensorRT-LLM and SGLang at their ``current`` slot of ``query_versions.yaml``
  (``BACKEND_VERSION``), power-law 1.01 routing only (the routing aiconfigurator's own SDK
  prices serving with: ``sdk/config.py`` ``workload_distribution = "power_law"``, alpha 1.01 in
  ``sdk/models/deepseek.py``; balanced rows would double the size), one kernel family per
  (engine, dtype, GPU) (the engine's default kernel, ``PREFERRED_MOE_KERNEL``, else the most
  rows), stored as variant ``moe_ffn_skew.<engine>`` with the table's ``moe_dtype`` as dtype.
  SGLang's wide-EP decode MoE (DeepEP low-latency dispatch into DeepGEMM's masked grouped GEMM,
  ``moe/sglang/<DEEPEP_SGLANG_VERSION>/wideep_generation_moe_perf.parquet``, kernel
  ``deepepmoe``, up to 128 tokens per EP rank, global token counts): variant
  ``moe_ffn_skew.sglang_deepep``, power-law 1.01 routing (``convert_moe_quant`` with engine
  ``sglang_deepep``). Its prefill MoE (DeepEP normal-mode dispatch into DeepGEMM's contiguous
  grouped GEMM, ``wideep_context_moe_perf.parquet``, kernel ``deepepmoe``, global token counts
  up to 524,288): variant ``moe_ffn_skew.sglang_deepep_normal``, power-law 1.01 routing.
  vLLM's Triton fused-MoE kernel (the one a launch gets with FlashInfer's and DeepGEMM's MoE
  turned off), from the newest vLLM version folder that measured it
  (``convert_moe_triton``): variant ``moe_ffn_skew.vllm_triton``, fp8 and fp8_block.
* vidur @7d47513 (MIT): ``data/profiling/compute/<sku>/<model>/mlp.csv`` (milliseconds;
  per-TP-shard shapes; we take ``time_stats.<op>.mean`` because the median of a few samples is
  quantized to the 1 µs timer resolution, a 10-20 % error on 5 µs norms) for norms and
  elementwise ops (and GEMMs on the A40, which
  aiconfigurator does not cover); ``data/profiling/network/*/all_reduce.csv`` (``size`` in
  **bytes**, times in ms) for all-reduce incl. cross-node (``devices_per_node`` < workers).
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from charon_search.cost.profile_db import normalize_gpu, write_profile_db  # noqa: E402
from charon_search.cost.selector import (  # noqa: E402
    BLOCK_FP8_GEMM_ENGINES,
    MLA_HEAD_DIM,
)

AIC = "aiconfigurator-core 0.12.0"
VIDUR = "vidur@7d47513"
MS = 1e-3
US = 1e-6
#: aiconfigurator dtype names -> IR dtype keys (``ir.graph.DTYPE_BYTES``).
DTYPE = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "fp8": "fp8", "int8": "int8",
         "nvfp4": "fp4"}
ELEMENT_BYTES = {"half": 2, "float16": 2, "bfloat16": 2, "int8": 1, "fp8": 1, "float": 4}
#: GPUs per node of each aiconfigurator system (NCCL tables are intra-node up to this size).
GPUS_PER_NODE = {"gb200": 4, "gb300": 4}
#: The default queried vLLM version per system (``systems/query_versions.yaml``).
VLLM_VERSION = {"a100_sxm": "0.14.0"}
#: Engine -> (``current`` version of ``systems/query_versions.yaml`` ``defaults``, overrides per
#: system) for the quantized MoE tables.
BACKEND_VERSION: dict[str, tuple[str, dict[str, str]]] = {
    "vllm": ("0.24.0", VLLM_VERSION),
    "trtllm": ("1.3.0rc20", {"a100_sxm": "1.0.0"}),
    "sglang": ("0.5.14", {"a100_sxm": "0.5.10"}),
}
#: Quantized MoE kernel dtypes imported (aiconfigurator ``moe_dtype`` names, kept verbatim as
#: the DB dtype): the formats of the checkpoints the catalog ships (``_charon_checkpoints``).
QUANT_MOE_DTYPES = ("fp8", "fp8_block", "w4a16_mxfp4", "w4a8_mxfp4_mxfp8", "int4_wo", "nvfp4")
#: (engine, moe_dtype) -> the kernel family the engine runs by default, where the table holds
#: several: vLLM's ``Fp8MoEMethod`` takes FlashInfer's CUTLASS MoE for block fp8 only with
#: ``VLLM_USE_FLASHINFER_MOE_FP8=1`` (default off, ``vllm/envs.py``) and otherwise the Triton
#: fused-MoE experts (DeepGEMM for large batches); the FlashInfer rows also cover only part of
#: the shapes (H200 0.24.0: no EP=1 rows of Qwen3-235B's experts).
#: TensorRT-LLM's NVFP4 experts: its ``moe_torch_flow_min_latency`` rows, not the CUTLASS ones
#: (``moe_torch_flow_cutlass``, the most rows). They time the TRT-LLM-gen MoE kernels that
#: ``moe_config.backend: TRTLLM`` runs (``dsr1_fp4_b200_trt.sh`` passes it unless attention DP
#: is on, when it picks CUTLASS; no expressed aggregated row runs that branch): for
#: DeepSeek's experts on B200 they are within 30 % of the FlashInfer TRT-LLM-gen rows that
#: SGLang and vLLM measured (same kernels), from 1 to 16,384 tokens, where the CUTLASS rows
#: are 1.5-3x slower (docs/calibration/README.md, session 50).
PREFERRED_MOE_KERNEL = {("vllm", "fp8_block"): "vllm_fp8moe_triton_tritonexperts",
                        ("trtllm", "nvfp4"): "moe_torch_flow_min_latency"}
#: SGLang version folder of the wide-EP (DeepEP) generation MoE tables (the only one holding
#: them on Blackwell; Hopper also has 0.5.6.post2).
DEEPEP_SGLANG_VERSION = "0.5.10"
#: (engine, version or None = the engine's ``BACKEND_VERSION`` slot) of the Marlin MoE rows.
MARLIN_TABLES = (("vllm", None), ("sglang", None), ("sglang", "0.5.10"))
SYSTEMS = ("a100_sxm", "h100_sxm", "h200_sxm", "b200_sxm", "b300_sxm", "gb200", "gb300", "l40s",
           "rtx_pro_6000_server")


def _read(path: str) -> pd.DataFrame:
    """A peer table (Parquet, or CSV for the small test fixtures)."""
    if str(path).endswith(".csv"):
        return pd.read_csv(path)
    return pq.read_table(path).to_pandas()


def _rel(path: str, peers: Path) -> str:
    return os.path.relpath(path, peers / "aiconfigurator-core" / "systems" / "data")


def _most_rows(df: pd.DataFrame, col: str = "kernel_source") -> pd.DataFrame:
    if df.empty:
        return df
    top = df[col].value_counts().idxmax()
    return df[df[col] == top]


def _slot(engine: str, system: str) -> str:
    """The version folder of ``engine``'s tables on ``system`` (``BACKEND_VERSION``)."""
    version, overrides = BACKEND_VERSION[engine]
    return overrides.get(system, version)


def _vllm_dir(peers: Path, system: str, family: str) -> Path | None:
    base = peers / "aiconfigurator-core" / "systems" / "data" / system / family / "vllm"
    version = VLLM_VERSION.get(system, "0.24.0")
    d = base / version
    return d if d.exists() else None


# ---------------------------------------------------------------------------- aiconfigurator
def convert_gemm(path: str, gpu: str, source: str) -> pd.DataFrame:
    """GEMM rows: bf16, per-tensor fp8 and, where measured (Blackwell), NVFP4 (one kernel
    each, stored as dtype ``fp4``); ms -> s."""
    df = _read(path)
    parts = []
    for dt in ("bfloat16", "fp8", "nvfp4"):
        sub = _most_rows(df[df.gemm_dtype == dt])
        if sub.empty:
            continue
        parts.append(pd.DataFrame({
            "gpu": gpu, "op_kind": "gemm", "variant": "", "dtype": DTYPE[dt],
            "kernel": sub.kernel_source.values, "source": source,
            "m": sub.m.values, "n": sub.n.values, "k": sub.k.values,
            "latency_s": sub.latency.values * MS,
        }))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


#: Engines whose 128x128 block-scaled fp8 GEMM rows (``gemm_dtype`` ``fp8_block``, the dense
#: layers of DeepSeek-V3/R1, Qwen3-FP8, MiniMax-M2.5, GLM-5 and Qwen3.5 FP8 checkpoints) are
#: imported, each as variant ``<engine>`` (``cost.selector.BLOCK_FP8_GEMM_ENGINES``): SGLang's
#: DeepGEMM ``fp8_gemm_nt`` on Hopper and Blackwell, TensorRT-LLM's own block-scaling GEMM on
#: Hopper (``torch_flow``) and DeepGEMM on Blackwell. vLLM's table (0.24.0) is left out: its
#: rows up to a few hundred tokens sit on a flat floor (H200 ~57 us, B200 ~170 us for every
#: shape down to 16 x 128 x 128, where SGLang's DeepGEMM takes 3.5-5 us), the host time of an
#: eager call measured with the kernel; from 8192 tokens they agree with SGLang's DeepGEMM rows
#: within 16-24 % (median).


def convert_gemm_block(path: str, gpu: str, source: str, engine: str) -> pd.DataFrame:
    """One engine's block-scaled fp8 GEMM rows: variant ``engine``, dtype ``fp8_block``; ms -> s.
    """
    df = _read(path)
    sub = _most_rows(df[df.gemm_dtype == "fp8_block"])
    if sub.empty:
        return pd.DataFrame()
    return pd.DataFrame({
        "gpu": gpu, "op_kind": "gemm", "variant": engine, "dtype": "fp8_block",
        "kernel": sub.kernel_source.values, "source": source,
        "m": sub.m.values, "n": sub.n.values, "k": sub.k.values,
        "latency_s": sub.latency.values * MS,
    })


def convert_attention(path: str, gpu: str, source: str, *, decode: bool,
                      engine: str = "") -> pd.DataFrame:
    """Context (prefill, causal, q_len = kv_len = isl) or generation (decode, q_len = 1,
    kv_len = step + 1: ``step`` cached tokens plus the new one) attention, no sliding window.

    No ``engine``: the table's bf16-cache rows (bf16 queries), variant ``decode`` /
    ``prefill``, dtype ``bf16``. With ``engine``: that engine's fp8-cache rows, variant
    ``decode.<engine>`` / ``prefill.<engine>``, dtype ``fp8``, in the engine's default kernel
    (the one with the most rows: vLLM FlashAttention 3 on Hopper and FlashInfer's TRT-LLM-gen
    kernels on Blackwell, SGLang ``fa3`` / ``trtllm_mha``, TensorRT-LLM ``torch_flow``) with the
    query type it has most rows of (decode: bf16; prefill: vLLM bf16, SGLang fp8, TensorRT-LLM
    fp8 on Hopper and bf16 on Blackwell, whose two variants lie within 8 %)."""
    df = _read(path)
    keep = df.kv_cache_dtype == ("fp8" if engine else "bfloat16")
    if decode or not engine:
        keep &= df.attn_dtype == "bfloat16"
    for col, value in (("window_size", 0), ("beam_width", 1)):
        if col in df.columns:  # absent in older collections (A100)
            keep &= df[col] == value
    df = _most_rows(_most_rows(df[keep]), "attn_dtype")
    if df.empty:
        return pd.DataFrame()
    family = "decode" if decode else "prefill"
    return pd.DataFrame({
        "gpu": gpu, "op_kind": "attention", "variant": f"{family}.{engine}" if engine else family,
        "dtype": "fp8" if engine else "bf16", "kernel": df.kernel_source.values,
        "source": source, "batch": df.batch_size.values, "heads": df.num_heads.values,
        "kv_heads": df.num_key_value_heads.values,
        "q_len": np.ones(len(df)) if decode else df.isl.values,
        "kv_len": df.step.values + 1 if decode else df.isl.values,
        "head_dim": df.head_dim.values, "latency_s": df.latency.values * MS,
    })


#: Engine -> its MLA decode kernel over an fp8 cache whose rows are imported (None: the table's
#: kernel). SGLang's Hopper table times its FlashAttention 3 MLA backend (``flash_attention``),
#: which with an fp8 cache takes 5x its bf16 time (283 vs 55 us at 32 requests, 4,096 keys,
#: H200); InferenceX's SGLang DeepSeek H200 recipe runs ``--attention-backend flashinfer``
#: instead, so only its Blackwell ``trtllm_mla`` rows (the backend of
#: ``dsr1_fp4_b200.sh`` with ``--kv-cache-dtype fp8_e4m3``) are taken.
MLA_KV8_KERNEL: dict[str, str | None] = {"trtllm": None, "sglang": "trtllm_mla"}


def convert_mla_decode(path: str, gpu: str, source: str, engine: str = "") -> pd.DataFrame:
    """MLA generation attention (DeepSeek-V2/V3 absorbed form: every query head attends to one
    shared latent KV head of ``kv_lora_rank + rope`` = 576 values), ``heads`` = the rank's
    query heads, ``kv_len`` = step + 1. No ``engine``: bf16 cache, variant ``decode_mla``,
    dtype ``bf16``; with ``engine``: its fp8-cache rows (``MLA_KV8_KERNEL``), variant
    ``decode_mla.<engine>``, dtype ``fp8``."""
    df = _read(path)
    df = df[(df.mla_dtype == "bfloat16")
            & (df.kv_cache_dtype == ("fp8" if engine else "bfloat16"))]
    kernel = MLA_KV8_KERNEL[engine] if engine else None
    df = _most_rows(df if kernel is None else df[df.kernel_source == kernel])
    if df.empty:
        return pd.DataFrame()
    return pd.DataFrame({
        "gpu": gpu, "op_kind": "attention",
        "variant": f"decode_mla.{engine}" if engine else "decode_mla",
        "dtype": "fp8" if engine else "bf16", "kernel": df.kernel_source.values,
        "source": source, "batch": df.batch_size.values, "heads": df.num_heads.values,
        "kv_heads": 1.0, "q_len": 1.0, "kv_len": df.step.values + 1, "head_dim": MLA_HEAD_DIM,
        "latency_s": df.latency.values * MS,
    })


def convert_nccl(path: str, gpu: str, source: str) -> pd.DataFrame:
    """NCCL collectives: message_size elements of nccl_dtype -> bytes; ms -> s."""
    df = _read(path)
    df = df[df.nccl_dtype == "half"]
    kind = df.op_name.replace({"alltoall": "all_to_all"})
    return pd.DataFrame({
        "gpu": gpu, "op_kind": kind.values, "variant": "", "dtype": "fp16",
        "kernel": "nccl " + df.version.astype(str).values, "source": source,
        "bytes": df.message_size.values * df.nccl_dtype.map(ELEMENT_BYTES).values,
        "group_size": df.num_gpus.values, "num_nodes": 1.0,
        "latency_s": df.latency.values * MS,
    })


def convert_moe(path: str, gpu: str, source: str) -> pd.DataFrame:
    """Whole MoE expert FFN (gate/up grouped GEMM + act + down) per GPU, bf16.

    ``n`` is the per-GPU intermediate size (inter_size / moe_tp), ``k`` the hidden size,
    ``num_experts`` the global expert count, ``group_size`` the EP degree.
    """
    df = _read(path)
    df = _most_rows(df[df.moe_dtype == "bfloat16"])
    parts = []
    for dist, variant in (("balanced", "moe_ffn"), ("power_law_1.01", "moe_ffn_skew")):
        sub = df[df.distribution == dist]
        if sub.empty:
            continue
        parts.append(_moe_frame(sub, gpu, source, variant, "bf16"))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def _moe_frame(sub: pd.DataFrame, gpu: str, source: str, variant: str,
               dtype: str) -> pd.DataFrame:
    """aiconfigurator MoE rows -> profile-DB grouped-GEMM rows (``n`` per GPU, ms -> s)."""
    return pd.DataFrame({
        "gpu": gpu, "op_kind": "grouped_gemm", "variant": variant, "dtype": dtype,
        "kernel": sub.kernel_source.values, "source": source,
        "tokens": sub.num_tokens.values, "top_k": sub.topk.values,
        "num_experts": sub.num_experts.values,
        "n": sub.inter_size.values / sub.moe_tp_size.values, "k": sub.hidden_size.values,
        "group_size": sub.moe_ep_size.values, "latency_s": sub.latency.values * MS,
    })


def convert_moe_quant(path: str, gpu: str, source: str, engine: str) -> pd.DataFrame:
    """Quantized MoE expert FFN rows of one engine (power-law 1.01 routing), columns as
    ``convert_moe``; variant ``moe_ffn_skew.<engine>``, dtype the table's ``moe_dtype``."""
    df = _read(path)
    df = df[df.distribution == "power_law_1.01"]
    parts = []
    for dt in QUANT_MOE_DTYPES:
        sub = df[df.moe_dtype == dt]
        preferred = PREFERRED_MOE_KERNEL.get((engine, dt))
        sub = (sub[sub.kernel_source == preferred]
               if preferred in set(sub.kernel_source) else _most_rows(sub))
        if sub.empty:
            continue
        parts.append(_moe_frame(sub, gpu, source, f"moe_ffn_skew.{engine}", dt))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


#: vLLM's Triton fused-MoE kernel (``fused_experts``: ``vllm_fused_moe`` in the legacy
#: collector's tables, ``*_triton_tritonexperts`` in the modular ones), for the formats it runs.
#: Launches that turn FlashInfer's and DeepGEMM's MoE off (``VLLM_USE_FLASHINFER_MOE_FP8=0``,
#: ``VLLM_MOE_USE_DEEP_GEMM=0``, ``--moe-backend triton``) run it on every GPU, but the vLLM
#: slot of ``query_versions.yaml`` holds only FlashInfer rows on Blackwell (B200 0.24.0:
#: ``vllm_fp8moe_flashinfer_trtllm_...``), so these rows come from the newest vLLM version
#: folder that measured the Triton kernel (B200: 0.22.0).
TRITON_MOE_DTYPES = ("fp8", "fp8_block")
TRITON_MOE_KERNEL = r"^vllm_fused_moe$|triton_tritonexperts$"


def convert_moe_triton(paths: list[str], gpu: str, peers: Path) -> pd.DataFrame:
    """vLLM's Triton fused-MoE rows (power-law 1.01 routing), columns as ``convert_moe``;
    variant ``moe_ffn_skew.vllm_triton``, dtype the table's ``moe_dtype``. ``paths`` are the
    GPU's vLLM MoE tables, newest version first: each dtype comes from the first table holding
    Triton rows of it."""
    parts, done = [], set()
    for path in paths:
        df = _read(path)
        df = df[(df.distribution == "power_law_1.01")
                & df.kernel_source.str.contains(TRITON_MOE_KERNEL)]
        for dt in TRITON_MOE_DTYPES:
            sub = _most_rows(df[df.moe_dtype == dt])
            if dt in done or sub.empty:
                continue
            done.add(dt)
            parts.append(_moe_frame(sub, gpu, f"{AIC} {_rel(path, peers)}",
                                    "moe_ffn_skew.vllm_triton", dt))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def convert_moe_marlin(paths: list[str], gpu: str, peers: Path) -> pd.DataFrame:
    """Marlin MoE rows of several tables (power-law 1.01 routing), columns as ``convert_moe``;
    variant ``moe_ffn_skew.marlin``, dtype ``w4a16_marlin``, each row's own table as source."""
    parts = []
    for path in paths:
        df = _read(path)
        df = df[(df.distribution == "power_law_1.01")
                & df.kernel_source.str.contains("marlin", case=False)]
        if len(df):
            parts.append(_moe_frame(df, gpu, f"{AIC} {_rel(path, peers)}",
                                    "moe_ffn_skew.marlin", "w4a16_marlin"))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def convert_deepep_ll(path: str, gpu: str, source: str, gpus_per_node: int) -> pd.DataFrame:
    """DeepEP low-latency dispatch / combine (``*_us`` microseconds -> s).

    ``bytes`` is the bf16 hidden state of the tokens sent (tokens x top_k x hidden x 2).
    """
    df = _read(path)
    parts = []
    for phase in ("dispatch", "combine"):
        parts.append(pd.DataFrame({
            "gpu": gpu, "op_kind": "all_to_all", "variant": phase, "dtype": "bf16",
            "kernel": "deepep_ll", "source": source,
            "tokens": df.num_token.values, "top_k": df.num_topk.values,
            "num_experts": df.num_experts.values,
            "bytes": df.num_token.values * df.num_topk.values * df.hidden_size.values * 2.0,
            "group_size": df.node_num.values * gpus_per_node, "num_nodes": df.node_num.values,
            "latency_s": df[f"{phase}_avg_t_us"].values * US,
        }))
    return pd.concat(parts, ignore_index=True)


#: aiconfigurator ``gdn_perf`` kernel -> our variant (``cost.selector`` linear attention).
GDN_KERNELS = {"chunk_gated_delta_rule": "prefill",
               "fused_recurrent_gated_delta_rule_packed_decode": "decode",
               "causal_conv1d_fn": "conv_prefill", "causal_conv1d_update": "conv_decode"}
#: Engine whose Gated DeltaNet tables are imported: SGLang, the engine of every Qwen3.5 silicon
#: row (its kernels are flash-linear-attention's Triton ones, which vLLM also runs for decode).
GDN_ENGINE = "sglang"


def convert_gdn(path: str, gpu: str, source: str) -> pd.DataFrame:
    """Gated DeltaNet kernels (``linear_attention/<engine>/<ver>/gdn_perf``): per-TP-rank key and
    value heads, ``batch_size`` sequences of ``seq_len`` tokens each (decode: ``seq_len`` 1);
    ms -> s. ``kv_heads`` holds the key heads, ``heads`` the value heads."""
    df = _read(path)
    df = df[df.kernel_source.isin(list(GDN_KERNELS))]
    return pd.DataFrame({
        "gpu": gpu, "op_kind": "linear_attention",
        "variant": df.kernel_source.map(GDN_KERNELS).values, "dtype": "bf16",
        "kernel": df.kernel_source.values, "source": source,
        "batch": df.batch_size.values, "q_len": df.seq_len.values,
        "heads": df.num_v_heads.values, "kv_heads": df.num_k_heads.values,
        "head_dim": df.head_k_dim.values, "tokens": df.num_tokens.values,
        "latency_s": df.latency.values * MS,
    })


#: aiconfigurator ``sparse_attention/sglang`` GLM-5 tables -> our ``sparse_attention`` variant:
#: the DSA lightning indexer's logits (DeepGEMM ``fp8_mqa_logits`` / ``fp8_paged_mqa_logits``)
#: and top-k (``fast_topk_transform_fused``), and the sparse MLA (FlashMLA
#: ``flash_mla_sparse_fwd``) of GLM-5 (zai-org/GLM-5: 64 MLA heads, 32 indexer heads of 128
#: dims, top-2048), SGLang's kernels (``cost.selector`` DSA lookup).
DSA_TABLES = {"glm5_mqa_logits_module_perf": "logits", "glm5_topk_module_perf": "topk",
              "glm5_dsa_attn_module_perf": "attn"}
#: The top-k table's ``score_mode`` imported: ``flat`` (every query's logits over all its keys).
DSA_TOPK_SCORE_MODE = "flat"


def convert_dsa(path: str, gpu: str, source: str, variant: str) -> pd.DataFrame:
    """GLM-5 DSA kernels (``sparse_attention/sglang/<ver>/glm5_*_module_perf``): ``batch_size``
    sequences of ``isl`` new tokens each after ``step`` cached tokens (decode rows: ``isl`` 1,
    ``step`` = the context), at ``num_heads`` MLA heads (64: TP 1); ms -> s. Stored as
    ``q_len`` = isl, ``kv_len`` = step + isl (keys after appending the new tokens, the traced
    ``kv_len``), ``heads`` = num_heads."""
    df = _read(path)
    if "score_mode" in df.columns:
        df = df[df.score_mode == DSA_TOPK_SCORE_MODE]
    # The top-k rows read 0 ms where a query has at most ``index_topk`` keys (all are kept,
    # no selection runs); the selector prices those as 0 instead of storing them.
    df = df[df.latency > 0]
    return pd.DataFrame({
        "gpu": gpu, "op_kind": "sparse_attention", "variant": variant,
        "dtype": df.kv_cache_dtype.map({"fp8_e4m3": "fp8"}).fillna("bf16").values,
        "kernel": df.kernel_source.values, "source": source,
        "batch": df.batch_size.values, "q_len": df.isl.values,
        "kv_len": (df.step + df.isl).values, "heads": df.num_heads.values,
        "latency_s": df.latency.values * MS,
    })


def import_aiconfigurator(peers: Path) -> list[pd.DataFrame]:
    out = []
    data = peers / "aiconfigurator-core" / "systems" / "data"
    for system in SYSTEMS:
        gpu = normalize_gpu(system)
        assert gpu is not None, system
        d = _vllm_dir(peers, system, "gemm")
        if d is not None:
            p = str(d / "gemm_perf.parquet")
            out.append(convert_gemm(p, gpu, f"{AIC} {_rel(p, peers)}"))
        for engine in BLOCK_FP8_GEMM_ENGINES:
            p = str(data / system / "gemm" / engine / _slot(engine, system) / "gemm_perf.parquet")
            if os.path.exists(p):
                out.append(convert_gemm_block(p, gpu, f"{AIC} {_rel(p, peers)}", engine))
        d = _vllm_dir(peers, system, "attention")
        if d is not None:
            for name, dec in (("context_attention_perf", False),
                              ("generation_attention_perf", True)):
                p = str(d / f"{name}.parquet")
                if os.path.exists(p):
                    out.append(convert_attention(p, gpu, f"{AIC} {_rel(p, peers)}", decode=dec))
        for engine in BACKEND_VERSION:
            for name, dec in (("context_attention_perf", False),
                              ("generation_attention_perf", True)):
                p = str(data / system / "attention" / engine / _slot(engine, system)
                        / f"{name}.parquet")
                if os.path.exists(p):
                    out.append(convert_attention(p, gpu, f"{AIC} {_rel(p, peers)}",
                                                 decode=dec, engine=engine))
        d = _vllm_dir(peers, system, "moe")
        if d is not None:
            p = str(d / "moe_perf.parquet")
            out.append(convert_moe(p, gpu, f"{AIC} {_rel(p, peers)}"))
        for engine in BACKEND_VERSION:
            p = str(data / system / "moe" / engine / _slot(engine, system) / "moe_perf.parquet")
            if os.path.exists(p):
                out.append(convert_moe_quant(p, gpu, f"{AIC} {_rel(p, peers)}", engine))
        p = str(data / system / "moe" / "sglang" / DEEPEP_SGLANG_VERSION
                / "wideep_generation_moe_perf.parquet")
        if os.path.exists(p):
            out.append(convert_moe_quant(p, gpu, f"{AIC} {_rel(p, peers)}", "sglang_deepep"))
        p = str(data / system / "moe" / "sglang" / DEEPEP_SGLANG_VERSION
                / "wideep_context_moe_perf.parquet")
        if os.path.exists(p):
            out.append(convert_moe_quant(p, gpu, f"{AIC} {_rel(p, peers)}",
                                         "sglang_deepep_normal"))
        p = str(data / system / "linear_attention" / GDN_ENGINE / _slot(GDN_ENGINE, system)
                / "gdn_perf.parquet")
        if os.path.exists(p):
            out.append(convert_gdn(p, gpu, f"{AIC} {_rel(p, peers)}"))
        for table, variant in DSA_TABLES.items():
            p = str(data / system / "sparse_attention" / "sglang" / _slot("sglang", system)
                    / f"{table}.parquet")
            if os.path.exists(p):
                out.append(convert_dsa(p, gpu, f"{AIC} {_rel(p, peers)}", variant))
        p = str(data / system / "mla" / "trtllm" / _slot("trtllm", system)
                / "generation_mla_perf.parquet")
        if os.path.exists(p):
            out.append(convert_mla_decode(p, gpu, f"{AIC} {_rel(p, peers)}"))
        for engine in MLA_KV8_KERNEL:
            p = str(data / system / "mla" / engine / _slot(engine, system)
                    / "generation_mla_perf.parquet")
            if os.path.exists(p):
                out.append(convert_mla_decode(p, gpu, f"{AIC} {_rel(p, peers)}", engine))
        vllm_tables = sorted(glob.glob(str(data / system / "moe" / "vllm" / "*"
                                           / "moe_perf.parquet")),
                             key=lambda p: tuple(int(x) for x in Path(p).parent.name.split(".")),
                             reverse=True)
        out.append(convert_moe_triton(vllm_tables, gpu, peers))
        marlin = []
        for engine, version in MARLIN_TABLES:
            p = str(data / system / "moe" / engine / (version or _slot(engine, system))
                    / "moe_perf.parquet")
            if os.path.exists(p) and p not in marlin:
                marlin.append(p)
        out.append(convert_moe_marlin(marlin, gpu, peers))
        nccl = sorted(glob.glob(str(data / system / "comm" / "nccl" / "*" / "nccl_perf.parquet")),
                      key=lambda p: tuple(int(x) for x in Path(p).parent.name.split(".")))
        if nccl:
            p = nccl[-1]
            out.append(convert_nccl(p, gpu, f"{AIC} {_rel(p, peers)}"))
        ll = sorted(glob.glob(str(data / system / "comm" / "sglang" / "0.5.12"
                                  / "wideep_deepep_ll_perf.parquet")))
        if ll:
            out.append(convert_deepep_ll(ll[0], gpu, f"{AIC} {_rel(ll[0], peers)}",
                                         GPUS_PER_NODE.get(system, 8)))
    return out


# ---------------------------------------------------------------------------- vidur
#: vidur model folders whose norms are LayerNorm, not RMSNorm.
LAYERNORM_MODELS = ("phi-2",)


def convert_vidur_mlp(path: str, gpu: str, source: str, *, with_gemm: bool) -> pd.DataFrame:
    """vidur per-op table (ms, per-TP shard shapes) -> norm / elementwise (/ gemm) rows.

    Norm: rows = tokens, cols = hidden. Elementwise ops also carry rows = tokens and cols =
    the per-token width (hidden, ffn/tp, (heads + kv_heads)/tp x head_dim): the kernels these
    rows time give each token one thread block, so at few tokens the width sets the time (a
    SiLU-and-mul at 1 token takes 15 us over 28,672 columns and 2 us over 3,584, Llama-2-70B at
    TP 1 and TP 8). Elementwise ``bytes`` = bytes moved in bf16:
    residual add reads 2 and writes 1 tensor of tokens x hidden; gated activation
    (SiLU(gate) * up) reads 2 and writes 1 tensor of tokens x ffn/tp (non-gated: 1 and 1);
    RoPE reads and writes q and k (tokens x (heads + kv_heads)/tp x head_dim).
    """
    df = _read(path)
    tp = df.num_tensor_parallel_workers.values.astype(float)
    tokens = df.num_tokens.values.astype(float)
    hidden = df.n_embd.values.astype(float)
    ffn = df.n_expanded_embd.values.astype(float) / tp
    head_dim = hidden / df.n_head.values
    heads = df.n_head.values / tp
    kv_heads = np.maximum(df.n_kv_head.values / tp, 1)
    gated = df.use_gated_mlp.astype(bool).values
    common = {"gpu": gpu, "dtype": "bf16", "kernel": "vidur sarathi-serve", "source": source}

    def ms(op: str) -> np.ndarray:
        col = f"time_stats.{op}.mean"  # absent for ops a model lacks (phi-2: one norm)
        return df[col].values * MS if col in df.columns else np.full(len(df), np.nan)
    parts = []
    # phi-2 normalizes with LayerNorm (its HF config: ``layer_norm_eps``, PhiModel's
    # nn.LayerNorm); every other vidur model with RMSNorm.
    norm = "layernorm" if any(m in Path(path).parts for m in LAYERNORM_MODELS) else "rmsnorm"
    for op in ("input_layernorm", "post_attention_layernorm"):
        parts.append(pd.DataFrame({**common, "op_kind": "norm", "variant": norm,
                                   "rows": tokens, "cols": hidden, "latency_s": ms(op)}))
    parts.append(pd.DataFrame({**common, "op_kind": "elementwise", "variant": "add",
                               "rows": tokens, "cols": hidden,
                               "numel": tokens * hidden, "bytes": 3 * 2 * tokens * hidden,
                               "latency_s": ms("add")}))
    act_numel = tokens * ffn
    parts.append(pd.DataFrame({**common, "op_kind": "elementwise", "variant": "act",
                               "rows": tokens, "cols": ffn, "numel": act_numel,
                               "bytes": np.where(gated, 3, 2) * 2 * act_numel,
                               "latency_s": ms("mlp_act")}))
    rope_width = (heads + kv_heads) * head_dim
    parts.append(pd.DataFrame({**common, "op_kind": "elementwise", "variant": "rope",
                               "rows": tokens, "cols": rope_width,
                               "numel": tokens * rope_width, "bytes": 2 * 2 * tokens * rope_width,
                               "latency_s": ms("attn_rope")}))
    if with_gemm:
        qkv = (heads + 2 * kv_heads) * head_dim
        up = ffn * np.where(gated, 2, 1)
        for op, n, k in (("attn_pre_proj", qkv, hidden), ("attn_post_proj", hidden, heads *
                         head_dim), ("mlp_up_proj", up, hidden), ("mlp_down_proj", hidden, ffn)):
            parts.append(pd.DataFrame({**common, "op_kind": "gemm", "variant": "",
                                       "m": tokens, "n": n, "k": k, "latency_s": ms(op)}))
    out = pd.concat(parts, ignore_index=True)
    return out[out.latency_s.notna() & (out.latency_s > 0)]


def convert_vidur_allreduce(path: str, gpu: str, source: str) -> pd.DataFrame:
    """vidur all_reduce.csv: ``size`` bytes, median ms -> s; rank-0 rows; cross-node when
    devices_per_node < num_workers."""
    df = _read(path)
    df = df[df["rank"] == 0]
    return pd.DataFrame({
        "gpu": gpu, "op_kind": "all_reduce", "variant": "", "dtype": "fp16",
        "kernel": "nccl (vidur)", "source": source, "bytes": df["size"].values.astype(float),
        "group_size": df.num_workers.values,
        "num_nodes": np.ceil(df.num_workers.values / df.devices_per_node.values),
        "latency_s": df["time_stats.all_reduce.median"].values * MS,
    })


def import_vidur(peers: Path) -> list[pd.DataFrame]:
    out = []
    root = peers / "vidur" / "data" / "profiling"
    for path in sorted(glob.glob(str(root / "compute" / "*" / "*" / "*" / "mlp.csv"))):
        sku = Path(path).parts[-4]
        gpu = normalize_gpu(sku)
        assert gpu is not None, sku
        rel = os.path.relpath(path, peers / "vidur")
        out.append(convert_vidur_mlp(path, gpu, f"{VIDUR} {rel}", with_gemm=(sku == "a40")))
    # Only the DGX tables (full NVLink); the "pairwise" boxes are a different topology.
    for node in ("a100_dgx", "h100_dgx"):
        path = root / "network" / node / "all_reduce.csv"
        if path.exists():
            gpu = normalize_gpu(node)
            rel = os.path.relpath(path, peers / "vidur")
            df = convert_vidur_allreduce(str(path), gpu, f"{VIDUR} {rel}")
            df["kernel"] = f"nccl (vidur {node})"
            out.append(df)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", default=str(REPO.parent / "shared" / "data" / "peers"))
    parser.add_argument("--out", default=str(REPO / "charon_search" / "data" / "profiles"))
    args = parser.parse_args(argv)
    peers = Path(args.peers)
    frames = [f for f in import_aiconfigurator(peers) + import_vidur(peers) if len(f)]
    rows = pd.concat(frames, ignore_index=True)
    # vidur all-reduce rows share (bytes, group_size, num_nodes) keys with aiconfigurator's
    # NCCL rows only by accident; keep both families apart through the variant.
    rows.loc[rows.kernel.str.startswith("nccl (vidur"), "variant"] = "vidur"
    out = Path(args.out)
    for sub in out.iterdir() if out.exists() else ():
        if sub.is_dir() and sub.name != "measured":  # measured/ holds our own profiler rows
            shutil.rmtree(sub)
    index = write_profile_db(rows, out)
    for lic in ("LICENSE.Apache-2.0.txt",):
        src = peers / "aiconfigurator-core" / lic
        if src.exists():
            shutil.copy(src, out / "LICENSE.aiconfigurator-core.Apache-2.0.txt")
    if (peers / "vidur" / "LICENSE").exists():
        shutil.copy(peers / "vidur" / "LICENSE", out / "LICENSE.vidur.MIT.txt")
    total = 0
    print(f"{'gpu':22s} {'op_kind':15s} {'rows':>8s} {'bytes':>10s}  variants")
    for t in index["tables"]:
        total += t["bytes"]
        print(f"{t['gpu']:22s} {t['op_kind']:15s} {t['rows']:8d} {t['bytes']:10d}  "
              f"{','.join(v or '-' for v in t['variants'])}")
    print(f"total rows {sum(t['rows'] for t in index['tables'])}, "
          f"{total / 1e6:.2f} MB, content hash {index['content_hash']}")
    dropped = sum(t["duplicates_dropped"] for t in index["tables"])
    print(f"{dropped} rows dropped that repeat a stored row's lookup key (the same shape "
          "measured in another model's table; the first is kept)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
