"""Recover symbolic dimensions from concrete traces.

The frontend traces once, at a point where ``b``, ``s`` and ``c`` are large primes (10007, 10009,
10037) that no model dimension is a multiple of. Every traced dim ``v`` then factors uniquely as
``k * b^i * s^j * c^l`` (``k`` free of those primes), or, failing that, ``v -/+ 1`` does (shapes
like ``s + 1`` from label padding, ``c - 1`` for a KV cache). FakeTensors never allocate, so the
large sizes cost nothing.

``DimFitter`` also accepts two points (each symbol a different prime at each point) and then
requires the same monomial to fit both, which is the check used in tests to validate the
single-point factorisation.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

from charon_search.errors import PassError
from charon_search.ir import Poly, sym

__all__ = ["DimFitter", "trace_points"]


#: Point values: primes no model dimension is a multiple of (checked for the whole catalog).
_B, _S, _C = 10007, 10009, 10037


def trace_points(phase: str, n: int = 1) -> tuple[dict[str, int], ...]:
    """The concrete point(s) a phase is traced at (decode: one query token, ``c`` keys)."""
    if n == 1:
        if phase == "decode":
            return ({"b": _B, "s": 1, "c": _C},)
        return ({"b": _B, "s": _S, "c": _S},)
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
        for off in (0, -1, 1):
            a = v - off
            if a <= 0:
                continue
            k = a
            mono = Poly.const(1)
            for name in self.symbols:
                p = self.p1[name]
                while k % p == 0:
                    k //= p
                    mono = mono * sym(name)
            if not mono.is_const():
                return mono * k + off
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
