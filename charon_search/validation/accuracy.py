"""Accuracy report (``docs/accuracy.md``) from a ``validate --json`` output.

Markdown with: the summary per metric group against the targets, a table per source, log-log
scatter plots of predicted vs measured per kind (matplotlib PNGs), the largest errors, and the
list of what is not yet expressible (reasons with counts; published records by id).
"""

from __future__ import annotations

import math
import os
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from charon_search.validation.ranking import pareto_sentence, verify_sentence
from charon_search.validation.report import block_table_rows, format_pct, summary_table_rows
from charon_search.validation.runner import ValidationResult
from charon_search.validation.stats import (
    METRIC_GROUPS,
    error_stats,
    grouped_summary,
    representative_rows,
    request_latency_rows,
)

#: Panels per kind in the scatter figure.
MAX_PANELS = 6

__all__ = ["check_calibration", "render_accuracy", "scatter_plots"]


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c).replace("|", "/") for c in r) + " |" for r in rows]
    return "\n".join(out)


def scatter_plots(result: ValidationResult, img_dir: Path) -> dict[str, Path]:
    """One log-log predicted-vs-measured PNG per kind (points coloured by metric group)."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, MaxNLocator, NullFormatter, NullLocator

    img_dir.mkdir(parents=True, exist_ok=True)
    by_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in result.rows:
        kind = result.cases.get(r["id"], {}).get("kind", "training")
        by_kind[kind].append(r)
    out = {}
    for kind, rows in sorted(by_kind.items()):
        # One panel per metric (a record counted once per metric group), so every panel has
        # one unit; the most populated metrics first.
        groups: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
        for rep in representative_rows(rows):
            groups[rep["metric"]].append(rep)
        groups = dict(sorted(groups.items(), key=lambda kv: -len(kv[1]))[:MAX_PANELS])
        ncols = min(3, len(groups))
        nrows = -(-len(groups) // ncols)
        fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 4.0 * nrows),
                                 squeeze=False)
        for ax in axes.flat[len(groups):]:
            ax.set_visible(False)
        for ax, (g, grows) in zip(axes.flat, groups.items()):
            xs = [r["measured"] for r in grows]
            ys = [r["predicted"] for r in grows]
            ax.scatter(xs, ys, s=10, alpha=0.6)
            lo, hi = min(xs + ys), max(xs + ys)
            ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
            for f in (0.9, 1.1):
                ax.plot([lo, hi], [lo * f, hi * f], "k:", lw=0.6)
            ax.set_xscale("log")
            ax.set_yscale("log")
            for axis in (ax.xaxis, ax.yaxis):
                axis.set_minor_formatter(NullFormatter())
                if hi < 10 * lo:  # within a decade: a few plain ticks (at most one power of 10)
                    axis.set_major_locator(MaxNLocator(nbins=4))
                    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g}"))
                    axis.set_minor_locator(NullLocator())
            ax.set_xlabel("measured")
            ax.set_ylabel("predicted")
            ax.set_title(f"{kind}: {g} (n={len(grows)})", fontsize=9)
        fig.tight_layout()
        path = img_dir / f"accuracy_{kind}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        out[kind] = path
    return out


def _log_err(x: float) -> str:
    """A median |log(pred/meas)| with the relative error it corresponds to."""
    return f"{x:.3f} ({math.expm1(x) * 100:.1f} %)" if math.isfinite(x) else "-"


def _fitted(values: Mapping[str, float]) -> str:
    """``name = value`` pairs in the unit the name carries (bytes as GiB, seconds as ms, or as
    us below a millisecond)."""
    def one(k: str, v: float) -> str:
        if k.endswith("_bytes"):
            return f"{k} = {v / 2**30:g} GiB"
        if k.endswith("_s"):
            return (f"{k} = {v * 1e6:g} us" if 0 < v < 1e-3 else f"{k} = {v * 1e3:g} ms")
        return f"{k} = {v:g}"
    return ", ".join(one(k, float(v)) for k, v in values.items())


#: Fields of a ``leave_one_source_out`` row of a ``calibrate`` output (all but ``held_out`` and
#: ``values`` are numbers).
_LOSO_FIELDS = ("held_out", "train_records", "test_records", "values",
                "train_median_abs_log_error", "test_median_abs_log_error",
                "test_median_abs_log_error_uncalibrated")


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _values_problem(values: Any) -> str:
    """Why ``values`` is not a mapping of parameter name -> number ("" when it is)."""
    if not isinstance(values, Mapping):
        return f"is {type(values).__name__} {values!r:.60}"
    bad = next((k for k, v in values.items() if not _is_number(v)), None)
    return "" if bad is None else f"has {bad!r}: {values[bad]!r:.60}, not a number"


def check_calibration(cal: Any, where: str) -> None:
    """Check the shape of a ``charon-search calibrate`` output before reporting it.

    ``fit`` must be a mapping whose ``values`` map parameter names to numbers (``objective``,
    ``uncalibrated_objective``, ``num_records``, ``evaluations`` numbers and ``sources`` a list,
    when present); ``leave_one_source_out`` (optional) a list of mappings with the keys
    ``_LOSO_FIELDS``; ``kind`` (optional) ``training`` or ``serving``; ``holdout_by``
    (optional) one of ``calibration.HOLDOUT_GROUPS``.

    Raises:
        ConfigError: naming ``where`` and the first bad field.
    """
    from charon_search.errors import ConfigError
    from charon_search.validation.calibration import HOLDOUT_GROUPS

    shape = ("the YAML written by `charon-search calibrate` (keys fit, leave_one_source_out)")
    if not isinstance(cal, Mapping) or "fit" not in cal:
        raise ConfigError(f"{where} must be {shape}")
    fit = cal["fit"]
    if not isinstance(fit, Mapping):
        raise ConfigError(f"{where}: `fit` must be a mapping with `values` (parameter -> "
                          f"number), but got {type(fit).__name__} {fit!r:.60}; it must be "
                          f"{shape}")
    why = _values_problem(fit.get("values") or {})
    if why:
        raise ConfigError(f"{where}: `fit.values` must map parameter names to numbers, but it "
                          f"{why}")
    for k in ("objective", "uncalibrated_objective", "num_records", "evaluations"):
        if k in fit and not _is_number(fit[k]):
            raise ConfigError(f"{where}: `fit.{k}` must be a number, but got {fit[k]!r:.60}")
    if "sources" in fit and not isinstance(fit["sources"], list):
        raise ConfigError(f"{where}: `fit.sources` must be a list of source names, but got "
                          f"{fit['sources']!r:.60}")
    kind = cal.get("kind")
    if kind is not None and kind not in ("training", "serving"):
        raise ConfigError(f"{where}: `kind` must be one of ['training', 'serving'], but got "
                          f"{kind!r:.60}")
    by = cal.get("holdout_by", "source")
    if by not in HOLDOUT_GROUPS:
        raise ConfigError(f"{where}: `holdout_by` must be one of {list(HOLDOUT_GROUPS)}, but "
                          f"got {by!r:.60}")
    loso = cal.get("leave_one_source_out", [])
    if not isinstance(loso, list):
        raise ConfigError(f"{where}: `leave_one_source_out` must be a list of held-out fits "
                          f"({{{', '.join(_LOSO_FIELDS)}}}), but got {type(loso).__name__} "
                          f"{loso!r:.60}")
    for i, row in enumerate(loso):
        what = f"{where}: `leave_one_source_out[{i}]`"
        if not isinstance(row, Mapping):
            why = f"is {type(row).__name__} {row!r:.60}"
        elif missing := [k for k in _LOSO_FIELDS if k not in row]:
            why = f"lacks {', '.join(missing)}"
        elif bad := next((k for k in _LOSO_FIELDS[1:] if k != "values"
                          and not _is_number(row[k])), None):
            why = f"has `{bad}` {row[bad]!r:.60}, not a number"
        elif values_why := _values_problem(row["values"]):
            why = f"has `values` that {values_why}"
        else:
            continue
        raise ConfigError(f"{what} {why}; each held-out fit must be a mapping "
                          f"{{{', '.join(_LOSO_FIELDS)}}} (values: parameter -> number, the "
                          "others numbers but held_out)")


def _calibration_section(cal: Mapping[str, Any]) -> list[str]:
    fit = cal.get("fit", {})
    values = _fitted(fit.get("values") or {})
    # The kind and the fitted names tell apart several calibration files of one kind.
    kind = (f", {cal['kind']}: {', '.join(fit.get('values') or {})}" if cal.get("kind")
            else "")
    loso = cal.get("leave_one_source_out", [])
    group = cal.get("holdout_by", "source")  # calibration.HOLDOUT_GROUPS
    wins = sum(r["test_median_abs_log_error"] < r["test_median_abs_log_error_uncalibrated"]
               - 1e-4 for r in loso)
    plural = "GPUs" if group == "gpu" else f"{group}s"
    verdict = (f" Held out, the fit beats the shipped specs on {wins} of {len(loso)} {plural}."
               if loso else "")
    lines = [f"## Calibration (leave-one-{group}-out{kind})", "",
             f"`charon-search calibrate` fitted {values} as one vector shared by every cluster, "
             f"on {fit.get('num_records')} development records of "
             f"{', '.join(fit.get('sources', []))} ({fit.get('evaluations')} parameter vectors "
             f"tried): median |log(pred/meas)| {_log_err(fit.get('objective', math.nan))}"
             + (f" against {_log_err(fit['uncalibrated_objective'])} as shipped"
                if "uncalibrated_objective" in fit else "") + ". "
             f"Each row below fits on all other {plural} and tests on the held-out one; "
             f"*shipped* is the held-out {group} under the cluster specs as the run found them. "
             "Errors are median |log(pred/meas)| with the relative error they correspond to."
             + verdict, ""]
    rows = [[r["held_out"], r["train_records"], r["test_records"],
             _fitted(r["values"]),
             _log_err(r["train_median_abs_log_error"]), _log_err(r["test_median_abs_log_error"]),
             _log_err(r["test_median_abs_log_error_uncalibrated"])]
            for r in loso]
    lines += [_md_table([f"held-out {group}", "train n", "test n", "fitted on the others",
                         "train", "test (fitted)", "test (shipped)"], rows), ""]
    return lines


def _request_latency_section(result: ValidationResult) -> list[str]:
    """Mean request latency (TTFT + (output_len - 1) x TPOT) next to the TTFT/TPOT split."""
    e2e = request_latency_rows(result.rows, result.cases)
    if not e2e:
        return []
    split: dict[tuple[str, str], float] = {(r["id"], r["metric"]): r["error"]
                                           for r in result.rows
                                           if r["metric"] in ("ttft_s", "tpot_s")}

    def row(label: str, ids: set[str]) -> list[Any]:
        errs = [r["error"] for r in e2e if r["id"] in ids]
        st = error_stats(errs)
        bias = {m: error_stats([split[(i, m)] for i in ids])["bias"]
                for m in ("ttft_s", "tpot_s")}
        return [label, st["n"], format_pct(st["median_abs"]), format_pct(st["p90_abs"]),
                format_pct(st["bias"], signed=True), format_pct(bias["ttft_s"], signed=True),
                format_pct(bias["tpot_s"], signed=True)]

    ids = {r["id"] for r in e2e}
    groups: dict[str, set[str]] = defaultdict(set)
    for i in ids:
        c = result.cases.get(i, {})
        groups[f"{c.get('source', '')} · {c.get('model', '')}"].add(i)
    rows = [row("all", ids)] + [row(k, v) for k, v in sorted(groups.items())
                                if len(v) >= 5]
    return ["## Serving request latency (derived)", "",
            "Mean request latency E2E = TTFT + (output_len − 1) × TPOT, computed the same way "
            "from the measured and the predicted pair (exact for the silicon rows' fixed output "
            "lengths; by Little's law a closed loop's throughput is concurrency / E2E). It shows "
            "how much work the simulator prices; the TTFT and TPOT bias columns show how it "
            "splits that work between the first token and the rest. Groups of at least 5 "
            "records.", "",
            _md_table(["records", "n", "E2E median abs", "E2E p90 abs", "E2E bias",
                       "TTFT bias", "TPOT bias"], rows), ""]


def _engine_build_section(result: ValidationResult, header: Sequence[str]) -> list[str]:
    """The serving rows per engine and engine build (``validate --group-by engine
    engine_version``): one engine's rows measured on different builds can differ by more than
    the model's error, and the builds the simulator fits show apart from those it does not."""
    cases = {i: c for i, c in result.cases.items() if c.get("kind") == "serving"}
    rows = [r for r in result.rows if r["id"] in cases]
    if not rows or not any(c.get("engine_version") for c in cases.values()):
        return []
    groups = grouped_summary(rows, cases, ["engine", "engine_version"])["groups"]
    return ["## Serving per engine build", "",
            "The serving rows per engine and the engine version the row names (`-`: not "
            "stated), as `charon-search validate --group-by engine engine_version` prints "
            "them.", "", _md_table(["engine / version", *header[1:]], block_table_rows(groups)),
            ""]


