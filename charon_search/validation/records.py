"""Validation records: published measurements (YAML, ``schema_version: 1``) and silicon CSV rows.

``load_records`` reads the format of ``data/validation/SCHEMA.md`` and checks every rule the
schema lists ("Checks a loader can rely on"); a malformed record raises ``ConfigError`` naming the
file, the record id and the field. ``variants`` are expanded into records of their own
(``<id>#<n>``, n from 1). ``load_silicon_csv`` reads the column layout of aiconfigurator-core's
``silicon_sample.csv`` (measured end-to-end serving points) into the same ``Record`` type with
``kind == "serving"`` and the measured ``ttft_s`` / ``tpot_s``.
"""

from __future__ import annotations

import copy
import csv
import io
import math
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from charon_search.errors import ConfigError

__all__ = [
    "FLOP_CONVENTIONS",
    "SILICON_COLUMNS",
    "Record",
    "data_dir",
    "default_files",
    "independent_reruns",
    "load_files",
    "load_records",
    "load_silicon_csv",
    "repeated_measurements",
]


def read_utf8(path: Path) -> str:
    """A record file's text (a leading byte-order mark dropped).

    Raises:
        ConfigError: the file is not UTF-8 text (a UTF-16 export, a binary file).
    """
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start}); save it as "
                          "UTF-8") from None

_ID_RE = re.compile(r"^[A-Za-z0-9_.-]+$")

FLOP_CONVENTIONS = (
    "megatron-sc21", "megatron-2022", "megatron-core", "llama3", "llm-foundry", "palm", "unstated",
)
_RECORD_KEYS = ("id", "source", "confidence", "kind", "model", "hardware", "measured",
                "flop_convention", "inferred_fields", "notes")
_MODEL_KEYS = ("name", "catalog", "arch", "num_layers", "hidden_size", "num_attention_heads",
               "num_key_value_heads", "intermediate_size", "vocab_size", "num_experts",
               "num_experts_per_token", "params")
_HARDWARE_KEYS = ("gpu", "num_gpus", "gpus_per_node", "interconnect")
_TRAINING_KEYS = ("tp", "pp", "dp", "cp", "ep", "vpp", "sequence_parallel", "zero_stage",
                  "schedule", "micro_batch_size", "global_batch_size", "seq_len", "recompute",
                  "precision", "async_tp")
_SERVING_KEYS = ("tp", "pp", "ep", "dp", "input_len", "output_len", "max_batch_size",
                 "concurrency", "precision", "framework")
_GPU_KEYS = ("a100-sxm-40gb", "a100-sxm-80gb", "a100", "h100-sxm-80gb", "h100-sxm-96gb-500w",
             "h800-sxm-80gb", "h200-sxm-141gb", "gb200", "tpu-v4")
_SCHEDULES = ("none", "1f1b", "interleaved-1f1b", "gpipe", "dualpipe", "zero-bubble")
_TRAIN_PRECISIONS = ("fp16", "bf16", "fp8", "mxfp8")
_SERVE_PRECISIONS = ("fp16", "bf16", "fp8", "mxfp8", "nvfp4", "int8", "int4")
_FLOP_METRIC_RE = re.compile(r"(tflops|^mfu$|^hfu$)")

#: Columns of aiconfigurator-core's ``systems/silicon_sample.csv`` this loader needs.
SILICON_COLUMNS = (
    "id", "backend", "backend_version", "model_path", "system", "precision", "mode", "isl", "osl",
    "gemm_quant_mode", "moe_quant_mode", "batch_size", "tp_size", "pp_size", "attention_dp_size",
    "moe_tp_size", "moe_ep_size", "prefill_batch_size", "prefill_num_workers", "prefill_tp_size",
    "prefill_pp_size", "prefill_attention_dp_size", "prefill_moe_tp_size", "prefill_moe_ep_size",
    "decode_batch_size", "decode_num_workers", "decode_tp_size", "decode_pp_size",
    "decode_attention_dp_size", "decode_moe_tp_size", "decode_moe_ep_size", "silicon_ttft_ms",
    "silicon_tpot_ms",
)

_CONC_RE = re.compile(r"silicon_concurrency=(\d+)")
#: The measurement date in the provenance column (``measured=2026-01-14T...``).
_MEASURED_RE = re.compile(r"measured=(\d{4}-\d{2}-\d{2})")
SILICON_SOURCE = "aiconfigurator-core 0.12.0 silicon_sample.csv"
#: The ``silicon_data_source`` marker of aiconfigurator's own gap-analysis sweeps (aiperf);
#: the other rows come from InferenceX-style dumps with their own client.
AIC_GAP_SOURCE = "aic-auto-gap-analysis"


def silicon_pipeline(data_source: str) -> str:
    """The measurement pipeline of a silicon row (its client and launch recipes differ), part
    of the row's source so that leave-one-source-out holds out a whole pipeline."""
    return "aiconfigurator gap analysis" if AIC_GAP_SOURCE in data_source else "InferenceX"


