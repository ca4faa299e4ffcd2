"""The Sweeps page lists the newest 25 sweeps unless asked for more: each listed sweep's
progress and leader cost its ablation table once per dashboard process (issue 27), so a first
load grows with what is shown, not with what the store holds."""

from __future__ import annotations

import dashboard_fixtures as fx
import pandas as pd
import pytest
from store_runs import new_attempt

from db import ablation
from db import annotations as ann
from db.store import Store

SWEEPS = 30


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[int]]:
    url = f"sqlite:///{tmp_path_factory.mktemp('many-sweeps') / 'store.db'}"
    store = Store(url)
    config = fx.arm_config("grpo", 0)
    ids = [
        store.create_sweep(
            name=f"s{i}", preset="tiny", arms=["grpo"], seeds=[0], base_config=config, ladder=[]
        )
        for i in range(SWEEPS)
    ]
    run_id = new_attempt(store, ids[-1], "grpo", 0, config=config, config_hash="h")
    store.update_run(run_id, status="completed", steps=1)
    ann.set_hidden(store.engine, ids[-2])  # a hidden one among the newest
    return url, ids


def test_listing_some_sweeps_gives_their_rows_of_the_full_list(many: tuple[str, list[int]]) -> None:
    url, ids = many
    engine = Store(url).engine
    # `some` first: list_sweeps keeps ended sweeps' rows per process, and they must be computed
    # here, not read back from the full list's.
    ablation._ENDED_ROWS.clear()
    some = ablation.list_sweeps(engine, among=[ids[0], ids[-1]])
    full = ablation.list_sweeps(engine)
    expected = full[full["sweep_id"].isin([ids[0], ids[-1]])].reset_index(drop=True)
    pd.testing.assert_frame_equal(
        some.drop(columns="leader"), expected.drop(columns="leader"), check_like=True
    )
    assert ablation.list_sweeps(engine, among=[]).empty


def test_the_page_lists_the_newest_25_then_all(
    many: tuple[str, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, ids = many
    monkeypatch.setenv("DAPO_DB_URL", url)
    at = fx.open_page("sweeps")
    newest = [i for i in reversed(ids) if i != ids[-2]]  # the hidden one is left out
    assert at.dataframe[0].value["sweep_id"].tolist() == newest[:25]
    captions = "\n".join(c.value for c in at.caption)
    assert "25 sweep(s) of 29, the newest" in captions and "1 hidden" in captions
    at.selectbox(key="sweeps-listed").set_value("all").run()
    assert at.dataframe[0].value["sweep_id"].tolist() == newest
    assert "of 29" not in "\n".join(c.value for c in at.caption)
