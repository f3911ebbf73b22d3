"""Inspect the profile database and evaluate the per-op predictors on held-out shapes.

``charon-search profiles info [--gpu GPU]`` prints the GPUs, op kinds, row counts and sources of
the DB (of the named GPUs only).
``charon-search profiles eval [--gpu GPU] [--op-kind KIND] [--json FILE]`` trains each
(GPU, op kind) predictor with whole shapes held out and prints MAPE of predictor vs roofline;
``--json`` writes ``{"rows": [{"gpu", "op_kind", "num_heldout", "mape_predictor",
"mape_roofline", ...}]}`` with MAPE as ratios.
``charon-search profiles fit-collectives [--cluster NAME] [--write]`` fits the collective
launch / α / bandwidth-efficiency calibration of each cluster's NVLink tier to the measured NCCL
rows through the simulator's own collective model, and with ``--write`` stores them (with
provenance) in the cluster YAML. With ``--all-to-all`` it fits only the tier's
``<tier>.pairwise`` all-to-all latency, to the measured NCCL all-to-all rows up to 1 MiB
(``cost.nccl_fit.fit_pairwise_alpha``).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from charon_search.cli._common import prepare_outputs
from charon_search.errors import ConfigError

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("info", "eval", "fit-collectives"),
                        help="info: what the DB holds; eval: predictor vs roofline MAPE on "
                             "held-out shapes; fit-collectives: fit the clusters' NVLink "
                             "calibration")
    parser.add_argument("--cluster", action="append", default=None,
                        help="fit-collectives: cluster name(s) (default: every cluster whose "
                             "GPU has NCCL rows)")
    parser.add_argument("--write", action="store_true",
                        help="fit-collectives: write the fitted values into the cluster YAML's "
                             "calibration block")
    parser.add_argument("--all-to-all", action="store_true",
                        help="fit-collectives: fit the innermost tier's `<tier>.pairwise` "
                             "alpha (all-to-all latency) to the measured NCCL all-to-all rows "
                             "up to 1 MiB (the ring fit is the default)")
    parser.add_argument("--max-mape", type=float, default=0.2,
                        help="fit-collectives --write: skip clusters whose fit MAPE (on the "
                             "fitted points) is above this ratio (default 0.2)")
    parser.add_argument("--db", default=None, help="profile DB folder (default: shipped DB)")
    parser.add_argument("--gpu", action="append", default=None,
                        help="info, eval: GPU name or alias (repeatable; default: every GPU "
                             "in the DB)")
    parser.add_argument("--op-kind", action="append", default=None,
                        help="eval: op kind to evaluate (repeatable): gemm, attention, norm, "
                             "elementwise, grouped_gemm (default: all)")
    parser.add_argument("--json", default=None, help="eval: write the table to this JSON file")
    parser.add_argument("--max-train-rows", type=int, default=None,
                        help="eval: subsample the training rows of each predictor to N "
                             "(quick runs; default: all)")


def _db(path: str | None):  # type: ignore[no-untyped-def]
    from charon_search.cost.profile_db import ProfileDB, default_profile_db

    db = ProfileDB(path) if path else default_profile_db()
    if db is None:
        raise ConfigError("no profile DB: the package has no charon_search/data/profiles; "
                          "run scripts/import_peers.py or pass --db")
    return db


def _gpus(db, names: list[str] | None) -> list[str] | None:  # type: ignore[no-untyped-def]
    if not names:
        return None
    out = []
    for name in names:
        key = db.resolve_gpu(name)
        if key is None:
            raise ConfigError(f"--gpu {name!r}: no profile data; must be one of {db.gpus()}")
        out.append(key)
    return out


def _info(db, gpus: list[str] | None = None) -> int:  # type: ignore[no-untyped-def]
    """The DB's tables (of ``gpus`` only, when given)."""
    from charon_search.units import format_bytes

    tables = [t for t in db.summary() if gpus is None or t["gpu"] in gpus]
    print(f"profile DB {db.root} (content hash {db.content_hash})")
    print(f"{'gpu':20s} {'op_kind':15s} {'rows':>8s} {'size':>10s}  dtypes / variants / kernels")
    total_rows = total_bytes = 0
    for t in tables:
        total_rows += t["rows"]
        total_bytes += t["bytes"]
        variants = ",".join(v or "-" for v in t["variants"])
        print(f"{t['gpu']:20s} {t['op_kind']:15s} {t['rows']:8d} {format_bytes(t['bytes']):>10s}"
              f"  {','.join(t['dtypes'])} / {variants} / {'; '.join(t['kernels'])[:80]}")
    print(f"total: {len({t['gpu'] for t in tables})} GPUs, {total_rows} rows, "
          f"{format_bytes(total_bytes)}")
    print("sources (tables converted; see ATTRIBUTION.md in the DB folder):")
    projects: dict[str, int] = {}
    for t in tables:
        for src in t["sources"]:
            proj = src.rsplit(" ", 1)[0]  # "<project> <version> <table path>"
            projects[proj] = projects.get(proj, 0) + 1
    for proj, n in sorted(projects.items()):
        print(f"  {proj}: {n} tables")
    return 0


