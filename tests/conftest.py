"""Session-wide test settings shared by every suite."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The tiny model's supervised warm-start is computed once per machine and cached here, so
# every test (and every Ray worker or Prefect subprocess, which inherit the environment)
# reuses it instead of training it again.
os.environ.setdefault("DAPO_CACHE_DIR", str(ROOT / ".cache" / "test-tiny"))
os.environ.setdefault("DAPO_DATA_DIR", str(ROOT.parent / "shared" / "data"))
# Keep Ray and Prefect from phoning home or opening browsers during tests.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("PREFECT_UI_ENABLED", "true")
(ROOT / "tests" / "artifacts").mkdir(parents=True, exist_ok=True)

# --- `make test` runs the suite in two pytest-xdist workers (one per core) ----------------
# A worker is told the controller's terminal width in $COLUMNS (80 without a terminal), where a
# plain run has none: the tables' tests expect what a command prints without it (120 columns),
# and the tests of $COLUMNS itself set their own.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if _WORKER:
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)
    # Each worker's Prefect servers keep their database in a directory of their own: two first
    # starts migrating one SQLite file at once would race (a plain run keeps $PREFECT_HOME).
    _home = os.environ.get("PREFECT_HOME") or str(ROOT / ".cache" / "test-prefect-home")
    os.environ["PREFECT_HOME"] = str(Path(_home) / _WORKER)
    # One torch thread per test process: two workers at torch's default of one thread per core
    # ran four threads on two cores, and the oversubscribed kernels took 1.35x as long (six
    # trainer modules, 84 s against 62 s, 2026-11-29). The commands and trainings a test starts
    # inherit it; Ray actors and gloo workers still set the threads their CPUs grant.
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# --- the two databases of the store tests ----------------------------------------------------
# Every store test runs against a SQLite file and a real PostgreSQL server (127.0.0.1:5432,
# database `test`, trust auth). PostgreSQL tests FAIL when the server is missing: CI starts it
# (.ci/run), and a skipped half of the store tests would read as a pass.

import tempfile  # noqa: E402
import uuid  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
import sqlalchemy as sa  # noqa: E402

PG_HOST, PG_PORT, PG_DATABASE = "127.0.0.1", 5432, "test"
PG_USERS = ("postgres", "root")
BACKENDS = ("sqlite", "postgresql")

# Nothing a test runs may write into the user's own store by accident: without an explicit URL
# the store is this session's scratch file (tests that check the default unset it).
os.environ.setdefault(
    "DAPO_DB_URL", f"sqlite:///{Path(tempfile.mkdtemp(prefix='dapo-test-store-')) / 'dapo.db'}"
)


def pg_server_url() -> str:
    """URL of the test database as the first user that can log in; pytest.fail otherwise."""
    problems = []
    for user in PG_USERS:
        url = f"postgresql+psycopg://{user}@{PG_HOST}:{PG_PORT}/{PG_DATABASE}"
        engine = sa.create_engine(url, connect_args={"connect_timeout": 5})
        try:
            with engine.connect() as conn:
                conn.execute(sa.text("SELECT 1"))
            return url
        except sa.exc.OperationalError as error:
            problems.append(f"{user}: {str(error.orig).strip().splitlines()[0]}")
        finally:
            engine.dispose()
    pytest.fail(
        f"PostgreSQL is required for the store tests and is not reachable at {PG_HOST}:{PG_PORT}"
        f"/{PG_DATABASE} ({'; '.join(problems)}); start it with `pg_ctlcluster "
        "--skip-systemctl-redirect $(ls /etc/postgresql) main start`"
    )


def pg_schema_url(server_url: str, schema: str) -> str:
    """A store URL whose connections work inside `schema` (libpq's `options` sets search_path)."""
    return f"{server_url}?options=-csearch_path%3D{schema}"


@pytest.fixture(scope="session")
def pg_schemas() -> Iterator[Callable[[], str]]:
    """Factory of fresh PostgreSQL schemas, each a store URL. Every schema of this session is
    named `dapo_test_<session>_<n>` and dropped at the end of the session."""
    server = pg_server_url()
    prefix = f"dapo_test_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(server)
    made: list[str] = []

    def make() -> str:
        schema = f"{prefix}_{len(made)}"
        with admin.begin() as conn:
            conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
        made.append(schema)
        return pg_schema_url(server, schema)

    try:
        yield make
    finally:
        from db import engine as db_engine

        db_engine.dispose()  # pooled connections would keep the schemas' tables busy
        with admin.begin() as conn:
            for schema in made:
                conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()


def _fresh_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    make: Callable[[], str] = request.getfixturevalue("pg_schemas")
    return make()


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """URL of a fresh, empty store: a SQLite file, then a PostgreSQL schema."""
    url = _fresh_url(request.param, tmp_path, request)
    yield url
    from db import engine as db_engine

    db_engine.dispose(url)


@pytest.fixture
def backend(store_url: str) -> str:
    """'sqlite' or 'postgresql': the backend of this test's store_url."""
    return "sqlite" if store_url.startswith("sqlite") else "postgresql"


# PostgreSQL through a TCP proxy that a test takes down and brings back (tests/tcp_proxy.py): the
# store outages of tests/db/test_db_outage.py and tests/flows/test_flows_arm_wall.py.
@pytest.fixture
def proxy() -> Iterator[Any]:
    from tcp_proxy import TcpProxy

    with TcpProxy((PG_HOST, PG_PORT)) as running:
        yield running
        running.unhang()  # a thread waiting on a hung proxy ends with the test


@pytest.fixture
def pg_urls(proxy: Any, request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """(direct URL, URL through the proxy) of a fresh PostgreSQL schema."""
    from db import engine as db_engine
    from db.store import Store

    direct: str = request.getfixturevalue("pg_schemas")()
    through = direct.replace(f":{PG_PORT}/", f":{proxy.port}/")
    assert through != direct  # the writes under test really go through the proxy
    Store(direct)  # created directly, so the outage never meets a half-made schema
    yield direct, through
    db_engine.dispose(through)


# --- the end-to-end flow runs: `make test-e2e` ----------------------------------------------------
# Sweeps through served deployments, pool workers and `dapo sweep` / `dapo arm`, killed actors and
# workers, cancellations, store outages: what only a whole run shows, each run once, and minutes
# of CPU together. `make test` leaves them out (one `dapo sweep` stays in it, in
# tests/flows/test_flows_cli.py); `make test-e2e` runs them, and .ci/run runs both.


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "e2e: an end-to-end flow run (Prefect deployments and workers, Ray actors, dapo sweep / "
        "arm training): make test-e2e, which .ci/run runs after make test",
    )


# --- the longest modules first ------------------------------------------------------------------
# `make test` hands whole files to its two workers in collection order, one at a time as each
# worker frees up. In alphabetical order a module of minutes came last and ran alone while the
# other core idled (the last 10% of one run took 7 of its 19 minutes, 2026-11-29). Longest first
# is the classic schedule for that: these modules took 27-107 s of a worker each, in this order
# (`--durations=0` summed per file, 2026-11-29); the rest keep their order after them. The
# Makefile passes --no-loadscope-reorder: pytest-xdist otherwise hands out the files with the
# most tests first, whatever this order says. Each is a path relative to tests/ (test_layers.py
# checks that it names a file). The first file builds the tiny model's warm start on one
# thread (81 s quiet, 184 s in a CI rehearsal beside the side environments' installs); the
# next four need no model, so the other worker runs them meanwhile instead of waiting on the
# warm start's lock (a grid sweep's fixture waited 55 s in that rehearsal).
LONGEST_FIRST = (
    "dapo_core/test_distributed_runs.py",
    "db/test_db_cli.py",
    "dashboard/test_dashboard_pages_browser.py",
    "db/test_annotations.py",
    "db/test_store_integrity.py",
    "flows/test_flows_cli.py",
    # make test-e2e's four modules are the flow ones: cli, served, pool, ray (379, 349, 283 and
    # 120 s) packs two workers best in this order; their make test parts take seconds
    "flows/test_flows_served.py",
    "flows/test_flows_pool.py",
    "dapo_core/test_async_workers.py",
    "flows/test_flows_arm_lease.py",
    "dashboard/test_dashboard_rerun_confirm.py",
    "dapo_core/test_plan.py",
    "flows/test_warm_start_phase.py",
    "dapo_core/test_load_once.py",
    "dapo_core/test_async_runs.py",
    "flows/test_cli_and_artifact_output.py",
    "dapo_core/test_distributed.py",
    "flows/test_flows_ray.py",
    "dapo_core/test_checkpoint_retention.py",
    "dashboard/test_dashboard_app.py",
    "db/test_db_concurrency.py",
    "db/test_cli_tables.py",
    "dashboard/test_dashboard_layout.py",
    "dashboard/test_artifact_layout.py",
    "dapo_core/test_runner.py",
)


TESTS = ROOT / "tests"


def _under_tests(path: Path) -> str:
    """A test module's path relative to tests/ (LONGEST_FIRST's spelling)."""
    resolved = path.resolve()
    return resolved.relative_to(TESTS).as_posix() if resolved.is_relative_to(TESTS) else ""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    # sorted() is stable: a module's own tests keep their order (their module fixtures rely on it).
    items.sort(key=lambda item: rank.get(_under_tests(item.path), len(rank)))


# --- one warm Ray per test process for the flow tests ------------------------------------------
# A `dapo sweep`, `dapo serve` or `dapo worker` without RAY_ADDRESS starts a local Ray of its own
# (GCS, raylet, agents and prestarted workers: seconds of CPU each time, and one more start that
# a loaded machine can time out). The flow tests' commands join this one instead, as they would
# a cluster (dapo_cli.store_env(tmp, ray=warm_ray)); the tests of a local Ray start their own.


@pytest.fixture(scope="session")
def warm_ray(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A one-node Ray of 2 CPUs (as this 2-core machine's local Ray has), started when a test
    first asks for it and stopped, every process of it, at the end of the session
    (tests/ray_cluster.py). Each test keeps its own store and runs directory; the actors of a
    test's commands end with those commands."""
    from ray_cluster import ray_cluster

    root = tmp_path_factory.mktemp("warm-ray")
    with ray_cluster(root, nodes=1, cpus_per_node=2, fast_health_checks=False) as head:
        yield head


# --- one Prefect server per test process for the `dapo` commands the tests run ----------------
# A `dapo sweep` without $PREFECT_API_URL starts a temporary server of its own: 3-10 s of wall
# time and ~7 s of CPU before its first step, paid by each of the suite's dozens of sweeps. The
# suite's processes share one per pytest process instead (a `dapo` command inherits the URL);
# the tests of the temporary server itself, and of `dapo serve`, which starts its own, drop it
# (tests/dapo_cli.py store_env(own_prefect=True), or monkeypatch.delenv).


@pytest.fixture(scope="session", autouse=True)
def shared_prefect_server() -> Iterator[str | None]:
    """$PREFECT_API_URL for the whole session: a server started here (with its UI) on a database
    of its own, copied from a migrated one kept beside the per-worker $PREFECT_HOME (made by a
    machine's first run), one per Prefect version (the side environments' suites run other
    versions, whose migrations an older server cannot read). None in an environment without Prefect. A URL the caller's shell sets is put back
    at the end, and never handed to a test's command: the tests' flow runs stay out of a
    server of one's own."""
    import importlib.util

    if importlib.util.find_spec("prefect") is None:  # .venv-trackers: its suite needs none
        yield None
        return
    previous = os.environ.pop("PREFECT_API_URL", None)
    # Prefect's in-process settings are read from the environment when prefect.context is
    # first imported (by `import prefect`): imported before the URL is set, they stay what a
    # test process had (no server); only the commands a test starts inherit the URL.
    import prefect
    import prefect_server

    home = Path(os.environ.get("PREFECT_HOME") or ROOT / ".cache" / "test-prefect-home")
    # With the UI (tests/prefect_ui.py drives it): the flow modules share this server too, on
    # a database of this session's own (two sessions on one would run each other's flow runs).
    template = home / f"server-template-{prefect.__version__}"
    with prefect_server.running_fresh(template, ui=True) as api_url:
        os.environ["PREFECT_API_URL"] = api_url
        try:
            yield api_url
        finally:
            os.environ.pop("PREFECT_API_URL", None)
            if previous is not None:
                os.environ["PREFECT_API_URL"] = previous
