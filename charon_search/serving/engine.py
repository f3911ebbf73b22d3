"""One serving engine replica: continuous batching (vLLM-style) or static batching.

The replica owns a waiting queue, the requests it runs and a paged KV pool. ``start_iteration``
composes a batch (decodes first, then running chunked prefills, then FCFS admissions within the
token budget ``max_num_batched_tokens`` and ``max_num_seqs``); ``finish_iteration`` applies its
effects. When the KV cache cannot hold a decode step or a running prefill's next chunk, the
most recently admitted running request (decoding or prefilling) is preempted by recompute, and
no waiting request is admitted in that step (vLLM v1 ``Scheduler.schedule``:
``self.running.pop()``, waiting requests only ``if not preempted_reqs``).
Engine policies (``ServingConfig``): ``prefill_schedule="prefill_first"`` runs a prefill-only
batch whenever a request can be admitted (SGLang without mixed chunk), ``max_prefill_tokens``
caps one batch's prompt tokens, ``decode_in_budget=False`` keeps decode tokens out of the budget
(SGLang), ``kv_admission="ratio"`` reserves KV for the running requests' expected output
(SGLang ``PrefillAdder``) and ``kv_admission="reserve_max"`` admits a request only when its
prompt + output KV fits beside the running requests' (TensorRT-LLM ``GUARANTEED_NO_EVICT``,
never preempts). Prefix caching (``kv_cache``) shares a prompt's full blocks from the step that
schedules them under vLLM (``KVCacheManager.allocate_slots`` caches them before the forward),
from the end of its prefill under SGLang and TensorRT-LLM.
The discrete-event loop around replicas is ``simulator.py``.

Decode bookkeeping is aggregate so an iteration costs O(1) in the number of decoding requests:
request *j* that joins the decode set at decode step ``join_j`` with ``stored_j`` KV tokens has
``stored_j + (t - join_j) * e`` tokens at step ``t`` (``e`` tokens committed per step, 1 without
speculation), so the batch's total context is ``A + n * t * e`` with ``A = sum(stored_j -
join_j * e)``, and completion steps sit in a heap. Preemptions (and, under ``ratio``, requests
with more than 4096 output tokens left) cost O(n) each.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from charon_search.serving.config import ServingConfig
from charon_search.serving.iteration_cost import IterationCostModel
from charon_search.serving.kv_cache import BlockPool, KvWindow
from charon_search.serving.workload import RequestSpec

__all__ = ["IterationRecord", "ReplicaEngine", "Request"]

_EPS = 1e-9
#: SGLang ``SchedulerRecvSkipper``: counter weight of a last batch that carried prompt tokens
#: (``SGLANG_SCHEDULER_RECV_SKIPPER_WEIGHT_DEFAULT`` = 1000, every mode but decode, target
#: verify and idle), so the scheduler polls right after such a batch.
SGLANG_RECV_PROMPT_WEIGHT = 1000
#: SGLang's admission estimate (``kv_admission="ratio"``): ``new_token_ratio`` starts at
#: ``default_init_new_token_ratio`` 0.7 x ``--schedule-conservativeness`` 1.0, decays by
#: (0.7 - 0.7 x 0.14) / 600 per decode step to its minimum 0.7 x 0.14
#: (``global_config.py``: ``default_min_new_token_ratio_factor`` 0.14,
#: ``default_new_token_ratio_decay_steps`` 600; ``Scheduler.update_running_batch``), returns to
#: its start when the scheduler idles (``Scheduler.self_check_during_idle``) and is set to
#: ``(decoded + 20 x n) / max_new`` over the n requests still running after a retraction
#: (``ScheduleBatch.retract_decode``, ``retract_decode_steps`` 20). A request's future output
#: is clipped at ``CLIP_MAX_NEW_TOKENS_ESTIMATION`` 4096 (``schedule_policy.py``).
SGLANG_INIT_NEW_TOKEN_RATIO = 0.7
SGLANG_MIN_NEW_TOKEN_RATIO = 0.7 * 0.14
SGLANG_NEW_TOKEN_RATIO_DECAY = (SGLANG_INIT_NEW_TOKEN_RATIO - SGLANG_MIN_NEW_TOKEN_RATIO) / 600
SGLANG_RETRACT_DECODE_STEPS = 20
SGLANG_CLIP_MAX_NEW_TOKENS = 4096
#: ``IGNORE_EOS_RESERVE_TOKENS`` (schedule_policy.py): tokens kept free per running request
#: by the admission of requests that ignore EOS.
SGLANG_IGNORE_EOS_RESERVE_TOKENS = 1


class ItlHistogram:
    """Inter-token latencies, weighted by tokens, in log bins of 0.2 % (memory flat in the
    number of iterations); the mean is exact, percentiles within 0.1 %."""

    __slots__ = ("bins", "total_s", "weight")
    _PER_E = 500.0

    def __init__(self) -> None:
        self.bins: dict[int, float] = {}
        self.total_s = 0.0
        self.weight = 0.0

    def add(self, itl_s: float, tokens: float) -> None:
        if itl_s <= 0 or tokens <= 0:
            return
        k = math.floor(math.log(itl_s) * self._PER_E)
        self.bins[k] = self.bins.get(k, 0.0) + tokens
        self.total_s += itl_s * tokens
        self.weight += tokens

    def merge(self, other: ItlHistogram) -> None:
        for k, w in other.bins.items():
            self.bins[k] = self.bins.get(k, 0.0) + w
        self.total_s += other.total_s
        self.weight += other.weight

    def stats(self) -> dict[str, float]:
        if not self.weight:
            return {k: math.nan for k in ("mean", "p50", "p90", "p99")}
        keys = sorted(self.bins)
        out = {"mean": self.total_s / self.weight}
        acc, i = 0.0, 0
        for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
            while i < len(keys) and acc + self.bins[keys[i]] < q * self.weight:
                acc += self.bins[keys[i]]
                i += 1
            k = keys[min(i, len(keys) - 1)]
            out[name] = math.exp((k + 0.5) / self._PER_E)
        return out


class Request:
    """Mutable per-request simulation state."""

    __slots__ = ("admit_seq", "arrived_s", "finish_s", "finish_step", "first_token_s", "gen0",
                 "generated_at_finish",
                 "hit_blocks", "hit_tokens", "join_step", "num_preemptions", "output_tokens",
                 "prefilled", "prefix_keys", "prompt_tokens", "spec", "stored0", "target",
                 "transfer_done", "window_full", "window_seq")

    def __init__(self, spec: RequestSpec, arrived_s: float) -> None:
        self.spec = spec
        self.arrived_s = arrived_s
        self.prompt_tokens = spec.prompt_tokens
        self.output_tokens = spec.output_tokens
        self.target = spec.prompt_tokens
        """Tokens the next prefill must have in KV (prompt, + generated after a preemption)."""
        self.prefilled = 0
        self.first_token_s = math.nan
        self.finish_s = math.nan
        self.gen0 = 0.0
        """Tokens generated when the request (re)joined the decode set."""
        self.join_step = 0
        self.finish_step = 0
        self.stored0 = 0
        self.hit_tokens = 0
        self.hit_blocks = 0
        self.prefix_keys: tuple = ()
        self.num_preemptions = 0
        self.generated_at_finish = 0.0
        self.transfer_done = False
        self.window_full = False
        """Decoding with at least a full window of tokens stored (``KvWindow``)."""
        self.window_seq = -1
        """The engine's window-heap entry of the current decode membership."""
        self.admit_seq = 0
        """When the request last entered the running set (admission order, for preemption)."""


