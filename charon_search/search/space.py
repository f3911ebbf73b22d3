"""Search spaces: parameters, fixed values, derived values and validity rules, read from YAML.

A space file (``spaces/<name>.yaml``) looks like::

    name: quickstart-llama8b-training
    evaluator: training            # registered evaluator (see ``search.evaluators``)
    fixed: {model: llama-3.1-8b, cluster: h100-sxm-8gpu, seq_len: 4096, global_batch_size: 64}
    params:
      num_gpus: {type: log_int, low: 1, high: 8, base: 2}     # 1, 2, 4, 8
      tp: {type: log_int, low: 1, high: 8, base: 2}
      micro_batch_size: {type: int, low: 1, high: 4}
      recompute: {type: categorical, choices: [none, selective, full]}
    derived:
      dp: num_gpus / (tp * pp * cp)     # exact arithmetic; a non-integer makes the point invalid
    normalize: [pipeline_schedule]      # registered canonicalisations (see ``search.rules``)
    constraints: [degrees_divide_world_size, tp_divides_heads]
    family: [recompute]                 # config keys that colour the Pareto plot

Parameter types: ``categorical`` (``choices``), ``int`` (``low``, ``high``, optional ``step``)
and ``log_int`` (``low``, ``high``; with ``base`` (an integer >= 2) only powers of ``base`` in
[low, high], sampled through their integer exponent so samplers keep the ordering, e.g. Optuna
parameter ``log2_tp``; without ``base`` Optuna's log-uniform integer). Optuna rejects value
spaces that depend on other parameters, so every parameter has a fixed range and validity rules
remove invalid combinations before anything is simulated.

For the ``training`` and ``serving`` evaluators, loading also checks what the evaluator will
read, without simulating: every ``fixed`` key and parameter name is a config key it reads
(``evaluator_keys``), and the fixed values, every categorical choice and the ``example`` build
the config it builds first (``build_config``: the ``Layout``; the workload and
``ServingConfig``), so a typo is one ``ConfigError`` naming the field instead of trials that all
fail or a value silently ignored.

A ``training`` space may name the job's framework (``framework: megatron-core``, with optional
``framework_year`` and ``torch_compile``; ``frameworks.FRAMEWORKS``): every trial then runs as that
framework's code does (``frameworks.framework_layout``: the facts the accuracy report's records of
it are simulated with), layout fields the space sets excepted. As a categorical parameter it
compares frameworks.
"""

from __future__ import annotations

import ast
import itertools
import math
import operator
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from charon_search.errors import ConfigError
from charon_search.search.rules import CONSTRAINTS, NORMALIZERS, RuleContext

if TYPE_CHECKING:
    import optuna

__all__ = ["PARAM_TYPES", "Param", "SearchSpace", "build_config", "evaluator_keys",
           "load_space"]

PARAM_TYPES = ("categorical", "int", "log_int")
_SPACE_KEYS = ("name", "description", "evaluator", "fixed", "params", "derived", "normalize",
               "constraints", "family", "source", "example")
