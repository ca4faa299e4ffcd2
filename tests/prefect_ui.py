"""Prefect's own UI, the v1 app that `prefect server start` serves, driven in headless Chromium
through dashboard/browser.py's Page: what a user does to start a custom run of a deployment.

The UI is a Vue app: a page is a shell until its scripts have read the API, so each step waits
for the element it needs (a condition with a deadline) before it acts. Elements are found by
the text a user reads ("dapo-sweep", "Run", "Custom run", "Run Name", "Use JSON input",
"Submit"), and by class only where a control has none: the ⋮ button of the Parameters header
and the JSON editor, a plain textarea.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any
from uuid import UUID

from dashboard.browser import POLL_S, Page

TIMEOUT_S = 60.0
FORM = ".flow-run-create-form-v2"
# The last visible element matching a selector whose text is exactly `text` (a menu's items
# are drawn after the page, so the last one is the one just opened).
FIND = """((selector, text) => [...document.querySelectorAll(selector)]
  .filter(e => e.getClientRects().length > 0 && (e.innerText || '').trim() === text).pop() || null)"""


def wait_js(page: Page, expression: str, what: str, timeout_s: float = TIMEOUT_S) -> Any:
    """Poll a JavaScript expression until it is truthy; returns its value, or raises
    TimeoutError with the page's text."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        value = page.evaluate(expression)
        if value:
            return value
        time.sleep(POLL_S)
    raise TimeoutError(f"{what}: not there after {timeout_s:g} s\n{page.text()[:3000]}")


def click(page: Page, selector: str, text: str) -> None:
    """Click the element a user would: the one `selector` matches that reads `text`."""
    find = f"{FIND}({json.dumps(selector)}, {json.dumps(text)})"
    wait_js(page, f"!!{find}", f"a {selector} reading {text!r}")
    page.evaluate(f"{find}.click()")


def type_into(page: Page, element: str, text: str) -> None:
    """Replace the value of a text input or textarea (a JavaScript expression for it) with
    `text`, typed as a user's input event, so that the app's bindings see it."""
    page.evaluate(f"(e => {{ e.focus(); e.select(); }})({element})")
    page.call("Input.insertText", text=text)


def fill_custom_run(
    page: Page, ui_url: str, deployment: str, parameters: dict[str, Any], run_name: str
) -> None:
    """Deployments → `deployment` → Run → Custom run; name the run, switch the parameters to
    JSON (Parameters ⋮ → Use JSON input) and type them. Stops before Submit."""
    page.goto(f"{ui_url}/deployments")
    click(page, "a", deployment)
    click(page, "button", "Run")
    click(page, "button", "Custom run")
    wait_js(page, f"!!document.querySelector('{FORM}')", "the custom run form")
    name_input = (
        "[...document.querySelectorAll('label')].find(l => l.innerText.trim() === 'Run Name')"
        "?.closest('.p-label')?.querySelector('input')"
    )
    wait_js(page, f"!!{name_input}", "the Run Name field")
    type_into(page, name_input, run_name)
    page.evaluate(f"document.querySelector('{FORM}__header button').click()")
    click(page, "button", "Use JSON input")
    editor = f"document.querySelector('{FORM} textarea')"
    wait_js(page, f"!!{editor}", "the JSON editor")
    type_into(page, editor, json.dumps(parameters, indent=2))
    # What the form now holds, read back from its own fields.
    typed = page.evaluate(f"[{name_input}.value, {editor}.value]")
    if typed[0] != run_name or json.loads(typed[1]) != parameters:
        raise RuntimeError(f"the form holds {typed}, not what was typed")


def submit(page: Page, run_name: str) -> UUID:
    """Press Submit; the UI goes back to the deployment's page, which lists the new run by its
    name: returns the flow run id its link holds (/runs/flow-run/ID)."""
    click(page, "button", "Submit")
    link = f"{FIND}('a', {json.dumps(run_name)})"
    href = wait_js(
        page,
        f"!location.pathname.endsWith('/run') && {link}?.getAttribute('href')",
        f"the deployment's page listing the run {run_name!r}",
    )
    found = re.search(r"/runs/flow-run/([0-9a-f-]{36})", str(href))
    if found is None:
        raise RuntimeError(f"the run's link is {href!r}, not a flow run's page")
    return UUID(found.group(1))
