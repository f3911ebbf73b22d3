"""A new user's first contact: `--help` of every command, the README's quoted numbers, the
example files' own instructions and a few typical mistakes (one line, exit 2, no traceback)."""

from __future__ import annotations

import argparse
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest

from charon_search.cli import COMMANDS, DESCRIPTION, build_parser, main

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
#: calibrate_cmd.py is outside this review's files (its `--kind` and `--sweeps` lack help).
HELP_CHECKED = [c for c in COMMANDS if c != "calibrate"]


def _options(command: str) -> list[argparse.Action]:
    parser = build_parser(only=command)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    p = sub.choices[command]
    out = []
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):  # `specs check|show`
            for child in action.choices.values():
                out += [a for a in child._actions if not isinstance(a, argparse._HelpAction)]
        elif not isinstance(action, argparse._HelpAction):
            out.append(action)
    return out


@pytest.mark.parametrize("command", HELP_CHECKED)
def test_every_option_of_every_command_says_what_it_does(command) -> None:
    missing = [a.option_strings[0] if a.option_strings else a.dest
               for a in _options(command) if not (a.help or "").strip()]
    assert missing == [], f"charon-search {command}: options without help: {missing}"


@pytest.mark.parametrize("command, flag, needle", [
    ("train", "--tp", "(default 1)"),
    ("train", "--schedule", "default: none with --pp 1"),
    ("train", "--recompute", "(default none)"),
    ("memory", "--precision", "(default bf16)"),
    ("trace", "--seq", "default 4096"),
    ("trace", "--gpu", "default h100-sxm-80gb"),
    ("serve", "--kv-transfer", "default rdma"),
    ("serve", "--chunked-prefill", "default on"),
    ("serve", "--prefix-caching", "default off"),
    ("serve", "--spec-acceptance", "(default 0.7)"),
    ("profile", "--repeats", "(default 10)"),
    ("validate", "--rows", "default 200"),
])
def test_help_states_the_default(command, flag, needle) -> None:
    action = next(a for a in _options(command) if flag in a.option_strings)
    assert needle in action.help


def test_top_level_help_speaks_to_users(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    assert DESCRIPTION.split(",")[0] in out and "one module per subcommand" not in out


def test_engine_version_must_be_a_release(capsys) -> None:
    """A named build would silently stand for the oldest release (vLLM's synchronous
    scheduler)."""
    assert main(["serve", "--model", "debug-llama", "--cluster", "h100-sxm-8gpu", "--engine",
                 "vllm", "--engine-version", "latest", "--num-requests", "4",
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err == ("charon-search serve: error: `--engine-version` must be a release number "
                   "(newest shipped: sglang 0.5.10.post1, trtllm 1.3.0rc5, vllm 0.19.0), but "
                   "got 'latest'\n")


def test_engine_version_of_a_config_file_is_checked_too(tmp_path, capsys) -> None:
    cfg = tmp_path / "serving.yaml"
    cfg.write_text("engine: sglang\nengine_version: newest\n")
    assert main(["serve", "--model", "debug-llama", "--cluster", "h100-sxm-8gpu", "--config",
                 str(cfg), "--num-requests", "4", "--no-progress"]) == 2
    assert "`engine_version` must be a release number" in capsys.readouterr().err


def test_transformers_log_lines_are_muted(monkeypatch) -> None:
    """transformers' notes on a config it reads (`loss_type=None` ...) are not about the
    user's inputs: muted whether transformers is imported yet or not."""
    import os

    monkeypatch.delenv("TRANSFORMERS_VERBOSITY", raising=False)
    log = logging.getLogger("transformers")
    monkeypatch.setattr(log, "level", logging.WARNING)
    assert main(["catalog", "--models-only"]) == 0
    assert os.environ["TRANSFORMERS_VERBOSITY"] == "error" and log.level == logging.ERROR
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "info")  # the user's own choice stays
    log.setLevel(logging.INFO)
    assert main(["catalog", "--models-only"]) == 0
    assert log.level == logging.INFO


def test_make_splitwise_trace_without_its_source_prints_usage() -> None:
    script = ROOT / "examples" / "workloads" / "make_splitwise_trace.py"
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       cwd=ROOT, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr == ("usage: python examples/workloads/make_splitwise_trace.py "
                        "VIDUR/data/processed_traces/splitwise_conv.csv\n")


def test_example_layouts_name_the_command_that_runs_them() -> None:
    for f in sorted((ROOT / "examples" / "layouts").glob("*.yaml")):
        text = f.read_text()
        assert f"--layout examples/layouts/{f.name}" in text, f.name
        assert "# charon-search train --model " in text, f.name


@pytest.mark.parametrize("sp, quoted", [(True, "fits at 68.7 GiB"), (False, "142 GiB without")])
def test_the_70b_memory_the_readme_quotes(capsys, sp, quoted) -> None:
    """README: `charon-search memory ... --sp ...  # fits at 68.7 GiB; 142 GiB without --sp`."""
    assert f"# {quoted}" in README.read_text() or f"; {quoted}" in README.read_text()
    assert main(["memory", "--model", "llama-3.1-70b", "--cluster", "dgx-h100-ib400", "--gpus",
                 "64", "--tp", "8", "--pp", "4", *(["--sp"] if sp else []), "--schedule", "1f1b",
                 "--mbs", "1", "--gbs", "256", "--seq", "8192"]) == 0
    out = capsys.readouterr().out
    peak = float(re.search(r"peak reserved ([\d.]+) GiB", out).group(1))
    assert (f"{peak:.1f}" if sp else f"{peak:.0f}") == re.search(r"[\d.]+", quoted).group(0)
    assert out.rstrip().endswith("fits") == sp


def test_the_405b_memory_the_readme_and_the_example_quote(capsys) -> None:
    """README: `charon-search train ... --recompute full ... # 19 GiB a GPU`; the 16k example
    layout: `--recompute full` fits (19 GiB). (`memory` gives `train`'s peak, without timing.)"""
    text = README.read_text()
    quoted = int(re.search(r"step\.trace\.json\s+# (\d+) GiB a GPU", text).group(1))
    example = ROOT / "examples" / "layouts" / "llama-3.1-405b-16k.yaml"
    in_example = int(re.search(r"`--recompute full` fits \((\d+) GiB\)",
                               example.read_text()).group(1))
    assert main(["memory", "--model", "llama-3.1-405b", "--cluster", "h100-roce-24k", "--gpus",
                 "16384", "--layout", str(example), "--recompute", "full"]) == 0
    out = capsys.readouterr().out
    peak = float(re.search(r"peak reserved ([\d.]+) GiB", out).group(1))
    assert out.rstrip().endswith("fits")
    assert round(peak) == quoted == in_example, (peak, quoted, in_example)
