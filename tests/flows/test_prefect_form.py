"""The Prefect form (issue 41.8), on a real Prefect server with its UI in headless Chromium: no
field of the sweep's form must be switched from None to its type before typing (a field's own
value means "the preset's"), the examples are JSON, the deployments enforce their parameter
schema (a value of the wrong type never starts a run), and what passes the schema but not the
flows' checks ends the flow run with one line, no traceback. The deployments are registered as
`dapo serve` registers them (flows.serve.deployments); no Ray, no runner: runs made here stay
scheduled, and the flows that must fail are called in this process."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import prefect_server
import prefect_ui
import pytest

from flows.params import ArmParams, SweepParams, validate

pytestmark = pytest.mark.slow

TOGGLE = 'Property is type "None"'


@pytest.fixture(scope="module")
def api(shared_prefect_server: str) -> Iterator[str]:
    """The session's Prefect server (with its UI), holding the three deployments of `dapo
    serve` for this module (removed after it, as the flow tests' harness does)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.serve import deployments

    with temporary_settings(updates={PREFECT_API_URL: shared_prefect_server}):
        for deployment in deployments():
            deployment.apply()
    try:
        yield shared_prefect_server
    finally:
        prefect_server.delete_deployments(shared_prefect_server)


def _deployment(api: str, name: str) -> Any:
    with prefect_server.client(api) as client:
        return client.read_deployment_by_name(name)


def test_the_sweep_form_is_typed_fields_with_json_examples(api: str) -> None:
    sweep = _deployment(api, "ablation-sweep/dapo-sweep")
    assert sweep.enforce_parameter_schema is True
    props = sweep.parameter_openapi_schema["properties"]
    # No field is "null or its type": each is its own type, its value meaning the default.
    nullable = [n for n, p in props.items() if {"type": "null"} in p.get("anyOf", [])]
    assert nullable == [], nullable
    assert (props["steps"]["type"], props["steps"]["default"]) == ("integer", 0)
    assert (props["model"]["type"], props["model"]["default"]) == ("string", "")
    assert props["eval_problems"]["default"] == -1  # 0 means "all problems"
    assert "0 means that default" in props["steps"]["description"]
    # The examples a user copies into the JSON editor are JSON.
    example = re.search(r"e\.g\. (\{.*?\})", props["overrides"]["description"])
    assert example is not None, props["overrides"]["description"]
    assert json.loads(example.group(1)) == {"batch.train_batch_size": 8, "algo.clip_high": 0.28}


def test_the_defaults_a_user_submits_in_the_ui_are_the_presets(api: str, tmp_path: Path) -> None:
    """The custom run form, submitted as it opens: no field asks for a type first, and what it
    sends, mapped as the flow maps it, is a sweep of the preset's own values."""
    from chromium import ARTIFACTS, find_chromium

    from dashboard.browser import open_page
    from flows.sweep import ablation_sweep

    exe = find_chromium()
    ui = api.removesuffix("/api")
    with open_page(exe) as page:
        page.goto(f"{ui}/deployments")
        prefect_ui.click(page, "a", "dapo-sweep")
        prefect_ui.click(page, "button", "Run")
        prefect_ui.click(page, "button", "Custom run")
        prefect_ui.wait_js(page, f"!!document.querySelector('{prefect_ui.FORM}')", "the form")
        prefect_ui.wait_js(page, "document.body.innerText.includes('eval_problems')", "fields")
        form = page.evaluate(f"document.querySelector('{prefect_ui.FORM}').innerText")
        name_input = (  # as prefect_ui.fill_custom_run finds it; the parameters stay as they open
            "[...document.querySelectorAll('label')].find(l => l.innerText.trim() === 'Run Name')"
            "?.closest('.p-label')?.querySelector('input')"
        )
        prefect_ui.type_into(page, name_input, "defaults-as-they-open")
        page.screenshot(tmp_path / "sweep-form.png")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        (ARTIFACTS / "prefect-sweep-form.png").write_bytes(
            (tmp_path / "sweep-form.png").read_bytes()
        )
        before = _run_ids(api)
        shown = prefect_ui.submit(page, "defaults-as-they-open")
    # The nested `adaptive` object keeps its own optional budget (a None toggle of its own);
    # the sweep's fields above it ask for none.
    head = form.split("adaptive")[0]
    assert TOGGLE not in head, head
    with prefect_server.client(api) as client:
        run = client.read_flow_run(shown)
        client.delete_flow_run(shown)  # no runner serves it: it would only wait, Late
    assert run.id not in before and run.parameters["steps"] == 0 and run.parameters["model"] == ""
    given = dict(run.parameters)
    mapped = {
        k: None if k in ablation_sweep.fn.form_unset and v == ablation_sweep.fn.form_unset[k] else v
        for k, v in given.items()
    }
    mapped.pop("sweep_id", None)
    assert validate(SweepParams, mapped) == validate(SweepParams, {})


def _run_ids(api: str) -> set[Any]:
    with prefect_server.client(api) as client:
        return {r.id for r in client.read_flow_runs()}


def test_a_wrong_type_never_starts_a_run(api: str) -> None:
    from prefect.exceptions import PrefectHTTPStatusError

    sweep = _deployment(api, "ablation-sweep/dapo-sweep")
    before = _run_ids(api)
    with prefect_server.client(api) as client:
        with pytest.raises(PrefectHTTPStatusError, match="'two' is not of type 'integer'"):
            client.create_flow_run_from_deployment(sweep.id, parameters={"steps": "two"})
        # What the served sweep sends its arms (nulls for "the sweep's") fits the arm's form.
        arm = _deployment(api, "ablation-arm/dapo-arm")
        child = ArmParams(sweep_id=1, arm="grpo", seed=0, publish=False).model_dump(mode="json")
        assert child["store_url"] is None and child["submit"] is None
        made = client.create_flow_run_from_deployment(arm.id, parameters=child)
        client.delete_flow_run(made.id)
    assert _run_ids(api) == before


def _logs(api: str, flow_run_id: Any) -> list[Any]:
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    with prefect_server.client(api) as client:
        return client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))


@pytest.mark.parametrize(
    ("flow", "parameters", "line"),
    [
        ("sweep", {"arms": ["grpo", "nope"]}, "ValueError: arms: unknown arm 'nope'"),
        ("arm", {"sweep_id": 1, "arm": ""}, "ValueError: arm: '' is not an arm name"),
    ],
)
def test_what_passes_the_form_but_not_the_flow_ends_in_one_line(
    api: str, flow: str, parameters: dict[str, Any], line: str
) -> None:
    from prefect.logging.handlers import APILogWorker
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.arm import ablation_arm
    from flows.plan import state_line
    from flows.sweep import ablation_sweep

    fn = ablation_sweep if flow == "sweep" else ablation_arm
    with temporary_settings(updates={PREFECT_API_URL: api}):
        state = fn(**parameters, return_state=True)
        APILogWorker.drain_all(timeout=30)  # its log records, sent while this server is the API
    assert state.is_failed()
    assert state_line(state.message).startswith(line), state.message
    assert "\n" not in state.message
    # The run's whole log, once the server has its last record ("Finished in state ...").
    logs = prefect_server.wait_for(
        lambda: (
            (found := _logs(api, state.state_details.flow_run_id))
            and any("Finished in state" in entry.message for entry in found)
            and found
        ),
        "the flow run's log on the server",
        60.0,
    )
    errors = [entry.message for entry in logs if entry.level >= 40]
    assert len(errors) == 1 and errors[0].startswith(line), errors
    assert not any("Traceback" in entry.message for entry in logs), [e.message for e in logs]
