"""Recover symbolic dimensions from two concrete traces.

Each dimension is traced at two points whose ``b``, ``s``/``c`` values are distinct primes, and
is matched to ``k * b^i * s^j [* c^l] + offset`` (offset in 0, -1, +1; integer ``k``) consistent at
both points. Because the point values are distinct primes, two different monomials can never
both fit (unique factorisation), so a match is unambiguous; a dim that fits none raises.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

from charon_search.errors import PassError
from charon_search.ir import Poly, sym

__all__ = ["DimFitter", "trace_points"]


def trace_points(phase: str) -> tuple[dict[str, int], dict[str, int]]:
    """The two concrete points a phase is traced at (odd primes, none a model dim)."""
    if phase == "decode":
        return {"b": 3, "s": 1, "c": 13}, {"b": 5, "s": 1, "c": 17}
    return {"b": 3, "s": 13, "c": 13}, {"b": 5, "s": 17, "c": 17}


class DimFitter:
    """Maps a pair of concrete dim values (point 1, point 2) to a ``Poly``."""

    def __init__(self, p1: Mapping[str, int], p2: Mapping[str, int], symbols: tuple[str, ...]):
        self.p1, self.p2 = p1, p2
        self.monos: list[tuple[Poly, int, int]] = []
        ranges = {"b": range(3), "s": range(4), "c": range(3)}
        for exps in itertools.product(*(ranges[x] for x in symbols)):
            if not any(exps):
                continue
            mono = Poly.const(1)
            v1 = v2 = 1
            for name, e in zip(symbols, exps, strict=True):
                mono = mono * (sym(name) ** e)
                v1 *= p1[name] ** e
                v2 *= p2[name] ** e
            self.monos.append((mono, v1, v2))
        self._memo: dict[tuple[int, int], Poly] = {}

    def fit(self, v1: int, v2: int) -> Poly:
        key = (int(v1), int(v2))
        if key in self._memo:
            return self._memo[key]
        out = self._fit(*key)
        self._memo[key] = out
        return out

    def _fit(self, v1: int, v2: int) -> Poly:
        if v1 == v2:
            return Poly.const(v1)
        for off in (0, -1, 1):
            a, b = v1 - off, v2 - off
            for mono, m1, m2 in self.monos:
                if a % m1 == 0 and b % m2 == 0 and a // m1 == b // m2 and a // m1 > 0:
                    return mono * (a // m1) + off
        raise PassError(
            f"frontend: cannot express a traced dimension as a monomial in b, s, c: it is {v1} "
            f"at {dict(self.p1)} and {v2} at {dict(self.p2)}"
        )
