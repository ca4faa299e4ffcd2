"""The entrypoint of an arm's Ray job (flows/ray_jobs.py): `python -m flows.job_entry RUN_ID`.

Trains store run RUN_ID, whose config and run directory the store holds, into the same store
($DAPO_DB_URL, set in the job's runtime_env: a URL may hold a password, so it is never on the
command line). $DAPO_JOB holds who owns the run directory and the arm's resources. It speaks to
the flow that watches it through its log, one JSON line per event (ray_jobs.PROGRESS, PLACED,
RESULT, ERROR); everything else it prints is its own output.

One worker trains here, in the entrypoint's process, with the CPUs and GPUs the job's
entrypoint was given (torch gets that many threads; Ray sets CUDA_VISIBLE_DEVICES). N workers:
this process is the driver of N actors in one placement group, as a flow's process is in the
default mode (ray_worker.run_training).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Any


def say(prefix: str, data: Any) -> None:
    print(prefix + json.dumps(data, default=str), flush=True)


def main(argv: list[str] | None = None) -> int:
    from flows import ray_jobs

    args = sys.argv[1:] if argv is None else argv
    try:
        if len(args) != 1 or not args[0].isdigit():
            raise ValueError(f"usage: python -m flows.job_entry RUN_ID (got {' '.join(args)!r})")
        result = train(int(args[0]))
    except BaseException as exc:
        from dapo_common.util import first_line

        # The one line the flow records (the traceback follows, for the log).
        say(ray_jobs.ERROR, first_line(exc, with_type=True))
        raise
    say(ray_jobs.RESULT, result)
    return 0


def train(run_id: int) -> dict[str, Any]:
    from db.store import Store
    from flows import cluster, ray_jobs, ray_worker
    from flows.params import Resources
    from flows.rollout_actor import host_for, placement_of

    spec = json.loads(os.environ[ray_jobs.JOB_ENV])
    owner, resources = spec["owner"], Resources.model_validate(spec["resources"])
    store_url = os.environ[ray_jobs.STORE_URL_ENV]
    run = Store(store_url).get_run(run_id)
    config, out_dir = dict(run["config"]), str(run["checkpoint_dir"])

    def on_progress(update: dict[str, Any]) -> None:
        say(ray_jobs.PROGRESS, update)

    if resources.workers > 1:
        ray_worker.connect()  # the job's cluster ($RAY_ADDRESS, set by Ray for its jobs)

        def on_placed(places: list[dict[str, Any]]) -> None:
            say(ray_jobs.PLACED, {"host": cluster.describe(places)})

        return ray_worker.run_training(
            run_id=run_id,
            config=config,
            store_url=store_url,
            out_dir=out_dir,
            owner=owner,
            resources=resources,
            on_progress=on_progress,
            on_placed=on_placed,
        )
    # One worker trains here, with the CPUs the job's entrypoint was given.
    import torch

    torch.set_num_threads(max(1, int(resources.cpus)))
    host = f"{socket.gethostname()} (Ray job)"
    say(ray_jobs.PLACED, {"host": host})
    job = ray_worker.TrainJob(config, store_url, run_id, out_dir, owner)
    placement = placement_of(resources)
    if placement is not None:
        ray_worker.connect()  # the engine's actor goes on the job's cluster
    engine_host = host_for(placement, config, wait_s=ray_worker.placement_wait_s())
    return {**ray_worker.train_one_worker(job, on_progress, engine_host=engine_host), "host": host}


if __name__ == "__main__":
    sys.exit(main())
