"""Compaction throughput of the DataFrame path, beside its baselines in the same run and session.

    python -m bench.compaction --quick

- ours: ``HistoryStore.compact`` (Spark DataFrame path) of a workload's sealed segments;
- the task engine (per-event folds in ``rdd.map`` tasks) on the same segments, same session;
- Spark's own JSON -> Parquet of the same segment files, warm (run once untimed first), with an
  explicit schema, in the same session;
- Delta Lake MERGE of the same changes, once per segment and table;
- peak RSS of the driver (this Python process), the JVM (driver and executors in local mode) and
  the executors' Python workers, sampled from /proc while compaction runs.

Target: ours >= 0.5x Spark's warm JSON -> Parquet.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.workload import Workload, write_workload
from history_pipeline import HistoryStore, StoreSettings
from history_pipeline.wal import SegmentState

#: the DataFrame compaction engine, on the session given to compact()
FRAMES = StoreSettings(spark_master=None, compaction_engine="dataframes")
#: the task engine (per-event folds in Spark tasks), on the same session
TASKS = StoreSettings(spark_master=None, compaction_engine="tasks")


SIZES = {
    "small": Workload(tables=2, live_rows=10_000, versions=100_000, segment_events=50_000),
    "quick": Workload(tables=2, live_rows=20_000, versions=200_000, segment_events=50_000),
    "full": Workload(tables=2, live_rows=250_000, versions=2_000_000, segment_events=100_000),
}
WAL_SCHEMA = "op string, t bigint, table_uuid string, key bigint, `values` map<string,string>"


def spark_json_to_parquet_s(spark: Any, paths: list[str], out: Path) -> float:
    """Spark's own JSON -> Parquet of ``paths`` as its users run it: an explicit schema, the session
    warm (one untimed run first); the best of two timed runs, in seconds."""

    def once() -> float:
        began = time.perf_counter()
        spark.read.schema(WAL_SCHEMA).json(paths).write.mode("overwrite").parquet(str(out))
        return time.perf_counter() - began

    once()  # warm-up, untimed
    return min(once() for _ in range(2))


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            tree.setdefault(int(fields[1]), []).append(int(entry))
        except (OSError, IndexError):
            continue
    return tree


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


class RssSampler:
    """Peak RSS of this process, its JVM children and the JVM's Python workers."""

    def __init__(self, every: float = 0.1):
        self.every = every
        self.peak = {"driver_python_mb": 0.0, "jvm_mb": 0.0, "executor_python_mb": 0.0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        me = os.getpid()
        while not self._stop.is_set():
            tree = _children()
            jvms = [p for p in tree.get(me, []) if _name(p) == "java"]
            workers: list[int] = []
            todo = [c for j in jvms for c in tree.get(j, [])]
            while todo:
                pid = todo.pop()
                workers.append(pid)
                todo += tree.get(pid, [])
            sample = {
                "driver_python_mb": _rss_mb(me),
                "jvm_mb": sum(_rss_mb(p) for p in jvms),
                "executor_python_mb": sum(_rss_mb(p) for p in workers),
            }
            for key, value in sample.items():
                self.peak[key] = max(self.peak[key], value)
            self._stop.wait(self.every)


def bench_compaction_frames(work: Path, w: Workload, spark: Any) -> dict[str, Any]:
    """Ours, Spark JSON -> Parquet (warm, explicit schema) and Delta MERGE on the same segments."""
    from bench.run import bench_delta_merge

    for name, settings in (("warm_frames", FRAMES), ("warm_tasks", TASKS)):  # both engines warm, like the baseline
        warm = HistoryStore.open(work / name, database="bench", settings=settings)
        write_workload(warm, Workload(tables=2, live_rows=500, versions=3_000, segment_events=1_500))
        warm.compact(spark=spark)
    store = HistoryStore.open(work / "frames", database="bench", settings=FRAMES)
    events = write_workload(store, w)
    copies = work / "frame_segments"
    copies.mkdir()
    for ref in store.segments(SegmentState.SEALED):
        shutil.copy(ref.path, copies / f"{ref.name}.json")
    with RssSampler() as rss:
        start = time.perf_counter()
        summary = store.compact(spark=spark)
        ours_s = time.perf_counter() - start
    versions = summary.versions_written
    paths = [str(p) for p in sorted(copies.iterdir())]
    tasks_store = HistoryStore.open(work / "tasks", database="bench", settings=TASKS)
    write_workload(tasks_store, w)
    start = time.perf_counter()
    tasks_versions = tasks_store.compact(spark=spark).versions_written
    tasks_s = time.perf_counter() - start

    spark_s = spark_json_to_parquet_s(spark, paths, work / "spark_json_out")
    delta = bench_delta_merge(work / "frames_delta", store)
    ours_rate = versions / ours_s
    spark_rate = events / spark_s
    ratio = ours_rate / spark_rate
    return {
        "events": events,
        "segments": len(paths),
        "versions": versions,
        "ours_s": ours_s,
        "ours_versions_per_s": ours_rate,
        "tasks_engine_s": tasks_s,
        "tasks_engine_versions_per_s": tasks_versions / tasks_s,
        "ratio_to_tasks_engine": ours_rate / (tasks_versions / tasks_s),
        "spark_json_to_parquet_warm_s": spark_s,
        "spark_events_per_s": spark_rate,
        "ratio_to_spark_json": ratio,
        "target_ratio_to_spark_json": 0.5,
        "meets_spark_target": ratio >= 0.5,
        "delta_merge_s": delta["seconds"],
        "delta_versions_per_s": versions / delta["seconds"] if delta["seconds"] else None,
        "ratio_to_delta_merge": (versions / ours_s) / (versions / delta["seconds"]) if delta["seconds"] else None,
        "peak_rss": rss.peak,
    }


def report(r: dict[str, Any]) -> str:
    """A short table of the figures and the verdict."""
    verdict = "MET" if r["meets_spark_target"] else "NOT MET"
    return "\n".join([
        f"compaction (DataFrame path): {r['versions']:,} versions from {r['events']:,} events "
        f"in {r['segments']} segments",
        f"  ours                          {r['ours_s']:8.2f} s  {r['ours_versions_per_s']:>10,.0f} versions/s",
        f"  task engine (same session)    {r['tasks_engine_s']:8.2f} s  "
        f"{r['tasks_engine_versions_per_s']:>10,.0f} versions/s  (ours {r['ratio_to_tasks_engine']:.2f}x)",
        f"  Spark JSON->Parquet (warm)    {r['spark_json_to_parquet_warm_s']:8.2f} s  "
        f"{r['spark_events_per_s']:>10,.0f} events/s",
        f"  Delta MERGE per segment       {r['delta_merge_s']:8.2f} s  "
        f"{(r['delta_versions_per_s'] or 0):>10,.0f} versions/s",
        f"  ratio to Spark JSON->Parquet  {r['ratio_to_spark_json']:.2f}x (target >= 0.5x: {verdict})",
        f"  ratio to Delta MERGE          {(r['ratio_to_delta_merge'] or 0):.2f}x",
        "  peak RSS MiB: driver python {driver_python_mb:.0f}, JVM (driver+executors) {jvm_mb:.0f}, "
        "executor python workers {executor_python_mb:.0f}".format(**r["peak_rss"]),
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes")
    parser.add_argument("--small", action="store_true", help="smaller still (100k versions), for a shared machine")
    args = parser.parse_args(argv)
    from history_pipeline.execution import local_spark

    spark = local_spark("local[2]", {"spark.ui.showConsoleProgress": "false"})
    with tempfile.TemporaryDirectory() as tmp:
        size = "small" if args.small else "quick" if args.quick else "full"
        result = bench_compaction_frames(Path(tmp), SIZES[size], spark)
    spark.stop()
    print(report(result))
    out = Path(__file__).parent / "results" / "compaction_frames.json"
    out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
