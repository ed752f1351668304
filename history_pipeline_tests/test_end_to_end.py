"""End to end through the real Dagster daemon: `dagster dev` (webserver + daemon) on 127.0.0.1 with a
temporary DAGSTER_HOME; a sealed segment becomes queryable through the sensor's run, and the
materializations are visible through the webserver's GraphQL API. The runs compact in their own
process (``HISTORY_PIPELINE_SPARK=in-process``): what is tested here is the daemon's path, the
sensor, the queue, the runs and what the UI shows; test_engine.py runs the same path on a
long-lived Spark Connect engine, and the classic local session is tested without the daemon."""

import json
import time
import urllib.request

import pytest

from history_pipeline import HistoryStore
from history_pipeline.orchestration.launcher import PID_TAG
from history_pipeline.orchestration.resources import ENGINE_ENV, IN_PROCESS
from history_pipeline.wal import SegmentState
from history_pipeline_tests.dagster_support import running_dagster_dev
from history_pipeline_tests.test_compaction import example_events, write


def _get(url, data=None, timeout=5):
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read()


def _wait(predicate, timeout, what, every: float = 1.0):
    """Poll ``predicate`` every ``every`` seconds (an error counts as not yet) until it holds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if predicate():
                return
        except Exception:  # noqa: BLE001 - a server still starting answers with errors
            pass
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture
def dagster_dev(tmp_path):
    with running_dagster_dev(tmp_path, {ENGINE_ENV: IN_PROCESS}) as port:
        yield tmp_path, port


QUERY = """
{ assetOrError(assetKey: {path: ["compacted_batches"]}) {
    ... on Asset { assetMaterializations(limit: 10) {
        partition
        metadataEntries { label ... on IntMetadataEntry { intValue } }
    } } } }
"""


RUN_TAGS = "{ runsOrError { ... on Runs { results { tags { key value } } } } }"


@pytest.mark.daemon
def test_sealed_segment_becomes_queryable_through_the_daemon(dagster_dev):
    workdir, port = dagster_dev
    store = HistoryStore.open(workdir / "data", database="tenant_e2e")
    started = time.time()
    write(store, example_events())
    _wait(lambda: store.frontier == 5, 240, "the sensor's run to compact the segment")
    seal_to_queryable = time.time() - started
    assert store.load_table("my_table", 6).to_pylist() == [{"synthetic_key": 2, "column1": "value2_prime"}]

    def materialized():
        answer = json.loads(_get(f"http://127.0.0.1:{port}/graphql", json.dumps({"query": QUERY}).encode()))
        return answer["data"]["assetOrError"]["assetMaterializations"]

    _wait(lambda: materialized(), 60, "the materialization event")
    event = materialized()[0]
    assert event["partition"] == "tenant_e2e.00000000000000000001"
    entries = {e["label"]: e.get("intValue") for e in event["metadataEntries"]}
    assert entries["frontier"] == 5 and entries["versions_written"] == 4
    print(f"seal to queryable through the daemon: {seal_to_queryable:.1f}s")
    # the run was launched warm (dagster.yaml's WarmRunLauncher): a fork whose pid the run names
    runs = json.loads(_get(f"http://127.0.0.1:{port}/graphql", json.dumps({"query": RUN_TAGS}).encode()))
    tags = [{t["key"]: t["value"] for t in r["tags"]} for r in runs["data"]["runsOrError"]["results"]]
    assert tags and all(t.get(PID_TAG, "").isdigit() for t in tags)

    # a segment the daemon quarantines, repaired by an operator, then applied by the daemon
    write(store, [{"op": "delete", "t": 9, "table_uuid": "tbl-example", "key": 99},
                  {"op": "insert", "t": 9, "table_uuid": "tbl-example", "key": 3, "values": {"col1": "three"}}])
    _wait(lambda: store.segments(SegmentState.QUARANTINED), 300, "the daemon to quarantine the bad segment")
    quarantined = store.segments(SegmentState.QUARANTINED)[0]
    fixed = workdir / "fixed.jsonl"
    fixed.write_text("".join(line for line in quarantined.path.read_text().splitlines(keepends=True)
                             if '"key":99' not in line))
    store.repair_segment(quarantined.segment_id, fixed, reason="no such key")
    _wait(lambda: store.frontier == 9, 300, "the daemon to apply the repaired segment")
    assert store.fetch_row("my_table", 3, 10) == {"column1": "three"}
    _wait(lambda: any(e["partition"] == "tenant_e2e.00000000000000000002" for e in materialized()), 60,
          "the repaired partition's materialization")
