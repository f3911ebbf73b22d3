"""Framework presets: what a training framework's code runs, as layout fields.

The validation records are simulated with what their framework's code did at the time: Megatron's
blocking pipeline transfers, torchtitan's op-level selective recompute and compiled loss,
Composer's FSDP1 gradient path, the attention kernel each ran... (``validation.
translate_training.framework_facts``, one sourced rule each). ``framework_layout`` applies the
same rules to a user's layout, so a plan for a Megatron-Core or torchtitan job is simulated the
way the accuracy report measured those frameworks (``docs/accuracy.md``). Fields the user set
(``keep``) are never overridden.

Example:
    >>> from charon_search import Layout, framework_layout, simulate_training
    >>> fl = framework_layout("llama-3.1-8b", Layout(dp=8, zero_stage=3, micro_batch_size=1,
    ...                       global_batch_size=8, seq_len=4096), "torchtitan")  # doctest: +SKIP
    >>> fl.layout.loss_kernel, fl.year  # doctest: +SKIP
    ('fused', 2025)
    >>> simulate_training("llama-3.1-8b", "h100-sxm-8gpu", fl.layout,
    ...                   memory_options=fl.memory_options).step_time_s  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from charon_search.errors import ConfigError

if TYPE_CHECKING:
    from charon_search.catalog.spec import ModelSpec
    from charon_search.layout import Layout

__all__ = ["DEFAULT_YEAR", "FRAMEWORKS", "YEARS", "FrameworkLayout", "check_preset_options",
           "framework_layout"]

#: Preset name -> the ``training.extra.framework`` of the validation records it follows.
FRAMEWORKS: dict[str, str] = {
    "megatron-lm": "Megatron-LM",
    "megatron-core": "Megatron-Core",
    "torchtitan": "torchtitan",
    "llm-foundry": "llm-foundry (Composer)",
}
#: The code year a preset describes when none is given: that of the latest validation records
#: of the framework the rules were checked against (rules that changed with a release key on
#: the year: Megatron-LM's 2021 and 2022 code, torchtitan's compiled loss and SAC save list from
#: 2025, its attention backend).
DEFAULT_YEAR: dict[str, int] = {"megatron-lm": 2022, "megatron-core": 2025, "torchtitan": 2025,
                                "llm-foundry": 2023}
#: Years a preset's rules describe. Megatron-LM's own model code (``megatron/model``, unfused
#: attention) is that of SC21 and Korthikanti et al.; Megatron from 2023 is ``megatron-core``.
YEARS: dict[str, tuple[int, int]] = {"megatron-lm": (2020, 2022), "megatron-core": (2023, 2026),
                                     "torchtitan": (2024, 2026), "llm-foundry": (2023, 2026)}
#: Presets none of whose rules key on the year (it is accepted, and the notes say so).
YEARLESS = ("megatron-core", "llm-foundry")


@dataclass(frozen=True, slots=True)
class FrameworkLayout:
    """A layout with a framework's facts applied (``framework_layout``)."""

    layout: Layout
    notes: tuple[str, ...]
    """One line per fact of the framework for this layout, with its source (as ``validate``
    prints assumptions), and a ``kept as set`` line for each the caller's own value overrides."""
    year: int
    """The code year the facts describe."""
    applied: Mapping[str, Any]
    """The ``Layout`` fields the preset set (their values)."""
    memory_options: Any
    """The framework's ``memory.report.MemoryOptions`` (state recipe, recompute policy, loss)."""


