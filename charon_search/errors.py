"""Error hierarchy of charon-search.

``ConfigError`` is bad input (the CLI prints it as one line and exits 2), ``InfeasibleError``
a valid configuration that cannot run (the search records it as an infeasible trial),
``PassError`` a graph rewrite that failed (names the pass and the node).
"""

from __future__ import annotations

__all__ = ["CharonError", "ConfigError", "InfeasibleError", "PassError"]


class CharonError(Exception):
    """Base class of every error charon-search raises on purpose."""


class ConfigError(CharonError, ValueError):
    """Bad input: unknown name, malformed file, a rule between settings that does not hold.

    The message states the rule first, then the values, e.g.
    ``"`tp` must divide num_attention_heads, but got (tp=3, num_attention_heads=64)."``
    """


class InfeasibleError(CharonError):
    """A valid configuration that cannot run, e.g. it does not fit in device memory."""


class PassError(CharonError):
    """A graph rewrite failed; the message names the pass and the node."""
