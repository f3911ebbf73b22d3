"""The README's Quickstart commands run as written (a layout check added after the README was
written once turned its 405B example into an error: `pp * vpp <= num_layers`)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from charon_search.cli import main

README = Path(__file__).resolve().parents[2] / "README.md"
#: Subcommands whose README lines are simulated here (validate/accuracy/calibrate need a full
#: validation run or a GPU and are exercised by their own tests).
RUN = ("catalog", "trace", "train", "memory", "serve", "profiles")


def _quickstart_commands() -> list[list[str]]:
    text = README.read_text()
    block = text.split("## Quickstart", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    cmds = []
    for line in block.replace("\\\n", " ").splitlines():
        line = line.split("  #", 1)[0].strip()
        if line.startswith("charon-search "):
            argv = shlex.split(line)[1:]
            if argv[0] in RUN:
                cmds.append(argv)
    return cmds


COMMANDS = _quickstart_commands()


def test_the_quickstart_lists_the_simulating_commands():
    assert {c[0] for c in COMMANDS} >= {"train", "memory", "serve", "trace"}
    assert sum(c[0] == "serve" for c in COMMANDS) >= 5


@pytest.mark.slow
@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: " ".join(a[:3]))
def test_quickstart_command_runs(argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)          # --json report.json / --trace land here
    assert main([*argv, *(["--no-progress"] if argv[0] == "serve" else [])]) == 0
    out = capsys.readouterr().out
    assert out.strip()
    if argv[0] in ("train", "memory"):   # a flagship example that does not fit teaches nothing
        assert "fits: True" in out or out.rstrip().endswith("fits"), out[-300:]
