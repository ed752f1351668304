"""Run one compaction scenario on a given Spark (a cluster master or a Connect URL) in its own
process, and print every answer at every T as JSON.

Used by ``test_spark_deployments.py``: a Spark Connect client and the test run's classic session
must not share one process, and a cluster needs its own driver settings.

    python -m history_pipeline_tests.spark_scenario SPEC_JSON
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from history_pipeline import HistoryStore, StoreSettings
from history_pipeline.io.store import S3Options
from history_pipeline_tests.test_compaction import write


def answers(store: HistoryStore, start: int = 0, at: Iterable[int] | None = None) -> dict[str, Any]:
    """Every table's rows at every answerable T from ``start`` on, or at the T's of ``at`` (values as
    text, so any type compares)."""
    out: dict[str, Any] = {"frontier": store.frontier}
    for as_of in range(start, store.frontier + 2) if at is None else at:
        tables = {}
        for descriptor in store.get_catalog(as_of):
            rows = store.load_table(descriptor.table_uuid, as_of).to_pylist()
            tables[descriptor.table_name] = sorted(
                [{k: repr(v) for k, v in row.items()} for row in rows], key=lambda r: r["synthetic_key"]
            )
        out[str(as_of)] = tables
    return out


def write_segments(store: HistoryStore, batches: list[list[dict[str, Any]]]) -> None:
    """Each batch becomes one sealed segment (closed at its last t)."""
    write(store, *batches)


def open_store(spec: dict[str, Any], shared: bool) -> HistoryStore:
    s3 = S3Options(**spec["s3"]) if spec.get("s3") else None
    settings = StoreSettings(spark_master=None, shared_paths=shared, compaction_engine="dataframes")
    return HistoryStore.open(spec["root"], database=spec["database"], wal_dir=spec["wal_dir"], s3=s3,
                             settings=settings)


def session(spec: dict[str, Any]) -> Any:
    from pyspark.sql import SparkSession

    if spec.get("remote"):
        return SparkSession.builder.remote(spec["remote"]).getOrCreate()
    builder = (
        SparkSession.builder.master(spec["master"])
        .appName("history_pipeline_scenario")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.executor.memory", "512m")
        .config("spark.cores.max", "2")
        .config("spark.executorEnv.PYTHONPATH", os.environ.get("PYTHONPATH", ""))
        # a cluster's executors compile as the test run's drivers do (conftest's QUICK_JIT)
        .config("spark.executor.extraJavaOptions", os.environ.get("SPARK_SUBMIT_OPTS", ""))
    )
    return builder.getOrCreate()


def main(job: dict[str, Any]) -> list[dict[str, Any]]:
    """One session (``job["session"]``) runs every scenario of ``job["runs"]`` in turn."""
    spark = session(job["session"])
    try:
        return [run(spark, spec) for spec in job["runs"]]
    finally:
        spark.stop()


def maintain(store: HistoryStore, spark: Any, purge_before: int) -> dict[str, Any]:
    """Merge every small file, then purge history below ``purge_before``, both on ``spark``;
    what they did and every answer left."""
    merged = store.merge(spark=spark, small_file_bytes=10**9)
    retained = store.retain(purge_before=purge_before, spark=spark)
    return {
        "merge_files_removed": merged.files_removed,
        "merge_files_added": merged.files_added,
        "retention_versions_removed": retained.versions_removed,
        "answers": answers(store, purge_before),
    }


def run(spark: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """Write the segments, compact them on ``spark`` (``False``: in this process), read every answer
    back; then, as the spec says, snapshot every table in pieces of ``snapshot_piece_rows`` rows and
    read every answer again, and merge and purge below ``purge_before`` and read the answers left.
    With ``expect_refusal`` the compaction is first tried on a store that does not declare its paths
    shared, and the refusal is the result (with ``refusal_only``, the whole result)."""
    result: dict[str, Any] = {}
    store = open_store(spec, shared=False)
    write_segments(store, spec["batches"])
    if spec.get("expect_refusal"):
        try:
            store.compact(spark=spark)
            result["refused"] = None
        except Exception as exc:  # noqa: BLE001 - the test checks the type and message
            result["refused"] = f"{type(exc).__name__}: {exc}"
        if spec.get("refusal_only"):
            return result
    store = open_store(spec, shared=spec.get("shared", False))
    summary = store.compact(spark=spark)
    result["segments_applied"] = summary.segments_applied
    result["answers"] = answers(store)
    if spec.get("snapshot_piece_rows"):
        # every table snapshotted now, in pieces of a few rows, by tasks on this Spark session
        pieced = HistoryStore.open(spec["root"], database=spec["database"], wal_dir=spec["wal_dir"],
                                   s3=store.s3, settings=replace(store.settings,
                                                                 snapshot_piece_rows=spec["snapshot_piece_rows"]))
        written = pieced.refresh_snapshots(force=True, spark=spark)
        state = pieced.catalog_state()
        result["snapshot_pieces"] = {t: sum(f.snapshot_as_of == written.as_of for f in state.files_of(t))
                                     for t in written.tables}
        result["answers_after_snapshot"] = answers(pieced)
    if spec.get("purge_before") is not None:
        result["maintenance"] = maintain(store, spark, spec["purge_before"])
    return result


if __name__ == "__main__":
    job = json.loads(Path(sys.argv[1]).read_text())
    print("RESULT " + json.dumps(main(job)))
