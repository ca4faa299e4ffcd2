"""`dapo deploy` and `dapo worker`: the three deployments on a Prefect work pool, and a worker.

`dapo serve` is one process that serves the deployments and runs their flow runs. A team runs
it the other way round: a Prefect server of its own, the deployments registered on a work
pool (`dapo deploy`), and workers (`dapo worker`) wherever the runs should start, each polling
the pool. The deployments are `flows.serve.deployments()`, the same objects `dapo serve`
serves, so the forms are the same; `prefect.yaml` describes the same three for `prefect deploy`
(tests/flows/test_flows_pool.py checks that the two agree).

What `dapo worker` adds to `prefect worker start --pool NAME`:
- it refuses a pool that does not exist (Prefect's worker would create an empty one, and wait
  on it for ever after a typo) or is not a process pool, in one line;
- it joins Ray once (--ray-address, $RAY_ADDRESS, else a local instance of its own) and
  exports RAY_ADDRESS, so that the sweep and its arms, each a flow-run subprocess, share one
  Ray and the sweep's pacing by Ray's resources means something;
- `--store` travels as with `dapo serve`: the flow runs inherit DAPO_DB_URL from the worker.

A worker's machine that dies takes its flow runs' processes with it, and nothing reports those
runs any more: the deployments make their runs send Prefect heartbeats every HEARTBEAT_S, and
the automation `dapo deploy` creates marks a run Crashed once they stop (Prefect's recipe for
"zombie" runs). Rerunning the arm then resumes it from its last checkpoint. A worker killed
alone leaves its runs going: each runs in a process (and session) of its own.

Concurrency: `--limit N` on deploy is the `dapo-arm` deployment's concurrency limit, counted
by the server over every worker of the pool. A limit on the whole pool would count sweeps
too, and a sweep holding the last slot while it waits for its arms would wait for ever.
"""

from __future__ import annotations

import os
import signal
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

DEFAULT_POOL = "dapo"
POOL_TYPE = "process"
# How often a worker asks the server for runs (Prefect's default: 10 s), as `dapo serve` does.
WORKER_POLL_S = 2
# Seconds between a flow run's heartbeats (Prefect's minimum is 30, its default 180).
HEARTBEAT_S = 30
# A flow run whose heartbeats stopped this long ago is marked Crashed (Prefect's docs use 90).
CRASH_AFTER_S = 90
AUTOMATION_NAME = "dapo: crash flow runs whose heartbeat stopped"
HEARTBEAT_ENV = {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(HEARTBEAT_S)}
TAG = "dapo"


def api_url() -> str:
    """The Prefect server this command talks to (env or Prefect profile), checked to answer."""
    from prefect.settings import PREFECT_API_URL

    from flows.local_server import healthy

    url = os.environ.get("PREFECT_API_URL") or PREFECT_API_URL.value()
    if not url:
        raise ValueError(
            "no Prefect server: start one (`prefect server start`, or with PostgreSQL, see the "
            "README) and set PREFECT_API_URL=http://HOST:4200/api"
        )
    if not healthy(url):
        raise ConnectionError(f"no Prefect server answers at PREFECT_API_URL={url}")
    return str(url)


def read_pool(client: Any, name: str) -> Any | None:
    from prefect.exceptions import ObjectNotFound

    try:
        return client.read_work_pool(name)
    except ObjectNotFound:
        return None


def check_worker_pool(pool: Any | None, name: str, url: str) -> None:
    """A worker's pool must exist and be a process pool (ValueError, one line, if not)."""
    if pool is None:
        raise ValueError(
            f"no work pool named {name!r} on the Prefect server at {url}: create it and its "
            f"deployments with `dapo deploy --pool {name}`"
        )
    if pool.type != POOL_TYPE:
        raise ValueError(
            f"work pool {name!r} is a {pool.type!r} pool and `dapo worker` runs a process "
            f"worker: start that pool's own worker (`prefect worker start --pool {name}`, "
            "with its integration package), or use a process pool"
        )


