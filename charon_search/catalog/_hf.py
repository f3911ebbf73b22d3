"""HuggingFace glue: config objects, meta-device models with one layer per type, param counts.

Imports torch and transformers lazily (only when a model is built or counted).
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import json
import threading
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from charon_search.cache import cache_dir, sources_fingerprint
from charon_search.errors import ConfigError

if TYPE_CHECKING:
    from charon_search.catalog.spec import ModelSpec

__all__ = ["ReducedModel", "build_reduced_model", "count_params", "count_params_per_expert",
           "hf_config_object"]

_PRIVATE_PREFIX = "_charon_"
_LOCK = threading.Lock()
_QUIET_LOCK = threading.RLock()


def _clean(cfg: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in cfg.items() if not k.startswith(_PRIVATE_PREFIX)}


def _one_line(e: BaseException, limit: int = 400) -> str:
    """An exception's message on one line (transformers' validation errors span several),
    cut at ``limit`` characters (its unsupported-class error lists every model class)."""
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[:limit] + " ..."


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' config-validation warnings (e.g. Llama 4's released
    ``rope_scaling`` has ``low_freq_factor == high_freq_factor``, which transformers warns about
    on every build): the configs are published ones, the warnings say nothing to a user."""
    from transformers.utils import logging as hf_logging

    with _QUIET_LOCK:  # the verbosity is process-global: one save/restore at a time
        level = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        try:
            yield
        finally:
            hf_logging.set_verbosity(level)


def hf_config_object(name: str, cfg: Mapping[str, Any]) -> Any:
    """A ``transformers`` config object for a raw ``config.json`` dict."""
    from transformers import AutoConfig

    clean = _clean(cfg)
    model_type = clean.pop("model_type", None)
    if not model_type:
        raise ConfigError(f"model config {name!r} must have a `model_type` key")
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        close = difflib.get_close_matches(str(model_type), list(CONFIG_MAPPING.keys()), n=5)
        raise ConfigError(f"model config {name!r}: transformers has no model_type "
                          f"{model_type!r}" + (f"; closest: {close}" if close else ""))
    try:
        with quiet_transformers():
            return AutoConfig.for_model(model_type, **clean)
    except Exception as e:  # transformers raises several types for bad configs
        raise ConfigError(
            f"model config {name!r}: transformers cannot build model_type={model_type!r}: "
            f"{_one_line(e)}") from e


class ReducedModel:
    """An HF causal-LM on the meta device holding one decoder layer per layer type.

    ``layer_type_of[j]`` is the type (``dense``/``moe``) of the j-th kept layer; the kept layers
    are the first layer of each type in the full model (their ``layer_idx`` renumbered 0..k-1).
    """

    def __init__(self, model: Any, layers_path: str, layer_type_of: tuple[str, ...],
                 orig_index: tuple[int, ...]) -> None:
        self.model = model
        self.layers_path = layers_path
        self.layer_type_of = layer_type_of
        self.orig_index = orig_index


def _find_layers(model: Any, num_layers: int) -> tuple[str, Any]:
    import torch.nn as nn

    best: tuple[str, Any] | None = None
    for path, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and len(mod) == num_layers and (
            best is None or len(path) < len(best[0])
        ):
            best = (path, mod)
    if best is None:
        raise ConfigError(f"cannot find the decoder layer list ({num_layers} layers) in "
                          f"{type(model).__name__}")
    return best


