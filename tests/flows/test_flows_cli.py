"""`dapo sweep` and `dapo arm` from a terminal: the session's Prefect server (the temporary one
a command starts without $PREFECT_API_URL where that is what a test is about), the session's
warm Ray (conftest.warm_ray, joined through RAY_ADDRESS), the real store.

The commands run as subprocesses, exactly as a user types them (dapo_cli.dapo), each test with a
store and runs directory of its own. One grid sweep is run once for the module and asserted on by
several tests: its output and stored points, the same sweep run again, a point rerun from its
stored config, a forced arm, and a second store sharing its runs directory.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dapo_cli import (
    DAPO,
    FLOW_TEST_TIMEOUT_S,
    LADDER_FILE,
    ROOT,
    SMALL,
    SMALL_OVERRIDES,
    alive,
    dapo,
    store_env,
    stored_sweep,
)
from prefect_server import wait_for
from ray_cluster import RayCluster
from store_runs import killed, new_attempt

pytestmark = pytest.mark.timeout(FLOW_TEST_TIMEOUT_S)


@pytest.fixture
def env(tmp_path: Path, warm_ray: RayCluster) -> dict[str, str]:
    return store_env(tmp_path, ray=warm_ray)


@pytest.fixture
def own_env(tmp_path: Path) -> dict[str, str]:
    """A store of its own and neither the session's Prefect server nor its Ray: a command
    starts its own, as on a laptop."""
    return store_env(tmp_path, own_prefect=True)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--arms", "grpo", "nope"], "error: arms: unknown arm 'nope': choose among grpo"),
        (
            ["--arms", "grpo", "--set", "optim.lr=-1"],
            "error: grpo seed 0: optim.lr=-1.0 must be > 0",
        ),
        (["--ray-address", "127.0.0.1:9"], "error: cannot reach the Ray cluster at 127.0.0.1:9"),
        (["--model", "./no/such/model"], "error: model path"),
        (["--store", "postgresql+psycopg://nobody@127.0.0.1:9/x"], "error: cannot open the store"),
        (["--ladder", "no/such.toml"], "error: ladder file no/such.toml does not exist"),
        (["--ladder", "dr-grpo", "--arms", "dapo"], "error: arms: unknown arm 'dapo': choose"),
        (["--grid", "algo.nope=1,2"], "error: --grid algo.nope: no such config field"),
        (
            ["--grid", "algo.clip_high=0.24,0.32", "--set", "algo.clip_high=0.3"],
            "error: overrides: algo.clip_high is the key the ladder's grid sweeps",
        ),
        # Issue 21.11: these failed inside the flow (exit 1) after Ray's autoscaler complained,
        # or (a long name) at the store's first insert on PostgreSQL.
        (["--arms", "grpo", "--cpus", "999"], "error: each arm asks for 999 CPU(s) but the Ray"),
        (["--arms", "grpo", "--gpus", "1"], "error: each arm asks for 1 GPU(s) but the Ray"),
        (["--name", "x" * 300], "error: name: String should have at most 200 characters"),
    ],
)
def test_bad_sweep_input_is_one_line_and_exit_2(
    env: dict[str, str], args: list[str], message: str
) -> None:
    result = dapo("sweep", *args, env=env)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(message), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    if Path(env["DAPO_DB_URL"].removeprefix("sqlite:///")).exists():  # opened, never written
        from db import reads
        from db.engine import get_engine

        assert reads.latest_sweep_id(get_engine(env["DAPO_DB_URL"])) is None


def test_an_unwritable_runs_directory_is_one_line_before_anything_starts(
    env: dict[str, str], tmp_path: Path
) -> None:
    """Issue 21.11: the runs directory was first written by the arm's actor, after the sweep
    row existed. A path under a regular file refuses even root (permission bits do not)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {**env, "DAPO_RUNS_DIR": str(blocker / "runs")}
    result = dapo("sweep", "--arms", "grpo", env=env)
    assert result.returncode == 2, result.stderr
    line = result.stderr.strip()
    assert line.startswith(f"error: the runs directory {blocker / 'runs'} ($DAPO_RUNS_DIR) is not")
    assert "\n" not in line
    assert not Path(env["DAPO_DB_URL"].removeprefix("sqlite:///")).exists() or _no_sweep(env)


