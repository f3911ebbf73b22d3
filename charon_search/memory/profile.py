"""Per-model memory profile: liveness summaries and parameter groups of every block, cached.

Tracing and the liveness walk run once per (model, phase, attention implementation); every
layout afterwards is arithmetic on the cached summaries.
"""

from __future__ import annotations

import inspect
import json
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from charon_search.catalog.spec import ModelSpec
from charon_search.ir.graph import TracedBlock
from charon_search.memory.liveness import BlockActivations, block_activations
from charon_search.memory.static import ParamGroups, analytic_param_groups, traced_param_groups

__all__ = ["ModelMemoryProfile", "model_profile"]


@dataclass(frozen=True, kw_only=True)
class ModelMemoryProfile:
    """Liveness summaries and parameter groups of a model's blocks.

    ``blocks`` and ``params`` are keyed like ``TracedModel.blocks``: ``embedding``, ``lm_head``
    and one entry per decoder layer type.
    """

    spec: ModelSpec
    phase: str
    attn_impl: str
    blocks: Mapping[str, BlockActivations]
    params: Mapping[str, ParamGroups]

    @classmethod
    def from_blocks(cls, spec: ModelSpec, blocks: Mapping[str, TracedBlock], *,
                    phase: str = "train", attn_impl: str = "sdpa") -> ModelMemoryProfile:
        """Build from traced blocks (a ``TracedModel.blocks`` dict or hand-built graphs)."""
        acts = {name: block_activations(b) for name, b in blocks.items()}
        params: dict[str, ParamGroups] = {}
        for name, b in blocks.items():
            groups = traced_param_groups(b)
            if groups.total == 0 and name in ("embedding", "lm_head", *spec.block_types):
                groups = analytic_param_groups(spec, name)
            params[name] = groups
        for name in ("embedding", "lm_head", *spec.block_types):
            if name not in params:
                params[name] = analytic_param_groups(spec, name)
        return cls(spec=spec, phase=phase, attn_impl=attn_impl, blocks=acts, params=params)


_LOCK = threading.Lock()
_BY_ID: dict[tuple[int, str, str], tuple[weakref.ref[ModelSpec], ModelMemoryProfile]] = {}
_BY_KEY: dict[tuple[str, str, str], ModelMemoryProfile] = {}


def _spec_key(spec: ModelSpec) -> str:
    return json.dumps(
        {"name": spec.name, "hf": spec.hf_config, "layers": spec.layer_types},
        sort_keys=True, default=str,
    )


def _trace(spec: ModelSpec, phase: str, attn_impl: str) -> Any:
    from charon_search.frontend import trace_model

    kwargs: dict[str, Any] = {"phase": phase}
    if "attn_impl" in inspect.signature(trace_model).parameters:
        kwargs["attn_impl"] = attn_impl
    return trace_model(spec, **kwargs)


def model_profile(spec: ModelSpec, *, phase: str = "train",
                  attn_impl: str = "sdpa") -> ModelMemoryProfile:
    """The cached memory profile of ``spec`` (traced with ``frontend.trace_model`` once).

    Args:
        spec: The model.
        phase: ``train`` (forward + backward) or ``prefill`` (forward only, serving).
        attn_impl: ``sdpa`` (fused/flash attention) or ``eager`` (materialised scores).
    """
    id_key = (id(spec), phase, attn_impl)
    hit = _BY_ID.get(id_key)
    if hit is not None and hit[0]() is spec:
        return hit[1]
    key = (_spec_key(spec), phase, attn_impl)
    with _LOCK:
        prof = _BY_KEY.get(key)
    if prof is None:
        traced = _trace(spec, phase, attn_impl)
        prof = ModelMemoryProfile.from_blocks(spec, traced.blocks, phase=phase,
                                              attn_impl=attn_impl)
        with _LOCK:
            _BY_KEY[key] = prof
    with _LOCK:
        _BY_ID[id_key] = (weakref.ref(spec), prof)
    return prof