@dataclass(frozen=True, kw_only=True)
class Record:
    """One measured configuration (a published record, one of its variants, or a silicon row)."""

    id: str
    source: str
    """Title of the publication (published records) or ``"<csv source> (<backend>)"``."""
    url: str = ""
    confidence: str = "medium"
    """``high`` | ``medium`` | ``low`` (silicon rows: ``high``, measured end to end)."""
    kind: str
    """``training`` or ``serving``."""
    model: Mapping[str, Any]
    """The record's ``model`` mapping; silicon rows: ``{"name": model_path, "catalog": None}``."""
    hardware: Mapping[str, Any]
    """``gpu``, ``num_gpus``, ``gpus_per_node``, ``interconnect`` (silicon: ``system`` key)."""
    config: Mapping[str, Any]
    """The ``training`` or ``serving`` mapping (including ``extra``)."""
    measured: Mapping[str, float]
    flop_convention: str | None = None
    inferred_fields: tuple[str, ...] = ()
    notes: str = ""
    parent_id: str | None = None
    """For a variant ``<id>#<n>``: the record it derives from."""
    origin: str = "published"
    """``published`` (YAML) or ``silicon`` (CSV row)."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Loader facts not in the schema (silicon: backend, mode, worker pools)."""


# ----------------------------------------------------------------------------- shipped data
def data_dir() -> Path:
    """Folder of the validation data shipped with the package."""
    return Path(__file__).resolve().parents[1] / "data" / "validation"


def default_files() -> list[Path]:
    """The shipped published records and silicon rows."""
    return [data_dir() / "published-dev.yaml", data_dir() / "silicon_sample.csv"]


def load_files(paths: Iterable[str | Path]) -> list[Record]:
    """Load YAML record files and silicon CSVs (by suffix); ids must be unique across them."""
    out: list[Record] = []
    seen: dict[str, str] = {}  # record id -> the file it came from
    for p in paths:
        path = Path(p)
        if not path.exists():
            raise ConfigError(f"validation file {str(path)!r} does not exist")
        if path.suffix.lower() == ".csv":
            recs = load_silicon_csv(path)
        elif path.suffix.lower() in (".yaml", ".yml"):
            recs = load_records(path)
        else:
            raise ConfigError(
                f"validation file {str(path)!r}: suffix must be one of ['.yaml', '.yml', '.csv']"
            )
        for r in recs:
            if r.id in seen:
                where = (f"{seen[r.id]} twice (is the file given twice?)"
                         if seen[r.id] == str(path) else f"both {seen[r.id]} and {path}")
                raise ConfigError(f"record id {r.id!r} occurs in {where}; ids must be unique")
            seen[r.id] = str(path)
        out.extend(recs)
    return out


# ----------------------------------------------------------------------------- YAML records
def repeated_measurements(records: Iterable[Record]) -> dict[str, tuple[str, bool]]:
    """Records whose measured values all repeat an earlier record's: ``id -> (first id, same
    configuration)``.

    Only records with at least two measured metrics are compared (one number can coincide by
    chance). A repeat under the same configuration is the same run shipped twice (e.g. a
    silicon row in two dated dumps); under another configuration one of the two labels is
    probably wrong (another model name, another parallel layout). ``validate`` reports both and
    still predicts every record, so the statistics stay those of the data as shipped.
    """
    first: dict[tuple[Any, ...], Record] = {}
    out: dict[str, tuple[str, bool]] = {}
    for rec in records:
        if len(rec.measured) < 2:
            continue
        key = (rec.kind, tuple(sorted((m, float(v)) for m, v in rec.measured.items())))
        seen = first.setdefault(key, rec)
        if seen is not rec:
            out[rec.id] = (seen.id, _same_setup(_setup(seen), _setup(rec)))
    return out


def independent_reruns(records: Iterable[Record]) -> dict[str, str]:
    """Records that ran an earlier record's setup again on another day: ``id -> earlier id``.

    Same setup means the same model, GPU, GPU count, configuration (engine and version,
    lengths, concurrency, parallel layout) and ``extra`` fields (system, backend, mode) but
    the date, compared as ``repeated_measurements`` does (a field one side leaves empty is
    unknown, not different); another run means another ``measured_date`` (silicon rows carry
    one) and measured values that are not all equal (a run shipped twice is
    ``repeated_measurements``' business). Each rerun points at the first
    earlier run of its setup, so n runs give n - 1 pairs. The pairs measure how far the
    hardware's own numbers move between runs: the floor under any deterministic prediction.
    """
    buckets: dict[tuple[Any, ...], list[tuple[Record, dict[str, Any]]]] = {}
    out: dict[str, str] = {}
    for rec in records:
        date = (rec.extra or {}).get("measured_date")
        if not date or not rec.measured:
            continue
        c = rec.config
        key = (rec.kind, rec.model.get("catalog") or rec.model.get("name"),
               rec.hardware.get("gpu"), rec.hardware.get("num_gpus"), c.get("framework"),
               c.get("framework_version"), c.get("mode"), c.get("input_len"),
               c.get("output_len"), c.get("concurrency"))
        earlier = buckets.setdefault(key, [])
        mine = _setup(rec, drop=("measured_date",))
        same = [p for p, setup in earlier if _same_setup(setup, mine)]
        if any(p.measured == rec.measured for p in same):
            continue  # a run shipped again, not another run
        first = next((p for p in same if p.extra["measured_date"] != date), None)
        if first is not None:
            out[rec.id] = first.id
        earlier.append((rec, mine))
    return out


