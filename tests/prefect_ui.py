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
import warnings
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


# Every API call of the page that fails (an HTTP error or no answer), kept in the page as
# "METHOD URL -> STATUS BODY", so that a form the UI refused says what the server answered.
RECORD_FAILURES_JS = """(() => {
  if (window.__apiFailures) return;
  window.__apiFailures = [];
  const note = line => window.__apiFailures.push(line.slice(0, 500));
  const open = XMLHttpRequest.prototype.open, send = XMLHttpRequest.prototype.send;
  XMLHttpRequest.prototype.open = function (method, url, ...rest) {
    this.__call = `${method} ${url}`;
    return open.call(this, method, url, ...rest);
  };
  XMLHttpRequest.prototype.send = function (...args) {
    this.addEventListener('loadend', () => {
      if (this.status === 0 || this.status >= 400) note(`${this.__call} -> ${this.status} ${this.responseText || ''}`);
    });
    return send.apply(this, args);
  };
  const fetch0 = window.fetch;
  window.fetch = async (...args) => {
    try {
      const reply = await fetch0(...args);
      if (!reply.ok) note(`fetch ${args[0]} -> ${reply.status}`);
      return reply;
    } catch (error) { note(`fetch ${args[0]} -> ${error}`); throw error; }
  };
})()"""
REFUSED = "Something went wrong"


def submit(page: Page, run_name: str) -> UUID:
    """Press Submit; the UI goes back to the deployment's page, which lists the new run by its
    name: returns the flow run id its link holds (/runs/flow-run/ID).

    Where the UI says it could not create the run (its "Something went wrong" toast, seen once
    in a full suite on a loaded machine, with no run created), Submit is pressed once more, as a
    user would, and a warning carries the API calls that failed; a second refusal fails."""
    page.evaluate(RECORD_FAILURES_JS)
    link = f"{FIND}('a', {json.dumps(run_name)})"
    listed = f"!location.pathname.endsWith('/run') && {link}?.getAttribute('href')"
    shown = f"(document.body.innerText.split({json.dumps(REFUSED)}).length - 1)"
    for attempt in (1, 2):
        # The refusals already on the page (one refusal may draw its text more than once).
        before = int(page.evaluate(shown))
        refused = f"{shown} > {before}"
        click(page, "button", "Submit")
        try:
            outcome = wait_js(
                page,
                f"({listed}) || ({refused} && 'refused')",
                f"the deployment's page listing the run {run_name!r}",
            )
        except TimeoutError as timeout:
            failures = page.evaluate("window.__apiFailures")
            raise TimeoutError(f"{timeout}\nfailed API calls: {failures}") from None
        if outcome != "refused":
            break
        failures = page.evaluate("window.__apiFailures.splice(0)")
        if attempt == 2:
            raise RuntimeError(f"the UI refused the run twice; failed API calls: {failures}")
        warnings.warn(
            f"the Prefect UI refused the run once; failed API calls: {failures}", stacklevel=2
        )
    href = outcome
    found = re.search(r"/runs/flow-run/([0-9a-f-]{36})", str(href))
    if found is None:
        raise RuntimeError(f"the run's link is {href!r}, not a flow run's page")
    return UUID(found.group(1))


# --- artifacts --------------------------------------------------------------------------------
# Each table on the page: its headers' text and left/right edges, and the part of the screen
# it can show (the viewport cut by every scrolling or clipping box around it: a wide table
# scrolls inside its card, so a header at x < 1440 may still be out of sight).
TABLES_JS = """(() => Array.from(document.querySelectorAll('table')).map(table => {
  let left = 0, right = window.innerWidth;
  for (let e = table.parentElement; e; e = e.parentElement) {
    if (getComputedStyle(e).overflowX === 'visible') continue;
    const box = e.getBoundingClientRect();
    left = Math.max(left, box.left); right = Math.min(right, box.right);
  }
  return {left, right, headers: Array.from(table.querySelectorAll('th')).map(th => {
    const box = th.getBoundingClientRect();
    return {text: th.textContent.trim(), left: box.left, right: box.right};
  })};
}))()"""


def latest_artifact_url(api_url: str, key: str) -> str:
    """The UI's page of the newest version of the artifact `key` (/artifacts/artifact/ID; the
    page of the key itself is a timeline of versions, without their content)."""
    import httpx

    reply = httpx.post(
        f"{api_url}/artifacts/latest/filter",
        json={"artifacts": {"key": {"any_": [key]}}},
        timeout=30,
    )
    reply.raise_for_status()
    found = reply.json()
    if not found:
        raise LookupError(f"no artifact with key {key!r}")
    return f"{api_url.removesuffix('/api')}/artifacts/artifact/{found[0]['latest_id']}"


def artifact_tables(page: Page, url: str, needles: list[str]) -> list[dict[str, Any]]:
    """Open an artifact's page, wait until its table shows every needle (text a cell or the
    page holds) and return TABLES_JS's tables."""
    page.goto(url)
    page.wait_for(needles, timeout_s=TIMEOUT_S)
    wait_js(
        page,
        "document.fonts.status === 'loaded' && document.querySelectorAll('th').length > 0",
        "the artifact's table, in its fonts",
    )
    return list(page.evaluate(TABLES_JS))
