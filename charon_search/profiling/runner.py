"""Run op shapes on a CUDA GPU and write profile-DB rows; NCCL collectives; overlap slowdown.

Timing is injected: ``profile_shapes(shapes, timer=...)`` calls ``timer(op_shape)`` for seconds,
so the plumbing (shape selection, row writing, calibration blocks) is tested on CPU with a fake
timer. ``CudaEventTimer`` is the real one: it builds the op's tensors with torch on the GPU,
runs ``warmup`` calls, then times ``repeats`` calls with CUDA events and returns the median.

Everything torch-specific stays in this module (imported lazily), per the package layout.
"""

from __future__ import annotations

import datetime as _dt
import functools
import itertools
import math
import os
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from charon_search.profiling.shapes import OpShape

__all__ = [
    "ELEMENTWISE_TRAFFIC",
    "CudaEventTimer",
    "atomic_write",
    "db_rows_problems",
    "elementwise_bytes",
    "measure_collectives",
    "measure_overlap",
    "overlap_calibration",
    "profile_shapes",
    "rows_from_measurements",
    "train_attention_rows",
]

Timer = Callable[[OpShape], float]


def atomic_write(path: Path, write: Callable[[Path], Any]) -> None:
    """``write(tmp_path)``, then rename over ``path``: a reader (or a kill) never sees half a
    file."""
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    os.replace(tmp, path)


#: Bytes per element of the dtypes the timer builds.
ITEMSIZE: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}
#: Elementwise variant -> (element reads + writes per element of ``numel``, what is timed).
#: ``add``: ``x + y`` reads 2, writes 1. ``act``: ``F.silu(g) * u`` is two kernels, SiLU
#: (read 1, write 1) then the multiply (read 2, write 1): 5, not a fused SiLU-and-mul's 3.
#: ``rope``: ``x * cs`` with two full-size operands (read 2, write 1), a stand-in for RoPE's
#: read-modify-write of q/k.
ELEMENTWISE_TRAFFIC: dict[str, tuple[int, str]] = {
    "add": (3, "x+y, 1 kernel"),
    "act": (5, "silu(g)*u, 2 kernels (silu, mul), not fused"),
    "rope": (3, "x*cos_sin stand-in for rope, 1 kernel"),
}


def elementwise_bytes(variant: str, dtype: str, numel: float) -> float:
    """HBM bytes the timed elementwise kernels move (``ELEMENTWISE_TRAFFIC`` x dtype size)."""
    return float(ELEMENTWISE_TRAFFIC.get(variant, (3, ""))[0] * ITEMSIZE.get(dtype, 2) * numel)


def rows_from_measurements(measured: Iterable[tuple[OpShape, float]], *, gpu: str, kernel: str,
                           source: str) -> list[dict[str, Any]]:
    """Profile-DB rows (``cost.profile_db.COLUMNS``) for measured shapes."""
    rows = []
    for shape, seconds in measured:
        p = dict(shape.params)
        kern = f"{kernel} {shape.op_kind}"
        if shape.op_kind == "elementwise":
            p["bytes"] = elementwise_bytes(shape.variant, shape.dtype, p["numel"])
            what = ELEMENTWISE_TRAFFIC.get(shape.variant, (3, ""))[1]
            kern += f" {what}" if what else ""
        if shape.op_kind == "grouped_gemm":
            p["group_size"] = 1.0
        row: dict[str, Any] = {"gpu": gpu, "op_kind": shape.op_kind, "variant": shape.variant,
                               "dtype": shape.dtype, "kernel": kern,
                               "source": source, "latency_s": float(seconds)}
        row.update(p)
        rows.append(row)
    return rows


def profile_shapes(shapes: Sequence[OpShape], *, timer: Timer, gpu: str, kernel: str,
                   source: str, on_error: Callable[[OpShape, Exception], None] | None = None,
                   on_rows: Callable[[list[dict[str, Any]]], None] | None = None
                   ) -> list[dict[str, Any]]:
    """Time every shape with ``timer`` and return DB rows; shapes that fail are skipped.

    ``on_rows`` gets each shape's rows as soon as it is timed (the CLI writes them to disk
    then, so a kill keeps every finished row). A timer with a ``last_note`` attribute (the
    ``CudaEventTimer``: timing method and L2 state of the last shape) has it appended to the
    row's ``source``. An exception raised by ``on_error`` ends the loop (a sticky CUDA error).
    """
    rows: list[dict[str, Any]] = []
    for shape in shapes:
        try:
            seconds = timer(shape)
        except Exception as e:  # an OOM or unsupported shape must not end the whole run
            if on_error is not None:
                on_error(shape, e)
            continue
        note = getattr(timer, "last_note", "")
        got = rows_from_measurements([(shape, seconds)], gpu=gpu, kernel=kernel,
                                     source=f"{source}; {note}" if note else source)
        rows += got
        if on_rows is not None:
            on_rows(got)
    return rows


