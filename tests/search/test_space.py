from __future__ import annotations

import pytest

from charon_search.errors import ConfigError
from charon_search.search import RuleContext, SearchSpace
from charon_search.search.space import Param, config_key

BASE = {
    "name": "t", "evaluator": "toy-analytic",
    "params": {"num_gpus": {"type": "log_int", "low": 8, "high": 64, "base": 2},
               "tp": {"type": "log_int", "low": 1, "high": 8, "base": 2}},
}


def test_log_int_with_base_is_powers_via_exponent():
    p = Param(name="tp", type="log_int", low=1, high=8, base=2)
    assert p.values() == (1, 2, 4, 8)
    assert p.optuna_values() == (0, 1, 2, 3)
    assert p.optuna_name == "log2_tp"
    assert p.to_optuna(8) == 3
    q = Param(name="n", type="log_int", low=3, high=100, base=3)
    assert q.values() == (3, 9, 27, 81)


def test_int_and_categorical_values():
    assert tuple(Param(name="g", type="int", low=8, high=32, step=8).values()) == (8, 16, 24, 32)
    assert Param(name="r", type="categorical", choices=("a", "b")).values() == ("a", "b")


def test_derived_exact_and_non_integer_is_invalid():
    s = SearchSpace.from_dict({**BASE, "fixed": {"pp": 2},
                               "derived": {"dp": "num_gpus / (tp * pp)"}})
    cfg, reason = s.config({"num_gpus": 64, "tp": 4})
    assert reason is None and cfg["dp"] == 8
    cfg, reason = s.config({"num_gpus": 8, "tp": 8})
    assert reason is not None and "1/2" in reason


def test_grid_size_and_enumerate_valid(toy_space):
    # 6 GPU counts x 4 tp x 3 pp x 3 micro-batch x 3 recompute x 2 zero
    assert toy_space.num_points() == 6 * 4 * 3 * 3 * 3 * 2
    valid = toy_space.enumerate_valid()
    for _, cfg in valid:
        assert cfg["num_gpus"] == cfg["tp"] * cfg["pp"] * cfg["dp"]
        assert cfg["global_batch_size"] % (cfg["micro_batch_size"] * cfg["dp"]) == 0
    assert len({config_key(c) for _, c in valid}) == len(valid)


def test_normalizer_collapses_equivalent_points():
    s = SearchSpace.from_dict({
        **BASE, "params": {**BASE["params"], "pp": {"type": "categorical", "choices": [1, 2]},
                           "schedule": {"type": "categorical",
                                        "choices": ["1f1b", "interleaved-1f1b"]}},
        "normalize": ["pipeline_schedule"]})
    a, _ = s.config({"num_gpus": 8, "tp": 1, "pp": 1, "schedule": "1f1b"})
    b, _ = s.config({"num_gpus": 8, "tp": 1, "pp": 1, "schedule": "interleaved-1f1b"})
    assert a["schedule"] == b["schedule"] == "none"
    assert config_key(a) == config_key(b)


def test_model_rules_with_hand_built_spec():
    from types import SimpleNamespace

    model = SimpleNamespace(name="m", num_attention_heads=32, num_key_value_heads=8,
                            attention="gqa", num_layers=30, is_moe=True, num_experts=64)
    ctx = RuleContext(models={"m": model})
    s = SearchSpace.from_dict({**BASE, "fixed": {"model": "m"},
                               "constraints": ["tp_divides_heads", "pp_divides_layers",
                                               "ep_divides_experts"]})
    assert s.check({"model": "m", "tp": 8, "pp": 3, "ep": 16}, ctx) is None
    assert "tp_divides_heads" in s.check({"model": "m", "tp": 3}, ctx)
    assert "pp_divides_layers" in s.check({"model": "m", "tp": 1, "pp": 4}, ctx)
    assert "ep_divides_experts" in s.check({"model": "m", "tp": 1, "pp": 1, "ep": 3}, ctx)


@pytest.mark.parametrize(("patch", "needles"), [
    ({"params": {"tp": {"type": "uniform", "low": 1, "high": 2}}},
     ["params.tp.type", "categorical", "log_int"]),
    ({"params": {"tp": {"type": "int", "low": 4, "high": 2}}}, ["low <= high", "params.tp"]),
    ({"params": {"tp": {"type": "log_int", "low": 1, "high": 8, "base": 1}}},
     ["params.tp.base", ">= 2"]),
    ({"params": {"tp": {"type": "categorical", "choices": [1], "step": 2}}},
     ["params.tp", "'step'", "choices"]),
    ({"constraints": ["tp_divides_head"]}, ["constraints", "tp_divides_heads"]),
    ({"evaluator": "simulator"}, ["evaluator", "training", "serving"]),
    ({"derived": {"dp": "num_gpus / ep"}}, ["derived.dp", "'ep'"]),
    ({"derived": {"dp": "num_gpus ** 2"}}, ["derived.dp", "operators allowed"]),
    ({"colour": ["tp"]}, ["'colour'", "allowed", "family"]),
])
def test_malformed_space_names_file_field_and_allowed(tmp_path, patch, needles):
    import yaml

    from charon_search.search import load_space

    data = {**BASE, **patch}
    path = tmp_path / "bad-space.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as e:
        load_space(path)
    msg = str(e.value)
    assert str(path) in msg
    for n in needles:
        assert n in msg, msg


def test_space_not_yaml_and_missing_file(tmp_path):
    from charon_search.search import load_space

    p = tmp_path / "broken.yaml"
    p.write_text("params: [unclosed\n")
    with pytest.raises(ConfigError, match=r"broken\.yaml:2:1: not valid YAML"):
        load_space(p)
    with pytest.raises(ConfigError, match="no such file"):
        load_space(tmp_path / "nope.yaml")
