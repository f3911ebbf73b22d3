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


def prepare_outputs(args: argparse.Namespace, flags: Mapping[str, str],
                    inputs: Mapping[str, str] | None = None) -> None:
    """Before any work: make the folders of the output files the command will write
    (``flags``: option -> ``args`` attribute) and check they can be written, so a finished
    simulation is never lost to a bad output path. ``inputs`` (option -> ``args`` attribute,
    a path or a list of paths) are the files the command reads: no output may be one of them,
    nor two outputs the same file (a report written over the run it was made from).

    Raises:
        ConfigError: naming the option, the path and why it cannot be written.
    """
    read: list[tuple[str, Path]] = []
    for flag, attr in (inputs or {}).items():
        value = getattr(args, attr, None)
        for p in (value if isinstance(value, list | tuple) else [value] if value else []):
            read.append((flag, Path(p)))
    written: list[tuple[str, Path]] = []
    for flag, attr in flags.items():
        value = getattr(args, attr, None)
        if not value:
            continue
        path = Path(value)
        if path.is_dir():
            raise ConfigError(f"`{flag}` {str(path)!r} is a folder; give a file path")
        for other_flag, other in [*read, *written]:
            if _same_file(path, other):
                role = "reads" if (other_flag, other) in read else "also writes"
                how = f" with `{other_flag}`" if other_flag.startswith("-") else ""
                raise ConfigError(f"`{flag}` {str(path)!r} is a file the command {role}{how}; "
                                  "writing it would destroy that file, so give another path")
        written.append((flag, path))
        bad = next((q for q in path.parents if q.exists() and not q.is_dir()), None)
        if bad is not None:
            raise ConfigError(f"`{flag}` {str(path)!r} is under the file {str(bad)!r}; give "
                              "a path in a folder")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"`{flag}` {str(path)!r}: cannot create its folder "
                              f"({e.strerror or e})") from e
        if not os.access(path.parent, os.W_OK):
            raise ConfigError(f"`{flag}` {str(path)!r}: its folder is not writable")


def _same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file (links and relative spellings included)."""
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
        return a.resolve() == b.resolve()
    except OSError:
        return False


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
    # transformers sets its logger's level from TRANSFORMERS_VERBOSITY when it is first
    # imported (lazily, inside the first trace), which would undo a setLevel made before.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    logging.getLogger("transformers").setLevel(logging.ERROR)
