"""A real `prefect server start` for the tests that need one, and the waits around it.

    with prefect_server.running(tmp / "prefect-server", ui=True) as api_url:
        ...   # http://127.0.0.1:PORT/api; the server is stopped by its process group after

The server gets a free port of 127.0.0.1 and a PREFECT_HOME of its own (its database); with
`ui` it also serves the v1 UI, the one tests/prefect_ui.py drives, reading this API (left
unset, the UI's pages would call the default port 4200). The suite's tests share one per test
process (conftest.shared_prefect_server, with the UI); what the flow tests do with it goes
through the helpers below: a client, a flow run of a deployment (what the UI's Run button
does), a wait for a final state, a flow run's logs, deployments removed after a module.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from dapo_cli import FLOW_TIMEOUT_S

from dapo_common.util import free_port

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
# A first start migrates a fresh database (.ci/run's is empty): tens of seconds when loaded.
START_TIMEOUT_S = 300.0
# The deployments of `dapo serve` and `dapo deploy` (flows/serve.py), by their full names.
DEPLOYMENTS = ("ablation-sweep/dapo-sweep", "ablation-arm/dapo-arm", "evaluate-run/dapo-eval")
# How often a wait asks the server or the store again: a flow takes tens of seconds, and each
# look costs the test process CPU (0.2 s between looks was a third of a core while waiting).
FLOW_POLL_S = 1.0


def wait_for(
    check: Callable[[], Any],
    what: str,
    timeout_s: float = FLOW_TIMEOUT_S,
    proc: subprocess.Popen | None = None,
    log: Path | None = None,
    poll_s: float = 0.2,
) -> Any:
    """Poll `check` until it returns something truthy (an event or a state, not a guess at
    timing); fail with the log's tail when `proc` exits first or `timeout_s` runs out (a
    ceiling only a hang reaches, by default the flows' FLOW_TIMEOUT_S)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            tail = log.read_text()[-3000:] if log and log.exists() else ""
            pytest.fail(f"{what}: the process exited with {proc.returncode}\n{tail}")
        time.sleep(poll_s)
    tail = log.read_text()[-3000:] if log and log.exists() else ""
    pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}\n{tail}")


def healthy(api_url: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{api_url}/health", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> None:
    """Stop `proc` and its process group (it was started in a session of its own)."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@contextmanager
def running_fresh(template_dir: Path, *, ui: bool = False) -> Iterator[str]:
    """A server like `running`'s on a database of its own (a temporary PREFECT_HOME, removed
    after), started from a copy of a migrated one kept in `template_dir` (taken from the first
    server on a machine once it answers): a fresh database without the minutes of migrations.
    Never one that another process's server uses: two servers on one database run each
    other's deployments (two test sessions on one machine took each other's flow runs)."""
    import sqlite3

    template = template_dir / "prefect.db"
    home = Path(tempfile.mkdtemp(prefix="dapo-prefect-"))
    try:
        if template.exists():
            shutil.copyfile(template, home / "prefect.db")
        with running(home, ui=ui) as api_url:
            if not template.exists():
                template_dir.mkdir(parents=True, exist_ok=True)
                partial = template_dir / f"prefect.db.{os.getpid()}"
                with (
                    sqlite3.connect(home / "prefect.db") as source,
                    sqlite3.connect(partial) as copy,
                ):
                    source.backup(copy)  # consistent while the server writes
                os.replace(partial, template)
            yield api_url
    finally:
        shutil.rmtree(home, ignore_errors=True)


@contextmanager
def running(home: Path, *, ui: bool = False) -> Iterator[str]:
    """A Prefect server with its database in `home` (created), until the block ends; yields
    its API URL once it answers."""
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "true" if ui else "false",
    }
    if ui:
        env.update({"PREFECT_SERVER_UI_V2_ENABLED": "false", "PREFECT_UI_API_URL": api_url})
    env.pop("PREFECT_API_URL", None)
    log = home / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(lambda: healthy(api_url), "the Prefect server", START_TIMEOUT_S, proc, log)
        yield api_url
    finally:
        stop(proc)


# --- what the flow tests do with a server ----------------------------------------------------
@contextmanager
def client(api_url: str) -> Iterator[Any]:
    """Prefect's synchronous client of the server at `api_url` (this process's own Prefect
    settings name none: conftest.shared_prefect_server leaves them to the commands)."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with (
        temporary_settings(updates={PREFECT_API_URL: api_url}),
        get_client(sync_client=True) as prefect,
    ):
        yield prefect


def trigger(api_url: str, deployment: str, parameters: dict[str, Any]) -> UUID:
    """What the UI's "Run" button does: a flow run of the deployment with these parameters."""
    with client(api_url) as prefect:
        dep = prefect.read_deployment_by_name(deployment)
        return prefect.create_flow_run_from_deployment(dep.id, parameters=parameters).id  # type: ignore[no-any-return]


def wait_final(
    api_url: str,
    flow_run_id: UUID,
    timeout_s: float = FLOW_TIMEOUT_S,
    logs: Iterable[Path] = (),
) -> Any:
    """The flow run once its state is final; on a hang (`timeout_s`, a ceiling a loaded
    machine does not reach), a failure with its last state and the tails of `logs`."""
    seen: list[str] = []
    with client(api_url) as prefect:  # one client for the wait: making one costs CPU

        def final() -> Any:
            run = prefect.read_flow_run(flow_run_id)
            seen[:] = [f"{run.state.name}: {run.state.message}" if run.state else "no state"]
            return run if run.state is not None and run.state.is_final() else None

        try:
            return wait_for(final, f"flow run {flow_run_id}", timeout_s, poll_s=FLOW_POLL_S)
        except pytest.fail.Exception as exc:
            tails = "\n".join(p.read_text(errors="replace")[-1500:] for p in logs if p.exists())
            pytest.fail(f"flow run {flow_run_id} last seen as {seen}\n{exc}\n{tails}")


def flow_logs(api_url: str, flow_run_id: UUID) -> list[str]:
    """The messages of a flow run's logs, as the server keeps them."""
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    with client(api_url) as prefect:
        logs = prefect.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    return [log.message for log in logs]


def delete_deployments(api_url: str, names: Iterable[str] = DEPLOYMENTS) -> None:
    """Remove these deployments if the server has them: a module that served or deployed them
    leaves the session's server without them, so that the next one registers its own."""
    from prefect.exceptions import ObjectNotFound

    with client(api_url) as prefect:
        for name in names:
            try:
                prefect.delete_deployment(prefect.read_deployment_by_name(name).id)
            except ObjectNotFound:
                continue
