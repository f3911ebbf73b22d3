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

from charon_search.cache import cache_dir
from charon_search.errors import ConfigError

if TYPE_CHECKING:
    from charon_search.catalog.spec import ModelSpec

__all__ = ["ReducedModel", "build_reduced_model", "count_params", "hf_config_object"]

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

    return cache_dir("catalog") / f"num_params-tf{transformers.__version__}.json"


_PARAMS_MEM: dict[str, int] = {}


def count_params(spec: ModelSpec) -> int:
    """Exact parameter count of ``spec``'s HF model class (what it instantiates on meta).

    Counted on a reduced meta model (one layer per type): non-layer parameters plus, per layer
    type, the layer's parameters times the number of layers of that type. Cached in memory and
    in ``cache_dir("catalog")``.
    """
    from charon_search.catalog._loader import config_hash

    key = f"{spec.model_type}:{config_hash(spec.hf_config)}"
    if key in _PARAMS_MEM:
        return _PARAMS_MEM[key]
    path = _param_cache_file()
    disk: dict[str, int] = {}
    if path.is_file():
        try:
            disk = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            disk = {}
    if key in disk:
        _PARAMS_MEM[key] = int(disk[key])
        return _PARAMS_MEM[key]
    n = _count_uncached(spec)
    _PARAMS_MEM[key] = n
    disk[key] = n
    tmp = path.with_suffix(f".tmp{threading.get_ident()}")
    tmp.write_text(json.dumps(disk, indent=0, sort_keys=True))
    tmp.replace(path)
    return n


def _count_uncached(spec: ModelSpec) -> int:
    # Counted on the eager attention path, which every HF class has; a config it cannot build
    # is reported without naming that path (the user asked for none: ``trace --attn sdpa``).
    try:
        rm = build_reduced_model(spec, attn_impl="eager")
    except ConfigError as e:
        cause = e.__cause__ or e
        raise ConfigError(f"model {spec.name!r}: transformers cannot build it: "
                          f"{type(cause).__name__}: {_one_line(cause)}") from cause
    layers = rm.model.get_submodule(rm.layers_path)
    layer_ids = {id(p) for layer in layers for p in layer.parameters()}
    outside = sum(p.numel() for p in rm.model.parameters() if id(p) not in layer_ids)
    total = outside
    for j, layer in enumerate(layers):
        t = rm.layer_type_of[j]
        total += spec.num_layers_of(t) * sum(p.numel() for p in layer.parameters())
    return int(total)


def count_params_full(spec: ModelSpec) -> int:
    """Parameters of the full HF model instantiated on the meta device (slow for huge models)."""
    import torch
    from transformers import AutoModelForCausalLM

    hf = hf_config_object(spec.name, spec.hf_config)
    with _LOCK, torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf)
    return int(sum(p.numel() for p in model.parameters()))
