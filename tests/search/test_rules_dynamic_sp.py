"""The ``dynamic_sp_needs_sp`` normalizer: a serving space varying ``sp`` and ``dynamic_sp``
simulates (sp=1, dynamic_sp=true) as the sp=1 run instead of wasting a trial on an invalid
config."""

from __future__ import annotations

import pytest

from charon_search.errors import ConfigError
from charon_search.search import SearchSpace
from charon_search.search.rules import NORMALIZERS, dynamic_sp_needs_sp
from charon_search.search.serving_bridge import serving_config_from
from charon_search.search.space import config_key

SPACE = {
    "name": "sp", "evaluator": "serving",
    "fixed": {"model": "debug-llama", "cluster": "h100-sxm-8gpu", "mode": "aggregated",
              "min_gpus": 1, "max_gpus": 8},
    "params": {"sp": {"type": "categorical", "choices": [1, 2]},
               "dynamic_sp": {"type": "categorical", "choices": [False, True]}},
    "constraints": ["serving_gpus_in_range"],
}


def test_dynamic_sp_needs_sp_merges_the_sp1_points() -> None:
    """2 x 2 grid points: 3 distinct runs with the normalizer (sp=1 once), 4 without."""
    plain = SearchSpace.from_dict({**SPACE, "normalize": ["disaggregation"]})
    merged = SearchSpace.from_dict({**SPACE,
                                    "normalize": ["disaggregation", "dynamic_sp_needs_sp"]})
    assert len(plain.enumerate_valid()) == 4
    runs = [(c["sp"], c["dynamic_sp"]) for _, c in merged.enumerate_valid()]
    assert sorted(runs) == [(1, False), (2, False), (2, True)]
    a, _ = merged.config({"sp": 1, "dynamic_sp": True})
    b, _ = merged.config({"sp": 1, "dynamic_sp": False})
    assert a["dynamic_sp"] is False and config_key(a) == config_key(b)
    assert serving_config_from(a).dynamic_sp is False  # a valid ServingConfig now
    with pytest.raises(ConfigError, match="dynamic_sp"):
        serving_config_from(plain.config({"sp": 1, "dynamic_sp": True})[0])


def test_dynamic_sp_needs_sp_leaves_other_configs_alone() -> None:
    assert NORMALIZERS.get("dynamic_sp_needs_sp") is dynamic_sp_needs_sp
    cfg = {"sp": 2, "dynamic_sp": True}
    assert dynamic_sp_needs_sp(cfg) == {"sp": 2, "dynamic_sp": True}
    assert dynamic_sp_needs_sp({"dynamic_sp": True}) == {"dynamic_sp": False}  # sp defaults to 1
    assert dynamic_sp_needs_sp({"sp": 1}) == {"sp": 1}  # no key added
    assert dynamic_sp_needs_sp({"sp": 1, "dynamic_sp": True}) == {"sp": 1, "dynamic_sp": False}
    assert cfg == {"sp": 2, "dynamic_sp": True}  # the input is not changed
