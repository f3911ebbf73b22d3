"""The `charon-search` dispatcher: every command loads, bad input exits 2 with one line."""

from __future__ import annotations

import importlib

import pytest

from charon_search.cli import COMMANDS, main


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_has_a_module_with_help(command: str, capsys: pytest.CaptureFixture[str]):
    module = importlib.import_module(f"charon_search.cli.{COMMANDS[command]}")
    assert callable(module.add_arguments) and callable(module.run)
    assert (module.__doc__ or "").strip(), f"{command} needs a docstring (its help text)"
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    assert "usage: charon-search" in capsys.readouterr().out


def test_help_keeps_the_docstring_examples_one_per_line(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit):
        main(["validate", "--help"])
    lines = capsys.readouterr().out.splitlines()
    # each example of the module docstring on a line of its own, as written (not reflowed)
    assert "    charon-search validate --explain --ids megatron_sc21_t1_1.7b" in lines


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]):
    assert main([]) == 2
    out = capsys.readouterr().out
    for command in COMMANDS:
        assert command in out


def test_config_error_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]):
    code = main(["trace", "no-such-model-xyz", "--phase", "train", "--seq", "128", "--mbs", "1"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no-such-model-xyz" in err[0]
    assert "Traceback" not in err[0]


def test_outputs_are_checked_before_the_work(tmp_path, capsys: pytest.CaptureFixture[str]):
    # A missing output folder is made; a folder given as the output file is a one-line error
    # before anything is simulated (a finished result must not be lost to its output path).
    args = ["memory", "--model", "debug-llama", "--cluster", "h100-sxm-8gpu", "--gpus", "8",
            "--zero", "3", "--mbs", "1", "--gbs", "8", "--seq", "256"]
    out = tmp_path / "new" / "dir" / "m.json"
    assert main([*args, "--json", str(out)]) == 0
    assert out.is_file()
    capsys.readouterr()
    assert main([*args, "--json", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "`--json`" in err[0] and "is a folder" in err[0]


def test_the_package_lists_its_public_api():
    """``dir(charon_search)`` (tab completion, help) shows the lazily exported names."""
    import charon_search

    assert {"simulate_training", "simulate_serving", "memory_report", "Layout",
            "load_model"} <= set(dir(charon_search))
    assert set(charon_search.__all__) <= set(dir(charon_search))


def test_explain_refuses_flags_it_would_ignore(capsys: pytest.CaptureFixture[str], tmp_path):
    base = tmp_path / "b.json"
    base.write_text('{"records": [], "skipped": [], "cases": {}, "summary": {}}')
    assert main(["validate", "--explain", "--ids", "megatron_sc21_t1_1.7b", "--baseline",
                 str(base)]) == 2
    assert "`--explain` prints how each record's prediction arises, so it takes no " \
           "--baseline" in capsys.readouterr().err
