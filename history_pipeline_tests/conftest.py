"""Shared fixtures (event builders, S3, Spark) and the suite's tiers.

Every test that needs a SparkSession, an S3 endpoint, a PostgreSQL server, a daemon or a JVM of its
own carries the marker of that component (``spark``, ``s3``, ``postgres``, ``daemon``, ``jvm``);
the markers are added here from the fixtures a test uses and from its parameters, or written on
the test. ``make check`` runs the tests with none of them (``-m "not spark and ..."``) and sets
``HISTORY_TEST_TIER=check``: in that tier a SparkSession, an S3 endpoint or a PostgreSQL server
that a test starts anyway fails it, so a missing marker is found rather than paid for.
"""

from __future__ import annotations

import os

import pytest

#: the components a test may need, each a marker; make check runs the tests that carry none
HEAVY_MARKERS = ("spark", "s3", "postgres", "daemon", "jvm")

#: fixture name -> the marker a test that uses it (directly or through another fixture) carries
FIXTURE_MARKERS = {
    "spark": "spark",
    "s3_endpoint": "s3",
    "postgres": "postgres",
    "pg": "postgres",
    "server": "daemon",  # a HistoryService with its worker processes
    "strict_server": "daemon",
    "dagster_dev": "daemon",
    "standalone_cluster": "jvm",  # a master and two workers
    "connect_server": "jvm",
}

#: modules every test of which needs a component (the PostgreSQL suites start their own servers)
MODULE_MARKERS = {
    "test_capture_postgres": "postgres",
    "test_postgres_oracle": "postgres",
    "test_postgres_edges": "postgres",
}

IN_CHECK_TIER = os.environ.get("HISTORY_TEST_TIER") == "check"

#: every JVM the tests start compiles with the quick JIT only: the local sessions, the command
#: line's, Spark Connect engines (spark-submit reads SPARK_SUBMIT_OPTS), a standalone cluster's
#: master and workers (SPARK_DAEMON_JAVA_OPTS) and its executors (``spark_scenario``). They live
#: seconds to minutes over tiny data, where the optimising compiler costs more CPU than it wins
#: back (test_compaction_frames.py on 2026-11-29, commit 9fe8695: 76 s of JVM CPU, 45 s with it).
QUICK_JIT = "-XX:TieredStopAtLevel=1"
for _variable in ("SPARK_SUBMIT_OPTS", "SPARK_DAEMON_JAVA_OPTS"):
    os.environ.setdefault(_variable, QUICK_JIT)


def pytest_collection_modifyitems(config, items):
    """Mark each test with the components its fixtures and parameters need."""
    for item in items:
        needed = {marker for fixture, marker in FIXTURE_MARKERS.items() if fixture in item.fixturenames}
        module = item.module.__name__.rsplit(".", 1)[-1] if item.module is not None else ""
        if module in MODULE_MARKERS:
            needed.add(MODULE_MARKERS[module])
        callspec = getattr(item, "callspec", None)
        if callspec is not None:
            # a backend or engine chosen by parameter ("s3", "spark") is fetched with getfixturevalue
            needed |= {value for value in callspec.params.values() if isinstance(value, str) and value in HEAVY_MARKERS}
        for marker in sorted(needed):
            item.add_marker(marker)
    _longest_modules_first(items)


#: the order modules run in, by the heaviest component any of their tests needs
RUN_ORDER = ("jvm", "daemon", "s3", "spark", "postgres")


def _longest_modules_first(items) -> None:
    """Modules whose tests start JVMs or daemons first, pure modules last (each module's tests kept
    together and in their own order): two workers then end on short tests, not one long one."""
    rank: dict[str, int] = {}
    for item in items:
        markers = {m.name for m in item.iter_markers()}
        heaviest = min((RUN_ORDER.index(m) for m in markers if m in RUN_ORDER), default=len(RUN_ORDER))
        module = item.nodeid.split("::", 1)[0]
        rank[module] = min(rank.get(module, heaviest), heaviest)
    items.sort(key=lambda item: rank[item.nodeid.split("::", 1)[0]])  # stable: module order kept within a rank


@pytest.fixture(autouse=True, scope="session")
def _check_tier_guard():
    """In the fast tier, starting a heavy component is an error naming the marker to add."""
    if not IN_CHECK_TIER:
        yield
        return
    from pyspark.sql import SparkSession

    from history_pipeline.service.server import HistoryServer
    from history_pipeline_tests import pg_support

    def refuse(component: str, marker: str):
        def refused(*args, **kwargs):
            raise AssertionError(f"this test starts {component}: mark it @pytest.mark.{marker}")

        return refused

    patch = pytest.MonkeyPatch()
    # a subprocess (the CLI run as a command) that would start a JVM fails to find Spark instead
    patch.setenv("SPARK_HOME", "/nonexistent: the check tier starts no JVM")
    patch.setattr(SparkSession.Builder, "getOrCreate", refuse("a SparkSession", "spark"))
    patch.setattr(pg_support, "pg_bin", refuse("a PostgreSQL server", "postgres"))
    patch.setattr(HistoryServer, "__init__", refuse("the HistoryService", "daemon"))
    try:
        from moto.server import ThreadedMotoServer

        patch.setattr(ThreadedMotoServer, "start", refuse("an S3 endpoint", "s3"))
    except ImportError:
        pass
    yield
    patch.undo()


def create_table(t, table_uuid="tbl-1", name="orders", columns=None):
    return {
        "op": "create_table",
        "t": t,
        "table_uuid": table_uuid,
        "table_name": name,
        "columns": columns
        or [
            {"column_uuid": "c-id", "column_name": "id", "data_type": "BIGINT", "is_nullable": False},
            {"column_uuid": "c-amount", "column_name": "amount", "data_type": "NUMERIC(10,2)"},
        ],
    }


@pytest.fixture
def wal_dir(tmp_path):
    return tmp_path / "wal"


@pytest.fixture(scope="session")
def s3_endpoint():
    """A real S3-compatible HTTP endpoint on 127.0.0.1 (moto's server mode), for the whole run."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_options(s3_endpoint):
    from history_pipeline.io.store import S3Options

    return S3Options(endpoint_url=s3_endpoint, region="us-east-1", access_key_id="test", secret_access_key="test")


@pytest.fixture
def s3_bucket(s3_options):
    """A fresh bucket; returns its s3:// URI with a prefix."""
    import uuid

    import boto3

    name = f"b-{uuid.uuid4().hex[:12]}"
    boto3.client(
        "s3",
        endpoint_url=s3_options.endpoint_url,
        region_name=s3_options.region,
        aws_access_key_id=s3_options.access_key_id,
        aws_secret_access_key=s3_options.secret_access_key,
    ).create_bucket(Bucket=name)
    return f"s3://{name}/warehouse"


@pytest.fixture(params=["local", "s3"])
def object_store(request, tmp_path):
    """The same tests on both backends: a local directory and a real S3 endpoint."""
    from history_pipeline.io.store import open_store

    if request.param == "local":
        return open_store(tmp_path / "root")
    uri = request.getfixturevalue("s3_bucket")
    return open_store(uri, request.getfixturevalue("s3_options"))


@pytest.fixture(scope="session")
def spark():
    """The one local SparkSession of the test run (stopped at the end)."""
    import os
    import sys

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable  # executors need this venv's pyarrow
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("history_pipeline_tests")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    yield session
    session.stop()
