"""Operator costs: profile DB, predictors, roofline and topology-aware collectives.

Importing the package registers the built-in backends ``roofline``, ``profile`` and
``predictor`` in ``COST_BACKENDS`` (heavy libraries load only when a backend is used).
"""

from charon_search.cost import roofline as _roofline  # noqa: F401  (registers "roofline")
from charon_search.cost import selector as _selector  # noqa: F401  (registers the others)
from charon_search.cost.base import COST_BACKENDS, CostBackend, NodeCost, ShapePoint

__all__ = ["COST_BACKENDS", "CostBackend", "NodeCost", "ShapePoint"]
