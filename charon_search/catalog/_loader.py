"""Load a ``ModelSpec`` from a catalog name, a ``config.json`` path, or an HF ``nn.Module``."""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from charon_search.catalog.spec import ModelSpec
from charon_search.errors import ConfigError

__all__ = [
    "config_hash",
    "list_models",
    "load_model",
    "resolve_model_name",
    "spec_from_config",
    "spec_hash",
]

#: Keys in shipped configs that are ours, not HF's.
_PRIVATE_PREFIX = "_charon_"


def _configs_dir() -> Path:
    return Path(str(resources.files("charon_search.catalog") / "configs"))


@functools.cache
def _catalog() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(_configs_dir().glob("*.json")):
        out[path.stem] = json.loads(path.read_text())
    return out


@functools.cache
def _aliases() -> dict[str, str]:
    table: dict[str, str] = {}
    for name, cfg in _catalog().items():
        table[name.lower()] = name
        for alias in cfg.get("_charon_aliases", ()):
            table[alias.lower()] = name
            # "meta-llama/Llama-3.1-70B" also matches "Llama-3.1-70B".
            table[alias.split("/")[-1].lower()] = name
    return table


def list_models() -> list[str]:
    """Catalog names of every shipped model, sorted."""
    return sorted(_catalog())


def resolve_model_name(name: str) -> str:
    """Catalog name of ``name`` (a catalog name or an HF id, case-insensitive).

    Raises:
        ConfigError: unknown name; the message lists the closest catalog names.
    """
    key = name.strip().lower()
    table = _aliases()
    if key in table:
        return table[key]
    close = difflib.get_close_matches(key, list(table), n=5, cutoff=0.5)
    hint = (f"closest catalog names: {', '.join(sorted({table[c] for c in close}))}" if close
            else "run `charon-search catalog` for the list")
    if "/" in name:  # an HF id or a relative path: say that neither was found
        hint = f"no file or folder {name!r} exists either; {hint}"
    raise ConfigError(
        f"`model` must be a catalog name, an HF id of one, or a path to a config.json, but got "
        f"{name!r}; {hint}"
    )


def config_hash(hf_config: Mapping[str, Any]) -> str:
    """Stable hash of a config's HF content (our private ``_charon_*`` keys excluded)."""
    clean = {k: v for k, v in hf_config.items() if not k.startswith(_PRIVATE_PREFIX)}
    blob = json.dumps(clean, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


#: ``ModelSpec`` fields that name or describe a spec without shaping its model: the same
#: architecture under two names shares its cached traces and counts.
_UNSHAPING_FIELDS = ("name", "num_params", "params_per_expert")


def spec_hash(spec: ModelSpec) -> str:
    """Stable hash of everything in ``spec`` that shapes its traced graphs and parameter count:
    the HF config's content (as ``config_hash``) and every derived field (``layer_types``,
    experts, ``extra``...), which a caller may change on its own (``dataclasses.replace``) or a
    loader change may derive differently from the same config. Not the name or the counts."""
    import dataclasses

    fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)
              if f.name not in _UNSHAPING_FIELDS}
    fields["hf_config"] = config_hash(spec.hf_config)
    blob = json.dumps(fields, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def load_model(model: Any) -> ModelSpec:
    """A ``ModelSpec`` for a catalog name, HF id, ``config.json`` path, or HF ``nn.Module``.

    An ``nn.Module`` must be a HuggingFace model (it has a ``.config``): the spec is read from
    that config and ``num_params`` counted on the module itself; tracing rebuilds the HF class
    from the config on the meta device (the module's own weights are never touched).

    Example:
        >>> spec = load_model("llama-3.1-8b")
        >>> spec.num_layers, spec.num_params
        (32, 8030261248)

    Raises:
        ConfigError: unknown name, missing/malformed file, or an unsupported architecture.
    """
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, Path) or (isinstance(model, str) and _looks_like_path(model)):
        path = Path(model)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise ConfigError(f"model config file {str(path)!r} does not exist")
        try:
            cfg = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ConfigError(f"model config {str(path)!r} is not valid JSON: {e}") from e
        if not isinstance(cfg, dict):
            raise ConfigError(f"model config {str(path)!r} must hold a JSON object")
        return spec_from_config(str(path), cfg)
    if isinstance(model, str):
        name = resolve_model_name(model)
        return spec_from_config(name, _catalog()[name])
    hf_cfg = getattr(model, "config", None)
    if hf_cfg is not None and hasattr(hf_cfg, "to_dict"):
        cfg = hf_cfg.to_dict()
        cls = type(model)
        # Tracing rebuilds the stock HF class from the config: a subclass or remote-code model
        # would be simulated without its own layers and forward, so it is refused.
        if (not cls.__module__.startswith("transformers.models.")
                or not cls.__name__.endswith("ForCausalLM")):
            raise ConfigError(
                f"`model` {cls.__name__} (module {cls.__module__}) is not a HuggingFace "
                f"transformers causal-LM class: charon-search traces the stock *ForCausalLM "
                f"class its config names, rebuilt from the config, so code of its own would not "
                f"be simulated; pass the stock causal-LM model or its config.json")
        spec = spec_from_config(cls.__name__, cfg)
        n = int(sum(p.numel() for p in model.parameters()))
        if n != spec.num_params:
            raise ConfigError(
                f"`model` {cls.__name__} holds {n:,} parameters, but the class rebuilt from its "
                f"config holds {spec.num_params:,}: modules added to it (adapters, extra heads) "
                f"would not be simulated; pass the stock model or its config.json")
        return spec
    raise ConfigError(
        f"`model` must be a catalog name, a config.json path, or a HuggingFace model "
        f"(nn.Module with a .config), but got {type(model).__name__}"
    )


