"""Where compaction's time goes: driver phases, the Spark job, and the fold tasks' own phases.

    python -m bench.compaction_phases --workload quick                 # bench.compaction's 200k versions
    python -m bench.compaction_phases --scale full --keep /tmp/held    # a table holding 40M versions

The held store of ``--scale`` is written once into ``--keep`` (reused by later runs: writing 40M
versions takes minutes) and copied for every measured run. Each run prints the wall seconds of
the driver's phases (verify and route, plan, the group's Spark job, commits, the snapshot refresh
``compact()`` ends with); ``--in-process`` runs the group tasks in this process instead of in
Spark and adds their phases (route rows, prior image, decode, fold, writes: inclusive, nested
phases are inside their callers). Timers wrap the functions; nothing is changed in what they do.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from bench.workload import UpdateHeavy, write_update_heavy, write_workload
from history_pipeline import HistoryStore, StoreSettings
from history_pipeline.compaction import compactor, frames

SPENT: dict[str, float] = defaultdict(float)
CALLS: dict[str, int] = defaultdict(int)


def _timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SPENT[name] += time.perf_counter() - began
            CALLS[name] += 1

    return wrapper


def _timed_iter(name: str, fn: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
    def wrapper(*args: Any, **kwargs: Any) -> Iterator[Any]:
        it = iter(fn(*args, **kwargs))
        CALLS[name] += 1
        while True:
            began = time.perf_counter()
            try:
                item = next(it)
            except StopIteration:
                SPENT[name] += time.perf_counter() - began
                return
            SPENT[name] += time.perf_counter() - began
            yield item

    return wrapper


def _in_process_run_group(spark: Any, members: Any, files_per_table: Any) -> list[Any]:
    tasks = frames.group_tasks(members, files_per_table)
    shared = [(str(m.plan.segment.ref.path.absolute()), m.plan.segment.ref.name, m.ctx) for m in members]
    rows = []
    for task in tasks:
        began = time.process_time()
        rows += [pa.RecordBatch.from_pylist([r], schema=frames.GROUP_OUT_SCHEMA).to_pylist()[0]
                 for r in frames._run_group_task(task, shared)]
        spent = time.process_time() - began
        SPENT["task CPU (process time)"] += spent
        CALLS["task CPU (process time)"] += 1
    return [frames._outcome(m.plan, [r for r in rows if r["segment_id"] == m.ctx.segment_id], m.ctx.segment_id)
            for m in members]


_ORIGINALS: list[tuple[Any, str, Any]] = []


def _wrap(owner: Any, name: str, wrapper: Callable[..., Any]) -> None:
    _ORIGINALS.append((owner, name, getattr(owner, name)))
    setattr(owner, name, wrapper)


def restore() -> None:
    """Undo ``instrument``: the functions as they were."""
    while _ORIGINALS:
        owner, name, fn = _ORIGINALS.pop()
        setattr(owner, name, fn)


def instrument(in_process: bool) -> None:
    """Wrap the phases' functions with timers (module attributes, as the callers look them up)."""
    from history_pipeline.maintenance import snapshots

    _wrap(frames, "verify_and_route", _timed("driver: verify and route", frames.verify_and_route))
    _wrap(frames, "plan_frames", _timed("driver: plan", frames.plan_frames))
    _wrap(compactor, "_commit", _timed("driver: commit", compactor._commit))
    _wrap(frames, "sweep_routes", _timed("driver: sweep routes", frames.sweep_routes))
    _wrap(HistoryStore, "refresh_snapshots",
          _timed("snapshot refresh after compact (all)", HistoryStore.refresh_snapshots))
    _wrap(snapshots, "write_snapshots", _timed("  snapshot: written whole in pieces", snapshots.write_snapshots))
    _wrap(snapshots, "_snapshot_by_closing",
          _timed("  snapshot: written by closing its interval", snapshots._snapshot_by_closing))
    _wrap(snapshots, "close_intervals", _timed("  snapshot: close other intervals", snapshots.close_intervals))
    if in_process:
        _wrap(frames, "run_group", _timed("group tasks in process (wall)", _in_process_run_group))
        _wrap(frames.RouteTable, "load", _timed("  task: read route file", frames.RouteTable.load))
        _wrap(frames.GroupTask, "rows", _timed("  task: its rows of a step (route read incl.)", frames.GroupTask.rows))
        _wrap(frames, "_prior_batches", _timed_iter("  task: prior image read", frames._prior_batches))
        _wrap(frames, "_newest", _timed("  task: newest per key", frames._newest))
        _wrap(frames, "_carried_prior", _timed("  task: carried prior", frames._carried_prior))
        _wrap(frames, "_read_lines", _timed_iter("  task: read own lines", frames._read_lines))
        decoder = frames._decoder
        _wrap(frames, "_decoder", lambda *a, **k: _timed_iter("  task: decode (own lines incl.)", decoder(*a, **k)))
        _wrap(frames, "fold", _timed("  task: fold", frames.fold))
        from history_pipeline.compaction import vector_decode as vd

        _wrap(frames, "decode_canonical", _timed("    decode: canonical (all)", frames.decode_canonical))
        _wrap(vd, "_envelopes", _timed("      decode: envelopes", vd._envelopes))
        _wrap(vd, "_find_all", _timed("      decode: find values", vd._find_all))
        _wrap(vd, "_decode_epoch", _timed("      decode: epoch (typed values incl.)", vd._decode_epoch))
        _wrap(vd, "decode_tokens", _timed("        decode: typed values", vd.decode_tokens))
        _wrap(frames, "_reference_batch", _timed("    decode: reference rows", frames._reference_batch))
        _wrap(frames, "_write_part", _timed("  task: write files", frames._write_part))
    else:
        _wrap(frames, "run_group", _timed("group Spark job (wall)", frames.run_group))


