"""Per-(GPU, op kind) latency predictors trained on profile-DB rows.

Each model predicts ``log(latency / t_ref)`` where ``t_ref = max(flops / F, bytes / B)`` is a
data-driven roofline: ``F`` and ``B`` are the highest FLOP/s and byte/s the GPU reached on that
op kind in the profile rows. The tree model (scikit-learn ``HistGradientBoostingRegressor``) then
only learns the *efficiency* surface — wave quantization ``ceil(tiles / SMs)``, tile padding,
launch latency at small shapes, GQA/head-dim effects — which generalises to unseen shapes far
better than raw log-latency.

Model keys (``ModelKey``): (gpu, op_kind, family, dtype), family being ``prefill``/``decode`` for
attention, ``moe_ffn``/``moe_ffn_skew`` for grouped GEMMs (balanced / power-law routing; bf16)
and ``moe_ffn_skew.<engine>`` for an engine's quantized MoE kernels (power-law routing; dtype =
the kernel format ``fp8``, ``fp8_block``, ``w4a16_mxfp4`` or ``int4_wo``, whose weight bytes
``MOE_WEIGHT_BYTES`` the reference roofline uses), ``add``/``act``/``rope``/``""`` (all) for
elementwise ops and ``""`` otherwise. Trained lazily,
cached on disk under ``cache_dir("predictors")`` keyed by the DB content hash and
``HYPERPARAMS`` (file lock, so concurrent Ray workers train once) and loaded in well under a
second; inference runs on ``FlatForest`` (vectorized numpy copy of the trees).

``heldout_evaluation`` holds out whole shapes (``HELDOUT_GROUPS``) and reports MAPE of the
predictor and of the roofline backend on them (``charon-search profiles eval``).
"""

from __future__ import annotations

import hashlib
import json
import pickle
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from charon_search.cache import cache_dir
from charon_search.cost.profile_db import ProfileDB, ProfileTable

__all__ = [
    "HELDOUT_GROUPS",
    "HYPERPARAMS",
    "MOE_WEIGHT_BYTES",
    "NUM_SMS",
    "PREDICTED_KINDS",
    "FlatForest",
    "ModelKey",
    "OpPredictor",
    "PredictorStore",
    "feature_matrix",
    "heldout_evaluation",
    "heldout_split",
    "shape_flops_bytes",
]

#: Streaming multiprocessors per GPU key, for wave quantization (NVIDIA product specs /
#: whitepapers: A100 108, H100/H200 SXM 132, B200 148, L40S 142, RTX PRO 6000 188, A40 84).
#: ``GpuSpec.num_sms`` wins when the cluster's GPU provides it.
NUM_SMS: dict[str, int] = {
    "a100-sxm-80gb": 108, "h100-sxm-80gb": 132, "h200-sxm-141gb": 132, "b200-sxm-180gb": 148,
    "b300-sxm-288gb": 148, "gb200": 148, "gb300": 148, "l40s-48gb": 142,
    "rtx-pro-6000-96gb": 188, "a40-48gb": 84,
}
#: Stored bytes per expert weight element of the quantized MoE kernel formats (the profile rows'
#: dtype), used by their predictors' reference roofline: fp8 1 (+ one fp32 scale per 128x128
#: block, < 0.1 %); MXFP4 4 bits + one E8M0 scale byte per 32 elements (OCP Microscaling spec
#: v1.0); int4 weight-only 4 bits + one bf16 scale per group of 128 (aiconfigurator's
#: ``int4_wo`` / GPTQ-style group size). Marlin rows (``w4a16_marlin``) pool MXFP4 and int4
#: checkpoints and use MXFP4's bytes (int4's are 3 % lower). ``w4a8_mxfp4_mxfp8`` stores the
#: same MXFP4 weights (its MXFP8 activations are not expert weights). NVFP4: 4 bits + one FP8
#: E4M3 scale per 16 elements (NVIDIA's NVFP4 format, ModelOpt ``group_size`` 16).
MOE_WEIGHT_BYTES: dict[str, float] = {"fp8": 1.0, "fp8_block": 1.0,
                                      "w4a16_mxfp4": 0.5 + 1 / 32, "int4_wo": 0.5 + 2 / 128,
                                      "w4a16_marlin": 0.5 + 1 / 32,
                                      "w4a8_mxfp4_mxfp8": 0.5 + 1 / 32,
                                      "nvfp4": 0.5 + 1 / 16}
