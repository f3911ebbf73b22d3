"""The serving discrete-event simulation and ``simulate_serving``.

Events are ordered by ``(time_s, priority, seq)`` with ``seq`` a per-simulation counter
(arrivals and KV hand-offs before iteration ends at the same instant). Replicas are
``ReplicaEngine``s; a router sends each request to the replica with the fewest requests
(join-shortest-queue, lowest index on ties). With PD disaggregation a finished prefill ships its
KV to the least-loaded decode replica over the chosen network tier and joins it on arrival.
"""

from __future__ import annotations

import heapq
import itertools
import json
import math
from collections.abc import Mapping, Sequence
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from charon_search.errors import ConfigError, InfeasibleError
from charon_search.serving.config import PoolConfig, ServingConfig
from charon_search.serving.engine import ItlHistogram, ReplicaEngine, Request
from charon_search.serving.iteration_cost import (
    GraphIterationCostModel,
    IterationCostModel,
    collective_s,
)
from charon_search.serving.kv_cache import KvWindow
from charon_search.serving.report import ServingReport, latency_stats
from charon_search.serving.workload import RequestSpec, WorkloadSpec

if TYPE_CHECKING:
    from charon_search.catalog.spec import ModelSpec
    from charon_search.hardware.spec import ClusterSpec

__all__ = ["ServingSimulation", "build_cost_model", "kv_capacity_blocks", "kv_paging",
           "resolve_kv_dtype", "run_simulation", "simulate_serving"]

_ARRIVE, _KV, _ITER = 0, 0, 1
#: SGLang ``--mamba-full-memory-ratio`` default: linear-attention state memory over full KV
#: memory of hybrid models (SGLang docs/basic_usage/qwen3.md, Qwen3-Next configuration tips).
SGLANG_MAMBA_FULL_MEMORY_RATIO = 0.9
#: SGLang ``--swa-full-tokens-ratio`` default: the sliding-window layers' pool holds this many
#: tokens per token of the full-attention layers' pool (``ServerArgs.swa_full_tokens_ratio``;
#: ``ModelRunner.set_num_token_hybrid`` splits the KV memory so that
#: ``swa_tokens x swa_layers + full_tokens x full_layers`` = all layers' tokens).
SGLANG_SWA_FULL_TOKENS_RATIO = 0.8


def _resolve(model: ModelSpec | str, cluster: ClusterSpec | str) -> tuple[ModelSpec, ClusterSpec]:
    if isinstance(model, str):
        from charon_search.catalog import load_model

        model = load_model(model)
    if isinstance(cluster, str):
        from charon_search.hardware import load_cluster

        cluster = load_cluster(cluster)
    return model, cluster


def resolve_kv_dtype(model: ModelSpec, config: ServingConfig) -> ServingConfig:
    """``config`` with a concrete ``kv_dtype``: ``auto`` becomes what an engine launched
    without ``--kv-cache-dtype`` stores for ``model``'s ``config.precision`` checkpoint
    (``serving._graphs.checkpoint_kv_dtype``); any other value is kept."""
    if config.kv_dtype != "auto":
        return config
    from charon_search.serving._graphs import checkpoint_kv_dtype

    return config.replace(kv_dtype=checkpoint_kv_dtype(model, config.precision))


def build_cost_model(model: ModelSpec, cluster: ClusterSpec, config: ServingConfig, *,
                     tp: int | None = None, pp: int | None = None,
                     ep: int | None = None,
                     dp_attention: bool | None = None) -> IterationCostModel:
    """The graph-based iteration cost model of one replica (SP wrapper when ``sp > 1``);
    ``dp_attention`` None = ``config.dp_attention``."""
    config = resolve_kv_dtype(model, config)
    dpa = config.dp_attention if dp_attention is None else dp_attention
    base: IterationCostModel = GraphIterationCostModel(
        model, cluster, tp=tp or config.tp, pp=pp or config.pp, ep=ep or config.ep,
        dp_attention=dpa, precision=config.precision, kv_dtype=config.kv_dtype,
        fused_kernels=config.fused_kernels, tp_allreduce=config.tp_allreduce,
        moe_kernel=config.moe_kernel, allreduce_norm_fusion=config.allreduce_norm_fusion)
    return _maybe_sp(base, cluster, config, tp or config.tp, pp or config.pp,
                     model.num_kv_layers)