def _eval(db, args: argparse.Namespace) -> int:  # type: ignore[no-untyped-def]
    from charon_search.cost.predictor import PREDICTED_KINDS, heldout_evaluation

    kinds = args.op_kind
    for k in kinds or ():
        if k not in PREDICTED_KINDS:
            raise ConfigError(f"--op-kind {k!r}: must be one of {sorted(PREDICTED_KINDS)}")
    gpus = _gpus(db, args.gpu)
    rows = heldout_evaluation(db, gpus=gpus, kinds=kinds, max_train_rows=args.max_train_rows)
    if not rows:
        raise ConfigError(f"no predictor to evaluate: the profile DB has no "
                          f"{' / '.join(kinds) if kinds else 'predicted-kind'} rows for "
                          f"{', '.join(gpus) if gpus else 'any GPU'} (`charon-search profiles "
                          "info` lists what it holds)")
    fmt = lambda x: "   n/a" if math.isnan(x) else f"{100 * x:5.1f}%"  # noqa: E731
    print(f"{'gpu':20s} {'op_kind':13s} {'family':8s} {'dtype':12s} {'train':>7s} "
          f"{'heldout':>7s} {'predictor':>9s} {'roofline':>9s}")
    for r in rows:
        print(f"{r['gpu']:20s} {r['op_kind']:13s} {r['family'] or '-':8s} {r['dtype']:12s} "
              f"{r['num_train']:7d} {r['num_heldout']:7d} {fmt(r['mape_predictor']):>9s} "
              f"{fmt(r['mape_roofline']):>9s}")
    if args.json:
        clean = [{k: (None if isinstance(v, float) and math.isnan(v) else v)
                  for k, v in r.items()} for r in rows]
        Path(args.json).write_text(json.dumps({"rows": clean}, indent=1) + "\n")
    return 0


def _fit_collectives(db, args: argparse.Namespace) -> int:  # type: ignore[no-untyped-def]
    import numpy as np

    from charon_search.cost.nccl_fit import fit_cluster_calibration, fit_pairwise_alpha
    from charon_search.hardware.loader import list_clusters, load_cluster

    names = args.cluster or list_clusters()
    for name in names:
        cluster = load_cluster(name)
        gpu = db.resolve_gpu(cluster.gpu.name, *cluster.gpu.aliases)
        kind = "all_to_all" if args.all_to_all else "all_reduce"
        if gpu is None or not db.has(gpu, kind):
            if args.cluster:
                raise ConfigError(f"--cluster {name}: no NCCL measurements for "
                                  f"{cluster.gpu.name} in the profile DB")
            continue
        if args.all_to_all:
            # every measured group size (2-8 GPUs): the fit sees how little the latency grows
            # with the peers
            fit = fit_pairwise_alpha(db, gpu, cluster)
        else:
            # Fit on the full NVLink domain (TP = gpus_per_node, and the intra-node phases of
            # hierarchical DP collectives); the MAPE over all group sizes is reported too.
            sizes = db.table(gpu, kind).columns["group_size"]
            full = int(min(cluster.gpus_per_node, float(np.nanmax(sizes))))
            fit = fit_cluster_calibration(db, gpu, cluster, min_group_size=full)
        shown = {k: (f"{v * 1e6:.3f} us" if not k.startswith("eff") else f"{v:.3f}")
                 for k, v in fit.values.items()}
        print(f"{name} ({gpu}) tier {fit.tier}: {shown}; MAPE {fit.mape_fit:.1%} on "
              f"{fit.num_fit_points} points of >= {fit.min_group_size} GPUs, "
              f"{fit.mape:.1%} on all {fit.num_points}")
        if args.write and fit.mape_fit > args.max_mape:
            print(f"  not written: MAPE {fit.mape_fit:.1%} > --max-mape {args.max_mape:.0%}")
        elif args.write:
            from charon_search.cost.nccl_fit import write_calibration

            path = write_calibration(cluster, fit)
            load_cluster(str(path))  # the edited file must still load
            print(f"  wrote {path}")
    return 0


#: Fewest training rows a predictor is trained on (``cost.predictor.heldout_evaluation``
#: leaves out a table with fewer): a smaller ``--max-train-rows`` would print an empty table.
MIN_TRAIN_ROWS = 8


def run(args: argparse.Namespace) -> int:
    if args.max_train_rows is not None and args.max_train_rows < MIN_TRAIN_ROWS:
        raise ConfigError(f"`--max-train-rows` must be >= {MIN_TRAIN_ROWS} (a predictor trains "
                          f"on at least {MIN_TRAIN_ROWS} rows; leave it out to use every row), "
                          f"but got {args.max_train_rows}")
    # Flags of one action given to another would be ignored without a word.
    only = {"--cluster": ("cluster", None, ("fit-collectives",)),
            # fit-collectives picks GPUs through the clusters (--cluster), not --gpu
            "--gpu": ("gpu", None, ("info", "eval")),
            "--write": ("write", False, ("fit-collectives",)),
            "--all-to-all": ("all_to_all", False, ("fit-collectives",)),
            "--max-mape": ("max_mape", 0.2, ("fit-collectives",)),
            "--op-kind": ("op_kind", None, ("eval",)),
            "--json": ("json", None, ("eval",)),
            "--max-train-rows": ("max_train_rows", None, ("eval",))}
    for flag, (dest, default, actions) in only.items():
        if args.action not in actions and getattr(args, dest) != default:
            raise ConfigError(f"`{flag}` applies to `profiles {' / '.join(actions)}`, not to "
                              f"`profiles {args.action}`")
    prepare_outputs(args, {"--json": "json"})
    db = _db(args.db)
    if args.action == "info":
        return _info(db, _gpus(db, args.gpu))
    if args.action == "fit-collectives":
        return _fit_collectives(db, args)
    return _eval(db, args)
