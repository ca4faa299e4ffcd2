"""Small helpers every layer uses: a free TCP port, durations and numbers as text, an error in
one line, a nested config as dotted keys. Standard library only (see dapo_common)."""

from __future__ import annotations

import socket
from collections.abc import Mapping
from typing import Any


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` (an IPv4 or IPv6 address) now; a rendezvous or a server binds it
    a moment later."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _unknown(value: Any) -> bool:
    # NaN is the one value unequal to itself: this catches numpy's NaNs as well as float's.
    return value is None or value != value


def duration(seconds: Any, *, compact: bool = False, missing: str = "-") -> str:
    """`H:MM:SS` (a progress line's ETA), or with `compact` '1h 02m', '3m 05s', '42s' (a table
    cell); `missing` when unknown (None or NaN)."""
    if _unknown(seconds):
        return missing
    total = round(float(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if not compact:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def num(x: Any, fmt: str) -> str:
    """`x` formatted with `fmt`; "-" when unknown (None or NaN)."""
    return "-" if _unknown(x) else format(x, fmt)


def first_line(error: BaseException, *, with_type: bool = False) -> str:
    """The first line of an exception's message (SQL errors, pydantic and Prefect carry pages
    after it); the class name when the message is empty. `with_type` prefixes the class name,
    as the store's error column and the flows' logs keep it."""
    text = str(error).strip()
    line = text.splitlines()[0] if text else ""
    if not line:
        return type(error).__name__
    return f"{type(error).__name__}: {line}" if with_type else line


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"algo": {"clip_high": 0.28}} -> {"algo.clip_high": 0.28}, for config diffs. Lists stay
    values, and so does an empty mapping: a section that went from {} to absent is a change."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, prefix=f"{dotted}."))
        else:
            flat[dotted] = value
    return flat
