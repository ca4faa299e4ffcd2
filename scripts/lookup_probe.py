"""Exact P(right) and decision entropy of a lookup policy: the training-side numbers the lookup
task's warm start is calibrated on (docs/mechanisms.md), read off the softmax at the decision
position for every key of the table, no sampling.

    .venv/bin/python scripts/lookup_probe.py                 # the lookup preset's warm start
    .venv/bin/python scripts/lookup_probe.py DIR [DIR ...]   # model directories or run
                                                             # directories (last checkpoint)

Prints, per model: the mean P(right) over the 32 keys with its smallest, median and largest, the
mean entropy of the decision (nats; log 8 = 2.08 is uniform over the symbols) and the mean
probability mass on the 8 symbols.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def probe(model: Any, tokenizer: Any) -> dict[str, float]:
    import torch

    from dapo_core.data import lookup
    from dapo_core.data.loaders import ANSWER_PREFIX

    symbols = [tokenizer.convert_tokens_to_ids(s) for s in lookup.SYMBOLS]
    right, entropy, mass = [], [], []
    with torch.no_grad():
        for task in lookup.tasks():
            ids = tokenizer(task.text + ANSWER_PREFIX, return_tensors="pt")["input_ids"]
            p = model(ids).logits[0, -1].float().softmax(-1)  # [V]
            right.append(float(p[tokenizer.convert_tokens_to_ids(task.answer)]))
            entropy.append(float(-(p * p.clamp_min(1e-30).log()).sum()))
            mass.append(float(p[symbols].sum()))
    n = len(right)
    ordered = sorted(right)
    return {
        "p_right": sum(right) / n,
        "p_right_min": ordered[0],
        "p_right_median": ordered[n // 2],
        "p_right_max": ordered[-1],
        "entropy": sum(entropy) / n,
        "symbol_mass": sum(mass) / n,
    }


def model_dir(path: Path) -> Path:
    """A model directory, or a run directory's last checkpoint's model."""
    checkpoints = sorted(
        (path / "checkpoints").glob("step_*"), key=lambda d: int(d.name.removeprefix("step_"))
    )
    return checkpoints[-1] / "model" if checkpoints else path


def main(argv: list[str]) -> int:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dapo_core.models import load_policy
    from dapo_core.setup.presets import preset_config

    targets: list[tuple[str, Any, Any]] = []
    if not argv:
        model, tokenizer = load_policy(preset_config("lookup").model, "cpu")
        targets.append(("the lookup preset's warm start", model.eval(), tokenizer))
    for arg in argv:
        where = model_dir(Path(arg))
        tokenizer = AutoTokenizer.from_pretrained(where)
        model = AutoModelForCausalLM.from_pretrained(where).eval()
        targets.append((str(where), model, tokenizer))
    for name, model, tokenizer in targets:
        r = probe(model, tokenizer)
        print(
            f"{name}: P(right) {r['p_right']:.4f} (min {r['p_right_min']:.3f}, median "
            f"{r['p_right_median']:.3f}, max {r['p_right_max']:.3f}), decision entropy "
            f"{r['entropy']:.3f} nats, mass on the symbols {r['symbol_mass']:.4f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
