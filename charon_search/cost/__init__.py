"""Operator costs: profile DB, predictors, roofline and topology-aware collectives."""

from charon_search.cost.base import COST_BACKENDS, CostBackend, NodeCost, ShapePoint

__all__ = ["COST_BACKENDS", "CostBackend", "NodeCost", "ShapePoint"]
