"""Compaction throughput of the DataFrame path, beside Spark's own JSON -> Parquet in the same run.

    python -m bench.compaction                       # both workloads below
    python -m bench.compaction --workload update-heavy
    python -m bench.compaction --workload multi-table --size quick --extras

Workloads:

- ``update-heavy``: one table of six columns (two BIGINT, DOUBLE PRECISION, two TEXT,
  NUMERIC(12,2)), transactions of ten mutations (25 % inserts, 70 % updates setting 1-3
  columns, 5 % deletes), a close every 20 transactions, 3 sealed segments of 100,000 events;
- ``multi-table``: ``bench.workload``'s tables of mixed types with schema changes of every kind.

Measured, both sides warm (one untimed run first), in one process and one Spark session, on the
same segment files:

- ours: ``HistoryStore.compact`` (everything it does: route, fold, write, commit, and the
  snapshot it takes when one falls due), with the split of its time by phase: the driver's
  (timers around its functions) and, from a second compaction of the same segments with the
  group tasks run in this process, the tasks' own (route rows, prior image, decode, fold, writes);
- Spark's JSON -> Parquet of the same files with the typed schema a user who knows the tables
  gives: ``values`` as a struct of the tables' columns, each of its SQL type (the baseline);
  the same with ``values`` as ``map<string,string>`` as an extra line;
- with ``--extras``: the task engine and Delta Lake MERGE once per segment, same session;
- peak RSS of the driver, the JVM and the executors' Python workers while ours runs.

With ``--runs N`` ours and the typed baseline run as N adjacent pairs, and the pairs' ratios are
given as median and spread, in wall time and in CPU time (this process, the JVM and its Python
workers, which the machine's load does not change).

Target: ours (versions/s) >= 0.5x the typed JSON -> Parquet (events/s), the median of the pairs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench import compaction_phases as phases
from bench.workload import (
    UpdateHeavy,
    Workload,
    events,
    typed_wal_schema,
    update_heavy_events,
    write_update_heavy,
    write_workload,
)
from history_pipeline import HistoryStore, StoreSettings
from history_pipeline.catalog import FileKind
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
#: ``values`` read as text: a user who does not know the tables (an extra line, not the baseline)
MAP_SCHEMA = "op string, t bigint, table_uuid string, key bigint, `values` map<string,string>"
RESULTS = Path(__file__).parent / "results"


def json_to_parquet(spark: Any, paths: list[str], out: Path, schema: Any) -> Timing:
    """One run of Spark's own JSON -> Parquet of ``paths`` as its users run it (an explicit
    ``schema``), its wall and CPU seconds."""
    with Timer() as timer:
        spark.read.schema(schema).json(paths).write.mode("overwrite").parquet(str(out))
    return timer.timing


def spark_json_to_parquet_s(spark: Any, paths: list[str], out: Path, schema: Any) -> float:
    """Spark's own JSON -> Parquet of ``paths`` as its users run it: an explicit ``schema``, the
    session warm (one untimed run first); the best of two timed runs, in seconds."""
    json_to_parquet(spark, paths, out, schema)  # warm-up, untimed
    return min(json_to_parquet(spark, paths, out, schema).wall for _ in range(2))


def tree_cpu_s(root: int | None = None) -> float:
    """CPU seconds (user and system) spent so far by a process (this one by default) and every
    process under it (the JVM, its Python workers), those already ended and reaped included: what
    a piece of work costs whatever share of the cores the machine's load leaves it."""
    tree = _children()
    ticks, todo = 0, [os.getpid() if root is None else root]
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
        todo += tree.get(pid, [])
    return ticks / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Timing:
    """Wall and CPU seconds of one measured run."""

    wall: float
    cpu: float


class Timer:
    """Measures the wall time and the CPU time of this process tree over a ``with`` block."""

    timing = Timing(0.0, 0.0)

    def __enter__(self) -> Timer:
        self._cpu, self._wall = tree_cpu_s(), time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.timing = Timing(time.perf_counter() - self._wall, tree_cpu_s() - self._cpu)


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


