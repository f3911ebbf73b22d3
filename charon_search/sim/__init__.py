"""Event engine (streams, overlap slowdown, link sharing), per-layer and pipeline simulation,
Chrome/Perfetto trace export."""

from charon_search.sim.engine import EngineResult, StreamEngine, Task
from charon_search.sim.layer import LayerCost, UnitCost, layer_cost
from charon_search.sim.pipeline import PipelineResult, PipeUnit, run_pipeline
from charon_search.sim.schedules import SCHEDULE_ORDERS, PipeOp, schedule_order
from charon_search.sim.trace import chrome_trace, write_chrome_trace

__all__ = [
    "SCHEDULE_ORDERS",
    "EngineResult",
    "LayerCost",
    "PipeOp",
    "PipeUnit",
    "PipelineResult",
    "StreamEngine",
    "Task",
    "UnitCost",
    "chrome_trace",
    "layer_cost",
    "run_pipeline",
    "schedule_order",
    "write_chrome_trace",
]
