"""Search service: spaces, objectives, the Optuna study loop on Ray workers, Pareto outputs.

Example:
    >>> from charon_search.search import SearchOptions, load_objective, load_space, run_search
    >>> space = load_space("spaces/quickstart-llama8b-training.yaml")  # doctest: +SKIP
    >>> res = run_search(space, load_objective("objectives/train-fast-cheap.yaml"),
    ...                  SearchOptions(trials=60, workers=2, out_dir="runs/q"))  # doctest: +SKIP
"""

from __future__ import annotations

from charon_search.search.evaluators import EVALUATORS, Evaluator, flatten_report
from charon_search.search.objective import Objective, load_objective
from charon_search.search.pareto import hypervolume, non_dominated, normalized_hypervolume
from charon_search.search.rules import CONSTRAINTS, NORMALIZERS, RuleContext
from charon_search.search.space import Param, SearchSpace, config_key, load_space
from charon_search.search.study import SAMPLERS, SearchOptions, SearchResult, run_search
from charon_search.search.sweep import read_sweep

__all__ = [
    "CONSTRAINTS",
    "EVALUATORS",
    "NORMALIZERS",
    "SAMPLERS",
    "Evaluator",
    "Objective",
    "Param",
    "RuleContext",
    "SearchOptions",
    "SearchResult",
    "SearchSpace",
    "config_key",
    "flatten_report",
    "hypervolume",
    "load_objective",
    "load_space",
    "non_dominated",
    "normalized_hypervolume",
    "read_sweep",
    "run_search",
]
