"""The real model through `dapo sweep` (Prefect + Ray, the path every GPU sweep takes), its
Hugging Face export reloaded by transformers and by `dapo eval`, and the dashboard's rollout
browser on its store (served for real, in headless Chromium: the prompts and replies SmolLM2 saw
and wrote, in its chat template, multi-byte characters intact from tokenizer to screen; the
screenshot is kept as tests/artifacts/rollouts-real-model.png).

The sweep (conftest.py `real_sweep`) trains 2 rollout steps of grpo on problems written with
multi-byte characters; these tests read what it left: the store's rows, the checkpoint's export.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from chromium import ARTIFACTS, find_chromium

from dashboard import browser

from .conftest import MULTIBYTE_PROBLEMS, RealSweep

# One module, so that `make test-real-model`'s workers (a module each) run the sweep once.
pytestmark = pytest.mark.realmodel
ROOT = Path(__file__).resolve().parents[2]
DAPO = str(Path(sys.executable).parent / "dapo")


def test_dapo_sweep_runs_two_rollout_steps_of_the_real_model(real_sweep: RealSweep) -> None:
    from db import reads
    from db.engine import get_engine

    done = real_sweep.done
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    assert "sweep 1 completed" in done.stdout, done.stdout[-2000:]
    # The 3-minute goal held at a load average of 6 (101 s) and only just at 14-18 (154-179 s):
    # the time is reported, not a reason to fail; the fixture's timeout is three times the goal.
    print(f"2 real-model rollout steps through dapo sweep: {real_sweep.seconds:.0f} s")
    engine = get_engine(real_sweep.store_url)
    (run,) = reads.runs_of_sweep(engine, 1).to_dict("records")
    assert (run["arm"], run["seed"], run["status"]) == ("grpo", 0, "completed")
    config = json.loads((real_sweep.run_dir() / "config.json").read_text())
    assert config["model"]["name_or_path"] == "smollm2-135m"
    assert config["data"]["prompt_template"] == "chat-answer"

    curves = reads.metric_curves(engine, [int(run["run_id"])], ["acc/mean", "losses/policy_loss"])
    assert sorted(set(curves["step"])) == [1, 2]
    assert all(math.isfinite(v) for v in curves["value"])

    samples = reads.samples(engine, int(run["run_id"]), limit=1000)
    assert sorted(set(samples["step"])) == [1, 2]
    problems = {text for text, _ in MULTIBYTE_PROBLEMS}
    for prompt in samples["prompt"]:
        # The real chat template around a problem of the data file, the multi-byte characters
        # as written (the store holds text, not bytes cut at a token boundary).
        user = prompt.split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
        assert user in problems, user
        assert prompt.endswith("<|im_start|>assistant\nAnswer: ")
    # (A reply may hold U+FFFD: the model can stop inside a multi-byte character's tokens.)
    assert all("<|im_end|>" not in r for r in samples["response"])


def _export(real_sweep: RealSweep) -> Path:
    assert real_sweep.done.returncode == 0, real_sweep.done.stderr[-3000:]
    return real_sweep.run_dir() / "checkpoints" / "step_2" / "model"


def test_the_sweeps_export_reloads_in_transformers_and_answers(
    real_sweep: RealSweep, real_dir: Path
) -> None:
    # Issue 23: the HF export of a trained real-model run is a model any transformers user can
    # load: AutoModelForCausalLM and AutoTokenizer from the directory alone, then one answer.
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)  # a shared 2-core runner
    export = _export(real_sweep)
    tokenizer = AutoTokenizer.from_pretrained(export)
    model = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32).eval()
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.vocab_size == 49152
    assert len(tokenizer) == 49152 and tokenizer.chat_template
    # The export holds the weights after the updates: changed from the converted model's if any
    # update had a gradient (a step whose groups are all wrong, or all right, has none: GRPO's
    # advantages are then 0, and so is AdamW's step without weight decay).
    from db import reads
    from db.engine import get_engine

    engine = get_engine(real_sweep.store_url)
    (run_id,) = [int(r) for r in reads.runs_of_sweep(engine, 1)["run_id"]]
    norms = reads.metric_curves(engine, [run_id], ["optim/grad_norm"])["value"]
    assert len(norms) == 2
    name = "model.layers.0.self_attn.q_proj.weight"
    with (
        safe_open(str(export / "model.safetensors"), "pt") as trained,
        safe_open(str(real_dir / "model.safetensors"), "pt") as start,
    ):
        same = torch.equal(trained.get_tensor(name), start.get_tensor(name))
    assert same == bool((norms == 0).all()), list(norms)

    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 3 + 4?"}], tokenize=False, add_generation_prompt=True
    )
    inputs = tokenizer(str(prompt) + "Answer: ", return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    answer = tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    print(f"the trained export answers {answer!r}")
    # Greedy, 2 small updates at lr 5e-6 from a model that gets 3 + 4 right: the answer is 7.
    assert answer.strip().startswith("7"), answer


def test_dapo_eval_evaluates_the_sweeps_export(real_sweep: RealSweep) -> None:
    # `dapo eval` checks the export (tokenizer, chat template, vocabulary) and loads it.
    run = real_sweep.run_dir()
    done = subprocess.run(
        [DAPO, "eval", "--ckpt", str(run), "--problems", "2", "--k", "2"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
        env=real_sweep.env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["dataset"] == "arithmetic-eval" and result["n_problems"] == 2
    assert 0.0 <= result["avg_at_k"] <= 1.0


# Opens the first sample's expander (a <details>): its prompt and response are then drawn, so
# that the screenshot shows them (the text is in the page either way).
OPEN_FIRST_SAMPLE = """(() => {
  const summary = document.querySelector('details summary');
  if (!summary) return false;
  if (!summary.parentElement.open) summary.click();
  return true;
})()"""


# True once Streamlit's "running" indicator is gone and the table's canvas is drawn.
SCRIPT_DONE = """(() => !document.querySelector('[data-testid^="stStatusWidgetRunning"]')
  && !!document.querySelector('[data-testid="stDataFrame"] canvas'))()"""


def _wait_until(page: browser.Page, expression: str, timeout_s: float = 60) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        result = page.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if result.get("result", {}).get("value") is True:
            return
        time.sleep(0.2)
    raise TimeoutError(f"the page did not settle in {timeout_s:g} s: {expression}")


@pytest.mark.browser
def test_the_rollout_browser_shows_the_real_models_text(
    real_sweep: RealSweep, tmp_path: Path
) -> None:
    from db import reads
    from db.engine import get_engine

    exe = find_chromium()
    assert real_sweep.done.returncode == 0, real_sweep.done.stderr[-3000:]
    engine = get_engine(real_sweep.store_url)
    (run_id,) = [int(r) for r in reads.runs_of_sweep(engine, 1)["run_id"]]
    last = reads.samples(engine, run_id, step=2, limit=1000)
    first = last.sort_values("idx").iloc[0]
    problem = first["prompt"].split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
    assert problem in {text for text, _ in MULTIBYTE_PROBLEMS}
    response = " ".join(str(first["response"]).split())  # the page's text collapses blanks

    with (
        open(tmp_path / "streamlit.log", "wb") as log,
        browser.served(
            real_sweep.store_url, cwd=tmp_path, env={"PREFECT_HOME": str(tmp_path)}, log=log
        ) as base,
        browser.open_page(exe) as page,
    ):
        page.goto(f"{base}/rollouts?run={run_id}&live=0")
        # The page's last step (2) is shown: its summary line, then the samples' expanders.
        page.wait_for(["Rollouts", "samples ·", "tokens"])
        assert page.call("Runtime.evaluate", expression=OPEN_FIRST_SAMPLE, returnByValue=True)[
            "result"
        ]["value"]
        # The natural-language prompt in SmolLM2's chat template, and the model's own reply,
        # as the store holds them: ë é è И (2 bytes), € — (3 bytes) intact.
        text = page.wait_for(
            [
                "You are a helpful AI assistant named SmolLM",
                problem,
                "Answer:",
                "Response",
                *([response] if response else []),
            ]
        )
        assert "Traceback" not in text
        # The screenshot once the script has finished (the table drawn, no running indicator).
        page.wait_for(["Show", "Wrong", "Truncated"])
        _wait_until(page, SCRIPT_DONE)
        for garbled in ("Ã«", "â‚¬", "Ã©"):  # UTF-8 read as Latin-1 somewhere on the way
            assert garbled not in text
        shot = page.screenshot(tmp_path / "rollouts.png")
    assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 20_000
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(tmp_path / "rollouts.png", ARTIFACTS / "rollouts-real-model.png")