@dataclass(frozen=True)
class Case:
    """A workload of the bench: how to write it into a store, and its typed JSON schema."""

    name: str
    write: Callable[[HistoryStore], int]
    typed_schema: Callable[[], Any]


def cases(size: str) -> dict[str, Case]:
    """The bench's workloads (the multi-table one at ``size``)."""
    heavy, multi = UpdateHeavy(), SIZES[size]
    return {
        "update-heavy": Case("update-heavy", lambda store: write_update_heavy(store, heavy),
                             lambda: typed_wal_schema(update_heavy_events(heavy))),
        "multi-table": Case(f"multi-table ({size})", lambda store: write_workload(store, multi),
                            lambda: typed_wal_schema(events(multi))),
    }


def _timed_compact(store: HistoryStore, spark: Any, in_process: bool) -> tuple[Any, Timing, list[Any]]:
    """Compact with the phases timed; (summary, wall and CPU seconds, phase split)."""
    phases.clear()
    phases.instrument(in_process)
    try:
        with Timer() as timer:
            summary = store.compact(spark=spark)
    finally:
        phases.restore()
    return summary, timer.timing, phases.split()


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def bench_case(work: Path, case: Case, spark: Any, extras: bool = False, runs: int = 1) -> dict[str, Any]:
    """Ours (with its phase split) and Spark's JSON -> Parquet, typed and as a map, on one workload.

    Ours and the typed baseline run in ``runs`` adjacent pairs (ours on a fresh copy of the written
    store each time, then the baseline): a load that changes during the bench moves both sides of a
    pair alike, so the pairs' ratios are compared, as medians and spreads, in wall time and in CPU
    time (this process, the JVM and its Python workers)."""
    pristine = work / "pristine"
    written = case.write(HistoryStore.open(pristine, database="bench", settings=FRAMES))
    copies = work / "segments"
    copies.mkdir()
    for ref in HistoryStore.open(pristine, database="bench", settings=FRAMES).segments(SegmentState.SEALED):
        shutil.copy(ref.path, copies / f"{ref.name}.json")
    paths = [str(p) for p in sorted(copies.iterdir())]
    typed = case.typed_schema()
    # warm right before the measurement, as the baseline is: Spark stops a Python worker idle for
    # a minute, and writing the workload takes longer than that
    warm(work / "warm", spark)
    json_to_parquet(spark, paths, work / "typed_out", typed)  # the baseline's warm-up, untimed
    pairs: list[tuple[Timing, Timing]] = []
    split: list[Any] = []
    peak: dict[str, float] = {}
    versions = 0
    for run in range(runs):
        shutil.copytree(pristine, work / f"ours{run}")
        store = HistoryStore.open(work / f"ours{run}", database="bench", settings=FRAMES)
        with RssSampler() as rss:
            summary, ours, run_split = _timed_compact(store, spark, in_process=False)
        if run == 0:
            versions, split, peak = summary.versions_written, run_split, rss.peak
        elif summary.versions_written != versions:
            raise RuntimeError(f"run {run} wrote {summary.versions_written} versions, the first {versions}")
        pairs.append((ours, json_to_parquet(spark, paths, work / "typed_out", typed)))
        if run < runs - 1:  # the last compacted store stays for the extras
            shutil.rmtree(work / f"ours{run}", ignore_errors=True)
    shutil.copytree(pristine, work / "split")
    _, in_process, task_split = _timed_compact(
        HistoryStore.open(work / "split", database="bench", settings=FRAMES), spark, in_process=True)
    map_s = spark_json_to_parquet_s(spark, paths, work / "map_out", MAP_SCHEMA)
    wall_ratios = [(versions / ours.wall) / (written / typed.wall) for ours, typed in pairs]
    cpu_ratios = [(versions / ours.cpu) / (written / typed.cpu) for ours, typed in pairs]
    ours_s = statistics.median(ours.wall for ours, _ in pairs)
    typed_s = statistics.median(typed.wall for _, typed in pairs)
    spark_rate = written / typed_s
    result: dict[str, Any] = {
        "workload": case.name,
        "events": written,
        "segments": len(paths),
        "segment_bytes": sum(os.path.getsize(p) for p in paths),
        "versions": versions,
        "runs": runs,
        "pairs": [{"ours_s": o.wall, "ours_cpu_s": o.cpu, "typed_s": t.wall, "typed_cpu_s": t.cpu}
                  for o, t in pairs],
        "ours_s": ours_s,
        "ours_cpu_s": statistics.median(ours.cpu for ours, _ in pairs),
        "ours_versions_per_s": versions / ours_s,
        "phases": [{"phase": n, "seconds": s, "calls": c} for n, s, c in split],
        "tasks_in_process_s": in_process.wall,
        "task_phases": [{"phase": n, "seconds": s, "calls": c} for n, s, c in task_split],
        "spark_json_typed_s": typed_s,
        "spark_json_typed_cpu_s": statistics.median(typed.cpu for _, typed in pairs),
        "spark_typed_events_per_s": spark_rate,
        "spark_json_map_s": map_s,
        "spark_map_events_per_s": written / map_s,
        "ratio_to_spark_json_typed": statistics.median(wall_ratios),
        "wall_ratio": _spread(wall_ratios),
        "cpu_ratio": _spread(cpu_ratios),
        "ratio_to_spark_json_map": versions / ours_s / (written / map_s),
        "target_ratio": 0.5,
        "meets_target": statistics.median(wall_ratios) >= 0.5,
        "peak_rss": peak,
        "load_average": os.getloadavg(),
    }
    if extras:
        from bench.run import bench_delta_merge

        shutil.copytree(pristine, work / "tasks")
        tasks_store = HistoryStore.open(work / "tasks", database="bench", settings=TASKS)
        began = time.perf_counter()
        tasks_versions = tasks_store.compact(spark=spark).versions_written
        tasks_s = time.perf_counter() - began
        delta = bench_delta_merge(work / "delta", store)
        result["tasks_engine_versions_per_s"] = tasks_versions / tasks_s
        result["delta_versions_per_s"] = versions / delta["seconds"] if delta["seconds"] else None
    return result


