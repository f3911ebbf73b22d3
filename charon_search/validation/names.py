"""Map the names used in validation data onto the project's catalogs.

- Models: HuggingFace ids (``meta-llama/Llama-3.1-70B``) and record ``model.catalog`` names
  (``llama-3.3-70b``) -> model catalog names, through the catalog's own resolver first and
  ``data/validation/names.yaml`` second.
- GPUs: the schema's ``hardware.gpu`` keys (``h100-sxm-80gb``) and aiconfigurator system names
  (``h100_sxm``) -> ``GpuSpec`` through ``hardware.load_gpu`` (which knows aliases).
- Clusters: the rules of ``names.yaml`` (GPU, kind, interconnect, GPU count) pick a cluster spec;
  without a matching rule the smallest cluster with that GPU and enough GPUs is used.

Everything that cannot be mapped raises ``Unexpressible`` with the reason the report prints.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import yaml

from charon_search.errors import CharonError, ConfigError
from charon_search.validation.records import Record, data_dir

if TYPE_CHECKING:
    from charon_search.catalog.spec import ModelSpec
    from charon_search.hardware.spec import ClusterSpec, GpuSpec

__all__ = ["ClusterChoice", "Unexpressible", "choose_cluster", "name_map", "resolve_gpu",
           "resolve_model_name"]


class Unexpressible(Exception):
    """The simulator cannot express a record; ``str(e)`` is the reason shown in reports."""


@functools.cache
def name_map() -> Mapping[str, Any]:
    """The parsed ``names.yaml`` (``models``, ``gpus``, ``clusters``)."""
    path = data_dir() / "names.yaml"
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, Mapping) or set(data) != {"models", "gpus", "clusters"}:
        raise ConfigError(f"{path}: keys must be ['clusters', 'gpus', 'models']")
    return data


# ----------------------------------------------------------------------------- models
def _catalog_names() -> set[str]:
    try:
        from charon_search.catalog import list_models
    except ImportError:
        return set()
    try:
        return {str(n) for n in list_models()}
    except CharonError:
        return set()


def resolve_model_name(name: str | None) -> str:
    """Catalog name for a HF id or record catalog name; raises ``Unexpressible`` if unknown."""
    if not name:
        raise Unexpressible("unknown model: the record names no catalog architecture")
    candidates = [name]
    mapped = name_map()["models"].get(name)
    if mapped:
        candidates.append(mapped)
    catalog_resolve: Callable[[str], str] | None
    try:  # the catalog's own resolver (engineer A) knows its aliases
        from charon_search.catalog import resolve_model_name as catalog_resolve
    except ImportError:
        catalog_resolve = None
    for cand in candidates:
        if catalog_resolve is not None:
            try:
                return str(catalog_resolve(cand))
            except (CharonError, KeyError, ValueError):
                pass
    known = _catalog_names()
    for cand in candidates:
        if cand in known or cand.lower() in known:
            return cand if cand in known else cand.lower()
    if not known and catalog_resolve is None:
        raise Unexpressible("model catalog not available (charon_search.catalog.list_models)")
    raise Unexpressible(f"unknown model: {name!r} is not in the model catalog")


def load_catalog_model(name: str) -> ModelSpec:
    """``catalog.load_model`` with failures turned into ``Unexpressible``."""
    try:
        from charon_search.catalog import load_model
    except ImportError as e:
        raise Unexpressible(f"model catalog not available: {e}") from e
    try:
        return load_model(name)
    except (CharonError, KeyError, ValueError, OSError) as e:
        raise Unexpressible(f"model {name!r} failed to load: {e}") from e


# ----------------------------------------------------------------------------- GPUs
def resolve_gpu(key: str) -> GpuSpec:
    """GpuSpec for a data GPU key; raises ``Unexpressible`` when no spec exists."""
    try:
        from charon_search.hardware import list_gpus, load_gpu
    except ImportError as e:
        raise Unexpressible(f"hardware specs not available: {e}") from e
    cands = [*list(name_map()["gpus"].get(key, [])), key]
    if key in name_map()["gpus"] and not name_map()["gpus"][key]:
        raise Unexpressible(f"unsupported accelerator {key!r} (no GPU spec: not a GPU)")
    for cand in cands:
        try:
            return load_gpu(cand)
        except (CharonError, KeyError, ValueError):
            continue
    import difflib

    known = sorted({*list_gpus(), *name_map()["gpus"]})
    close = difflib.get_close_matches(str(key), known, n=3, cutoff=0.5)
    tried = f" (tried {cands[:-1]})" if len(cands) > 1 else ""
    raise Unexpressible(f"unsupported GPU {key!r}: no GPU spec of that name{tried}"
                        + (f"; closest: {', '.join(close)}" if close else "")
                        + " (GPU specs: `charon-search catalog`)")


# ----------------------------------------------------------------------------- clusters
@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterChoice:
    cluster: ClusterSpec
    how: str
    """Why this cluster: the rule or the fallback."""


def _list_clusters() -> list[str]:
    from charon_search.hardware import list_clusters

    return [str(c) for c in list_clusters()]


@functools.cache
def _load_cluster_cached(name: str) -> ClusterSpec:
    from charon_search.hardware import load_cluster

    return load_cluster(name)


def _rule_matches(rule: Mapping[str, Any], record: Record, num_gpus: int) -> bool:
    if rule.get("gpu") != record.hardware.get("gpu"):
        return False
    if "kind" in rule and rule["kind"] != record.kind:
        return False
    if "max_gpus" in rule and num_gpus > int(rule["max_gpus"]):
        return False
    needle = rule.get("interconnect_contains")
    if needle:
        text = str(record.hardware.get("interconnect") or "").lower()
        if str(needle).lower() not in text:
            return False
    return True


def choose_cluster(record: Record, num_gpus: int) -> ClusterChoice:
    """Cluster spec for a record needing ``num_gpus`` GPUs; raises ``Unexpressible``."""
    try:
        names = _list_clusters()
    except ImportError as e:
        raise Unexpressible(f"hardware specs not available: {e}") from e
    gpu = resolve_gpu(str(record.hardware.get("gpu")))
    for rule in name_map()["clusters"]:
        if not _rule_matches(rule, record, num_gpus):
            continue
        for cand in rule.get("candidates", []):
            if cand not in names:
                continue
            cl = _load_cluster_cached(cand)
            if cl.num_gpus >= num_gpus:
                if cl.gpu.name != gpu.name:
                    continue
                return ClusterChoice(cluster=cl, how=f"rule gpu={rule['gpu']}"
                                     + (f", kind={rule['kind']}" if "kind" in rule else "")
                                     + (f", interconnect~{rule['interconnect_contains']}"
                                        if "interconnect_contains" in rule else ""))
        for base in rule.get("derive_from", []):
            if base not in names:
                continue
            cl = _load_cluster_cached(base)
            if cl.num_gpus >= num_gpus:
                derived = dataclasses.replace(cl, gpu=gpu, name=f"{cl.name}+{gpu.name}")
                return ClusterChoice(cluster=derived, how=(
                    f"derived: topology of {cl.name} with {gpu.name} GPUs (no cluster spec "
                    f"with {gpu.name} and >= {num_gpus} GPUs)"))
        break  # first matching rule decides; fall back below
    fitting = []
    for name in names:
        try:
            cl = _load_cluster_cached(name)
        except CharonError:
            continue
        if cl.gpu.name == gpu.name and cl.num_gpus >= num_gpus:
            fitting.append(cl)
    if not fitting:
        raise Unexpressible(
            f"unsupported GPU/cluster: no cluster spec with {gpu.name} and >= {num_gpus} GPUs"
        )
    fitting.sort(key=lambda c: (c.num_gpus, c.name))
    return ClusterChoice(cluster=fitting[0], how=f"smallest cluster with {gpu.name} "
                         f"and >= {num_gpus} GPUs")
