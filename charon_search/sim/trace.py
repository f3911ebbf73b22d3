"""Chrome / Perfetto trace export (open in ui.perfetto.dev or chrome://tracing).

One process per pipeline rank, one thread (track) per stream: ``compute`` (pipeline units,
optimizer), ``comm_dp`` (gradient sync, parameter all-gather), ``comm_pp`` (the end of a unit
that waits for its own send, ``Layout.pp_p2p_blocking``), ``comm_tied`` (tied embeddings'
gradient all-reduce between the first and the last stage), and for micro-batch 0 the
operator-level timeline of each unit's first layer (op names from module paths) on
``ops.<stream>`` tracks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["chrome_trace", "write_chrome_trace"]

_US = 1e6


def chrome_trace(timeline: Any) -> dict[str, Any]:
    """Trace-event JSON of a ``training.step.StepTimeline``."""
    events: list[dict[str, Any]] = []
    tids: dict[tuple[int, str], int] = {}

    def tid(rank: int, stream: str) -> int:
        key = (rank, stream)
        if key not in tids:
            tids[key] = len(tids) + 1
            events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tids[key],
                           "args": {"name": stream}})
        return tids[key]

    ranks = sorted({u.rank for u in timeline.pipeline.units})
    for r in ranks:
        events.append({"ph": "M", "name": "process_name", "pid": r,
                       "args": {"name": f"pp rank {r}"}})
    for u in timeline.pipeline.units:
        blocks = timeline.stage_blocks[u.rank][u.op.chunk]
        events.append({
            "ph": "X", "pid": u.rank, "tid": tid(u.rank, "compute"),
            "name": f"{u.op.kind} mb{u.op.mb} c{u.op.chunk}", "ts": u.start_s * _US,
            "dur": (u.end_s - u.start_s) * _US,
            "args": {"layers": len(blocks), "exposed_comm_s": dict(u.cost.exposed_comm_s)}})
        send = u.send_wait_s
        if send > 0:
            events.append({"ph": "X", "pid": u.rank, "tid": tid(u.rank, "comm_pp"),
                           "name": f"send {u.op.kind} mb{u.op.mb} c{u.op.chunk}",
                           "ts": (u.end_s - send) * _US, "dur": send * _US})
        if u.op.mb == 0 and u.op.kind in ("F", "B"):
            name = next((b for b in blocks if b not in ("embedding", "lm_head")),
                        blocks[0] if blocks else None)
            if name is None or name not in timeline.layer_costs:
                continue
            lc = timeline.layer_costs[name][0 if u.op.kind == "F" else 1]
            if lc is None or lc.timeline is None:
                continue
            for task, s0, e0 in zip(lc.tasks, lc.timeline.start_s, lc.timeline.end_s,
                                    strict=True):
                if e0 - s0 <= 0:
                    continue
                events.append({"ph": "X", "pid": u.rank,
                               "tid": tid(u.rank, f"ops.{task.stream}"),
                               "name": task.label, "ts": (u.start_s + s0) * _US,
                               "dur": (e0 - s0) * _US, "args": {"op": task.name}})
    for r, name, s0, e0 in timeline.dp_intervals:
        events.append({"ph": "X", "pid": r, "tid": tid(r, "comm_dp"), "name": name,
                       "ts": s0 * _US, "dur": (e0 - s0) * _US})
    for r, stream, name, s0, e0 in timeline.tail_intervals:
        events.append({"ph": "X", "pid": r, "tid": tid(r, stream), "name": name,
                       "ts": s0 * _US, "dur": (e0 - s0) * _US})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(timeline: Any, path: str | Path) -> None:
    Path(path).write_text(json.dumps(chrome_trace(timeline)))
