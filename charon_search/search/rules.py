"""Validity rules and normalizers of search spaces, registered by name.

Space files refer to them by key (``constraints: [degrees_divide_world_size, tp_divides_heads]``,
``normalize: [pipeline_schedule]``), never by expression strings. A constraint takes the config
(fixed + params + derived) and a ``RuleContext`` (model and cluster lookups, cached) and returns
``None`` when the rule holds or a short reason naming the values. A normalizer maps a config to its
canonical form so that parameter tuples meaning the same run (``pp=1`` with any schedule) are
simulated once.

Rules that concern a parallel degree apply to the plain key (``tp``) and to every pool-prefixed key
of a serving space (``prefill_tp``, ``decode_tp``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from charon_search.errors import ConfigError
from charon_search.registry import Registry

__all__ = ["CONSTRAINTS", "NORMALIZERS", "RuleContext"]

Constraint = Callable[[Mapping[str, Any], "RuleContext"], "str | None"]
Normalizer = Callable[[dict[str, Any]], dict[str, Any]]

CONSTRAINTS: Registry[Constraint] = Registry("space constraint", "charon_search.constraints")
NORMALIZERS: Registry[Normalizer] = Registry("space normalizer", "charon_search.normalizers")


class RuleContext:
    """Model and cluster lookups for rules, cached; ``models``/``clusters`` pre-seed the caches."""

    def __init__(self, *, models: Mapping[str, Any] | None = None,
                 clusters: Mapping[str, Any] | None = None) -> None:
        self._models: dict[str, Any] = dict(models or {})
        self._clusters: dict[str, Any] = dict(clusters or {})

    def model(self, name: str) -> Any:
        if name not in self._models:
            from charon_search.catalog import load_model

            self._models[name] = load_model(name)
        return self._models[name]

    def cluster(self, name: str) -> Any:
        if name not in self._clusters:
            from charon_search.hardware import load_cluster

            self._clusters[name] = load_cluster(name)
        return self._clusters[name]


def _g(cfg: Mapping[str, Any], key: str, default: int = 1) -> int:
    v = cfg.get(key, default)
    return default if v is None else int(v)


def _axis_keys(cfg: Mapping[str, Any], axis: str) -> list[str]:
    """``tp`` plus pool-prefixed ``prefill_tp``/``decode_tp``... present in ``cfg``."""
    return [k for k in cfg if k == axis or k.endswith(f"_{axis}")]


def _pool(key: str, axis: str) -> str:
    return key[: -len(axis)]  # "prefill_" for prefill_tp, "" for tp


# ------------------------------------------------------------------ constraints
@CONSTRAINTS.register("degrees_divide_world_size")
def degrees_divide_world_size(cfg: Mapping[str, Any], ctx: RuleContext) -> str | None:
    """tp * pp * cp divides num_gpus (and equals it times dp when dp is given)."""
    for tp_key in _axis_keys(cfg, "tp"):
        pre = _pool(tp_key, "tp")
        gpus_key = f"{pre}num_gpus"
        if gpus_key not in cfg:
            continue
        n = _g(cfg, gpus_key)
        prod = _g(cfg, tp_key) * _g(cfg, f"{pre}pp") * _g(cfg, f"{pre}cp")
        if n % prod:
            return f"tp*pp*cp={prod} must divide {gpus_key}={n}"
        if f"{pre}dp" in cfg and prod * _g(cfg, f"{pre}dp") != n:
            return f"tp*pp*cp*dp={prod * _g(cfg, f'{pre}dp')} must equal {gpus_key}={n}"
    return None


@CONSTRAINTS.register("tp_divides_heads")
def tp_divides_heads(cfg: Mapping[str, Any], ctx: RuleContext) -> str | None:
    """tp divides the attention heads; GQA: tp divides kv heads or is a multiple of them."""
    model = ctx.model(cfg["model"])
    for key in _axis_keys(cfg, "tp"):
        tp = _g(cfg, key)
        if model.num_attention_heads % tp:
            return f"{key}={tp} must divide num_attention_heads={model.num_attention_heads}"
        kv = model.num_key_value_heads
        if model.attention != "mla" and kv % tp and tp % kv:
            return f"{key}={tp} must divide num_key_value_heads={kv} or be a multiple of it"
    return None


@CONSTRAINTS.register("pp_divides_layers")
def pp_divides_layers(cfg: Mapping[str, Any], ctx: RuleContext) -> str | None:
    """pp * vpp divides the number of decoder layers."""
    model = ctx.model(cfg["model"])
    for key in _axis_keys(cfg, "pp"):
        chunks = _g(cfg, key) * _g(cfg, f"{_pool(key, 'pp')}vpp")
        if model.num_layers % chunks:
            return f"{key}*vpp={chunks} must divide num_layers={model.num_layers}"
    return None


@CONSTRAINTS.register("pp_within_layers")
def pp_within_layers(cfg: Mapping[str, Any], ctx: RuleContext) -> str | None:
    """pp * vpp <= number of layers (uneven stages allowed, e.g. DeepSeek-V3's 61 layers)."""
    model = ctx.model(cfg["model"])
    for key in _axis_keys(cfg, "pp"):
        chunks = _g(cfg, key) * _g(cfg, f"{_pool(key, 'pp')}vpp")
        if chunks > model.num_layers:
            return f"{key}*vpp={chunks} must be <= num_layers={model.num_layers}"
    return None


@CONSTRAINTS.register("ep_divides_experts")
def ep_divides_experts(cfg: Mapping[str, Any], ctx: RuleContext) -> str | None:
    """ep divides the routed experts; ep > 1 needs a MoE model."""
    model = ctx.model(cfg["model"])
    for key in _axis_keys(cfg, "ep"):
        ep = _g(cfg, key)
        if ep > 1 and not model.is_moe:
            return f"{key}={ep} needs a MoE model, but {model.name} is dense"
        if model.is_moe and model.num_experts % ep:
            return f"{key}={ep} must divide num_experts={model.num_experts}"
    return None


@CONSTRAINTS.register("ep_divides_dp_cp")
def ep_divides_dp_cp(cfg: Mapping[str, Any], ctx: RuleContext) -> str | None:
    """Training: experts shard inside dp*cp, so ep divides dp*cp."""
    ep, dp, cp = _g(cfg, "ep"), _g(cfg, "dp"), _g(cfg, "cp")
    if (dp * cp) % ep:
        return f"ep={ep} must divide dp*cp={dp * cp}"
    return None


@CONSTRAINTS.register("ep_divides_replica")
def ep_divides_replica(cfg: Mapping[str, Any], ctx: RuleContext) -> str | None:
    """Serving: experts shard over the tp GPUs of each pipeline stage of a replica, so ep
    divides tp (the simulator's own rule: tp=2, pp=2, ep=4 is rejected there, not run)."""
    for key in _axis_keys(cfg, "ep"):
        pre = _pool(key, "ep")
        tp = _g(cfg, f"{pre}tp")
        if tp % _g(cfg, key):
            return f"{key}={_g(cfg, key)} must divide {pre}tp={tp}"
    return None


def _pool_gpus(cfg: Mapping[str, Any], pool: str) -> int:
    """GPUs of a disaggregated deployment's ``prefill`` or ``decode`` pool: replicas*tp*pp."""
    return _g(cfg, f"{pool}_replicas") * _g(cfg, f"{pool}_tp") * _g(cfg, f"{pool}_pp")


def serving_num_gpus(cfg: Mapping[str, Any]) -> int:
    """GPUs of a serving deployment: tp*pp*sp*dp, or the sum over prefill/decode pools."""
    if cfg.get("mode") == "disaggregated":
        return sum(_pool_gpus(cfg, p) for p in ("prefill", "decode"))
    return _g(cfg, "tp") * _g(cfg, "pp") * _g(cfg, "sp") * _g(cfg, "dp")


@CONSTRAINTS.register("serving_gpus_in_range")
def serving_gpus_in_range(cfg: Mapping[str, Any], ctx: RuleContext) -> str | None:
    """min_gpus <= deployment GPUs <= max_gpus (fixed keys of the space)."""
    n = serving_num_gpus(cfg)
    lo, hi = _g(cfg, "min_gpus", 1), _g(cfg, "max_gpus", 1 << 30)
    if not lo <= n <= hi:
        return f"deployment uses {n} GPUs, outside [min_gpus={lo}, max_gpus={hi}]"
    return None


@CONSTRAINTS.register("batch_divides_micro_dp")
def batch_divides_micro_dp(cfg: Mapping[str, Any], ctx: RuleContext) -> str | None:
    """global_batch_size is a multiple of micro_batch_size * dp."""
    gbs, mbs, dp = _g(cfg, "global_batch_size"), _g(cfg, "micro_batch_size"), _g(cfg, "dp")
    if gbs % (mbs * dp):
        return f"global_batch_size={gbs} must be a multiple of micro_batch_size*dp={mbs * dp}"
    return None


@CONSTRAINTS.register("micro_batches_fill_pipeline")
def micro_batches_fill_pipeline(cfg: Mapping[str, Any], ctx: RuleContext) -> str | None:
    """With pp > 1, micro-batches per step >= pp; interleaving needs a multiple of pp."""
    pp = _g(cfg, "pp")
    if pp == 1:
        return None
    m = _g(cfg, "global_batch_size") // (_g(cfg, "micro_batch_size") * _g(cfg, "dp"))
    if m < pp:
        return f"micro-batches per step ({m}) must be >= pp={pp}"
    if _g(cfg, "vpp") > 1 and m % pp:
        return f"interleaved schedule needs micro-batches ({m}) to be a multiple of pp={pp}"
    return None


@CONSTRAINTS.register("cp_divides_seq_len")
def cp_divides_seq_len(cfg: Mapping[str, Any], ctx: RuleContext) -> str | None:
    """seq_len splits into 2*cp zig-zag chunks."""
    cp, s = _g(cfg, "cp"), _g(cfg, "seq_len", 0)
    if cp > 1 and s % (2 * cp):
        return f"seq_len={s} must be divisible by 2*cp={2 * cp}"
    return None


@CONSTRAINTS.register("gpus_fit_cluster")
def gpus_fit_cluster(cfg: Mapping[str, Any], ctx: RuleContext) -> str | None:
    """The job's GPUs fit in the cluster; a disaggregated serving deployment's pools count on
    their own cluster (``prefill_cluster``/``decode_cluster``, default ``cluster``), the
    pools sharing one cluster together."""
    if cfg.get("mode") == "disaggregated":
        need: dict[str, int] = {}
        for p in ("prefill", "decode"):
            name = cfg.get(f"{p}_cluster") or cfg.get("cluster")
            if name is not None:
                need[name] = need.get(name, 0) + _pool_gpus(cfg, p)
        for name, n in need.items():
            cl = ctx.cluster(name)
            if n > cl.num_gpus:
                return f"{n} GPUs exceed cluster {cl.name}'s {cl.num_gpus}"
        return None
    total = sum(_g(cfg, k) for k in cfg if k == "num_gpus" or k.endswith("_num_gpus"))
    for key in [k for k in cfg if k == "cluster" or k.endswith("_cluster")]:
        cl = ctx.cluster(cfg[key])
        if total > cl.num_gpus:
            return f"{total} GPUs exceed cluster {cl.name}'s {cl.num_gpus}"
    return None


@CONSTRAINTS.register("tp_within_node")
def tp_within_node(cfg: Mapping[str, Any], ctx: RuleContext) -> str | None:
    """TP groups stay inside one NVLink node."""
    for key in _axis_keys(cfg, "tp"):
        pre = _pool(key, "tp")
        cl_name = cfg.get(f"{pre}cluster", cfg.get("cluster"))
        if cl_name is None:
            continue
        per_node = ctx.cluster(cl_name).gpus_per_node
        if _g(cfg, key) > per_node:
            return f"{key}={_g(cfg, key)} must be <= gpus_per_node={per_node}"
    return None


@CONSTRAINTS.register("layout_valid")
def layout_valid(cfg: Mapping[str, Any], ctx: RuleContext) -> str | None:
    """The training ``Layout`` built from the config (with its framework's facts, when it
    names one) passes ``Layout.validate_for``."""
    from charon_search.search.evaluators import training_setup

    try:
        layout = training_setup(cfg, ctx.model(cfg["model"]))[0]
        try:  # the training simulator's own rules (dualpipe, interleaving) when present
            from charon_search.training import validate_layout
        except ImportError:
            layout.validate_for(ctx.model(cfg["model"]), int(cfg["num_gpus"]))
        else:
            validate_layout(ctx.model(cfg["model"]), layout, int(cfg["num_gpus"]))
    except ConfigError as e:
        return str(e)
    return None


# ------------------------------------------------------------------ normalizers
@NORMALIZERS.register("pipeline_schedule")
def pipeline_schedule(cfg: dict[str, Any]) -> dict[str, Any]:
    """pp == 1 -> schedule 'none'; vpp only with 'interleaved-1f1b' (else 1)."""
    cfg = dict(cfg)
    if _g(cfg, "pp") == 1:
        cfg["schedule"] = "none"
    if "vpp" in cfg and cfg.get("schedule") != "interleaved-1f1b":
        cfg["vpp"] = 1
    return cfg


@NORMALIZERS.register("sequence_parallel_needs_tp")
def sequence_parallel_needs_tp(cfg: dict[str, Any]) -> dict[str, Any]:
    """Sequence parallelism is a flag on TP: tp == 1 -> sequence_parallel False."""
    cfg = dict(cfg)
    if "sequence_parallel" in cfg and _g(cfg, "tp") == 1:
        cfg["sequence_parallel"] = False
    return cfg


@NORMALIZERS.register("dynamic_sp_needs_sp")
def dynamic_sp_needs_sp(cfg: dict[str, Any]) -> dict[str, Any]:
    """Dynamic SP picks each request's degree among sp's divisors: sp == 1 -> dynamic_sp False
    (``ServingConfig`` rejects dynamic_sp with sp=1; the pair is the sp=1 run)."""
    cfg = dict(cfg)
    if "dynamic_sp" in cfg and _g(cfg, "sp") == 1:
        cfg["dynamic_sp"] = False
    return cfg


@NORMALIZERS.register("recompute_layers")
def recompute_layers(cfg: dict[str, Any]) -> dict[str, Any]:
    """recompute_num_layers only means something with recompute 'full'."""
    cfg = dict(cfg)
    if "recompute_num_layers" in cfg and cfg.get("recompute") != "full":
        cfg["recompute_num_layers"] = 0
    return cfg


_AGGREGATED_ONLY = ("tp", "pp", "ep", "dp", "sp", "dynamic_sp", "dp_attention")


@NORMALIZERS.register("disaggregation")
def disaggregation(cfg: dict[str, Any]) -> dict[str, Any]:
    """Serving: keep only the keys the mode uses (pool keys when disaggregated, else replica).

    ``num_gpus`` is set to the deployment's GPU count.
    """
    if cfg.get("mode", "aggregated") == "aggregated":
        out = {k: v for k, v in cfg.items()
               if not k.startswith(("prefill_", "decode_")) and k != "kv_transfer"}
    else:
        out = {k: v for k, v in cfg.items() if k not in _AGGREGATED_ONLY}
    out["num_gpus"] = serving_num_gpus(out)
    return out