TILE = 128
"""GEMM output tile edge used for the wave-quantization feature."""

#: Op kinds with predictors and the families trained for each.
PREDICTED_KINDS: dict[str, tuple[str, ...]] = {
    "gemm": ("",),
    # Attention over an fp8 KV cache per engine (``decode.<engine>``, ``decode_mla.<engine>``,
    # ``prefill.<engine>``, dtype fp8).
    "attention": ("prefill", "decode", "decode_mla", "decode.vllm", "decode.sglang",
                  "decode.trtllm", "decode_mla.sglang", "decode_mla.trtllm", "prefill.vllm",
                  "prefill.sglang", "prefill.trtllm"),
    "norm": ("",),
    # Per-variant elementwise models (residual add, activation, RoPE) plus "" = all rows,
    # for elementwise nodes of other roles.
    "elementwise": ("add", "act", "rope", ""),
    # Balanced routing; power-law-skewed routing where no balanced rows exist (A100); each
    # engine's quantized MoE kernels and the Marlin MoE kernel (power-law routing).
    "grouped_gemm": ("moe_ffn", "moe_ffn_skew", "moe_ffn_skew.vllm", "moe_ffn_skew.sglang",
                     "moe_ffn_skew.trtllm", "moe_ffn_skew.marlin",
                     "moe_ffn_skew.sglang_deepep", "moe_ffn_skew.sglang_deepep_normal",
                     "moe_ffn_skew.vllm_triton"),
}

HYPERPARAMS: dict[str, Any] = {
    "model": "HistGradientBoostingRegressor",
    "max_iter": 400,
    "learning_rate": 0.08,
    "max_leaf_nodes": 48,
    "min_samples_leaf": 8,
    "l2_regularization": 1e-3,
    "max_depth": 10,
    # Median (L1) regression in log space where tables hold bimodal launch-latency noise
    # (fp8 GEMMs on Blackwell, vidur's microsecond-resolution norms and elementwise ops);
    # least squares elsewhere. Chosen on held-out shapes (profiles eval).
    "loss_by_kind": {"gemm": "absolute_error", "norm": "absolute_error",
                     "elementwise": "absolute_error", "attention": "squared_error",
                     "grouped_gemm": "squared_error"},
    "random_state": 0,
    "feature_version": 2,
}


@dataclass(frozen=True, slots=True)
class ModelKey:
    gpu: str
    op_kind: str
    family: str
    dtype: str

    def slug(self) -> str:
        return f"{self.gpu}.{self.op_kind}.{self.family or 'all'}.{self.dtype}"


def _col(cols: Mapping[str, Any], name: str, n: int, default: float = np.nan) -> np.ndarray:
    v = cols.get(name)
    if v is None:
        return np.full(n, default, dtype=np.float64)
    return np.broadcast_to(np.asarray(v, dtype=np.float64), (n,)).astype(np.float64)