def check_preset_options(framework: str | None, *, year: Any = None, torch_compile: Any = None,
                         spelled: Mapping[str, str] | None = None) -> None:
    """A preset's options need their preset: ``framework_year`` and ``torch_compile`` a
    ``framework``, ``torch_compile`` torchtitan's (the other frameworks' facts do not depend on
    it). ``None`` is an option not given; ``spelled`` names the fields as the caller's input
    does (the CLI's flags), else by their config keys.

    Raises:
        ConfigError: naming the option and what it needs.
    """
    name = {"framework": "framework", "framework_year": "framework_year",
            "torch_compile": "torch_compile", **(spelled or {})}
    if framework is None:
        for key, value in (("framework_year", year), ("torch_compile", torch_compile)):
            if value is not None:
                raise ConfigError(f"`{name[key]}` applies only with `{name['framework']}`")
    elif torch_compile is not None and framework != "torchtitan":
        raise ConfigError(f"`{name['torch_compile']}` applies only with `{name['framework']} "
                          f"torchtitan`, but got {name['framework']} {framework}")


def framework_layout(model: ModelSpec | str, layout: Layout, framework: str, *,
                     year: int | None = None, torch_compile: bool = True,
                     keep: Iterable[str] = ()) -> FrameworkLayout:
    """``layout`` as ``framework``'s code of ``year`` runs it.

    Args:
        model: the ``ModelSpec`` or catalog name (multi-latent attention and the hidden size
            select some kernels).
        layout: the parallel layout; its degrees, batch, recompute and precision decide which
            facts apply.
        framework: a key of ``FRAMEWORKS``.
        year: the code's year (default ``DEFAULT_YEAR`` of the framework; ``YEARS`` bounds it).
        torch_compile: the job compiles its model (torchtitan: fused norms and the compiled
            loss; without it the eager RMSNorm and unfused kernels).
        keep: ``Layout`` fields the caller set explicitly; the preset leaves them alone.

    Raises:
        ConfigError: an unknown framework, or a layout the facts make invalid.
    """
    from charon_search.catalog import load_model
    from charon_search.validation import translate as _tr
    from charon_search.validation import translate_training as _tt
    from charon_search.validation.records import Record

    if framework not in FRAMEWORKS:
        raise ConfigError(f"`framework` must be one of {list(FRAMEWORKS)}, but got "
                          f"{framework!r}")
    lo, hi = YEARS[framework]
    if year is not None and (isinstance(year, bool) or not isinstance(year, int)
                             or not lo <= year <= hi):
        hint = " (later Megatron is 'megatron-core')" if framework == "megatron-lm" else ""
        raise ConfigError(f"`framework_year` of {framework!r} must be one of {lo}..{hi}{hint}, "
                          f"but got {year!r}")
    spec = load_model(model) if isinstance(model, str) else model
    given_year = year
    name, year = FRAMEWORKS[framework], year or DEFAULT_YEAR[framework]
    kept = set(keep)
    if framework == "megatron-lm":
        _check_megatron_lm(spec, layout, year)
    ex: dict[str, Any] = {"framework": name, "torch_compile": bool(torch_compile)}
    if framework == "torchtitan" and layout.recompute == "selective":
        ex["selective_ac_option"] = "op"  # torchtitan's train configs: per-op SAC
    if framework == "torchtitan" and "fp8_recipe" in kept:
        ex["float8_recipe"] = layout.fp8_recipe  # the torchao recipe the user names
    t: dict[str, Any] = {
        "tp": layout.tp, "pp": layout.pp, "vpp": layout.vpp, "cp": layout.cp, "ep": layout.ep,
        "schedule": layout.schedule,
        "sequence_parallel": layout.sequence_parallel, "zero_stage": layout.zero_stage,
        "recompute": layout.recompute, "precision": layout.precision, "extra": ex,
    }
    record = Record(
        id=f"{framework}-preset", source=f"{name} preset ({year})", kind="training",
        model={"catalog": spec.name, "hidden_size": spec.hidden_size,
               "model_type": (spec.hf_config or {}).get("model_type", ""),
               "extra": {"attention": "MLA" if spec.attention == "mla" else ""}},
        hardware={"num_gpus": layout.num_gpus}, config=t, measured={})
    notes: list[str] = []
    fields: list[frozenset[str]] = []  # the facts each note states
    facts = _tt.framework_facts(record, t, ex, notes, fields)

    def fact(field: str, value: Any, note: str) -> None:
        facts[field] = value
        notes.append(note)
        fields.append(frozenset({field}))

    if framework == "torchtitan" and not torch_compile:
        fact("fused_kernels", False,
             "torchtitan without torch.compile: norm/SwiGLU/RoPE kernels unfused")
    kernel = _tt.attention_kernel(record, ex, spec)
    if kernel is not None and layout.attention_kernel == "flash":
        fact("attention_kernel", kernel[0], f"attention kernel {kernel[0]!r} ({kernel[1]})")
    # Facts that follow a field the caller kept follow the caller's value: the fp8 GEMM kernel
    # of the kept recipe (cuBLASLt for per-tensor and rowwise scaling only), the SAC save list
    # only under op-level SAC.
    if "fp8_recipe" in kept and "fp8_gemm_kernel" in facts:
        facts["fp8_gemm_kernel"] = ("cublaslt" if layout.fp8_recipe in _tt.CUBLASLT_FP8_RECIPES
                                    else "cutlass")
    policy = layout.selective_policy if "selective_policy" in kept else facts.get(
        "selective_policy", layout.selective_policy)
    if policy != "op":
        facts.pop("sac_saves_reduce_scatter", None)
    applied = {k: v for k, v in facts.items() if k not in kept}
    overridden = {k: v for k, v in facts.items() if k in kept and getattr(layout, k) != v}
    # A note stays while one of the facts it states holds: the notes of facts the caller
    # overrode, or that a kept field dropped (the SAC save list), give way to "kept as set".
    notes = [n for n, f in zip(notes, fields, strict=True)
             if not f or f & (facts.keys() - overridden.keys())]
    notes += [f"kept as set: {k}={getattr(layout, k)!r} (the framework's would be {v!r})"
              for k, v in overridden.items()]
    if given_year is not None and framework in YEARLESS:
        notes.append(f"framework_year {year}: no fact of the {framework} preset depends on the "
                     f"year ({YEARS[framework][0]}-{YEARS[framework][1]} alike)")
    try:
        out = layout.replace(**applied)
    except ConfigError as e:
        raise ConfigError(f"framework {framework!r}: {e}") from e
    memory = _tr.framework_memory_options(ex, out)
    # the memory model follows the caller's recompute policy and loss kernel where kept
    if "selective_policy" in kept:
        memory = dataclasses.replace(memory, selective_policy=None)
    if "loss_kernel" in kept:
        memory = dataclasses.replace(memory, loss_impl=None)
    return FrameworkLayout(layout=out, notes=tuple(notes), year=year, applied=applied,
                           memory_options=memory)


def _check_megatron_lm(spec: ModelSpec, layout: Layout, year: int) -> None:
    """Megatron-LM's own model code of 2020-22 (``megatron/model``): dense GPT layers with TP,
    PP (1F1B, interleaved), data parallelism with the distributed optimizer (ZeRO-1, 2022) and
    fp16/bf16. What it did not have is a ``ConfigError`` naming the field."""
    why = ("MoE layers" if spec.num_experts or layout.ep > 1 else
           "multi-latent attention" if spec.attention == "mla" else
           f"cp={layout.cp} (context parallelism)" if layout.cp > 1 else
           f"precision={layout.precision!r}" if layout.precision == "fp8" else
           f"zero_stage={layout.zero_stage}" if layout.zero_stage > (1 if year >= 2022 else 0)
           else f"schedule={layout.schedule!r}" if layout.schedule in ("dualpipe", "zero-bubble")
           else "")
    if why:
        raise ConfigError(f"`framework` 'megatron-lm' ({year}) ran dense fp16/bf16 GPT layers "
                          f"with TP, PP (1F1B, interleaved) and DP, not {why}; use "
                          "'megatron-core' for later Megatron")
