"""``charon-search`` command line: one module per subcommand.

Each subcommand module defines ``add_arguments(parser)`` and ``run(args) -> int``; its
docstring's first line is the help text. ``main`` turns ``ConfigError`` into one line on stderr
and exit code 2, other ``CharonError``s into exit code 1; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import logging
import os
import sys
import warnings
from collections.abc import Sequence

from charon_search.errors import CharonError, ConfigError

__all__ = ["COMMANDS", "main"]

#: Subcommand name -> module under ``charon_search.cli`` (imported only when used).
COMMANDS: dict[str, str] = {
    "catalog": "catalog_cmd",
    "trace": "trace_cmd",
    "specs": "specs_cmd",
    "train": "train_cmd",
    "memory": "memory_cmd",
    "serve": "serve_cmd",
    "search": "search_cmd",
    "sweep": "sweep_cmd",
    "profiles": "profiles_cmd",
    "profile": "profile_cmd",
    "validate": "validate_cmd",
    "calibrate": "calibrate_cmd",
    "accuracy": "accuracy_cmd",
}


#: What ``charon-search --help`` says first (the module docstring is for developers).
DESCRIPTION = ("Simulate LLM training and serving on GPU clusters, and search configuration "
               "spaces for Pareto fronts.")


class _ArgumentParser(argparse.ArgumentParser):
    """argparse exits 2 on usage errors already; keep its one-line message."""


def _load(name: str):  # type: ignore[no-untyped-def]
    return importlib.import_module(f"charon_search.cli.{COMMANDS[name]}")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = _ArgumentParser(prog="charon-search", description=DESCRIPTION,
                             epilog="`charon-search COMMAND --help` describes each command.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        if only is not None and name != only:
            # Keep `charon-search --help` listing every command without importing them all.
            sub.add_parser(name, help=f"see `charon-search {name} --help`")
            continue
        try:
            module = _load(name)
        except ModuleNotFoundError as e:
            if e.name and e.name.startswith("charon_search.cli."):
                continue
            raise
        doc = inspect.getdoc(module) or name
        # The module docstring as written: its example command lines stay one per line.
        p = sub.add_parser(name, help=doc.splitlines()[0], description=doc,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--debug", action="store_true", help="show tracebacks")
        module.add_arguments(p)
    return parser


def _one_line_warning(message: Warning | str, category: type[Warning], filename: str,
                      lineno: int, line: str | None = None) -> str:
    return f"charon-search: warning: {message}\n"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(only=command if command in COMMANDS else None)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if not args.debug:  # warnings as one line each, without the source line that raised them
        warnings.formatwarning = _one_line_warning
        # transformers' own log lines about a config it reads (``loss_type=None`` ...) are not
        # about the user's inputs; it reads this when first imported, inside the first trace
        # (and the logger's level, when it already was).
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        if os.environ["TRANSFORMERS_VERBOSITY"] == "error":
            logging.getLogger("transformers").setLevel(logging.ERROR)
    try:
        return int(_load(args.command).run(args) or 0)
    except ConfigError as e:
        if args.debug:
            raise
        print(f"charon-search {args.command}: error: {e}", file=sys.stderr)
        return 2
    except CharonError as e:
        if args.debug:
            raise
        print(f"charon-search {args.command}: failed: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # a file the command reads or writes (outputs are checked first)
        if args.debug:
            raise
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        print(f"charon-search {args.command}: failed: {where}{e.strerror or e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"charon-search {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