def check_deploy_pool(pool: Any | None, name: str, image: str | None) -> None:
    """A pool other than a process pool starts each flow run in a container: it needs an
    image with dapo-lab installed (ValueError, one line, if none is given)."""
    if pool is not None and pool.type != POOL_TYPE and not image:
        raise ValueError(
            f"work pool {name!r} is a {pool.type!r} pool: its flow runs start from a container "
            "image; name one with dapo-lab installed (--image), or deploy to a process pool"
        )
    if pool is None and image:
        raise ValueError(
            f"work pool {name!r} does not exist and `dapo deploy` creates process pools only, "
            "which take no image: create the pool first (`prefect work-pool create "
            f"{name} --type kubernetes`), or leave out --image"
        )
    if pool is not None and pool.type == POOL_TYPE and image:
        raise ValueError(
            f"work pool {name!r} is a process pool: its flow runs start in the worker's own "
            "environment, not from an image; leave out --image"
        )


def zombie_automation(crash_after_s: int) -> Any:
    """Prefect's recipe for runs whose process died with its machine (docs: "detect zombie
    flows"), limited to this project's flow runs (the deployments' tag): after a heartbeat,
    expect another heartbeat or a final state within `crash_after_s`, else mark it Crashed."""
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    return AutomationCore(
        name=AUTOMATION_NAME,
        description=(
            f"A dapo flow run that sent no heartbeat for {crash_after_s} s (its process died "
            "with its worker's machine) is marked Crashed; rerunning the arm resumes it from "
            "its last checkpoint."
        ),
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={
                "prefect.flow-run.heartbeat",
                "prefect.flow-run.Completed",
                "prefect.flow-run.Failed",
                "prefect.flow-run.Cancelled",
                "prefect.flow-run.Crashed",
            },
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            match_related=ResourceSpecification(
                {"prefect.resource.role": "tag", "prefect.resource.id": f"prefect.tag.{TAG}"}
            ),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=crash_after_s),
        ),
        actions=[
            ChangeFlowRunState(
                state=StateType.CRASHED,
                message=f"no heartbeat for {crash_after_s} s: its process is gone",
            )
        ],
    )


def ensure_automation(client: Any, crash_after_s: int) -> None:
    """One automation of that name, with this window (a redeploy replaces it)."""
    for old in client.read_automations_by_name(AUTOMATION_NAME):
        client.delete_automation(old.id)
    client.create_automation(zombie_automation(crash_after_s))