def split() -> list[tuple[str, float, int]]:
    """The phases timed since the last ``clear``: (name, seconds, calls)."""
    return [(name, seconds, CALLS[name]) for name, seconds in SPENT.items()]


def clear() -> None:
    """Forget the phases timed so far."""
    SPENT.clear()
    CALLS.clear()


def spark_tasks(spark: Any) -> str:
    """The newest Spark job's stages and tasks from the UI's REST API: when each task ran and
    for how long, against the stage's span."""
    import json
    import urllib.request

    base = spark.sparkContext.uiWebUrl + "/api/v1/applications/" + spark.sparkContext.applicationId

    def get(path: str) -> Any:
        with urllib.request.urlopen(base + path) as r:
            return json.load(r)

    job = get("/jobs")[0]
    out = [f"  Spark job {job['jobId']}: {job.get('submissionTime')} -> {job.get('completionTime')}"]
    for stage_id in job["stageIds"]:
        for stage in get(f"/stages/{stage_id}?details=true"):
            out.append(f"    stage {stage_id}: submitted {stage.get('submissionTime')}, "
                       f"done {stage.get('completionTime')}, "
                       f"run time {stage['executorRunTime'] / 1000:.2f} s in {stage['numCompleteTasks']} tasks")
            for task in sorted(stage["tasks"].values(), key=lambda t: t["launchTime"]):
                m = task["taskMetrics"]
                out.append(f"      task {task['index']}: launched {task['launchTime'][11:23]}, "
                           f"{task['duration'] / 1000:.2f} s, run {m['executorRunTime'] / 1000:.2f} s, "
                           f"deserialize {m['executorDeserializeTime'] / 1000:.2f} s, "
                           f"result {m['resultSerializationTime'] / 1000:.2f} s")
    return "\n".join(out)


def held_store(scale_name: str, keep: Path) -> Path:
    """The held store of ``bench.compaction_at_scale``'s size, written once into ``keep``."""
    from bench.compaction_at_scale import SIZES, _create_table, hold_history, write_measured

    base = keep / f"held_{scale_name}"
    if not (base / ".done").exists():
        shutil.rmtree(base, ignore_errors=True)
        store = HistoryStore.open(base, database="bench", settings=StoreSettings(spark_master=None))
        _create_table(store)
        write_measured(store, SIZES[scale_name], hold_history(store, SIZES[scale_name]) + 1)
        (base / ".done").touch()
    return base


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", choices=("small", "quick", "full"), help="a held table (compaction_at_scale)")
    parser.add_argument("--workload", choices=("small", "quick", "full", "update-heavy"),
                        help="bench.compaction's workload")
    parser.add_argument("--keep", type=Path, default=Path(tempfile.gettempdir()) / "hp-bench-phases")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--in-process", action="store_true", help="run the group tasks in this process")
    args = parser.parse_args()
    from history_pipeline.execution import local_spark

    ui = {} if args.in_process else {"spark.ui.enabled": "true", "spark.ui.port": "0"}
    spark = local_spark("local[2]", {"spark.ui.showConsoleProgress": "false", **ui})
    args.keep.mkdir(parents=True, exist_ok=True)
    settings = StoreSettings(spark_master=None, compaction_engine="dataframes")
    warm = HistoryStore.open(Path(tempfile.mkdtemp(dir=args.keep)), database="bench", settings=settings)
    from bench.compaction import SIZES as WORKLOADS
    from bench.workload import Workload

    write_workload(warm, Workload(tables=2, live_rows=500, versions=3_000, segment_events=1_500))
    warm.compact(spark=spark)
    instrument(args.in_process)
    held = held_store(args.scale, args.keep) if args.scale else None
    for run in range(args.runs):
        work = Path(tempfile.mkdtemp(dir=args.keep))
        if held is not None:
            shutil.copytree(held, work / "store")
            store = HistoryStore.open(work / "store", database="bench", settings=settings)
        else:
            store = HistoryStore.open(work / "store", database="bench", settings=settings)
            if args.workload == "update-heavy":
                write_update_heavy(store, UpdateHeavy())
            else:
                write_workload(store, WORKLOADS[args.workload or "quick"])
        SPENT.clear()
        CALLS.clear()
        began = time.perf_counter()
        summary = store.compact(spark=spark)
        wall = time.perf_counter() - began
        print(f"run {run}: {summary.versions_written:,} versions in {wall:.2f} s "
              f"({summary.versions_written / wall:,.0f} versions/s)")
        for name, seconds in SPENT.items():
            print(f"  {name:48s} {seconds:7.3f} s  ({CALLS[name]} calls)")
        if not args.in_process:
            print(spark_tasks(spark))
        shutil.rmtree(work, ignore_errors=True)
    spark.stop()


if __name__ == "__main__":
    main()