def shape_flops_bytes(op_kind: str, cols: Mapping[str, Any], n: int
                      ) -> tuple[np.ndarray, np.ndarray]:
    """FLOPs and bytes of ``n`` shapes of ``op_kind`` (bf16 operands) from shape columns.

    These closed forms are used for both training rows and graph nodes so the reference
    roofline is consistent; graph nodes' own ``flops``/``bytes`` are not needed.
    """
    c = lambda name, d=np.nan: _col(cols, name, n, d)  # noqa: E731
    if op_kind == "gemm":
        m, nn, k = c("m"), c("n"), c("k")
        return 2 * m * nn * k, 2 * (m * k + k * nn + m * nn)
    if op_kind in ("attention", "attention_bwd"):
        b, h, kvh, q, kv, d = (c("batch"), c("heads"), c("kv_heads"), c("q_len"), c("kv_len"),
                               c("head_dim"))
        dv = c("v_head_dim")
        dv = np.where(np.isnan(dv), d, dv)
        causal = c("causal", 1.0)
        causal = np.where(np.isnan(causal), 1.0, causal)
        # Causal with q <= kv: query i sees kv - q + i + 1 keys.
        pairs = np.where(causal > 0, q * kv - q * (q - 1) / 2, q * kv)
        flops = 2 * b * h * pairs * (d + dv)
        nbytes = 2 * b * (q * h * d + kv * kvh * (d + dv) + q * h * dv)
        return flops, nbytes
    if op_kind == "norm":
        r, cc = c("rows"), c("cols")
        return 5 * r * cc, 2 * (2 * r * cc + cc)
    if op_kind == "elementwise":
        numel = c("numel")
        nbytes = c("bytes")
        nbytes = np.where(np.isnan(nbytes), 3 * 2 * numel, nbytes)
        return numel, nbytes
    if op_kind == "grouped_gemm":
        t, topk, e, nn, k = c("tokens"), c("top_k"), c("num_experts"), c("n"), c("k")
        ep = c("group_size", 1.0)
        ep = np.where(np.isnan(ep), 1.0, ep)
        rows = t * topk / ep
        local_experts = np.maximum(e / ep, 1)
        # Bytes per expert weight: 2 (bf16, every profile row) unless the shape says otherwise
        # (serving graphs of fp8 / fp4 checkpoints: 1 / 0.5), so a quantized expert FFN is
        # priced with the bytes it reads, not a bf16 model's.
        wb = c("weight_bytes", 2.0)
        wb = np.where(np.isnan(wb), 2.0, wb)
        # Only experts that received a token are read: with uniform routing an expert gets
        # Poisson(r) of the batch's rows, r = tokens * top_k / experts (the same in global
        # and EP-local terms), so a fraction 1 - exp(-r) of the weights moves. Fused-MoE
        # kernels (vLLM/SGLang Triton fused_moe, TensorRT-LLM/CUTLASS grouped GEMM) launch
        # tiles only for experts with rows (moe_align_block_size / expert offsets).
        touched = touched_expert_fraction(t, topk, e)
        # Gated expert FFN: gate+up [rows, k] x [k, 2n] and down [rows, n] x [n, k].
        flops = 2 * rows * 3 * nn * k
        nbytes = wb * local_experts * touched * 3 * nn * k + 2 * rows * (2 * k + 3 * nn)
        return flops, nbytes
    raise KeyError(op_kind)


def touched_expert_fraction(tokens: Any, top_k: Any, experts: Any) -> Any:
    """Expected share of a MoE layer's experts that receive at least one of ``tokens x top_k``
    rows under uniform routing: ``1 - e^(-r)``, ``r = tokens x top_k / experts`` (an expert
    gets Poisson(r) rows), the share of expert weights a fused-MoE kernel reads."""
    return 1.0 - np.exp(-(tokens * top_k / np.maximum(experts, 1)))


