"""The long-lived Spark engine through the real daemon: `dagster dev` with HISTORY_PIPELINE_SPARK
naming a local Spark Connect server. The runs' work shows in the server's own job history
(its event log, every job tagged with the Dagster run that asked for it); the server killed
mid-compaction fails that run with one clear error and applies nothing, and once it is back the
sensor compacts the segment again. Every process started here is stopped by its pid."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from history_pipeline import HistoryStore
from history_pipeline.engine import (
    WARM_TAG,
    engine_dir,
    process_alive,
    reachable,
    running_engine,
    start_engine,
    stop_engine,
)
from history_pipeline.execution import shared_periods_to_warm, shared_session_url
from history_pipeline.orchestration.resources import ENGINE_ENV, run_tag
from history_pipeline.orchestration.sensors import COMPACTION_TAG
from history_pipeline.wal import SegmentState
from history_pipeline_tests.dagster_support import dagster_home, running_dagster_dev
from history_pipeline_tests.dagster_support import free_port as _free_port
from history_pipeline_tests.test_compaction import example_events, write
from history_pipeline_tests.test_end_to_end import _get
from history_pipeline_tests.test_end_to_end import _wait as _wait_every

RUNS = """
{ runsOrError { ... on Runs { results { runId status tags { key value } } } } }
"""
FAILURES = """
query($id: ID!) { logsForRun(runId: $id) { ... on EventConnection { events {
    __typename ... on ExecutionStepFailureEvent { stepKey error { message causes { message } } } } } } }
"""


def _graphql(port: int, query: str, **variables) -> dict:
    body = json.dumps({"query": query, "variables": variables}).encode()
    return json.loads(_get(f"http://127.0.0.1:{port}/graphql", body, timeout=10))["data"]


def _wait(predicate, timeout: float, what: str) -> None:
    """``test_end_to_end``'s wait, polled every quarter second: a kill must land while the run works."""
    _wait_every(predicate, timeout, what, every=0.25)


def _runs(port: int) -> list[dict]:
    """The compaction runs the sensor requested (a schedule's maintenance run may come and go too)."""
    return [r for r in _graphql(port, RUNS)["runsOrError"]["results"]
            if any(tag["key"] == COMPACTION_TAG for tag in r["tags"])]


def _tagged_runs(events) -> set[str]:
    """Dagster run ids named by the tags of the jobs in the engine's event log."""
    text = "".join(p.read_text(errors="replace") for p in events.rglob("*") if p.is_file())
    return set(re.findall(re.escape(run_tag("")) + r"([0-9a-f-]{36})", text))


def _tag_sessions(events, tag: str) -> set[str]:
    """Engine session ids of the jobs in the engine's event log that carry the job tag ``tag``."""
    text = "".join(p.read_text(errors="replace") for p in events.rglob("*") if p.is_file())
    return set(re.findall(r"Session_([0-9a-f-]{36})_Tag_" + re.escape(tag), text))


def _bulk(first_t: int, rows: int) -> list[dict]:
    """Inserts of ``rows`` keys into the example table, one timestamp each (a segment that takes the
    engine a few seconds, so that it can be killed while working on it)."""
    return [{"op": "insert", "t": first_t + i, "table_uuid": "tbl-example", "key": 1000 + i,
             "values": {"col1": f"v{i}"}} for i in range(rows)]


def test_process_alive_sees_an_exited_child_only_when_reaping():
    assert process_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
        assert process_alive(child.pid)  # a zombie still answers kill 0
        assert not process_alive(child.pid, reap=True)
        assert not process_alive(child.pid)  # reaped: gone
    finally:
        child.returncode = 0  # reaped above: Popen must not wait for it again


def test_engine_commands_without_an_engine(tmp_path, capsys):
    from history_pipeline.cli import main

    root = str(tmp_path / "data")
    assert main(["--root", root, "engine", "status"]) == 3
    assert "no engine running" in capsys.readouterr().out
    assert main(["--root", root, "engine", "stop"]) == 0
    assert "no engine was running" in capsys.readouterr().out
    # a record left by an engine that died is not taken for a running one
    folder = engine_dir(tmp_path / "data")
    folder.mkdir(parents=True)
    (folder / "engine.json").write_text(json.dumps({
        "url": f"sc://127.0.0.1:{_free_port()}", "pid": os.getpid(), "master": "local[2]", "driver_memory": "2g",
        "log": "x", "started_at": 0.0}))
    assert running_engine(folder) is None
    assert main(["--root", root, "engine", "status"]) == 3


def test_engine_start_warms_the_session_of_the_dagster_instance_at_dagster_home(tmp_path, monkeypatch, capsys):
    import history_pipeline.engine as engine
    from history_pipeline.cli import main

    asked: list[str | None] = []

    def start(folder, **options):
        asked.append(options.get("scope"))
        return engine.EngineInfo("sc://127.0.0.1:1", 1, "local[2]", "2g", "log", 0.0)

    monkeypatch.setattr(engine, "start_engine", start)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    assert main(["--root", str(tmp_path / "data"), "engine", "start"]) == 0
    monkeypatch.delenv("DAGSTER_HOME")
    assert main(["--root", str(tmp_path / "data"), "engine", "start"]) == 0
    assert asked == [str(tmp_path / "home"), None]


