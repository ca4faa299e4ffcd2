"""The dashboard's one write: "rerun this arm", as a flow run of the arm deployment in Prefect.

Plain functions with a timeout that never raise: every failure (no server configured, server
down, deployment not served) comes back as a RerunResult with one line a user can act on.
Prefect is imported lazily so that pages which never rerun anything stay fast to load; the
parameters are the arm flow's own model (flows.params), so the form and the button agree.

A rerun is asked for twice before it happens (the button, then a confirmation that says what
the new attempt will do: `describe_rerun`), and each confirmation carries an idempotency key
(`idempotency_key`) that Prefect keeps with the flow run: a double click, or a page rerun that
repeats the request, gets the same flow run back instead of a second one training beside it.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The arm flow's parameter model: pydantic only (flows.params imports neither Prefect nor torch).
from flows.params import ArmParams, validate

FLOW_NAME = "ablation-arm"
DEPLOYMENT_NAME = "dapo-arm"
DEPLOYMENT = f"{FLOW_NAME}/{DEPLOYMENT_NAME}"
DEFAULT_TIMEOUT_S = 10.0

NO_SERVER = (
    "No Prefect server is configured for this dashboard: start one (`prefect server start`), "
    "serve the flows (`dapo serve`), then restart the dashboard with PREFECT_API_URL set, e.g. "
    "`PREFECT_API_URL=http://127.0.0.1:4200/api dapo dashboard`: it reads the variable when it "
    "starts."
)

# api URL -> an async Prefect client (an async context manager); tests pass a fake with the
# same two or three methods.
ClientFactory = Callable[[str], Any]


@dataclass(frozen=True)
class RerunResult:
    """What came of a request to Prefect: ok, a one-line message, and the flow run if any."""

    ok: bool
    message: str
    flow_run_id: str | None = None
    state: str | None = None
    url: str | None = None


def prefect_api_url(environ: Mapping[str, str] | None = None) -> str | None:
    """The Prefect API this dashboard talks to: $PREFECT_API_URL, else the active profile's."""
    env = os.environ if environ is None else environ
    if env.get("PREFECT_API_URL"):
        return env["PREFECT_API_URL"]
    if environ is not None:
        return None
    try:
        from prefect.settings import get_current_settings

        url = get_current_settings().api.url
    except Exception:  # a broken profile must not break the page; treat it as "not set"
        return None
    return str(url) if url else None


def prefect_ui_url(environ: Mapping[str, str] | None = None) -> str | None:
    """$PREFECT_UI_URL, else the API URL without its trailing /api."""
    env = os.environ if environ is None else environ
    if env.get("PREFECT_UI_URL"):
        return env["PREFECT_UI_URL"].rstrip("/")
    api = prefect_api_url(environ)
    if not api:
        return None
    api = api.rstrip("/")
    return api[: -len("/api")] if api.endswith("/api") else api


