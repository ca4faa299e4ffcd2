"""One driver of one arm, for the lease tests: `flows.arm.run_arm` in this process, as `dapo
arm` and a served flow run call it, with Ray left out so that the test decides when training
ends.

    python tests/arm_driver.py STORE_URL SWEEP_ID ARM START GO [WALL_EVERY_S]

It waits for the file START to exist (two drivers then claim the arm at the same moment), then
runs the arm. Its "training" (ray_worker.run_training) records which process trained the run
(a `trained-by-<pid>` file in the run directory), says `training run <id>` on stdout, waits
for the file GO, or for its lease to be lost (run_training's `cancel`), then writes its two
steps' metrics. A user's mistake (a lease
held by another process among them) ends as the `dapo` dispatcher ends it: `error: <one line>`
on stderr, exit 2.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any


def main(argv: list[str]) -> int:
    url, sweep_id, arm, start, go = argv[:5]
    from dapo_lab.cli import USER_ERRORS
    from flows import arm as arm_flow
    from flows import heartbeat, ray_worker
    from flows.params import ArmParams, validate

    if len(argv) > 5:
        heartbeat.WALL_EVERY_S = float(argv[5])

    def training(*, run_id: int, out_dir: str, cancel: Any = None, **_: Any) -> dict[str, Any]:
        import os

        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / f"trained-by-{os.getpid()}").write_text(str(run_id))
        print(f"training run {run_id}", flush=True)
        while not Path(go).exists():
            if cancel is not None and cancel.is_set():
                raise ray_worker.LeaseLost(f"run {run_id} was taken over")
            time.sleep(0.05)
        from db.store import Store

        # Its two steps' metrics, as the actor's sink writes them (the flow marks a run
        # completed only when its curve is whole in the store).
        with Store(url).sink(run_id) as sink:
            for step in (1, 2):
                sink.log_metrics(step, {"reward/mean": 0.5})
        return {
            "steps": 2,
            "grad_updates": 2,
            "tokens": 10,
            "host": "test",
            "final_eval": None,
            "checkpoint_dir": out_dir,
            "store_wait_s": 0.0,
        }

    ray_worker.place_arm = lambda *a, **k: []  # type: ignore[assignment]
    ray_worker.run_training = training  # type: ignore[assignment]
    arm_flow.train_in_ray = arm_flow.train_in_ray.fn  # type: ignore[assignment]  # no Prefect
    params = validate(
        ArmParams,
        {"sweep_id": int(sweep_id), "arm": arm, "seed": 0, "store_url": url, "publish": False},
    )
    while not Path(start).exists():
        time.sleep(0.01)
    try:
        result = arm_flow.run_arm(params)
    except USER_ERRORS as exc:
        from dapo_common.util import first_line

        print(f"error: {first_line(exc)}", file=sys.stderr, flush=True)
        return 2
    print(f"{result['status']} run {result['run_id']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