def _looks_like_path(s: str) -> bool:
    return s.endswith(".json") or s.startswith((".", "/", "~")) or Path(s).exists()


def spec_from_config(
    name: str, cfg: Mapping[str, Any], *, count_params: bool = True
) -> ModelSpec:
    """Build a ``ModelSpec`` from a raw HF ``config.json`` dict."""
    from charon_search.catalog._hf import count_params as _count
    from charon_search.catalog._hf import hf_config_object

    cfg = dict(cfg)
    _check_sizes_positive(name, cfg)
    hf = hf_config_object(name, cfg)
    _check_rope_type(name, cfg, hf)
    _check_sizes_stated(name, cfg, hf)
    fields = _spec_fields(name, hf)
    spec = ModelSpec(name=name, hf_config=cfg, **fields)
    if count_params:
        import dataclasses

        from charon_search.catalog._hf import count_params_per_expert

        spec = dataclasses.replace(spec, num_params=_count(spec),
                                   params_per_expert=count_params_per_expert(spec))
    return spec


#: Sizes a config.json must state itself: transformers fills a missing one with its reference
#: checkpoint's default (a bare ``{"model_type": "llama"}`` builds Llama-2-7B), a model nobody
#: asked for.
REQUIRED_SIZES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
#: The MLP width is required too, except where the architecture derives it (GPT-2's, GPT-J's
#: and GPT-BigCode's ``n_inner`` = 4h, MPT's ``expansion_ratio``, Bloom's and Falcon's 4h) or
#: a MoE whose every layer is MoE states its experts' width instead (Qwen3.5).
WIDTH_DERIVED_TYPES = frozenset({"gpt2", "mpt", "gptj", "gpt_bigcode", "bloom", "falcon"})


#: Keys under which multimodal config.json files nest their language model's config.
NESTED_TEXT_CONFIGS = ("text_config", "llm_config", "language_config")

#: Sizes that must be positive integers wherever a config.json (or its nested text config)
#: states them, under their HF spellings.
POSITIVE_SIZES = ("hidden_size", "n_embd", "num_hidden_layers", "n_layer",
                  "num_attention_heads", "n_head", "num_key_value_heads", "vocab_size",
                  "intermediate_size", "head_dim")