def warm(work: Path, spark: Any) -> None:
    """Both engines' code loaded and the session's Python workers started, like the baseline's:
    every step a measured compaction runs, the snapshot it takes when one falls due included."""
    work.mkdir(parents=True, exist_ok=True)
    snapshot_soon = {"snapshot_min_versions": 1_000, "snapshot_ratio": 0.5}
    for name, settings in (("warm_frames", FRAMES), ("warm_tasks", TASKS)):
        store = HistoryStore.open(work / name, database="bench", settings=replace(settings, **snapshot_soon))
        write_workload(store, Workload(tables=2, live_rows=500, versions=3_000, segment_events=1_500))
        store.compact(spark=spark)
        if not any(f.kind is FileKind.SNAPSHOT for f in store.catalog_state().files.values()):
            raise RuntimeError("the warm-up took no snapshot")


def report(r: dict[str, Any]) -> str:
    """One workload's figures, its phase split and the verdict (markdown)."""
    verdict = "MET" if r["meets_target"] else "NOT MET"
    lines = [
        f"### {r['workload']}: {r['versions']:,} versions from {r['events']:,} records in {r['segments']} "
        f"segments ({r['segment_bytes'] / 2**20:.0f} MiB)",
        "",
        "| measure | seconds | rate | ratio |",
        "|---|---:|---:|---:|",
        f"| ours: `compact()` | {r['ours_s']:.2f} | {r['ours_versions_per_s']:,.0f} versions/s | "
        f"**{r['ratio_to_spark_json_typed']:.2f}x** typed (target >= 0.5x: {verdict}) |",
        f"| Spark JSON->Parquet, typed struct schema (baseline) | {r['spark_json_typed_s']:.2f} | "
        f"{r['spark_typed_events_per_s']:,.0f} events/s | 1.00x |",
        f"| Spark JSON->Parquet, `values` as map<string,string> | {r['spark_json_map_s']:.2f} | "
        f"{r['spark_map_events_per_s']:,.0f} events/s | ours {r['ratio_to_spark_json_map']:.2f}x |",
    ]
    if "cpu_ratio" in r:
        wall, cpu = r["wall_ratio"], r["cpu_ratio"]
        lines += ["", f"{r['runs']} adjacent pairs (ours, then the typed baseline), load average "
                  f"{r['load_average'][0]:.1f} at the end: ratio in wall time median {wall['median']:.2f}x "
                  f"({wall['min']:.2f}-{wall['max']:.2f}x); in CPU time (this process, the JVM and its Python "
                  f"workers: ours {r['ours_cpu_s']:.2f} s, baseline {r['spark_json_typed_cpu_s']:.2f} s, medians) "
                  f"median {cpu['median']:.2f}x ({cpu['min']:.2f}-{cpu['max']:.2f}x)."]
    if "tasks_engine_versions_per_s" in r:
        lines.append(f"| task engine | | {r['tasks_engine_versions_per_s']:,.0f} versions/s | |")
        lines.append(f"| Delta MERGE per segment | | {(r['delta_versions_per_s'] or 0):,.0f} versions/s | |")
    lines += ["", "Where `compact()`'s time goes (wall seconds summed over calls: the driver routes two segments "
              "at once; nested phases are inside their callers):", "",
              "| phase | seconds | calls |", "|---|---:|---:|"]
    lines += [f"| {p['phase'].strip()} | {p['seconds']:.3f} | {p['calls']} |" for p in r["phases"]]
    lines += ["", f"The group tasks' own phases, from a second compaction of the same segments with the tasks "
              f"in this process ({r['tasks_in_process_s']:.2f} s in all):", "",
              "| phase | seconds | calls |", "|---|---:|---:|"]
    lines += [f"| {p['phase'].strip()} | {p['seconds']:.3f} | {p['calls']} |" for p in r["task_phases"]
              if p["phase"].startswith(" ") or "task" in p["phase"] or "group" in p["phase"]]
    lines.append("")
    lines.append("Peak RSS MiB: driver python {driver_python_mb:.0f}, JVM (driver+executors) {jvm_mb:.0f}, "
                 "executor python workers {executor_python_mb:.0f}".format(**r["peak_rss"]))
    return "\n".join(lines)


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True, cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_results(stamp: dict[str, Any], results: list[dict[str, Any]]) -> None:
    """``bench/results/compaction.json`` and ``.md``: the figures with their date, commit and command."""
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "compaction.json").write_text(json.dumps({**stamp, "results": results}, indent=2))
    header = [f"## Compaction throughput ({stamp['date']}, commit {stamp['commit']})", "",
              f"`{stamp['command']}`: local[2], both sides warm, in one process and Spark session, on the same "
              "segment files. " + stamp["note"], ""]
    (RESULTS / "compaction.md").write_text("\n".join(header + [report(r) + "\n" for r in results]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("update-heavy", "multi-table", "both"), default="both")
    parser.add_argument("--size", choices=sorted(SIZES), default="quick", help="of the multi-table workload")
    parser.add_argument("--quick", action="store_true", help="(as --size quick)")
    parser.add_argument("--extras", action="store_true", help="also the task engine and Delta MERGE")
    parser.add_argument("--note", default="", help="what else ran on the machine")
    parser.add_argument("--runs", type=int, default=1,
                        help="adjacent (ours, baseline) pairs per workload: medians and spreads of their ratios")
    args = parser.parse_args(argv)
    from history_pipeline.execution import local_spark

    spark = local_spark("local[2]", {"spark.ui.showConsoleProgress": "false"})
    chosen = ["update-heavy", "multi-table"] if args.workload == "both" else [args.workload]
    results = []
    with tempfile.TemporaryDirectory(prefix="hp-bench-compaction-") as tmp:
        for name in chosen:
            work = Path(tmp) / name
            work.mkdir()
            result = bench_case(work, cases(args.size)[name], spark, args.extras, args.runs)
            print(report(result), flush=True)
            results.append(result)
    spark.stop()
    command = f"python -m bench.compaction --workload {args.workload} --size {args.size} --runs {args.runs}"
    stamp = {"date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"), "commit": _commit(),
             "command": command + (" --extras" if args.extras else ""), "note": args.note}
    write_results(stamp, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
