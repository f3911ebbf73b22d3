"""Small helpers shared by subcommands."""

from __future__ import annotations

import argparse
import logging
import os
import warnings
from collections.abc import Mapping
from pathlib import Path

from charon_search.errors import ConfigError

__all__ = ["prepare_outputs", "silence_tracing_noise"]


def prepare_outputs(args: argparse.Namespace, flags: Mapping[str, str]) -> None:
    """Before any work: make the folders of the output files the command will write
    (``flags``: option -> ``args`` attribute) and check they can be written, so a finished
    simulation is never lost to a bad output path.

    Raises:
        ConfigError: naming the option, the path and why it cannot be written.
    """
    for flag, attr in flags.items():
        value = getattr(args, attr, None)
        if not value:
            continue
        path = Path(value)
        if path.is_dir():
            raise ConfigError(f"`{flag}` {str(path)!r} is a folder; give a file path")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"`{flag}` {str(path)!r}: cannot create its folder "
                              f"({e.strerror or e})") from e
        if not os.access(path.parent, os.W_OK):
            raise ConfigError(f"`{flag}` {str(path)!r}: its folder is not writable")


def prepare_out_folder(flag: str, value: str | Path | None) -> None:
    """Before any work: the output folder ``value`` of option ``flag`` is a folder, or can be
    made one.

    Raises:
        ConfigError: naming the option, the path and why it is not a usable folder.
    """
    if not value:
        return
    path = Path(value)
    bad = next((q for q in (path, *path.parents) if q.exists() and not q.is_dir()), None)
    if bad is not None:
        what = "is a file" if bad == path else f"is under the file {str(bad)!r}"
        raise ConfigError(f"`{flag}` {str(path)!r} {what}; give a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"`{flag}` {str(path)!r}: cannot create the folder "
                          f"({e.strerror or e})") from e
    if not os.access(path, os.W_OK):
        raise ConfigError(f"`{flag}` {str(path)!r}: the folder is not writable")


def with_flags(message: str, flags: dict[str, str], command: str) -> str:
    """``message`` with each backquoted field of ``flags`` (field -> flag dest) followed by
    the command-line flag that sets it, as "`global_batch_size` (train --gbs)" (a file given
    with ``--layout`` / ``--config`` may have set it instead)."""
    for field, dest in flags.items():
        flag = f"{command} --{dest.replace('_', '-')}"
        message = message.replace(f"`{field}`", f"`{field}` ({flag})")
        if message.startswith(f"{field}: "):
            message = f"{field} ({flag}): " + message[len(field) + 2:]
    return message


def silence_tracing_noise() -> None:
    """Mute the per-model UserWarnings and log lines torch/transformers emit while tracing.

    They are not about the user's records and would drown the tables of batch commands.
    """
    warnings.simplefilter("ignore", UserWarning)
    logging.getLogger("transformers").setLevel(logging.ERROR)