def _check_sizes_positive(name: str, cfg: Mapping[str, Any]) -> None:
    """``ConfigError`` naming a size of ``cfg`` that is not a positive integer, or key/value
    heads that do not divide the attention heads (transformers would fail later with a bare
    ``ZeroDivisionError``, or build a model no GPU runs)."""
    parts = [("", cfg)] + [(f"{sub}.", cfg[sub]) for sub in NESTED_TEXT_CONFIGS
                           if isinstance(cfg.get(sub), Mapping)]
    for prefix, part in parts:
        for key in POSITIVE_SIZES:
            v = part.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ConfigError(f"model config {name!r}: field `{prefix}{key}` must be a "
                                  f"positive integer, but got {v!r}")
        heads = part.get("num_attention_heads", part.get("n_head"))
        kv = part.get("num_key_value_heads")
        if heads and kv and heads % kv:
            raise ConfigError(f"model config {name!r}: field `{prefix}num_key_value_heads` "
                              f"must divide `num_attention_heads` ({heads}), but got {kv}")


def _check_sizes_stated(name: str, cfg: Mapping[str, Any], hf: Any) -> None:
    """``ConfigError`` naming the ``REQUIRED_SIZES`` that ``cfg`` (or its nested text config)
    leaves out, under any of the spellings the config class maps them to (``n_embd``...), and,
    for a mixture of experts or MLA attention, the expert and ``MLA_FIELDS`` sizes it leaves
    out (``_check_moe_fields_stated``)."""
    stated = set(cfg)
    aliases: dict[str, str] = dict(getattr(type(hf), "attribute_map", {}) or {})
    for sub in NESTED_TEXT_CONFIGS:
        if isinstance(cfg.get(sub), Mapping):
            stated |= set(cfg[sub])
    text = hf.get_text_config() if hasattr(hf, "get_text_config") else hf
    aliases.update(getattr(type(text), "attribute_map", {}) or {})
    required = REQUIRED_SIZES + (() if text.model_type in WIDTH_DERIVED_TYPES
                                 else ("intermediate_size",))
    text_cfg = next((cfg[s] for s in NESTED_TEXT_CONFIGS if isinstance(cfg.get(s), Mapping)),
                    cfg)
    all_moe = "moe_intermediate_size" in stated and not (
        text_cfg.get("mlp_only_layers") or text_cfg.get("first_k_dense_replace")
        or (text_cfg.get("decoder_sparse_step") or 1) > 1)
    # DBRX: every layer is MoE, its experts' width is `ffn_config.ffn_hidden_size`.
    nested_width = isinstance(text_cfg.get("ffn_config"), Mapping) and (
        "ffn_hidden_size" in text_cfg["ffn_config"])
    missing = [k for k in required if k not in stated and aliases.get(k) not in stated
               and not (k == "intermediate_size"
                        and (stated & {"ffn_dim", "d_ff"} or all_moe or nested_width))]
    if missing:
        raise ConfigError(f"model config {name!r} must state {', '.join(missing)} (transformers "
                          f"would fill in its own defaults for model_type "
                          f"{cfg.get('model_type')!r})")
    _check_moe_fields_stated(name, text, text_cfg, stated, aliases)


#: Spellings of the expert count, the experts per token and the experts' MLP width across
#: transformers' MoE config classes (``num_experts`` / ``num_local_experts`` (Mixtral, gpt-oss,
#: Llama 4) / ``n_routed_experts`` (DeepSeek, GLM) / ``moe_num_experts`` (ERNIE 4.5, DBRX's
#: ``ffn_config``); ``moe_k`` (ERNIE 4.5), ``moe_top_k`` (DBRX)).
EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
EXPERT_TOP_K_KEYS = ("num_experts_per_tok", "num_experts_per_token", "experts_per_token",
                     "moe_k", "moe_top_k")
#: What a MLA (multi-head latent attention) config must state: transformers' defaults are
#: DeepSeek-V3's (q_lora_rank 1536, rope 64...). ``q_lora_rank`` may be ``null`` (V2-Lite).
MLA_FIELDS = ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
              "v_head_dim")


