"""The sample record: one rollout as the trainer keeps it (a few per step) for the rollout
browser and the trackers' sample tables.

The trainer writes it (dapo_core.train.rollout.keep_samples), the trackers show it as a table
(dapo_core.train.trackers), the store keeps its fields in columns of `samples` (db.models
Sample, written by db.sink) and reads them back (db.reads). Its keys are spelled here once, below
both dapo_core and db, which may not import each other.
"""

from __future__ import annotations

SAMPLE_FIELDS: dict[str, type] = {
    "prompt": str,  # the prompt as the engine saw it
    "response": str,  # the decoded response
    "ground_truth": str,  # the problem's answer
    "pred": str,  # the answer the grader read from the response
    "reward": float,  # score + overlong_penalty (DAPO Eq. 13)
    "score": float,  # the grader's +1 / -1
    "overlong_penalty": float,  # the soft overlong punishment, <= 0 (0 when it is off)
    "correct": bool,  # the grader's accuracy > 0
    "length": int,  # response tokens
    "truncated": bool,  # ended by the length limit, not by EOS
}
"""The fields of a sample record and their types, in the store's column order: each has a column
of its own in `samples` (besides run_id, step and idx). Text fields may be None where the
trainer had nothing to say (no ground truth, no answer read); numbers may be None too."""

GROUP = "group"
"""The response's group: its index among the step's generated groups (a prompt's G responses)."""
MEMBER = "member"
"""The response's place in its group."""
ADVANTAGE = "advantage"
"""Its group advantage at this step; None when its group was not trained on (dynamic sampling
dropped it, or it waits for the next step)."""
TOKENS = "tokens"
"""Its per-token record (text, p_old, ratio, clip, entropy, eligible lists), when kept."""

SAMPLE_EXTRAS = (GROUP, MEMBER, ADVANTAGE, TOKENS)
"""The further keys the trainer adds to a record: the store keeps them in the row's `extra`
JSON, with any other key a record carries."""
