"""Units: YAML key suffix -> SI conversion, and human-readable formatting at the edges.

Inside Python every quantity is SI (seconds, bytes, FLOPs, bytes/s, FLOP/s). YAML files may use
human units only through one of the key suffixes below; loaders convert once with ``to_si``.
Memory capacity is binary (GiB = 2**30 B); bandwidth and FLOP/s are decimal (1e9, 1e12).
"""

from __future__ import annotations

__all__ = [
    "GIB",
    "SUFFIX_TO_SI",
    "format_bytes",
    "format_flops",
    "format_seconds",
    "split_unit_key",
    "to_si",
]

KIB = 2**10
MIB = 2**20
GIB = 2**30
TIB = 2**40

#: Allowed YAML key suffixes -> (SI suffix, factor).
SUFFIX_TO_SI: dict[str, tuple[str, float]] = {
    "_s": ("_s", 1.0),
    "_ms": ("_s", 1e-3),
    "_us": ("_s", 1e-6),
    "_ns": ("_s", 1e-9),
    "_bytes": ("_bytes", 1.0),
    "_gib": ("_bytes", float(GIB)),
    "_gb": ("_bytes", 1e9),
    "_gbyte_per_s": ("_bytes_per_s", 1e9),
    "_gbit_per_s": ("_bytes_per_s", 1e9 / 8),
    "_tflops_per_s": ("_flops_per_s", 1e12),
}


def split_unit_key(key: str) -> tuple[str, str, float] | None:
    """Split ``hbm_capacity_gib`` into ``("hbm_capacity", "_bytes", 2**30)``; None if no unit."""
    # Longest suffix first so `_gbyte_per_s` wins over `_s`.
    for suffix in sorted(SUFFIX_TO_SI, key=len, reverse=True):
        if key.endswith(suffix):
            si_suffix, factor = SUFFIX_TO_SI[suffix]
            return key[: -len(suffix)], si_suffix, factor
    return None


def to_si(key: str, value: float) -> tuple[str, float]:
    """Convert a YAML ``(key, value)`` with a unit suffix to ``(si_key, si_value)``.

    >>> to_si("hbm_capacity_gib", 80)
    ('hbm_capacity_bytes', 85899345920.0)
    """
    parts = split_unit_key(key)
    if parts is None:
        return key, value
    base, si_suffix, factor = parts
    return base + si_suffix, float(value) * factor


def _scaled(value: float, steps: list[tuple[float, str]], fmt: str) -> str:
    if value != value:  # NaN: a quantity with no sample (TPOT of one-token outputs)
        return "n/a"
    for factor, unit in steps:
        if abs(value) >= factor:
            return f"{value / factor:{fmt}} {unit}"
    factor, unit = steps[-1]
    return f"{value / factor:{fmt}} {unit}"


def format_bytes(n: float) -> str:
    """Binary units: ``format_bytes(80 * 2**30) == '80.0 GiB'``."""
    return _scaled(n, [(TIB, "TiB"), (GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB"), (1, "B")], ".1f")


def format_seconds(t: float) -> str:
    """``format_seconds(0.0123) == '12.30 ms'``."""
    return _scaled(t, [(1.0, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns")], ".2f")


def format_flops(n: float) -> str:
    """Decimal units: ``format_flops(3.2e15) == '3.20 PFLOP'``."""
    return _scaled(
        n,
        [(1e18, "EFLOP"), (1e15, "PFLOP"), (1e12, "TFLOP"), (1e9, "GFLOP"), (1e6, "MFLOP"),
         (1.0, "FLOP")],
        ".2f",
    )
