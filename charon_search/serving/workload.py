"""Request workloads: arrival processes, length distributions, trace files, closed-loop mode.

All randomness comes from the ``numpy.random.Generator`` passed in (or built from ``seed``);
nothing here seeds a global RNG. A workload yields ``RequestSpec`` rows; the closed-loop
``concurrency`` mode leaves ``arrived_at_s`` to the simulator (a new request enters as soon as
one finishes).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from charon_search.config_fields import MAX_SEED, typed_kwargs
from charon_search.errors import ConfigError

__all__ = [
    "ARRIVALS",
    "LENGTH_KINDS",
    "LengthDistribution",
    "RequestSpec",
    "WorkloadSpec",
    "read_trace",
    "requests_from_rows",
]

ARRIVALS = ("poisson", "gamma", "concurrency", "trace", "burst")
LENGTH_KINDS = ("fixed", "uniform", "lognormal", "empirical")
TRACE_COLUMNS = ("arrived_at", "prompt_tokens", "output_tokens")


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestSpec:
    """One request of a workload (immutable input to the simulator)."""

    request_id: int
    arrived_at_s: float
    """Arrival time; NaN in closed-loop mode (set when a slot frees)."""
    prompt_tokens: int
    output_tokens: int
    prefix_id: int = -1
    """Requests with the same id share their first ``prefix_tokens`` prompt tokens; -1 = none."""
    prefix_tokens: int = 0
    think_time_s: float = 0.0
    """Closed loop: the client's pause between its previous request finishing and this one."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LengthDistribution:
    """A token-length distribution (prompt or output)."""

    kind: str = "fixed"
    """``fixed`` (value), ``uniform`` (low..high inclusive), ``lognormal`` (mean, sigma of the
    underlying normal chosen so the mean is ``mean``), ``empirical`` (resample ``values``)."""
    value: int = 128
    low: int = 1
    high: int = 128
    mean: float = 128.0
    sigma: float = 0.5
    values: tuple[int, ...] = ()
    minimum: int = 1
    maximum: int = 1 << 24
    """Bounds of every sampled length (a lognormal tail is clipped to them); a ``fixed``,
    ``uniform`` or ``empirical`` length outside them is an error, not clipped. The default,
    16,777,216 tokens, is above every shipped model's context (Llama 4 Scout: 10,485,760)."""

    def __post_init__(self) -> None:
        if self.kind not in LENGTH_KINDS:
            raise ConfigError(f"`length.kind` must be one of {list(LENGTH_KINDS)}, "
                              f"but got {self.kind!r}")
        if self.kind == "fixed" and self.value < 1:
            raise ConfigError(f"`length.value >= 1` must hold, but got {self.value}")
        if self.kind == "uniform" and not 1 <= self.low <= self.high:
            raise ConfigError(f"`1 <= low <= high` must hold, but got (low={self.low}, "
                              f"high={self.high})")
        if self.kind == "lognormal" and not (0 < self.mean < math.inf
                                             and 0 <= self.sigma < math.inf):
            raise ConfigError(f"lognormal needs finite mean > 0, sigma >= 0, got ({self.mean=}, "
                              f"{self.sigma=})")
        if self.kind == "empirical" and not self.values:
            raise ConfigError("empirical length distribution needs non-empty `values`")
        if not 1 <= self.minimum <= self.maximum:
            raise ConfigError(f"`1 <= length.minimum <= length.maximum` must hold, but got "
                              f"(minimum={self.minimum}, maximum={self.maximum})")
        given = {"fixed": {"value": (self.value,)},
                 "uniform": {"low": (self.low,), "high": (self.high,)},
                 "empirical": {"values": self.values}}.get(self.kind, {})
        for name, lengths in given.items():
            outside = [v for v in lengths if not self.minimum <= v <= self.maximum]
            if outside:
                raise ConfigError(
                    f"`length.{name}` must lie in [minimum, maximum] = [{self.minimum:,}, "
                    f"{self.maximum:,}], but got {outside[0]:,}; raise `length.maximum` "
                    f"(or lower `length.minimum`) to serve it")

    @property
    def longest(self) -> int | None:
        """The longest length ``sample`` draws (within [minimum, maximum] by construction);
        None for ``lognormal``, whose tail only ``maximum`` bounds."""
        if self.kind == "lognormal":
            return None
        top = (self.value if self.kind == "fixed" else self.high if self.kind == "uniform"
               else max(self.values))
        return min(top, self.maximum)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        if self.kind == "fixed":
            out = np.full(n, self.value, dtype=np.int64)
        elif self.kind == "uniform":
            out = rng.integers(self.low, self.high + 1, size=n)
        elif self.kind == "lognormal":
            mu = np.log(self.mean) - 0.5 * self.sigma**2
            out = np.rint(rng.lognormal(mu, self.sigma, size=n)).astype(np.int64)
        else:
            out = rng.choice(np.asarray(self.values, dtype=np.int64), size=n, replace=True)
        return np.clip(out, self.minimum, self.maximum).astype(np.int64)

    @classmethod
    def coerce(cls, value: int | Mapping[str, Any] | LengthDistribution, *,
               where: str = "length") -> LengthDistribution:
        """A distribution from a length (``fixed``) or a mapping of its fields; errors name
        ``where`` (e.g. ``workload.input_len``)."""
        if isinstance(value, LengthDistribution):
            return value
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            kw: dict[str, Any] = {"kind": "fixed", "value": int(value)}
        elif isinstance(value, Mapping):
            kw = typed_kwargs(cls, value, where)
            if "values" in kw:
                kw["values"] = tuple(kw["values"])
        else:
            raise ConfigError(f"{where}: must be a token count or a mapping of "
                              f"LengthDistribution fields, but got {value!r}")
        try:
            return cls(**kw)
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadSpec:
    """What requests arrive and when.

    Example:
        >>> w = WorkloadSpec(arrival="poisson", rate_per_s=2.0, num_requests=3,
        ...                  input_len=LengthDistribution(value=100))
        >>> [r.prompt_tokens for r in w.generate()]
        [100, 100, 100]
    """

    arrival: str = "poisson"
    """``poisson``, ``gamma`` (bursty, coefficient of variation ``cv``), ``concurrency``
    (closed loop: ``concurrency`` requests in flight), ``trace`` (``trace_path``), ``burst``
    (all at t = 0)."""
    rate_per_s: float = 1.0
    """Mean arrival rate (poisson, gamma)."""
    cv: float = 1.0
    """Coefficient of variation of inter-arrival gaps (gamma; 1.0 = Poisson)."""
    concurrency: int = 1
    think_time_s: float = 0.0
    """Closed loop: mean of an exponential client pause before issuing the next request."""
    ramp_up_s: float | None = None
    """Closed loop: the first ``concurrency`` requests start spread evenly over this time;
    None = over one expected request lifetime (steady-state phasing of a closed loop, see
    ``ServingSimulation.run``); 0 = all at once (synchronized waves)."""
    num_requests: int = 100
    input_len: LengthDistribution = LengthDistribution(value=1024)
    output_len: LengthDistribution = LengthDistribution(value=128)
    trace_path: str = ""
    time_scale: float = 1.0
    """Trace arrival times are multiplied by this (speed a trace up or down)."""
    shared_prefix_tokens: int = 0
    """Synthetic prefix sharing: the first this-many prompt tokens are shared..."""
    num_prefixes: int = 1
    """...among this many distinct prefixes (request i uses prefix
    ``(i + prefix_offset) mod num_prefixes``). A benchmark client that draws its prompts from a
    fixed pool is ``shared_prefix_tokens`` = the prompt length and ``num_prefixes`` = the pool
    size: a repeated prompt is a whole-prompt prefix hit on an engine with prefix caching."""
    prefix_offset: int = 0
    """Pool index of the first request's prefix (requests drawn before it, e.g. a warm-up that
    is not simulated, used the indices below it)."""
    cached_prefixes: int = 0
    """The prefixes of this many requests drawn just before the first one (indices
    ``prefix_offset - cached_prefixes .. prefix_offset - 1`` mod ``num_prefixes``, oldest
    first) are in every prefix cache at t = 0, as a finished warm-up leaves them
    (``warm_prefixes``); 0 = the caches start empty."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.arrival not in ARRIVALS:
            raise ConfigError(f"`workload.arrival` must be one of {list(ARRIVALS)}, "
                              f"but got {self.arrival!r}")
        if self.arrival in ("poisson", "gamma") and not 0 < self.rate_per_s < math.inf:
            raise ConfigError(f"`workload.rate_per_s` must be > 0 requests/s and finite, but got "
                              f"{self.rate_per_s}")
        if self.arrival == "gamma" and not 0 < self.cv < math.inf:
            raise ConfigError(f"`workload.cv` must be > 0 and finite, but got {self.cv}")
        if self.concurrency < 1:
            raise ConfigError(f"`workload.concurrency` must be >= 1, but got {self.concurrency}")
        if self.num_requests < 1 and self.arrival != "trace":
            raise ConfigError(f"`workload.num_requests` must be >= 1, but got "
                              f"{self.num_requests}")
        if self.arrival == "trace" and not self.trace_path:
            raise ConfigError("workload arrival 'trace' needs `trace_path`")
        for name in ("think_time_s", "ramp_up_s"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ConfigError(f"`workload.{name}` must be >= 0 seconds, but got {value}")
        if self.closed_loop and self.num_requests < self.concurrency:
            raise ConfigError(
                f"`workload.concurrency` ({self.concurrency}) must be <= `workload.num_requests` "
                f"({self.num_requests}): a closed loop of {self.concurrency} streams never "
                f"holds more requests in flight than it has")
        if not self.time_scale > 0:
            raise ConfigError(f"`workload.time_scale > 0` must hold, but got {self.time_scale}")
        if not 0 <= self.seed <= MAX_SEED:
            raise ConfigError(f"`workload.seed` must be an integer in [0, 2**32 - 1], but got "
                              f"{self.seed}")
        if self.shared_prefix_tokens < 0 or self.num_prefixes < 1:
            raise ConfigError("`shared_prefix_tokens >= 0` and `num_prefixes >= 1` must hold")
        if self.prefix_offset < 0 or not 0 <= self.cached_prefixes <= self.num_prefixes:
            raise ConfigError(f"`prefix_offset >= 0` and `0 <= cached_prefixes <= num_prefixes` "
                              f"must hold, but got ({self.prefix_offset=}, "
                              f"{self.cached_prefixes=}, {self.num_prefixes=})")

    @property
    def closed_loop(self) -> bool:
        return self.arrival == "concurrency"

    def generate(self, rng: np.random.Generator | None = None) -> list[RequestSpec]:
        """The requests, in arrival order (closed loop: in issue order, times NaN)."""
        rng = np.random.default_rng(self.seed) if rng is None else rng
        if self.arrival == "trace":
            reqs = read_trace(self.trace_path, time_scale=self.time_scale)
            if self.num_requests and self.num_requests < len(reqs):
                reqs = reqs[: self.num_requests]
            return reqs
        n = self.num_requests
        if self.arrival == "poisson":
            gaps = rng.exponential(1.0 / self.rate_per_s, size=n)
        elif self.arrival == "gamma":
            shape = 1.0 / self.cv**2
            gaps = rng.gamma(shape, 1.0 / (shape * self.rate_per_s), size=n)
        else:
            gaps = np.zeros(n)
        arrivals = np.cumsum(gaps) - gaps[0] if self.arrival in ("poisson", "gamma") else gaps
        if self.closed_loop:
            arrivals = np.full(n, np.nan)
        prompts = self.input_len.sample(n, rng)
        outputs = self.output_len.sample(n, rng)
        think = (rng.exponential(self.think_time_s, size=n) if self.closed_loop
                 and self.think_time_s > 0 else np.zeros(n))
        out = []
        for i in range(n):
            pid, ptok = -1, 0
            if self.shared_prefix_tokens:
                pid = (i + self.prefix_offset) % self.num_prefixes
                ptok = min(self.shared_prefix_tokens, int(prompts[i]))
            out.append(RequestSpec(request_id=i, arrived_at_s=float(arrivals[i]),
                                   prompt_tokens=int(prompts[i]), output_tokens=int(outputs[i]),
                                   prefix_id=pid, prefix_tokens=ptok,
                                   think_time_s=float(think[i])))
        return out

    def warm_prefixes(self) -> list[tuple[int, int]]:
        """``(prefix_id, tokens)`` of the prefixes cached at t = 0 (``cached_prefixes``), oldest
        first; empty without shared prefixes."""
        if not (self.shared_prefix_tokens and self.cached_prefixes):
            return []
        first = self.prefix_offset - self.cached_prefixes
        return [((first + j) % self.num_prefixes, self.shared_prefix_tokens)
                for j in range(self.cached_prefixes)]

    def replace(self, **changes: Any) -> WorkloadSpec:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WorkloadSpec:
        kw = typed_kwargs(cls, data, "workload")
        for k in ("input_len", "output_len"):
            if k in kw:
                kw[k] = LengthDistribution.coerce(kw[k], where=f"workload.{k}")
        return cls(**kw)


def read_trace(path: str | Path, *, time_scale: float = 1.0) -> list[RequestSpec]:
    """Read a request trace (CSV or Parquet).

    ``path`` may also name a shipped trace (``splitwise_conv_2k.csv``, see
    ``charon_search/data/traces/SOURCE.md``). Columns: ``arrived_at`` (s), ``prompt_tokens``,
    ``output_tokens`` and optionally
    ``prefix_id`` and ``prefix_tokens``. vidur/Splitwise spellings ``num_prefill_tokens`` /
    ``num_decode_tokens`` are accepted too.

    Raises:
        ConfigError: the file is missing or lacks a required column.
    """
    p = Path(path)
    if not p.exists():
        shipped = Path(__file__).resolve().parent.parent / "data" / "traces" / p.name
        if not shipped.exists():
            raise ConfigError(f"workload trace {str(p)!r} does not exist; a workload is one of "
                              f"{[a for a in ARRIVALS if a != 'trace']} or a trace file (shipped "
                              f"traces: "
                              f"{sorted(x.name for x in shipped.parent.glob('*.csv'))})")
        p = shipped
    try:
        if p.suffix == ".parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(p).to_pydict()
        else:
            import pyarrow.csv as pacsv

            table = pacsv.read_csv(p).to_pydict()
    except Exception as e:  # any parse failure is bad input
        raise ConfigError(f"workload trace {str(p)!r} could not be read: {e}") from e
    return _requests_from_columns(table, f"workload trace {str(p)!r}", time_scale)


def requests_from_rows(rows: Sequence[Mapping[str, Any]], *,
                       where: str = "workload rows") -> list[RequestSpec]:
    """Requests from mappings holding a trace's columns, one per request (``read_trace``:
    ``arrived_at``, ``prompt_tokens``, ``output_tokens``, optionally ``prefix_id`` and
    ``prefix_tokens``), checked as a trace file's rows are.

    Raises:
        ConfigError: a required column is missing or a value is out of range.
    """
    keys = sorted({str(k) for r in rows for k in r})
    return _requests_from_columns({k: [r.get(k) for r in rows] for k in keys}, where, 1.0)


def _requests_from_columns(table: Mapping[str, Sequence[Any]], where: str,
                           time_scale: float) -> list[RequestSpec]:
    """The requests of a trace's columns, in arrival order, times from the first."""
    aliases = {"num_prefill_tokens": "prompt_tokens", "num_decode_tokens": "output_tokens"}
    cols = {aliases.get(k, k): v for k, v in table.items()}
    missing = [c for c in TRACE_COLUMNS if c not in cols]
    if missing:
        raise ConfigError(
            f"{where}: missing column(s) {missing}; required: {list(TRACE_COLUMNS)} (optional: "
            f"prefix_id, prefix_tokens); found: {sorted(table)}"
        )
    _check_trace_values(cols, where)
    n = len(cols["arrived_at"])
    if n == 0:
        raise ConfigError(f"{where} holds no requests")
    t = np.asarray(cols["arrived_at"], dtype=float) * time_scale
    order = np.argsort(t, kind="stable")
    pid = cols.get("prefix_id", [-1] * n)
    ptok = cols.get("prefix_tokens", [0] * n)
    out = []
    for new_id, i in enumerate(order):
        prompt = int(cols["prompt_tokens"][i])
        output = max(1, int(cols["output_tokens"][i]))
        p_id = -1 if pid[i] is None else int(pid[i])
        p_tok = min(prompt, int(ptok[i] or 0)) if p_id >= 0 else 0
        if p_id >= 0 and p_tok == 0:
            # A prefix id without a length: the whole prompt but its last block is shared.
            p_tok = max(0, prompt - 1)
        out.append(RequestSpec(request_id=new_id, arrived_at_s=float(t[i] - t[order[0]]),
                               prompt_tokens=max(1, prompt), output_tokens=output,
                               prefix_id=p_id, prefix_tokens=p_tok))
    return out