def _setup(rec: Record, drop: tuple[str, ...] = ()) -> dict[str, Any]:
    """What a record ran: model, hardware and its training / serving configuration (less the
    ``extra`` keys in ``drop``)."""
    extra = {k: v for k, v in (rec.extra or {}).items() if k not in drop}
    return {"model": rec.model.get("catalog") or rec.model.get("name"),
            "gpu": rec.hardware.get("gpu"), "num_gpus": rec.hardware.get("num_gpus"),
            "config": rec.config, "extra": extra}


def _same_setup(a: Any, b: Any) -> bool:
    """Equal wherever both sides say something: a field one dump leaves empty (None, "") is
    unknown there, not different."""
    if a in (None, "") or b in (None, ""):
        return True
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return all(_same_setup(a[k], b[k]) for k in set(a) & set(b))
    return bool(a == b)


def load_records(path: str | Path, *, expand_variants: bool = True) -> list[Record]:
    """Read and check a ``published-*.yaml`` file; variants become records ``<id>#<n>``.

    Raises:
        ConfigError: malformed YAML or a record that breaks a rule of SCHEMA.md (the message
            names the file, the record id and the field).
    """
    path = Path(path)
    try:
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        data = yaml.load(read_utf8(path), Loader=loader)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: malformed YAML: {e}") from e
    return parse_records(data, where=str(path), expand_variants=expand_variants)


def parse_records(data: Any, *, where: str = "records",
                  expand_variants: bool = True) -> list[Record]:
    """Check an already parsed document (``{"schema_version": 1, "records": [...]}``)."""
    if not isinstance(data, Mapping) or set(data) != {"schema_version", "records"}:
        keys = sorted(data) if isinstance(data, Mapping) else type(data).__name__
        raise ConfigError(
            f"{where}: top level must have exactly the keys ['records', 'schema_version'], "
            f"but got {keys}"
        )
    if data["schema_version"] != 1:
        raise ConfigError(f"{where}: `schema_version` must be 1, but got "
                          f"{data['schema_version']!r}")
    if not isinstance(data["records"], list):
        raise ConfigError(f"{where}: `records` must be a list")
    out: list[Record] = []
    seen: set[str] = set()
    for i, raw in enumerate(data["records"]):
        rec = _check_record(raw, where=f"{where}: record {i}")
        if rec.id in seen:
            raise ConfigError(f"{where}: record id {rec.id!r} is not unique")
        seen.add(rec.id)
        out.append(rec)
        if expand_variants:
            out.extend(_variants(raw, rec, where=f"{where}: record {rec.id}"))
    return out


def _require_keys(m: Any, required: tuple[str, ...], optional: tuple[str, ...],
                  where: str) -> None:
    if not isinstance(m, Mapping):
        raise ConfigError(f"{where}: must be a mapping, but got {type(m).__name__}")
    missing = [k for k in required if k not in m]
    stray = sorted(set(m) - set(required) - set(optional))
    if missing:
        raise ConfigError(f"{where}: missing key(s) {missing}")
    if stray:
        raise ConfigError(f"{where}: unknown key(s) {stray}; allowed: "
                          f"{sorted(required + optional)}")


def _int(v: Any, where: str, *, nullable: bool = True, min_value: int = 1) -> None:
    if v is None and nullable:
        return
    if not isinstance(v, int) or isinstance(v, bool) or v < min_value:
        raise ConfigError(f"{where} must be an integer >= {min_value}"
                          f"{' or null' if nullable else ''}, but got {v!r}")


def _choice(v: Any, allowed: tuple[Any, ...], where: str, *, nullable: bool = False) -> None:
    if v is None and nullable:
        return
    if v not in allowed:
        raise ConfigError(f"{where} must be one of {list(allowed)}"
                          f"{' or null' if nullable else ''}, but got {v!r}")


def _check_gpu_name(name: Any, where: str) -> None:
    """A GPU outside SCHEMA.md's key table is accepted when it names a shipped GPU spec (as
    the silicon CSV's `system` does: `h100_sxm`, `A100-SXM4-80GB`, `b200_sxm`)."""
    from charon_search.validation.names import Unexpressible, resolve_gpu

    try:
        if isinstance(name, str):
            resolve_gpu(name)
            return
    except Unexpressible:
        pass
    raise ConfigError(f"{where} must be one of {list(_GPU_KEYS)} (SCHEMA.md) or the name of a "
                      f"GPU spec (`charon-search catalog`), but got {name!r}")


def _bool(v: Any, where: str) -> None:
    if v is not None and not isinstance(v, bool):
        raise ConfigError(f"{where} must be true, false or null, but got {v!r}")


def _check_measured(measured: Any, where: str) -> dict[str, float]:
    if not isinstance(measured, Mapping) or not measured:
        raise ConfigError(f"{where}: `measured` must be a non-empty mapping of metric -> number")
    out: dict[str, float] = {}
    for k, v in measured.items():
        # >= the smallest normal float: a subnormal measurement (5e-324) would make the
        # relative error overflow to inf and turn every summary it enters into nan.
        if (isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)
                or not v >= sys.float_info.min):
            raise ConfigError(f"{where}: `measured.{k}` must be a positive finite number, but "
                              f"got {v!r}")
        if k in ("mfu", "hfu") and not 0 < v <= 1:
            raise ConfigError(f"{where}: `measured.{k}` must lie in (0, 1], but got {v!r}")
        out[str(k)] = float(v)
    return out


