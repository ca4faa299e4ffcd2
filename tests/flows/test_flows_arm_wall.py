"""An attempt's wall time (integrity item 13, the rest): the sum of its tries' training time,
without the time their store sinks spent waiting on a store that was down.

The sink counts that wait (db.sink.SqlSink.waited_s, here through a real PostgreSQL outage: a
TCP proxy taken down and brought back); the actor reports it with its progress and its result
(flows.ray_worker.store_wait_s); the driver leaves it out of each try's time (flows.arm.TryClock),
also for a try whose actor died, and the attempt's last write carries a try's time that the
store was too far gone to take when the try ended.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from store_outage import new_run
from store_runs import new_attempt
from tcp_proxy import TcpProxy

from db.store import Store


def test_the_sink_counts_the_seconds_it_waited_on_a_store_that_was_down(
    proxy: TcpProxy,
    pg_urls: tuple[str, str],
    tmp_path: Path,
) -> None:
    """Steps logged while the store is down do not wait (they are queued); close() waits for
    the store to come back, and that wait is what waited_s says. A sink that met no outage
    waited 0 s."""
    _, through = pg_urls
    store, run_id = new_run(through, outage_s=60)
    with store.sink(run_id, spill_dir=tmp_path) as calm:
        calm.log_metrics(1, {"m": 1.0})
    assert calm.waited_s == 0.0

    sink = store.sink(run_id, spill_dir=tmp_path)
    proxy.stop()
    sink.log_metrics(2, {"m": 2.0})
    assert sink.pending == 1
    back = threading.Timer(2.0, proxy.start)
    back.start()
    t0 = time.monotonic()
    sink.close()
    closing = time.monotonic() - t0
    back.join()
    assert sink.pending == 0
    # Everything close() spent was waiting for the store, but the final write itself.
    assert 1.0 < sink.waited_s <= closing + 0.5, (sink.waited_s, closing)


def test_the_actor_reports_its_sinks_wait_behind_the_trackers_fan_out() -> None:
    from flows import ray_worker

    sql = SimpleNamespace(waited_s=12.5)
    assert ray_worker.store_wait_s(sql) == 12.5
    assert ray_worker.store_wait_s(SimpleNamespace(primary=sql)) == 12.5
    assert ray_worker.store_wait_s(None) == 0.0


def _run(url: str) -> tuple[Store, int]:
    store = Store(url)
    sweep_id = store.create_sweep(
        name="wall", preset="tiny", arms=["grpo"], seeds=[0], base_config={},
        ladder=[{"arm": "grpo"}],
    )  # fmt: skip
    run_id = new_attempt(store, sweep_id, "grpo", 0, config_hash="h")
    return store, run_id


def test_wall_time_is_the_tries_training_time_without_store_outage_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Try 1 runs 50 s, 10 of them waiting on the store (its last progress update said so),
    then its actor dies. Try 2 runs 30 s, of which its sink waited 5 (its result says so).
    The attempt trained (50 - 10) + (30 - 5) = 65 s; it used to read 80 s."""
    from flows import arm, heartbeat, ray_worker
    from flows.params import Resources

    url = f"sqlite:///{tmp_path / 'store.db'}"
    store, run_id = _run(url)
    now = [1_000.0]
    monkeypatch.setattr(heartbeat, "time", SimpleNamespace(monotonic=lambda: now[0]))

    def dies(*, on_progress: Any, **_k: Any) -> dict[str, Any]:
        now[0] += 50.0
        on_progress({"step": 1, "steps": 2, "store_wait_s": 10.0})
        raise ray_worker.ActorLost("worker 0 died (test)")

    def finishes(*, on_progress: Any, **_k: Any) -> dict[str, Any]:
        on_progress({"step": 2, "steps": 2, "store_wait_s": 1.0})  # a new sink: its own count
        now[0] += 30.0
        return {"steps": 2, "store_wait_s": 5.0}

    args = (run_id, "grpo s0", {}, url, str(tmp_path / "run"), {}, Resources().model_dump())
    monkeypatch.setattr(ray_worker, "run_training", dies)
    with pytest.raises(ray_worker.ActorLost):
        arm.train_in_ray.fn(*args)
    assert store.get_run(run_id)["wall_s"] == 40.0
    monkeypatch.setattr(ray_worker, "run_training", finishes)
    assert arm.train_in_ray.fn(*args)["steps"] == 2
    run = store.get_run(run_id)
    assert (run["tries"], run["wall_s"]) == (2, 65.0)


def test_a_failed_attempt_keeps_the_time_of_a_try_the_store_missed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The try's last write of its time met a store outage, and the attempt then failed (no
    retry to carry the time on): the failure's record carries it, instead of losing it."""
    from db.errors import StoreUnavailable
    from flows import arm, heartbeat, ray_worker
    from flows.params import ArmParams, Resources

    url = f"sqlite:///{tmp_path / 'store.db'}"
    store, run_id = _run(url)
    now = [1_000.0]
    monkeypatch.setattr(heartbeat, "time", SimpleNamespace(monotonic=lambda: now[0]))

    def down(*_a: Any, **_k: Any) -> bool:
        raise StoreUnavailable("the store is unreachable (test)")

    def fails(**_k: Any) -> dict[str, Any]:
        now[0] += 42.0
        raise ray_worker.TrainingFailed("RuntimeError: boom", "traceback")

    monkeypatch.setattr(Store, "set_wall", down)
    monkeypatch.setattr(ray_worker, "run_training", fails)
    args = (run_id, "grpo s0", {}, url, str(tmp_path / "run"), {}, Resources().model_dump())
    with pytest.raises(ray_worker.TrainingFailed) as failed:
        arm.train_in_ray.fn(*args)
    assert store.get_run(run_id)["wall_s"] is None
    params = ArmParams(sweep_id=1, arm="grpo", seed=0, store_url=url, publish=False)
    arm._record_failure(store, params, "grpo s0", run_id, failed.value)
    run = store.get_run(run_id)
    assert (run["status"], run["wall_s"]) == ("failed", 42.0)
