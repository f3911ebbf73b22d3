"""The profile database: measured op latencies, one Parquet file per (GPU, op kind).

Layout on disk (``charon_search/data/profiles/`` for the shipped DB, any folder for a user DB)::

    index.json                      {"version", "content_hash", "tables": [{gpu, op_kind, rows,
                                      file, sources}]}
    <gpu>/<op_kind>.parquet         rows of one GPU and op kind, sorted by (variant, dtype, shape)

A query reads exactly one file (never all rows), and an exact-shape lookup is a dict hit built
on first use per (gpu, op_kind, variant, dtype).

Columns (``COLUMNS``): ``gpu`` (normalized GPU key, ``GPU_KEYS``), ``op_kind`` (``ir.ops.OpKind``
value), ``variant`` (``prefill``/``decode`` for attention — decode rows have ``q_len == 1`` —,
``moe_ffn`` for a whole MoE expert FFN, ``prefill``/``decode``/``conv_prefill``/``conv_decode``
for Gated DeltaNet kernels (``linear_attention``: ``heads`` = value heads, ``kv_heads`` = key
heads), ``logits``/``topk``/``attn`` for DeepSeek Sparse Attention kernels
(``sparse_attention``: the indexer's logits and top-k, the sparse MLA; ``heads`` = MLA heads,
``kv_len`` = keys after the new tokens), ``dispatch``/``combine`` for EP all-to-all, ``""``
otherwise), ``dtype`` (IR dtype key: ``bf16``, ``fp8``...), ``kernel`` (kernel/implementation
measured), ``source`` (which table it was converted from), ``latency_s`` (SI seconds) and the
shape columns named as in ``ir.ops.PARAMS_BY_KIND`` (NaN where a kind lacks the parameter).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from charon_search.errors import ConfigError

__all__ = [
    "COLUMNS",
    "GPU_KEYS",
    "SHAPE_COLUMNS",
    "SHAPE_KEYS",
    "ProfileDB",
    "ProfileTable",
    "default_profile_db",
    "normalize_gpu",
    "subset_profile_db",
    "write_profile_db",
]

#: Shape columns (float64, NaN when the op kind lacks the parameter).
SHAPE_COLUMNS: tuple[str, ...] = (
    "m", "n", "k", "batch", "heads", "kv_heads", "q_len", "kv_len", "head_dim",
    "tokens", "top_k", "num_experts", "rows", "cols", "numel", "bytes", "group_size",
    "num_nodes",
)
STRING_COLUMNS: tuple[str, ...] = ("gpu", "op_kind", "variant", "dtype", "kernel", "source")
COLUMNS: tuple[str, ...] = (*STRING_COLUMNS, *SHAPE_COLUMNS, "latency_s")

#: Shape columns that make up the exact-lookup key of each stored op kind (in this order).
SHAPE_KEYS: dict[str, tuple[str, ...]] = {
    "gemm": ("m", "n", "k"),
    "attention": ("batch", "heads", "kv_heads", "q_len", "kv_len", "head_dim"),
    "linear_attention": ("batch", "heads", "kv_heads", "q_len", "head_dim"),
    "sparse_attention": ("batch", "heads", "q_len", "kv_len"),
    "norm": ("rows", "cols"),
    "elementwise": ("numel", "bytes"),
    "grouped_gemm": ("tokens", "top_k", "num_experts", "n", "k", "group_size"),
    "all_reduce": ("bytes", "group_size", "num_nodes"),
    "all_gather": ("bytes", "group_size", "num_nodes"),
    "reduce_scatter": ("bytes", "group_size", "num_nodes"),
    "all_to_all": ("bytes", "group_size", "num_nodes", "tokens", "top_k", "num_experts"),
    "send_recv": ("bytes", "group_size", "num_nodes"),
}

#: Feature columns beyond the lookup key that tell stored rows apart (``write_profile_db``).
#: Empty for now: keeping every width of an elementwise size (``{"elementwise": ("rows",
#: "cols")}``, A100 4,610 -> 12,463 rows) was checked in session 58 and moved Megatron's
#: unfused 22B layer rows 3 points slower (docs/calibration/README.md, session 58), past their
#: test bound, until Megatron's fused elementwise kernels are modelled.
DEDUP_EXTRA: dict[str, tuple[str, ...]] = {}

#: Normalized GPU key -> spellings used by the measurement sources (aiconfigurator system
#: folder names, vidur SKU folders, ``nvidia-smi`` device names).
GPU_KEYS: dict[str, tuple[str, ...]] = {
    "a100-sxm-80gb": ("a100_sxm", "a100", "a100_dgx", "nvidia a100-sxm4-80gb", "a100-sxm4-80gb"),
    "h100-sxm-80gb": ("h100_sxm", "h100", "h100_dgx", "nvidia h100 80gb hbm3"),
    "h200-sxm-141gb": ("h200_sxm", "h200", "nvidia h200"),
    "b200-sxm-180gb": ("b200_sxm", "b200", "nvidia b200"),
    "b300-sxm-288gb": ("b300_sxm", "b300", "nvidia b300 sxm6 ac"),
    "gb200": ("gb200_nvl72", "nvidia gb200"),
    "gb300": ("gb300_nvl72", "nvidia gb300"),
    "l40s-48gb": ("l40s", "nvidia l40s"),
    "rtx-pro-6000-96gb": ("rtx_pro_6000_server", "nvidia rtx pro 6000 blackwell server edition"),
    "a40-48gb": ("a40", "nvidia a40"),
}
_ALIAS_TO_KEY = {a: k for k, aliases in GPU_KEYS.items() for a in (k, *aliases)}


def _canon(name: str) -> str:
    return name.strip().lower()


def normalize_gpu(name: str) -> str | None:
    """The DB key for a GPU name or alias, or None if the DB has no key for it.

    Tries the package's hardware resolver first (``charon_search.hardware.resolve_gpu_name``,
    engineer B's), then the alias table of the measurement sources.
    """
    n = _canon(name)
    if n in _ALIAS_TO_KEY:
        return _ALIAS_TO_KEY[n]
    alt = n.replace("_", "-")
    if alt in _ALIAS_TO_KEY:
        return _ALIAS_TO_KEY[alt]
    try:  # the hardware package may know more aliases (e.g. "H100 SXM5")
        from charon_search.hardware.loader import resolve_gpu_name

        resolved = _canon(resolve_gpu_name(name))
        return _ALIAS_TO_KEY.get(resolved, _ALIAS_TO_KEY.get(resolved.replace("_", "-")))
    except Exception:  # unknown to the resolver too, or resolver not present
        return None


def _shape_key(values: Iterable[float]) -> tuple[float, ...]:
    return tuple(float(v) for v in values)


#: Rows of a GEMM's ``m`` dimension that one output tile spans on Hopper and Blackwell tensor
#: cores (the smallest M tile of CUTLASS / cuBLASLt warpgroup and tcgen05 kernels is 64 rows).
GEMM_SINGLE_TILE_M = 64


def single_tile_envelope(cols: Mapping[str, np.ndarray]) -> np.ndarray:
    """GEMM latencies with each ``m <= GEMM_SINGLE_TILE_M`` row priced at the fastest row of
    the same (variant, dtype, n, k) whose ``m`` lies between its own and the tile's.

    Below one M tile every ``m`` does the same work (the tile is padded, and the weights are
    read once), so a kernel's time cannot rise as ``m`` falls. Measured rows sometimes do:
    aiconfigurator-core's fp8 rows on B200, B300, GB200 and GB300 (vLLM
    ``CutlassFP8ScaledMMLinearKernel``) take a median 2.5-2.9x longer at ``m = 1`` than the
    fastest ``m`` of 2-64 at the same ``n, k`` (480 shapes per GPU; every other table is within
    1.07x there), a kernel-selection effect at ``m = 1`` that the engines' own decode GEMMs
    (TensorRT-LLM, SGLang, padded CUDA-graph batches) do not show. Rows above the tile keep
    their measured time.
    """
    lat = np.asarray(cols["latency_s"], dtype=np.float64).copy()
    m = np.asarray(cols["m"], dtype=np.float64)
    small = np.flatnonzero(m <= GEMM_SINGLE_TILE_M)
    if small.size == 0:
        return lat
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i in small.tolist():
        key = (cols["variant"][i], cols["dtype"][i], float(cols["n"][i]), float(cols["k"][i]))
        groups.setdefault(key, []).append(i)
    for idx in groups.values():
        idx.sort(key=lambda i: -m[i])  # largest m first: running minimum towards m = 1
        best = np.inf
        for i in idx:
            best = min(best, lat[i])
            lat[i] = best
    return lat


@dataclass(frozen=True, kw_only=True)
class ProfileTable:
    """All rows of one (gpu, op_kind), as numpy columns."""

    gpu: str
    op_kind: str
    columns: Mapping[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.columns["latency_s"])

    def select(self, *, variant: str | None = None, dtype: str | None = None) -> ProfileTable:
        mask = np.ones(len(self), dtype=bool)
        if variant is not None:
            mask &= self.columns["variant"] == variant
        if dtype is not None:
            mask &= self.columns["dtype"] == dtype
        return ProfileTable(gpu=self.gpu, op_kind=self.op_kind,
                            columns={c: v[mask] for c, v in self.columns.items()})

    def to_pandas(self) -> Any:
        import pandas as pd

        return pd.DataFrame(dict(self.columns))


class ProfileDB:
    """Read access to a profile-DB folder. Thread-safe; tables are loaded lazily and kept.

    Args:
        root: the folder holding ``index.json`` and ``<gpu>/<op_kind>.parquet`` files.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        index_path = self.root / "index.json"
        if not index_path.exists():
            raise ConfigError(f"profile DB {self.root}: missing index.json")
        self.index: dict[str, Any] = json.loads(index_path.read_text())
        self._tables: dict[tuple[str, str], ProfileTable] = {}
        self._lookup: dict[tuple[str, str, str, str], dict[tuple[float, ...], float]] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ metadata
    @property
    def content_hash(self) -> str:
        """Hash of every table file (stored in the index when the DB was written)."""
        return str(self.index["content_hash"])

    def gpus(self) -> list[str]:
        return sorted({t["gpu"] for t in self.index["tables"]})

    def op_kinds(self, gpu: str | None = None) -> list[str]:
        return sorted({t["op_kind"] for t in self.index["tables"]
                       if gpu is None or t["gpu"] == gpu})

    def has(self, gpu: str, op_kind: str) -> bool:
        return self.entry(gpu, op_kind) is not None

    def entry(self, gpu: str, op_kind: str) -> dict[str, Any] | None:
        """The index entry (rows, dtypes, variants, kernels, sources) of one table."""
        return next((t for t in self.index["tables"]
                     if t["gpu"] == gpu and t["op_kind"] == op_kind), None)

    def summary(self) -> list[dict[str, Any]]:
        """One dict per stored table: gpu, op_kind, rows, bytes, sources."""
        return [dict(t) for t in self.index["tables"]]

    def resolve_gpu(self, *names: str) -> str | None:
        """The first of ``names`` (GPU name, then aliases) that maps to a GPU in this DB."""
        present = set(self.gpus())
        for name in names:
            key = normalize_gpu(name)
            if key in present:
                return key
        return None

    # ------------------------------------------------------------------ rows
    def table(self, gpu: str, op_kind: str) -> ProfileTable | None:
        """All rows of (gpu, op_kind), reading only that one file; None when absent."""
        key = (gpu, op_kind)
        with self._lock:
            if key in self._tables:
                return self._tables[key]
        entry = next((t for t in self.index["tables"]
                      if t["gpu"] == gpu and t["op_kind"] == op_kind), None)
        if entry is None:
            return None
        # ParquetFile (not read_table: that imports pyarrow.dataset and pandas, ~1-3 s) with
        # dictionary-decoded string columns, expanded through numpy without pandas.
        arrow = pq.ParquetFile(self.root / entry["file"],
                               read_dictionary=list(STRING_COLUMNS)).read()
        cols = {}
        for name in arrow.column_names:
            col = arrow.column(name)
            if name in STRING_COLUMNS:
                arr = col.combine_chunks()
                if pa.types.is_dictionary(arr.type):
                    words = np.asarray(arr.dictionary.to_pylist(), dtype=object)
                    cols[name] = words[arr.indices.to_numpy(zero_copy_only=False)]
                else:
                    cols[name] = np.asarray(arr.to_pylist(), dtype=object)
            else:
                cols[name] = col.to_numpy(zero_copy_only=False).astype(np.float64)
        if op_kind == "gemm":
            cols["latency_s"] = single_tile_envelope(cols)
        tbl = ProfileTable(gpu=gpu, op_kind=op_kind, columns=cols)
        with self._lock:
            self._tables[key] = tbl
        return tbl

    def exact(self, gpu: str, op_kind: str, variant: str, dtype: str,
              shape: Mapping[str, float]) -> float | None:
        """The measured latency (s) of exactly this shape, or None. A dict hit after first use.

        ``shape`` holds the ``SHAPE_KEYS[op_kind]`` values; absent keys are treated as NaN and
        never match a stored number.
        """
        lk = (gpu, op_kind, variant, dtype)
        lookup = self._lookup.get(lk)
        if lookup is None:
            lookup = self._build_lookup(*lk)
        names = SHAPE_KEYS.get(op_kind, ())
        return lookup.get(_shape_key(shape.get(n, np.nan) for n in names))

    def _build_lookup(self, gpu: str, op_kind: str, variant: str,
                      dtype: str) -> dict[tuple[float, ...], float]:
        tbl = self.table(gpu, op_kind)
        out: dict[tuple[float, ...], float] = {}
        if tbl is not None:
            sub = tbl.select(variant=variant, dtype=dtype)
            names = SHAPE_KEYS.get(op_kind, ())
            keys = zip(*(sub.columns[n].tolist() for n in names))
            # Keep the first row on duplicates (write_profile_db stores none).
            for key, lat in zip(keys, sub.columns["latency_s"].tolist()):
                out.setdefault(key, lat)
        with self._lock:
            self._lookup[(gpu, op_kind, variant, dtype)] = out
        return out