def build_reduced_model(
    spec: ModelSpec, *, attn_impl: str = "sdpa", all_layers: bool = False
) -> ReducedModel:
    """Build ``spec``'s HF model on the meta device with one decoder layer per layer type."""
    import torch
    from transformers import AutoModelForCausalLM

    types = spec.layer_types or ("dense",) * spec.num_layers
    reps: list[int] = []
    for t in dict.fromkeys(types):
        reps.append(types.index(t))
    n_build = spec.num_layers if all_layers else max(reps) + 1
    cfg = _clean(spec.hf_config)
    n_key = "n_layer" if "n_layer" in cfg else "num_hidden_layers"
    n_orig = int(cfg.get(n_key, spec.num_layers))
    for k, v in list(cfg.items()):
        if isinstance(v, list) and len(v) == n_orig and k != "architectures":
            cfg[k] = v[:n_build]
    if cfg.get("mlp_only_layers"):
        cfg["mlp_only_layers"] = [i for i in cfg["mlp_only_layers"] if i < n_build]
    cfg[n_key] = n_build
    hf = hf_config_object(spec.name, {**cfg, "model_type": spec.model_type})
    kwargs: dict[str, Any] = {"attn_implementation": attn_impl}
    if spec.num_experts:
        kwargs["experts_implementation"] = "grouped_mm"
    with _LOCK, torch.device("meta"), quiet_transformers():
        try:
            try:
                model = AutoModelForCausalLM.from_config(hf, **kwargs)
            except (ValueError, TypeError, KeyError) as e:
                if "experts_implementation" not in kwargs or "experts" not in str(e):
                    raise
                # Models whose experts module is their own (Llama 4's batched experts) reject
                # the grouped_mm switch; the frontend swaps their forward instead.
                kwargs["experts_implementation"] = "eager"
                model = AutoModelForCausalLM.from_config(hf, **kwargs)
        except Exception as e:  # transformers raises several types for configs it cannot build
            raise ConfigError(
                f"model {spec.name!r}: transformers cannot build it with "
                f"attn_implementation={attn_impl!r}: {type(e).__name__}: {_one_line(e)}"
            ) from e
    model.to(torch.bfloat16)
    path, layers = _find_layers(model, n_build)
    if all_layers:
        return ReducedModel(model, path, tuple(types), tuple(range(n_build)))
    kept = [layers[i] for i in reps]
    for j, layer in enumerate(kept):
        for mod in layer.modules():
            if hasattr(mod, "layer_idx"):
                mod.layer_idx = j
    import torch.nn as nn

    parent_path, _, attr = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    setattr(parent, attr, nn.ModuleList(kept))
    text_cfg = model.config
    setattr(text_cfg, n_key if hasattr(text_cfg, n_key) else "num_hidden_layers", len(kept))
    if isinstance(getattr(text_cfg, "layer_types", None), list):
        orig_lt = list(text_cfg.layer_types)
        text_cfg.layer_types = [orig_lt[i] for i in reps]
    return ReducedModel(model, path, tuple(types[i] for i in reps), tuple(reps))


@functools.cache
def _param_cache_file() -> Any:
    import transformers

    return cache_dir("catalog") / f"model_counts-tf{transformers.__version__}.json"


_COUNTS_MEM: dict[str, dict[str, int]] = {}


def _counts_key(spec: ModelSpec) -> str:
    """Cache key of ``spec``'s counts: this package's catalog code (which derives and checks
    the layer types) and every field of ``spec`` that shapes the model (``spec_hash``); the
    transformers version names the cache file."""
    from charon_search.catalog._loader import spec_hash

    return f"{sources_fingerprint('catalog')}:{spec_hash(spec)}"


def count_params(spec: ModelSpec) -> int:
    """Exact parameter count of ``spec``'s HF model class (what it instantiates on meta).

    Counted on the full model built on the meta device (a fraction of a second even for a
    trillion parameters), after checking that every layer is built like the first layer of its
    type in ``spec.layer_types`` (the layer the frontend traces for all of them:
    ``_check_layer_types``). Cached in memory and in ``cache_dir("catalog")``.

    Raises:
        ConfigError: transformers cannot build the model, or builds layers that
            ``spec.layer_types`` types alike differently.
    """
    return _counts(spec)["num_params"]


def count_params_per_expert(spec: ModelSpec) -> int:
    """Parameters of one routed expert of ``spec``'s MoE layers as transformers builds it
    (weights and biases: gpt-oss's experts carry biases), 0 for a dense model."""
    return _counts(spec)["params_per_expert"]


def _counts(spec: ModelSpec) -> dict[str, int]:
    key = _counts_key(spec)
    if key in _COUNTS_MEM:
        return _COUNTS_MEM[key]
    path = _param_cache_file()
    disk: dict[str, dict[str, int]] = {}
    if path.is_file():
        try:
            disk = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            disk = {}
    hit = disk.get(key)
    if isinstance(hit, dict) and {"num_params", "params_per_expert"} <= set(hit):
        _COUNTS_MEM[key] = {k: int(v) for k, v in hit.items()}
        return _COUNTS_MEM[key]
    counts = _count_uncached(spec)
    _COUNTS_MEM[key] = counts
    # Entries of older catalog code can never be hit again: drop them.
    code = key.split(":", 1)[0]
    disk = {k: v for k, v in disk.items() if k.startswith(f"{code}:")}
    disk[key] = counts
    tmp = path.with_suffix(f".tmp{threading.get_ident()}")
    tmp.write_text(json.dumps(disk, indent=0, sort_keys=True))
    tmp.replace(path)
    return counts


