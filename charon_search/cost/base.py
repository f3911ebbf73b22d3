"""The cost-backend interface: one node on one GPU -> seconds, with provenance.

Backends never rewrite graphs. A backend returns ``None`` for a node it does not cover, and the
fused selector (``cost/selector.py``) falls through profile -> predictor -> roofline.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

from charon_search.registry import Registry

if TYPE_CHECKING:
    from charon_search.hardware.spec import ClusterSpec, GpuSpec
    from charon_search.ir.graph import Node

__all__ = ["COST_BACKENDS", "PROVENANCES", "CostBackend", "NodeCost", "ShapePoint"]

#: Provenance values, in order of preference.
PROVENANCES = ("profile", "predictor", "roofline", "collective")


@dataclass(frozen=True, slots=True)
class ShapePoint:
    """The concrete symbolic-dimension values a node is costed at."""

    b: float
    s: float
    c: float


@dataclass(frozen=True, slots=True)
class NodeCost:
    """The duration of one node and which source produced it."""

    duration_s: float
    provenance: str
    """One of ``PROVENANCES``."""
    detail: str = ""
    """E.g. the kernel family of a profile hit, or the bound (``compute``/``memory``)."""


class CostBackend(ABC):
    """Prices compute nodes on one GPU. Subclasses register in ``COST_BACKENDS``.

    ``cost`` must be cheap (it runs for every node of every evaluated configuration) and
    deterministic. Collectives are priced by ``cost.collectives`` from the cluster topology.
    """

    name: str = ""

    @abstractmethod
    def cost(self, node: Node, point: ShapePoint, gpu: GpuSpec) -> NodeCost | None:
        """Seconds for ``node`` at ``point`` on ``gpu``, or None if this backend can't tell."""

    def prepare(self, cluster: ClusterSpec) -> None:  # noqa: B027 - optional hook
        """Load whatever the backend needs for ``cluster`` (profiles, trained models)."""


COST_BACKENDS: Registry[type[CostBackend]] = Registry(
    "cost backend", entry_point_group="charon_search.cost_backends"
)
