"""Shared fixtures: event builders used across the suite."""

from __future__ import annotations

import pytest


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
