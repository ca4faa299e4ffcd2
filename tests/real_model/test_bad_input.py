"""Bad model input to `dapo sweep` and `dapo eval`: one line, exit 2, before anything is written.

`dapo train` refused these already (test_conversion.py); `dapo sweep` only checked that a local
model path held a config.json, so a broken model failed inside the Ray actor, after the sweep row
existed. Every command now calls the one check, dapo_core.real_model.check_model (flows/checks.py
for `dapo sweep` and `dapo arm`, train.checkpoint.check_checkpoint for `dapo eval`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from dapo_cli import dapo

from dapo_core import real_model
from dapo_core.train.checkpoint import check_checkpoint

from .test_conversion import _gguf, _model_copy, _one_line

pytestmark = pytest.mark.realmodel


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A store and a runs directory of this test's own (neither exists yet), no Prefect server."""
    env = {
        **os.environ,
        "DAPO_DB_URL": f"sqlite:///{tmp_path / 'dapo.db'}",
        "DAPO_RUNS_DIR": str(tmp_path / "runs"),
        "DAPO_DEBUG": "",
        "OMP_NUM_THREADS": "1",
        **extra,
    }
    env.pop("PREFECT_API_URL", None)
    return env


# What each fault's one line must say.
SAYS = {
    "no-tokenizer": "no tokenizer files",
    "no-chat-template": "no chat template",
    "vocab-mismatch": "do not belong together",
}


def _broken_model(real_dir: Path, dest: Path, fault: str) -> Path:
    """A model directory (the real one's files) with one fault of SAYS."""
    if fault == "no-tokenizer":
        return _model_copy(real_dir, dest, skip=("tokenizer.json",))
    if fault == "no-chat-template":
        _model_copy(real_dir, dest, skip=("chat_template.jinja",))
        assert "chat_template" not in json.loads((dest / "tokenizer_config.json").read_text())
        return dest
    assert fault == "vocab-mismatch", fault
    _model_copy(real_dir, dest)
    config = json.loads((dest / "config.json").read_text())
    config["vocab_size"] = 32000  # a model of another tokenizer family
    (dest / "config.json").write_text(json.dumps(config))
    return dest


def _no_sweep_written(env: dict[str, str], tmp_path: Path) -> None:
    from db.engine import get_engine
    from db.reads import latest_sweep_id

    db = tmp_path / "dapo.db"
    # The store may have been opened (its schema made) by the checks; no sweep row is in it.
    assert not db.exists() or latest_sweep_id(get_engine(env["DAPO_DB_URL"])) is None
    runs = tmp_path / "runs"
    assert not runs.exists() or not [p for p in runs.iterdir() if not p.name.startswith(".")]


SWEEP_FAULTS = [
    "not-converted",
    "missing-gguf",
    "not-gguf",
    "truncated-gguf",
    "unconverted-gguf",
    "no-tokenizer",
    "no-chat-template",
    "vocab-mismatch",
]


@pytest.mark.parametrize("fault", SWEEP_FAULTS)
def test_dapo_sweep_refuses_a_bad_model_before_a_sweep_row_exists(
    fault: str, real_dir: Path, tmp_path: Path
) -> None:
    env = _env(tmp_path)
    model: list[str] = []
    gguf = tmp_path / "model.gguf"
    if fault == "not-converted":  # the pinned name on a machine without `make real-model`
        env["DAPO_CACHE_DIR"] = str(tmp_path / "empty-cache")
        # offline: the command may not convert it on first use, so it must refuse
        env["HF_HUB_OFFLINE"] = "1"
        says = "make real-model"
    elif fault == "missing-gguf":
        model, says = ["--model", str(gguf)], "does not exist"
    elif fault == "not-gguf":  # e.g. an HTML error page saved under the file's name
        gguf.write_bytes(b"<html>404 Not Found</html>" * 100)
        model, says = ["--model", str(gguf)], "not a GGUF file"
    elif fault == "truncated-gguf":  # an interrupted copy: the header and half the metadata
        with _gguf(real_dir).open("rb") as src:
            gguf.write_bytes(src.read(1 << 20))
        model, says = ["--model", str(gguf)], "corrupt GGUF"
    elif fault == "unconverted-gguf":  # a whole GGUF: the engines need it converted first
        model, says = ["--model", str(_gguf(real_dir))], "python -m dapo_core.real_model --gguf"
    else:
        model = ["--model", str(_broken_model(real_dir, tmp_path / "model", fault))]
        says = SAYS[fault]
    done = dapo("sweep", "--preset", "smollm2-135m", "--arms", "grpo", "--quiet", *model, env=env)
    line = _one_line(done)
    assert line.startswith("error: ") and says in line, line
    _no_sweep_written(env, tmp_path)