def _check_moe_fields_stated(name: str, text: Any, text_cfg: Mapping[str, Any],
                             stated: set[str], aliases: Mapping[str, str]) -> None:
    """``ConfigError`` naming the expert / MLA fields a MoE or MLA config leaves out: the config
    classes fill them with a reference checkpoint's values (a bare ``qwen3_moe`` gets
    Qwen3-30B-A3B's 128 experts, top-8, width 768), a model nobody asked for."""
    def said(*keys: str) -> bool:
        names = set(keys) | {aliases[k] for k in keys if k in aliases} | {
            a for a, target in aliases.items() if target in keys}
        return bool(names & stated)

    missing: list[str] = []
    ffn = text_cfg.get("ffn_config")
    if isinstance(ffn, Mapping):  # DBRX nests its MoE sizes
        missing = [f"ffn_config.{k}" for k in ("moe_num_experts", "moe_top_k",
                                               "ffn_hidden_size") if k not in ffn]
    elif int(_get(text, *EXPERT_COUNT_KEYS, default=0) or 0) > 0:
        def own(keys: tuple[str, ...]) -> str:
            """The config class's own attribute among ``keys`` and the ``attribute_map``
            spellings of it (``num_local_experts (or num_experts)``)."""
            real = next((k for k in keys if getattr(text, k, None) is not None
                         and k not in aliases), keys[0])
            other = sorted(a for a, target in aliases.items() if target == real)
            return f"{real} (or {', '.join(other)})" if other else real

        if not said(*EXPERT_COUNT_KEYS):
            missing.append(own(EXPERT_COUNT_KEYS))
        if not said(*EXPERT_TOP_K_KEYS):
            missing.append(own(EXPERT_TOP_K_KEYS))
        if getattr(text, "moe_intermediate_size", None) is not None and not said(
                "moe_intermediate_size"):
            missing.append("moe_intermediate_size")
    mla = [k for k in MLA_FIELDS if not said(k)] if getattr(text, "kv_lora_rank", None) else []
    if missing or mla:
        what = " and ".join(w for w, gap in (("a mixture of experts", missing),
                                             ("multi-head latent attention", mla)) if gap)
        missing += mla
        raise ConfigError(f"model config {name!r} (model_type {text.model_type!r}, {what}) must "
                          f"state {', '.join(missing)}: transformers would fill in its reference "
                          f"checkpoint's values")


