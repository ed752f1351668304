"""The DataFrame compaction on the places beyond the test run's local session: a standalone
cluster (master and two workers as separate JVMs on 127.0.0.1) and Spark Connect. The same
segments must give, at every T, the answers of the in-process reference (which the local session's
DataFrame compaction equals: ``test_compaction_frames``, ``test_engine_parity``).

Cluster and Connect drivers run in a subprocess (``spark_scenario.py``): a Connect client and
the test run's classic session must not share one process. Every JVM a test starts is stopped
by its pid."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from history_pipeline_tests.spark_scenario import run
from history_pipeline_tests.test_compaction import _split, random_history

SPARK_HOME = Path(__import__("pyspark").__file__).parent
ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        SPARK_HOME=str(SPARK_HOME),
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        PYTHONPATH=os.pathsep.join(p for p in [str(ROOT), env.get("PYTHONPATH", "")] if p),
    )
    return env


def _start(args: list[str], log: Path) -> subprocess.Popen:
    out = open(log, "wb")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(args, env=_env(), stdout=out, stderr=subprocess.STDOUT, cwd=log.parent)


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait(check, what: str, procs: list[subprocess.Popen], logs: list[Path], limit: float = 180) -> None:
    give_up = time.monotonic() + limit
    while time.monotonic() < give_up:
        if any(p.poll() is not None for p in procs):
            break
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(1)
    _stop(procs)
    tails = "\n".join(log.read_text(errors="replace")[-3000:] for log in logs)
    raise AssertionError(f"{what} did not come up:\n{tails}")


@pytest.fixture(scope="module")
def standalone_cluster(tmp_path_factory):
    """spark://127.0.0.1:port with two workers (one core each)."""
    base = tmp_path_factory.mktemp("cluster")
    port, ui = _free_port(), _free_port()
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    logs = [base / "master.log"]
    procs = [_start([spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port",
                     str(port), "--webui-port", str(ui)], logs[0])]
    url = f"spark://127.0.0.1:{port}"
    for i in range(2):
        work = base / f"worker{i}"
        work.mkdir()
        logs.append(base / f"worker{i}.log")
        procs.append(_start([spark_class, "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
                             "--cores", "1", "--memory", "1g", "--work-dir", str(work), "--webui-port",
                             str(_free_port())], logs[-1]))

    def two_workers() -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=5) as r:
            status = json.loads(r.read())
        return sum(w.get("state") == "ALIVE" for w in status.get("workers", [])) == 2

    _wait(two_workers, "the standalone cluster", procs, logs)
    try:
        yield url
    finally:
        _stop(procs)


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory):
    """A Spark Connect server (local[2] inside) on 127.0.0.1."""
    base = tmp_path_factory.mktemp("connect")
    port = _free_port()
    log = base / "connect.log"
    proc = _start([
        str(SPARK_HOME / "bin" / "spark-submit"), "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
        "--master", "local[2]", "--conf", f"spark.connect.grpc.binding.port={port}",
        "--conf", "spark.connect.grpc.binding.address=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
        "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.sql.shuffle.partitions=4",
        "--conf", "spark.ui.enabled=false", "spark-internal",
    ], log)

    def listening() -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True

    _wait(listening, "the Spark Connect server", [proc], [log])
    try:
        yield f"sc://127.0.0.1:{port}"
    finally:
        _stop([proc])


def _batches(seed: int, segments: int = 4) -> list[list[dict]]:
    """A random history cut into ``segments`` segments at timestamp boundaries (a few: every
    segment costs a handful of Spark jobs, each slow on a cluster, and the suite has a budget)."""
    cuts = _split(random_history(seed, n_events=50), random.Random(seed))
    per = -(-len(cuts) // segments)
    return [[e for cut in cuts[i:i + per] for e in cut] for i in range(0, len(cuts), per)]


def _reference(tmp_path: Path, spec: dict) -> dict:
    """What ``spec`` (a scenario run: its batches, snapshot pieces, maintenance) gives compacted in
    this process: the per-event reference, which the DataFrame path on a local session equals at
    every T (``test_compaction_frames``, ``test_engine_parity``)."""
    local = {**spec, "root": str(tmp_path / "reference"), "wal_dir": str(tmp_path / "wal-reference"), "s3": None,
             "expect_refusal": False, "shared": False}
    return json.loads(json.dumps(run(False, local)))


def _run(tmp_path: Path, session: dict, runs: list[dict]) -> list[dict]:
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"session": session, "runs": runs}))
    proc = subprocess.run([sys.executable, "-m", "history_pipeline_tests.spark_scenario", str(job)], env=_env(),
                          capture_output=True, text=True, timeout=900, cwd=tmp_path)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-5000:]
    return json.loads(lines[-1][len("RESULT "):])