def deploy(
    *, pool: str, limit: int | None, image: str | None, crash_after_s: int = CRASH_AFTER_S
) -> int:
    """Create the pool if missing, register the three deployments on it; returns 0."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.workers.process import ProcessWorker

    from flows.arm import FLOW_NAME as ARM_FLOW
    from flows.serve import deployments

    url = api_url()
    with (
        temporary_settings(updates={PREFECT_API_URL: url}),
        get_client(sync_client=True) as client,
    ):
        found = read_pool(client, pool)
        check_deploy_pool(found, pool, image)
        if found is None:
            client.create_work_pool(
                WorkPoolCreate(
                    name=pool,
                    type=POOL_TYPE,
                    base_job_template=ProcessWorker.get_default_base_job_template(),
                )
            )
            print(f"created work pool {pool!r} (type {POOL_TYPE})", flush=True)
        else:
            print(f"using work pool {pool!r} (type {found.type})", flush=True)
        names = []
        for deployment in deployments():
            # Whatever worker starts the run (a bare `prefect worker start`, a Kubernetes
            # one), its heartbeats come as often as the automation below expects them.
            deployment.job_variables = {**deployment.job_variables, "env": HEARTBEAT_ENV}
            if deployment.flow_name == ARM_FLOW:
                # None lifts a limit an earlier deploy set.
                deployment.concurrency_limit = limit
            deployment.apply(work_pool_name=pool, image=image)
            names.append(f"{deployment.flow_name}/{deployment.name}")
        ensure_automation(client, crash_after_s)
    ui = url.rstrip("/").removesuffix("/api")
    print(
        f"deployed to work pool {pool!r}: {', '.join(names)}\n"
        + (
            f"at most {limit} arm(s) train at once over all workers of the pool\n"
            if limit
            else "arms: no limit of Prefect's (each sweep paces its arms by Ray's resources)\n"
        )
        + f"a flow run silent for {crash_after_s} s (its worker's machine died) is marked "
        "Crashed; rerunning its arm resumes from the last checkpoint\n\n"
        f"Start a worker where the runs should start (e.g. the Ray head node):\n"
        f"  PREFECT_API_URL={url} dapo worker --pool {pool} [--store URL] [--ray-address ADDR]\n"
        f"Trigger a sweep: {ui}/deployments → dapo-sweep → Run → Custom run, or\n"
        f"  PREFECT_API_URL={url} prefect deployment run ablation-sweep/dapo-sweep "
        "--param preset=tiny",
        flush=True,
    )
    return 0


def worker(*, pool: str, ray_address: str | None, limit: int | None, name: str | None) -> int:
    """Check the pool, share Ray, then run Prefect's process worker in this process until
    interrupted; returns the exit code. The caller has set DAPO_DB_URL from --store."""
    from prefect.client.orchestration import get_client
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_WORKER_QUERY_SECONDS,
        temporary_settings,
    )

    from flows.plan import RUNS_DIR_ENV, runs_dir

    # Started in the background by a script, SIGINT arrives ignored; `kill -INT` should stop
    # the worker just like Ctrl-C does (as with `dapo serve`).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    url = api_url()
    with (
        temporary_settings(updates={PREFECT_API_URL: url}),
        get_client(sync_client=True) as client,
    ):
        check_worker_pool(read_pool(client, pool), pool, url)
    os.environ["PREFECT_API_URL"] = url  # the flow-run subprocesses read it
    # Flow runs start in a fresh temporary directory: a relative runs directory would land there.
    if os.environ.get(RUNS_DIR_ENV):
        os.environ[RUNS_DIR_ENV] = str(Path(os.environ[RUNS_DIR_ENV]).expanduser().resolve())
    for key, value in HEARTBEAT_ENV.items():  # for deployments registered without it
        os.environ.setdefault(key, value)

    from flows import ray_worker
    from flows.cluster import runs_dir_warning
    from flows.serve import share_ray

    ray_line, nodes = share_ray(ray_address)
    print(
        f"Prefect server: {url}\nwork pool: {pool!r} (process worker"
        + (f", at most {limit} flow run(s) at once" if limit else "")
        + f")\n{ray_line}\nRun directories (checkpoints): {runs_dir()}\n"
        "Stop with Ctrl-C.\n",
        flush=True,
    )
    warning = runs_dir_warning(runs_dir(), nodes)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    updates: dict[Any, Any] = {PREFECT_API_URL: url}
    if not os.environ.get("PREFECT_WORKER_QUERY_SECONDS"):
        updates[PREFECT_WORKER_QUERY_SECONDS] = WORKER_POLL_S
    try:
        with temporary_settings(updates=updates):
            _run_worker(pool, limit, name)
    except KeyboardInterrupt:
        pass
    finally:
        ray_worker.shutdown()
    return 0


def _run_worker(pool: str, limit: int | None, name: str | None) -> None:
    """What `prefect worker start --pool POOL --type process` does, in this process (so that
    the Ray instance it may have started lives exactly as long as the worker)."""
    import anyio
    from prefect.settings import PREFECT_WORKER_HEARTBEAT_SECONDS, PREFECT_WORKER_PREFETCH_SECONDS
    from prefect.utilities.processutils import setup_signal_handlers_worker
    from prefect.workers.process import ProcessWorker

    # Prefect's own: SIGTERM stops polling (a second one kills what is left), like Ctrl-C.
    setup_signal_handlers_worker(os.getpid(), "the process worker", print)

    async def work() -> None:
        process_worker = ProcessWorker(
            name=name,
            work_pool_name=pool,
            limit=limit,
            prefetch_seconds=PREFECT_WORKER_PREFETCH_SECONDS.value(),
            heartbeat_interval_seconds=int(PREFECT_WORKER_HEARTBEAT_SECONDS.value()),
            create_pool_if_not_found=False,
        )
        await process_worker.start(printer=print)

    anyio.run(work)


# --- the commands ------------------------------------------------------------------------------
POOL_ENV_HELP = """\
where things go:
  Prefect                        $PREFECT_API_URL: a server of your own (`prefect server start`;
                                 for a team, on PostgreSQL), needed by deploy and worker
  the experiment store           worker --store, else $DAPO_DB_URL, else a SQLite file
  run directories (checkpoints)  $DAPO_RUNS_DIR, default {runs}
                                 (a cluster: one shared file system, the same path on every node)
  Ray                            worker --ray-address, else $RAY_ADDRESS, else a local instance"""


def register(subparsers: Any) -> None:
    """Add `deploy` and `worker` to the `dapo` dispatcher (dapo_lab.cli's registrars)."""
    import argparse

    from dapo_common.cli_args import positive_int
    from db.cli import store_argument
    from flows.plan import default_runs_dir

    epilog = POOL_ENV_HELP.format(runs=default_runs_dir())

    p = subparsers.add_parser(
        "deploy",
        help="register the dapo-sweep, dapo-arm and dapo-eval deployments on a Prefect work pool",
        description="Register the three deployments (the same forms as `dapo serve`) on a work "
        "pool of the Prefect server at $PREFECT_API_URL, creating the pool (a process pool) if "
        "it does not exist. Workers started with `dapo worker --pool NAME` run the flow runs. "
        "Run it again after an upgrade: it updates the deployments in place.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--pool", default=DEFAULT_POOL, help=f"work pool (default {DEFAULT_POOL})")
    p.add_argument(
        "--limit",
        type=positive_int,
        help="most arms training at once over all the pool's workers (the dapo-arm "
        "deployment's concurrency limit; sweeps and evaluations are not counted; default: none)",
    )
    p.add_argument(
        "--image",
        help="for a pool of another type (kubernetes, docker): the image its flow runs start "
        "from, with dapo-lab installed",
    )
    p.add_argument(
        "--crash-after",
        type=positive_int,
        default=CRASH_AFTER_S,
        metavar="SECONDS",
        help=f"mark a flow run Crashed when its heartbeats (every {HEARTBEAT_S} s from a "
        f"`dapo worker`) stop for this long (default {CRASH_AFTER_S}; at least {2 * HEARTBEAT_S})",
    )
    p.set_defaults(func=cmd_deploy)

    p = subparsers.add_parser(
        "worker",
        help="run the flow runs of a work pool's deployments (a Prefect process worker)",
        description="Poll a work pool of the Prefect server at $PREFECT_API_URL and run its "
        "flow runs, each in a subprocess of this machine (Prefect's process worker), all joined "
        "to one Ray: --ray-address / $RAY_ADDRESS, else a local Ray instance started here. Start "
        "as many as you like, on as many machines: they share the pool's runs. Stop with Ctrl-C.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--pool", default=DEFAULT_POOL, help=f"work pool (default {DEFAULT_POOL})")
    p.add_argument(
        "--limit", type=positive_int, help="most flow runs of this worker at once (default: none)"
    )
    p.add_argument("--name", help="the worker's name in the Prefect UI (default: generated)")
    p.add_argument(
        "--ray-address", help="Ray cluster to join (default: $RAY_ADDRESS, else a local one)"
    )
    store_argument(p)  # the default store of the flow runs it starts
    p.set_defaults(func=cmd_worker)


def cmd_deploy(args: Any) -> int:
    from flows.commands import prepare_terminal

    if args.crash_after < 2 * HEARTBEAT_S:
        raise ValueError(
            f"--crash-after {args.crash_after}: at least {2 * HEARTBEAT_S} s, two heartbeats, "
            "or a late heartbeat crashes a live run"
        )
    prepare_terminal(quiet_prefect=False)
    return deploy(
        pool=args.pool, limit=args.limit, image=args.image, crash_after_s=args.crash_after
    )


def cmd_worker(args: Any) -> int:
    from flows.commands import prepare_terminal

    if args.store:
        # Opened now (a bad URL is one line before anything starts), then inherited by the
        # flow runs, which start in this process's environment: as with `dapo serve --store`.
        from db.engine import ENV_VAR
        from db.store import Store

        os.environ[ENV_VAR] = Store(args.store, open_wait_s=0).url
    prepare_terminal(quiet_prefect=False)
    return worker(pool=args.pool, ray_address=args.ray_address, limit=args.limit, name=args.name)