@pytest.mark.daemon
@pytest.mark.jvm
def test_runs_compact_on_the_engine_and_survive_losing_it(tmp_path):
    folder = engine_dir(tmp_path / "engine")
    events = tmp_path / "events"
    events.mkdir()
    port = _free_port()
    # the event log written through a small buffer: a job's tag is in the file when the job starts,
    # not only once its events fill the default 100 KB buffer (by then the work may be done)
    conf = {"spark.eventLog.enabled": "true", "spark.eventLog.dir": events.as_uri(), "spark.eventLog.compress": "false",
            "spark.eventLog.buffer.kb": "1k"}
    bulk = 60_000  # rows of the segment the engine is killed on: a few seconds of work
    url = f"sc://127.0.0.1:{port}"
    pool = ThreadPoolExecutor(max_workers=1)
    wal = None
    try:
        # the engine's JVM starts while dagster dev comes up (each takes seconds of waiting on its
        # processes); warmed for the runs of this instance (its root directory is the run's DAGSTER_HOME)
        started = time.time()
        engine_up = pool.submit(start_engine, folder, port=port, conf=conf, driver_memory="1g",
                                scope=str(dagster_home(tmp_path)))
        with running_dagster_dev(tmp_path, {ENGINE_ENV: url}) as web:
            engine_up.result()
            store = HistoryStore.open(tmp_path / "data", database="tenant_engine")
            write(store, example_events())
            # the next segment is written while the sensor's run compacts the first, and sealed (so
            # that the sensor sees it) once the first run is checked
            wal = store.wal_writer()
            for event in [*_bulk(6, bulk), {"op": "close", "t": 5 + bulk}]:
                wal.append(event)
            _wait(lambda: store.frontier == 5, 120, "the sensor's run to compact the segment")
            _wait(lambda: any(r["status"] == "SUCCESS" for r in _runs(web)), 60, "the run to finish")
            first = [r for r in _runs(web) if r["status"] == "SUCCESS"]
            assert len(first) == 1
            # the run's work reached the engine: its jobs carry the run's tag
            _wait(lambda: first[0]["runId"] in _tagged_runs(events), 30, "the run's jobs in the engine's log")
            # the engine ran its warm-up job before it was up, in the session this instance's runs share
            warmed = _tag_sessions(events, WARM_TAG)
            # (and the next half hour's too when started near the end of one)
            home = str(dagster_home(tmp_path))
            # (the warm-up ran some time after `started`, in the background: its periods are those
            # of a moment between `started` and now)
            def sessions(at: float) -> set[str]:
                return {shared_session_url(url, p, home).rsplit("=", 1)[1] for p in shared_periods_to_warm(at)}
            assert warmed in (sessions(started), sessions(time.time()))
            current = shared_session_url(url, time.time(), home).rsplit("=", 1)[1]
            if current in warmed:
                assert _tag_sessions(events, run_tag(first[0]["runId"])) == {current}

            # the engine is killed while the next segment is on it
            wal.seal()
            wal.close()
            engine = running_engine(folder)
            assert engine is not None
            # polled often: on the warm engine the run's work takes a second or two, and a kill that
            # lands after it tests nothing
            deadline = time.time() + 120
            while not _tagged_runs(events) - {first[0]["runId"]}:
                assert time.time() < deadline, "timed out after 120s waiting for the second run's first job"
                time.sleep(0.05)
            os.kill(engine.pid, signal.SIGKILL)
            assert store.frontier == 5, "the kill landed after the run's work was committed: it tests nothing"
            _wait(lambda: any(r["status"] == "FAILURE" for r in _runs(web)), 120, "the run to fail")
            failed = next(r for r in _runs(web) if r["status"] == "FAILURE")
            failures = [e for e in _graphql(web, FAILURES, id=failed["runId"])["logsForRun"]["events"]
                        if e["__typename"] == "ExecutionStepFailureEvent"]
            assert len(failures) == 1 and failures[0]["stepKey"] == "compact_segments"
            # Dagster's step error wraps exactly one cause: ours, naming the engine (no gRPC chain)
            causes = failures[0]["error"]["causes"]
            assert len(causes) == 1, causes
            assert causes[0]["message"].startswith(
                f"history_pipeline.execution.EngineUnavailableError: the Spark engine at {url} stopped answering")
            # nothing of it is visible: the frontier, the answers and the segment are as before
            assert store.frontier == 5
            assert store.load_table("my_table", 6).to_pylist() == [{"synthetic_key": 2, "column1": "value2_prime"}]
            assert [r.segment_id for r in store.segments(SegmentState.SEALED)] == [2]
            # back on the same address: the engine's JVM starts now (not warmed: the retry's own first
            # job starts what it needs, and the warm-up is checked above) and takes far longer than
            # three seconds to listen, in which the sensor ticks: no run is requested while it is away
            engine_back = pool.submit(start_engine, folder, port=port, conf=conf, driver_memory="1g", warm=False)
            time.sleep(3)
            assert sum(r["status"] in ("QUEUED", "STARTED", "STARTING") for r in _runs(web)) == 0
            assert not reachable(url), "the engine listened again within the three seconds: they test nothing"

            # the sensor requests the segment again once the engine is back, and it applies
            engine_back.result()
            _wait(lambda: store.frontier == 6 + bulk - 1, 180, "the sensor's retry to compact the segment")
            _wait(lambda: sum(r["status"] == "SUCCESS" for r in _runs(web)) == 2, 60, "the retry to finish")
            assert store.sql("SELECT count(*) AS n FROM my_table", as_of=store.frontier + 1).to_pylist() == [
                {"n": bulk + 1}]
            assert not store.verify()
    finally:
        if wal is not None:
            wal.close()
        pool.shutdown()  # an engine still starting is up (or failed) before it is stopped
        stop_engine(folder)