def _driver_version() -> str:
    """The NVIDIA driver version (NVML, else ``nvidia-smi``), or ``"?"``."""
    try:
        import pynvml

        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)
    except Exception:
        pass
    try:
        import subprocess

        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=10).stdout.strip().splitlines()
        return out[0].strip() if out else "?"
    except Exception:
        return "?"


def default_source(device_name: str) -> str:
    """Provenance of a run's rows: device, driver, CUDA runtime, cuDNN, torch and the date
    (each row adds its timing method and L2 state, ``CudaEventTimer.last_note``)."""
    import torch

    day = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d")
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return (f"charon-search profiler on {device_name} (driver {_driver_version()}, "
            f"CUDA {torch.version.cuda}, cuDNN {cudnn}), torch {torch.__version__}, {day}")


def db_rows_problems(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Why ``cost.profile_db.write_profile_db`` would reject or silently drop some of
    ``rows`` (unknown columns; op kinds without a lookup key; rows that share a lookup key,
    of which the writer keeps only the first). Empty when the rows load as they are."""
    import pandas as pd

    from charon_search.cost.profile_db import COLUMNS, DEDUP_EXTRA, SHAPE_KEYS

    if not rows:
        return []
    df = pd.DataFrame(list(rows))
    problems = []
    unknown = sorted(set(df.columns) - set(COLUMNS))
    if unknown:
        problems.append(f"unknown columns {unknown} (write_profile_db rejects them)")
    for kind, part in df.groupby("op_kind"):
        if kind not in SHAPE_KEYS:
            problems.append(f"op kind {kind!r} has no profile-DB lookup key: its {len(part)} "
                            "rows would collapse to one per (variant, dtype)")
            continue
        keys = [c for c in ("variant", "dtype", *SHAPE_KEYS[kind], *DEDUP_EXTRA.get(kind, ()))
                if c in part.columns]
        dup = int(part.duplicated(subset=keys).sum())
        if dup:
            problems.append(f"op kind {kind!r}: {dup} rows repeat another row's lookup key "
                            f"{keys} (write_profile_db keeps only the first)")
    return problems


def train_attention_rows(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Training-attention rows in the format ``sim.train_attention`` reads: every row has
    ``v_head_dim`` (``head_dim`` where the shape has no separate value head dim)."""
    out = []
    for r in rows:
        d = dict(r)
        v = d.get("v_head_dim")
        if v is None or v != v:  # missing or NaN
            d["v_head_dim"] = float(d["head_dim"])
        out.append(d)
    return out


# ---------------------------------------------------------------------------- CUDA timing
_TORCH_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
#: ``--sdpa-backend`` -> ``torch.nn.attention.SDPBackend`` member (``default``: torch's own
#: choice). ``flash`` is FlashAttention-2 (PyTorch's bundled copy), ``cudnn`` cuDNN's fused
#: attention (warp-specialized on Hopper), ``efficient`` the xFormers memory-efficient kernel.
SDPA_BACKENDS = {"default": None, "flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION",
                 "efficient": "EFFICIENT_ATTENTION"}


#: L2 size assumed when the device does not report one (the H200's is 60 MB, the H100's 50).
DEFAULT_L2_BYTES = 64 * 2**20
#: At most this many weight copies are rotated (the note then says how many bytes they span).
MAX_WEIGHT_COPIES = 128


class CudaEventTimer:
    """Median seconds of an op shape on the current CUDA device (CUDA events).

    By default the op is captured ``inner`` times into a CUDA graph and the graph is replayed
    between two events (time / ``inner``): that is the GPU time of the kernels, as serving
    engines see it under CUDA graphs, without the Python/driver launch gaps that dominate
    eager timing of small kernels (~20-40 µs per call on a sandboxed host). Ops that cannot be
    captured fall back to eager timing (not on an out-of-memory error), and the row says so.

    Cold weights: a GEMM (bf16, fp8 ``_scaled_mm``, grouped expert GEMM) whose weights are
    smaller than twice the L2 cache (decode-sized GEMMs at TP 2-8) rotates over enough weight
    copies that together they span at least ``2 x L2`` (``cold_l2``), so each call reads its
    weights from HBM, as a model far larger than L2 does; activations and other ops keep their
    operands (warm L2). ``last_note`` describes how the last shape was timed (timing method,
    L2 state); ``profile_shapes`` appends it to the row's ``source``.
    """

    def __init__(self, *, warmup: int = 3, repeats: int = 10, device: str = "cuda",
                 use_graphs: bool = True, inner: int = 10, sdpa_backend: str = "default",
                 cold_l2: bool = True, l2_bytes: int | None = None) -> None:
        import torch

        if sdpa_backend not in SDPA_BACKENDS:
            raise ValueError(f"sdpa_backend must be one of {sorted(SDPA_BACKENDS)}, "
                             f"got {sdpa_backend!r}")
        self.torch = torch
        self.warmup, self.repeats, self.device = warmup, repeats, device
        self.use_graphs, self.inner = use_graphs, inner
        self.sdpa_backend = sdpa_backend
        self.eager_fallbacks = 0
        self.cold_l2 = cold_l2
        if l2_bytes is None and str(device).startswith("cuda"):
            try:
                l2_bytes = int(torch.cuda.get_device_properties(device).L2_cache_size)
            except Exception:
                l2_bytes = None
        self.l2_bytes = int(l2_bytes or DEFAULT_L2_BYTES)
        self.last_note = ""
        self._l2_note = ""

    def weight_copies(self, weight_bytes: float) -> int:
        """How many copies of a ``weight_bytes`` weight to rotate so each call reads it cold
        (1: no rotation, the weight is at least twice the L2 or ``cold_l2`` is off)."""
        if not self.cold_l2 or weight_bytes <= 0 or weight_bytes >= 2 * self.l2_bytes:
            return 1
        return min(math.ceil(2 * self.l2_bytes / weight_bytes), MAX_WEIGHT_COPIES)

    def graph_calls(self, fn: Callable[[], Any]) -> int:
        """Calls captured per graph: ``inner``, raised to a multiple of ``fn``'s weight
        rotation so consecutive replays keep the rotation's order (each copy is used again
        only after all the others)."""
        rot = max(int(getattr(fn, "rotation", 1)), 1)
        return rot * math.ceil(self.inner / rot)

    def _rotating(self, make: Callable[[], Any], weight_bytes: float
                  ) -> tuple[list[Any], Callable[[], Any]]:
        """``copies`` weights made by ``make`` and a function returning the next one."""
        copies = self.weight_copies(weight_bytes)
        ws = [make() for _ in range(copies)]
        if copies > 1:
            self._l2_note = (f"L2 cold: weights rotated over {copies} copies "
                             f"({copies * weight_bytes / 1e6:.0f} MB; L2 "
                             f"{self.l2_bytes / 1e6:.0f} MB)")
        else:
            self._l2_note = ("L2: weights larger than 2x L2 (read from HBM)"
                             if self.cold_l2 else "L2 warm: operands reused")
        cycle = itertools.cycle(ws)
        return ws, lambda: next(cycle)

    def time_fn(self, fn: Callable[[], Any]) -> float:
        if self.use_graphs:
            try:
                seconds = self._time_graph(fn)
                self.last_note = (f"timing: CUDA-graph replay of {self.graph_calls(fn)} calls, "
                                  f"median of {self.repeats}, {self.warmup} warm-up")
                return seconds
            except self.torch.cuda.OutOfMemoryError:
                raise  # not a capture problem: the shape fails, no eager re-timing
            except Exception as e:  # not capturable (host sync, NCCL without graph support...)
                self.eager_fallbacks += 1
                self.torch.cuda.synchronize()
                seconds = self._time_eager(fn)
                self.last_note = (f"timing: eager calls (graph capture failed: "
                                  f"{type(e).__name__}), median of {self.repeats}, "
                                  f"{self.warmup} warm-up")
                return seconds
        seconds = self._time_eager(fn)
        self.last_note = f"timing: eager calls, median of {self.repeats}, {self.warmup} warm-up"
        return seconds

    def _events(self, fn: Callable[[], Any]) -> list[float]:
        torch = self.torch
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(self.repeats)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(self.repeats)]
        for st, en in zip(starts, ends):
            st.record()
            fn()
            en.record()
        torch.cuda.synchronize()
        return [st.elapsed_time(en) * 1e-3 for st, en in zip(starts, ends)]

    def _time_eager(self, fn: Callable[[], Any]) -> float:
        for _ in range(self.warmup):
            fn()
        self.torch.cuda.synchronize()
        return statistics.median(self._events(fn))

    def _time_graph(self, fn: Callable[[], Any]) -> float:
        torch = self.torch
        calls = self.graph_calls(fn)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        graph.replay()
        torch.cuda.synchronize()
        return statistics.median(self._events(graph.replay)) / calls

    def __call__(self, shape: OpShape) -> float:
        self._l2_note = "L2 warm: operands reused"  # GEMM builds say otherwise
        fn = self.build(shape)
        try:
            seconds = self.time_fn(fn)
            if self._l2_note:
                self.last_note += f"; {self._l2_note}"
            return seconds
        finally:
            del fn
            self.torch.cuda.empty_cache()

    def build(self, shape: OpShape) -> Callable[[], Any]:
        torch = self.torch
        import torch.nn.functional as F

        dt = getattr(torch, _TORCH_DTYPE.get(shape.dtype, "bfloat16"))
        dev = self.device
        p = {k: int(v) for k, v in shape.params}
        rnd = lambda *s: torch.randn(*s, device=dev, dtype=dt)  # noqa: E731
        if shape.op_kind == "gemm" and shape.variant.startswith("scaled_mm."):
            return self._scaled_mm(shape.variant.split(".", 1)[1], p)
        if shape.op_kind == "gemm":
            a = rnd(p["m"], p["k"])
            ws, nxt = self._rotating(lambda: rnd(p["n"], p["k"]),
                                     p["n"] * p["k"] * ITEMSIZE.get(shape.dtype, 2))
            return _with_rotation(lambda: F.linear(a, nxt()), len(ws))
        if shape.op_kind in ("attention", "attention_bwd"):
            return self._attention(shape, p, rnd)
        if shape.op_kind == "norm":
            x, w = rnd(p["rows"], p["cols"]), rnd(p["cols"])
            return lambda: F.rms_norm(x, (p["cols"],), w)
        if shape.op_kind == "elementwise":
            n = p["numel"]
            if shape.variant == "act":
                g, u = rnd(n), rnd(n)
                return lambda: F.silu(g) * u
            if shape.variant == "rope":
                x, cs = rnd(n // 2, 2), rnd(n // 2, 2)
                return lambda: x * cs  # one read-modify-write pass over q/k, like RoPE
            x, y = rnd(n), rnd(n)
            return lambda: x + y
        if shape.op_kind == "grouped_gemm":
            e = max(p["num_experts"], 1)
            rows = max(p["tokens"] * p["top_k"] // e, 1)  # balanced routing
            xs = rnd(e, rows, p["k"])
            ws, nxt = self._rotating(lambda: rnd(e, p["k"], p["n"]),
                                     e * p["k"] * p["n"] * ITEMSIZE.get(shape.dtype, 2))
            return _with_rotation(lambda: torch.bmm(xs, nxt()), len(ws))
        raise ValueError(f"cannot profile op kind {shape.op_kind}")

    def _attention(self, shape: OpShape, p: dict[str, int], rnd: Callable[..., Any]
                   ) -> Callable[[], Any]:
        """SDPA forward, or (``attention_bwd``) its backward alone: the forward runs once
        under autograd and each call replays only the backward kernels (``retain_graph``)."""
        import contextlib

        torch = self.torch
        import torch.nn.functional as F

        b, h, kvh, q, kv, d = (p["batch"], p["heads"], p["kv_heads"], p["q_len"],
                               p["kv_len"], p["head_dim"])
        bwd = shape.op_kind == "attention_bwd"
        dv = p.get("v_head_dim", d)
        qt, kt, vt = (t.requires_grad_(bwd) for t in (rnd(b, h, q, d), rnd(b, kvh, kv, d),
                                                      rnd(b, kvh, kv, dv)))
        causal = q > 1 and q == kv
        backend = SDPA_BACKENDS[self.sdpa_backend]

        def ctx() -> Any:  # a fresh context manager per call (generator-based ones are single-use)
            if backend is None:
                return contextlib.nullcontext()
            from torch.nn.attention import SDPBackend, sdpa_kernel

            return sdpa_kernel(getattr(SDPBackend, backend))

        def fwd() -> Any:
            with ctx():
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal,
                                                      enable_gqa=kvh != h)
        if not bwd:
            return fwd
        out = fwd()
        grad = torch.randn_like(out)
        return lambda: torch.autograd.grad(out, (qt, kt, vt), grad, retain_graph=True)

    def _scaled_mm(self, scaling: str, p: dict[str, int]) -> Callable[[], Any]:
        """fp8 e4m3 ``torch._scaled_mm`` with bf16 output: ``tensorwise`` (one scale per
        operand, fast accumulation: torchao's forward), ``rowwise`` (a scale per row of A and
        column of B, fast accumulation) or ``rowwise_slowacc`` (without)."""
        torch = self.torch
        m, n, k = p["m"], p["n"], p["k"]
        fp8 = torch.float8_e4m3fn
        a = torch.randn(m, k, device=self.device).to(fp8)
        # column-major B, as cuBLASLt wants; rotated copies when it fits in L2 (cold weights)
        bts, nxt = self._rotating(lambda: torch.randn(n, k, device=self.device).to(fp8).t(),
                                  n * k)
        if scaling == "tensorwise":
            sa = torch.ones((), device=self.device)
            sb = torch.ones((), device=self.device)
        else:
            sa = torch.ones(m, 1, device=self.device)
            sb = torch.ones(1, n, device=self.device)
        fast = scaling != "rowwise_slowacc"
        return _with_rotation(lambda: torch._scaled_mm(a, nxt(), scale_a=sa, scale_b=sb,
                                                       out_dtype=torch.bfloat16,
                                                       use_fast_accum=fast), len(bts))


def _with_rotation(fn: Callable[[], Any], copies: int) -> Callable[[], Any]:
    """``fn`` marked with the number of weight copies it cycles through."""
    fn.rotation = copies  # type: ignore[attr-defined]
    return fn


# ---------------------------------------------------------------------------- collectives
def measure_collectives(sizes_bytes: Sequence[int], *, kinds: Sequence[str] = (
        "all_reduce", "all_gather", "reduce_scatter"), warmup: int = 3, repeats: int = 10
        ) -> list[dict[str, Any]]:
    """NCCL collective latencies over every local GPU (torch.distributed, one process per GPU).

    Returns DB rows (``bytes`` = full buffer, ``group_size`` = GPUs). Needs >= 2 GPUs; the
    caller decides what to do otherwise.
    """
    import torch
    import torch.multiprocessing as mp

    world = torch.cuda.device_count()
    if world < 2:
        raise RuntimeError(f"collectives need >= 2 GPUs, found {world}")
    manager = mp.Manager()
    results = manager.list()
    mp.spawn(_collective_worker, args=(world, list(sizes_bytes), list(kinds), warmup, repeats,
                                       results), nprocs=world, join=True)
    return list(results)


def _collective_worker(rank: int, world: int, sizes: list[int], kinds: list[str], warmup: int,
                       repeats: int, results: Any) -> None:  # pragma: no cover - needs GPUs
    import os

    import torch
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    timer = CudaEventTimer(warmup=warmup, repeats=repeats, use_graphs=False)
    for kind in kinds:
        for size in sizes:
            numel = max(size // 2 // world * world, world)
            x = torch.ones(numel, device="cuda", dtype=torch.bfloat16)
            shard = torch.empty(numel // world, device="cuda", dtype=torch.bfloat16)
            fn: Callable[[], Any]
            if kind == "all_reduce":
                fn = functools.partial(dist.all_reduce, x)
            elif kind == "all_gather":
                fn = functools.partial(dist.all_gather_into_tensor, x, shard)
            else:
                fn = functools.partial(dist.reduce_scatter_tensor, shard, x)
            dist.barrier()
            seconds = timer.time_fn(fn)
            if rank == 0:
                results.append({"op_kind": kind, "bytes": float(numel * 2),
                                "group_size": float(world), "num_nodes": 1.0,
                                "latency_s": seconds, "dtype": "bf16", "variant": ""})
    dist.destroy_process_group()


def sm_limited_copy(num_bytes: int = 2**31, num_ctas: int = 24) -> Callable[[], Any]:
    """A copy kernel on ``num_ctas`` thread blocks (Triton): a one-GPU stand-in for an NCCL
    collective kernel, which runs on a few dozen SMs (channels) and streams bytes through HBM.
    Falls back to ``Tensor.copy_`` (all SMs) without Triton."""
    import torch

    src = torch.empty(num_bytes // 2, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return lambda: dst.copy_(src)

    @triton.jit
    def _copy(x_ptr, y_ptr, n, BLOCK: tl.constexpr, STEP: tl.constexpr):  # type: ignore[no-untyped-def]
        pid = tl.program_id(0)
        for start in range(pid * BLOCK, n, STEP):
            offs = start + tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)

    n = src.numel()
    block = 8192
    return lambda: _copy[(num_ctas,)](src, dst, n, BLOCK=block, STEP=block * num_ctas)


def measure_overlap(timer: CudaEventTimer, *, m: int = 8192, n: int = 8192, k: int = 8192,
                    comm: Callable[[], Any] | None = None, comm_kind: str = "") -> dict[str, Any]:
    """Compute/communication overlap slowdowns, each side timed on its own stream.

    A GEMM loop on stream 1 and ``comm`` on stream 2 start together; CUDA events on each
    stream give each side's duration while overlapped, divided by its duration alone:
    ``compute_slowdown`` and ``comm_slowdown`` (the cluster-spec ``overlap_*_slowdown``).
    ``comm`` defaults to ``sm_limited_copy`` (no process group on one GPU: a proxy, and the
    result's ``comm_kind`` says so); pass an all-reduce closure on a multi-GPU machine.
    """
    torch = timer.torch
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    if comm is None:
        comm = sm_limited_copy()
        comm_kind = "sm_limited_copy_2GiB_24ctas"
    gemm = lambda: a @ b  # noqa: E731
    gemm_s = timer._time_eager(gemm)  # large ops: launch gaps are negligible
    comm_s = timer._time_eager(comm)
    reps = max(round(comm_s / gemm_s), 1)  # the GEMM loop spans the comm kernel
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    ev = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
    over_g, over_c = [], []
    for _ in range(timer.warmup + timer.repeats):
        g0, g1, c0, c1 = ev(), ev(), ev(), ev()
        torch.cuda.synchronize()
        with torch.cuda.stream(s1):
            g0.record()
            for _ in range(reps):
                gemm()
            g1.record()
        with torch.cuda.stream(s2):
            c0.record()
            comm()
            c1.record()
        torch.cuda.synchronize()
        over_g.append(g0.elapsed_time(g1) * 1e-3)
        over_c.append(c0.elapsed_time(c1) * 1e-3)
    gemm_over = statistics.median(over_g[timer.warmup:])
    comm_over = statistics.median(over_c[timer.warmup:])
    return {"gemm_s": gemm_s, "comm_s": comm_s, "gemm_reps": float(reps),
            "gemm_overlapped_s": gemm_over, "comm_overlapped_s": comm_over,
            "comm_kind": comm_kind,
            "compute_slowdown": gemm_over / (reps * gemm_s),
            "comm_slowdown": comm_over / comm_s}


def overlap_calibration(result: Mapping[str, Any], *, device: str) -> dict[str, Any]:
    """A cluster-spec ``calibration`` block (YAML-ready) from ``measure_overlap``'s result."""
    comp = max(float(result["compute_slowdown"]), 1.0)
    comm = max(float(result["comm_slowdown"]), 1.0)
    prov = (f"charon-search profile on {device}: bf16 GEMM 8192^3 x{int(result['gemm_reps'])} "
            f"({result['gemm_s'] * 1e3:.3f} ms each alone) on one stream || "
            f"{result['comm_kind']} ({result['comm_s'] * 1e3:.3f} ms alone) on another; "
            f"overlapped: GEMMs {result['gemm_overlapped_s'] * 1e3:.3f} ms, comm "
            f"{result['comm_overlapped_s'] * 1e3:.3f} ms")
    return {"overlap_compute_slowdown": round(comp, 3), "overlap_comm_slowdown": round(comm, 3),
            "provenance": {"overlap_compute_slowdown": prov, "overlap_comm_slowdown": prov}}
