"""The "rerun this arm" path to Prefect, and the `dapo dashboard` command line."""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dapo_common.util import free_port
from dashboard import cli, rerun
from db.engine import get_engine

API = {"PREFECT_API_URL": "http://127.0.0.1:4200/api"}


class FakeClient:
    """Stands in for prefect's async client: records calls, returns a scheduled flow run."""

    def __init__(self, calls: list[tuple[str, Any]], *, hang: bool = False) -> None:
        self.calls, self.hang = calls, hang
        self.run_id = uuid.UUID(int=7)

    async def __aenter__(self) -> FakeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def read_deployment_by_name(self, name: str) -> Any:
        if self.hang:
            await asyncio.sleep(60)
        self.calls.append(("read_deployment_by_name", name))
        return SimpleNamespace(id=uuid.UUID(int=1))

    async def create_flow_run_from_deployment(self, deployment_id: Any, **kw: Any) -> Any:
        self.calls.append(("create", (deployment_id, kw)))
        return SimpleNamespace(
            id=self.run_id,
            name="brave-otter",
            state=SimpleNamespace(name="Scheduled", type="SCHEDULED"),
        )

    async def read_flow_run(self, flow_run_id: uuid.UUID) -> Any:
        self.calls.append(("read_flow_run", flow_run_id))
        return SimpleNamespace(
            id=flow_run_id, state=SimpleNamespace(name="Running", type="RUNNING")
        )


def test_rerun_creates_a_forced_flow_run_of_the_arm_deployment() -> None:
    calls: list[tuple[str, Any]] = []
    result = rerun.request_rerun(
        3, "clip_higher", 1, client_factory=lambda _url: FakeClient(calls), environ=API
    )
    assert result.ok, result.message
    assert calls[0] == ("read_deployment_by_name", "ablation-arm/dapo-arm")
    deployment_id, kwargs = calls[1][1]
    assert deployment_id == uuid.UUID(int=1)
    assert kwargs == {"parameters": {"sweep_id": 3, "arm": "clip_higher", "seed": 1, "force": True}}
    assert result.state == "Scheduled"
    assert result.flow_run_id == str(uuid.UUID(int=7))
    assert result.url == f"http://127.0.0.1:4200/runs/flow-run/{uuid.UUID(int=7)}"
    state = rerun.flow_run_state(
        result.flow_run_id, client_factory=lambda _url: FakeClient(calls), environ=API
    )
    assert (state.ok, state.state) == (True, "Running")


def test_rerun_parameters_are_the_arm_flows_own_model() -> None:
    # Any ladder's arm name (a grid point here); only the fields set, so the deployment's
    # defaults (its store, its Ray) fill the rest.
    assert rerun.rerun_parameters(3, "dapo-clip_high=0.24", 0) == {
        "sweep_id": 3,
        "arm": "dapo-clip_high=0.24",
        "seed": 0,
        "force": True,
    }
    calls: list[tuple[str, Any]] = []
    bad = rerun.request_rerun(
        0, "grpo", 0, client_factory=lambda _url: FakeClient(calls), environ=API
    )
    assert not bad.ok and calls == []
    assert bad.message == "Cannot rerun: sweep_id: Input should be greater than or equal to 1"


def test_no_prefect_server_configured_is_a_message_not_an_error() -> None:
    result = rerun.request_rerun(1, "grpo", 0, environ={})
    assert not result.ok
    assert "PREFECT_API_URL" in result.message
    # the dashboard reads the variable when it starts: the hint says to restart it with it
    assert "restart the dashboard with PREFECT_API_URL set" in result.message
    assert "PREFECT_API_URL=http://127.0.0.1:4200/api dapo dashboard" in result.message
    assert rerun.flow_run_state("x", environ={}).message == rerun.NO_SERVER


def test_connection_refused_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port that nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"PREFECT_API_URL": f"http://127.0.0.1:{port}/api"}
    result = rerun.request_rerun(1, "grpo", 0, environ=env, timeout_s=20)
    assert not result.ok
    assert result.message.startswith(f"Cannot reach the Prefect server at {env['PREFECT_API_URL']}")
    assert "\n" not in result.message


