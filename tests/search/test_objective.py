from __future__ import annotations

import pytest
import yaml

from charon_search.errors import ConfigError
from charon_search.search import load_objective
from charon_search.search.objective import Objective

GOOD = {
    "name": "o",
    "objectives": [{"metric": "tokens_per_s_per_gpu", "direction": "maximize"},
                   {"metric": "ttft_s.p90", "direction": "minimize"}],
    "constraints": ["ttft_s.p90 <= 1.0", "peak_memory_bytes <= device", "num_gpus <= budget",
                    "mfu >= 0.3"],
    "limits": {"budget": 64},
}


def test_values_minimized_and_relative_violations():
    o = Objective.from_dict(GOOD)
    rec = {"tokens_per_s_per_gpu": 1000.0, "ttft_s.p90": 1.5, "peak_memory_bytes": 60e9,
           "device_memory_bytes": 80e9, "num_gpus": 96, "mfu": 0.45}
    assert o.values(rec) == [1000.0, 1.5]
    assert o.minimized([1000.0, 1.5]) == [-1000.0, 1.5]
    v = dict((b.text, x) for b, x in o.violations(rec))
    assert v["ttft_s.p90 <= 1.0"] == pytest.approx(0.5)          # (1.5 - 1) / 1
    assert v["peak_memory_bytes <= device"] == pytest.approx(-0.25)  # (60 - 80) / 80
    assert v["num_gpus <= budget"] == pytest.approx(0.5)          # (96 - 64) / 64
    assert v["mfu >= 0.3"] == pytest.approx(-0.5)                 # (0.3 - 0.45) / 0.3
    assert o.values({"tokens_per_s_per_gpu": 1.0}) is None


@pytest.mark.parametrize(("patch", "needles"), [
    ({"objectives": [{"metric": "x", "direction": "up"}]},
     ["objectives[0].direction", "minimize", "maximize", "'up'"]),
    ({"objectives": []}, ["objectives", "non-empty"]),
    ({"constraints": ["ttft_s.p90 == 1"]}, ["constraints[0]", "'<='", "'>='"]),
    ({"constraints": ["ttft_s.p90 <= soon"]}, ["constraints[0]", "device", "budget", "'soon'"]),
    # a missing bound is not read as operator '<' with bound '='
    ({"constraints": ["ttft_s.p90 <="]}, ["constraints[0]", "'METRIC OP BOUND'",
                                          "'ttft_s.p90 <='"]),
    ({"constraint": []}, ["'constraint'", "allowed", "constraints"]),
    ({"objectives": [{"metric": "x", "direction": "minimize", "weight": 2}]},
     ["objectives[0]", "'weight'", "metric", "direction"]),
])
def test_malformed_objective_names_file_field_and_allowed(tmp_path, patch, needles):
    path = tmp_path / "bad-objective.yaml"
    path.write_text(yaml.safe_dump({**GOOD, **patch}))
    with pytest.raises(ConfigError) as e:
        load_objective(path)
    msg = str(e.value)
    assert str(path) in msg
    for n in needles:
        assert n in msg, msg
