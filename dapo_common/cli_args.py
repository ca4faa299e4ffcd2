"""What every layer's subcommands share (dapo_core.cli, flows.commands, flows.deploy and the
`dapo` dispatcher): argparse value types whose mistakes read as one line, and the exceptions
shown as one line with exit code 2. Standard library only (see dapo_common)."""

from __future__ import annotations

import argparse

# What bad input, a missing or unwritable path, or a store that stayed down raise: shown as
# their one line and exit code 2 (by the dispatcher, and from a Ray actor by the flows).
USER_ERRORS: tuple[type[Exception], ...] = (
    ValueError,
    FileNotFoundError,
    NotADirectoryError,
    PermissionError,
    ConnectionError,
    TimeoutError,
)


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1, else one clear error line."""
    value = integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    value = integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a non-negative integer")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    value = number(text)
    if not (value > 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return value


def non_negative_float(text: str) -> float:
    """argparse type: a number >= 0."""
    value = number(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a non-negative number")
    return value


def integer(text: str) -> int:
    """argparse type: an integer (the message names the text, not a Python exception)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def number(text: str) -> float:
    """argparse type: a number (the message names the text, not a Python exception)."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