def test_a_server_that_does_not_answer_times_out() -> None:
    result = rerun.request_rerun(
        1,
        "grpo",
        0,
        client_factory=lambda _url: FakeClient([], hang=True),
        environ=API,
        timeout_s=0.05,
    )
    assert not result.ok
    assert (
        result.message
        == f"The Prefect server at {API['PREFECT_API_URL']} did not answer within 0.05 s."
    )


def test_unknown_deployment_says_to_serve_it() -> None:
    from prefect.exceptions import ObjectNotFound

    class Missing(FakeClient):
        async def read_deployment_by_name(self, name: str) -> Any:
            raise ObjectNotFound(http_exc=Exception("404"))

    result = rerun.request_rerun(1, "grpo", 0, client_factory=lambda _url: Missing([]), environ=API)
    assert not result.ok
    assert "'ablation-arm/dapo-arm'" in result.message and "dapo serve" in result.message


def test_prefect_ui_links() -> None:
    assert rerun.prefect_ui_url({"PREFECT_API_URL": "http://h:4200/api/"}) == "http://h:4200"
    env = {"PREFECT_API_URL": "http://h:4200/api", "PREFECT_UI_URL": "https://ui.example/"}
    assert rerun.flow_run_url("abc", env) == "https://ui.example/runs/flow-run/abc"
    assert rerun.flow_run_url(None, env) is None
    assert rerun.flow_run_url("abc", {}) is None
    assert (rerun.FLOW_NAME, rerun.DEPLOYMENT_NAME) == ("ablation-arm", "dapo-arm")


# --- `dapo dashboard` ---------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dapo")
    cli.register(parser.add_subparsers(dest="command"))
    return parser


def test_cli_runs_streamlit_headless_with_the_store_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    get_engine(url)  # an existing store: a missing one is refused (test_dashboard_process)
    port = str(free_port())  # a fixed port may be taken on a shared machine
    args = _parser().parse_args(["dashboard", "--store", url, "--port", port])
    seen: dict[str, Any] = {}

    class FakeStreamlit:
        def __init__(self, cmd: list[str], env: dict[str, str]) -> None:
            seen.update(cmd=cmd, env=env)

        def wait(self, timeout: float | None = None) -> int:
            return 0  # Streamlit ended by itself

        def poll(self) -> int:
            return 0

    monkeypatch.setattr(cli.subprocess, "Popen", FakeStreamlit)
    assert args.func(args) == 0
    cmd = seen["cmd"]
    assert cmd[:4] == [sys.executable, "-m", "dashboard.serve", "run"]
    assert cmd[4] == str(Path(cli.__file__).with_name("app.py"))
    assert cmd[cmd.index("--server.headless") + 1] == "true"
    assert cmd[cmd.index("--server.port") + 1] == port
    assert cmd[cmd.index("--server.address") + 1] == "127.0.0.1"
    assert url not in cmd and "--url" not in cmd  # the store goes by environment (issue 21.7)
    assert seen["env"]["DAPO_DB_URL"] == url
    assert f"http://127.0.0.1:{port}" in capsys.readouterr().out
    assert cmd[cmd.index("--theme.primaryColor") + 1] == cli.ACCENT  # not Streamlit's red


def test_cli_takes_the_store_as_every_command_does() -> None:
    # --store, db.cli's one name for it; --url, its old name, still works.
    for flag in ("--store", "--url"):
        assert _parser().parse_args(["dashboard", flag, "sqlite://"]).store == "sqlite://"
    assert _parser().parse_args(["dashboard"]).store is None


def test_cli_rejects_a_bad_port() -> None:
    args = _parser().parse_args(["dashboard", "--port", "70000"])
    with pytest.raises(ValueError, match="--port"):
        args.func(args)


# --- layering ------------------------------------------------------------------------------

FORBIDDEN = {"torch", "transformers", "ray", "vllm"}


def test_importing_the_dashboard_pulls_in_no_training_stack() -> None:
    """Importing the pages' modules pulls in neither torch/transformers/ray/vLLM nor Prefect
    (flows.params, the arm flow's parameter model the rerun button fills, must stay that
    light). What the modules import on the page (no dapo_core, nothing of flows beyond
    flows.params) is tests/test_layers.py's."""
    code = (
        "import sys, dashboard.cli, dashboard.configs, dashboard.curves, dashboard.rerun, "
        "dashboard.rollouts, dashboard.shaping, dashboard.widgets; "
        f"print(sorted(m for m in {sorted(FORBIDDEN | {'prefect'})!r} if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == "[]"