def _no_sweep(env: dict[str, str]) -> bool:
    from db import reads
    from db.engine import get_engine

    return reads.latest_sweep_id(get_engine(env["DAPO_DB_URL"])) is None


@pytest.mark.parametrize(
    ("store", "message"),
    [
        ("nosuch://x", "error: unsupported store URL nosuch://x"),
        ("postgresql+psycopg://nobody@127.0.0.1:9/x", "error: cannot open the store"),
    ],
)
def test_serve_checks_its_store_before_serving(
    env: dict[str, str], store: str, message: str
) -> None:
    """`dapo serve --store URL` (the forms' default store) opens it first: a bad one is one line
    and exit 2, before any Prefect server or Ray is started."""
    result = dapo("serve", "--store", store, "--port", "9", env=env)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(message), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def _no_sweep_written(env: dict[str, str]) -> None:
    from db import reads
    from db.engine import get_engine

    assert reads.latest_sweep_id(get_engine(env["DAPO_DB_URL"])) is None


def test_a_malformed_data_file_is_one_line_exit_2_and_no_sweep(
    env: dict[str, str], tmp_path: Path
) -> None:
    """Issue 14.10: the data file was read only inside the Ray actor, after the sweep row was
    written: 76 lines of Prefect tracebacks, exit 1 and a failed sweep in the store."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "What is 1+1?", "answer": "2"}\n{"problem": "unfinished\n')
    result = dapo("sweep", "--arms", "grpo", "--data", str(bad), "--quiet", env=env)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: training data: "), result.stderr
    assert str(bad) in lines[0] and result.stdout == ""
    _no_sweep_written(env)


def test_a_model_path_that_is_not_a_model_is_one_line(env: dict[str, str], tmp_path: Path) -> None:
    result = dapo("sweep", "--arms", "grpo", "--model", str(tmp_path), env=env)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"error: model path {tmp_path} is not a model directory (no config.json in it)"
    )


def _stored_sweep(env: dict[str, str], seeds: list[int], **extra: Any) -> tuple[Any, int]:
    from db.store import Store
    from flows.params import SweepParams, validate

    params = validate(
        SweepParams,
        {"arms": ["grpo"], "seeds": seeds, "steps": 2, "eval_problems": 8, "eval_k": 2}
        | {"overrides": SMALL_OVERRIDES}
        | extra,
    )
    store = Store(env["DAPO_DB_URL"])
    return store, stored_sweep(store, params, "stored")


def test_dapo_arm_refuses_a_seed_or_arm_outside_the_sweep(env: dict[str, str]) -> None:
    """Issue 14.5: it trained seed 5 and the table then averaged grpo over {0, 5} alone."""
    from db import reads

    store, sweep_id = _stored_sweep(env, [0])
    for args, what in (
        (("--arm", "grpo", "--seed", "5"), "seed 5 (its seeds: 0)"),
        (("--arm", "dapo"), "arm 'dapo' (its arms: grpo)"),
    ):
        result = dapo("arm", "--sweep", str(sweep_id), *args, env=env)
        assert result.returncode == 2, result.stdout + result.stderr
        assert result.stderr.strip() == (
            f"error: sweep {sweep_id} has no {what}: choose one of its own, or pass --extend "
            "(form: extend) to add it to the sweep"
        )
    assert reads.runs_of_sweep(store.engine, sweep_id).empty
    assert store.get_sweep(sweep_id)["seeds"] == [0]


def test_a_busy_port_is_named_with_what_holds_it(own_env: dict[str, str]) -> None:
    """Issue 14.13: a second `dapo serve` said "no Prefect server answers there"."""
    env = own_env
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = dapo("serve", "--port", str(port), env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    line = result.stderr.strip()
    assert line.startswith(f"error: port {port} on 127.0.0.1 is taken by pid {os.getpid()} (")
    assert "it is not a Prefect server: choose another --port" in line
    assert "\n" not in line


DRIVER = """
import sys, time
from flows.commands import prepare_terminal, use_temporary_server
prepare_terminal()
server = use_temporary_server()
print(server.process.pid, server.api_url, flush=True)
time.sleep(600)
"""


def test_the_temporary_prefect_server_dies_with_a_killed_driver(own_env: dict[str, str]) -> None:
    """Issue 14.15: a SIGKILLed `dapo sweep` left Prefect's temporary server running (still up
    31 minutes later). The driver here starts its server exactly as `dapo sweep` does."""
    env = own_env
    from flows.local_server import healthy

    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER], env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    server_pid = None
    try:
        assert driver.stdout is not None
        pid, api_url = driver.stdout.readline().split()  # printed once the server answers
        server_pid = int(pid)
        cmdline = Path(f"/proc/{server_pid}/cmdline").read_bytes().split(b"\0")
        assert b"flows.local_server" in cmdline
        assert healthy(api_url)
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=60)
        wait_for(lambda: not alive(server_pid), "the server to die with its driver", 300.0)
        assert not healthy(api_url, timeout_s=1.0)
    finally:
        if driver.poll() is None:
            driver.kill()
        if server_pid is not None and alive(server_pid):
            os.kill(server_pid, signal.SIGKILL)


def test_dapo_arm_on_an_empty_store_says_what_to_do(env: dict[str, str]) -> None:
    result = dapo("arm", "--arm", "grpo", env=env)
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        == "error: the store holds no sweep yet: run `dapo sweep` first, or pass --sweep ID"
    )


def test_sweep_help_says_where_run_directories_go(env: dict[str, str]) -> None:
    result = dapo("sweep", "--help", env=env)
    assert result.returncode == 0
    assert "$DAPO_RUNS_DIR, default" in result.stdout and "dapo-lab/runs" in result.stdout


# --- one grid sweep, asserted on by the tests below ----------------------------------------------
GRID = ("--arms", "grpo", "--grid", "algo.clip_high=0.2,0.28")  # 0.2: grpo's own value
POINT = "grpo-clip_high=0.28"


@pytest.fixture(scope="module")
def swept(warm_ray: RayCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """`dapo sweep` of a grid around grpo (2 points, 2 steps) into a store of the module's own.
    Each arm asks for both CPUs, so the arms run one after the other in the ladder's order
    (grpo is run 1, as the second store's only arm is below) in one warm actor."""
    tmp = tmp_path_factory.mktemp("swept")
    env = store_env(tmp, ray=warm_ray)
    done = dapo("sweep", *GRID, "--cpus", "2", "--steps", "2", "--name", "cli", *SMALL, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return {"env": env, "tmp": tmp, "stdout": done.stdout}


@pytest.mark.slow
def test_a_grid_sweep_says_its_progress_prints_its_table_and_stores_its_points(
    swept: dict[str, Any],
) -> None:
    from db import grids, reads
    from db.store import Store

    out = swept["stdout"]
    # Progress in words, then the table, then the time split.
    assert "grpo s0  step 2/2  acc" in out and "tok/s  ETA" in out
    assert re.search(rf"{re.escape(POINT)} s0  run \d completed: 2 steps", out)
    assert "sweep 1 'cli'" in out and "completed" in out
    # A row per arm, each ending with its status (the comparisons below name arms too).
    rows = [line for line in out.splitlines() if line.startswith(("grpo ", f"{POINT} "))]
    assert [row.split()[0] for row in rows if row.endswith("completed")] == ["grpo", POINT]
    assert "orchestration ≈" in out
    store = Store(swept["env"]["DAPO_DB_URL"])
    runs = reads.runs_of_sweep(store.engine, 1)
    assert list(runs["status"]) == ["completed", "completed"]
    assert all(
        Path(d).is_relative_to(swept["env"]["DAPO_RUNS_DIR"]) for d in runs["checkpoint_dir"]
    )

    sweep = store.get_sweep(1)
    assert sweep["arms"] == ["grpo", POINT]
    assert [(r["arm"], r["parent"], r["grid"]) for r in sweep["ladder"]] == [
        ("grpo", None, {"algo.clip_high": 0.2}),
        (POINT, "grpo", {"algo.clip_high": 0.28}),
    ]
    # The dashboard's grid page: one row per point, the base marked.
    points = grids.grid_table(store.engine, 1)
    assert list(points["arm"]) == ["grpo", POINT]
    assert [p["algo.clip_high"] for p in points["point"]] == [0.2, 0.28]
    assert list(points["base"]) == [True, False]


@pytest.mark.e2e
@pytest.mark.slow
def test_the_same_sweep_again_skips_its_completed_arms(swept: dict[str, Any]) -> None:
    """Both arms already completed with the same config: skipped, nothing new stored."""
    from db import reads
    from db.store import Store

    env = swept["env"]
    store = Store(env["DAPO_DB_URL"])
    again = dapo("sweep", "--sweep", "1", env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    for run in reads.runs_of_sweep(store.engine, 1).to_dict("records"):
        assert f"skipped: already completed with config {run['config_hash']}" in again.stdout
    assert again.stdout.count("skipped: already completed with config") == 2
    assert len(reads.runs_of_sweep(store.engine, 1)) == 2


@pytest.mark.e2e
@pytest.mark.slow
def test_a_forced_point_is_a_new_attempt_of_its_stored_config_that_the_table_follows(
    swept: dict[str, Any],
) -> None:
    """One point again from (sweep, arm, seed) alone: the stored ladder rebuilds the config it
    completed with (the same hash), and --force starts a new attempt the table then shows."""
    from db import ablation, reads
    from db.store import Store

    env = swept["env"]
    store = Store(env["DAPO_DB_URL"])
    rerun = dapo("arm", "--arm", POINT, "--force", "--quiet", env=env)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    attempts = reads.arm_attempts(store.engine, 1, POINT)
    assert list(attempts["attempt"]) == [1, 2]
    assert list(attempts["status"]) == ["completed", "completed"]
    runs = reads.runs_of_sweep(store.engine, 1)
    assert runs.loc[runs["arm"] == POINT, "config_hash"].nunique() == 1
    table = ablation.ablation_table(store.engine, 1)
    newest = int(attempts["run_id"].iloc[-1])
    assert list(table.loc[table["arm"] == POINT, "run_ids"].iloc[0]) == [newest]


@pytest.mark.e2e
@pytest.mark.slow
def test_two_stores_sharing_a_runs_directory_never_share_a_run(swept: dict[str, Any]) -> None:
    """Issue 14.1: a sweep into a fresh store, with the runs directory of an earlier store,
    resumed the other store's checkpoint and recorded `completed` with 0 metrics. The earlier
    store is the module's sweep (its run 1: grpo, trained first); the fresh one's only run is
    sweep 1, run 1, grpo as well."""
    from db import reads
    from db.store import Store

    env = swept["env"]
    other = {**env, "DAPO_DB_URL": f"sqlite:///{swept['tmp'] / 'other.db'}"}
    second = dapo("sweep", "--arms", "grpo", "--steps", "2", "--quiet", *SMALL, env=other)
    assert second.returncode == 0, second.stdout + second.stderr

    runs = {}
    for url in (env["DAPO_DB_URL"], other["DAPO_DB_URL"]):
        store = Store(url)
        run = reads.run_details(store.engine, 1)
        assert (run["sweep_id"], run["arm"], run["attempt"]) == (1, "grpo", 1)
        assert run["status"] == "completed" and run["steps"] == 2
        curves = reads.metric_curves(store.engine, [1])
        assert sorted(set(curves["step"])) == [1, 2]  # trained here, not resumed
        assert 0 in set(reads.evaluations(store.engine, 1)["step"])  # its own start
        owner = json.loads((Path(run["checkpoint_dir"]) / "OWNER.json").read_text())
        assert owner["store"] == store.store_id
        runs[store.store_id] = run["checkpoint_dir"]
    assert len(set(runs.values())) == 2
    assert all(Path(d).is_relative_to(env["DAPO_RUNS_DIR"]) for d in runs.values())


@pytest.mark.e2e
@pytest.mark.slow
def test_after_a_killed_driver_dapo_arm_finishes_the_sweep_and_extend_widens_it(
    env: dict[str, str],
) -> None:
    """Issue 14.6: the sweep stayed `running` after a successful resume, and the attempt that
    the killed driver left stayed `running` too. Issue 14.5: --extend adds a seed on purpose."""
    store, sweep_id = _stored_sweep(env, [0])
    store.set_sweep_status(sweep_id, "running")  # then the driver was killed ...
    # ... with its attempt still "running", no checkpoint yet
    stale = new_attempt(store, sweep_id, "grpo", 0, holder=killed())
    done = dapo("arm", "--sweep", str(sweep_id), "--arm", "grpo", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    newest = store.latest_attempt(sweep_id, "grpo", 0)
    assert newest is not None and newest["status"] == "completed"
    assert store.get_sweep(sweep_id)["status"] == "completed"
    old = store.get_run(stale)
    assert old["status"] == "cancelled" and old["superseded_by"] == newest["run_id"]
    assert newest["tries"] == 1 and newest["wall_s"] > 0
    assert f"sweep {sweep_id} completed" in done.stdout

    wider = dapo(
        "arm", "--sweep", str(sweep_id), "--arm", "grpo", "--seed", "1", "--extend", env=env
    )
    assert wider.returncode == 0, wider.stdout + wider.stderr
    sweep = store.get_sweep(sweep_id)
    assert sweep["seeds"] == [0, 1] and sweep["params"]["seeds"] == [0, 1]
    assert sweep["status"] == "completed"
    assert store.latest_attempt(sweep_id, "grpo", 1)["status"] == "completed"  # type: ignore[index]


@pytest.mark.e2e
@pytest.mark.slow
def test_a_store_outage_mid_sweep_is_one_line_naming_the_store(
    env: dict[str, str], request: pytest.FixtureRequest
) -> None:
    """Issue 14.10 / 14.3: a store that goes away mid-sweep (and stays away past the budget)
    ends the sweep with one line that names the store, not a SQLAlchemy dump."""
    from conftest import PG_HOST, PG_PORT
    from tcp_proxy import TcpProxy

    from db.engine import safe_url
    from db.store import Store

    direct: str = request.getfixturevalue("pg_schemas")()
    Store(direct)  # the schema exists before the outage
    with TcpProxy((PG_HOST, PG_PORT)) as proxy:
        url = direct.replace(f":{PG_PORT}/", f":{proxy.port}/")
        outage = {**env, "DAPO_DB_URL": url, "DAPO_STORE_OUTAGE_S": "2"}
        args = ["sweep", "--arms", "grpo", "--steps", "40", *SMALL]
        driver = subprocess.Popen(
            [DAPO, *args], env=outage, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:
            assert driver.stdout is not None
            for line in driver.stdout:
                # Training, and writing through the proxy (progress skips steps faster than
                # its poll, so any step line will do).
                if re.search(r"grpo s0  step \d+/40", line):
                    proxy.stop()
                    break
            out, err = driver.communicate(timeout=600)
        finally:
            if driver.poll() is None:
                driver.kill()
    assert driver.returncode == 1, out + err
    # The sink's notice that the store stopped answering (forwarded from the actor) is a
    # warning on the way; the error itself is one line.
    lines = [line for line in err.strip().splitlines() if "does not answer" not in line]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: sweep ") and safe_url(url) in lines[0], lines[0]
    assert "unreachable" in lines[0] and "Traceback" not in err


# --- ladders of your own (dapo_cli.LADDER_FILE) -------------------------------------------------
def test_a_bad_ladder_file_is_one_line_and_writes_nothing(
    env: dict[str, str], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(LADDER_FILE.replace("0.28", "0.2"))  # eps28 then equals its parent
    result = dapo("sweep", "--ladder", str(bad), env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip() == (
        f"error: {bad}: arm 'eps28': same config as its parent 'base' on preset 'tiny': give it "
        "a `set` that changes something, or remove it"
    )
    assert not Path(env["DAPO_DB_URL"].removeprefix("sqlite:///")).exists()


def test_a_ladder_files_arms_are_the_ones_a_sweep_can_name(
    env: dict[str, str], tmp_path: Path
) -> None:
    """The file is read by the command and its arms offered in the file's order (a sweep of a
    ladder's TOML text runs end to end in tests/flows/test_flows_served.py)."""
    path = tmp_path / "mine.toml"
    path.write_text(LADDER_FILE)
    result = dapo("sweep", "--ladder", str(path), "--arms", "base,nope", env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    line = result.stderr.strip()
    assert line.startswith("error: arms: unknown arm 'nope': choose among base, eps28, no_std")
    assert "'mine'" in line and "\n" not in line
