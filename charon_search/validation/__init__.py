"""Compare simulator output with published measurements (``charon-search validate``).

>>> from charon_search.validation import load_files, default_files, select_records
>>> recs = select_records(load_files(default_files()), ids=["megatron_sc21_t1_1.7b"])
>>> recs[0].measured["hfu"]
0.44
"""

from __future__ import annotations

from charon_search.validation.names import (
    Unexpressible,
    choose_cluster,
    resolve_gpu,
    resolve_model_name,
)
from charon_search.validation.records import (
    Record,
    data_dir,
    default_files,
    load_files,
    load_records,
    load_silicon_csv,
    parse_records,
)
from charon_search.validation.report import render_html, render_text
from charon_search.validation.runner import (
    ValidationResult,
    merge_json,
    read_result,
    result_from_json,
    run_validation,
    select_records,
    source_label,
)
from charon_search.validation.translate import ServingCase, TrainingCase, to_case

__all__ = [
    "Record",
    "ServingCase",
    "TrainingCase",
    "Unexpressible",
    "ValidationResult",
    "choose_cluster",
    "data_dir",
    "default_files",
    "load_files",
    "load_records",
    "load_silicon_csv",
    "merge_json",
    "parse_records",
    "read_result",
    "render_html",
    "render_text",
    "resolve_gpu",
    "resolve_model_name",
    "result_from_json",
    "run_validation",
    "select_records",
    "source_label",
    "to_case",
]