def _check_rope_type(name: str, cfg: Mapping[str, Any], hf: Any) -> None:
    """``ConfigError`` naming a ``rope_scaling`` / ``rope_parameters`` ``rope_type`` (or its old
    spelling ``type``) that transformers has no RoPE for (it would fail building the model with
    a bare ``KeyError``). Read from the config object, after its class has normalised its own
    aliases (Qwen2-VL's ``mrope`` is ``default``); per-layer-type parameters (Gemma 3) one by
    one."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    text = hf.get_text_config() if hasattr(hf, "get_text_config") else hf
    rope = getattr(text, "rope_parameters", None)
    if not isinstance(rope, Mapping):
        return
    allowed = ["default", *ROPE_INIT_FUNCTIONS]
    per_layer = {f"{k}.": v for k, v in rope.items() if isinstance(v, Mapping)} or {"": rope}
    for layer, params in per_layer.items():
        kind = params.get("rope_type")
        if kind is not None and kind not in allowed:
            raise ConfigError(f"model config {name!r}: field `{_rope_field(cfg, layer)}` must "
                              f"be one of {allowed}, but got {kind!r}")


def _rope_field(cfg: Mapping[str, Any], layer: str) -> str:
    """Where ``cfg`` states its RoPE type: ``rope_scaling.rope_type``,
    ``text_config.rope_parameters.type``..."""
    parts = [("", cfg)] + [(f"{sub}.", cfg[sub]) for sub in NESTED_TEXT_CONFIGS
                           if isinstance(cfg.get(sub), Mapping)]
    for prefix, part in parts:
        for field_name in ("rope_scaling", "rope_parameters"):
            rope = part.get(field_name)
            if isinstance(rope, Mapping):
                params = rope.get(layer[:-1], rope) if layer else rope
                key = "type" if isinstance(params, Mapping) and "type" in params and (
                    "rope_type" not in params) else "rope_type"
                return f"{prefix}{field_name}.{layer}{key}"
    return f"rope_parameters.{layer}rope_type"


#: model types whose MLP is two matrices with an activation between (no gate).
_PLAIN_MLP = frozenset({"gpt2", "mpt", "opt", "gpt_neox", "gptj", "bloom", "falcon"})


def _get(hf: Any, *names: str, default: Any = None) -> Any:
    for n in names:
        v = getattr(hf, n, None)
        if v is not None:
            return v
    return default


def _spec_fields(name: str, hf: Any) -> dict[str, Any]:
    mt = hf.model_type
    layers = int(_get(hf, "num_hidden_layers", "n_layer"))
    hidden = int(_get(hf, "hidden_size", "n_embd"))
    heads = int(_get(hf, "num_attention_heads", "n_head"))
    kv = int(_get(hf, "num_key_value_heads", default=heads))
    extra: dict[str, Any] = {}
    attention = "mha" if kv == heads else "gqa"
    v_head_dim = 0
    if getattr(hf, "kv_lora_rank", None):
        attention = "mla"
        head_dim = int(hf.qk_nope_head_dim + hf.qk_rope_head_dim)
        v_head_dim = int(hf.v_head_dim)
        extra.update(kv_lora_rank=hf.kv_lora_rank, q_lora_rank=hf.q_lora_rank,
                     qk_rope_head_dim=hf.qk_rope_head_dim, qk_nope_head_dim=hf.qk_nope_head_dim)
        if getattr(hf, "index_topk", None):
            extra["dsa"] = _dsa_fields(hf, layers)
    else:
        head_dim = int(_get(hf, "head_dim", default=hidden // heads))
    if mt == "gpt2":
        intermediate = int(hf.n_inner or 4 * hidden)
    elif mt == "mpt":
        intermediate = int(hf.expansion_ratio * hidden)
    elif mt == "llama4_text":
        # Llama 4: `intermediate_size` is the experts' (and the shared expert's) width, the
        # dense layers' MLP is `intermediate_size_mlp` (transformers Llama4TextMLP).
        intermediate = int(hf.intermediate_size_mlp)
    elif _nested_ffn(hf) is not None:
        # DBRX: no dense layer; its experts' width is `ffn_config.ffn_hidden_size`.
        intermediate = int(_nested_ffn(hf).ffn_hidden_size)
    else:
        intermediate = int(_get(hf, "intermediate_size", "ffn_dim", default=4 * hidden))
    gated = mt not in _PLAIN_MLP
    moe_cfg = _nested_ffn(hf) or hf
    num_experts = int(_get(moe_cfg, *EXPERT_COUNT_KEYS, default=0))
    top_k = int(_get(moe_cfg, *EXPERT_TOP_K_KEYS, default=0))
    stated = next((k for k in EXPERT_COUNT_KEYS if getattr(moe_cfg, k, None) is not None), None)
    if stated and (num_experts < 1 or not 1 <= top_k <= num_experts):
        raise ConfigError(f"model config {name!r}: a MoE needs `{stated}` >= 1 and 1 <= "
                          f"`num_experts_per_tok` <= it, but got {num_experts} experts and "
                          f"top-k {top_k}")
    moe_inter = 0
    shared = 0
    if num_experts:
        moe_inter = int(_get(hf, "moe_intermediate_size", default=intermediate))
        shared = int(_get(hf, "n_shared_experts", "moe_num_shared_experts", default=0) or 0)
        if mt == "llama4_text":  # one shared expert beside the routed ones (Llama4TextMoe)
            moe_inter, shared = int(hf.intermediate_size), 1
        if mt in ("qwen2_moe", "qwen3_next", "qwen3_5_moe_text") and _get(
                hf, "shared_expert_intermediate_size", default=0):
            shared = 1
    layer_types = _layer_types(name, mt, hf, layers, num_experts)
    sw = getattr(hf, "sliding_window", None)
    if sw:
        extra["sliding_window"] = int(sw)
    chunk = getattr(hf, "attention_chunk_size", None)
    if chunk:
        extra["attention_chunk_size"] = int(chunk)
    attn_types = getattr(hf, "layer_types", None)
    if attn_types and isinstance(attn_types, (list, tuple)):
        extra["attention_layer_types"] = tuple(attn_types)
    if any(t.endswith("_linear") for t in layer_types):
        # Gated DeltaNet shapes (Qwen3-Next / Qwen3.5 config keys).
        extra["linear_attention"] = {
            "k_heads": int(hf.linear_num_key_heads), "v_heads": int(hf.linear_num_value_heads),
            "k_head_dim": int(hf.linear_key_head_dim), "v_head_dim": int(hf.linear_value_head_dim),
            "conv_kernel": int(hf.linear_conv_kernel_dim)}
    if mt == "gpt2":
        extra["max_position_embeddings"] = int(hf.n_positions)
    else:
        mpe = getattr(hf, "max_position_embeddings", None)
        if mpe:
            extra["max_position_embeddings"] = int(mpe)
    return dict(
        model_type=mt, num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
        num_key_value_heads=kv, head_dim=head_dim, intermediate_size=intermediate,
        vocab_size=int(hf.vocab_size), tie_word_embeddings=bool(hf.tie_word_embeddings),
        gated_mlp=gated, attention=attention, v_head_dim=v_head_dim, num_experts=num_experts,
        num_experts_per_token=top_k, moe_intermediate_size=moe_inter, num_shared_experts=shared,
        layer_types=layer_types, extra=extra,
    )


def _dsa_fields(hf: Any, layers: int) -> dict[str, int]:
    """DeepSeek Sparse Attention (GLM-5 ``glm_moe_dsa``, DeepSeek-V3.2) indexer shapes.

    ``indexer_layers``: layers running their own lightning indexer (transformers
    ``GlmMoeDsaConfig.indexer_types`` entry ``"full"``; ``"shared"`` layers reuse the previous
    full layer's top-k). GLM-5's config.json sets no pattern, so all 78 layers index."""
    kinds = list(getattr(hf, "indexer_types", None) or ["full"] * layers)
    return {"index_heads": int(hf.index_n_heads), "index_head_dim": int(hf.index_head_dim),
            "index_topk": int(hf.index_topk),
            "indexer_layers": sum(1 for k in kinds if k == "full")}


def _nested_ffn(hf: Any) -> Any:
    """DBRX's ``ffn_config`` (its experts' count, top-k and width), else ``None``."""
    ffn = getattr(hf, "ffn_config", None)
    return ffn if hasattr(ffn, "moe_num_experts") else None


#: HF per-layer ``layer_types`` values (a layer's token mixer) the frontend traces: softmax
#: attention, full or windowed (``sliding_window`` / ``attention_chunk_size``, priced
#: downstream).
ATTENTION_LAYER_TYPES = frozenset({"full_attention", "sliding_attention", "chunked_attention"})
#: ``layer_types`` entries whose token mixer is linear attention, and the model types whose
#: linear attention is Gated DeltaNet (``frontend._linear_attn``): Mamba, Jamba, MiniMax-01 and
#: the other hybrids report their own linear mixers under the same name.
LINEAR_ATTENTION_LAYER_TYPES = frozenset({"linear_attention"})
GATED_DELTANET_MODEL_TYPES = frozenset({"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text",
                                        "qwen3_5", "qwen3_5_moe"})
#: ``indexed_attention`` (DeepSeek Sparse Attention) is traced as the engines' indexer and
#: sparse MLA (``frontend._dsa``) for these model types only.
DSA_MODEL_TYPES = frozenset({"glm_moe_dsa"})


def _layer_types(name: str, mt: str, hf: Any, layers: int,
                 num_experts: int) -> tuple[str, ...]:
    """Block type of each layer: ``dense`` / ``moe`` by the MLP, with ``_linear`` appended for
    layers whose token mixer is Gated DeltaNet (Qwen3-Next, Qwen3.5: ``layer_types``).

    Raises:
        ConfigError: a ``layer_types`` value (token mixer) the frontend does not trace: Mamba
            or other linear-attention mixers, LFM2's short convolutions, Falcon-H1's hybrid
            layers... (they would be priced as the first layer of their MLP type).
    """
    base = _mlp_layer_types(hf, layers, num_experts)
    mixers = getattr(hf, "layer_types", None)
    if not isinstance(mixers, (list, tuple)):
        return base
    supported = set(ATTENTION_LAYER_TYPES)
    if mt in GATED_DELTANET_MODEL_TYPES:
        supported |= LINEAR_ATTENTION_LAYER_TYPES
    if mt in DSA_MODEL_TYPES:
        supported.add("indexed_attention")
    for kind in dict.fromkeys(mixers):
        if kind not in supported:
            where = [i for i, m in enumerate(mixers) if m == kind]
            shown = ", ".join(map(str, where[:6])) + (", ..." if len(where) > 6 else "")
            raise ConfigError(
                f"model config {name!r}: model_type {mt!r} has `layer_types` entry {kind!r} "
                f"(layers {shown}), a token mixer charon-search does not trace; supported: "
                f"{', '.join(sorted(ATTENTION_LAYER_TYPES))}, linear_attention (Gated DeltaNet: "
                f"{', '.join(sorted(GATED_DELTANET_MODEL_TYPES))}), indexed_attention "
                f"({', '.join(sorted(DSA_MODEL_TYPES))})")
    if len(mixers) == layers and any(m in LINEAR_ATTENTION_LAYER_TYPES for m in mixers):
        return tuple(f"{t}_linear" if m in LINEAR_ATTENTION_LAYER_TYPES else t
                     for t, m in zip(base, mixers, strict=True))
    return base


def _mlp_layer_types(hf: Any, layers: int, num_experts: int) -> tuple[str, ...]:
    """``dense`` / ``moe`` MLP of each layer, from the config fields transformers' decoder
    layers test, whatever the model type (``modeling_*.py`` ``DecoderLayer.__init__``):

    * ``mlp_layer_types``: ``"dense"`` or a MoE kind (``"sparse"``) per layer (GLM-5,
      GLM-4.7-Flash ``glm4_moe_lite``, DeepSeek-V3.2, MiMo-V2-Flash...);
    * ``first_k_dense_replace``: layers ``>= k`` are MoE (DeepSeek-V2/V3, Kimi-K2, GLM-4.5 /
      4.6 ``glm4_moe``, dots1, Mistral 4); transformers ignores DeepSeek's ``moe_layer_freq``;
    * ``moe_layer_start_index`` / ``moe_layer_end_index`` / ``moe_layer_interval``: layer ``i``
      is MoE when ``(i + 1) % interval == 0`` and ``start <= i <= end`` (ERNIE 4.5);
    * ``decoder_sparse_step`` / ``mlp_only_layers``: MoE when ``i`` is not MLP-only and
      ``(i + 1) % step == 0`` (Qwen2/3-MoE, Qwen3-Next, Qwen3.5);
    * ``moe_layers``: the MoE layers' indices (Llama 4: every ``interleave_moe_layer_step``-th);
    * otherwise every layer (Mixtral, gpt-oss, MiniMax, DBRX...).

    ``catalog._hf.count_params`` checks the result against the layers transformers builds."""
    if not num_experts:
        return ("dense",) * layers
    kinds = getattr(hf, "mlp_layer_types", None)
    if isinstance(kinds, (list, tuple)) and len(kinds) == layers:
        return tuple("dense" if k == "dense" else "moe" for k in kinds)
    first_dense = getattr(hf, "first_k_dense_replace", None)
    if first_dense is not None:
        return tuple("moe" if i >= int(first_dense) else "dense" for i in range(layers))
    interval = getattr(hf, "moe_layer_interval", None)
    if interval is not None:
        start = int(getattr(hf, "moe_layer_start_index", 0) or 0)
        end = getattr(hf, "moe_layer_end_index", None)
        end = layers - 1 if end is None or end == -1 else int(end)
        return tuple("moe" if (i + 1) % int(interval) == 0 and start <= i <= end else "dense"
                     for i in range(layers))
    step = getattr(hf, "decoder_sparse_step", None)
    only = getattr(hf, "mlp_only_layers", None)
    if step is not None or only is not None:
        step, only = int(step or 1), set(only or ())
        return tuple("moe" if i not in only and (i + 1) % step == 0 else "dense"
                     for i in range(layers))
    moe_layers = getattr(hf, "moe_layers", None)
    if moe_layers is not None:
        moe = set(moe_layers)
        return tuple("moe" if i in moe else "dense" for i in range(layers))
    return ("moe",) * layers