def _s3_spec(tmp_path: Path, batches, s3_bucket: str, s3_options) -> dict:
    s3 = {"endpoint_url": s3_options.endpoint_url, "region": s3_options.region,
          "access_key_id": s3_options.access_key_id, "secret_access_key": s3_options.secret_access_key}
    return {"root": s3_bucket, "wal_dir": str(tmp_path / "wal-s3"), "database": "db", "batches": batches, "s3": s3,
            "shared": True}


def test_standalone_cluster_gives_the_local_answers(tmp_path, standalone_cluster, s3_bucket, s3_options):
    """A local root is refused on a cluster unless declared shared (before any work); an S3 root
    compacts on the cluster's executors, which then write snapshots in pieces, and every answer
    equals the reference's."""
    batches = _batches(77)
    local_root = {"root": str(tmp_path / "root"), "wal_dir": str(tmp_path / "wal-local"), "database": "db",
                  "batches": batches, "expect_refusal": True, "refusal_only": True}
    on_s3 = {**_s3_spec(tmp_path, batches, s3_bucket, s3_options), "snapshot_piece_rows": 3}
    expected = _reference(tmp_path, on_s3)
    refused, s3_root = _run(tmp_path, {"master": standalone_cluster}, [local_root, on_s3])
    assert refused["refused"] is not None and "ExecutionError" in refused["refused"]
    assert "shared_paths" in refused["refused"]
    assert s3_root["segments_applied"] == expected["segments_applied"] == list(range(1, len(batches) + 1))
    assert s3_root["answers"] == expected["answers"]
    # snapshots written in pieces by the cluster's executors on S3 answer alike
    assert s3_root["snapshot_pieces"] == expected["snapshot_pieces"]
    assert max(s3_root["snapshot_pieces"].values()) >= 2
    assert s3_root["answers_after_snapshot"] == expected["answers"]


def test_spark_connect_gives_the_local_answers(tmp_path, connect_server, s3_bucket, s3_options):
    """Compaction, snapshots in pieces, then merge and retention on an S3 root: maintenance runs its
    table tasks through DataFrames (no ``sparkContext`` under Connect), the S3 credentials in the
    session conf, not in the task payloads. One Connect run does all of it, to keep the suite's time
    (a local root under Connect is the engine's, in ``test_engine``)."""
    batches = _batches(78)
    purge_before = 1 + max(e["t"] for batch in batches for e in batch) // 3
    on_s3 = {**_s3_spec(tmp_path, batches, s3_bucket, s3_options), "snapshot_piece_rows": 3,
             "purge_before": purge_before}
    expected = _reference(tmp_path, on_s3)
    assert expected["maintenance"]["merge_files_removed"] > 1
    assert expected["maintenance"]["retention_versions_removed"] > 0
    (s3_root,) = _run(tmp_path, {"remote": connect_server}, [on_s3])
    assert s3_root["answers"] == expected["answers"]
    # snapshots written in pieces by tasks under Spark Connect answer alike
    assert s3_root["snapshot_pieces"] == expected["snapshot_pieces"]
    assert max(s3_root["snapshot_pieces"].values()) >= 2
    assert s3_root["answers_after_snapshot"] == expected["answers"]
    assert s3_root["maintenance"] == expected["maintenance"]


SHARED_PROBE = """
import sys
from history_pipeline.orchestration.resources import SparkResource
session = SparkResource(master=sys.argv[1]).session()
if sys.argv[2] == "create":
    session.range(3).createOrReplaceTempView("shared_probe")
else:
    print(session.table("shared_probe").count())
"""


def test_runs_on_a_connect_engine_share_one_engine_session(connect_server):
    """Two processes (two runs) attach to one server-side session, whose Python workers are started
    once: a temporary view, which lives in a session, made by one is read by the other."""
    import subprocess
    import sys

    def probe(step: str) -> str:
        done = subprocess.run([sys.executable, "-c", SHARED_PROBE, connect_server, step], capture_output=True,
                              text=True, timeout=180)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.strip()

    probe("create")
    assert probe("read") == "3"
