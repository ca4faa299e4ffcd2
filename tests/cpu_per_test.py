"""CPU seconds per test, of the test's whole process tree: a pytest plugin for the suite's
speed work, which on a shared, loaded machine cannot compare wall times.

    PYTHONPATH=tests .venv/bin/python -m pytest -p cpu_per_test -p no:xdist tests/db/test_stats.py
    CPU_PER_TEST_JSON=out.json ...   # also every test's numbers and the processes it started

Every SAMPLE_S a thread reads /proc: the pytest process and every process descended from it
(a process, once seen, stays followed after its parent dies and it is re-parented), each one's
own user + system time. What each used since the last sample is put on the test phase running
then (`nodeid [setup|call|teardown]`; a module fixture's start is in its first test's setup,
its end in the last test's teardown; `(session)` for collection and the session's fixtures).
The thread's own CPU is taken off the pytest process's. A lower bound, as in
bench/cpu_by_process.py: a process shorter than a sample is missed, and each process's last
fraction of one. At the end: the slowest tests by CPU, and the total beside what the kernel
counted for the pytest process and the children it reaped (getrusage), a check on the bound.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

SAMPLE_S = 0.25
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
SHOW = 40


def _kinds() -> Any:
    """bench/cpu_by_process.py's kinds of process (matched on the command line)."""
    root = Path(__file__).resolve().parents[1]
    if str(root) not in sys.path:
        sys.path.append(str(root))
    try:
        from bench.cpu_by_process import kind_of
    except ImportError:
        return lambda cmdline: "process"
    return kind_of


def _stat(pid: str) -> tuple[int, str, float] | None:
    """(parent pid, start time, own CPU s) of a process, or None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()
    return int(fields[1]), fields[19], (int(fields[11]) + int(fields[12])) * TICK_S


class Probe:
    def __init__(self) -> None:
        self.root = os.getpid()
        self.label = "(session)"
        self.cpu: dict[str, float] = defaultdict(float)
        self.wall: dict[str, float] = defaultdict(float)
        self.started: dict[str, Counter[str]] = defaultdict(Counter)
        self.by_kind: dict[str, Counter[str]] = defaultdict(Counter)
        self.kinds: dict[tuple[int, str], str] = {}
        self.last: dict[tuple[int, str], float] = {}
        self.followed: set[int] = {self.root}
        self.own_thread_s = 0.0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="cpu-per-test", daemon=True)
        self.lock = threading.Lock()
        self.t0 = self._since = time.monotonic()
        self.kind_of = _kinds()
        me = _stat(str(self.root))
        if me is not None:
            self.last[(self.root, me[1])] = me[2]
        self.start_key = (self.root, me[1] if me else "")

    def _loop(self) -> None:
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(SAMPLE_S)
        self.sample()

    def sample(self) -> None:
        with self.lock:  # the sampling thread and the hooks both sample
            self._sample()

    def _sample(self) -> None:
        t0 = time.thread_time()
        rows = {}
        for name in os.listdir("/proc"):
            if name.isdigit() and (got := _stat(name)) is not None:
                rows[int(name)] = got
        # Descendants: children of a followed process are followed, until nothing new.
        grew = True
        while grew:
            grew = False
            for pid, (ppid, _, _) in rows.items():
                if pid not in self.followed and ppid in self.followed:
                    self.followed.add(pid)
                    grew = True
        label = self.label
        used = 0.0
        for pid in self.followed & rows.keys():
            _, start, cpu = rows[pid]
            key = (pid, start)
            if key not in self.last:
                try:
                    raw = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    raw = b""
                kind = self.kind_of(raw.replace(b"\0", b" ").decode("utf-8", "replace"))
                self.kinds[key] = "pytest" if pid == self.root else kind
                self.started[label][kind] += 1
                before = 0.0
            else:
                before = self.last[key]
            used += cpu - before
            self.by_kind[label][self.kinds.get(key, "pytest")] += cpu - before
            self.last[key] = cpu
        spent = time.thread_time() - t0
        self.own_thread_s += spent
        self.by_kind[label]["pytest"] -= spent
        self.cpu[label] += used - spent  # this thread runs in the pytest process

    def enter(self, label: str) -> None:
        self.sample()
        with self.lock:
            self.label = label
        self._since = time.monotonic()

    def leave(self) -> None:
        self.sample()
        with self.lock:
            self.wall[self.label] += time.monotonic() - self._since
            self.label = "(session)"


_probe: Probe | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _probe
    if hasattr(config, "workerinput") or _probe is not None:
        return
    _probe = Probe()
    _probe.thread.start()


def _phase(item: pytest.Item, phase: str) -> Any:
    if _probe is None:
        return (yield)
    _probe.enter(f"{item.nodeid} [{phase}]")
    try:
        return (yield)
    finally:
        _probe.leave()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Any:
    yield from _phase(item, "setup")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    yield from _phase(item, "call")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Any:
    yield from _phase(item, "teardown")


def pytest_unconfigure(config: pytest.Config) -> None:
    global _probe
    probe, _probe = _probe, None
    if probe is None:
        return
    probe.stop.set()
    probe.thread.join()
    wall = time.monotonic() - probe.t0
    tests: dict[str, dict[str, Any]] = {}
    for label, used in probe.cpu.items():
        nodeid, _, phase = label.rpartition(" [")
        nodeid = nodeid or label
        row = tests.setdefault(
            nodeid, {"cpu_s": 0.0, "wall_s": 0.0, "phases": {}, "started": {}, "by_kind": {}}
        )
        for kind, kind_s in probe.by_kind.get(label, {}).items():
            row["by_kind"][kind] = round(row["by_kind"].get(kind, 0.0) + kind_s, 2)
        row["cpu_s"] += used
        row["wall_s"] += probe.wall.get(label, 0.0)
        row["phases"][phase.rstrip("]") or "all"] = round(used, 2)
        for kind, n in probe.started.get(label, {}).items():
            row["started"][kind] = row["started"].get(kind, 0) + n
    total = sum(row["cpu_s"] for row in tests.values())
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    kernel = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime - probe.own_thread_s
    lines = [
        "",
        f"cpu_per_test: wall {wall:.0f} s, CPU of the process tree {total:.1f} s sampled "
        f"(kernel: pytest + its reaped children {kernel:.1f} s; load average "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())})",
        f"{'CPU s':>8} {'wall s':>8}  test  (processes started)",
    ]
    ranked = sorted(tests.items(), key=lambda kv: -kv[1]["cpu_s"])
    for nodeid, row in ranked[:SHOW]:
        kinds = ", ".join(
            f"{n} {k}" for k, n in sorted(row["started"].items(), key=lambda x: -x[1])
        )
        lines.append(f"{row['cpu_s']:8.1f} {row['wall_s']:8.1f}  {nodeid}  ({kinds})")
    kinds: Counter[str] = Counter()
    for row in tests.values():
        kinds.update(row["by_kind"])
    lines.append(
        "by kind of process: " + ", ".join(f"{k} {v:.0f} s" for k, v in kinds.most_common())
    )
    print("\n".join(lines), file=sys.stderr)
    out = os.environ.get("CPU_PER_TEST_JSON")
    if out:
        Path(out).write_text(
            json.dumps(
                {
                    "wall_s": wall,
                    "cpu_s": total,
                    "kernel_cpu_s": kernel,
                    "loadavg_end": os.getloadavg(),
                    "by_kind": {k: round(v, 1) for k, v in kinds.most_common()},
                    "tests": {k: {**v, "cpu_s": round(v["cpu_s"], 2)} for k, v in ranked},
                },
                indent=1,
            )
        )