def _ordering_section(ordering: Mapping[str, Any]) -> list[str]:
    """How well the serving configurations of one workload are ordered
    (``ranking.configuration_ordering``)."""
    if not ordering:
        return []
    rows = []
    for metric, c in ordering["concordance"].items():
        eq = c.get("equal_concurrency") or {}
        rows.append([metric, c["groups"], c["pairs"], format_pct(c["fraction"]),
                     eq.get("pairs", "-"),
                     format_pct(eq["fraction"]) if eq else "-"])
    out = ["## Ordering of serving configurations", "",
           "A search ranks configurations by their simulated metrics and verifies the best on "
           "hardware, so what it needs is the order, not the absolute value. A workload is a "
           "model with an input and an output length; its configurations differ in GPU, "
           "engine, layout and concurrency. A pair counts when its measured values are at least "
           f"{ordering['min_gap']:.0%} apart (the measurements' run-to-run spread is a few per "
           "cent); *concordant* pairs are ordered the same way by the simulation. Throughput per "
           "GPU is derived on both sides as concurrency x output length / (TTFT + (output "
           "length - 1) x TPOT) / GPUs (`validation.ranking`).", "",
           _md_table(["metric", "workloads", "pairs", "concordant", "pairs at equal "
                      "concurrency", "concordant"], rows), ""]
    for sentence in (pareto_sentence(ordering), verify_sentence(ordering)):
        out += [sentence, ""] if sentence else []
    return out


