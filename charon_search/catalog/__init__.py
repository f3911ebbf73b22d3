"""Model catalog: shipped HF ``config.json`` files and ``ModelSpec`` loading.

>>> from charon_search.catalog import load_model
>>> load_model("meta-llama/Llama-3.1-70B").name
'llama-3.1-70b'
"""

from __future__ import annotations

from charon_search.catalog._loader import (
    config_hash,
    list_models,
    load_model,
    resolve_model_name,
    spec_from_config,
    spec_hash,
)
from charon_search.catalog.spec import ModelSpec

__all__ = [
    "ModelSpec",
    "config_hash",
    "list_models",
    "load_model",
    "resolve_model_name",
    "spec_from_config",
    "spec_hash",
]