def test_dapo_sweep_checks_the_chat_template_only_where_the_prompts_need_it(
    real_dir: Path, tmp_path: Path
) -> None:
    # The tiny preset's `raw` prompts need no chat template: the same directory passes the model
    # check there, and the sweep stops at the next mistake (a data file that is not there).
    path = _broken_model(real_dir, tmp_path / "model", "no-chat-template")
    env = _env(tmp_path)
    done = dapo("sweep", "--arms", "grpo", "--model", str(path), "--data", "./nope.jsonl", env=env)
    line = _one_line(done)
    assert "nope.jsonl does not exist" in line, line
    _no_sweep_written(env, tmp_path)


# --- dapo eval -----------------------------------------------------------------------------------
def _checkpoint(real_dir: Path, run: Path, fault: str) -> Path:
    """A run directory whose one checkpoint holds the real model's export with `fault` (or, for
    `sharded`, no export at all: `dapo eval` would export it from the run's model)."""
    from dapo_core.setup.ladders import paper_ladder

    step = run / "checkpoints" / "step_1"
    step.mkdir(parents=True)
    (run / "checkpoints" / "latest").write_text("step_1")
    cfg = paper_ladder().config("grpo", "smollm2-135m", {})
    (step / "config.json").write_text(json.dumps(cfg.to_dict()))
    (step / "trainer_state.pt").write_bytes(b"")  # never read: the check comes first
    if fault == "sharded":
        (step / "dcp").mkdir()
    else:
        _broken_model(real_dir, step / "model", fault)
    return step


@pytest.mark.parametrize(
    "fault", ["no-tokenizer", "no-chat-template", "vocab-mismatch", "sharded-not-converted"]
)
def test_dapo_eval_refuses_a_bad_checkpoint_model_before_loading_it(
    fault: str, real_dir: Path, tmp_path: Path
) -> None:
    env = _env(tmp_path)
    if fault == "sharded-not-converted":
        step = _checkpoint(real_dir, tmp_path / "run", "sharded")
        env["DAPO_CACHE_DIR"] = str(tmp_path / "empty-cache")
        env["HF_HUB_OFFLINE"] = "1"  # no conversion on first use: the refusal
        says = "make real-model"
    else:
        step = _checkpoint(real_dir, tmp_path / "run", fault)
        says = SAYS[fault]
    before = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "run").rglob("*"))
    line = _one_line(dapo("eval", "--ckpt", str(tmp_path / "run"), "--problems", "1", env=env))
    assert line.startswith("error: ") and says in line, line
    if fault != "sharded-not-converted":
        assert str(step / "model") in line, line
    # Nothing written: no export made from dcp/, no file added beside the checkpoint.
    after = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "run").rglob("*"))
    assert after == before


def test_check_checkpoint_accepts_the_real_export(real_dir: Path, tmp_path: Path) -> None:
    step = tmp_path / "step_1"
    step.mkdir()
    _model_copy(real_dir, step / "model")
    check_checkpoint(step, real_model.NAME, chat=True)
    (step / "model" / "chat_template.jinja").unlink()
    check_checkpoint(step, real_model.NAME, chat=False)  # `dapo` or `raw` prompts