def _count_uncached(spec: ModelSpec) -> dict[str, int]:
    # Counted on the eager attention path, which every HF class has; a config it cannot build
    # is reported without naming that path (the user asked for none: ``trace --attn sdpa``).
    try:
        rm = build_reduced_model(spec, attn_impl="eager", all_layers=True)
    except ConfigError as e:
        cause = e.__cause__ or e
        raise ConfigError(f"model {spec.name!r}: transformers cannot build it: "
                          f"{type(cause).__name__}: {_one_line(cause)}") from cause
    layers = rm.model.get_submodule(rm.layers_path)
    per_expert = _check_layer_types(spec, layers)
    return {"num_params": int(sum(p.numel() for p in rm.model.parameters())),
            "params_per_expert": per_expert}


def _check_layer_types(spec: ModelSpec, layers: Any) -> int:
    """Check that transformers built ``spec``'s layers as ``spec.layer_types`` types them, and
    return the parameters of one routed expert (0 for a dense model).

    The frontend traces the first layer of each type and prices every layer of the type like
    it, so every layer must hold the same parameter-owning modules (class, path, parameter
    shapes) as that first one; a ``dense`` layer must hold no routed experts (a module named
    ``experts``), a ``moe`` one must. A config field the loader does not read (a dense/MoE
    pattern, another token mixer) otherwise prices one layer's kind for all of them.
    """
    from charon_search.catalog.spec import is_moe_block

    types = spec.layer_types or ("dense",) * spec.num_layers
    first: dict[str, int] = {}
    for i, t in enumerate(types):
        j = first.setdefault(t, i)
        if _layer_signature(layers[i]) != _layer_signature(layers[j]):
            raise ConfigError(
                f"model {spec.name!r} (model_type {spec.model_type!r}): transformers builds "
                f"layer {i} unlike layer {j} ({_layer_difference(layers[j], layers[i])}), but "
                f"charon-search reads both as {t!r} layers from the config; this layer pattern "
                f"is not supported")
    per_expert = 0
    for t, j in first.items():
        experts = _routed_experts(layers[j])
        if experts is None and not is_moe_block(t):
            continue
        if experts is None or not is_moe_block(t):
            raise ConfigError(
                f"model {spec.name!r} (model_type {spec.model_type!r}): layer {j} is read as "
                f"a {t!r} layer from the config, but transformers builds it "
                f"{'with' if experts is not None else 'without'} routed experts; this "
                f"config's MoE fields are not supported")
        n = sum(p.numel() for p in experts.parameters())
        per_expert = n // max(spec.num_experts, 1)
    return int(per_expert)


def _routed_experts(layer: Any) -> Any:
    """A decoder layer's routed-experts module (transformers names it ``experts``: ``mlp``,
    ``block_sparse_moe``, ``feed_forward``, DBRX's ``ffn``), else ``None``."""
    return next((m for path, m in layer.named_modules()
                 if path.rpartition(".")[2] == "experts"), None)


def _layer_signature(layer: Any) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
    """(module path, class, parameter shapes) of each module of ``layer`` owning parameters
    (parameter-free modules such as Llama 4's L2 norm of its RoPE layers are left out)."""
    out = []
    for path, mod in layer.named_modules():
        shapes = tuple(tuple(p.shape) for p in mod.parameters(recurse=False))
        if shapes:
            out.append((path, type(mod).__name__, shapes))
    return tuple(out)


def _layer_difference(a: Any, b: Any) -> str:
    """The first top-level submodules in which layers ``a`` and ``b`` differ, as
    ``name: ClassA vs ClassB``."""
    diffs = []
    for name in dict.fromkeys([*dict(a.named_children()), *dict(b.named_children())]):
        ma, mb = getattr(a, name, None), getattr(b, name, None)
        sa = _layer_signature(ma) if ma is not None else ()
        sb = _layer_signature(mb) if mb is not None else ()
        if sa != sb:
            diffs.append(f"{name}: {type(ma).__name__} vs {type(mb).__name__}")
    return "; ".join(diffs[:3]) or "parameter shapes"


def count_params_full(spec: ModelSpec) -> int:
    """Parameters of the full HF model instantiated on the meta device (slow for huge models)."""
    import torch
    from transformers import AutoModelForCausalLM

    hf = hf_config_object(spec.name, spec.hf_config)
    with _LOCK, torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf)
    return int(sum(p.numel() for p in model.parameters()))