@dataclass(frozen=True, slots=True)
class IterationRecord:
    """One executed iteration (kept only when a Chrome trace is requested)."""

    replica: str
    start_s: float
    duration_s: float
    prefill_tokens: int
    num_prefill: int
    num_decode: int
    cuda_graph: bool


class ReplicaEngine:
    """One replica (tp x pp x sp GPUs) of an aggregated, prefill or decode pool.

    Args:
        name: label in traces (``mixed0``, ``prefill1``...).
        role: ``mixed`` (prefill + decode), ``prefill`` (hands finished prefills to
            ``on_prefilled``) or ``decode`` (admits requests whose KV arrived).
        cost: the replica's iteration cost model.
        config: engine knobs.
        num_kv_blocks: KV capacity in blocks.
        overhead_s: per-iteration CPU/scheduler time.
        prefill_overhead_s: host time an iteration carrying prompt tokens adds on top
            (``ServingConfig.prefill_iteration_overhead_s``).
        launch_s: host seconds per operator of an iteration that replays no CUDA graph, which
            lasts at least ``cost.num_kernels`` x this (None: ``config.kernel_launch_overhead_s``;
            the simulator passes the cluster's calibrated ``eager_kernel_host_s`` when larger).
        adp_ranks: attention-DP ranks this replica stands for (0: no attention DP).
        kv_window: paging of a model with sliding-window layers (``kv_cache.KvWindow``): its
            windowed layers hold only the window's blocks of each request; None = every layer
            holds every token.
        tokens_per_step: tokens committed per decode step (speculation: expected accepted + 1).
        decode_q: tokens processed per decoding request and step (k + 1 when verifying).
        draft_s: extra seconds of an iteration's drafting given (prefill chunks as
            ``(tokens, context)``, num_decode, kv_sum): a draft model also runs the prompts.
    """

    def __init__(self, name: str, role: str, cost: IterationCostModel, config: ServingConfig,
                 *, num_kv_blocks: int, overhead_s: float, tokens_per_step: float = 1.0,
                 decode_q: int = 1,
                 draft_s: Callable[[Sequence[tuple[int, int]], int, float], float] | None = None,
                 on_prefilled: Callable[[Request, float], None] | None = None,
                 on_finished: Callable[[Request, float], None] | None = None,
                 record: bool = False, prefill_overhead_s: float = 0.0,
                 launch_s: float | None = None, adp_ranks: int = 0,
                 kv_window: KvWindow | None = None) -> None:
        self.name = name
        self.role = role
        self.cost = cost
        self.cfg = config
        self.pool = BlockPool(num_kv_blocks, config.block_size,
                              prefix_caching=config.prefix_caching and role != "decode",
                              window=kv_window)
        self.overhead_s = overhead_s
        self.prefill_overhead_s = prefill_overhead_s
        self.launch_s = config.kernel_launch_overhead_s if launch_s is None else launch_s
        self.adp_ranks = adp_ranks
        self.e = tokens_per_step
        self.q = decode_q
        self.draft_s = draft_s
        self.on_prefilled = on_prefilled
        self.on_finished = on_finished
        self.stream: Callable[[float, int], float] | None = None
        """``(iteration end, tokens it emitted) -> time its tokens reach their clients``: the
        serving front end's output queue (``simulator._StreamQueue.take``); None = at once."""
        # Disaggregated: the client's first token comes from the decode replica, once the KV
        # has arrived. SGLang's decode server streams the prefill's token when the request
        # joins (a "prebuilt" batch, scheduler_output_processor_mixin
        # process_batch_result_prebuilt); vLLM's (NixlConnector: the decode instance computes
        # the next token itself) and TensorRT-LLM's generation servers return it with the
        # first decode step they run for it.
        self.first_token_at_join = role == "decode" and config.engine == "sglang"
        self._first_pending: list[Request] = []
        self.static = config.scheduler == "static"
        self.graph_sizes = config.cuda_graph_sizes if config.cuda_graph else ()
        # vLLM keys its CUDA graphs by tokens (CudagraphDispatcher, BatchDescriptor.num_tokens)
        # and caches a prompt's full blocks when it schedules them (KVCacheManager
        # .allocate_slots -> cache_blocks); SGLang and TensorRT-LLM key graphs by requests and
        # insert a prompt into their prefix cache once its prefill has run.
        vllm_like = config.engine in ("", "vllm")
        self.graph_by_tokens = vllm_like
        self.cache_at_schedule = vllm_like
        self.ratio = config.kv_admission in ("ratio", "ignore_eos")
        self.ignore_eos = config.kv_admission == "ignore_eos"
        """SGLang's admission of requests that ignore EOS with its radix cache off
        (``PrefillAdder.add_one_req_ignore_eos``, ``_ignore_eos_fits``)."""
        self.new_token_ratio = SGLANG_INIT_NEW_TOKEN_RATIO
        """SGLang's ``new_token_ratio`` (``kv_admission="ratio"``)."""
        self._admit_seq = 0
        self.waiting: deque[Request] = deque()
        self.prefilling: list[Request] = []
        self.decoding: dict[int, Request] = {}
        self.dstep = 0
        self._a_sum = 0.0  # sum(stored0 - join_step * e) over the decode set
        # sum(output - gen0 + join_step * e) over the decode set (its remaining output is this
        # minus n * dstep * e), and how many of them had more than the clip left at joining.
        self._left_sum = 0.0
        self._n_long = 0
        self._hit_sum = 0  # shared (tree) blocks referenced by the decode set
        # Windowed layers (KvWindow): a decoding request keeps min(stored, window) tokens there.
        # Requests below a full window are summed like _a_sum; the others count a full window
        # each; a heap holds the step at which each reaches it.
        self._window_tokens = (kv_window.window_blocks * config.block_size
                               if kv_window is not None else 0)
        self._w_sum = 0.0  # sum(stored0 - join_step * e) over the requests below a full window
        self._w_below = 0
        self._w_full = 0
        self._w_heap: list[tuple[int, int, Request]] = []
        self._finish_heap: list[tuple[int, int, Request]] = []
        self._heap_seq = 0
        self.busy = False
        self.in_flight: tuple | None = None
        # statistics
        self.num_preemptions = 0
        self.num_iterations = 0
        self.busy_s = 0.0
        self.kv_used_page_s = 0.0
        self.itl = ItlHistogram()
        self.records: list[IterationRecord] | None = [] if record else None
        self._dec_charge = 0
        self._static_ctx = 0
        self._static_batch: list[Request] = []
        self._static_steps_left = 0
        self.reserve_max = config.kv_admission == "reserve_max"
        self._reserved: dict[int, int] = {}
        """``reserve_max``: blocks each admitted request may grow to (prompt + output)."""
        self._reserved_sum = 0
        self._batch_wait = 0
        """Iterations the waiting prompts have been held back (``batch_wait_iters``)."""
        self._adp_wait = 0
        """Scheduling steps since attention-DP balance last let prompts go
        (``adp_balance_timeout_iters``)."""
        self._prev_start_s = -math.inf
        self._last_end_s = -math.inf
        self._host_free_s = -math.inf
        """When the host finished launching the last iteration's kernels (its start for a graph
        replay, start + kernels x ``launch_s`` otherwise)."""
        self._cutoff_s = math.inf
        """Overlap scheduler: prompts that arrived at or after this instant are not in the batch
        being formed (it was formed when the previous, back-to-back iteration started; a prompt
        arriving at that instant answers a response sent then, so it comes after)."""
        self._recv_cut = math.inf
        """``scheduler_recv_interval``: prompts that arrived at or after this instant have not
        been received by the scheduler yet (its last poll)."""
        self._recv_count = 0
        self._polled_at = -math.inf
        self._last_had_prompts = False

    def host_kernels(self, tokens: int) -> int:
        """Kernels the host launches for an iteration of ``tokens`` that replays no full CUDA
        graph: a batch within the piecewise graphs' sizes (``piecewise_graph_tokens``) replays
        them and launches only its attention operators; any other launches every operator."""
        if tokens <= self.cfg.piecewise_graph_tokens:
            return self.cost.num_attention_kernels
        return self.cost.num_kernels

    # ------------------------------------------------------------------ queue state
    @property
    def num_running(self) -> int:
        return len(self.prefilling) + len(self.decoding)

    @property
    def load(self) -> int:
        return len(self.waiting) + self.num_running + len(self._static_batch)

    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or self.decoding or self._static_batch)

    def enqueue(self, req: Request) -> None:
        self.waiting.append(req)

    def _decode_kv_sum(self) -> float:
        """Tokens stored in KV by the decode set before the current step."""
        return self._a_sum + len(self.decoding) * self.dstep * self.e

    def _stored(self, r: Request) -> float:
        return r.stored0 + (self.dstep - r.join_step) * self.e

    def _decode_pages_exact(self, extra: int) -> int:
        pages = self.pool.private_pages
        return sum(pages(self._stored(r) + extra, r.hit_blocks) for r in self.decoding.values())

    def _decode_pages_upper(self, extra: int) -> int:
        """An upper bound on ``_decode_pages_exact(extra)`` in O(1) (amortized)."""
        n = len(self.decoding)
        return self.pool.decode_pages_upper(self._decode_kv_sum() + n * extra, n, self._hit_sum,
                                            window_tokens=self._window_sum(extra))

    def _window_sum(self, extra: int) -> float:
        """``sum(min(stored + extra, window))`` tokens over the decode set, at most (the
        requests still below a full window count ``stored + extra``)."""
        if not self._window_tokens:
            return 0.0
        heap = self._w_heap
        while heap and heap[0][0] <= self.dstep:
            _, seq, r = heapq.heappop(heap)
            if seq == r.window_seq and self.decoding.get(id(r)) is r and not r.window_full:
                self._w_sum -= r.stored0 - r.join_step * self.e
                self._w_below -= 1
                self._w_full += 1
                r.window_full = True
        below = self._w_sum + self._w_below * (self.dstep * self.e + extra)
        return below + self._w_full * self._window_tokens

    def _prefill_private(self, r: Request, tokens: int) -> int:
        return max(0, self.pool.private_pages(tokens, r.hit_blocks))

    # ------------------------------------------------------------------ membership changes
    def _join_decode(self, r: Request) -> None:
        r.join_step = self.dstep
        r.stored0 = r.target
        self.decoding[id(r)] = r
        self._a_sum += r.stored0 - r.join_step * self.e
        self._left_sum += r.output_tokens - r.gen0 + r.join_step * self.e
        self._n_long += r.output_tokens - r.gen0 > SGLANG_CLIP_MAX_NEW_TOKENS
        self._hit_sum += r.hit_blocks
        if self._window_tokens:
            room = self._window_tokens - r.stored0
            r.window_full = room <= 0
            if r.window_full:
                self._w_full += 1
            else:
                self._w_sum += r.stored0 - r.join_step * self.e
                self._w_below += 1
                self._heap_seq += 1
                r.window_seq = self._heap_seq
                heapq.heappush(self._w_heap, (r.join_step + math.ceil(room / self.e - _EPS),
                                              self._heap_seq, r))
        steps = max(1, math.ceil((r.output_tokens - r.gen0) / self.e - _EPS))
        self._heap_seq += 1
        r.finish_step = r.join_step + steps
        heapq.heappush(self._finish_heap, (r.finish_step, self._heap_seq, r))

    def _leave_decode(self, r: Request) -> float:
        """Remove from the decode set; returns tokens generated so far."""
        del self.decoding[id(r)]
        self._a_sum -= r.stored0 - r.join_step * self.e
        self._left_sum -= r.output_tokens - r.gen0 + r.join_step * self.e
        self._n_long -= r.output_tokens - r.gen0 > SGLANG_CLIP_MAX_NEW_TOKENS
        self._hit_sum -= r.hit_blocks
        if self._window_tokens:
            if r.window_full:
                self._w_full -= 1
            else:
                self._w_sum -= r.stored0 - r.join_step * self.e
                self._w_below -= 1
            r.window_full = False
        return min(float(r.output_tokens), r.gen0 + (self.dstep - r.join_step) * self.e)

    def _unreserve(self, r: Request) -> None:
        self._reserved_sum -= self._reserved.pop(id(r), 0)

    def _release_prefix(self, r: Request, now_s: float) -> None:
        if r.prefix_keys and self.pool.tree is not None and r.hit_blocks:
            self.pool.tree.release(r.prefix_keys[: r.hit_blocks], now_s)
        r.hit_blocks = 0

    def _admit(self, r: Request) -> None:
        """``r`` enters the running set (the tail of vLLM's ``running`` list)."""
        self._admit_seq += 1
        r.admit_seq = self._admit_seq

    def _newest_running(self) -> Request | None:
        """The most recently admitted running request: vLLM's ``self.running.pop()``, decoding
        or prefilling alike. Under ``ratio`` only decoding requests: SGLang retracts from its
        running (decode) batch, which its chunked request is not part of
        (``ScheduleBatch.retract_decode``; it picks the fewest output tokens, which FCFS
        admission makes the newest). O(decode set), paid per preemption only."""
        newest = self.prefilling[-1] if self.prefilling and not self.ratio else None
        for r in self.decoding.values():
            if newest is None or r.admit_seq > newest.admit_seq:
                newest = r
        return newest

    def _preempt(self, r: Request, now_s: float) -> None:
        """Preempt running request ``r`` by recompute: free its KV, requeue it first."""
        if self.decoding.get(id(r)) is r:
            generated = self._leave_decode(r)
            r.gen0 = math.floor(generated + _EPS)
            r.target = r.prompt_tokens + int(r.gen0)
        else:
            self.prefilling.remove(r)
            self.pool.owned_pages -= self._prefill_private(r, r.prefilled)
        self._release_prefix(r, now_s)
        self._unreserve(r)
        r.prefilled = 0
        r.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(r)

    def _decode_charge(self, q: int) -> int:
        """Pages the decode set holds after growing by ``q`` tokens each (the O(1) upper bound
        when it fits, else the exact count)."""
        upper = self._decode_pages_upper(q)
        return upper if upper <= self.pool.available() else self._decode_pages_exact(q)

    def _future_output_tokens(self) -> float:
        """SGLang's reservation for the decode set: ``min(remaining output, 4096)`` summed."""
        if self._n_long:
            clip = SGLANG_CLIP_MAX_NEW_TOKENS
            return sum(min(clip, max(0.0, r.output_tokens - r.gen0
                                     - (self.dstep - r.join_step) * self.e))
                       for r in self.decoding.values())
        return max(0.0, self._left_sum - len(self.decoding) * self.dstep * self.e)

    def _ratio_room(self) -> float:
        """SGLang ``PrefillAdder.rem_total_tokens`` before this step's admissions: free and
        evictable KV tokens minus ``new_token_ratio`` x the decode set's future output."""
        return (self.pool.available() * self.pool.block_size
                - self.new_token_ratio * self._future_output_tokens())

    def _ignore_eos_fits(self, r: Request, prompt: int, room: float, cur_room: float) -> bool:
        """SGLang ``PrefillAdder.add_one_req_ignore_eos`` (clients that ignore EOS, radix cache
        off): ``r``'s ``prompt`` tokens must fit both rooms, and, with every running request and
        ``r`` sorted by the output tokens they have left, the cache must never run out as they
        finish in that order: for the i-th of n, ``cur_room + freed - left_i x (n - i)`` must
        exceed ``IGNORE_EOS_RESERVE_TOKENS`` (1) x (n - i), ``freed`` the prompt + output
        tokens of those finished before it."""
        paged = self.pool.pages_for(prompt) * self.pool.block_size
        if paged > min(cur_room, room):
            return False
        if self._window_tokens:
            return True  # SGLang skips the rest for sliding-window (SWA) pools (``is_hybrid``)
        states = [(r.output_tokens - r.gen0, r.prompt_tokens + r.gen0)]
        for x in self.decoding.values():
            done = x.gen0 + (self.dstep - x.join_step) * self.e
            states.append((x.output_tokens - done, x.prompt_tokens + done))
        states += [(x.output_tokens - x.gen0, x.prompt_tokens + x.gen0) for x in self.prefilling]
        states = sorted(s for s in states if s[0] > 0)
        rem, freed, n = cur_room - paged, 0.0, len(states)
        for i, (left, occupied) in enumerate(states):
            if rem + freed - left * (n - i) <= SGLANG_IGNORE_EOS_RESERVE_TOKENS * (n - i):
                return False
            freed += occupied
        return True

    def _update_ratio(self, retracted: bool) -> None:
        """SGLang's ``new_token_ratio`` after a decode step (constants above)."""
        if not retracted:
            self.new_token_ratio = max(self.new_token_ratio - SGLANG_NEW_TOKEN_RATIO_DECAY,
                                       SGLANG_MIN_NEW_TOKEN_RATIO)
            return
        decoded = max_new = 0.0
        for r in self.decoding.values():
            decoded += r.gen0 + (self.dstep - r.join_step) * self.e
            max_new += r.output_tokens
        if max_new > 0:
            n = len(self.decoding)
            self.new_token_ratio = min(1.0, (decoded + SGLANG_RETRACT_DECODE_STEPS * n)
                                       / max_new)

    # ------------------------------------------------------------------ scheduling
    def _admissible(self, budget: int, q: int) -> bool:
        """A waiting request could start (or a partial prefill continue) a prefill batch now:
        a seat under ``max_num_seqs`` and free KV blocks for its next chunk."""
        if self.prefilling:
            return True
        if not self.waiting or self.num_running >= self.cfg.max_num_seqs:
            return False
        r = self.waiting[0]
        if r.prefilled >= r.target or (r.arrived_s >= self._cutoff_s and self.decoding):
            return False
        pool = self.pool
        held = self._decode_pages_upper(q)
        free = pool.available() - held
        return free >= pool.pages_for(min(r.target - r.prefilled, budget))

    def start_iteration(self, now_s: float, *, allow_prefill_only: bool = True) -> float:
        """Compose and cost the next batch; returns its duration (0 = nothing to run)."""
        if self.static:
            return self._start_static(now_s)
        cfg = self.cfg
        pool = self.pool
        budget = cfg.max_num_batched_tokens
        q = self.q
        if self.ratio and self._last_end_s != now_s and not self.num_running:
            # SGLang resets its estimate whenever the scheduler found nothing to run.
            self.new_token_ratio = SGLANG_INIT_NEW_TOKEN_RATIO
        # Overlap scheduler: back to back, this batch was formed when the previous one started.
        self._cutoff_s = (self._prev_start_s if cfg.overlap_scheduler
                          and self._last_end_s == now_s else math.inf)
        if cfg.scheduler_recv_interval > 1:
            self._cutoff_s = min(self._cutoff_s, self._poll(now_s))
        # 0. Requests whose KV arrived from a prefill pool join the decode set.
        while (self.waiting and self.waiting[0].prefilled >= self.waiting[0].target
               and self.num_running < cfg.max_num_seqs):
            r = self.waiting[0]
            if self._decode_pages_upper(q) + pool.pages_for(r.target + q) > pool.available():
                break
            self.waiting.popleft()
            self._admit(r)
            self._join_decode(r)
            if math.isnan(r.first_token_s):
                if self.first_token_at_join:
                    r.first_token_s = now_s
                else:
                    self._first_pending.append(r)
        # prefill_first (SGLang): a batch of prefills runs alone whenever one can start; the
        # decode set keeps its KV but does not step (grow by 0 tokens) in that iteration.
        prefill_only = (allow_prefill_only and cfg.prefill_schedule == "prefill_first"
                        and self.role != "decode" and self._admissible(budget, 0))
        if prefill_only:
            q = 0
        # 1. Decodes must be able to grow by q tokens; otherwise preempt the newest running
        # request (vLLM: the tail of ``running``, whichever phase it is in).
        preempted = False
        charge = 0
        while self.decoding:
            charge = self._decode_charge(q)
            if charge <= pool.available():
                break
            victim = self._newest_running()
            assert victim is not None
            self._preempt(victim, now_s)
            preempted = True
            charge = 0
        pool.owned_pages += charge
        self._dec_charge = charge
        pool.evict_overflow()
        n_dec = 0 if prefill_only else len(self.decoding)
        if self.ratio and n_dec:
            self._update_ratio(retracted=preempted)
        if cfg.decode_in_budget:
            budget -= n_dec * q
        prefill_cap = cfg.max_prefill_tokens or budget
        # SGLang's PrefillAdder: KV room left after the decode set's expected output.
        room = self._ratio_room() if self.ratio else math.inf
        # ... and its ``cur_rem_tokens``: free and evictable KV tokens, less this step's prompts.
        cur_room = float(pool.available() * pool.block_size)
        taken = 0
        chunks: list[tuple[Request, int]] = []
        # 2. Running (partially prefilled) requests, in admission order.
        i = 0
        while i < len(self.prefilling) and budget > 0:
            r = self.prefilling[i]
            take = min(r.target - r.prefilled, budget)
            if self.ratio:
                # SGLang ``add_chunked_req``: the chunk is cut to the room left, and waits
                # when there is none (its request is not retracted for it).
                take = min(take, math.floor(room))
                if take <= 0:
                    break
            extra = self._prefill_private(r, r.prefilled + take) - self._prefill_private(
                r, r.prefilled)
            fits = pool.reserve(extra)
            while not fits and not self.ratio:
                # vLLM: preempt the tail of ``running`` until the chunk fits, the request
                # itself last (``if preempted_req == request: break``).
                victim = self._newest_running()
                assert victim is not None
                decoding = self.decoding.get(id(victim)) is victim
                self._preempt(victim, now_s)
                preempted = True
                if victim is r:
                    break
                if decoding:  # it was charged for this step in 1.: charge the others again
                    pool.owned_pages -= charge
                    charge = self._decode_charge(q) if self.decoding else 0
                    pool.owned_pages += charge
                    self._dec_charge = charge
                    n_dec = 0 if prefill_only else len(self.decoding)
                    if cfg.decode_in_budget:
                        budget += q
                fits = pool.reserve(extra)
            if not fits:
                break  # preempted itself, or (``ratio``) no KV for its chunk: it waits
            pool.owned_pages += extra
            if self.cache_at_schedule:
                pool.owned_pages -= self._insert_prefix(r, now_s, r.prefilled + take)
            chunks.append((r, take))
            budget -= take
            taken += take
            if self.ratio:
                left = r.output_tokens - int(r.gen0)
                cur_room -= take
                room -= take + (min(left, SGLANG_CLIP_MAX_NEW_TOKENS)
                                if r.prefilled + take >= r.target else 0)
            i += 1
        hold = cfg.batch_wait_iters > 0 and n_dec > 0 and self._hold_prompts(budget, n_dec)
        if not hold and cfg.adp_balance_timeout_iters and self.adp_ranks > 1:
            hold = self._hold_for_balance(budget, n_dec)
        # 3. FCFS admissions, none in a step that preempted (vLLM schedules the waiting queue
        # only ``if not preempted_reqs``; SGLang retracts after it found no prefill to run).
        while (not hold and not preempted and self.waiting and budget > 0
               and taken < prefill_cap and self.num_running < cfg.max_num_seqs):
            r = self.waiting[0]
            if r.prefilled >= r.target:
                break  # KV-arrived request that did not fit in step 0
            if r.arrived_s >= self._cutoff_s and (chunks or n_dec):
                break  # arrived after this batch was formed (an empty batch would see it)
            if r.prefilled == 0 and r.hit_blocks == 0:
                self._match_prefix(r, now_s)
            remaining = r.target - r.prefilled
            if not cfg.chunked_prefill and remaining > budget and (chunks or n_dec):
                break
            if self.reserve_max:
                need = pool.pages_for(r.target + r.output_tokens - int(r.gen0))
                if self._reserved and self._reserved_sum + need > pool.num_pages:
                    break  # GUARANTEED_NO_EVICT: wait until a running request frees its share
            future = 0
            if self.ratio:
                # PrefillAdder.add_one_req: the whole remaining prompt plus its clipped output
                # must fit (``total_tokens >= rem_total_tokens`` -> NO_TOKEN).
                future = min(r.output_tokens - int(r.gen0), SGLANG_CLIP_MAX_NEW_TOKENS)
                if (not self._ignore_eos_fits(r, remaining, room, cur_room) if self.ignore_eos
                        else remaining + future >= room):
                    self._unmatch(r, now_s)
                    break
            take = remaining if not cfg.chunked_prefill else min(remaining, budget)
            extra = self._prefill_private(r, r.prefilled + take) - self._prefill_private(
                r, r.prefilled)
            if not pool.reserve(extra):
                self._unmatch(r, now_s)
                break
            pool.owned_pages += extra
            self.waiting.popleft()
            self._admit(r)
            self.prefilling.append(r)
            if self.cache_at_schedule:
                pool.owned_pages -= self._insert_prefix(r, now_s, r.prefilled + take)
            if self.reserve_max:
                self._reserved[id(r)] = need
                self._reserved_sum += need
            # A chunked (truncated) admission reserves only its chunk (``_update_prefill_budget``
            # with max_new_tokens 0); the rest is checked when its last chunk is scheduled.
            room -= take + (future if take == remaining else 0)
            cur_room -= take
            chunks.append((r, take))
            budget -= take
            taken += take
        if prefill_only and not chunks:
            # Nothing could be admitted after all: undo the decode charge and run the decodes.
            pool.owned_pages -= charge
            self._dec_charge = 0
            return self.start_iteration(now_s, allow_prefill_only=False)
        if not chunks and not self.decoding:
            if preempted and self.waiting:
                # Everything running was preempted: the next step admits from the queue.
                return self.start_iteration(now_s)
            return 0.0
        # 4. Cost: decode-only batches replay a CUDA graph of the next captured size (vLLM:
        # of n_dec x q tokens; SGLang, TensorRT-LLM: of n_dec requests), or of exactly their
        # size without padding (``cuda_graph_padding``).
        shape = [(take, r.prefilled + take) for r, take in chunks]
        kv_sum = self._decode_kv_sum() + n_dec * q if n_dec else 0.0
        padded = 0
        captured = False
        if not chunks and self.graph_sizes:
            need = n_dec * q if self.graph_by_tokens else n_dec
            i = bisect_left(self.graph_sizes, need)
            if i < len(self.graph_sizes) and (cfg.cuda_graph_padding
                                              or self.graph_sizes[i] == need):
                size = self.graph_sizes[i]
                # The cost model pads whole requests: a token size that q does not divide is
                # rounded up to the next whole request (< q tokens more).
                padded = -(-size // q) if self.graph_by_tokens else size
                captured = True
        gpu_s = self.cost.iteration_s(shape, n_dec, kv_sum, q, padded_decode=padded)
        if self.draft_s is not None:
            gpu_s += self.draft_s(shape, n_dec, kv_sum)
        # The host launches each kernel of an iteration that replays no graph. Behind an overlap
        # scheduler it starts on batch n + 1 as soon as it has launched batch n (at once for a
        # graph replay), so the GPU time of a back-to-back predecessor hides part of it.
        launch_from = (self._host_free_s if self.cfg.overlap_scheduler
                       and self._last_end_s == now_s else now_s)
        if captured:
            self._host_free_s = now_s
        else:
            self._host_free_s = launch_from + self.host_kernels(taken + n_dec * q) * self.launch_s
            gpu_s = max(gpu_s, self._host_free_s - now_s)
        duration = gpu_s + self.overhead_s + (self.prefill_overhead_s if chunks else 0.0)
        self._prev_start_s = now_s
        self._last_had_prompts = bool(chunks)
        self.in_flight = (chunks, n_dec)
        self.busy = True
        self.num_iterations += 1
        self.busy_s += duration
        self.kv_used_page_s += pool.used_pages * duration
        if n_dec:
            self.itl.add(duration / self.e, n_dec * self.e)
        if self.records is not None:
            self.records.append(IterationRecord(self.name, now_s, duration,
                                                sum(t for _, t in chunks), len(chunks), n_dec,
                                                captured))
        return duration

    def _poll(self, now_s: float) -> float:
        """SGLang's receive skipper (``SchedulerRecvSkipper.handle``): before forming a batch
        the scheduler adds the weight of the last batch's mode to a counter (a decode-only
        batch 1, one with prompt tokens 1000) and receives new requests once the counter reaches
        ``scheduler_recv_interval``. An idle scheduler polls continuously, so a batch that does
        not follow another back to back sees every arrival. Returns the instant before which
        arrivals have been received."""
        if now_s == self._polled_at:  # the same batch, composed again
            return self._recv_cut
        self._polled_at = now_s
        formed_s = self._cutoff_s if math.isfinite(self._cutoff_s) else math.nextafter(
            now_s, math.inf)
        if self._last_end_s != now_s:
            self._recv_count = 0
            self._recv_cut = formed_s
            return self._recv_cut
        self._recv_count += SGLANG_RECV_PROMPT_WEIGHT if self._last_had_prompts else 1
        if self._recv_count >= self.cfg.scheduler_recv_interval:
            self._recv_count = 0
            self._recv_cut = formed_s
        return self._recv_cut

    def _startable_prompts(self, budget: int) -> tuple[int, int]:
        """``(prompts, tokens)`` the FCFS admission would start within ``budget`` and the free
        sequence slots (KV not checked)."""
        room = self.cfg.max_num_seqs - self.num_running
        ctx = k = 0
        for r in self.waiting:
            rem = r.target - r.prefilled
            if k >= room or rem <= 0 or ctx + rem > budget:
                break
            ctx += rem
            k += 1
        return k, ctx

    def _hold_for_balance(self, budget: int, n_dec: int) -> bool:
        """TensorRT-LLM attention-DP balancing (``PyExecutor._balance_adp_requests`` with
        ``batching_wait_iters`` 0), checked at every scheduling step: when every rank has a
        prompt to start (and a free slot) they go and the count restarts; otherwise the count
        grows, and prompts go only when it reaches ``adp_balance_timeout_iters`` or some rank has
        no decoding request. The count grows on steps without any prompt too, so the timeout
        opens a window every that many iterations rather than timing each prompt."""
        cfg = self.cfg
        ranks = self.adp_ranks
        k, _ = self._startable_prompts(budget)
        if k >= ranks and n_dec < cfg.max_num_seqs:
            self._adp_wait = 0
            return False
        self._adp_wait += 1
        if self._adp_wait >= cfg.adp_balance_timeout_iters or n_dec < ranks:
            self._adp_wait = 0
            return False
        return k > 0

    def _hold_prompts(self, budget: int, n_dec: int) -> bool:
        """TensorRT-LLM batch waiting (``PyExecutor._waiting_requests``): while generation
        requests run, the prompts the scheduler would start are held back until their tokens
        plus the decode tokens reach ``batch_wait_tokens`` or ``batch_wait_iters`` iterations
        have passed; the count restarts when they are let in."""
        cfg = self.cfg
        k, ctx = self._startable_prompts(budget)
        if not k:
            return False
        if self._batch_wait < cfg.batch_wait_iters and ctx + n_dec < cfg.batch_wait_tokens:
            self._batch_wait += 1
            return True
        self._batch_wait = 0
        return False

    def _prefix_block_keys(self, prefix_id: int, tokens: int) -> tuple:
        """Radix-tree keys of the full KV blocks of ``tokens`` tokens of prefix ``prefix_id``."""
        return tuple((prefix_id, i) for i in range(tokens // self.pool.block_size))

    def _match_prefix(self, r: Request, now_s: float) -> None:
        tree = self.pool.tree
        spec = r.spec
        if tree is None or spec.prefix_id < 0 or spec.prefix_tokens < self.pool.block_size:
            return
        if not r.prefix_keys:
            r.prefix_keys = self._prefix_block_keys(spec.prefix_id, spec.prefix_tokens)
        hit = tree.match(r.prefix_keys)
        # Keep at least one token to compute (vLLM recomputes the last token of a full hit).
        hit = min(hit, (r.target - 1) // self.pool.block_size)
        if hit:
            tree.acquire(r.prefix_keys[:hit], now_s)
            r.hit_blocks = hit
            if not r.num_preemptions:
                # Counted at the first admission only: a recompute after a preemption re-hits
                # the request's own blocks, and the hit rate is per prompt token.
                r.hit_tokens += hit * self.pool.block_size
            r.prefilled = hit * self.pool.block_size

    def finish_iteration(self, now_s: float) -> None:
        """Apply the effects of the batch started last (prefill progress, tokens, finishes)."""
        self.busy = False
        self._last_end_s = now_s
        if self.static:
            self._finish_static(now_s)
            return
        assert self.in_flight is not None
        chunks, n_dec = self.in_flight
        self.in_flight = None
        done: list[Request] = []
        for r, take in chunks:
            r.prefilled += take
            if r.prefilled >= r.target:
                done.append(r)
        # Client-visible time of this iteration's tokens: one per decoding request and one per
        # finished prompt, through the front end's output queue.
        seen_s = now_s if self.stream is None else self.stream(now_s, n_dec + len(done))
        if n_dec:
            self.dstep += 1
            for r in self._first_pending:
                if self.decoding.get(id(r)) is r:  # not preempted since it joined
                    r.first_token_s = seen_s
            self._first_pending.clear()
            heap = self._finish_heap
            while heap and heap[0][0] <= self.dstep:
                step, _, r = heapq.heappop(heap)
                if self.decoding.get(id(r)) is not r or step != r.finish_step:
                    continue  # stale entry of a preempted request
                self._leave_decode(r)
                self._complete(r, now_s, seen_s)
        for r in done:
            self.prefilling.remove(r)
            self.pool.owned_pages -= self._prefill_private(r, r.prefilled)
            self._insert_prefix(r, now_s)
            r.gen0 += 1
            handed_off = (r.gen0 < r.output_tokens and self.role == "prefill"
                          and self.on_prefilled is not None)
            if math.isnan(r.first_token_s) and not handed_off:
                r.first_token_s = seen_s
            if r.gen0 >= r.output_tokens:
                self._complete(r, now_s, seen_s)
            elif handed_off:
                self._release_prefix(r, now_s)
                self._unreserve(r)
                self.on_prefilled(r, now_s)
            else:
                self._join_decode(r)
        # Decode blocks are re-charged at the next start; drop this step's charge now so a
        # finished request's blocks are free for admissions.
        self.pool.owned_pages -= self._dec_charge
        self._dec_charge = 0

    def _insert_prefix(self, r: Request, now_s: float, tokens: int | None = None) -> int:
        """Move the full prefix blocks of ``r``'s first ``tokens`` prompt tokens (None: those
        prefilled) from its private pages into the shared tree; returns the private pages
        this frees when ``r`` stores ``tokens`` tokens."""
        tree = self.pool.tree
        if tree is None or not r.prefix_keys:
            return 0
        tokens = r.prefilled if tokens is None else tokens
        full = min(len(r.prefix_keys), tokens // self.pool.block_size)
        if full <= r.hit_blocks:
            return 0
        private = self._prefill_private(r, tokens)
        if r.hit_blocks:
            tree.release(r.prefix_keys[: r.hit_blocks], now_s)
        tree.acquire(r.prefix_keys[:full], now_s)
        r.hit_blocks = full
        return private - self._prefill_private(r, tokens)

    def _unmatch(self, r: Request, now_s: float) -> None:
        """Undo ``_match_prefix`` for a request that was not admitted after all."""
        if not r.num_preemptions:
            r.hit_tokens -= r.hit_blocks * self.pool.block_size
        self._release_prefix(r, now_s)
        r.prefilled = 0

    def warm_prefix(self, prefix_id: int, tokens: int, now_s: float) -> bool:
        """Leave the full blocks of ``tokens`` prompt tokens of prefix ``prefix_id`` cached and
        unpinned, as a finished request that computed them does (a warm-up run before the
        simulated one). Older cached blocks are evicted LRU-first when the pool is full.
        Returns False (nothing cached) without prefix caching or room."""
        tree = self.pool.tree
        keys = self._prefix_block_keys(prefix_id, tokens)
        if tree is None or not keys:
            return False
        missing = len(keys) - tree.match(keys)
        if missing and not self.pool.reserve(missing):
            return False
        tree.acquire(keys, now_s)
        tree.release(keys, now_s)
        return True

    def _complete(self, r: Request, now_s: float, seen_s: float) -> None:
        """Free ``r``'s engine state at ``now_s``; its client gets the last token at
        ``seen_s``, when a closed loop's next request starts."""
        self._release_prefix(r, now_s)
        self._unreserve(r)
        r.finish_s = seen_s
        r.generated_at_finish = r.output_tokens
        if self.on_finished is not None:
            self.on_finished(r, seen_s)

    # ------------------------------------------------------------------ static batching
    def _start_static(self, now_s: float) -> float:
        """Batch-at-a-time baseline: prefill a batch together, decode it to the longest output.

        Requests of a batch complete together when the batch does (no continuous batching);
        KV for prompt + output is reserved up front.
        """
        cfg = self.cfg
        if not self._static_batch:
            batch: list[Request] = []
            blocks = 0
            while self.waiting and len(batch) < cfg.max_num_seqs:
                r = self.waiting[0]
                need = self.pool.pages_for(r.prompt_tokens + r.output_tokens)
                if blocks + need > self.pool.num_pages:
                    break  # a first request larger than the cache never starts: infeasible
                blocks += need
                batch.append(self.waiting.popleft())
            if not batch:
                return 0.0
            self._static_batch = batch
            self.pool.owned_pages = blocks
            longest = max(r.prompt_tokens for r in batch)
            self._static_steps_left = max(r.output_tokens for r in batch) - 1
            self._static_ctx = longest
            shape = [(longest, longest)] * len(batch)
            gpu_s = self.cost.iteration_s(shape, 0, 0.0)
            phase = "prefill"
        else:
            n = len(self._static_batch)
            self._static_ctx += 1
            gpu_s = self.cost.iteration_s((), n, n * self._static_ctx, 1)
            phase = "decode"
        gpu_s = max(gpu_s, self.cost.num_kernels * self.launch_s)
        duration = gpu_s + self.overhead_s + (self.prefill_overhead_s if phase == "prefill"
                                              else 0.0)
        self.in_flight = (phase,)
        self.busy = True
        self.num_iterations += 1
        self.busy_s += duration
        self.kv_used_page_s += self.pool.used_pages * duration
        if phase == "decode":
            self.itl.add(duration, float(len(self._static_batch)))
        return duration

    def _finish_static(self, now_s: float) -> None:
        assert self.in_flight is not None
        phase = self.in_flight[0]
        self.in_flight = None
        seen_s = now_s if self.stream is None else self.stream(now_s, len(self._static_batch))
        if phase == "prefill":
            for r in self._static_batch:
                r.first_token_s = seen_s
        else:
            self._static_steps_left -= 1
        if self._static_steps_left <= 0:
            for r in self._static_batch:
                self._complete(r, now_s, seen_s)
            self._static_batch = []
            self.pool.owned_pages = 0

