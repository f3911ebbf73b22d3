"""Polynomials over the symbolic dimensions of a traced graph.

A graph is traced once; the dimensions that vary with the configuration stay symbolic:

* ``b`` - micro-batch size (sequences in one forward pass),
* ``s`` - query tokens per sequence (sequence length in training and prefill, 1 in decode),
* ``c`` - context (key/value) length seen by attention (``c = s`` in training and prefill, the
  KV-cache length plus one in decode).

The serving "tokens in a batch" dimension is the monomial ``b*s``. Shapes, FLOPs and bytes are
``Poly`` values: sums of ``coeff * b**i * s**j * c**k``. Re-evaluating a graph for another
``(b, s, c)`` is arithmetic (see ``OpGraph.evaluate``), never a re-trace.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["SYMBOLS", "Poly", "PolyLike", "as_poly", "sym"]

SYMBOLS: tuple[str, ...] = ("b", "s", "c")
_NSYM = len(SYMBOLS)
Exps = tuple[int, int, int]
_ZERO_EXPS: Exps = (0, 0, 0)


@dataclass(frozen=True, slots=True)
class Poly:
    """An immutable polynomial ``sum(coeff * b**eb * s**es * c**ec)``.

    ``terms`` is a tuple of ``(exponents, coeff)`` pairs sorted by exponents, with no zero
    coefficients, so equal polynomials compare and hash equal.

    >>> b, s = sym("b"), sym("s")
    >>> p = 2 * b * s * 4096 + 7
    >>> p(b=2, s=10)
    163847.0
    >>> str(b * s * s)
    'b*s^2'
    """

    terms: tuple[tuple[Exps, float], ...] = ()

    @staticmethod
    def from_dict(d: Mapping[Exps, float]) -> Poly:
        return Poly(tuple(sorted((e, float(c)) for e, c in d.items() if c != 0.0)))

    @staticmethod
    def const(value: float) -> Poly:
        return Poly.from_dict({_ZERO_EXPS: value})

    # ------------------------------------------------------------------ arithmetic
    def _dict(self) -> dict[Exps, float]:
        return dict(self.terms)

    def __add__(self, other: PolyLike) -> Poly:
        o = as_poly(other)
        d = self._dict()
        for e, c in o.terms:
            d[e] = d.get(e, 0.0) + c
        return Poly.from_dict(d)

    __radd__ = __add__

    def __neg__(self) -> Poly:
        return Poly(tuple((e, -c) for e, c in self.terms))

    def __sub__(self, other: PolyLike) -> Poly:
        return self + (-as_poly(other))

    def __rsub__(self, other: PolyLike) -> Poly:
        return as_poly(other) - self

    def __mul__(self, other: PolyLike) -> Poly:
        o = as_poly(other)
        d: dict[Exps, float] = {}
        for e1, c1 in self.terms:
            for e2, c2 in o.terms:
                e = (e1[0] + e2[0], e1[1] + e2[1], e1[2] + e2[2])
                d[e] = d.get(e, 0.0) + c1 * c2
        return Poly.from_dict(d)

    __rmul__ = __mul__

    def __truediv__(self, other: float) -> Poly:
        if isinstance(other, Poly):
            if other.is_const():
                other = other.const_value()
            elif len(other.terms) == 1:
                return self._div_monomial(other)
            else:
                raise TypeError(f"cannot divide {self} by the non-monomial {other}")
        return Poly(tuple((e, c / float(other)) for e, c in self.terms))

    def _div_monomial(self, other: Poly) -> Poly:
        """Exact division by one term, e.g. ``(4*b*s^2) / s == 4*b*s``."""
        (oe, oc), = other.terms
        out: dict[Exps, float] = {}
        for e, c in self.terms:
            q = (e[0] - oe[0], e[1] - oe[1], e[2] - oe[2])
            if min(q) < 0:
                raise TypeError(f"{self} is not divisible by the monomial {other}")
            out[q] = out.get(q, 0.0) + c / oc
        return Poly.from_dict(out)

    def __pow__(self, n: int) -> Poly:
        out = Poly.const(1.0)
        for _ in range(n):
            out = out * self
        return out

    # ------------------------------------------------------------------ queries
    def is_const(self) -> bool:
        return all(e == _ZERO_EXPS for e, _ in self.terms)

    def const_value(self) -> float:
        if not self.is_const():
            raise ValueError(f"{self} is not a constant")
        return self.terms[0][1] if self.terms else 0.0

    def degree(self, symbol: str) -> int:
        i = SYMBOLS.index(symbol)
        return max((e[i] for e, _ in self.terms), default=0)

    def __call__(self, b: float = 1, s: float = 1, c: float | None = None) -> float:
        """Evaluate at ``(b, s, c)``; ``c`` defaults to ``s``."""
        cc = s if c is None else c
        total = 0.0
        for (eb, es, ec), coeff in self.terms:
            total += coeff * (b**eb) * (s**es) * (cc**ec)
        return total

    def subs(self, **values: PolyLike) -> Poly:
        """Substitute symbols by polynomials or numbers, e.g. ``p.subs(c=sym("s"))``."""
        out = Poly()
        for exps, coeff in self.terms:
            term = Poly.const(coeff)
            for name, e in zip(SYMBOLS, exps, strict=True):
                if e == 0:
                    continue
                base = as_poly(values[name]) if name in values else sym(name)
                term = term * (base**e)
            out = out + term
        return out

    def __float__(self) -> float:
        return self.const_value()

    def __int__(self) -> int:
        return round(self.const_value())

    def __bool__(self) -> bool:
        return bool(self.terms)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (int, float)):
            other = Poly.const(other)
        if not isinstance(other, Poly):
            return NotImplemented
        if len(self.terms) != len(other.terms):
            return False
        for (e1, c1), (e2, c2) in zip(self.terms, other.terms, strict=True):
            if e1 != e2 or not math.isclose(c1, c2, rel_tol=1e-12, abs_tol=1e-12):
                return False
        return True

    def __hash__(self) -> int:
        return hash(tuple((e, round(c, 9)) for e, c in self.terms))

    def __str__(self) -> str:
        if not self.terms:
            return "0"
        parts = []
        for exps, coeff in reversed(self.terms):
            factors = [
                name if e == 1 else f"{name}^{e}"
                for name, e in zip(SYMBOLS, exps, strict=True)
                if e
            ]
            c = int(coeff) if float(coeff).is_integer() else coeff
            if factors and c == 1:
                parts.append("*".join(factors))
            else:
                parts.append("*".join([str(c), *factors]))
        return " + ".join(parts)

    __repr__ = __str__

    def to_json(self) -> list[list[float]]:
        """``[[eb, es, ec, coeff], ...]``: round-trips through ``Poly.from_json``."""
        return [[*e, c] for e, c in self.terms]

    @staticmethod
    def from_json(data: Iterable[Iterable[float]]) -> Poly:
        d: dict[Exps, float] = {}
        for row in data:
            eb, es, ec, coeff = row
            d[(int(eb), int(es), int(ec))] = float(coeff)
        return Poly.from_dict(d)


PolyLike = Poly | int | float


def as_poly(x: PolyLike) -> Poly:
    if isinstance(x, Poly):
        return x
    return Poly.const(float(x))


def sym(name: str) -> Poly:
    """The polynomial of one symbol: ``sym("b")``."""
    exps = [0] * _NSYM
    exps[SYMBOLS.index(name)] = 1
    return Poly((((exps[0], exps[1], exps[2]), 1.0),))
