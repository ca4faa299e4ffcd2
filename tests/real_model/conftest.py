"""The real model's suite (`make test-real-model`): SmolLM2-135M-Instruct as `make real-model`
converted it. The model is 538 MB in float32: each module loads it at most once. Modules that
need the model are marked `realmodel` (outside the default run); test_arithmetic_data.py needs
none and runs in the default suite."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def real_dir() -> Path:
    from dapo_core import real_model

    try:
        return real_model.model_dir()
    except real_model.ModelSetupError as exc:
        pytest.fail(str(exc))
