"""Issue 22 item 10: an arm of N workers whose placement group Ray cannot place gives up after
$DAPO_PLACEMENT_WAIT_S with one line naming what could not be placed, and removes the group
(before, `group.ready()` was waited on without limit: after a node loss, a retry that could not
place N GPUs waited forever).

A real local Ray with 1 CPU is asked for 2 workers × 1 CPU, in an interpreter of its own (ray.init
is once per process), which shuts its Ray down before it exits.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_flows_ray import _python

from flows.ray_worker import DEFAULT_PLACEMENT_WAIT_S, placement_wait_s

UNPLACEABLE = """
import json, time
from flows import ray_worker  # first: it binds a local Ray to loopback, as the flows do
import ray
from flows.params import Resources

ray_worker.connect("local", num_cpus=1)
job = ray_worker.TrainJob({}, "sqlite://", 7, "/nonexistent", {})
report = {}
t0 = time.monotonic()
try:
    ray_worker.run_group(job, Resources(cpus=1, workers=2), None, None)
except Exception as exc:
    report["error"] = [type(exc).__name__, str(exc)]
report["waited_s"] = time.monotonic() - t0
report["groups"] = sorted(g["state"] for g in ray.util.placement_group_table().values())
print(json.dumps(report))
ray_worker.shutdown()
"""


def test_a_group_that_cannot_be_placed_gives_up_in_one_line(tmp_path: Path) -> None:
    done = _python(UNPLACEABLE, cwd=tmp_path, timeout=240, DAPO_PLACEMENT_WAIT_S="3")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    kind, line = report["error"]
    assert kind == "PlacementTimeout" and "\n" not in line, report
    assert line.startswith("could not place 2 workers × {CPU 1} (PACK) within 3 s: "), line
    assert "the cluster has CPU 1 free of CPU 1" in line and "DAPO_PLACEMENT_WAIT_S" in line
    assert 3 <= report["waited_s"] < 120
    assert report["groups"] == ["REMOVED"]  # nothing left queued on the cluster


def test_the_placement_wait_comes_from_the_environment() -> None:
    assert placement_wait_s({}) == DEFAULT_PLACEMENT_WAIT_S
    assert placement_wait_s({"DAPO_PLACEMENT_WAIT_S": " 90 "}) == 90.0
    assert placement_wait_s({"DAPO_PLACEMENT_WAIT_S": "0"}) == 0.0  # no limit
    with pytest.raises(ValueError, match=r"^DAPO_PLACEMENT_WAIT_S='soon' is not a number"):
        placement_wait_s({"DAPO_PLACEMENT_WAIT_S": "soon"})