_PARAM_KEYS: dict[str, tuple[str, ...]] = {
    "categorical": ("type", "choices"),
    "int": ("type", "low", "high", "step"),
    "log_int": ("type", "low", "high", "base"),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Param:
    """One searched parameter."""

    name: str
    type: str
    """One of ``PARAM_TYPES``."""
    choices: tuple[Any, ...] = ()
    """``categorical`` only: the allowed values (str, int, float, bool)."""
    low: int = 0
    high: int = 0
    step: int = 1
    """``int`` only."""
    base: int = 0
    """``log_int`` only: 0 = any integer, log-uniform; >= 2 = only powers of ``base``."""

    @property
    def optuna_name(self) -> str:
        """The name the sampler sees (``log2_tp`` for a power-of-two ``tp``)."""
        return f"log{self.base}_{self.name}" if self.type == "log_int" and self.base else self.name

    def values(self) -> Sequence[Any]:
        """Every value of this parameter (for grid enumeration); integer ranges stay ``range``
        objects, so a wide one costs nothing until it is enumerated."""
        if self.type == "categorical":
            return self.choices
        if self.type == "int":
            return range(self.low, self.high + 1, self.step)
        if self.base:
            lo, hi = self._exponents()
            return tuple(self.base**e for e in range(lo, hi + 1))
        return range(self.low, self.high + 1)

    def describe_values(self) -> str:
        """The allowed values, for messages (a range as ``low..high``)."""
        vals = self.values()
        if isinstance(vals, range):
            step = f" step {vals.step}" if vals.step != 1 else ""
            return f"integers {self.low}..{vals[-1]}{step}"
        return str(list(vals))

    def optuna_values(self) -> Sequence[Any]:
        """Every value of the sampler-level parameter (exponents for a ``base`` log_int)."""
        if self.type == "log_int" and self.base:
            lo, hi = self._exponents()
            return tuple(range(lo, hi + 1))
        return self.values()

    def _exponents(self) -> tuple[int, int]:
        lo = math.ceil(math.log(self.low, self.base) - 1e-9)
        hi = math.floor(math.log(self.high, self.base) + 1e-9)
        return lo, hi

    def suggest(self, trial: optuna.trial.Trial) -> Any:
        """Ask ``trial`` for this parameter and return the config-level value."""
        if self.type == "categorical":
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.type == "int":
            return trial.suggest_int(self.name, self.low, self.high, step=self.step)
        if self.base:
            lo, hi = self._exponents()
            return self.base ** trial.suggest_int(self.optuna_name, lo, hi)
        return trial.suggest_int(self.name, self.low, self.high, log=True)

    def distribution(self) -> optuna.distributions.BaseDistribution:
        """The Optuna distribution of the sampler-level parameter."""
        from optuna.distributions import CategoricalDistribution, IntDistribution

        if self.type == "categorical":
            return CategoricalDistribution(list(self.choices))
        if self.type == "int":
            return IntDistribution(self.low, self.high, step=self.step)
        if self.base:
            lo, hi = self._exponents()
            return IntDistribution(lo, hi)
        return IntDistribution(self.low, self.high, log=True)

    def to_optuna(self, value: Any) -> Any:
        """Config-level value -> sampler-level value (inverse of ``suggest``)."""
        if self.type == "log_int" and self.base:
            return round(math.log(value, self.base))
        return value


@dataclass(frozen=True, kw_only=True)
class SearchSpace:
    """A named search space. Build with ``load_space`` or ``SearchSpace.from_dict``."""

    name: str
    evaluator: str
    """Registered evaluator key (``training``, ``serving``, ``toy-analytic``)."""
    params: tuple[Param, ...]
    fixed: Mapping[str, Any] = field(default_factory=dict)
    derived: Mapping[str, str] = field(default_factory=dict)
    """Derived config key -> arithmetic expression over other keys (``+ - * / //``, ints)."""
    normalize: tuple[str, ...] = ()
    """Registered normalizers applied to every config (canonical form; see ``search.rules``)."""
    constraints: tuple[str, ...] = ()
    """Registered validity rules; a point violating one is never simulated."""
    family: tuple[str, ...] = ()
    """Config keys whose values name a point's "family" (plot colour)."""
    description: str = ""
    source: str = ""
    example: Mapping[str, Any] = field(default_factory=dict)
    """A valid parameter point (e.g. a published layout); smoke tests evaluate it."""
    path: str = ""
    """File the space was loaded from (for messages)."""

    # ------------------------------------------------------------ points
    def suggest(self, trial: optuna.trial.Trial) -> dict[str, Any]:
        """Ask ``trial`` for every parameter; return the parameter-level point."""
        return {p.name: p.suggest(trial) for p in self.params}

    def config(self, point: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
        """Fixed + point + derived values, normalized; plus why it is invalid (None = valid)."""
        cfg: dict[str, Any] = {**self.fixed, **point}
        for key, expr in self.derived.items():
            try:
                value = _eval_expr(expr, cfg)
            except ZeroDivisionError:
                return cfg, f"derived `{key} = {expr}` divides by zero"
            if value.denominator != 1 or value <= 0:
                return cfg, f"derived `{key} = {expr}` must be a positive integer, but got {value}"
            cfg[key] = int(value)
        for name in self.normalize:
            cfg = NORMALIZERS.get(name)(cfg)
        return cfg, None

    def check(self, cfg: Mapping[str, Any], ctx: RuleContext) -> str | None:
        """Run the validity rules on a config; return the first violation's reason or None."""
        for name in self.constraints:
            reason = CONSTRAINTS.get(name)(cfg, ctx)
            if reason:
                return f"{name}: {reason}"
        return None

    def num_points(self) -> int:
        """Size of the parameter grid (valid and invalid points)."""
        return math.prod(len(p.values()) for p in self.params)

    def grid(self) -> Iterator[dict[str, Any]]:
        """Every parameter-level point of the grid, in a fixed order."""
        names = [p.name for p in self.params]
        for values in itertools.product(*(p.values() for p in self.params)):
            yield dict(zip(names, values))

    def enumerate_valid(self, ctx: RuleContext | None = None) -> list[tuple[dict, dict]]:
        """Every valid point as ``(point, config)``, one per distinct canonical config."""
        ctx = ctx or RuleContext()
        seen: set[tuple] = set()
        out = []
        for point in self.grid():
            cfg, reason = self.config(point)
            if reason or self.check(cfg, ctx):
                continue
            key = config_key(cfg)
            if key not in seen:
                seen.add(key)
                out.append((point, cfg))
        return out

    def optuna_params(self, point: Mapping[str, Any]) -> dict[str, Any]:
        """Parameter-level point -> the sampler's parameter dict (for ``enqueue_trial``)."""
        return {p.optuna_name: p.to_optuna(point[p.name]) for p in self.params}

    def family_of(self, cfg: Mapping[str, Any]) -> str:
        keys = self.family or tuple(p.name for p in self.params if p.type == "categorical")[:1]
        return " ".join(f"{k}={cfg.get(k)}" for k in keys) or self.name

    def with_fixed(self, **values: Any) -> SearchSpace:
        """A copy where ``values`` are fixed (removing parameters of the same name)."""
        import dataclasses

        params = tuple(p for p in self.params if p.name not in values)
        return dataclasses.replace(self, params=params, fixed={**self.fixed, **values})

    # ------------------------------------------------------------ loading
    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, path: str = "<space>") -> SearchSpace:
        """Build and validate a space; ``ConfigError`` names the file, field and allowed values."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"{path}: a space file must be a mapping with keys {_SPACE_KEYS}")
        reject_unknown_keys(data, _SPACE_KEYS, path, "")
        for req in ("name", "evaluator", "params"):
            if req not in data:
                raise ConfigError(f"{path}: missing required field `{req}`")
        from charon_search.search.evaluators import EVALUATORS

        evaluator = str(data["evaluator"])
        if evaluator not in EVALUATORS:
            raise ConfigError(
                f"{path}: field `evaluator` must be one of {EVALUATORS.names()}, "
                f"but got {evaluator!r}"
            )
        raw_params = data["params"]
        if not isinstance(raw_params, Mapping) or not raw_params:
            raise ConfigError(f"{path}: field `params` must be a non-empty mapping name -> spec")
        for section in ("params", "fixed", "derived", "example"):
            _check_mapping(data.get(section), path, section)
        params = tuple(_parse_param(name, spec, path) for name, spec in raw_params.items())
        fixed = dict(data.get("fixed") or {})
        clash = sorted(set(fixed) & {p.name for p in params})
        if clash:
            raise ConfigError(f"{path}: keys {clash} are both `fixed` and `params`")
        derived = {str(k): str(v) for k, v in (data.get("derived") or {}).items()}
        known = set(fixed) | {p.name for p in params}
        for key, expr in derived.items():
            names = _expr_names(expr, f"{path}: derived.{key}")
            missing = sorted(names - known)
            if missing:
                raise ConfigError(
                    f"{path}: field `derived.{key}` uses unknown name(s) {missing}; "
                    f"allowed: {sorted(known)}"
                )
            known.add(key)
        normalize = tuple(_names(data.get("normalize"), NORMALIZERS, path, "normalize"))
        constraints = tuple(_names(data.get("constraints"), CONSTRAINTS, path, "constraints"))
        raw_family = data.get("family") or ()
        if isinstance(raw_family, str):  # `family: recompute` is one key, not its letters
            raw_family = [raw_family]
        if not isinstance(raw_family, list | tuple) or not all(isinstance(f, str)
                                                               for f in raw_family):
            raise ConfigError(f"{path}: field `family` must be a list of config keys, e.g. "
                              f"[recompute], but got {raw_family!r}")
        family = tuple(raw_family)
        for f in family:
            if f not in known:
                raise ConfigError(
                    f"{path}: field `family` names unknown key {f!r}; allowed: {sorted(known)}"
                )
        example = dict(data.get("example") or {})
        by_name = {p.name: p for p in params}
        space = cls(
            name=str(data["name"]), evaluator=evaluator, params=params, fixed=fixed,
            derived=derived, normalize=normalize, constraints=constraints, family=family,
            description=str(data.get("description", "")), source=str(data.get("source", "")),
            example=example, path=path,
        )
        # What the evaluator reads is checked before any trial: a misspelt key or a bad fixed
        # value would otherwise be ignored or make every trial fail, and a bad choice would be
        # sampled (the choices first, so a choice's typo is not blamed on `example`).
        _check_config_keys(space)
        # After the key check: a misspelt parameter name is reported as that, not as an
        # `example` that no longer matches the parameters.
        if example and set(example) != set(by_name):
            raise ConfigError(f"{path}: field `example` must set exactly the params "
                              f"{sorted(by_name)}, but got {sorted(example)}")
        _check_builds(space)
        for k, v in example.items():
            if v not in by_name[k].values():
                raise ConfigError(f"{path}: field `example.{k}` must be one of "
                                  f"{by_name[k].describe_values()}, but got {v!r}")
        if example:
            cfg, reason = space.config(example)
            if reason is None:
                try:
                    build_config(evaluator, cfg)
                except ConfigError as e:
                    raise ConfigError(f"{path}: field `example` does not make a valid "
                                      f"{evaluator!r} config: {e}") from None
        return space


def load_space(path: str | Path) -> SearchSpace:
    """Load ``spaces/<name>.yaml`` (a path, or a bare name looked up in ``spaces/``)."""
    p = _resolve(path, "spaces")
    return SearchSpace.from_dict(_read_yaml(p), path=str(p))


def config_key(cfg: Mapping[str, Any]) -> tuple:
    """Hashable canonical key of a config (memoisation, de-duplication)."""
    return tuple(sorted((k, _hashable(v)) for k, v in cfg.items()))


def _hashable(v: Any) -> Any:
    if isinstance(v, Mapping):
        return tuple(sorted((k, _hashable(x)) for k, x in v.items()))
    if isinstance(v, list | tuple):
        return tuple(_hashable(x) for x in v)
    return v


# ---------------------------------------------------------------- evaluator configs
#: Sampled points tried when looking for one that makes a valid evaluator config.
_BUILD_TRIES = 48


def evaluator_keys(evaluator: str) -> frozenset[str] | None:
    """The config keys the ``training``/``serving`` evaluator reads; None for other evaluators
    (their keys are not known here, so they are not checked)."""
    import dataclasses

    if evaluator == "training":
        from charon_search.layout import Layout
        from charon_search.search.evaluators import FRAMEWORK_KEYS

        return frozenset({f.name for f in dataclasses.fields(Layout)}
                         | {"model", "cluster", "num_gpus", *FRAMEWORK_KEYS})
    if evaluator == "serving":
        from charon_search.search.serving_bridge import _POOL_KEYS, _SEARCH_ONLY
        from charon_search.serving import ServingConfig, WorkloadSpec

        return frozenset({f.name for f in dataclasses.fields(ServingConfig)} | _SEARCH_ONLY
                         | {f"{pool}_{k}" for pool in ("prefill", "decode") for k in _POOL_KEYS}
                         | {f"workload_{f.name}" for f in dataclasses.fields(WorkloadSpec)})
    return None


def build_config(evaluator: str, cfg: Mapping[str, Any],
                 cache: dict[str, Any] | None = None) -> None:
    """Build what the ``training``/``serving`` evaluator builds from ``cfg`` before simulating
    (the ``Layout``; the ``WorkloadSpec`` and ``ServingConfig``), without simulating; nothing
    for other evaluators. ``cache`` keeps generated workloads between calls.

    Raises:
        ConfigError: the evaluator would reject ``cfg`` (a bad value, a misspelt key).
    """
    if evaluator in ("training", "serving"):
        _check_names(cfg, cache)
    if evaluator == "training":
        from charon_search.search.evaluators import training_setup

        training_setup(cfg)
    elif evaluator == "serving":
        from charon_search.search.serving_bridge import serving_config_from, workload_from
        from charon_search.serving import WorkloadSpec

        data = workload_from(cfg)
        workload = WorkloadSpec.from_dict(data)  # checks the seed's range too
        prompts: list[int] = []
        if cfg.get("engine"):
            key = repr(sorted(data.items(), key=lambda kv: kv[0]))
            if cache is not None and key in cache:
                prompts = cache[key]
            else:
                try:
                    prompts = [r.prompt_tokens for r in workload.generate()]
                except (ValueError, TypeError, OSError) as e:
                    raise ConfigError(f"`workload` cannot generate its requests: {e}") from None
                if cache is not None:
                    cache[key] = prompts
        serving_config_from(cfg, gpu="", prompt_tokens=prompts)


def _check_names(cfg: Mapping[str, Any], cache: dict[str, Any] | None) -> None:
    """The model and the cluster ``cfg`` names exist (``catalog.load_model``,
    ``hardware.load_cluster``), so a misspelt name fails when the space loads, not in a worker;
    names already checked are kept in ``cache``."""
    from charon_search.catalog import load_model
    from charon_search.hardware import load_cluster

    # A serving space's pools may run on their own clusters (``prefill_cluster``,
    # ``decode_cluster``): a misspelt one would otherwise fail every disaggregated trial, or
    # stop the search in a validity rule that looks it up.
    keys = [("model", load_model), ("cluster", load_cluster)]
    keys += [(k, load_cluster) for k in cfg if isinstance(k, str) and k.endswith("_cluster")]
    for key, load in keys:
        value = cfg.get(key)
        seen = f"name-checked {key}={value}"
        if not isinstance(value, str) or (cache is not None and seen in cache):
            continue
        try:
            load(value)
        except ConfigError as e:
            msg = str(e)
            raise ConfigError(msg if msg.startswith(f"`{key}`") else f"`{key}`: {msg}") from None
        if cache is not None:
            cache[seen] = True


def _check_config_keys(space: SearchSpace) -> None:
    """Every ``fixed`` key and parameter name is a key the evaluator reads."""
    import difflib

    allowed = evaluator_keys(space.evaluator)
    if allowed is None:
        return
    names = [("fixed", k) for k in space.fixed] + [("params", p.name) for p in space.params]
    given = {k for _, k in names} | set(space.derived)
    for key in ("model", "cluster"):  # every trial simulates one model on one cluster
        if key not in given:
            raise ConfigError(f"{space.path}: field `{key}` is required by the "
                              f"{space.evaluator!r} evaluator: set it under `fixed` (or as a "
                              "parameter)")
    for section, key in names:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), sorted(allowed), n=3)
            hint = f"did you mean {close}? " if close else ""
            raise ConfigError(
                f"{space.path}: field `{section}.{key}` is not a config key of the "
                f"{space.evaluator!r} evaluator (it would be ignored); {hint}"
                f"allowed: {sorted(allowed)}")


def _check_builds(space: SearchSpace) -> None:
    """The fixed values, and every choice of every categorical parameter, make a config the
    evaluator accepts, tried on the ``example`` point and a seeded sample of the grid.

    A choice is rejected only when no tried point holding it builds while another point does;
    when no point builds at all, the error names the ``fixed`` key (or the choice) it is about.
    """
    import random

    if evaluator_keys(space.evaluator) is None:
        return
    values = {p.name: p.values() for p in space.params}
    rng = random.Random(0)
    cache: dict[str, Any] = {}

    def sample(**pinned: Any) -> Iterator[dict[str, Any]]:
        for _ in range(_BUILD_TRIES):
            yield {k: pinned[k] if k in pinned else rng.choice(v) for k, v in values.items()}

    def error(point: Mapping[str, Any]) -> ConfigError | bool:
        """Why ``point`` does not build; False: it builds; True: its derived values are
        invalid (the space's rules report that per trial), so it tells nothing."""
        cfg, reason = space.config(point)
        if reason is not None:
            return True
        try:
            build_config(space.evaluator, cfg, cache)
        except ConfigError as e:
            return e
        return False

    example_ok = bool(space.example) and all(
        v in values[k] for k, v in space.example.items())
    first: ConfigError | None = None
    good: dict[str, Any] | None = None
    for point in itertools.chain([dict(space.example)] if example_ok else [], sample()):
        e = error(point)
        if e is False:
            good = point
            break
        if isinstance(e, ConfigError):
            first = first or e
    categorical = [p for p in space.params if p.type == "categorical"]
    where = f"{space.path}: field"
    if good is None:
        if first is None:
            return
        msg = str(first)
        for p in categorical:
            for c in p.choices:
                if re.search(rf"but got {re.escape(repr(c))}(?![\w.])", msg):
                    raise ConfigError(f"{where} `params.{p.name}.choices` holds {c!r}, which "
                                      f"the {space.evaluator!r} evaluator rejects: {msg}")
        keys = _fixed_keys_named(space, msg)
        at = f"`fixed.{keys[0]}`" if keys else "`fixed` (or a parameter's range)"
        raise ConfigError(f"{where} {at} makes no valid {space.evaluator!r} config: {msg}")
    for p in categorical:
        for c in p.choices:
            e = error({**good, p.name: c})
            if not isinstance(e, ConfigError):
                continue
            if any(error(point) is False for point in sample(**{p.name: c})):
                continue
            # A fixed value only read under this choice (a serving space's `kv_transfer` or
            # `decode_cluster`, read when `mode` is disaggregated) is the culprit, not the
            # choice: the message names that key and quotes its value.
            keys = [k for k in _fixed_keys_named(space, str(e))
                    if repr(space.fixed[k]) in str(e)]
            if keys:
                raise ConfigError(f"{where} `fixed.{keys[0]}` makes no valid "
                                  f"{space.evaluator!r} config with `{p.name}` = {c!r}: {e}")
            raise ConfigError(f"{where} `params.{p.name}.choices` holds {c!r}, which the "
                              f"{space.evaluator!r} evaluator rejects: {e}")


def _fixed_keys_named(space: SearchSpace, msg: str) -> list[str]:
    """The ``fixed`` keys an evaluator's error message names: as a word inside a backquoted
    span (`key`, `key.x`, `disagg.key`, `0 < key <= 1`) or at its start (``key: ...``)."""
    spans = re.findall(r"`([^`]*)`", msg)
    return [k for k in space.fixed
            if any(re.search(rf"(?<!\w){re.escape(k)}(?!\w)", span) for span in spans)
            or msg.startswith((f"{k}:", f"{k}."))]


# ---------------------------------------------------------------- helpers
def _resolve(path: str | Path, folder: str) -> Path:
    """``path`` if it exists, else (a relative path) ``folder/<path>.yaml`` or
    ``folder/<path>`` (``folder`` relative to the working directory, as the shipped
    ``spaces/``, ``objectives/`` and ``sweeps/``); ``ConfigError`` naming the close matches
    among ``folder``'s names otherwise."""
    import difflib

    p = Path(path)
    if p.exists():
        return p
    if not p.is_absolute():
        for cand in (Path(folder) / f"{p}.yaml", Path(folder) / p):
            if cand.exists():
                return cand
    bare = not p.is_absolute() and len(p.parts) == 1 and p.suffix not in (".yaml", ".yml")
    if bare:  # a shipped name: the close ones among the folder's names
        names = sorted(f.stem for f in Path(folder).glob("*.yaml"))
        close = difflib.get_close_matches(p.name, names, n=3)
    else:  # a path: the close ones among the YAML files beside it
        names = sorted(f.name for f in p.parent.glob("*.y*ml")) if p.parent.is_dir() else []
        close = [str(p.parent / n) for n in difflib.get_close_matches(p.name, names, n=3)]
    msg = f"{path}: no such file" + (f", nor a name in {folder}/" if bare else "")
    if close:
        msg += f"; did you mean {close}?"
    if bare and names:
        msg += f" {folder}/ holds {names}"
    elif bare:
        msg += (f"; there is no {folder}/ folder in {Path.cwd()} (run from the repository "
                "root or give the file's path)")
    raise ConfigError(msg)


def _read_yaml(p: Path) -> Any:
    try:
        return yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{p}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(p)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{where}: not valid YAML: {problem}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: cannot read the file: {getattr(e, 'strerror', None) or e}") \
            from e


def reject_unknown_keys(data: Mapping, allowed: tuple[str, ...], path: str, where: str) -> None:
    stray = sorted(str(k) for k in set(data) - set(allowed))
    if stray:
        at = f" in `{where}`" if where else ""
        raise ConfigError(f"{path}: unknown field(s) {stray}{at}; allowed: {list(allowed)}")


def _parse_param(name: str, spec: Any, path: str) -> Param:
    where = f"params.{name}"
    if not isinstance(spec, Mapping) or "type" not in spec:
        raise ConfigError(
            f"{path}: field `{where}` must be a mapping with `type` one of {list(PARAM_TYPES)}"
        )
    kind = spec["type"]
    if kind not in PARAM_TYPES:
        raise ConfigError(
            f"{path}: field `{where}.type` must be one of {list(PARAM_TYPES)}, but got {kind!r}"
        )
    reject_unknown_keys(spec, _PARAM_KEYS[kind], path, where)
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices:
            raise ConfigError(f"{path}: field `{where}.choices` must be a non-empty list")
        for c in choices:
            if not (c is None or isinstance(c, str | int | float | bool)):
                raise ConfigError(
                    f"{path}: field `{where}.choices` allows str, int, float, bool or null, "
                    f"but got {c!r}"
                )
        if len(set(map(repr, choices))) != len(choices):
            raise ConfigError(f"{path}: field `{where}.choices` has duplicates: {choices}")
        return Param(name=name, type=kind, choices=tuple(choices))
    for k in ("low", "high"):
        v = spec.get(k)
        if not isinstance(v, int) or isinstance(v, bool):
            raise ConfigError(f"{path}: field `{where}.{k}` must be an integer, but got {v!r}")
    low, high = int(spec["low"]), int(spec["high"])
    if not low <= high:
        raise ConfigError(f"{path}: `low <= high` must hold for `{where}`, but got "
                          f"(low={low}, high={high})")
    if kind == "int":
        step = spec.get("step", 1)
        if not isinstance(step, int) or isinstance(step, bool) or step < 1:
            raise ConfigError(f"{path}: field `{where}.step` must be a positive integer, "
                              f"but got {step!r}")
        if (high - low) % step:
            raise ConfigError(f"{path}: `high - low` must be a multiple of `step` for "
                              f"`{where}` (so `high` is a value), but got low={low}, "
                              f"high={high}, step={step}")
        return Param(name=name, type=kind, low=low, high=high, step=step)
    base = spec.get("base", 0)
    if "base" in spec and (not isinstance(base, int) or isinstance(base, bool) or base < 2):
        raise ConfigError(f"{path}: field `{where}.base` must be an integer >= 2 (leave it out "
                          f"for any integer, log-uniform), but got {base!r}")
    if low < 1:
        raise ConfigError(f"{path}: `low >= 1` must hold for log_int `{where}`, but got {low}")
    param = Param(name=name, type=kind, low=low, high=high, base=base)
    if not param.values():
        raise ConfigError(f"{path}: `{where}` has no power of {base} in [{low}, {high}]")
    return param


def _check_mapping(value: Any, path: str, section: str) -> None:
    """``value`` (a space's ``section``) is absent or a mapping with string keys."""
    if value is None:
        return
    what = {"params": "name -> spec", "fixed": "config key -> value",
            "derived": "config key -> expression", "example": "param -> value"}[section]
    if not isinstance(value, Mapping):
        raise ConfigError(f"{path}: field `{section}` must be a mapping {what}, but got "
                          f"{type(value).__name__} {value!r:.60}")
    for k, v in value.items():
        if not isinstance(k, str):
            raise ConfigError(f"{path}: field `{section}` keys must be names, but got {k!r} "
                              f"(quote it in the YAML file)")
        if section == "derived" and (isinstance(v, bool) or not isinstance(v, str | int)):
            raise ConfigError(f"{path}: field `derived.{k}` must be an arithmetic expression, "
                              f"but got {v!r}")


def _names(value: Any, registry: Any, path: str, field_name: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigError(f"{path}: field `{field_name}` must be a list of names from "
                          f"{registry.names()}")
    for v in value:
        if not isinstance(v, str) or v not in registry:
            raise ConfigError(
                f"{path}: field `{field_name}` must list names from {registry.names()}, "
                f"but got {v!r}"
            )
    return [str(v) for v in value]


_BINOPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv,
}


def _expr_names(expr: str, where: str) -> set[str]:
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as e:
        raise ConfigError(f"{where}: cannot parse expression {expr!r}: {e.msg}") from None
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.BinOp):
            if type(node.op) not in _BINOPS:
                raise ConfigError(f"{where}: operators allowed are + - * / //, got {expr!r}")
        elif isinstance(node, ast.Constant):
            if not isinstance(node.value, int) or isinstance(node.value, bool):
                raise ConfigError(f"{where}: only integer constants allowed, got {expr!r}")
        elif not isinstance(node, ast.Expression | ast.operator | ast.Load):
            raise ConfigError(
                f"{where}: only names, integers, + - * / // and parentheses allowed, "
                f"got {expr!r}"
            )
    return names


def _eval_expr(expr: str, env: Mapping[str, Any]) -> Fraction:
    def ev(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant):
            return Fraction(int(node.value))  # type: ignore[arg-type]
        if isinstance(node, ast.Name):
            return Fraction(env[node.id])
        if isinstance(node, ast.BinOp):
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.FloorDiv):
                return Fraction(a // b)
            return Fraction(_BINOPS[type(node.op)](a, b))
        raise ValueError(expr)  # unreachable: _expr_names validated the tree

    return ev(ast.parse(expr, mode="eval"))