def _bands_section(result: ValidationResult, generated_at: str) -> list[str]:
    """The validated error bands of this run (``validation.bands``)."""
    from charon_search.validation.bands import MIN_GROUP_ROWS, compute_bands, render_bands

    doc = compute_bands({"records": result.rows, "cases": result.cases,
                         "generated_at": generated_at})
    if not doc["bands"]:
        return []
    return ["## Validated error bands", "",
            "Quantiles r_q of measured / predicted (of the implied step time for a throughput "
            "metric), one row per record and metric group: a measurement fell at or below "
            "r_q x the prediction in a fraction q of the rows. Serving groups are the engine "
            f"and deployment mode with at least {MIN_GROUP_ROWS} rows, the engine, and all "
            "engines. `charon-search accuracy --bands FILE` writes them as JSON; the shipped "
            "copy (`charon_search/data/validation/error_bands.json`) gives `charon-search "
            "serve` its error lines and an objective's `guard: q` its margins. The serving "
            "rows compare benchmark means, so a guard applies the mean's ratio to whichever "
            "percentile a constraint names; the bands are the errors as measured, tails and "
            "all: a group holding the unexplained rows of *Largest errors* has a wide "
            "r90 and r95.", "",
            render_bands(doc), "", *_coverage_lines(result)]


