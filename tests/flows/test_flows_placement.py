"""Issue 22 item 10: an arm of N workers whose placement group Ray cannot place gives up after
$DAPO_PLACEMENT_WAIT_S with one line naming what could not be placed, and removes the group
(before, `group.ready()` was waited on without limit: after a node loss, a retry that could not
place N GPUs waited forever).

The session's warm Ray (conftest.warm_ray, 2 CPUs) is asked for 3 workers × 1 CPU by a driver
in an interpreter of its own (ray.init is once per process).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from ray_cluster import RayCluster
from test_flows_ray import _python

from flows.ray_worker import DEFAULT_PLACEMENT_WAIT_S, placement_wait_s

UNPLACEABLE = """
import json, time
from flows import ray_worker  # first: it binds a local Ray to loopback, as the flows do
import ray
from flows.params import Resources

ray_worker.connect()  # the warm Ray ($RAY_ADDRESS), which other tests' groups may be on
before = set(ray.util.placement_group_table())
job = ray_worker.TrainJob({}, "sqlite://", 7, "/nonexistent", {})
report = {}
t0 = time.monotonic()
try:
    ray_worker.run_group(job, Resources(cpus=1, workers=3), None, None)
except Exception as exc:
    report["error"] = [type(exc).__name__, str(exc)]
report["waited_s"] = time.monotonic() - t0
table = ray.util.placement_group_table()
report["groups"] = sorted(g["state"] for i, g in table.items() if i not in before)
print(json.dumps(report))
ray_worker.shutdown()
"""


def test_a_group_that_cannot_be_placed_gives_up_in_one_line(
    tmp_path: Path, warm_ray: RayCluster
) -> None:
    done = _python(UNPLACEABLE, cwd=tmp_path, DAPO_PLACEMENT_WAIT_S="3", **warm_ray.client_env())
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    kind, line = report["error"]
    assert kind == "PlacementTimeout" and "\n" not in line, report
    assert line.startswith("could not place 3 workers × {CPU 1} (PACK) within 3 s: "), line
    # What is free depends on what the previous test's actors still hold as they end.
    assert re.search(r"the cluster has CPU [\d.]+ free of CPU 2\b", line), line
    assert "DAPO_PLACEMENT_WAIT_S" in line
    assert 3 <= report["waited_s"] < 600
    assert report["groups"] == ["REMOVED"]  # nothing left queued on the cluster


def test_the_placement_wait_comes_from_the_environment() -> None:
    assert placement_wait_s({}) == DEFAULT_PLACEMENT_WAIT_S
    assert placement_wait_s({"DAPO_PLACEMENT_WAIT_S": " 90 "}) == 90.0
    assert placement_wait_s({"DAPO_PLACEMENT_WAIT_S": "0"}) == 0.0  # no limit
    with pytest.raises(ValueError, match=r"^DAPO_PLACEMENT_WAIT_S='soon' is not a number"):
        placement_wait_s({"DAPO_PLACEMENT_WAIT_S": "soon"})
