"""Small helpers shared by subcommands."""

from __future__ import annotations

import logging
import warnings

__all__ = ["silence_tracing_noise"]


def silence_tracing_noise() -> None:
    """Mute the per-model UserWarnings and log lines torch/transformers emit while tracing.

    They are not about the user's records and would drown the tables of batch commands.
    """
    warnings.simplefilter("ignore", UserWarning)
    logging.getLogger("transformers").setLevel(logging.ERROR)
