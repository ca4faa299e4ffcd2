"""The real model's task (dapo_core.data.arithmetic) and its prompt template: no model needed,
so these run in the default suite."""

from __future__ import annotations

from dapo_core.data import arithmetic
from dapo_core.data.loaders import (
    ANSWER_PREFIX,
    Problem,
    format_prompt,
    graded_text,
    load_problems,
    response_prefix,
)


def test_train_and_held_out_problems_are_disjoint_and_deterministic() -> None:
    train = load_problems("arithmetic", seed=0)
    held_out = load_problems("arithmetic-eval")
    assert len(train) == arithmetic.TRAIN_SIZE and len(held_out) == arithmetic.EVAL_SIZE
    assert not {p.prompt for p in train} & {p.prompt for p in held_out}
    assert len({p.prompt for p in held_out}) == len(held_out)  # distinct
    assert [p.prompt for p in load_problems("arithmetic", seed=0)] == [p.prompt for p in train]
    assert [p.prompt for p in load_problems("arithmetic", seed=1)] != [p.prompt for p in train]
    # The held-out set does not depend on the run's seed.
    assert load_problems("arithmetic-eval", seed=7) == held_out
    for p in (*train[:50], *held_out):
        a, b = (int(x) for x in p.prompt.removeprefix("What is ").removesuffix("?").split(" + "))
        assert arithmetic.LOW <= a <= arithmetic.HIGH and arithmetic.LOW <= b <= arithmetic.HIGH
        assert p.answer == str(a + b)


class _ChatTokenizer:
    """apply_chat_template as a ChatML tokenizer renders it (enough for the template's text)."""

    chat_template = "chatml"

    def apply_chat_template(self, messages: list[dict[str, str]], **kw: object) -> str:
        assert kw == {"tokenize": False, "add_generation_prompt": True}
        turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return turns + "<|im_start|>assistant\n"


def test_chat_answer_begins_the_reply_and_the_grader_reads_it_back() -> None:
    problem = Problem("What is 17 + 25?", "42", "arithmetic", 0)
    prompt = format_prompt(problem, "chat-answer", _ChatTokenizer())  # type: ignore[arg-type]
    assert prompt.endswith("<|im_start|>assistant\nAnswer: ")
    assert "What is 17 + 25?" in prompt
    assert response_prefix("chat-answer") == ANSWER_PREFIX
    assert graded_text("chat-answer", "42") == "Answer: 42"
    for template in ("dapo", "chat", "raw"):  # the other templates' responses are graded as is
        assert graded_text(template, "42") == "42"


def test_chat_answer_refuses_a_tokenizer_without_a_chat_template() -> None:
    import pytest

    class Plain:
        chat_template = None

    with pytest.raises(ValueError, match="needs a tokenizer with a chat template"):
        format_prompt(Problem("q", "1", "x", 0), "chat-answer", Plain())  # type: ignore[arg-type]
