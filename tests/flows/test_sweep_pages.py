"""A sweep with more runs than one page of a read still shows every run.

Prefect's API answers a list read with at most its page (PREFECT_SERVER_API_DEFAULT_LIMIT, 200
by default) unless asked otherwise, and a grid sweep can have more arms than that. Here the
page is lowered to 3 (a fake client that pages like the server) and the sweep has 8 arms, so
a single read would see 3 of them. The store's side (`dapo table`, the dashboard's sweeps
listing, the sweep's published table) is checked with the same 8 runs: none of them reads
a fixed page today, and this pins that. Seconds, no Prefect server, no training.
"""

from __future__ import annotations

import contextlib
import csv
import io
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from uuid import UUID, uuid4

import pytest
from store_runs import new_attempt

from db.store import Store

PAGE = 3
ARMS = [f"grpo-clip_high=0.{200 + i}" for i in range(8)]  # more arms than PAGE, not a multiple


class PagedClient:
    """The slice of Prefect's sync client a sweep reads, returning at most PAGE rows a read
    (as the server does when no limit is asked for)."""

    def __init__(self, children: dict[UUID, UUID]) -> None:
        self.children = children  # flow run id -> parent flow run id
        self.cancelled: list[UUID] = []
        self.reads = 0

    def read_flow_runs(
        self, *, flow_run_filter: Any, sort: Any = None, limit: int | None = None, offset: int = 0
    ) -> list[Any]:
        self.reads += 1
        parents = set(flow_run_filter.parent_flow_run_id.any_)
        mine = sorted(run for run, parent in self.children.items() if parent in parents)
        page = min(PAGE, limit or PAGE)
        return [SimpleNamespace(id=run) for run in mine[offset : offset + page]]

    def read_flow_run(self, flow_run_id: UUID) -> Any:
        return SimpleNamespace(state=SimpleNamespace(is_final=lambda: False))

    def set_flow_run_state(self, flow_run_id: UUID, state: Any) -> None:
        self.cancelled.append(flow_run_id)


@pytest.fixture
def sweep_runs() -> tuple[UUID, dict[UUID, UUID]]:
    parent, other = uuid4(), uuid4()
    children = {uuid4(): parent for _ in ARMS}
    children |= {uuid4(): other for _ in range(2)}  # another sweep's arms: never touched
    return parent, children


def test_child_flow_runs_reads_every_page(sweep_runs: tuple[UUID, dict[UUID, UUID]]) -> None:
    from flows.sweep import child_flow_runs

    parent, children = sweep_runs
    client = PagedClient(children)
    found = [run.id for run in child_flow_runs(client, parent)]
    mine = {run for run, p in children.items() if p == parent}
    assert len(found) == len(ARMS) == len(set(found)) and set(found) == mine
    # 8 rows in pages of 3: 3 + 3 + 2, then the empty page that ends the reads.
    assert client.reads == 4


def test_a_cancelled_sweep_cancels_every_arm_past_a_page(
    sweep_runs: tuple[UUID, dict[UUID, UUID]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import prefect.client.orchestration as orchestration

    from flows.sweep import _sweep_interrupted

    parent, children = sweep_runs
    client = PagedClient(children)

    @contextlib.contextmanager
    def get_client(**_: Any) -> Iterator[PagedClient]:
        yield client

    monkeypatch.setattr(orchestration, "get_client", get_client)
    flow_run = SimpleNamespace(
        id=parent, parameters={"store_url": f"sqlite:///{tmp_path / 'store.db'}"}
    )
    state = SimpleNamespace(is_cancelled=lambda: True, name="Cancelled")
    _sweep_interrupted(None, flow_run, state)
    assert set(client.cancelled) == {run for run, p in children.items() if p == parent}


def _grid_sweep(url: str) -> int:
    """A completed sweep of len(ARMS) one-step runs (a start and a final evaluation each)."""
    store = Store(url)
    ladder = [
        {"arm": arm, "adds": arm, "parent": None if i == 0 else ARMS[0], "paper_score": None}
        for i, arm in enumerate(ARMS)
    ]
    config = {"preset": "tiny", "run": {"steps": 1, "seed": 0}}
    sweep_id = store.create_sweep(
        name="wide", preset="tiny", arms=ARMS, seeds=[0], base_config=config, ladder=ladder
    )
    for i, arm in enumerate(ARMS):
        run_id = new_attempt(
            store, sweep_id, arm, 0, config={**config, "arm": arm}, config_hash=f"hash{i}"
        )
        with store.sink(run_id) as sink:
            for step, score in ((0, 0.2), (1, 0.2 + 0.01 * i)):
                sink.log_evaluation(
                    step,
                    {"dataset": "held-out", "k": 1, "avg_at_k": score, "pass_at_k": score,
                     "n_problems": 10},
                )  # fmt: skip
        store.update_run(run_id, status="completed", steps=1, grad_updates=1, wall_s=1.0)
    store.set_sweep_status(sweep_id, "completed")
    return sweep_id


def test_store_lists_every_run_of_a_wide_sweep(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dapo_lab.cli import main
    from db import ablation
    from db.engine import get_engine
    from flows.publish import text

    url = f"sqlite:///{tmp_path / 'store.db'}"
    sweep_id = _grid_sweep(url)

    assert main(["table", "--sweep", str(sweep_id), "--store", url, "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [row["arm"] for row in rows] == ARMS

    listed = ablation.list_sweeps(get_engine(url), sweep_id).iloc[0]  # the dashboard's listing
    assert (listed["runs_done"], listed["arms_total"]) == (len(ARMS), len(ARMS))
    published = text(url, sweep_id)  # what the sweep prints and publishes at its end
    assert all(arm in published for arm in ARMS)
