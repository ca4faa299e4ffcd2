"""The conversion: cached per machine, keyed on the GGUF's sha256, never half-written; and the
bad inputs of issue 23, each one line and exit 2 before anything is written."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dapo_core import real_model

pytestmark = pytest.mark.realmodel
ROOT = Path(__file__).resolve().parents[2]
DAPO = str(Path(sys.executable).parent / "dapo")


def _gguf(real_dir: Path) -> Path:
    gguf = real_dir.parent / "gguf" / real_model.GGUF_NAME
    assert gguf.is_file(), f"{gguf}: make real-model keeps the GGUF beside the conversion"
    return gguf


# --- cached, keyed on the hash ------------------------------------------------------------------
def test_the_conversion_is_keyed_on_the_gguf_hash_and_a_rerun_does_nothing(
    real_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gguf = _gguf(real_dir)
    sha = real_model.sha256_file(gguf)
    info = json.loads((real_dir / real_model.INFO_FILE).read_text())
    assert sha == real_model.GGUF_SHA256 == info["sha256"]
    assert real_dir == real_model.converted_dir(sha) and sha[:16] in real_dir.name
    assert info["params"] == 134_515_008 and info["vocab_size"] == info["tokenizer_size"] == 49152
    weights = real_dir / "model.safetensors"
    before = weights.stat().st_mtime_ns

    def must_not_convert(*_: Any) -> dict[str, Any]:
        raise AssertionError("a GGUF with a converted hash was converted again")

    monkeypatch.setattr(real_model, "_convert_into", must_not_convert)
    path, fresh = real_model.setup(gguf, real_dir.parent)
    assert (path, fresh) == (real_dir, False)
    assert weights.stat().st_mtime_ns == before


def _fake_conversion(real_dir: Path, fail: BaseException | None = None) -> Any:
    """Stands in for the 20-second dequantisation: writes a small directory a run would accept
    (the real config and tokenizer, a placeholder weights file), or fails half-way."""

    def convert_into(gguf: Path, out: Path) -> dict[str, Any]:
        for name in (
            "config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "chat_template.jinja",
        ):
            shutil.copy(real_dir / name, out / name)
        if fail is not None:
            raise fail
        (out / "model.safetensors").write_bytes(b"placeholder")
        return {"params": 0, "vocab_size": 49152, "tokenizer_size": 49152, "seconds": 0.0}

    return convert_into


def test_another_gguf_converts_into_its_own_directory_and_an_interrupted_one_leaves_nothing(
    real_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = tmp_path / "other.gguf"
    shutil.copy(_gguf(real_dir), other)
    with other.open("ab") as handle:  # trailing bytes: a valid GGUF with another hash
        handle.write(b"\0" * 32)
    sha = real_model.sha256_file(other)
    assert sha != real_model.GGUF_SHA256
    root = tmp_path / "cache"
    target = real_model.converted_dir(sha, root)

    for interruption in (KeyboardInterrupt(), RuntimeError("disk full")):
        monkeypatch.setattr(real_model, "_convert_into", _fake_conversion(real_dir, interruption))
        with pytest.raises(type(interruption)):
            real_model.convert(other, root)
        # Neither the directory nor its temporary sibling survives an interruption.
        assert not target.exists()
        assert [p.name for p in root.iterdir() if not p.name.endswith(".lock")] == []

    monkeypatch.setattr(real_model, "_convert_into", _fake_conversion(real_dir))
    assert real_model.convert(other, root) == target != real_dir
    assert json.loads((target / real_model.INFO_FILE).read_text())["sha256"] == sha
    # The pinned name never points at a file of another hash.
    with pytest.raises(real_model.ModelSetupError, match="make real-model"):
        real_model.model_dir(root)


# --- bad input: one line, exit 2, nothing written ---------------------------------------------------
def _setup_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dapo_core.real_model", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def _one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


@pytest.mark.parametrize("kind", ["missing", "not-gguf", "truncated"])
def test_a_missing_or_corrupt_gguf_is_one_line_and_exit_2(
    kind: str, real_dir: Path, tmp_path: Path
) -> None:
    gguf = tmp_path / "model.gguf"
    if kind == "not-gguf":
        gguf.write_bytes(b"<html>404 Not Found</html>" * 100)
    elif kind == "truncated":  # an interrupted copy: the header and half the metadata
        with _gguf(real_dir).open("rb") as src:
            gguf.write_bytes(src.read(1 << 20))
    root = tmp_path / "cache"
    line = _one_line(_setup_cli("--gguf", str(gguf), "--root", str(root)))
    expected = {"missing": "does not exist", "not-gguf": "not a GGUF file", "truncated": "corrupt"}
    assert expected[kind] in line, line
    assert not root.exists() or not any(root.iterdir())


def _dapo_train(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DAPO, "train", "--preset", "smollm2-135m", "--out", str(tmp_path / "run"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "DAPO_DEBUG": "", **env},
    )


def _model_copy(real_dir: Path, dest: Path, *, skip: tuple[str, ...] = ()) -> Path:
    """A model directory made of the real one's small files and a link to its weights."""
    dest.mkdir()
    for item in real_dir.iterdir():
        if item.name in skip or item.name == real_model.INFO_FILE:
            continue
        if item.suffix == ".safetensors":
            os.symlink(item, dest / item.name)
        else:
            shutil.copy(item, dest / item.name)
    return dest


def test_dapo_train_before_the_conversion_says_how_to_convert(tmp_path: Path) -> None:
    # Offline, so that the command cannot convert it on first use
    # (tests/dapo_core/test_real_model_first_use.py covers the conversion): it says how to get the
    # model instead.
    done = _dapo_train(tmp_path, DAPO_CACHE_DIR=str(tmp_path / "empty-cache"), HF_HUB_OFFLINE="1")
    line = _one_line(done)
    assert "not converted" in line and "make real-model" in line, line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("fault", ["no-tokenizer", "no-chat-template", "vocab-mismatch"])
def test_dapo_train_refuses_a_broken_model_directory_before_writing(
    fault: str, real_dir: Path, tmp_path: Path
) -> None:
    model = tmp_path / "model"
    if fault == "no-tokenizer":
        _model_copy(real_dir, model, skip=("tokenizer.json",))
        says = "no tokenizer files"
    elif fault == "no-chat-template":
        _model_copy(real_dir, model, skip=("chat_template.jinja",))
        config = json.loads((model / "tokenizer_config.json").read_text())
        assert "chat_template" not in config
        says = "no chat template"
    else:
        _model_copy(real_dir, model)
        config = json.loads((model / "config.json").read_text())
        config["vocab_size"] = 32000  # a model of another tokenizer family
        (model / "config.json").write_text(json.dumps(config))
        says = "do not belong together"
    line = _one_line(_dapo_train(tmp_path, "--model", str(model)))
    assert says in line, line
    assert not (tmp_path / "run").exists()


def test_the_converted_directory_itself_passes_the_checks(real_dir: Path) -> None:
    real_model.check_model_dir(real_dir, chat=True, info_required=True)
    real_model.check_model(real_model.NAME, chat=True)