def _check_trace_values(cols: Mapping[str, Sequence[Any]], where: str) -> None:
    """Every row holds a finite arrival time (seconds, any origin: times are taken relative to
    the first), a prompt of >= 1 tokens and >= 0 output tokens (0 counts as the one token a
    request always gets), as whole numbers; prefix columns, where present, whole numbers."""
    rules = {"arrived_at": (False, None), "prompt_tokens": (True, 1), "output_tokens": (True, 0),
             "prefix_id": (True, None), "prefix_tokens": (True, 0)}
    for col, (whole, low) in rules.items():
        for row, v in enumerate(cols.get(col, ())):
            if v is None and col.startswith("prefix"):
                continue
            ok = (isinstance(v, (int, float, np.integer, np.floating))
                  and not isinstance(v, bool) and np.isfinite(v)
                  and (not whole or float(v).is_integer()) and (low is None or v >= low))
            if not ok:
                kind = "a whole number" if whole else "a finite number"
                bound = f" >= {low}" if low is not None else ""
                raise ConfigError(f"{where}: `{col}` must be {kind}{bound} in every row, "
                                  f"but row {row + 1} holds {v!r}")


def workload_from_requests(requests: Sequence[RequestSpec]) -> list[RequestSpec]:
    """Validate a hand-built request list (ids unique, lengths positive, finite arrival
    times: a list is replayed open loop at its ``arrived_at_s``, think times finite >= 0)."""
    ids = [r.request_id for r in requests]
    if len(set(ids)) != len(ids):
        raise ConfigError("request ids must be unique")
    for r in requests:
        if r.prompt_tokens < 1 or r.output_tokens < 1:
            raise ConfigError(f"request {r.request_id}: prompt and output tokens must be >= 1")
        if not math.isfinite(r.arrived_at_s):
            raise ConfigError(f"request {r.request_id}: `arrived_at_s` must be a finite number "
                              f"of seconds, but got {r.arrived_at_s}")
        if not 0 <= r.think_time_s < math.inf:
            raise ConfigError(f"request {r.request_id}: `think_time_s` must be a finite number "
                              f">= 0 seconds, but got {r.think_time_s}")
    return list(requests)
