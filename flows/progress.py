"""What the flows say while they run: one line per event, to the Prefect run log and, when the
flows run inside `dapo sweep` / `dapo arm`, to the terminal.

The terminal gets them through a listener set by the command (flows run in the command's
process there); served flow runs have none and only log.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

from dapo_common.text import percent
from dapo_common.util import duration, num

Listener = Callable[[str, dict[str, Any]], None]
"""(message, data): data carries what a terminal display may need, e.g. {"sweep_id": 3}."""

_lock = threading.Lock()
_listener: Listener | None = None


def set_listener(listener: Listener | None) -> None:
    global _listener
    with _lock:
        _listener = listener


def say(message: str, *, level: str = "info", **data: Any) -> None:
    """Log `message` to the current Prefect run (if any) and hand it to the listener."""
    from prefect.exceptions import MissingContextError
    from prefect.logging import get_run_logger

    with contextlib.suppress(MissingContextError):  # outside a flow run: the listener only
        getattr(get_run_logger(), level)(message)
    with _lock:
        listener = _listener
    if listener is not None:
        listener(message, data)


def step_line(label: str, update: dict[str, Any]) -> str:
    """`grpo s0  step 3/12  acc 41.2%  reward -0.176  1234 tok/s  ETA 0:00:20`: scores in
    percent, as the ablation table shows them; the reward in its own unit."""
    return (
        f"{label}  step {update.get('step')}/{update.get('steps')}"
        f"  acc {percent(update.get('acc'))}  reward {num(update.get('reward'), '+.3f')}"
        f"  {num(update.get('tokens_per_s'), '.0f')} tok/s  ETA {duration(update.get('eta_s'))}"
    )


def eval_text(final_eval: dict[str, Any] | None) -> str:
    if not final_eval:
        return "no evaluation"
    k = final_eval.get("k")
    return (
        f"{final_eval.get('dataset')} avg@{k} {percent(final_eval.get('avg_at_k'))}"
        f" pass@{k} {percent(final_eval.get('pass_at_k'))}"
    )