def flow_run_url(flow_run_id: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """Link to a flow run in the Prefect UI, or None without a flow run or a known server."""
    ui = prefect_ui_url(environ)
    if not flow_run_id or not ui:
        return None
    return f"{ui}/runs/flow-run/{flow_run_id}"


def rerun_parameters(sweep_id: int, arm: str, seed: int) -> dict[str, Any]:
    """The arm deployment's parameters for a forced rerun of one (arm, seed) of a sweep: the
    flows' own ArmParams (one definition of the form), only the fields set here, so that the
    served deployment's defaults (its store, its Ray) fill the rest. ValueError in one line."""
    params: ArmParams = validate(
        ArmParams, {"sweep_id": sweep_id, "arm": arm, "seed": seed, "force": True}
    )
    return params.model_dump(mode="json", exclude_unset=True)


def new_token() -> str:
    """A fresh token for one confirmation of a rerun (see idempotency_key)."""
    return uuid.uuid4().hex


def idempotency_key(sweep_id: int, arm: str, seed: int, token: str) -> str:
    """The key Prefect keeps with the flow run of one confirmed rerun: the same (sweep, arm,
    seed, token) always gets the same flow run of the deployment back, never a second one.
    The token is drawn when the confirmation opens, so a later, deliberate rerun is new."""
    return f"dapo-rerun/sweep-{int(sweep_id)}/{arm}/seed-{int(seed)}/{token}"


def describe_rerun(
    attempts: Sequence[Mapping[str, Any]], sweep_id: int, arm: str, seed: int
) -> str:
    """What a rerun of (arm, seed) will do, in words, from its attempts in the store (rows with
    run_id, attempt, status, steps, checkpoint_dir; any order). The arm flow decides for real
    (flows.plan.decide_arm); this says the same from what the dashboard can see: a resume
    needs the latest attempt unfinished with a checkpoint (the checkpoint is at or before the
    last step it recorded; a changed config starts over instead)."""
    what = f"arm {arm!r}, seed {seed} of sweep {sweep_id}"
    if not attempts:
        return f"A first attempt of {what}, from step 0."
    latest = max(attempts, key=lambda row: (int(row["attempt"]), int(row["run_id"])))
    run, status = int(latest["run_id"]), str(latest["status"])
    new = f"A new attempt (attempt {int(latest['attempt']) + 1}) of {what}"
    steps = latest.get("steps")
    steps = int(steps) if steps is not None and steps == steps else 0
    if status == "completed":
        return (
            f"{new}: run {run} completed, so the forced rerun starts over from step 0 in a new "
            f"directory; run {run} and its results stay in the store."
        )
    if latest.get("checkpoint_dir") and steps > 0:
        still = (
            f" Run {run} is marked running: if it is still training, the rerun is refused."
            if status == "running"
            else ""
        )
        return (
            f"{new} that resumes run {run} ({status}) from its last checkpoint, at step "
            f"{steps} or the checkpoint before it (from step 0 if it left none).{still}"
        )
    return f"{new}: run {run} ({status}) left no checkpoint, so it starts over from step 0."


def _default_factory(api_url: str) -> Any:
    """prefect's get_client() pointed at `api_url`: without an explicit URL it would start an
    ephemeral in-process server, which no worker serves, so a rerun there would never run."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api_url}):
        return get_client()


def _explain(error: BaseException, api_url: str, timeout_s: float) -> str:
    """One line for a failed Prefect call; the exception classes are matched by name so that
    this module needs neither prefect nor httpx at import time."""
    names = {cls.__name__ for cls in type(error).__mro__}
    if isinstance(error, TimeoutError) or "TimeoutException" in names:
        return f"The Prefect server at {api_url} did not answer within {timeout_s:g} s."
    if "ObjectNotFound" in names:
        return (
            f"Deployment {DEPLOYMENT!r} is not known to the Prefect server at {api_url}: "
            "serve it with `dapo serve`."
        )
    if isinstance(error, OSError) or names & {"ConnectError", "NetworkError", "TransportError"}:
        return (
            f"Cannot reach the Prefect server at {api_url} ({error or 'connection refused'}): "
            "start it with `prefect server start`."
        )
    if "HTTPStatusError" in names:
        return f"The Prefect server at {api_url} refused the request: {error}"
    first_line = str(error).splitlines()[0] if str(error) else ""
    return f"Prefect call failed: {type(error).__name__}: {first_line}".rstrip(": ")


def _run_with_timeout(
    work: Callable[[Any], Any], factory: ClientFactory, api_url: str, timeout_s: float
) -> tuple[Any, str | None]:
    """Run `work(client)` (a coroutine function) with a fresh client; (value, None) or
    (None, message)."""

    async def main() -> Any:
        async with factory(api_url) as client:
            return await work(client)

    try:
        return asyncio.run(asyncio.wait_for(main(), timeout_s)), None
    except Exception as error:
        return None, _explain(error, api_url, timeout_s)


def _state_name(flow_run: Any) -> str | None:
    state = getattr(flow_run, "state", None)
    return None if state is None else str(getattr(state, "name", None) or state.type)


def request_rerun(
    sweep_id: int,
    arm: str,
    seed: int,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    client_factory: ClientFactory | None = None,
    environ: Mapping[str, str] | None = None,
    idempotency_key: str | None = None,
) -> RerunResult:
    """Create a flow run of the arm deployment that retrains (sweep, arm, seed) with force=True.

    `idempotency_key`: Prefect returns the flow run already created with this key for the
    deployment instead of creating another (a repeated request is the same rerun).
    Never raises: without PREFECT_API_URL, or when the server is down or the deployment is not
    served, the result says so in one line.
    """
    api_url = prefect_api_url(environ)
    if not api_url:
        return RerunResult(ok=False, message=NO_SERVER)
    try:
        parameters = rerun_parameters(sweep_id, arm, seed)
    except ValueError as error:
        return RerunResult(ok=False, message=f"Cannot rerun: {error}")

    async def work(client: Any) -> Any:
        deployment = await client.read_deployment_by_name(DEPLOYMENT)
        once = {"idempotency_key": idempotency_key} if idempotency_key else {}
        return await client.create_flow_run_from_deployment(
            deployment.id, parameters=parameters, **once
        )

    flow_run, problem = _run_with_timeout(
        work, client_factory or _default_factory, api_url, timeout_s
    )
    if problem is not None:
        return RerunResult(ok=False, message=problem)
    run_id = str(flow_run.id)
    state = _state_name(flow_run)
    return RerunResult(
        ok=True,
        message=f"Flow run {getattr(flow_run, 'name', run_id)} created ({state or 'Scheduled'}): "
        f"rerunning arm {arm!r}, seed {seed} of sweep {sweep_id}.",
        flow_run_id=run_id,
        state=state,
        url=flow_run_url(run_id, environ),
    )


def flow_run_state(
    flow_run_id: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    client_factory: ClientFactory | None = None,
    environ: Mapping[str, str] | None = None,
) -> RerunResult:
    """The current state of a flow run (Scheduled, Running, Completed, Failed, ...)."""
    api_url = prefect_api_url(environ)
    if not api_url:
        return RerunResult(ok=False, message=NO_SERVER, flow_run_id=flow_run_id)

    async def work(client: Any) -> Any:
        from uuid import UUID

        return await client.read_flow_run(UUID(str(flow_run_id)))

    flow_run, problem = _run_with_timeout(
        work, client_factory or _default_factory, api_url, timeout_s
    )
    if problem is not None:
        return RerunResult(ok=False, message=problem, flow_run_id=flow_run_id)
    state = _state_name(flow_run)
    return RerunResult(
        ok=True,
        message=f"Flow run {flow_run_id} is {state}.",
        flow_run_id=flow_run_id,
        state=state,
        url=flow_run_url(flow_run_id, environ),
    )