def feature_matrix(op_kind: str, cols: Mapping[str, Any], n: int, num_sms: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(X, flops, bytes) for ``n`` shapes. Features are logs of dims plus derived terms."""
    flops, nbytes = shape_flops_bytes(op_kind, cols, n)
    c = lambda name, d=np.nan: _col(cols, name, n, d)  # noqa: E731
    lg = lambda x: np.log2(np.maximum(x, 1e-9))  # noqa: E731
    base = [lg(flops), lg(nbytes), lg(flops) - lg(nbytes)]
    if op_kind == "gemm":
        m, nn, k = c("m"), c("n"), c("k")
        tiles = np.ceil(m / TILE) * np.ceil(nn / TILE)
        waves = np.ceil(tiles / num_sms)
        extra = [lg(m), lg(nn), lg(k), waves, tiles / (waves * num_sms),
                 m / (TILE * np.ceil(m / TILE)), nn / (TILE * np.ceil(nn / TILE)),
                 k % 64 == 0]
    elif op_kind in ("attention", "attention_bwd"):
        b, h, kvh, q, kv, d = (c("batch"), c("heads"), c("kv_heads"), c("q_len"), c("kv_len"),
                               c("head_dim"))
        ctas = b * h * np.ceil(q / TILE)
        extra = [lg(b), lg(h), lg(kvh), lg(q), lg(kv), d, h / np.maximum(kvh, 1),
                 np.ceil(ctas / num_sms), lg(b * kvh)]
    elif op_kind == "norm":
        r, cc = c("rows"), c("cols")
        extra = [lg(r), lg(cc), np.ceil(r / num_sms)]
    elif op_kind == "elementwise":
        numel = c("numel")
        # rows (tokens) and cols (per-token width) where known: a token-wise kernel with one
        # thread block per token runs as long as its widest row takes at small token counts,
        # so numel alone conflates 1 x 28,672 (15 us) with 8 x 3,584 (2 us). NaN elsewhere.
        extra = [lg(numel), nbytes / np.maximum(numel, 1), lg(c("rows")), lg(c("cols"))]
    elif op_kind == "grouped_gemm":
        t, topk, e, nn, k = c("tokens"), c("top_k"), c("num_experts"), c("n"), c("k")
        ep = c("group_size", 1.0)
        ep = np.where(np.isnan(ep), 1.0, ep)
        rows_per_expert = t * topk / np.maximum(e, 1)
        extra = [lg(t), topk, lg(e), lg(nn), lg(k), lg(ep), lg(rows_per_expert),
                 lg(np.maximum(e / ep, 1))]
    else:
        raise KeyError(op_kind)
    X = np.column_stack([np.asarray(v, dtype=np.float64) for v in base + extra])
    return X, flops, nbytes


class FlatForest:
    """A fitted ``HistGradientBoostingRegressor`` as padded numpy arrays.

    sklearn's ``predict`` walks its trees one by one in Python (about 10 ms for 400 trees even
    for one row); here every tree advances one level per numpy step, so a batch of shapes costs
    ~(tree depth) vectorized gathers (tens of microseconds). Exact same result.
    """

    def __init__(self, model: Any) -> None:
        trees = [p[0].nodes for p in model._predictors]
        width = max(len(t) for t in trees)
        shape = (len(trees), width)
        self.feature = np.zeros(shape, dtype=np.int64)
        self.threshold = np.zeros(shape)
        self.left = np.zeros(shape, dtype=np.int64)
        self.right = np.zeros(shape, dtype=np.int64)
        self.is_leaf = np.ones(shape, dtype=bool)
        self.value = np.zeros(shape)
        self.missing_left = np.zeros(shape, dtype=bool)
        for i, t in enumerate(trees):
            n = len(t)
            self.feature[i, :n] = t["feature_idx"]
            self.threshold[i, :n] = t["num_threshold"]
            self.left[i, :n] = t["left"]
            self.right[i, :n] = t["right"]
            self.is_leaf[i, :n] = t["is_leaf"].astype(bool)
            self.value[i, :n] = t["value"]
            self.missing_left[i, :n] = t["missing_go_to_left"].astype(bool)
        self.depth = int(max(int(t["depth"].max()) for t in trees))
        self.baseline = float(np.ravel(model._baseline_prediction)[0])
        self._flatten()

    def predict(self, X: np.ndarray) -> np.ndarray:
        n, t = X.shape[0], self.feature.shape[0]
        width = self.feature.shape[1]
        # Flat node index tree * width + node, so each step is a few 1-D ``take``s.
        base = np.arange(t, dtype=np.int64) * width
        feat, thr = self.feature.ravel(), self.threshold.ravel()
        node = np.broadcast_to(base, (n, t)).copy()
        rows = np.arange(n)[:, None] * X.shape[1]
        xflat = X.ravel()
        for _ in range(self.depth):
            leaf = self._leaf_flat.take(node)
            if leaf.all():
                break
            x = xflat.take(rows + feat.take(node))
            go_left = np.where(np.isnan(x), self._missing_flat.take(node), x <= thr.take(node))
            nxt = np.where(go_left, self._left_flat.take(node), self._right_flat.take(node))
            node = np.where(leaf, node, nxt)
        return self._value_flat.take(node).sum(axis=1) + self.baseline

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._flatten()

    def _flatten(self) -> None:
        t, width = self.feature.shape
        base = (np.arange(t, dtype=np.int64) * width)[:, None]
        self._left_flat = (self.left + base).ravel()
        self._right_flat = (self.right + base).ravel()
        self._leaf_flat = self.is_leaf.ravel()
        self._missing_flat = self.missing_left.ravel()
        self._value_flat = self.value.ravel()


@dataclass(kw_only=True)
class OpPredictor:
    """One trained model: predicts seconds for shapes of one (gpu, op kind, family, dtype)."""

    key: ModelKey
    model: Any
    peak_flops_per_s: float
    """Highest FLOP/s seen in the training rows (the data-driven roofline's compute roof)."""
    peak_bytes_per_s: float
    num_sms: int
    num_rows: int
    train_shape: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Column -> (min, max) seen in training (for reporting extrapolation)."""
    flat: FlatForest | None = None
    """Vectorized copy of ``model`` used by ``predict``."""

    def t_ref(self, flops: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
        return np.maximum(flops / self.peak_flops_per_s, nbytes / self.peak_bytes_per_s)

    def predict(self, cols: Mapping[str, Any], n: int | None = None) -> np.ndarray:
        """Seconds for ``n`` shapes given as shape columns (arrays or scalars)."""
        if n is None:
            n = max((np.size(v) for v in cols.values()), default=1)
        cols = _with_weight_bytes(self.key, cols)
        X, flops, nbytes = feature_matrix(self.key.op_kind, cols, n, self.num_sms)
        raw = self.flat.predict(X) if self.flat is not None else self.model.predict(X)
        return self.t_ref(flops, nbytes) * np.exp(raw)


def _with_weight_bytes(key: ModelKey, cols: Mapping[str, Any]) -> Mapping[str, Any]:
    """A quantized-MoE model's shapes always read its own format's weight bytes (training rows
    and queried nodes alike); bf16 models keep the caller's ``weight_bytes``."""
    wb = MOE_WEIGHT_BYTES.get(key.dtype) if key.op_kind == "grouped_gemm" else None
    return cols if wb is None else {**cols, "weight_bytes": wb}


def _make_model(hp: Mapping[str, Any], op_kind: str = "") -> Any:
    from sklearn.ensemble import HistGradientBoostingRegressor

    return HistGradientBoostingRegressor(
        loss=dict(hp.get("loss_by_kind", {})).get(op_kind, "squared_error"),
        max_iter=hp["max_iter"], learning_rate=hp["learning_rate"],
        max_leaf_nodes=hp["max_leaf_nodes"], min_samples_leaf=hp["min_samples_leaf"],
        l2_regularization=hp["l2_regularization"], random_state=hp["random_state"],
        max_depth=hp.get("max_depth"))


def rows_for(table: ProfileTable, family: str, dtype: str) -> ProfileTable:
    """The training rows of one model family (``moe_ffn`` takes balanced routing only;
    elementwise and GEMM family ``""`` take every variant of the dtype)."""
    return table.select(variant=family if _by_variant(table.op_kind, family) else None,
                        dtype=dtype)


def _by_variant(op_kind: str, family: str) -> bool:
    """Whether a model of ``op_kind`` trains on one variant's rows: attention and MoE always;
    elementwise ops and GEMMs when a family is named (an engine's own GEMM kernel rows, e.g.
    block-scaled fp8 ``gemm`` variant ``sglang``)."""
    return op_kind in ("attention", "grouped_gemm") or (
        op_kind in ("elementwise", "gemm") and family != "")


def train_predictor(key: ModelKey, rows: ProfileTable, *, num_sms: int,
                    hyperparams: Mapping[str, Any] = HYPERPARAMS) -> OpPredictor:
    """Fit one model on ``rows`` (all of them: callers split for held-out evaluation)."""
    n = len(rows)
    if n < 8:
        raise ValueError(f"{key.slug()}: {n} rows are too few to train a predictor")
    X, flops, nbytes = feature_matrix(key.op_kind, _with_weight_bytes(key, rows.columns), n,
                                      num_sms)
    lat = rows.columns["latency_s"]
    peak_f = float(np.max(flops / lat))
    peak_b = float(np.max(nbytes / lat))
    t_ref = np.maximum(flops / peak_f, nbytes / peak_b)
    model = _make_model(hyperparams, key.op_kind)
    model.fit(X, np.log(lat / t_ref))
    span = {c: (float(np.nanmin(v)), float(np.nanmax(v))) for c, v in rows.columns.items()
            if v.dtype != object and not np.all(np.isnan(v)) and c != "latency_s"}
    return OpPredictor(key=key, model=model, peak_flops_per_s=peak_f, peak_bytes_per_s=peak_b,
                       num_sms=num_sms, num_rows=n, train_shape=span, flat=FlatForest(model))


#: Version of an op kind's shape features (``shape_flops_bytes``); part of the disk-cache key
#: so a changed formula (or training rows) retrains that kind's predictors. grouped_gemm 2:
#: touched experts only; gemm 1: rows within one M tile at their envelope
#: (``profile_db.single_tile_envelope``).
FEATURE_VERSIONS: dict[str, int] = {"grouped_gemm": 2, "gemm": 1, "elementwise": 1}


def _hp_hash(hp: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(dict(hp), sort_keys=True).encode()).hexdigest()[:10]


class PredictorStore:
    """Lazily trains, caches (memory + disk) and serves ``OpPredictor``s for one profile DB.

    Args:
        db: the profile database.
        hyperparams: model hyper-parameters (part of the cache key).
        use_disk_cache: keep trained models under ``cache_dir("predictors")``.
    """

    def __init__(self, db: ProfileDB, *, hyperparams: Mapping[str, Any] = HYPERPARAMS,
                 use_disk_cache: bool = True) -> None:
        self.db = db
        self.hyperparams = dict(hyperparams)
        self.use_disk_cache = use_disk_cache
        self._models: dict[ModelKey, OpPredictor | None] = {}
        self._lock = threading.Lock()

    def available(self, gpu: str, op_kind: str, family: str, dtype: str) -> bool:
        """Whether the DB has rows for this model (from the index: no table is read)."""
        entry = self.db.entry(gpu, op_kind) if op_kind in PREDICTED_KINDS else None
        if entry is None or dtype not in entry.get("dtypes", ()):
            return False
        return not _by_variant(op_kind, family) or family in entry.get("variants", ())

    def get(self, gpu: str, op_kind: str, family: str, dtype: str, *,
            num_sms: int | None = None) -> OpPredictor | None:
        """The predictor for this key, training it on first use; None without data."""
        key = ModelKey(gpu, op_kind, family, dtype)
        with self._lock:
            if key in self._models:
                return self._models[key]
        pred = self._load_or_train(key, num_sms or NUM_SMS.get(gpu, 132))
        with self._lock:
            self._models[key] = pred
        return pred

    def _path(self, key: ModelKey):  # type: ignore[no-untyped-def]
        fv = FEATURE_VERSIONS.get(key.op_kind, 0)
        name = (f"{self.db.content_hash}-{_hp_hash(self.hyperparams)}-{key.slug()}"
                f"{f'-fv{fv}' if fv else ''}.pkl")
        return cache_dir("predictors") / name

    def _load_or_train(self, key: ModelKey, num_sms: int) -> OpPredictor | None:
        if not self.available(key.gpu, key.op_kind, key.family, key.dtype):
            return None
        if not self.use_disk_cache:
            return self._train(key, num_sms)
        from filelock import FileLock

        path = self._path(key)
        with FileLock(str(path) + ".lock"):
            if path.exists():
                try:
                    with path.open("rb") as f:
                        pred = pickle.load(f)
                    if isinstance(pred, OpPredictor) and pred.num_sms == num_sms:
                        if pred.flat is None:
                            pred.flat = FlatForest(pred.model)
                        return pred
                except Exception:  # a corrupt cache file is retrained
                    pass
            pred = self._train(key, num_sms)
            if pred is None:
                return None
            tmp = path.with_suffix(".tmp")
            with tmp.open("wb") as f:
                pickle.dump(pred, f, protocol=pickle.HIGHEST_PROTOCOL)
            tmp.replace(path)
            return pred

    def _train(self, key: ModelKey, num_sms: int) -> OpPredictor | None:
        tbl = self.db.table(key.gpu, key.op_kind)
        if tbl is None or len(rows_for(tbl, key.family, key.dtype)) < 8:
            return None
        return train_predictor(key, rows_for(tbl, key.family, key.dtype), num_sms=num_sms,
                               hyperparams=self.hyperparams)


# ---------------------------------------------------------------------------- evaluation
#: Columns whose value combination defines one held-out "shape" per op kind: whole (n, k)
#: weight shapes for GEMMs, whole head configurations for attention, whole hidden sizes for
#: norms, whole models (source tables) for elementwise, whole expert shapes for MoE.
HELDOUT_GROUPS: dict[str, tuple[str, ...]] = {
    "gemm": ("n", "k"),
    "attention": ("heads", "kv_heads", "head_dim"),
    "norm": ("cols",),
    "elementwise": ("source",),
    "grouped_gemm": ("n", "k", "num_experts", "top_k"),
}


def heldout_split(table: ProfileTable, *, fraction: float = 0.2, seed: int = 0
                  ) -> tuple[ProfileTable, ProfileTable]:
    """(train, test): every ``1/fraction``-th whole shape group (``HELDOUT_GROUPS``) is held out.

    Groups are ordered by a seeded permutation, so the split is deterministic.
    """
    names = HELDOUT_GROUPS[table.op_kind]
    keys = [tuple(str(v) for v in t) for t in zip(*(table.columns[c] for c in names))]
    uniq = sorted(set(keys))
    order = np.random.default_rng(seed).permutation(len(uniq))
    step = max(round(1 / fraction), 2)
    held = {uniq[i] for i in order[::step]}
    mask = np.fromiter((k in held for k in keys), dtype=bool, count=len(keys))

    def part(m: np.ndarray) -> ProfileTable:
        return ProfileTable(gpu=table.gpu, op_kind=table.op_kind,
                            columns={c: v[m] for c, v in table.columns.items()})

    return part(~mask), part(mask)


def synthetic_nodes(op_kind: str, cols: Mapping[str, np.ndarray], dtype: str) -> list[Any]:
    """IR ``Node``s with constant params/FLOPs/bytes for profile rows (roofline comparison)."""
    from charon_search.ir.graph import Node
    from charon_search.ir.ops import PARAMS_BY_KIND, OpKind
    from charon_search.ir.symbolic import Poly

    n = len(cols["latency_s"])
    flops, nbytes = shape_flops_bytes(op_kind, cols, n)
    kind = OpKind(op_kind)
    names = [p for p in PARAMS_BY_KIND[kind] if p in cols]
    out = []
    for i in range(n):
        params = {p: Poly.const(float(cols[p][i])) for p in names if not np.isnan(cols[p][i])}
        if op_kind == "attention":
            params.setdefault("v_head_dim", params["head_dim"])
            params.setdefault("causal", Poly.const(1.0))
        out.append(Node(id=i, name=f"{op_kind}{i}", kind=kind, params=params, dtype=dtype,
                        flops=Poly.const(float(flops[i])), bytes_read=Poly.const(float(
                            nbytes[i]) * 2 / 3), bytes_written=Poly.const(float(nbytes[i]) / 3)))
    return out


#: Profile dtype of a quantized MoE kernel -> the tensor-core dtype it computes in (the roofline's
#: peak): block-scaled fp8 runs fp8 MMAs; W4A16 kernels dequantize 4-bit weights to bf16; MXFP4
#: weights with MXFP8 activations run Blackwell's mixed-precision MMAs at the fp8 rate; NVFP4
#: quantizes the activations too and runs FP4 MMAs.
ROOFLINE_COMPUTE_DTYPE = {"fp8_block": "fp8", "w4a16_mxfp4": "bf16", "int4_wo": "bf16",
                          "w4a16_marlin": "bf16", "w4a8_mxfp4_mxfp8": "fp8", "nvfp4": "fp4"}


def roofline_seconds(op_kind: str, cols: Mapping[str, np.ndarray], gpu_key: str, dtype: str
                     ) -> np.ndarray | None:
    """Roofline-backend seconds for profile rows, or None without a roofline/GPU spec."""
    dtype = ROOFLINE_COMPUTE_DTYPE.get(dtype, dtype)
    try:
        import charon_search.cost.roofline  # noqa: F401 - registers "roofline"
        from charon_search.cost.base import COST_BACKENDS, ShapePoint
        from charon_search.hardware.loader import load_gpu

        gpu = load_gpu(gpu_key)
        backend = COST_BACKENDS.get("roofline")()
    except Exception:
        return None
    point = ShapePoint(b=1.0, s=1.0, c=1.0)
    out = []
    for node in synthetic_nodes(op_kind, cols, dtype):
        res = backend.cost(node, point, gpu)
        out.append(np.nan if res is None else res.duration_s)
    return np.asarray(out)


def heldout_evaluation(db: ProfileDB, *, gpus: list[str] | None = None,
                       kinds: list[str] | None = None, dtypes: list[str] | None = None,
                       fraction: float = 0.2,
                       max_train_rows: int | None = None,
                       hyperparams: Mapping[str, Any] = HYPERPARAMS,
                       with_roofline: bool = True) -> list[dict[str, Any]]:
    """Held-out-shape MAPE per (gpu, op kind, family, dtype): predictor vs roofline.

    Returns rows ``{"gpu", "op_kind", "family", "dtype", "num_train", "num_heldout",
    "mape_predictor", "mape_roofline"}`` (MAPE as ratios; roofline NaN when unavailable).
    ``max_train_rows`` subsamples training rows (deterministically) for quick runs.
    """
    rows = []
    for gpu in gpus or db.gpus():
        for kind, families in PREDICTED_KINDS.items():
            if (kinds and kind not in kinds) or not db.has(gpu, kind):
                continue
            table = db.table(gpu, kind)
            assert table is not None
            present = sorted(set(table.columns["dtype"].tolist()))
            for family in families:
                for dtype in (d for d in present if not dtypes or d in dtypes):
                    sub = rows_for(table, family, dtype)
                    if len(sub) < 50:
                        continue
                    train, test = heldout_split(sub, fraction=fraction)
                    if max_train_rows and len(train) > max_train_rows:
                        keep = np.random.default_rng(0).permutation(len(train))[:max_train_rows]
                        keep.sort()
                        train = ProfileTable(gpu=gpu, op_kind=kind, columns={
                            c: v[keep] for c, v in train.columns.items()})
                    if len(test) == 0 or len(train) < 8:
                        continue
                    key = ModelKey(gpu, kind, family, dtype)
                    pred = train_predictor(key, train, num_sms=NUM_SMS.get(gpu, 132),
                                           hyperparams=hyperparams)
                    y = test.columns["latency_s"]
                    mape_p = float(np.mean(np.abs(pred.predict(test.columns, len(test)) - y)
                                           / y))
                    mape_r = float("nan")
                    if with_roofline:
                        roof = roofline_seconds(kind, test.columns, gpu, dtype)
                        if roof is not None:
                            mape_r = float(np.nanmean(np.abs(roof - y) / y))
                    rows.append({"gpu": gpu, "op_kind": kind, "family": family, "dtype": dtype,
                                 "num_train": len(train), "num_heldout": len(test),
                                 "mape_predictor": mape_p, "mape_roofline": mape_r})
    return rows
