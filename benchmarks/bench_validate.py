"""Speed of `charon-search validate`: loading, translation, and a fixed slice end to end.

Prints one JSON object on the last line:
``{"load_s", "translate_s", "num_records", "cases": [{"name", "records", "wall_s"}]}``.
"""

from __future__ import annotations

import json
import time
import warnings

warnings.simplefilter("ignore", UserWarning)

from charon_search.validation import (  # noqa: E402
    Unexpressible,
    default_files,
    load_files,
    run_validation,
    select_records,
    to_case,
)

SLICES = {
    "training_sc21": ["megatron_sc21_t1_1.7b", "megatron_sc21_t1_7.5b", "megatron_sc21_t1_39b"],
    "serving_h100_8b": [
        "meta_llama_llama_3_1_8b_instruct_meta_llama_llama_3_1_8b_instruct_h100_sxm_trtllm_agg_"
        "1024x128_c8_tp1_epnone_1",
        "meta_llama_llama_3_1_8b_instruct_meta_llama_llama_3_1_8b_instruct_h100_sxm_trtllm_agg_"
        "1024x128_c64_tp1_epnone_28",
    ],
}


def main() -> None:
    t0 = time.perf_counter()
    records = load_files(default_files())
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for r in records:
        try:
            to_case(r)
        except Unexpressible:
            pass
    translate_s = time.perf_counter() - t0
    cases = []
    for name, ids in SLICES.items():
        recs = select_records(records, ids=ids)
        run_validation(recs)  # cold: traces and cost tables
        t0 = time.perf_counter()
        run_validation(recs)
        cases.append({"name": name, "records": len(recs),
                      "wall_s": round(time.perf_counter() - t0, 3)})
    print(json.dumps({"load_s": round(load_s, 3), "translate_s": round(translate_s, 3),
                      "num_records": len(records), "cases": cases}))


if __name__ == "__main__":
    main()
