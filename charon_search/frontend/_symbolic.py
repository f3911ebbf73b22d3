"""Recover symbolic dimensions from concrete traces.

The frontend traces once, at a point where ``b``, ``s`` (and ``c`` for decode) are primes that
divide no integer of the model's config. A dimension of a traced tensor is a product/quotient
of config integers and the symbols (or such a term plus/minus one: label padding ``s + 1``, a KV
cache of ``c - 1`` tokens), so it factors uniquely as ``k * b^i * s^j * c^l [± 1]`` with ``k``
free of those primes. ``s`` and ``c`` stay small (below 128) so models with a position limit
(ALiBi tables, learned positions, sliding windows) trace unchanged; ``b`` is large (FakeTensors
never allocate).

``DimFitter`` also accepts two points (each symbol a different prime at each point) and then
requires the same monomial to fit both; tests use it to validate the single-point factorisation.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

from charon_search.errors import PassError
from charon_search.ir import Poly, sym

__all__ = ["DimFitter", "trace_points"]


_B_PRIMES = (10007, 10009, 10037, 10039, 10061)
_S_PRIMES = (97, 89, 83, 79, 73, 71, 67, 61, 59, 53)
_C_PRIMES = (113, 109, 107, 103, 101)


def _config_ints(obj: object, out: set[int]) -> set[int]:
    if isinstance(obj, bool):
        return out
    if isinstance(obj, int):
        out.add(abs(obj))
    elif isinstance(obj, float) and obj.is_integer():
        out.add(abs(int(obj)))
    elif isinstance(obj, Mapping):
        for v in obj.values():
            _config_ints(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _config_ints(v, out)
    return out


def _pick(candidates: tuple[int, ...], ints: set[int], taken: set[int]) -> int:
    # Constants a shape can hold besides the config's own integers: quotients (head_dim =
    # hidden / heads) and sums (MLA's nope + rope head dim). None may sit next to the prime.
    small = {v for v in ints if 0 < v < 1 << 40}
    derived = set(small)
    for v in small:
        for w in small:
            if w and v % w == 0:
                derived.add(v // w)
            derived.add(v + w)
    for p in candidates:
        if p not in taken and not any(v >= p and v % p == 0 for v in ints) and not (
            {p - 1, p + 1} & derived
        ):
            return p
    raise PassError(f"frontend: every trace prime in {candidates} divides a config integer")


def trace_points(phase: str, n: int = 1, config: Mapping[str, object] | None = None
                 ) -> tuple[dict[str, int], ...]:
    """The concrete point(s) a phase is traced at (decode: one query token, ``c`` keys)."""
    if n == 1:
        ints = _config_ints(config or {}, set())
        b = _pick(_B_PRIMES, ints, set())
        if phase == "decode":
            return ({"b": b, "s": 1, "c": _pick(_C_PRIMES, ints, {b})},)
        s = _pick(_S_PRIMES, ints, {b})
        return ({"b": b, "s": s, "c": s},)
    if phase == "decode":
        return {"b": 3, "s": 1, "c": 13}, {"b": 5, "s": 1, "c": 17}
    return {"b": 3, "s": 13, "c": 13}, {"b": 5, "s": 17, "c": 17}


class DimFitter:
    """Maps the concrete values of one dim (one per trace point) to a ``Poly``."""

    def __init__(self, points: tuple[Mapping[str, int], ...], symbols: tuple[str, ...]):
        self.points = points
        self.p1 = points[0]
        self.symbols = symbols
        self.monos: list[tuple[Poly, tuple[int, ...]]] = []
        ranges = {"b": range(3), "s": range(4), "c": range(3)}
        for exps in itertools.product(*(ranges[x] for x in symbols)):
            if not any(exps):
                continue
            mono = Poly.const(1)
            vals = [1] * len(points)
            for name, e in zip(symbols, exps, strict=True):
                mono = mono * (sym(name) ** e)
                for i, p in enumerate(points):
                    vals[i] *= p[name] ** e
            self.monos.append((mono, tuple(vals)))
        self._memo: dict[tuple[int, ...], Poly] = {}

    def fit(self, *values: int) -> Poly:
        key = tuple(int(v) for v in values)
        if key not in self._memo:
            self._memo[key] = self._fit(key) if len(key) > 1 else self._factor(key[0])
        return self._memo[key]

    def _factor(self, v: int) -> Poly:
        if v <= 1:
            return Poly.const(v)
        k = v
        mono = Poly.const(1)
        for name in self.symbols:
            p = self.p1[name]
            if p <= 1:
                continue  # a symbol fixed at 1 (decode's s) cannot be read off a factor
            while k % p == 0:
                k //= p
                mono = mono * sym(name)
        if not mono.is_const():
            return mono * k
        # Off-by-one shapes are only ever the bare symbol: ``s + 1`` (label padding) or
        # ``c - 1`` (the KV cache before this step's token).
        for name in self.symbols:
            p = self.p1[name]
            if p > 1 and v in (p - 1, p + 1):
                return sym(name) + (v - p)
        return Poly.const(v)

    def _fit(self, vals: tuple[int, ...]) -> Poly:
        if len(set(vals)) == 1:
            return Poly.const(vals[0])
        for off in (0, -1, 1):
            shifted = [v - off for v in vals]
            for mono, ms in self.monos:
                ks = {a // m if a % m == 0 else -1 for a, m in zip(shifted, ms, strict=True)}
                if len(ks) == 1 and (k := ks.pop()) > 0:
                    return mono * k + off
        raise PassError(
            f"frontend: cannot express a traced dimension as a monomial in {self.symbols}: "
            f"values {vals} at points {list(self.points)}"
        )
