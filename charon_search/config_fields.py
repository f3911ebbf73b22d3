"""Keyword arguments of a config dataclass from a user's mapping (YAML, JSON), checked.

``Layout``, ``ServingConfig``, ``WorkloadSpec`` and their parts are frozen dataclasses whose
``__post_init__`` checks the rules between values (``tp`` divides the heads, ``low <= high``).
What YAML can get wrong before that, a misspelled key or a value of the wrong kind (``"false"``
for a flag, ``"3"`` for a count, ``64`` for a list), is checked here once for all of them,
against each field's annotation: a ``bool`` field takes only true/false (a YAML string
``"false"`` would otherwise switch it on), an ``int`` field an integer, a ``float`` field a
number, a ``str`` field a string, a ``tuple[T, ...]`` field a list of T (of strings: also one
space-separated string). Nested config types
(a ``DisaggConfig``, a ``LengthDistribution``) and annotations not listed here are left to the
class's own coercion.
"""

from __future__ import annotations

import dataclasses
import difflib
import numbers
import re
import types
import typing
from collections.abc import Mapping
from functools import cache
from typing import Any

from charon_search.errors import ConfigError

__all__ = ["MAX_SEED", "typed_kwargs"]

#: Largest seed a run takes (a workload's and the search samplers' alike): NumPy's legacy
#: seeding takes 32-bit seeds.
MAX_SEED = 2**32 - 1

_KIND = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _matches(value: Any, hint: Any) -> bool | None:
    """Whether ``value`` fits ``hint``; None when the hint is not one this module checks."""
    if hint is Any:
        return None
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    origin = typing.get_origin(hint)
    if origin is tuple:
        args = typing.get_args(hint)
        if len(args) != 2 or args[1] is not Ellipsis:
            return None
        if isinstance(value, str) and args[0] is str:
            return True  # a space-separated list (``Layout.recompute_modules: "mlp moe_act"``)
        if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, (list, tuple)):
            return False
        inner = [_matches(v, args[0]) for v in value]
        return None if None in inner else all(inner)
    if origin in (typing.Union, types.UnionType):
        results = [_matches(value, h) for h in typing.get_args(hint)]
        if any(r is True for r in results):
            return True
        return None if None in results else False
    return None


def _describe(hint: Any) -> str:
    if hint in _KIND:
        return _KIND[hint]
    if hint is type(None):
        return "null"
    origin = typing.get_origin(hint)
    if origin is tuple:
        return f"a list of {re.sub(r'^an? ', '', _describe(typing.get_args(hint)[0]))}s"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(h) for h in typing.get_args(hint))
    return getattr(hint, "__name__", str(hint))


def typed_kwargs(cls: type, data: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``data`` as keyword arguments of the dataclass ``cls``.

    Raises:
        ConfigError: ``data`` is not a mapping, holds a key that is not a field of ``cls``
            (close matches named, then every allowed key), or a value whose kind does not fit
            its field's annotation.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: must be a mapping of {cls.__name__} fields, but got "
                          f"{type(data).__name__} {data!r}")
    allowed = [f.name for f in dataclasses.fields(cls)]
    stray = sorted(set(data) - set(allowed), key=str)
    if stray:
        close = [m for s in stray[:3] for m in difflib.get_close_matches(str(s), allowed, n=2)]
        hint = f"did you mean {close}? " if close else ""
        raise ConfigError(f"{where}: unknown key(s) {stray}; {hint}allowed: {sorted(allowed)}")
    hints = _hints(cls)
    for key, value in data.items():
        hint = hints.get(key, Any)
        if _matches(value, hint) is False:
            raise ConfigError(f"{where}: `{key}` must be {_describe(hint)}, but got "
                              f"{value!r} ({type(value).__name__})")
    return dict(data)