def _check_record(raw: Any, *, where: str, name: str | None = None) -> Record:
    """Check one record; errors name it ``name`` (a variant's ``<id>#<n>``) or its id."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: must be a mapping")
    rid = raw.get("id")
    if not isinstance(rid, str) or not _ID_RE.match(rid):
        raise ConfigError(f"{where}: `id` must match [A-Za-z0-9_.-]+, but got {rid!r}")
    where = f"{where.rsplit(': record', 1)[0]}: record {name or rid}"
    kind = raw.get("kind")
    _choice(kind, ("training", "serving"), f"{where}: `kind`")
    kind = str(kind)
    _require_keys(raw, (*_RECORD_KEYS, kind), ("variants",), where)
    src = raw["source"]
    _require_keys(src, ("title", "read_from", "url"), (), f"{where}: `source`")
    _choice(raw["confidence"], ("high", "medium", "low"), f"{where}: `confidence`")

    model = raw["model"]
    _require_keys(model, (*_MODEL_KEYS, "arch"), ("extra",), f"{where}: `model`")
    _choice(model["arch"], ("dense", "moe"), f"{where}: `model.arch`")
    for k in ("num_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
              "intermediate_size", "vocab_size", "num_experts", "num_experts_per_token"):
        _int(model[k], f"{where}: `model.{k}`")
    hw = raw["hardware"]
    _require_keys(hw, _HARDWARE_KEYS, (), f"{where}: `hardware`")
    if hw["gpu"] not in _GPU_KEYS:
        _check_gpu_name(hw["gpu"], f"{where}: `hardware.gpu`")
    _int(hw["num_gpus"], f"{where}: `hardware.num_gpus`", nullable=False)
    _int(hw["gpus_per_node"], f"{where}: `hardware.gpus_per_node`")

    cfg = raw[kind]
    low = raw["confidence"] == "low"
    if kind == "training":
        _check_training(cfg, model, hw, where=f"{where}: training", low=low)
    else:
        _check_serving(cfg, hw, where=f"{where}: serving", low=low)
    measured = _check_measured(raw["measured"], where)
    conv = raw["flop_convention"]
    _choice(conv, FLOP_CONVENTIONS, f"{where}: `flop_convention`", nullable=True)
    _check_convention(conv, measured, where)
    inferred = raw["inferred_fields"]
    if not isinstance(inferred, list):
        raise ConfigError(f"{where}: `inferred_fields` must be a list")
    for dotted in inferred:
        if not _has_path(raw, str(dotted)):
            raise ConfigError(f"{where}: `inferred_fields` entry {dotted!r} is not a field of "
                              f"the record")
    if not isinstance(raw["notes"], str):
        raise ConfigError(f"{where}: `notes` must be a string")
    return Record(
        id=rid, source=str(src["title"]), url=str(src["url"]), confidence=raw["confidence"],
        kind=kind, model=dict(model), hardware=dict(hw), config=copy.deepcopy(dict(cfg)),
        measured=measured, flop_convention=conv, inferred_fields=tuple(map(str, inferred)),
        notes=raw["notes"],
    )


def _check_convention(conv: str | None, measured: Mapping[str, float], where: str) -> None:
    flop_metrics = [k for k in measured if _FLOP_METRIC_RE.search(k)]
    if bool(flop_metrics) != (conv is not None):
        raise ConfigError(
            f"{where}: `flop_convention` must be non-null exactly when a FLOP-based metric is "
            f"measured, but got (flop_convention={conv!r}, flop metrics={flop_metrics})"
        )
    if any(k.startswith("reported_tflops") for k in measured) and conv != "unstated":
        raise ConfigError(f"{where}: `reported_tflops_*` needs flop_convention 'unstated', "
                          f"but got {conv!r}")


def _check_training(cfg: Any, model: Mapping[str, Any], hw: Mapping[str, Any], *, where: str,
                    low: bool) -> None:
    _require_keys(cfg, _TRAINING_KEYS, ("extra",), where)
    for k in ("tp", "pp", "dp", "cp", "micro_batch_size", "global_batch_size", "seq_len"):
        _int(cfg[k], f"{where}.{k}")
    _int(cfg["ep"], f"{where}.ep", nullable=False)
    _int(cfg["vpp"], f"{where}.vpp", min_value=2)
    _bool(cfg["sequence_parallel"], f"{where}.sequence_parallel")
    _bool(cfg["async_tp"], f"{where}.async_tp")
    _choice(cfg["zero_stage"], (0, 1, 2, 3), f"{where}.zero_stage", nullable=True)
    _choice(cfg["schedule"], _SCHEDULES, f"{where}.schedule", nullable=True)
    _choice(cfg["recompute"], ("none", "selective", "full"), f"{where}.recompute", nullable=True)
    _choice(cfg["precision"], _TRAIN_PRECISIONS, f"{where}.precision", nullable=True)
    tp, pp, dp, cp, ep = (cfg[k] for k in ("tp", "pp", "dp", "cp", "ep"))
    degrees = (tp, pp, dp, cp)
    if all(d is not None for d in degrees):
        product = tp * pp * dp * cp
        if product != hw["num_gpus"] and not low:
            raise ConfigError(
                f"{where}: `tp * pp * dp * cp == hardware.num_gpus` must hold, but got "
                f"(tp={tp}, pp={pp}, dp={dp}, cp={cp}, product={product}, "
                f"num_gpus={hw['num_gpus']})"
            )
    elif any(d is not None for d in degrees) and not low:
        raise ConfigError(f"{where}: tp/pp/dp/cp may be null only together (low confidence)")
    if pp is not None and cfg["schedule"] is not None and (pp == 1) != (cfg["schedule"] == "none"):
        raise ConfigError(f"{where}: `schedule == 'none'` must hold exactly when pp == 1, but got "
                          f"(pp={pp}, schedule={cfg['schedule']!r})")
    if cfg["vpp"] is not None and cfg["schedule"] != "interleaved-1f1b":
        raise ConfigError(f"{where}: `vpp` needs schedule 'interleaved-1f1b', but got "
                          f"(vpp={cfg['vpp']}, schedule={cfg['schedule']!r})")
    for flag in ("sequence_parallel", "async_tp"):
        if cfg[flag] and tp is not None and tp == 1:
            raise ConfigError(f"{where}: `{flag}` needs tp > 1, but got tp=1")
    heads = model["num_attention_heads"]
    if tp is not None and heads is not None and heads % tp:
        raise ConfigError(f"{where}: `tp` must divide num_attention_heads, but got "
                          f"(tp={tp}, num_attention_heads={heads})")
    if model["arch"] == "dense" and ep != 1:
        raise ConfigError(f"{where}: dense models need ep == 1, but got ep={ep}")
    if model["arch"] == "moe" and dp is not None and cp is not None and (dp * cp) % ep:
        raise ConfigError(f"{where}: `ep` must divide dp * cp, but got "
                          f"(ep={ep}, dp={dp}, cp={cp})")
    mbs, gbs = cfg["micro_batch_size"], cfg["global_batch_size"]
    if mbs is not None and gbs is not None and dp is not None and gbs % (mbs * dp):
        raise ConfigError(f"{where}: `global_batch_size` must be a multiple of micro_batch_size "
                          f"* dp, but got (global_batch_size={gbs}, micro_batch_size={mbs}, "
                          f"dp={dp})")


def _check_serving(cfg: Any, hw: Mapping[str, Any], *, where: str, low: bool) -> None:
    _require_keys(cfg, _SERVING_KEYS, ("extra",), where)
    for k in ("tp", "pp", "ep", "dp"):
        _int(cfg[k], f"{where}.{k}", nullable=False)
    for k in ("input_len", "output_len", "max_batch_size", "concurrency"):
        _int(cfg[k], f"{where}.{k}")
    _choice(cfg["precision"], _SERVE_PRECISIONS, f"{where}.precision")
    product = cfg["tp"] * cfg["pp"] * cfg["dp"]
    if product != hw["num_gpus"] and not low:
        raise ConfigError(f"{where}: `tp * pp * dp == hardware.num_gpus` must hold, but got "
                          f"(tp={cfg['tp']}, pp={cfg['pp']}, dp={cfg['dp']}, "
                          f"num_gpus={hw['num_gpus']})")


def _has_path(raw: Mapping[str, Any], dotted: str) -> bool:
    node: Any = raw
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def _variants(raw: Mapping[str, Any], rec: Record, *, where: str) -> list[Record]:
    variants = raw.get("variants") or []
    if not isinstance(variants, list):
        raise ConfigError(f"{where}: `variants` must be a list")
    out = []
    for n, var in enumerate(variants, start=1):
        vwhere = f"{where}#{n}"
        _require_keys(var, ("overrides", "measured"), ("notes",), vwhere)
        if not isinstance(var["overrides"], Mapping) or not var["overrides"]:
            raise ConfigError(f"{vwhere}: `overrides` must be a non-empty mapping of "
                              f"`{rec.kind}.<field>` -> value (a variant is another "
                              f"configuration of the record), but got {var['overrides']!r}")
        new_raw = copy.deepcopy(dict(raw))
        new_raw.pop("variants", None)
        new_raw["id"] = f"{rec.id}-v{n}"  # placeholder matching the id pattern for the checks
        for dotted, value in dict(var["overrides"]).items():
            head, _, rest = str(dotted).partition(".")
            if head != rec.kind or not rest or rest not in new_raw[head]:
                raise ConfigError(f"{vwhere}: override {dotted!r} must name a field of "
                                  f"`{rec.kind}`")
            new_raw[head][rest] = value
        new_raw["measured"] = var["measured"]
        checked = _check_record(new_raw, where=vwhere, name=f"{rec.id}#{n}")
        notes = rec.notes + (f" Variant: {var['notes']}" if var.get("notes") else "")
        out.append(Record(
            id=f"{rec.id}#{n}", source=rec.source, url=rec.url, confidence=rec.confidence,
            kind=rec.kind, model=rec.model, hardware=rec.hardware, config=checked.config,
            measured=checked.measured, flop_convention=rec.flop_convention,
            inferred_fields=rec.inferred_fields, notes=notes, parent_id=rec.id,
            extra={"overrides": dict(var["overrides"])},
        ))
    return out


# ----------------------------------------------------------------------------- silicon CSV
def _opt_int(row: Mapping[str, str], col: str, where: str) -> int | None:
    v = (row.get(col) or "").strip()
    if not v:
        return None
    try:
        f = float(v)
    except ValueError as e:
        raise ConfigError(f"{where}: column `{col}` must be an integer, but got {v!r}") from e
    if not math.isfinite(f) or f != int(f) or f < 0:
        raise ConfigError(f"{where}: column `{col}` must be a non-negative integer, got {v!r}")
    return int(f)


def _pool(row: Mapping[str, str], prefix: str, where: str) -> dict[str, int | None]:
    pool = {k: _opt_int(row, f"{prefix}{k}", where)
            for k in ("batch_size", "num_workers", "tp_size", "pp_size", "attention_dp_size",
                      "moe_tp_size", "moe_ep_size")}
    _check_degrees(pool, prefix, where)
    return pool


def _check_degrees(pool: Mapping[str, int | None], prefix: str, where: str) -> None:
    """TP and PP degrees are >= 1 when given (a 0 MoE TP/EP degree means "none" in the
    dumps; a 0 TP or PP degree means nothing)."""
    for k in ("tp_size", "pp_size"):
        if pool.get(k) == 0:
            raise ConfigError(f"{where}: column `{prefix}{k}` must be >= 1 or empty, but got 0")


def load_silicon_csv(path: str | Path) -> list[Record]:
    """Read measured serving rows in the layout of aiconfigurator-core's ``silicon_sample.csv``.

    Each row becomes a serving ``Record`` with ``measured = {"ttft_s", "tpot_s"}`` (the CSV holds
    milliseconds), ``config`` holding ``input_len``/``output_len`` (isl/osl), ``concurrency``
    (the closed-loop client concurrency: ``silicon_concurrency`` of the provenance column, else
    ``batch_size`` × attention-DP ranks), ``workers`` (agg rows whose concurrency is k > 1
    times ``batch_size`` × attention-DP ranks: k workers behind the router), the degrees and, for
    ``mode == "disagg"``, the prefill/decode worker pools under ``config["prefill"]`` /
    ``config["decode"]``. Rows without an ``id`` get ``silicon_row_<n>`` (1-based line number).
    ``extra`` holds the row's system, backend and mode, and ``measured_date`` (``YYYY-MM-DD``)
    when the provenance column states one.

    A ``silicon_ttft_ms`` / ``silicon_tpot_ms`` of 0 means "not measured" (the metric is left
    out); a row needs one of them positive.

    Raises:
        ConfigError: missing columns, non-numeric values, a negative or non-finite latency,
            a mode other than agg/disagg (naming the line and the row id).
    """
    path = Path(path)
    # utf-8-sig: a spreadsheet's "CSV UTF-8" starts with a byte-order mark, which would
    # otherwise become part of the first column's name and lose the `id` column.
    with io.StringIO(read_utf8(path), newline="") as fh:
        reader = csv.DictReader(fh)
        cols = reader.fieldnames or []
        missing = [c for c in SILICON_COLUMNS if c not in cols and c != "id"]
        if missing:
            raise ConfigError(f"{path}: missing column(s) {missing} of the silicon CSV layout")
        out = []
        for n, row in enumerate(reader, start=2):
            where = f"{path}: line {n}"
            rid = (row.get("id") or "").strip() or f"silicon_row_{n - 1}"
            if not _ID_RE.match(rid):
                raise ConfigError(f"{where}: column `id` must match [A-Za-z0-9_.-]+ (`#` names a "
                                  f"record's variants), but got {rid!r}")
            mode = (row["mode"] or "").strip()
            _choice(mode, ("agg", "disagg"), f"{where}: column `mode`")
            try:
                ttft_ms = float(row["silicon_ttft_ms"])
                tpot_ms = float(row["silicon_tpot_ms"])
            except (TypeError, ValueError) as e:
                raise ConfigError(f"{where}: silicon_ttft_ms/silicon_tpot_ms must be numbers, "
                                  f"but got {row['silicon_ttft_ms']!r}, "
                                  f"{row['silicon_tpot_ms']!r}") from e
            isl, osl = _opt_int(row, "isl", where), _opt_int(row, "osl", where)
            if not isl or not osl:
                raise ConfigError(f"{where}: columns `isl` and `osl` must be positive integers")
            for col, ms in (("silicon_ttft_ms", ttft_ms), ("silicon_tpot_ms", tpot_ms)):
                if not math.isfinite(ms) or ms < 0:
                    raise ConfigError(f"{where} (id {rid}): column `{col}` must be a finite "
                                      "number of milliseconds >= 0 (0 = not measured), but got "
                                      f"{row[col]!r}")
            measured = {}
            if ttft_ms > 0:
                measured["ttft_s"] = ttft_ms * 1e-3
            if tpot_ms > 0:
                measured["tpot_s"] = tpot_ms * 1e-3
            if not measured:
                raise ConfigError(f"{where}: no positive silicon_ttft_ms / silicon_tpot_ms")
            # The client concurrency is in the provenance column when the dump has it; else it
            # is the per-rank batch times the attention-DP ranks (times decode workers).
            source = row.get("silicon_data_source") or ""
            m = _CONC_RE.search(source)
            conc = int(m.group(1)) if m else None
            when = _MEASURED_RE.search(source)
            cfg: dict[str, Any] = {
                "mode": mode, "input_len": isl, "output_len": osl,
                "precision": (row.get("precision") or "").strip() or None,
                "gemm_quant_mode": (row.get("gemm_quant_mode") or "").strip() or None,
                "moe_quant_mode": (row.get("moe_quant_mode") or "").strip() or None,
                "framework": (row["backend"] or "").strip(),
                "framework_version": (row["backend_version"] or "").strip(),
            }
            layout_note = ""
            if mode == "agg":
                pool = {k: _opt_int(row, k, where) for k in
                        ("batch_size", "tp_size", "pp_size", "attention_dp_size", "moe_tp_size",
                         "moe_ep_size")}
                system = (row.get("system") or "").strip()
                layout_note = (_degrees_from_id(rid, pool, system)
                               or _ep_ranks_as_dp(rid, pool, system)
                               or _implied_attention_dp(pool))
                _check_degrees(pool, "", where)
                if not pool["batch_size"] or not pool["tp_size"]:
                    raise ConfigError(f"{where}: agg rows need batch_size and tp_size")
                adp = pool["attention_dp_size"] or 1
                # ``batch_size`` is one worker's batch (per attention-DP rank): aiconfigurator
                # predicts an agg row as one worker at that batch. A client concurrency that is
                # k times it ran k such workers behind the router (e.g. a GB200 row of 448
                # streams over 32 TP-2 workers of 14, 64 GPUs like the disagg row of its run).
                # A row whose degrees were corrected wrote its batch for the columns' layout.
                share = pool["batch_size"] * adp
                workers = (conc // share if conc and conc > share and not conc % share
                           and not layout_note else 1)
                cfg.update(concurrency=conc or share, tp=pool["tp_size"],
                           pp=pool["pp_size"] or 1, dp=pool["attention_dp_size"] or 1,
                           moe_tp=pool["moe_tp_size"] or 1, ep=pool["moe_ep_size"] or 1,
                           **({"workers": workers} if workers > 1 else {}))
                num_gpus = workers * _pool_gpus(pool)
            else:
                pre, dec = _pool(row, "prefill_", where), _pool(row, "decode_", where)
                for name, p in (("prefill", pre), ("decode", dec)):
                    if not p["tp_size"]:
                        raise ConfigError(f"{where}: disagg rows need {name}_tp_size")
                # Part of the dump lacks worker counts / batch sizes; kept, and reported as
                # not expressible by the translation rather than rejected here.
                known = all(p["num_workers"] for p in (pre, dec))
                if conc is None and known and dec["batch_size"]:
                    conc = (int(dec["batch_size"]) * int(dec["num_workers"] or 1)
                            * int(dec["attention_dp_size"] or 1))
                cfg.update(prefill=pre, decode=dec, concurrency=conc)
                num_gpus = sum((p["num_workers"] or 1) * _pool_gpus(p) for p in (pre, dec))
            out.append(Record(
                id=rid, source=f"{SILICON_SOURCE} ({row['backend']}, "
                                f"{silicon_pipeline(source)})",
                url="https://pypi.org/project/aiconfigurator-core/",
                confidence="high", kind="serving",
                model={"name": row["model_path"], "catalog": None},
                hardware={"gpu": row["system"], "num_gpus": num_gpus, "gpus_per_node": None,
                          "interconnect": None},
                config=cfg, measured=measured, flop_convention=None, inferred_fields=(),
                notes=source.strip(), origin="silicon",
                extra={"system": row["system"], "backend": (row["backend"] or "").strip(),
                       "mode": mode,
                       **({"layout_note": layout_note} if layout_note else {}),
                       **({"measured_date": when.group(1)} if when else {})},
            ))
    return out


_ID_DEGREES = re.compile(r"_tp(\d+)(?:_0)?_ep(\d+)(?:_0)?_")
#: GPUs per node of the HGX systems of the silicon rows (``b200_sxm``, ``h200_sxm``...).
HGX_NODE_GPUS = 8


def _beyond_hgx_node(system: str, gpus: int) -> bool:
    """More GPUs than one 8-GPU node of an HGX ``system`` (``gb*`` NVL72 racks excluded: their
    one NVLink domain spans 72 GPUs)."""
    return bool(system) and not system.startswith("gb") and gpus > HGX_NODE_GPUS


def _degrees_from_id(rid: str, pool: dict[str, int | None], system: str = "") -> str:
    """Fix an aggregated row whose columns hold TP x EP where the launch had TP (in place);
    returns a note ("" when the row is kept as read).

    Part of the InferenceX dump of 2026-04-06 writes, for ``trtllm-serve --tp_size X --ep_size
    Y`` (and SGLang ``--tp X --ep Y``) on one 8-GPU node, ``tp_size = X * Y`` (with attention
    DP: ``attention_dp_size = X * Y``), ``moe_tp_size = X`` and ``moe_ep_size = Y`` while its
    row id says ``tpX_epY``: e.g. ``..._tp8_ep8_928`` with ``tp_size`` 64, which no 8-GPU node
    runs and ``moe_tp * moe_ep = 64`` contradicts. The id's degrees are the launch's: X GPUs
    (TP X, or X attention-DP ranks), experts over EP Y and MoE TP X / Y (the engines' split).

    Rows of the same dump with a ``cfg<n>`` id carry the same columns without the degrees in
    the id (``dsr1_b200_sglang_fp8_agg_1024x1024_c16_cfg199``: ``tp_size`` 64, ``moe_tp_size``
    8, ``moe_ep_size`` 8); every one of them that has a ``tpX_epY`` twin (same system, model,
    lengths, concurrency and columns) repeats the twin's measured TTFT and TPOT exactly, 8 of
    8. On a system of 8-GPU nodes (not an NVL72 rack, whose one NVLink domain does run TP 64),
    such columns get the same reading with X = ``moe_tp_size``, Y = ``moe_ep_size``."""
    m = _ID_DEGREES.search(rid)
    if m is not None:
        x, y = int(m.group(1)), int(m.group(2))
        how = f"the row id (tp{x}_ep{y})"
    elif _beyond_hgx_node(system, (pool.get("moe_tp_size") or 1) * (pool.get("moe_ep_size") or 1)):
        x, y = int(pool["moe_tp_size"] or 1), int(pool["moe_ep_size"] or 1)
        how = (f"moe_tp_size x moe_ep_size ({x} x {y}), more GPUs than one {HGX_NODE_GPUS}-GPU "
               f"{system} node")
    else:
        return ""
    tp, adp = pool.get("tp_size") or 1, pool.get("attention_dp_size") or 1
    if (y < 2 or x % y or pool.get("moe_ep_size") != y or pool.get("moe_tp_size") != x
            or tp * adp != x * y or 1 not in (tp, adp)):
        return ""
    field = "tp_size" if adp == 1 else "attention_dp_size"
    pool.update({field: x, "moe_tp_size": x // y})
    return (f"{field} column {x * y} = TP x EP of {how}: simulated as the "
            f"launch's {'TP' if adp == 1 else 'attention DP'} {x}, EP {y}, MoE TP {x // y} on "
            f"{x} GPUs")


def _ep_ranks_as_dp(rid: str, pool: dict[str, int | None], system: str = "") -> str:
    """Fix an aggregated row that writes an expert-parallel launch's EP ranks as attention DP
    (in place); returns a note ("" when the row is kept as read).

    The same InferenceX dump writes ``vllm serve --tensor-parallel-size X
    --enable-expert-parallel`` on X GPUs (vLLM's EP size is TP x DP = X, row id ``tpX_epX``)
    as ``tp_size`` X, ``attention_dp_size`` X, ``moe_tp_size`` 1, ``moe_ep_size`` X * X and a
    ``batch_size`` of the concurrency / X: 16 B200s for a ``tp4_ep4`` launch of Kimi-K2.5,
    which the id's EP 4 contradicts, and the ``cfg<n>`` twins of these rows repeat their
    measurements exactly (Kimi-K2.5 FP4 1024/1024 at concurrency 4: 170 ms TTFT, 8.4 ms
    TPOT in both). Without the degrees in the id, the columns get this reading where X * X
    GPUs exceed one 8-GPU node (not an NVL72 rack)."""
    tp, adp = pool.get("tp_size") or 1, pool.get("attention_dp_size") or 1
    if ((pool.get("moe_tp_size") or 1) != 1 or pool.get("moe_ep_size") != tp * adp or tp < 2
            or tp != adp):
        return ""
    m = _ID_DEGREES.search(rid)
    if m is not None:
        if (int(m.group(1)), int(m.group(2))) != (tp, adp):
            return ""
        how = f"the row id (tp{tp}_ep{adp})"
    elif _beyond_hgx_node(system, tp * adp):
        how = f"{tp * adp} GPUs, more than one {HGX_NODE_GPUS}-GPU {system} node"
    else:
        return ""
    pool.update({"attention_dp_size": 1, "moe_ep_size": tp,
                 "batch_size": (pool.get("batch_size") or 0) * adp or None})
    return (f"attention_dp_size {adp} and moe_ep_size {tp * adp} = the EP ranks of {how}: "
            f"simulated as the launch's TP {tp} with EP {tp} (vLLM: EP = TP x DP) on {tp} GPUs")


def _implied_attention_dp(pool: dict[str, int | None]) -> str:
    """Fill an empty ``attention_dp_size`` (in place) that the MoE columns imply; returns a
    note ("" when the row is kept as read).

    aiconfigurator's layout has ``moe_tp_size x moe_ep_size = tp_size x attention_dp_size``
    (the MoE spans the worker's GPUs). Its vLLM gap-analysis rows leave ``attention_dp_size``
    empty where the launch was data-parallel (``--data-parallel-size``): e.g. Qwen3-235B-FP8
    with ``tp_size`` 1 and ``moe_tp_size`` 2, which one H200 cannot hold (219 GiB of FP8
    weights). The attention-DP degree is ``moe_tp x moe_ep / tp``."""
    tp, moe = pool.get("tp_size") or 1, (pool.get("moe_tp_size") or 1) * (
        pool.get("moe_ep_size") or 1)
    if pool.get("attention_dp_size") or moe <= tp or moe % tp:
        return ""
    pool["attention_dp_size"] = moe // tp
    return (f"attention_dp_size empty, moe_tp_size x moe_ep_size = {moe} over tp_size {tp}: "
            f"simulated as {moe // tp} attention-DP ranks of TP {tp} on {moe} GPUs")


def _pool_gpus(pool: Mapping[str, int | None]) -> int:
    """GPUs of one worker: tp * pp, where attention-DP replicas share the TP*EP GPUs.

    In aiconfigurator's layout an attention-DP worker has ``tp_size * attention_dp_size`` GPUs
    (``tp_size`` is the attention TP inside one DP replica), and the MoE part spans the same GPUs
    (``moe_tp * moe_ep == tp * attention_dp``).
    """
    tp = pool.get("tp_size") or 1
    pp = pool.get("pp_size") or 1
    adp = pool.get("attention_dp_size") or 1
    return tp * pp * adp