def _maybe_sp(base: IterationCostModel, cluster: ClusterSpec, config: ServingConfig, tp: int,
              pp: int, num_kv_layers: int) -> IterationCostModel:
    if config.sp == 1:
        return base
    from charon_search.serving.dynamic_sp import SequenceParallelCostModel

    stage_layers = -(-num_kv_layers // pp)

    def all_gather(kv_bytes: float, d: int) -> float:
        # ``kv_bytes``: the request's KV on one GPU of a pipeline stage (``kv_bytes_per_token``
        # covers a stage's ceil(num_kv_layers / pp) KV layers). The prefill attention is the
        # whole model's, so every KV layer of every stage all-gathers its KV, over d ranks
        # spaced tp apart.
        return num_kv_layers * collective_s("all_gather", kv_bytes / stage_layers, d, cluster,
                                            stride=tp)

    return SequenceParallelCostModel(base, sp=config.sp, dynamic=config.dynamic_sp,
                                     all_gather=all_gather)


def kv_capacity_blocks(model: ModelSpec, cluster: ClusterSpec, config: ServingConfig, *,
                       tp: int, pp: int, ep: int, dp_attention: bool | None = None) -> int:
    """KV blocks per replica: ``num_kv_blocks`` if set, else the memory model's capacity
    (``dp_attention`` None = ``config.dp_attention``)."""
    if config.num_kv_blocks:
        return config.num_kv_blocks
    config = resolve_kv_dtype(model, config)
    from charon_search.memory.serving import MEMORY_RULE_KNOBS, kv_cache_capacity, moe_tp_degree
    from charon_search.serving._graphs import weight_storage
    from charon_search.serving.backends import engine_memory

    dpa = config.dp_attention if dp_attention is None else dp_attention
    rule, fraction = engine_memory(config, cluster.gpu, tp=tp, pp=pp, dp_attention=dpa)
    cap = kv_cache_capacity(
        model, cluster, tp=1 if dpa else tp, pp=pp, ep=ep, moe_tp=moe_tp_degree(tp, ep),
        gpu_memory_utilization=fraction, memory_rule=rule,
        # Under attention DP each rank runs its share of the replica's tokens.
        max_batched_tokens=-(-config.max_num_batched_tokens // tp) if dpa
        else config.max_num_batched_tokens, block_size=config.block_size,
        kv_dtype=config.kv_dtype,
        linear_state_ratio=SGLANG_MAMBA_FULL_MEMORY_RATIO if config.engine == "sglang" else 0.0,
        linear_state_requests=config.max_num_seqs, **weight_storage(model, config.precision),
        **_draft_memory(model, config, tp=1 if dpa else tp))
    blocks = cap.num_blocks
    if dpa:
        blocks *= tp  # each attention-DP rank holds its own requests' KV
    # Sequence parallelism: each of the sp GPUs of a colocated replica keeps whole requests'
    # KV (``dynamic_sp.SequenceParallelCostModel``), so the replica holds sp times one's.
    blocks *= config.sp
    if blocks < 1:
        shipped = sorted(model.hf_config.get("_charon_checkpoints") or {})
        hint = (f"; the catalog's {model.name} checkpoints are {', '.join(shipped)} "
                f"(`precision`), not {config.precision}"
                if shipped and config.precision not in shipped else "")
        raise InfeasibleError(
            f"{model.name} with tp={tp}, pp={pp}, ep={ep} leaves no room for KV cache on "
            f"{cluster.gpu.name} ({cap.weights_bytes / 2**30:.1f} GiB weights per GPU at "
            f"{config.precision}, within the engine's {MEMORY_RULE_KNOBS[rule]} {fraction:g}: "
            f"raise `--memory-fraction`, tp or pp, or use a smaller precision){hint}"
        )
    return blocks


def _draft_memory(model: ModelSpec, config: ServingConfig, *, tp: int) -> dict[str, Any]:
    """``kv_cache_capacity`` keyword arguments for speculative decoding's extra memory: the
    checkpoint's MTP layers (``mtp_layers``), or, per GPU, a draft model's weights and per-token
    KV (it runs TP-sharded beside the target at the target's precision, as
    ``ServingSimulation._draft_fn`` costs it, and keeps its own KV for every cached token)."""
    spec = config.speculative
    if spec is None:
        return {}
    if spec.method == "mtp":
        return {"mtp_layers": mtp_layers(model)}
    from charon_search.catalog import load_model
    from charon_search.memory.serving import WEIGHT_DTYPE_BYTES, kv_bytes_per_token

    draft = load_model(spec.draft_model)
    wbytes = WEIGHT_DTYPE_BYTES[{"fp4": "nvfp4"}.get(config.precision, config.precision)]
    return {"extra_weights_bytes": draft.num_params * wbytes / tp,
            "extra_kv_bytes_per_token": kv_bytes_per_token(draft, tp=tp,
                                                           kv_dtype=config.kv_dtype)}


def kv_paging(model: ModelSpec, config: ServingConfig, blocks: int
              ) -> tuple[int, KvWindow | None]:
    """``(blocks, window)`` of a replica whose memory holds ``blocks`` blocks of tokens in every
    KV layer, under ``config.windowed_kv`` (``ServingConfig``): the shared page pool of vLLM
    and TensorRT-LLM (``KvWindow``), SGLang's own pools for sliding windows (the
    full-attention one is the limit: ``blocks x layers / (full + 0.8 x windowed layers)``
    blocks, no window), or every layer keeping every token (``window`` None)."""
    windowed = model.windowed_kv_layers if config.windowed_kv is not False else 0
    if windowed and config.windowed_kv is None and config.engine == "sglang":
        # A request keeps at most a window in SGLang's SWA pool (0.8 x the full pool's
        # tokens). Its Llama 4 chunked-attention pools (--hybrid-kvcache-ratio) are not
        # modelled: no saving.
        if not model.extra.get("attention_chunk_size"):
            layers = model.num_kv_layers
            blocks = int(blocks * layers / (layers - windowed
                                            + SGLANG_SWA_FULL_TOKENS_RATIO * windowed))
        windowed = 0
    return blocks, KvWindow.for_layers(model.num_kv_layers - windowed, windowed,
                                       model.sliding_window, config.block_size)


def _engine_time(explicit: float | None, calibrated: Mapping[str, float], engine: str) -> float:
    """A per-engine time of ``ServingConfig``: its own value, else the cluster's calibrated one
    for ``engine`` (0 when the cluster has none)."""
    return float(explicit) if explicit is not None else float(calibrated.get(engine, 0.0))


class _StreamQueue:
    """One front-end process's output queue: first come, first served, ``per_token_s`` each."""

    __slots__ = ("free_s", "per_token_s")

    def __init__(self, per_token_s: float) -> None:
        self.per_token_s = per_token_s
        self.free_s = 0.0

    def take(self, now_s: float, tokens: int) -> float:
        """``tokens`` tokens handed over at ``now_s``: when their clients have them."""
        self.free_s = max(self.free_s, now_s) + tokens * self.per_token_s
        return self.free_s


class _CycleQueue:
    """One front-end process that streams in cycles (``ServingConfig.frontend_output_stream_s``):
    a cycle hands every request with new tokens one chunk, ``per_stream_s`` each, one after
    another. Tokens emitted while a cycle runs wait for the next one, which starts when it
    ends and serves each waiting request once, however many iterations its tokens came from
    (they merge into one chunk)."""

    __slots__ = ("busy_s", "end_s", "per_stream_s", "waiting")

    def __init__(self, per_stream_s: float) -> None:
        self.per_stream_s = per_stream_s
        self.end_s = 0.0
        """End of the running (or last) cycle."""
        self.waiting: dict[int, int] = {}
        """Source (replica) -> requests with tokens waiting for the next cycle."""
        self.busy_s = 0.0

    def take(self, now_s: float, streams: int, source: int = 0) -> float:
        """``streams`` requests of replica ``source`` got tokens at ``now_s``: when their clients
        have them (on average: the middle of the cycle that serves them)."""
        q = self.per_stream_s
        if self.waiting and self.end_s <= now_s:  # the next cycle started when the last ended
            n = sum(self.waiting.values())
            self.waiting.clear()
            self.end_s += n * q
            self.busy_s += n * q
        if self.end_s <= now_s:  # idle: a cycle starts now
            self.end_s = now_s + streams * q
            self.busy_s += streams * q
            return now_s + 0.5 * (streams + 1) * q
        # Merged: a request waits once in the next cycle whichever iterations fed it.
        self.waiting[source] = max(self.waiting.get(source, 0), streams)
        return self.end_s + 0.5 * (sum(self.waiting.values()) + 1) * q


class ServingSimulation:
    """One serving simulation: replicas, router, event heap, per-request results."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, config: ServingConfig, *,
                 cost_model: IterationCostModel | None = None,
                 draft_cost_model: IterationCostModel | None = None,
                 record_iterations: bool = False,
                 cost_cache: dict[tuple, IterationCostModel] | None = None) -> None:
        self.model = model
        self.cluster = cluster
        self.config = resolve_kv_dtype(model, config)
        self._heap: list[tuple[float, int, int, int, Any]] = []
        self._seq = itertools.count()
        self.prefill_pool: list[ReplicaEngine] = []
        self.decode_pool: list[ReplicaEngine] = []
        self._cost_cache: dict[tuple, IterationCostModel] = (
            {} if cost_cache is None else cost_cache)
        """Per-pool cost models (with their warm memo tables); pass one dict to reuse them."""
        self._injected = cost_model
        self._draft = draft_cost_model
        self._record = record_iterations
        spec = config.speculative
        self._e = spec.expected_tokens_per_step if spec else 1.0
        self._q = spec.num_draft_tokens + 1 if spec else 1
        self._kv_xfer_bytes_per_token = 0.0
        self._kv_xfer_window: KvWindow | None = None
        """The prefill pool's windowed paging: its windowed layers hand over only the
        window's KV."""
        if config.disagg is None:
            pool = PoolConfig(num_replicas=config.dp, tp=config.tp, pp=config.pp, ep=config.ep)
            self.prefill_pool = self._make_pool("mixed", pool)
            self.decode_pool = self.prefill_pool
        else:
            self.prefill_pool = self._make_pool("prefill", config.disagg.prefill)
            self.decode_pool = self._make_pool("decode", config.disagg.decode)
        self.replicas = list(dict.fromkeys(self.prefill_pool + self.decode_pool))
        process = config.frontend or config.engine  # hardware.spec.FRONTEND_KEYED_TIMES keys
        cal = cluster.calibration
        self.frontend_s = _engine_time(config.frontend_latency_s, cal.frontend_latency_s, process)
        """Front-end latency (``ServingConfig.frontend_latency_s``) of the process that takes
        the request (the engine's own server, or ``dynamo``): a request reaches the engine this
        long after its client sent it; reported latencies start at the send."""
        self.frontend_token_s = _engine_time(config.frontend_prompt_token_s,
                                             cal.frontend_prompt_token_s, process)
        """Front-end time per prompt token (``ServingConfig.frontend_prompt_token_s``), of the
        process that turns the prompt into token ids: the engine's own server, or Dynamo's
        ``dynamo.frontend`` for a Dynamo launch (keyed ``dynamo`` whatever the engine)."""
        self.frontend_output_token_s = _engine_time(config.frontend_output_token_s,
                                                    cal.frontend_output_token_s, process)
        """Front-end time per streamed output token (``ServingConfig.frontend_output_token_s``):
        the engine's own server streams every replica's tokens (disaggregated: the decode
        replicas'), Dynamo one queue per replica (its ``dynamo.<engine>`` worker)."""
        self.frontend_output_stream_s = _engine_time(config.frontend_output_stream_s,
                                                     cal.frontend_output_stream_s, process)
        """Front-end time per streaming request per output cycle
        (``ServingConfig.frontend_output_stream_s``): one cycling process for the engine's own
        server, one per replica under Dynamo, as for ``frontend_output_token_s``."""
        self.disagg_handoff_s = _engine_time(config.disagg_handoff_s, cal.disagg_handoff_s,
                                             config.engine)
        """Hand-over time of a disaggregated request beyond its KV bytes
        (``ServingConfig.disagg_handoff_s``), the engine's own transfer machinery."""
        per_front = self.decode_pool if config.frontend else (0,)
        self._streams: list[_StreamQueue] = []
        self._cycles: list[_CycleQueue] = []
        if self.frontend_output_token_s > 0:
            self._streams = [_StreamQueue(self.frontend_output_token_s) for _ in per_front]
        if self.frontend_output_stream_s > 0:
            self._cycles = [_CycleQueue(self.frontend_output_stream_s) for _ in per_front]
        for i, eng in enumerate(self.decode_pool):
            eng.stream = self._stream_fn(i if config.frontend else 0, i)
        self._finished = 0
        self._on_finish_hook: Any = None
        self._ramp_end_s = 0.0
        self._decode_resamples_first = config.engine in ("", "vllm")
        """Disaggregated: the decode pool samples the first token again (vLLM's NixlConnector
        flow); SGLang streams the prefill's token at the join and TensorRT-LLM's generation
        server continues from it (``engine.ReplicaEngine.first_token_at_join``)."""
        """Send time of a closed loop's last ramped first-wave request (0 without a ramp)."""

    def _stream_fn(self, front: int, replica: int) -> Any:
        """Replica ``replica``'s path to its clients through front end ``front``: the output
        token queue, then the streaming cycles (None: tokens reach the clients at once)."""
        tokens = self._streams[front].take if self._streams else None
        cycles = self._cycles[front].take if self._cycles else None
        if cycles is None:
            return tokens
        if tokens is None:
            return lambda now_s, n: cycles(now_s, n, replica)
        return lambda now_s, n: cycles(tokens(now_s, n), n, replica)

    def front_s(self, spec: RequestSpec) -> float:
        """Time ``spec`` spends in the serving front end before the engine sees it (its
        client's send is this long before its arrival at the scheduler)."""
        return self.frontend_s + self.frontend_token_s * spec.prompt_tokens

    # ------------------------------------------------------------------ construction
    def _pool_cluster(self, pool: PoolConfig) -> ClusterSpec:
        if not pool.cluster:
            return self.cluster
        from charon_search.hardware import load_cluster

        return load_cluster(pool.cluster)

    def _cost(self, pool: PoolConfig, cluster: ClusterSpec) -> IterationCostModel:
        key = (cluster.name, pool.tp, pool.pp, pool.ep, pool.dp_attention, self.config.sp,
               self.config.dynamic_sp)
        hit = self._cost_cache.get(key)
        if hit is not None and hasattr(hit, "saved_s"):
            hit.saved_s = 0.0  # a shared cache's SP model: count this simulation's saving only
        if hit is None:
            if self._injected is not None:
                hit = _maybe_sp(self._injected, cluster, self.config, pool.tp, pool.pp,
                                self.model.num_kv_layers)
            else:
                hit = build_cost_model(self.model, cluster, self.config, tp=pool.tp,
                                       pp=pool.pp, ep=pool.ep, dp_attention=pool.dp_attention)
            self._cost_cache[key] = hit
        return hit

    def _make_pool(self, role: str, pool: PoolConfig) -> list[ReplicaEngine]:
        cfg = self.config
        own = {k: v for k, v in (("max_num_batched_tokens", pool.max_num_batched_tokens),
                                 ("max_num_seqs", pool.max_num_seqs)) if v}
        if own:
            cfg = cfg.replace(**own)  # the pool's own engine limits
        cluster = self._pool_cluster(pool)
        cost = self._cost(pool, cluster)
        try:
            blocks = kv_capacity_blocks(self.model, cluster, cfg, tp=pool.tp, pp=pool.pp,
                                        ep=pool.ep, dp_attention=pool.dp_attention)
        except InfeasibleError as e:
            if role == "mixed":
                raise
            raise InfeasibleError(f"{role} pool: {e}") from e
        overhead = (cfg.iteration_overhead_s if cfg.iteration_overhead_s is not None
                    else cluster.calibration.iteration_cpu_overhead_s)
        prefill_overhead = _engine_time(cfg.prefill_iteration_overhead_s,
                                        cluster.calibration.prefill_iteration_overhead_s,
                                        cfg.engine)
        # Host floor per operator of an iteration without a CUDA graph: the engine's launch
        # cost, or the cluster's calibrated host time for this engine when that is larger.
        launch = max(cfg.kernel_launch_overhead_s,
                     cluster.calibration.eager_kernel_host_s.get(cfg.engine, 0.0))
        dpa = cfg.dp_attention if pool.dp_attention is None else pool.dp_attention
        blocks, window = kv_paging(self.model, cfg, blocks)
        if role == "prefill":
            # Per token, whole model, summed over the GPUs holding it: all tp ranks (heads
            # sharded), or one rank per stage under attention DP (whole heads, its requests).
            holders = (1 if dpa else pool.tp) * pool.pp
            self._kv_xfer_bytes_per_token = cost.kv_bytes_per_token() * holders
            self._kv_xfer_window = window
            self._prefill_cluster = cluster
            self._prefill_gpus = holders
        # A disaggregated prefill pool drafts too: its draft model or MTP layers run over the
        # prompt (their KV, the first proposal), as the decode pool never sees the prompt.
        draft = self._draft_fn(cost, pool, cluster) if cfg.speculative is not None else None
        engines = []
        for i in range(pool.num_replicas):
            engines.append(ReplicaEngine(
                f"{role}{i}", role, cost, cfg, num_kv_blocks=blocks, overhead_s=overhead,
                prefill_overhead_s=prefill_overhead, launch_s=launch,
                adp_ranks=pool.tp if dpa else 0, kv_window=window,
                tokens_per_step=self._e if role != "prefill" else 1.0,
                decode_q=self._q if role != "prefill" else 1, draft_s=draft,
                on_prefilled=self._on_prefilled, on_finished=self._on_finished,
                record=self._record))
        return engines

    def _draft_fn(self, cost: IterationCostModel, pool: PoolConfig, cluster: ClusterSpec) -> Any:
        spec = self.config.speculative
        assert spec is not None
        k = spec.num_draft_tokens
        if spec.method == "mtp":
            # The MTP layers run over the prompt chunks once (their own KV, the first
            # proposal), then propose k tokens for every decoding request, one pass each.
            return lambda shape, n, kv: (cost.mtp_prefill_s(shape)
                                         + (k * cost.mtp_step_s(n, kv) if n else 0.0))
        draft = self._draft
        if draft is None:
            from charon_search.catalog import load_model

            draft_spec = load_model(spec.draft_model)
            # The draft keeps its KV in the target's cache dtype (as ``_draft_memory`` sizes
            # it) and all-reduces with the target's kernel.
            draft = GraphIterationCostModel(draft_spec, cluster, tp=pool.tp, pp=1,
                                            precision=self.config.precision,
                                            kv_dtype=self.config.kv_dtype,
                                            tp_allreduce=self.config.tp_allreduce,
                                            fused_kernels=self.config.fused_kernels)
        def draft_s(shape: Sequence[tuple[int, int]], n: int, kv: float) -> float:
            # The draft model runs the iteration's prompt chunks once (its own KV) and then
            # proposes k tokens for every decoding request, one forward each.
            first = draft.iteration_s(shape, n, kv, 1) if shape or n else 0.0
            return first + (k - 1) * draft.iteration_s((), n, kv, 1) if n else first

        return draft_s

    # ------------------------------------------------------------------ events
    def _push(self, t: float, prio: int, kind: int, payload: Any) -> None:
        heapq.heappush(self._heap, (t, prio, next(self._seq), kind, payload))

    @staticmethod
    def _least_loaded(pool: Sequence[ReplicaEngine]) -> ReplicaEngine:
        best = pool[0]
        for r in pool[1:]:
            if r.load < best.load:
                best = r
        return best

    def _on_prefilled(self, req: Request, now_s: float) -> None:
        cfg = self.config
        assert cfg.disagg is not None
        tokens = float(req.target)
        w = self._kv_xfer_window
        if w is not None:  # the windowed layers' share of the bytes covers only the window
            share = w.window_pages / w.pages_per_block
            tokens += share * (min(tokens, w.window_blocks * cfg.block_size) - tokens)
        nbytes = tokens * self._kv_xfer_bytes_per_token
        # Every prefill GPU sends its shard in parallel.
        per_gpu = nbytes / max(1, self._prefill_gpus)
        xfer = kv_transfer_s(per_gpu, self._prefill_cluster, cfg.disagg.kv_transfer)
        self._push(now_s + xfer + self.disagg_handoff_s, 0, _KV, req)

    def _on_finished(self, req: Request, now_s: float) -> None:
        self._finished += 1
        if self._on_finish_hook is not None:
            self._on_finish_hook(now_s)

    # ------------------------------------------------------------------ run
    def expected_lifetime_s(self, requests: Sequence[RequestSpec], concurrency: int) -> float:
        """One request's expected E2E in a closed loop of ``concurrency`` (mean lengths of
        ``requests``): its prefill (chunks of ``max_num_batched_tokens``) plus ``output - 1``
        decode steps of a batch of ``concurrency`` requests per replica at the mean context,
        each with the per-iteration overhead. Used to stagger a closed loop's first wave."""
        if not requests:
            return 0.0
        p = float(np.mean([r.prompt_tokens for r in requests]))
        o = float(np.mean([r.output_tokens for r in requests]))
        pre, dec = self.prefill_pool[0], self.decode_pool[0]
        budget = self.config.max_num_batched_tokens
        t, done = 0.0, 0
        while done < p:
            take = int(min(budget, math.ceil(p - done)))
            done += take
            t += pre.cost.iteration_s([(take, done)], 0, 0.0) + pre.overhead_s
        n = max(1, min(self.config.max_num_seqs,
                       math.ceil(concurrency / max(1, len(self.decode_pool)))))
        kv = n * (p + o / 2)
        step = dec.cost.iteration_s((), n, kv, dec.q, padded_decode=n) + dec.overhead_s
        if dec.draft_s is not None:
            step += dec.draft_s((), n, kv)
        return t + max(0.0, o - 1) / dec.e * step

    def warm_prefix_caches(self, prefixes: Sequence[tuple[int, int]]) -> int:
        """Cache ``(prefix_id, tokens)`` prefixes (oldest first) before the run, as requests
        that finished before it leave them (``WorkloadSpec.cached_prefixes``). Each one goes to
        one prefill-capable replica, round-robin (a router spreads a warm-up over them).
        Returns how many were cached (0 without prefix caching)."""
        engines = [e for e in self.prefill_pool if e.pool.tree is not None]
        cached = 0
        for j, (pid, tokens) in enumerate(prefixes):
            if engines:
                # Increasing times before t = 0 keep the draw order for LRU eviction.
                cached += engines[j % len(engines)].warm_prefix(pid, tokens,
                                                               -1e-6 * (len(prefixes) - j))
        return cached

    def run(self, requests: Sequence[RequestSpec], *, closed_loop_concurrency: int = 0,
            ramp_up_s: float | None = 0.0, progress: bool = False) -> list[Request]:
        """Simulate ``requests``; closed loop keeps ``closed_loop_concurrency`` in flight
        (a finished request's client issues the next one after its ``think_time_s``).

        ``ramp_up_s``: the first ``closed_loop_concurrency`` requests start evenly spread over
        this time; None = over one expected request lifetime (``expected_lifetime_s``), the
        steady state of a closed loop. Why: with identical requests started together, a
        deterministic simulation keeps them in lock-step waves forever (all prefill in one
        iteration, all finish together), so every TTFT includes everyone's prefill. Real
        benchmark clients drift out of lock-step (scheduling jitter, prefill chunking,
        tokenizer/HTTP latency, early EOS, warm-up requests) towards evenly phased streams: a
        new request arrives every E2E / concurrency on average and joins a running decode
        batch. Spreading the first wave over one lifetime starts the loop in that state;
        Little's law (concurrency = throughput x E2E) is unchanged. The two settings bound a
        measured closed loop's TTFT: ``0`` (lock-step waves) from above, the default from
        below; measured silicon rows fall in between (see examples/workloads/silicon_check.py
        ``--waves``)."""
        reqs: list[Request] = []
        pending = iter(requests)
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=len(requests), unit="req", desc="serve", leave=False)

        front = self.front_s

        def issue(now_s: float) -> None:
            spec = next(pending, None)
            if spec is not None:
                self._push(now_s + spec.think_time_s + front(spec), 0, _ARRIVE, spec)

        if closed_loop_concurrency:
            first = min(closed_loop_concurrency, len(requests))
            if ramp_up_s is None:
                ramp_up_s = self.expected_lifetime_s(requests[:first], closed_loop_concurrency)
            for i in range(first):
                spec = next(pending)
                self._push(ramp_up_s * i / first + front(spec), 0, _ARRIVE, spec)
            # A benchmark client starts every stream at once; a ramp only seeds the steady
            # state, so the report measures throughput from its last start (``report``).
            self._ramp_end_s = ramp_up_s * (first - 1) / first
            self._on_finish_hook = issue
        else:
            for spec in requests:
                self._push(spec.arrived_at_s + front(spec), 0, _ARRIVE, spec)
        # Replicas with new work at this instant, by their place in ``self.replicas``: they
        # start in that order (not by ``id()``, a memory address that differs between runs).
        dirty: set[int] = set()
        index = {id(r): i for i, r in enumerate(self.replicas)}
        heap = self._heap
        last_done = 0
        while heap:
            now, _, _, kind, payload = heapq.heappop(heap)
            if kind == _ARRIVE and isinstance(payload, RequestSpec):
                req = Request(payload, now)
                reqs.append(req)
                target = self._least_loaded(self.prefill_pool)
                target.enqueue(req)
                dirty.add(index[id(target)])
            elif kind == _KV and isinstance(payload, Request):
                if self._decode_resamples_first:
                    # vLLM's decode instance drops the prefill's sampled token and recomputes
                    # the last prompt token to sample it itself (v1 Scheduler
                    # _update_waiting_for_remote_kv: num_computed_tokens -= 1 on a full
                    # prompt hit), so it runs all output_tokens steps.
                    payload.gen0 = 0
                payload.prefilled = payload.target
                target = self._least_loaded(self.decode_pool)
                target.enqueue(payload)
                dirty.add(index[id(target)])
            else:
                engine: ReplicaEngine = payload
                engine.finish_iteration(now)
                dirty.add(index[id(engine)])
            if heap and heap[0][0] == now:
                continue  # start iterations once every event of this instant is in
            for i in sorted(dirty):
                engine = self.replicas[i]
                if not engine.busy and engine.has_work():
                    d = engine.start_iteration(now)
                    if d > 0:
                        self._push(now + d, 1, _ITER, engine)
                    elif engine.busy:  # a batch ran, but took no time: it would never end
                        raise InfeasibleError(
                            f"replica {engine.name}: an iteration was costed at {d} s; the "
                            f"cost model and the overheads (iteration_overhead_s, "
                            f"kernel_launch_overhead_s) must give every iteration > 0 s")
            dirty.clear()
            if bar is not None and self._finished != last_done:
                bar.update(self._finished - last_done)
                last_done = self._finished
        if bar is not None:
            bar.close()
        stuck = [r for r in self.replicas if r.has_work()]
        if stuck:
            raise InfeasibleError(
                f"replica {stuck[0].name} cannot make progress: a request needs more KV blocks "
                f"than the cache has ({stuck[0].pool.num_blocks} blocks of "
                f"{self.config.block_size} tokens)"
            )
        return reqs

    # ------------------------------------------------------------------ report
    def report(self, reqs: Sequence[Request], *, num_requests: int, closed_loop: bool,
               keep_requests: bool = False) -> ServingReport:
        cfg = self.config
        n = len(reqs)
        # Latencies from the client's send, a front-end latency before the engine's arrival.
        arrived = np.array([r.arrived_s - self.front_s(r.spec) for r in reqs])
        first = np.array([r.first_token_s for r in reqs])
        finish = np.array([r.finish_s for r in reqs])
        out_tok = np.array([r.output_tokens for r in reqs], dtype=float)
        done = np.isfinite(finish)
        if cfg.stream_interval > 1:
            # The client's first chunk is taken to carry the stream_interval-th token (or the
            # last one): an empirical rule (ServingConfig.stream_interval).
            with np.errstate(invalid="ignore", divide="ignore"):
                gap = np.where(out_tok > 1, (finish - first) / (out_tok - 1), 0.0)
            first = first + (np.minimum(cfg.stream_interval, out_tok) - 1) * gap
        ttft = first - arrived
        e2e = finish - arrived
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(out_tok > 1, (e2e - ttft) / (out_tok - 1), np.nan)
        t0 = float(arrived.min()) if n else 0.0
        t_end = float(np.nanmax(finish)) if done.any() else t0
        run_s = max(t_end - t0, 1e-12)
        # Throughput window: the whole run, or for a ramped closed loop from the ramp's end:
        # the ramp, with fewer streams in flight than the loop keeps, is not part of a
        # benchmark (``run``'s ``ramp_up_s``). Inside it each request counts the output
        # tokens it streams there (the first at its first token, the rest evenly until its
        # last) and, as a request, the share of its lifetime there (so requests/s meets
        # Little's law, in flight / E2E, however short the run).
        r0 = t0 + self._ramp_end_s if closed_loop else t0
        if r0 > t0 and t_end > r0:
            duration = t_end - r0

            def share(start: np.ndarray) -> np.ndarray:
                with np.errstate(invalid="ignore", divide="ignore"):
                    inside = np.clip(finish - np.maximum(start, r0), 0.0, None)
                    return np.where(finish > start, inside / (finish - start), 1.0)

            win_tok = (first >= r0) + np.maximum(out_tok - 1, 0) * share(first)
            win_req = np.where(done, share(arrived), 0.0)
        else:
            duration, win_tok, win_req = run_s, out_tok, done.astype(float)
        # Measurement window for Little's law: the arrival period (open loop) or the run.
        if not closed_loop and n > 1 and arrived.max() > t0:
            w0, w1 = t0, float(arrived.max())
            arrival_rate = (n - 1) / (w1 - w0)
        else:
            w0, w1 = t0, t_end
            arrival_rate = n / run_s
        fin = np.where(done, finish, t_end)
        overlap = np.clip(np.minimum(fin, w1) - np.maximum(arrived, w0), 0.0, None)
        in_system = float(overlap.sum() / max(w1 - w0, 1e-12))
        # ITL: decode iterations weighted by the tokens they commit (log histogram).
        hist = ItlHistogram()
        for eng in self.replicas:
            hist.merge(eng.itl)
        itl = hist.stats()
        ok = done.copy()
        if cfg.slo_ttft_s is not None:
            ok &= ttft <= cfg.slo_ttft_s
        if cfg.slo_tpot_s is not None:
            ok &= ~(tpot > cfg.slo_tpot_s)
        mean_tpot = float(np.nanmean(tpot[done])) if np.isfinite(tpot[done]).any() else math.nan
        out_rate = float(win_tok[done].sum() / duration)
        prompt = sum(r.prompt_tokens for r in reqs)
        hits = sum(r.hit_tokens for r in reqs)
        kv_util = [eng.kv_used_page_s / (eng.busy_s * eng.pool.num_pages)
                   for eng in self.replicas if eng.busy_s > 0]
        saved = sum(getattr(c, "saved_s", 0.0)  # this simulation's models, each once
                    for c in {id(eng.cost): eng.cost for eng in self.replicas}.values())
        per_request = None
        if keep_requests:
            per_request = {
                "request_id": [r.spec.request_id for r in reqs],
                "arrived_at_s": arrived.tolist(), "prompt_tokens": [r.prompt_tokens for r in reqs],
                "output_tokens": out_tok.astype(int).tolist(), "ttft_s": ttft.tolist(),
                "e2e_s": e2e.tolist(), "tpot_s": tpot.tolist(),
                "num_preemptions": [r.num_preemptions for r in reqs],
                "prefix_hit_tokens": [r.hit_tokens for r in reqs],
            }
        num_gpus = cfg.num_gpus
        window = self.decode_pool[0].pool.window
        return ServingReport(
            ttft_s=latency_stats(ttft[done]), tpot_s=latency_stats(tpot[done]), itl_s=itl,
            e2e_s=latency_stats(e2e[done]), requests_per_s=float(win_req.sum() / duration),
            output_tokens_per_s=out_rate,
            tokens_per_s_per_user=1.0 / mean_tpot if mean_tpot > 0 else math.nan,
            tokens_per_s_per_gpu=out_rate / num_gpus, num_gpus=num_gpus,
            num_requests=num_requests, num_completed=int(done.sum()),
            num_preemptions=sum(eng.num_preemptions for eng in self.replicas),
            prefix_hit_rate=hits / prompt if prompt else 0.0,
            kv_utilization=float(np.mean(kv_util)) if kv_util else 0.0,
            mean_requests_in_system=in_system, arrival_rate=arrival_rate,
            goodput_requests_per_s=float(win_req[ok].sum() / duration),
            slo_attainment=float(ok.sum() / max(1, done.sum())), duration_s=duration,
            num_iterations=sum(eng.num_iterations for eng in self.replicas),
            kv_capacity_tokens=self.decode_pool[0].pool.capacity_tokens,
            kv_window_tokens=window.window_blocks * cfg.block_size if window else 0,
            mean_tokens_per_step=self._e, dynamic_sp_saved_s=saved,
            frontend_busy=float((out_tok[done].sum() * self.frontend_output_token_s
                                 + sum(c.busy_s for c in self._cycles))
                                / max(1, len(self._streams), len(self._cycles)) / run_s),
            config=_jsonable_config(cfg), per_request=per_request)

    def write_chrome_trace(self, path: str | Path) -> None:
        """Iterations as Chrome/Perfetto complete events, one row per replica."""
        events = []
        for pid, eng in enumerate(self.replicas):
            events.append({"name": "process_name", "ph": "M", "pid": pid,
                           "args": {"name": eng.name}})
            for rec in eng.records or ():
                label = ("mixed" if rec.num_prefill and rec.num_decode else
                         "prefill" if rec.num_prefill else "decode")
                events.append({"name": label, "ph": "X", "pid": pid, "tid": 0,
                               "ts": rec.start_s * 1e6, "dur": rec.duration_s * 1e6,
                               "args": {"prefill_tokens": rec.prefill_tokens,
                                        "num_prefill": rec.num_prefill,
                                        "num_decode": rec.num_decode,
                                        "cuda_graph": rec.cuda_graph}})
        Path(path).write_text(json.dumps({"traceEvents": events}))


def kv_transfer_s(nbytes_per_gpu: float, cluster: ClusterSpec, tier: str) -> float:
    """Seconds to move one GPU's KV shard to the decode pool.

    ``nvlink``: a send/recv between neighbouring ranks (innermost tier). ``rdma``: over the
    scale-out NIC (``DisaggConfig.kv_transfer``), a send/recv between ranks one innermost
    domain apart, which lands on the first ``fabric: network`` tier (one node apart on a DGX,
    one NVL72 rack apart on GB200, whose trays share NVLink); a cluster without a network
    tier moves it at the GPU's NIC bandwidth (``GpuSpec.nic_bandwidth_bytes_per_s``) plus the
    outermost tier's latency.
    """
    if tier == "nvlink":
        return collective_s("send_recv", nbytes_per_gpu, 2, cluster, stride=1)
    tiers = cluster.tiers
    net = next((i for i, t in enumerate(tiers) if i > 0 and t.fabric == "network"), None)
    if net is not None:
        return collective_s("send_recv", nbytes_per_gpu, 2, cluster,
                            stride=tiers[net - 1].num_devices)
    nic = cluster.gpu.nic_bandwidth_bytes_per_s
    if nic <= 0:
        raise ConfigError(f"`--kv-transfer rdma` needs a NIC, but GPU {cluster.gpu.name} "
                          "has nic_bandwidth 0; use nvlink")
    return nbytes_per_gpu / nic + cluster.tiers[-1].latency_s


def _jsonable_config(cfg: ServingConfig) -> dict[str, Any]:
    d = cfg.to_dict()
    d["cuda_graph_sizes"] = list(cfg.cuda_graph_sizes)
    return d


def simulate_serving(model: ModelSpec | str, cluster: ClusterSpec | str,
                     config: ServingConfig | dict[str, Any],
                     workload: WorkloadSpec | Sequence[RequestSpec | Mapping[str, Any]]
                     | Mapping[str, Any] | str | PathLike[str], *,
                     rng: np.random.Generator | None = None,
                     cost_model: IterationCostModel | None = None,
                     keep_requests: bool = False, chrome_trace: str | Path | None = None,
                     progress: bool = False) -> ServingReport:
    """Simulate serving ``workload`` with ``config`` and return a ``ServingReport``.

    Args:
        model: ``ModelSpec`` or catalog name.
        cluster: ``ClusterSpec`` or cluster name (GPU type, topology, calibration).
        config: ``ServingConfig`` (or its dict form).
        workload: ``WorkloadSpec`` (or a mapping of its fields), a trace file path
            (``read_trace``), or the requests: a list of ``RequestSpec`` or of mappings
            with a trace's columns (``arrived_at``, ``prompt_tokens``, ``output_tokens``).
        rng: randomness for generated workloads (default ``default_rng(workload.seed)``).
        cost_model: override of the iteration cost model (all pools), e.g. an
            ``AffineIterationCostModel`` with measured coefficients.
        keep_requests: keep per-request columns in the report.
        chrome_trace: write the iterations as a Chrome trace to this path.
        progress: show a progress bar.

    Example:
        >>> rep = simulate_serving("debug-llama", "h100-sxm-8gpu", ServingConfig(),
        ...     WorkloadSpec(rate_per_s=5, num_requests=20))  # doctest: +SKIP
        >>> rep.ttft_s["p99"]  # doctest: +SKIP
    """
    sim, report = run_simulation(model, cluster, config, workload, rng=rng,
                                 cost_model=cost_model, keep_requests=keep_requests,
                                 record_iterations=chrome_trace is not None, progress=progress)
    if chrome_trace is not None:
        sim.write_chrome_trace(chrome_trace)
    return report


def run_simulation(model: ModelSpec | str, cluster: ClusterSpec | str,
                   config: ServingConfig | dict[str, Any],
                   workload: WorkloadSpec | Sequence[RequestSpec] | dict[str, Any], *,
                   rng: np.random.Generator | None = None,
                   cost_model: IterationCostModel | None = None, keep_requests: bool = False,
                   record_iterations: bool = False, progress: bool = False,
                   ) -> tuple[ServingSimulation, ServingReport]:
    """``simulate_serving`` returning the finished ``ServingSimulation`` too (its replicas'
    ``records`` hold every iteration when ``record_iterations``; ``validation.explain``)."""
    spec_model, cl = _resolve(model, cluster)
    cfg = config if isinstance(config, ServingConfig) else ServingConfig.from_dict(config)
    workload = _as_workload(workload)
    closed = 0
    ramp: float | None = 0.0
    if isinstance(workload, WorkloadSpec):
        requests = workload.generate(rng)
        closed = workload.concurrency if workload.closed_loop else 0
        ramp = workload.ramp_up_s
    else:
        requests = list(workload)
    if not requests:
        raise ConfigError("the workload has no requests")
    _check_parallel(spec_model, cfg)
    _check_precision(spec_model, cl, cfg)
    _check_speculative(spec_model, cfg)
    _check_context(spec_model, requests)
    _check_prompt_budget(cfg, requests)
    sim = ServingSimulation(spec_model, cl, cfg, cost_model=cost_model,
                            record_iterations=record_iterations)
    if isinstance(workload, WorkloadSpec):
        sim.warm_prefix_caches(workload.warm_prefixes())
    reqs = sim.run(requests, closed_loop_concurrency=closed, ramp_up_s=ramp, progress=progress)
    report = sim.report(reqs, num_requests=len(requests), closed_loop=bool(closed),
                        keep_requests=keep_requests)
    return sim, report


def _as_workload(workload: Any) -> WorkloadSpec | list[RequestSpec]:
    """A ``simulate_serving`` workload: a ``WorkloadSpec`` (or a mapping of its fields), a
    trace file (``read_trace``), or the requests themselves (``RequestSpec`` objects, or mappings
    with a trace's columns: ``requests_from_rows``)."""
    from charon_search.serving.workload import (
        ARRIVALS,
        read_trace,
        requests_from_rows,
        workload_from_requests,
    )

    if isinstance(workload, WorkloadSpec):
        return workload
    if isinstance(workload, Mapping):
        return WorkloadSpec.from_dict(workload)
    if isinstance(workload, str | PathLike):
        if str(workload) in ARRIVALS:
            raise ConfigError(f"`workload` {str(workload)!r} needs its parameters: pass a "
                              f"mapping of WorkloadSpec fields, e.g. {{'arrival': "
                              f"{str(workload)!r}, 'num_requests': 100, ...}}")
        return read_trace(workload)
    if isinstance(workload, Sequence):
        items = list(workload)
        if items and all(isinstance(r, RequestSpec) for r in items):
            return workload_from_requests(items)
        if items and all(isinstance(r, Mapping) for r in items):
            return requests_from_rows(items)
    raise ConfigError("`workload` must be a WorkloadSpec, a mapping of its fields, a trace "
                      "file, or a non-empty list of RequestSpec or of trace rows (mappings "
                      "with arrived_at, prompt_tokens, output_tokens), but got "
                      f"{type(workload).__name__}")


def _check_context(model: ModelSpec, requests: Sequence[RequestSpec]) -> None:
    """Every request fits the model's context (``ModelSpec.max_context``): an engine rejects a
    longer one (vLLM's and SGLang's default ``max_model_len`` / ``context_length`` and
    TensorRT-LLM's ``max_seq_len`` come from the checkpoint's ``max_position_embeddings``)."""
    limit = model.max_context
    if not limit:
        return
    longest = max(requests, key=lambda r: r.prompt_tokens + r.output_tokens)
    if longest.prompt_tokens + longest.output_tokens > limit:
        raise ConfigError(
            f"a request of {longest.prompt_tokens:,} prompt + {longest.output_tokens:,} output "
            f"tokens exceeds {model.name}'s context of {limit:,} tokens "
            f"(max_position_embeddings); `input_len` + `output_len` must be <= {limit:,} (for a "
            "lognormal length, set its `maximum`), or serve a config.json whose "
            "max_position_embeddings covers the RoPE scaling you run (`model` takes its path)")


def _check_prompt_budget(cfg: ServingConfig, requests: Sequence[RequestSpec]) -> None:
    """Without chunked prefill a prompt runs whole in one iteration, so it must fit the token
    budget of the replicas that prefill it: vLLM refuses to start with ``max_num_batched_tokens``
    below ``max_model_len`` then, and TensorRT-LLM rejects a prompt over ``max_num_tokens``."""
    if cfg.chunked_prefill:
        return
    budget = cfg.max_num_batched_tokens
    if cfg.disagg is not None and cfg.disagg.prefill.max_num_batched_tokens:
        budget = cfg.disagg.prefill.max_num_batched_tokens
    longest = max(r.prompt_tokens for r in requests)
    if longest > budget:
        raise ConfigError(
            f"without chunked prefill a prompt runs whole in one iteration, but a "
            f"{longest:,}-token prompt exceeds `max_num_batched_tokens` {budget:,}; raise the "
            f"budget or turn `chunked_prefill` on")


#: Expert kernel formats that run as weight-only GEMMs (4-bit weights dequantized to bf16), so
#: a GPU without 4-bit (or 8-bit) tensor cores runs them all the same (Marlin, Triton).
WEIGHT_ONLY_MOE_FORMATS = frozenset({"w4a16_mxfp4", "int4_wo"})


def _check_precision(model: ModelSpec, cluster: ClusterSpec, cfg: ServingConfig) -> None:
    """A ``precision`` whose GEMMs need tensor cores the GPU lacks (fp8 on an A100, fp4 on a
    Hopper part) is served only when the checkpoint quantizes nothing but its routed experts,
    in a weight-only format (gpt-oss's MXFP4 experts on H100); otherwise W8A8 / W4A4 GEMMs
    would be priced that the GPU cannot run.

    Raises:
        ConfigError: naming the precision, the GPU and its formats.
    """
    from charon_search.catalog.spec import is_moe_block
    from charon_search.hardware import load_cluster
    from charon_search.serving._graphs import checkpoint_quant

    if cfg.precision not in ("fp8", "fp4"):
        return
    clusters = [cluster] + ([load_cluster(p.cluster) for p in
                             (cfg.disagg.prefill, cfg.disagg.decode) if p.cluster]
                            if cfg.disagg is not None else [])
    for cl in clusters:
        peaks = cl.gpu.peak_flops_per_s
        if cfg.precision in peaks:
            continue
        quant = checkpoint_quant(model, cfg.precision)
        present = {"attn.qkv", "attn.out"}
        if any(not is_moe_block(t) for t in model.layer_types) or not model.is_moe:
            present |= {"mlp.in", "mlp.out"}
        if model.num_shared_experts:
            present.add("moe.shared")
        dense = sorted(present & quant.quantized_roles)
        experts = model.is_moe and "moe.expert" in quant.quantized_roles
        if dense or (experts and quant.moe_dtype not in WEIGHT_ONLY_MOE_FORMATS):
            formats = [f for f in ("bf16", "fp16", "fp8", "fp4") if f in peaks]
            what = (f"its {', '.join(dense)} GEMMs" if dense else
                    f"its routed experts ({quant.moe_dtype or 'no known format'})")
            shipped = cfg.precision in (model.hf_config.get("_charon_checkpoints") or {})
            whose = (f"{model.name}'s {cfg.precision} checkpoint runs" if shipped else
                     f"no {cfg.precision} checkpoint of {model.name} is shipped, so the assumed "
                     f"one quantizes every GEMM and runs")
            raise ConfigError(
                f"`precision` {cfg.precision!r}: {whose} "
                f"{what} as {cfg.precision} GEMMs, which {cl.gpu.name} (cluster {cl.name}) has "
                f"no tensor cores for; its formats: {formats} (weight-only 4-bit experts, as "
                f"gpt-oss's MXFP4 ones, are the only lower precision modelled there)")


def mtp_layers(model: ModelSpec) -> int:
    """Multi-token-prediction layers the checkpoint ships (DeepSeek-V3 / GLM
    ``num_nextn_predict_layers``, Qwen3.5 ``mtp_num_hidden_layers``, MiniMax
    ``mtp_transformer_layers`` with ``use_mtp``); 0 for a model without MTP heads."""
    hf = dict(model.hf_config)
    hf.update(hf.get("text_config") or {})  # multimodal configs nest the language model's
    if "use_mtp" in hf and not hf.get("use_mtp"):
        return 0
    return max(int(hf.get(k) or 0) for k in ("num_nextn_predict_layers",
                                             "mtp_num_hidden_layers", "mtp_transformer_layers"))


def _check_speculative(model: ModelSpec, cfg: ServingConfig) -> None:
    """MTP needs the checkpoint's MTP layers; a draft model must share the target's vocabulary
    (vLLM and SGLang refuse another one) and be smaller than it.

    Raises:
        ConfigError: naming the field, the model and what it has.
    """
    spec = cfg.speculative
    if spec is None:
        return
    if spec.method == "mtp" and not mtp_layers(model):
        raise ConfigError(f"`speculative.method` 'mtp' needs a checkpoint with MTP layers "
                          f"(num_nextn_predict_layers / mtp_num_hidden_layers / "
                          f"mtp_transformer_layers), but {model.name} "
                          "has none: give a draft model (method 'draft', `draft_model`; serve "
                          "--spec-draft MODEL)")
    if spec.method == "draft":
        from charon_search.catalog import load_model

        try:
            draft = load_model(spec.draft_model)
        except ConfigError as e:
            raise ConfigError(f"`speculative.draft_model` (serve --spec-draft): {e}") from None
        if draft.vocab_size != model.vocab_size:
            raise ConfigError(f"`speculative.draft_model` {draft.name!r} must share the target's "
                              f"vocabulary, but has {draft.vocab_size:,} tokens against "
                              f"{model.name}'s {model.vocab_size:,}")
        if draft.num_params >= model.num_params:
            raise ConfigError(f"`speculative.draft_model` {draft.name!r} must be smaller than "
                              f"the target, but has {draft.num_params:,} parameters against "
                              f"{model.name}'s {model.num_params:,}")


def _check_parallel(model: ModelSpec, cfg: ServingConfig) -> None:
    pools = ([(cfg.tp, cfg.pp, cfg.ep)] if cfg.disagg is None else
             [(p.tp, p.pp, p.ep) for p in (cfg.disagg.prefill, cfg.disagg.decode)])
    for tp, pp, ep in pools:
        if model.num_attention_heads % tp:
            raise ConfigError(f"`tp` must divide num_attention_heads, but got "
                              f"(tp={tp}, num_attention_heads={model.num_attention_heads})")
        if pp > model.num_layers:
            raise ConfigError(f"`pp <= num_layers` must hold, but got (pp={pp}, "
                              f"num_layers={model.num_layers})")
        if ep > 1 and not model.is_moe:
            raise ConfigError(f"`ep > 1` needs a MoE model, but {model.name} is dense (ep={ep})")
        if ep > 1 and model.num_experts % ep:
            raise ConfigError(f"`ep` must divide num_experts of a MoE model, but got "
                              f"(ep={ep}, num_experts={model.num_experts})")
        if tp % ep:
            # Experts are sharded over the GPUs of one pipeline stage of a replica (its tp
            # GPUs; with dp_attention the attention runs data parallel over the same GPUs).
            raise ConfigError(f"`ep` must divide `tp` (a replica shards its experts over the "
                              f"tp GPUs of each pipeline stage; raise tp, with dp_attention "
                              f"for data-parallel attention), but got (tp={tp}, ep={ep})")