def _coverage_lines(result: ValidationResult) -> list[str]:
    """Held-out coverage of the bands (``validation.bands.held_out_coverage``)."""
    from charon_search.validation.bands import held_out_coverage

    levels = (0.5, 0.9, 0.95)
    cov = held_out_coverage({"records": result.rows, "cases": result.cases}, levels)
    if not cov:
        return []
    head = [f"within r{round(q * 100)}" for q in levels]
    rows = [[fam, str(v["n"]), *(format_pct(v["within"][q]) for q in levels)]
            for fam, v in cov.items()]
    per = [[fam, src, str(a["n"]), format_pct(a["within"][0.9])]
           for fam, v in cov.items() for src, a in sorted(v["by_source"].items())
           if a["n"] >= 10]
    return ["Held out, leave one source out: the bands recomputed without a source, and the "
            "fraction of that source's rows whose measured / predicted is at or below their "
            "group's r_q. A band that carries to measurements it did not see holds about q "
            "of them.", "",
            _md_table(["family", "rows", *head], rows), "",
            "Per source (sources with at least 10 rows), within r90:", "",
            _md_table(["family", "source", "rows", "within r90"], per), ""]


def render_accuracy(result: ValidationResult, *, img_dir: Path | None = None,
                    img_rel: str = "img", command: str = "",
                    calibration: Sequence[Mapping[str, Any]] = (),
                    generated_at: str = "") -> str:
    """The markdown of ``docs/accuracy.md`` (plots written to ``img_dir`` when given)."""
    s = result.summary
    t = s.get("totals", {})
    origins = Counter(str(c.get("origin")) for c in result.cases.values())
    lines = ["# Accuracy against measured hardware", ""]
    if command:
        when = f" (validate run of {generated_at})" if generated_at else ""
        lines += [f"Generated by `{command}` from the output of `charon-search validate`{when}. "
                  "The simulators change as their owners work: regenerate with "
                  "`charon-search validate --json validate.json` and this command.", ""]
    if result.coverage:
        lines += ["Coverage of this report (merged validate runs):", ""]
        lines += [f"- {c}" for c in result.coverage] + [""]
    lines += [
        f"Records: {t.get('records')} (expressed {t.get('expressed')}, not expressible "
        f"{t.get('skipped')}); predicted metrics: {t.get('predicted_metrics')}. "
        "error = (predicted − measured) / measured. Statistics count one metric per record and "
        "metric group (throughput, MFU and TFLOP/s of a record are one step time). "
        "*Fully specified*: confidence high/medium and no batch/schedule/layout field assumed.",
        "", "## Method", "",
        f"- Records: {origins.get('published', 0)} published training and serving measurements "
        "(SCHEMA.md; the shipped ones are `charon_search/data/validation/published-dev.yaml`, "
        f"SOURCES.md) and {origins.get('silicon', 0)} measured serving rows in the layout of "
        "`silicon_sample.csv` (the shipped copy: 3131 points of aiconfigurator-core 0.12.0, "
        "Apache-2.0), one source per serving engine and measurement pipeline: "
        "aiconfigurator's gap-analysis sweeps (aiperf) and the InferenceX dumps, whose clients "
        "and launch recipes differ.",
        "- Names: HF ids map to catalog models (`names.yaml`, then the catalog's aliases); GPU "
        "keys to GPU specs; the cluster of each record is chosen by GPU, kind, interconnect and "
        "GPU count and printed per record (`cases.<id>.cluster` in the JSON).",
        "- Training: the record's layout becomes a `Layout`; `null` fields are filled with a "
        "stated assumption. Throughput, TFLOP/s and MFU/HFU are all derived from the predicted "
        "step time with the record's `flop_convention` (SC21, Korthikanti 2022, Megatron-Core, "
        "llm-foundry, Llama 3, PaLM closed forms in `validation/flops.py`), so FLOPs are counted "
        "the way the source counted them. Memory metrics come from the memory model "
        "(`peak_memory_bytes` = peak reserved) with the framework's conventions "
        "(`MemoryOptions.for_framework`). What a record says its framework ran becomes a layout "
        "field, never a fitted factor: Megatron-LM 2021/22 (SC21, Korthikanti) unfused attention "
        "(`attention_kernel='eager'`), torchtitan `selective_ac_option: op` "
        "(`selective_policy='op'`), the fp8 scaling recipe (torchao tensorwise/rowwise, "
        "Transformer Engine delayed, block-scaled for MXFP8 and DeepSeek-V3), DualPipe's "
        "all-to-all overlap (`moe_a2a_overlap`), deduplicating EP dispatch (DeepSeek's own "
        "kernels and Megatron-Core's flex dispatcher send a token once per target node and "
        "rank, not once per routed expert: `ep_node_dedup`) and DeepSeek-V3's fp8 dispatch "
        "(`ep_dispatch_fp8`), llm-foundry's Composer FSDP1 backward "
        "prefetch (`BACKWARD_POST`: each backward all-gather after the layer's gradients, "
        "queued with the reduce-scatters; `fsdp_backward_prefetch='post'`) and its FlatParameter "
        "gradient path (concatenated, cast to the reduce dtype and pre-divided before each "
        "reduce-scatter: `fsdp_flat_grad`, `grad_reduce_dtype`), Megatron-LM's code of the "
        "source's year (2022: apex's persistent LayerNorm, `norm_impl='persistent'`; the SP "
        "re-gather of the column linears' saved input, `sp_wgrad_regather`; 2021: the "
        "synchronous TP backward all-reduce, `tp_async_allreduce=False`, and the "
        "per-micro-batch gradient-buffer add, `grad_accum_hook`; from 2022 the same hook "
        "over the embedding and norm gradients the fused wgrad GEMMs do not add, "
        "`embedding_grad_hook`), Megatron's pipeline transfers that block the sending "
        "stage (`pp_p2p_blocking`; Megatron-LM always, Megatron-Core without interleaving) and "
        "Megatron-LM's scatter/gather of them without SP (`pp_scatter_gather`), "
        "Megatron-Core's fused MLA RoPE kernels (`mla_rope_fusion`), the fused cross "
        "entropy of llm-foundry's MPT (flash-attn's kernel, its default `loss_fn`) and of "
        "torchtitan's compiled loss from 2025 (`loss_kernel='fused'`), and which fused "
        "attention kernel it ran (`attention_kernel`). On H100/H200/H800 that kernel's "
        "forward and backward are priced "
        "from dense cuDNN and FlashAttention-2 kernels this project measured on an H200 "
        "(`sim.train_attention`, `data/profiles/measured/README.md`), not from the serving "
        "prefill rows. The same rules are the framework presets a user's layout can take "
        "(`charon-search train --framework megatron-core`, `memory --framework`, a training "
        "space's `framework` key; `frameworks.framework_layout`).",
        "- Collectives (training and serving): a collective whose ranks all sit in one "
        "NVLink node is priced from the profile DB's measured NCCL rows for that GPU and group "
        "size (log-log interpolation, `cost.measured_collectives`); groups across nodes, PCIe "
        "boxes and GPUs without rows use the α-β topology model with the cluster's fitted "
        "tiers.",
        "- Serving (silicon rows): the row's benchmark client as it ran "
        "(`serving.backends.BenchmarkProtocol`): a closed loop at the row's concurrency C, all "
        "streams starting together; aiconfigurator's aiperf rows drain their 2 x C warm-up "
        "requests, so the 50 x C measured ones start on an idle engine, and draw their prompts "
        "from aiperf's default pool of 100 (a repeated prompt is a prefix-cache hit on an "
        "engine launched with prefix caching; aiconfigurator's launches turn it off); "
        "InferenceX rows draw "
        "lengths from [0.8 x len, len] and average every request from the idle start (10 x C); "
        "both average every measured request, at most max(1024, 2 x C) of them simulated. "
        "SGLang's --stream-interval k delivers the first token with the k-th (TTFT and TPOT as "
        "the client measures them), and its --scheduler-recv-interval R (InferenceX's "
        "DeepSeek-R1 Blackwell recipes) lets the scheduler take new requests only every R "
        "decode-only batches, at once after a prompt batch or when idle. A run cut short of "
        "the benchmark's last turn is "
        "followed by one more simulated turn during which arrivals stop: it stands for the "
        "benchmark's own draining last turn, so the turns before it keep the full load. The "
        "engine's scheduler facts come from its launch "
        "recipe (`serving.backends.engine_profile`), including the overlap schedulers of "
        "TensorRT-LLM, SGLang and vLLM async scheduling (vLLM's default from 0.14), which "
        "form batch n + 1 while batch n runs. Quantized checkpoints run the kernels their "
        "launch picks: per-module precision from the checkpoint's quantization config "
        "(fp8 blocks, MXFP4, W4A16 int4), Marlin, MXFP8-activation or vLLM's Triton fused MoE "
        "kernels where a recipe or the engine's Blackwell default says so (vLLM's own default "
        "block-fp8 MoE on Blackwell is FlashInfer's), NVFP4 dense GEMMs and routed experts "
        "from measured NVFP4 rows (each engine's TRT-LLM-gen MoE kernels on Blackwell; "
        "TensorRT-LLM dispatches NVFP4 activations under attention DP with EP); decode and "
        "prompt attention over an fp8 KV cache run each engine's measured fp8-cache kernels "
        "(FlashAttention 3, SGLang's fa3 / trtllm_mha, TensorRT-LLM's XQA and MLA kernels), "
        "which take 0.5-0.9x their bf16 time in decode, not a uniform half; SGLang's "
        "wide EP (attention DP with expert parallelism) runs DeepEP's low-latency MoE up to "
        "128 tokens per rank (decode) and DeepEP's normal mode into "
        "DeepGEMM's contiguous grouped GEMM beyond (prefill), each from its measured rows; "
        "SGLang's default chunked-prefill size is 8192 tokens below 160 GiB of GPU memory and "
        "16384 from there. TP all-reduces run the engines' measured "
        "custom NVLink kernels inside a node (TensorRT-LLM's also across the trays of an NVL72 "
        "domain, from the HGX table of the same NVLink generation). "
        "TensorRT-LLM's attention-DP launches hold prompts until every rank has one "
        "(`attention_dp_config` balance, at most `timeout_iters` steps). A served "
        "TensorRT-LLM iteration that carries prompt tokens adds the cluster's calibrated "
        "host time (`prefill_iteration_overhead`, fitted; its leave-one-source-out check is "
        "below). The engine's own server adds its calibrated host times on the way in "
        "(`frontend_latency`, `frontend_prompt_token`) and on the way out: it hands every "
        "streaming request one chunk per output cycle, tokens emitted meanwhile merging into "
        "the next cycle's chunk, so each token reaches its client about a cycle "
        "(streams x `frontend_output_stream`) late (fitted on H100/H200, checked on the x86 "
        "Blackwell rows). Disaggregated rows use the row's prefill/decode pools. Their first "
        "token reaches the client from the decode pool (as the request joins under SGLang, "
        "with its first decode step under vLLM and TensorRT-LLM) once the KV has arrived and "
        "the engine's calibrated hand-over time has passed (`disagg_handoff`: KV "
        "pre-allocation, handshake, completion notice; fitted on the Grace NVL72 rows and "
        "checked on the x86 rows, and the other way round); an "
        "aggregated row "
        "whose client concurrency is k times its batch (per attention-DP rank) ran k workers "
        "behind the router, and one of them is simulated at its share. Rows of the "
        "2026-04-06 InferenceX dump that write an expert-parallel launch's degrees as TP x EP "
        "(`tpX_epY` as tp_size X*Y) or as attention DP (vLLM `tpX_epX` as X attention-DP "
        "ranks and EP X*X) are read as the launch ran, from the row id or, beyond one 8-GPU "
        "node, from the columns (their `cfg` twins repeat the measurements exactly); each "
        "record states the reading. Published TRT-LLM rows: "
        "trtllm-bench's own limits and request counts, all submitted at t = 0 (offline "
        "throughput).",
        "- Calibration: `charon-search calibrate` fits only unpublished physical parameters, "
        "shared by all clusters, on development records, and reports leave-one-source-out "
        "train/test error. The tables below use the cluster specs as shipped; the calibration "
        "sections at the end (when the report was given `--calibration`) show what a fit "
        "would change and whether it carries over to a source it did not see.",
        "", "## Summary against the targets", "",
    ]
    rows = []
    for g in METRIC_GROUPS:
        tgt = s.get("targets", {}).get(g, {})
        for label, key in (("all", "by_group"), ("fully specified", "by_group_fully_specified")):
            st = s.get(key, {}).get(g)
            if not st or not st.get("n"):
                continue
            rows.append([g, label, st["n"], format_pct(st["median_abs"]),
                         format_pct(st["p90_abs"]), format_pct(st["max_abs"]),
                         format_pct(st["bias"], signed=True),
                         f"{format_pct(tgt.get('median_abs'))} / {format_pct(tgt.get('p90_abs'))}"
                         if tgt else "-"])
    lines += [_md_table(["metric group", "records", "n", "median abs", "p90 abs", "max abs",
                         "bias", "target median / p90"], rows), ""]
    lines += _request_latency_section(result)
    lines += _ordering_section(s.get("ordering") or {})
    header = ["", "expressed", "metric group", "n", "median abs", "p90 abs", "max abs", "bias"]
    lines += ["## Per kind", "", _md_table(header, summary_table_rows(s, "by_kind")), ""]
    lines += ["## Per source", "", _md_table(header, summary_table_rows(s, "by_source")), ""]
    if s.get("by_gpu"):
        lines += ["## Per GPU", "", _md_table(header, summary_table_rows(s, "by_gpu")), ""]
    if s.get("by_model"):
        lines += ["## Per model (expressibility and error)", "",
                  _md_table(header, summary_table_rows(s, "by_model")), ""]
    lines += _engine_build_section(result, header)
    if img_dir is not None and result.rows:
        plots = scatter_plots(result, img_dir)
        lines += ["## Predicted vs measured", ""]
        for kind, path in plots.items():
            lines += [f"![{kind}]({img_rel}/{path.name})", ""]
    published = [r for r in result.rows
                 if result.cases.get(r["id"], {}).get("origin") == "published"]
    if published:
        lines += ["## Published records", ""]
        rows = []
        for r in published:
            c = result.cases.get(r["id"], {})
            rows.append([r["id"], r["metric"], f"{r['measured']:.4g}", f"{r['predicted']:.4g}",
                         format_pct(r["error"], signed=True), c.get("cluster", ""),
                         "yes" if c.get("fully_specified") else "no"])
        lines += [_md_table(["id", "metric", "measured", "predicted", "error", "cluster",
                             "fully specified"], rows), ""]
    for cal in calibration:
        lines += _calibration_section(cal)
    worst = sorted(result.rows, key=lambda r: -abs(r["error"]))[:15]
    if worst:
        lines += ["## Largest errors", ""]
        lines += [_md_table(["id", "metric", "measured", "predicted", "error"],
                            [[r["id"], r["metric"], f"{r['measured']:.4g}",
                              f"{r['predicted']:.4g}", format_pct(r["error"], signed=True)]
                             for r in worst]), ""]
    repeats = sorted((rid, c["repeats"], bool(c.get("repeats_same_setup")))
                     for rid, c in result.cases.items() if c.get("repeats"))
    if repeats:
        other = [r for r in repeats if not r[2]]
        lines += ["## Repeated measurements", "",
                  f"{len(repeats)} records repeat every measured value of an earlier record "
                  f"({len(repeats) - len(other)} under the same setup: one run shipped twice; "
                  f"{len(other)} under another model or configuration: one of the two labels is "
                  "probably wrong). All are predicted and counted above, as shipped.", ""]
        if other:
            lines += [_md_table(["record", "repeats"], [[f"`{a}`", f"`{b}`"]
                                                        for a, b, _ in other]), ""]
    r2r = s.get("run_to_run", {})
    if r2r:
        lines += ["## Run-to-run spread of the measurements", "",
                  "Records that ran an earlier record's setup again on another day (same model, "
                  "GPUs, engine version, lengths, concurrency and layout; another measured date; "
                  "other values) show how far the hardware's own numbers move between runs: "
                  "spread = |a − b| / mean(a, b) per pair (`records.independent_reruns`, "
                  "`reruns` in the JSON cases). A prediction at the mean of two runs would be "
                  "off each by half their spread; the last columns are the simulator's errors "
                  "on the records of the pairs.", ""]
        lines += [_md_table(
            ["group", "pairs", "spread median", "spread p90", "spread max", "records",
             "prediction median abs", "prediction p90 abs"],
            [[g, str(v["pairs"]), format_pct(v["median"]), format_pct(v["p90"]),
              format_pct(v["max"]), str(v["records"]), format_pct(v["error_median_abs"]),
              format_pct(v["error_p90_abs"])] for g, v in r2r.items()]), ""]
    lines += _bands_section(result, generated_at)
    lines += ["## Not yet expressible", ""]
    reasons = Counter(x["reason"] for x in result.skipped)
    lines += [_md_table(["records", "reason"], [[str(n), reason] for reason, n in
                                                reasons.most_common()]) if reasons else
              "Every record of the run is expressed.", ""]
    pub_skips = [x for x in result.skipped
                 if result.cases.get(x["id"], {}).get("origin") == "published"]
    if pub_skips:
        lines += ["Published records not expressed:", ""]
        lines += [f"- `{x['id']}`: {x['reason']}" for x in pub_skips]
        lines += [""]
    metric_skips = Counter((x["metric"], x["reason"]) for x in result.skipped_metrics)
    if metric_skips:
        lines += ["Metrics of expressed records that are not predicted:", ""]
        lines += [_md_table(["metric", "records", "reason"],
                            [[m, str(n), reason]
                             for (m, reason), n in metric_skips.most_common()]),
                  ""]
    return "\n".join(lines)
