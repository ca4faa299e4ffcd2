"""The sample record (one stored rollout) is spelled once, in dapo_common.samples: what the
trainer keeps, the store's columns, the trackers' table and the store's reads agree with it, and
a record comes back from the store as the trainer wrote it."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from store_runs import new_attempt

from dapo_common.samples import ADVANTAGE, GROUP, MEMBER, SAMPLE_EXTRAS, SAMPLE_FIELDS, TOKENS
from dapo_core.data.loaders import Problem
from dapo_core.engines.base import Completion
from dapo_core.train.rollout import Group, Rollout, keep_samples, token_record
from dapo_core.train.trackers import SAMPLE_COLUMNS, sample_rows
from db import reads
from db.models import SAMPLES
from db.store import Store


def _group() -> Group:
    """One prompt, two responses: a right one that stopped, a wrong one cut at the limit with
    an overlong penalty of −0.25 (reward = score + penalty, DAPO Eq. 13)."""

    def rollout(text: str, ids: list[int], reason: str, score: float, penalty: float) -> Rollout:
        completion = Completion(0, [5, 6], ids, [-0.1] * len(ids), reason, text)  # type: ignore[arg-type]
        pred = text.split()[1]
        acc = float(score > 0)
        return Rollout(completion, score, acc, pred, penalty, reward=score + penalty)

    return Group(
        problem=Problem(prompt="1 + 2", answer="3", source="t", idx=0),
        prompt="Q: 1 + 2",
        rollouts=[
            rollout("Answer: 3", [7, 8, 1], "stop", 1.0, 0.0),
            rollout("Answer: 4 4 4", [7, 9, 9, 9], "length", -1.0, -0.25),
        ],
        policy_version=0,
    )


def _records() -> list[dict]:
    tokens = token_record(["A", "4", "4", "4"], [-0.1] * 4, [1.0, None, 1.1, 0.9], [0, 0, 1, 0],
                          [0.5, 0.4, 0.3, 0.2], [True, False, True, True])  # fmt: skip
    return keep_samples([_group()], 2, advantages={0: [1.0, -1.0]}, tokens={(0, 1): tokens})


def test_the_trainer_keeps_every_field_and_the_extras() -> None:
    right, wrong = _records()
    assert set(right) == set(SAMPLE_FIELDS) | {GROUP, MEMBER, ADVANTAGE}
    assert set(wrong) == set(SAMPLE_FIELDS) | set(SAMPLE_EXTRAS)
    for record in (right, wrong):
        for name, kind in SAMPLE_FIELDS.items():
            assert isinstance(record[name], kind), (name, record[name])
    assert (wrong["reward"], wrong["score"], wrong["overlong_penalty"]) == (-1.25, -1.0, -0.25)
    assert (wrong["length"], wrong["truncated"], wrong["correct"]) == (4, True, False)
    assert (wrong[GROUP], wrong[MEMBER], wrong[ADVANTAGE]) == (0, 1, -1.0)


def test_the_stores_columns_are_the_fields_in_order_and_type() -> None:
    assert [c.name for c in SAMPLES.columns] == ["run_id", "step", "idx", *SAMPLE_FIELDS, "extra"]
    for name, kind in SAMPLE_FIELDS.items():
        assert SAMPLES.c[name].type.python_type is kind, name
    read = reads.SAMPLE_COLUMNS
    assert read == ["run_id", "step", "idx", *SAMPLE_FIELDS]


def test_the_trackers_table_shows_every_field() -> None:
    columns = SAMPLE_COLUMNS
    assert columns == ("step", *SAMPLE_FIELDS)
    right, wrong = sample_rows(3, _records())
    assert wrong == [3, "Q: 1 + 2", "Answer: 4 4 4", "3", "4", -1.25, -1.0, -0.25, False, 4, True]
    assert right[0] == 3 and right[1:] == [_records()[0][name] for name in SAMPLE_FIELDS]


def test_a_record_comes_back_from_the_store_as_written(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'store.db'}")
    sweep = store.create_sweep(
        name="s", preset="tiny", arms=["grpo"], seeds=[0], base_config={}, ladder=[]
    )
    run_id = new_attempt(store, sweep)
    written = _records()
    # A record the trainer leaves fields out of: NULL, or the column's empty value.
    sparse = {"prompt": None, "response": "r", "correct": None, "reward": math.inf}
    with store.sink(run_id) as sink:
        sink.log_samples(2, [*written, sparse])
    frame = reads.samples(store.engine, run_id)
    assert list(frame.columns) == reads.SAMPLE_COLUMNS
    for idx, record in enumerate(written):
        row = frame.iloc[idx]
        assert {name: row[name] for name in SAMPLE_FIELDS} == {
            name: record[name] for name in SAMPLE_FIELDS
        }
    last = frame.iloc[2]
    assert (last["prompt"], last["response"], last["correct"], last["truncated"]) == (
        "", "r", False, False,
    )  # fmt: skip
    assert pd.isna(last["ground_truth"]) and math.isnan(last["reward"])  # inf is stored as NULL
    groups = reads.sample_groups(store.engine, run_id, 2)
    assert groups[[GROUP, MEMBER, ADVANTAGE]].iloc[:2].values.tolist() == [[0, 0, 1.0],
                                                                           [0, 1, -1.0]]  # fmt: skip
    assert reads.sample_tokens(store.engine, run_id, 2) == {1: written[1][TOKENS]}