def write_profile_db(rows: Any, root: str | Path, *, extra_index: Mapping[str, Any] | None = None
                     ) -> dict[str, Any]:
    """Write ``rows`` (a pandas DataFrame with ``COLUMNS``) as a profile DB under ``root``.

    Missing shape columns are filled with NaN; unknown columns raise. Existing table files of
    the same (gpu, op_kind) are replaced. Returns the index written.
    """
    import pandas as pd

    df = pd.DataFrame(rows).copy()
    unknown = set(df.columns) - set(COLUMNS)
    if unknown:
        raise ConfigError(f"profile rows: unknown columns {sorted(unknown)}; allowed: {COLUMNS}")
    for c in COLUMNS:
        if c not in df.columns:
            df[c] = "" if c in STRING_COLUMNS else np.nan
    for c in STRING_COLUMNS:
        df[c] = df[c].fillna("").astype(str)
    for c in (*SHAPE_COLUMNS, "latency_s"):
        df[c] = df[c].astype(np.float64)
    if (df["latency_s"] <= 0).any() or df["latency_s"].isna().any():
        raise ConfigError("profile rows: `latency_s > 0` must hold for every row")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tables = []
    hasher = hashlib.sha256()
    for (gpu, kind), part in sorted(df.groupby(["gpu", "op_kind"], sort=True)):
        keys = ["variant", "dtype", *SHAPE_KEYS.get(kind, ())]
        part = part.sort_values(keys, kind="stable")
        # Rows that repeat a lookup key (and ``DEDUP_EXTRA``) are the same shape measured in
        # another model's table: the first is kept, and the count is recorded.
        dedup_keys = ["variant", "dtype", *SHAPE_KEYS.get(kind, ()), *DEDUP_EXTRA.get(kind, ())]
        before = len(part)
        part = part.drop_duplicates(subset=dedup_keys, keep="first")
        rel = f"{gpu}/{kind}.parquet"
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        arrow = pa.Table.from_pandas(part[list(COLUMNS)], preserve_index=False)
        pq.write_table(arrow, path, compression="zstd", row_group_size=1 << 17,
                       use_dictionary=list(STRING_COLUMNS))
        data = path.read_bytes()
        hasher.update(rel.encode())
        hasher.update(data)
        tables.append({"gpu": gpu, "op_kind": kind, "rows": len(part),
                       "duplicates_dropped": before - len(part), "file": rel,
                       "bytes": len(data),
                       "dtypes": sorted(part["dtype"].unique().tolist()),
                       "variants": sorted(part["variant"].unique().tolist()),
                       "kernels": sorted(part["kernel"].unique().tolist()),
                       "sources": sorted(part["source"].unique().tolist())})
    index = {"version": 1, "content_hash": hasher.hexdigest()[:16], "tables": tables,
             **dict(extra_index or {})}
    (root / "index.json").write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    return index


