"""Every example layout loads, fits its model and cluster's degrees, and the memory verdict its
comment states is the memory model's (``examples/layouts/*.yaml``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from charon_search.hardware import load_cluster
from charon_search.layout import Layout
from charon_search.memory import memory_report

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples" / "layouts").glob("*.yaml"))
#: The verdicts the comments state (None: the file names no command to check it on).
FITS = {"llama-3.1-8b-fsdp": True, "llama-3.1-405b-16k": False,
        "deepseek-v3-dualpipe": False, "gpt-175b-megatron": True}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_layout(path):
    text = path.read_text()
    layout = Layout.from_dict(yaml.safe_load(text), where=str(path))
    assert path.stem in FITS
    m = re.search(r"# charon-search train --model (\S+) --cluster (\S+) --gpus (\d+)", text)
    if FITS[path.stem] is None:
        assert m is None
        return
    assert m is not None, "the comment names the command that runs the example"
    model, cluster, gpus = m.group(1), m.group(2), int(m.group(3))
    assert layout.num_gpus == gpus
    assert load_cluster(cluster).num_gpus >= gpus
    rep = memory_report(model, layout, cluster)
    assert rep.fits is FITS[path.stem], rep.reason
