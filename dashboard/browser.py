"""Headless Chromium against a served dashboard: for the README's screenshots and the browser test.

A Streamlit page is an empty shell until its script has run on the server and the results have
come back over a websocket, so "the page has loaded" says nothing about its content. Chromium's
own one-shot modes (`--dump-dom`, `--screenshot`) cannot wait for that: with
`--virtual-time-budget` their clock jumps ahead while the page only waits on its websocket, and
they quit before a page that takes a second to compute is drawn. `open_page` drives one tab over
the DevTools protocol instead: navigate, then wait until the text a caller names is on the
screen (a condition, with a deadline), then read the text or take the picture.

Flags: headless, no sandbox (root in a container), no GPU, and no background networking (the
machines this runs on have no internet; Chromium's own connections would otherwise fail).
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from dapo_common.util import free_port

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
    "--window-size=1600,1200",
)
POLL_S = 0.2  # how often a waiting loop looks again (the wait itself is for a condition)
WATCH_MS = 50  # how often the page looks for the awaited text (time_to's resolution)
WATCH_SLICE_S = 60.0  # the longest one look in the page lasts (the protocol's reply waits 120 s)
# Page.text's text, computed in the page: its text nodes but those of scripts and styles, set
# apart by spaces (what stripping the tags off its HTML leaves), blanks collapsed.
_TEXT_JS = """() => {
  if (!document.documentElement) return "";  // a document not parsed yet
  const walker = document.createTreeWalker(document.documentElement, NodeFilter.SHOW_TEXT);
  const parts = [];
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const tag = node.parentNode ? node.parentNode.nodeName : "";
    if (tag !== "SCRIPT" && tag !== "STYLE") parts.push(node.data);
  }
  return parts.join(" ").replace(/\\s+/g, " ");
}"""
# Resolves with performance.now() (ms since this document's navigation start) once every needle
# is in the text, -1 when `ms` pass first, null at once on a blank page (the old one, before a
# navigation replaces it).
_WATCH_JS = (
    """(needles, ms, every) => new Promise((resolve) => {
  if (location.href === "about:blank") { resolve(null); return; }
  const text = """
    + _TEXT_JS
    + """;
  const end = performance.now() + ms;
  const look = () => {
    const seen = text();
    if (needles.every((n) => seen.includes(n))) resolve(performance.now());
    else if (performance.now() >= end) resolve(-1);
    else setTimeout(look, every);
  };
  look();
})"""
)


def find_browser() -> str | None:
    """The first Chromium-family browser on PATH, or None."""
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


def wait_until_healthy(port: int, server: subprocess.Popen[bytes], deadline_s: float) -> None:
    """Poll Streamlit's health endpoint until it answers; RuntimeError if the server dies or
    the deadline passes."""
    from dashboard.cli import answers, health_url

    url = health_url("127.0.0.1", port)
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if server.poll() is not None:
            raise RuntimeError(f"streamlit exited with code {server.returncode}")
        if answers(url):
            return
        time.sleep(POLL_S)
    raise RuntimeError(f"streamlit did not answer on port {port} within {deadline_s} s")


def stop(proc: subprocess.Popen[bytes], grace_s: float = 15.0, *, group: bool = False) -> None:
    """SIGTERM `proc`, then SIGKILL it if it is still there after `grace_s`. `group`: `proc`
    leads its own process group (start_new_session) and the whole group goes: a browser's
    helper processes outlive its main one and keep writing to its profile for a moment."""

    def send(sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(proc.pid, sig)
            else:
                proc.send_signal(sig)

    if proc.poll() is None:
        send(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            send(signal.SIGKILL)
            proc.wait()
    if group:  # whatever of the group is left: it must not write after we return
        send(signal.SIGKILL)


@contextlib.contextmanager
def served(
    store_url: str,
    *,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    log: IO[bytes] | None = None,
    deadline_s: float = 60.0,
) -> Iterator[str]:
    """The dashboard on `store_url` served by a real `streamlit run` on a free loopback port:
    yields its base URL once Streamlit answers, and stops the server when the block ends.
    RuntimeError (from wait_until_healthy) if it never answers."""
    from dashboard.cli import streamlit_command, streamlit_env

    port = free_port()
    out = subprocess.DEVNULL if log is None else log
    server = subprocess.Popen(
        streamlit_command(port=port, host="127.0.0.1"),
        cwd=cwd,
        env=streamlit_env(store_url, {**os.environ, **(env or {})}),
        stdout=out,
        stderr=out,
    )
    try:
        wait_until_healthy(port, server, deadline_s)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(server)


class Page:
    """One tab of a headless Chromium, driven over the DevTools protocol."""

    def __init__(self, socket_url: str) -> None:
        from websockets.sync.client import connect

        self._ws = connect(socket_url, max_size=None, open_timeout=30)
        self._ids = itertools.count(1)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one DevTools command and return its result (events in between are skipped)."""
        msg_id = next(self._ids)
        self._ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self._ws.recv(timeout=120))
            if reply.get("id") != msg_id:
                continue
            if "error" in reply:
                raise RuntimeError(f"{method}: {reply['error'].get('message', reply['error'])}")
            return dict(reply.get("result") or {})

    def goto(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def text(self) -> str:
        """The page's text: its text nodes, scripts and styles left out, each set apart by a
        space (as if every tag were one), blanks collapsed. (Not innerText: Streamlit draws
        tables on a canvas and keeps their cells in a hidden accessible table, which innerText
        leaves out.) Computed in the page: only the text crosses the protocol."""
        return str(self.evaluate(f"({_TEXT_JS})()") or "")

    def wait_for(self, needles: Iterable[str], timeout_s: float = 120) -> str:
        """Wait until every needle is in the visible text; returns the text, or raises
        TimeoutError with what the page showed."""
        self.time_to(needles, timeout_s)
        return self.text()

    def time_to(self, needles: Iterable[str], timeout_s: float = 120) -> float:
        """Seconds from the current document's navigation start to the first moment every
        needle was in its text (looked for in the page every WATCH_MS, so that nothing but a
        yes or no crosses the protocol while the page draws), or TimeoutError with what the
        page showed. Called right after `goto`, it waits for the new document: a blank one
        (the old one still there) or one replaced while it looks is looked at again."""
        wanted = json.dumps(list(needles))
        end = time.monotonic() + timeout_s
        while (left := end - time.monotonic()) > 0:
            ms = int(min(left, WATCH_SLICE_S) * 1000)
            try:
                at = self.evaluate(f"({_WATCH_JS})({wanted}, {ms}, {WATCH_MS})", wait=True)
            except RuntimeError as error:  # the document was replaced while it looked
                if "context" not in str(error) and "navigated" not in str(error):
                    raise
                at = None
            if at is None:  # about:blank, or a document being replaced: look again
                time.sleep(0.01)
            elif at >= 0:
                return float(at) / 1000.0
        text = self.text()
        missing = [n for n in json.loads(wanted) if n not in text]
        raise TimeoutError(f"not on the page after {timeout_s:g} s: {missing}\n{text[:3000]}")

    def set_viewport(self, width: int, height: int) -> None:
        """Lay the page out as a window of `width` x `height` CSS pixels (a laptop's 1440 px,
        say), whatever size the browser started with."""
        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=int(width),
            height=int(height),
            deviceScaleFactor=1,
            mobile=False,
        )

    def evaluate(self, expression: str, *, wait: bool = False) -> Any:
        """The JSON value of a JavaScript expression evaluated in the page (`wait`: of the
        promise it gives, once it settles)."""
        result = self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=wait
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"script failed: {result['exceptionDetails'].get('text')}")
        return result.get("result", {}).get("value")

    def screenshot(self, path: Path) -> bytes:
        """A PNG of the viewport, written to `path` and returned."""
        data = base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])
        Path(path).write_bytes(data)
        return data

    def close(self) -> None:
        self._ws.close()


@contextlib.contextmanager
def open_page(browser: str, *, start_timeout_s: float = 60) -> Iterator[Page]:
    """A headless Chromium with one blank tab, driven over the DevTools protocol; the browser
    and its throw-away profile are gone when the block ends."""
    port = free_port()
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.Popen(
            [
                browser,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={profile}",
                f"--remote-debugging-port={port}",
                "--remote-allow-origins=*",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        page = None
        try:
            page = Page(_page_socket(port, proc, start_timeout_s))
            page.call("Page.enable")
            yield page
        finally:
            if page is not None:
                with contextlib.suppress(Exception):
                    page.close()
            stop(proc, group=True)


def _page_socket(port: int, proc: subprocess.Popen[bytes], timeout_s: float) -> str:
    """The DevTools websocket of the browser's first page, once the browser answers."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"the browser exited with code {proc.returncode} at start")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=2) as r:
                targets = json.loads(r.read())
            pages = [t for t in targets if t.get("type") == "page"]
            if pages:
                return str(pages[0]["webSocketDebuggerUrl"])
        except OSError:
            pass
        time.sleep(POLL_S)
    raise RuntimeError(f"the browser's DevTools did not answer on port {port} in {timeout_s:g} s")
