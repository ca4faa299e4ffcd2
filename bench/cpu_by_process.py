"""Where a command's CPU time goes, by kind of process: the test suite's servers, workers and
subprocesses, each summed over every process of that kind that ran while the command did.

    .venv/bin/python bench/cpu_by_process.py [--json FILE] -- COMMAND [ARGS...]
    .venv/bin/python bench/cpu_by_process.py -- .venv/bin/python -m pytest -q -n 2 --dist loadfile

Every SAMPLE_S it reads each process's own user + system time from /proc (its children's are
theirs, not its), keeping the last value seen per process; at the end it sums them by kind
(`KINDS`, matched on the command line, first match wins). Processes that start and end between
two samples are missed, and each one's last fraction of a sample period: the totals are a lower
bound, close for processes that live seconds or more. Processes already running when the
command starts (a database server, say) count only what they used while it ran; this script's
own sampling is left out. Prints the
command's wall time, the total CPU seen, the average number of busy cores and the table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

SAMPLE_S = 0.5
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
# (kind, the substrings of its command line that name it): the first kind that matches.
KINDS: list[tuple[str, tuple[str, ...]]] = [
    ("pytest-xdist worker (in-process tests)", ("exec(eval(sys.stdin.readline()))",)),
    ("pytest main", ("-m pytest",)),
    ("Prefect flow-run process", ("prefect.engine",)),
    ("Prefect runner supervisor", ("prefect.runner._workspace_supervisor",)),
    ("Prefect server", ("prefect server start", "flows.local_server")),
    ("dapo worker (Prefect work pool)", ("bin/dapo worker",)),
    (
        "dapo sweep / arm / train / eval",
        ("bin/dapo sweep", "bin/dapo arm", "bin/dapo train", "bin/dapo eval"),
    ),
    ("dapo, other commands", ("bin/dapo",)),
    # Before the workers: a raylet's command line holds the worker command it starts.
    ("Ray raylet / GCS", ("raylet/raylet", "gcs_server")),
    ("Ray worker (arms' actors)", ("default_worker.py", "ray::")),
    ("Ray, other", ("ray/", "ray_")),
    ("torch multiprocessing spawn (gloo workers)", ("multiprocessing.spawn",)),
    ("Chromium", ("chrom",)),
    ("Streamlit", ("streamlit", "dashboard.serve")),
    ("PostgreSQL", ("postgres",)),
    ("other Python", ("python",)),
]


def kind_of(cmdline: str) -> str:
    return next((k for k, marks in KINDS if any(m in cmdline for m in marks)), "other")


def _read(pid: str) -> tuple[str, float] | None:
    """(start time, CPU seconds) of one process, or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19], (int(fields[11]) + int(fields[12])) * TICK_S


def snapshot() -> dict[tuple[str, str], float]:
    """{(pid, start time): CPU s} of every process now."""
    out = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit() and (got := _read(pid)) is not None:
            out[(pid, got[0])] = got[1]
    return out


def sample(
    seen: dict[tuple[str, str], list[object]],
    before: dict[tuple[str, str], float],
    stop: threading.Event,
) -> None:
    """Fill `seen` {(pid, start time): [CPU s at the start, last CPU s, command line]} until
    `stop` is set; a process that was not running at the start (`before`) started at 0."""
    me = str(os.getpid())
    while not stop.is_set():
        for key, used in snapshot().items():
            if key[0] == me:
                continue
            if key not in seen:
                try:
                    raw = Path(f"/proc/{key[0]}/cmdline").read_bytes()
                except OSError:
                    continue
                cmdline = raw.replace(b"\0", b" ").decode(errors="replace")
                seen[key] = [before.get(key, 0.0), used, cmdline]
            else:
                seen[key][1] = used
        stop.wait(SAMPLE_S)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write every process seen here")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command: put it after --")
    seen: dict[tuple[str, str], list[object]] = {}
    stop = threading.Event()
    before = snapshot()
    watcher = threading.Thread(target=sample, args=(seen, before, stop), daemon=True)
    watcher.start()
    started = time.perf_counter()
    code = subprocess.call(command)
    wall = time.perf_counter() - started
    time.sleep(SAMPLE_S)
    stop.set()
    watcher.join()
    by_kind: Counter[str] = Counter()
    count: Counter[str] = Counter()
    rows = []
    for (pid, _), (first, last, cmdline) in seen.items():
        used = float(last) - float(first)  # type: ignore[arg-type]
        if used <= 0:
            continue
        kind = kind_of(str(cmdline))
        by_kind[kind] += used
        count[kind] += 1
        rows.append({"pid": int(pid), "cpu_s": round(used, 2), "kind": kind, "cmdline": cmdline})
    total = sum(by_kind.values())
    print(
        f"\n{' '.join(command)}: exit {code}, wall {wall:.0f} s, CPU seen {total:.0f} s "
        f"({total / wall:.2f} cores busy on average)"
    )
    print(f"{'CPU s':>8} {'share':>6} {'procs':>6}  kind")
    for kind, used in by_kind.most_common():
        print(f"{used:8.1f} {used / total:6.1%} {count[kind]:6d}  {kind}")
    if args.json:
        args.json.write_text(json.dumps(sorted(rows, key=lambda r: -r["cpu_s"]), indent=1))
    return code


if __name__ == "__main__":
    sys.exit(main())