def shipped_profile_dir() -> Path:
    return Path(__file__).resolve().parent.parent / "data" / "profiles"


@cache
def default_profile_db() -> ProfileDB | None:
    """The shipped profile DB (package data), or None if the package was built without it."""
    root = shipped_profile_dir()
    if not (root / "index.json").exists():
        return None
    return ProfileDB(root)


def subset_profile_db(db: ProfileDB, root: str | Path, *, gpus: Iterable[str],
                      op_kinds: Iterable[str], every: int | Mapping[str, int] = 1,
                      keep: Mapping[str, Iterable[Mapping[str, float]]] | None = None
                      ) -> ProfileDB:
    """Write every ``every``-th row of some (gpu, op kind) tables of ``db`` to a new DB.

    ``every`` may be a mapping op kind -> stride (absent kinds: 1).
    ``keep`` maps op kind -> shapes (``SHAPE_KEYS`` dicts) always kept (e.g. a row a test
    checks by value). Used for small test databases and per-cluster slices.
    """
    import pandas as pd

    frames = []
    for gpu in gpus:
        for kind in op_kinds:
            tbl = db.table(gpu, kind)
            if tbl is None:
                continue
            df = tbl.to_pandas()
            mask = np.zeros(len(df), dtype=bool)
            stride = every.get(kind, 1) if isinstance(every, Mapping) else every
            mask[::stride] = True
            for shape in (keep or {}).get(kind, ()):
                m = np.ones(len(df), dtype=bool)
                for col, val in shape.items():
                    m &= df[col].to_numpy() == val
                mask |= m
            frames.append(df[mask])
    if not frames:
        raise ConfigError(f"subset_profile_db: no rows for gpus {list(gpus)} "
                          f"and op kinds {list(op_kinds)}")
    write_profile_db(pd.concat(frames, ignore_index=True), root)
    return ProfileDB(root)
