"""Where dapo-lab caches models on this machine, and quiet model loading: a leaf module that
the tiny model (dapo_core.models) and the real one (dapo_core.real_model) both use."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


def cache_root() -> Path:
    """`$DAPO_CACHE_DIR`, else the platform's user cache directory for dapo-lab."""
    env = os.environ.get("DAPO_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("dapo-lab"))


@contextlib.contextmanager
def quiet_progress() -> Iterator[None]:
    """No transformers progress bars ("Loading weights", "Writing model shards") inside: they
    would cut into the per-step progress lines and into `--quiet` output."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            hf_logging.enable_progress_bar()
