"""Merge ``--train-attention`` runs into one measured training-attention table.

``python -m charon_search.profiling.merge_train_attention OUT.parquet RUN [RUN ...]``: each RUN
is a ``train_attention.parquet`` or a ``charon-search profile`` output folder holding one.
The merged file is what ``sim.train_attention`` reads
(``data/profiles/measured/<gpu>.train-attention-<backend>.parquet``): the checks below are the
ones that step used to need by hand. Refused (exit 2, nothing written): rows of more than one
GPU or SDPA backend, a row without ``v_head_dim`` or ``latency_s > 0``, or a shape measured
twice (forward and backward rows are keyed apart by ``op_kind``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from charon_search.errors import ConfigError
from charon_search.profiling.runner import atomic_write

__all__ = ["TRAIN_ATTENTION_KEY", "main", "merge_train_attention"]

#: The columns that identify one measured training-attention shape.
TRAIN_ATTENTION_KEY = ("op_kind", "variant", "dtype", "batch", "heads", "kv_heads", "q_len",
                       "kv_len", "head_dim", "v_head_dim")
_COLUMNS = ("gpu", "op_kind", "variant", "dtype", "kernel", "source", "latency_s", "batch",
            "head_dim", "heads", "kv_heads", "kv_len", "q_len", "v_head_dim")


def _backend(kernel: str) -> str:
    return next((t for t in kernel.split() if t.startswith("sdpa:")), "sdpa:default")


def merge_train_attention(frames: Sequence[Any]) -> Any:
    """One DataFrame of ``frames`` (pandas), checked; raises ``ConfigError``."""
    import pandas as pd

    if not frames:
        raise ConfigError("no training-attention rows to merge")
    df = pd.concat(list(frames), ignore_index=True)
    missing = [c for c in _COLUMNS if c not in df.columns]
    if missing:
        raise ConfigError(f"training-attention rows lack columns {missing}")
    df = df[list(_COLUMNS)]
    if set(df.op_kind) - {"attention", "attention_bwd"}:
        raise ConfigError(f"not training-attention rows: op kinds {sorted(set(df.op_kind))}")
    gpus = sorted(set(df.gpu))
    if len(gpus) != 1:
        raise ConfigError(f"rows of several GPUs: {gpus}")
    backends = sorted({_backend(k) for k in df.kernel})
    if len(backends) != 1:
        raise ConfigError(f"rows of several SDPA backends: {backends}; merge each apart")
    nulls = df[list(TRAIN_ATTENTION_KEY)].isna().any(axis=1)
    if nulls.any():
        raise ConfigError(f"{int(nulls.sum())} rows lack a shape value (v_head_dim?)")
    if not (df.latency_s > 0).all():
        raise ConfigError("`latency_s > 0` must hold for every row")
    dup = df.duplicated(subset=list(TRAIN_ATTENTION_KEY), keep=False)
    if dup.any():
        first = df[dup].iloc[0]
        raise ConfigError(f"{int(dup.sum())} rows repeat a shape, e.g. "
                          + ", ".join(f"{k}={first[k]}" for k in TRAIN_ATTENTION_KEY))
    return df.sort_values(list(TRAIN_ATTENTION_KEY), kind="stable").reset_index(drop=True)


def main(argv: Sequence[str] | None = None) -> int:
    import pandas as pd

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="merged .parquet to write")
    ap.add_argument("runs", nargs="+", type=Path,
                    help="train_attention.parquet files or profile output folders")
    args = ap.parse_args(argv)
    try:
        frames = []
        for run in args.runs:
            path = run / "train_attention.parquet" if run.is_dir() else run
            if not path.is_file():
                raise ConfigError(f"{path}: no such file")
            frames.append(pd.read_parquet(path))
        df = merge_train_attention(frames)
    except ConfigError as e:
        print(f"merge_train_attention: error: {e}", file=sys.stderr)
        return 2
    atomic_write(args.out, lambda tmp: df.to_parquet(tmp, index=False))
    print(f"wrote {len(df)} rows ({df.gpu.iloc[0]}, {_backend(df.kernel.iloc[0])}) to "
          f"{args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
