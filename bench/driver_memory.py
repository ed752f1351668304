"""Driver memory against segment size and table size: is the driver's peak RSS flat?

    python -m bench.driver_memory --size quick     # segments of 25k/100k/400k events, tables of 25k/250k rows
    python -m bench.driver_memory --size full      # segments of 100k/400k/1.6M events, tables of 100k/1M rows

The target: driver RSS independent of segment size (no step holds a segment or a table in
driver memory). Every case runs in a fresh Python process (its own Spark session, ``local[2]``)
after its store was prepared by another process, and after a warm-up of the same step on a tiny
store; then the peak-RSS counters (``VmHWM``) of the driver, its JVM and the JVM's Python workers
are reset (``/proc/<pid>/clear_refs``) and the step runs once. Reported per case:

- driver: the driver Python process's own peak (``VmHWM``) during the step, and its RSS before;
- JVM: the Spark JVM's peak (driver and executors: local mode is one JVM);
- executor Python: the largest peak of one Python worker, and the peak of their summed RSS
  (sampled every 50 ms).

Cases:

- ``compact``: one sealed segment of N events (updates 70 %, inserts 25 %, deletes 5 %) compacted
  by ``HistoryStore.compact`` (default engine) into a table holding 100k live rows (snapshots off,
  so the step is the compaction alone);
- ``snapshot``: ``refresh_snapshots`` of a table of N live rows with N versions since its last
  snapshot, in pieces on Spark, without the interval close that follows it (measured apart);
- ``snapshot_in_process``: the same with ``spark=False`` (the piece tasks run in the driver);
- ``close_intervals``: the interval close that a refresh ends with, on Spark tasks over key ranges
  (the driver plans from key statistics and commits);
- ``driver_live_rows``: the previous implementation's read, the table's whole live image read on
  the driver (``catalog.files.live_rows``), for comparison.

The machine this runs on is shared (2 cores, other work running); peaks are not timing figures
and move little with load, but seconds do.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from bench import provenance

RESULTS = Path(__file__).parent / "results"
SIZES = {
    "tiny": {"compact": (2_000, 8_000), "snapshot": (2_000, 8_000), "held": 2_000},  # a smoke run
    "quick": {"compact": (25_000, 100_000, 400_000), "snapshot": (25_000, 250_000), "held": 25_000},
    "full": {"compact": (100_000, 400_000, 1_600_000), "snapshot": (100_000, 1_000_000), "held": 100_000},
}
#: every size's rows of version files are written in files of this many keys (as compaction parts)
FILE_ROWS = 250_000
NO_SNAPSHOTS = 10**15


# --- /proc ---------------------------------------------------------------------------------------

def _status_kb(pid: int, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _reset_peak(pid: int) -> None:
    """Reset a process's VmHWM to its current RSS (Linux ``clear_refs`` 5)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _tree() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
                tree.setdefault(parent, []).append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return tree


def _jvm_and_workers() -> tuple[list[int], list[int]]:
    tree = _tree()
    jvms = [p for p in tree.get(os.getpid(), []) if _comm(p) == "java"]
    workers, todo = [], [c for j in jvms for c in tree.get(j, [])]
    while todo:
        pid = todo.pop()
        workers.append(pid)
        todo += tree.get(pid, [])
    return jvms, workers


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


class PeakSampler:
    """Resets the peaks of this process, its JVM and the JVM's Python workers, then samples the
    workers (they may come and go) until stopped."""

    def __init__(self, every: float = 0.05):
        self.every = every
        self.worker_peak_kb = 0
        self.workers_sum_kb = 0
        self.jvm_peak_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakSampler:
        jvms, workers = _jvm_and_workers()
        for pid in [os.getpid(), *jvms, *workers]:
            _reset_peak(pid)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _sample(self) -> None:
        jvms, workers = _jvm_and_workers()
        self.jvm_peak_kb = max(self.jvm_peak_kb, sum(_status_kb(p, "VmHWM") for p in jvms))
        self.worker_peak_kb = max([self.worker_peak_kb, *(_status_kb(p, "VmHWM") for p in workers)])
        self.workers_sum_kb = max(self.workers_sum_kb, sum(_status_kb(p, "VmRSS") for p in workers))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.every)


# --- stores ----------------------------------------------------------------------------------------

def _settings(**overrides: Any) -> Any:
    from history_pipeline import StoreSettings

    return StoreSettings(spark_master=None, **{"snapshot_min_versions": NO_SNAPSHOTS, **overrides})


def _open(path: Path) -> Any:
    from history_pipeline import HistoryStore

    return HistoryStore.open(path, database="bench", settings=_settings())


def _hold_rounds(store: Any, live_rows: int, rounds: int, snapshot_after_first: bool) -> int:
    """``rounds`` rounds of full-image versions of ``live_rows`` keys, in files of FILE_ROWS keys,
    committed round by round (a snapshot after the first when asked); returns the frontier."""
    from bench.compaction_at_scale import TABLE_UUID, _round_of_versions
    from history_pipeline.catalog.files import write_parquet
    from history_pipeline.catalog.model import AddFile, AdvanceFrontier, FileKind
    from history_pipeline.schema import replay_schema_history
    from history_pipeline.supertable import FileMetadata, new_file_path

    for round_no in range(rounds):
        state = store.catalog_state()
        supercolumns = replay_schema_history(state.schema_history).supercolumns[TABLE_UUID]
        t, entries = state.frontier + 1, []
        for first in range(1, live_rows + 1, FILE_ROWS):
            keys = pa.array(np.arange(first, min(first + FILE_ROWS, live_rows + 1), dtype=np.int64))
            table = _round_of_versions(supercolumns, keys, t, round_no)
            meta = FileMetadata(database=store.database, table_uuid=TABLE_UUID, kind=FileKind.VERSIONS,
                                txn_id=state.txn_id + 1, lower=t, upper=t + len(keys))
            path = new_file_path(store.database, TABLE_UUID, FileKind.VERSIONS, state.txn_id + 1)
            entries.append(write_parquet(store.objects, path, table, meta))
            t += len(keys)
        frontier = t - 1
        store.catalog.commit("bench: held round",
                             lambda current, e=entries, f=frontier: [*(AddFile(x) for x in e), AdvanceFrontier(f)])
        if round_no == 0 and snapshot_after_first:
            store.refresh_snapshots(force=True, spark=False)
    return store.frontier


def _setup_compact(root: Path, held: int, events: int) -> None:
    from bench.compaction_at_scale import Scale, _create_table, write_measured

    store = _open(root)
    _create_table(store)
    frontier = _hold_rounds(store, held, 1, snapshot_after_first=True)
    write_measured(store, Scale(live_rows=held, held_versions=held, segments=1, segment_events=events), frontier + 1)


def _setup_snapshot(root: Path, live_rows: int) -> None:
    from bench.compaction_at_scale import _create_table

    store = _open(root)
    _create_table(store)
    _hold_rounds(store, live_rows, 2, snapshot_after_first=True)  # a snapshot, then N versions since


def setup(case: dict[str, Any]) -> None:
    """Prepare a case's store (and its tiny warm-up twin) in this process."""
    root = Path(case["root"])
    if case["kind"] == "compact":
        _setup_compact(root / "store", case["held"], case["size"])
        _setup_compact(root / "warm", 1_000, 2_000)
    else:
        _setup_snapshot(root / "store", case["size"])
        _setup_snapshot(root / "warm", 2_000)


# --- one measured step per process ---------------------------------------------------------------------

def _step(kind: str, store: Any, spark: Any) -> Callable[[], Any]:
    from history_pipeline.maintenance import snapshots

    if kind == "compact":
        return lambda: store.compact(spark=spark).versions_written
    if kind in ("snapshot", "snapshot_in_process"):
        session = spark if kind == "snapshot" else False

        def refresh() -> int:
            close, snapshots.close_intervals = snapshots.close_intervals, lambda *_, **__: 0
            try:
                return store.refresh_snapshots(force=True, spark=session).rows
            finally:
                snapshots.close_intervals = close
        return refresh
    if kind == "close_intervals":
        return lambda: snapshots.close_intervals(store, spark=spark)
    if kind == "driver_live_rows":
        from bench.compaction_at_scale import TABLE_UUID
        from history_pipeline.catalog.files import live_rows
        from history_pipeline.schema import replay_schema_history

        def read() -> int:
            state = store.catalog_state()
            supercolumns = replay_schema_history(state.schema_history).supercolumns[TABLE_UUID]
            return live_rows(store.objects, state, TABLE_UUID, supercolumns, state.frontier + 1).num_rows
        return read
    raise ValueError(kind)


def _prepare(kind: str, store: Any, spark: Any) -> None:
    """What must have happened before the measured step (unmeasured)."""
    if kind == "close_intervals":
        _step("snapshot", store, spark)()


def measure(case: dict[str, Any]) -> dict[str, Any]:
    """Run a case's step once in this (fresh) process and return its peaks."""
    from history_pipeline.execution import local_spark

    spark = local_spark("local[2]", {"spark.ui.showConsoleProgress": "false"})
    root = Path(case["root"])
    warm, store = _open(root / "warm"), _open(root / "store")
    _prepare(case["step"], warm, spark)
    _step(case["step"], warm, spark)()  # the same step on a tiny store: workers started, code loaded
    _prepare(case["step"], store, spark)
    before_kb = _status_kb(os.getpid(), "VmRSS")
    with PeakSampler() as peaks:
        began = time.perf_counter()
        outcome = _step(case["step"], store, spark)()
        seconds = time.perf_counter() - began
    driver_peak_kb = _status_kb(os.getpid(), "VmHWM")
    spark.stop()
    return {
        "step": case["step"], "size": case["size"], "outcome": outcome, "seconds": round(seconds, 2),
        "driver_rss_before_mb": round(before_kb / 1024), "driver_peak_mb": round(driver_peak_kb / 1024),
        "driver_growth_mb": round((driver_peak_kb - before_kb) / 1024),
        "jvm_peak_mb": round(peaks.jvm_peak_kb / 1024),
        "executor_python_worker_peak_mb": round(peaks.worker_peak_kb / 1024),
        "executor_python_sum_peak_mb": round(peaks.workers_sum_kb / 1024),
    }


def _in_child(mode: str, case: dict[str, Any]) -> dict[str, Any] | None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    done = subprocess.run([sys.executable, "-m", "bench.driver_memory", f"--{mode}", json.dumps(case)],
                          env=env, check=True, stdout=subprocess.PIPE, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if mode == "measure" else None


STEPS = {"compact": ("compact",),
         "snapshot": ("snapshot", "snapshot_in_process", "close_intervals", "driver_live_rows")}


def run(size: str, work: Path, kinds: tuple[str, ...] = ("compact", "snapshot")) -> list[dict[str, Any]]:
    """Every case of ``size`` (of ``kinds``): one setup process per store, one fresh process per
    measured step."""
    results = []
    sizes = SIZES[size]
    for kind in kinds:
        for n in sizes[kind]:
            base = work / f"{kind}-{n}"
            _in_child("setup", {"kind": kind, "size": n, "held": sizes["held"], "root": str(base)})
            for step in STEPS[kind]:
                copy = work / f"{kind}-{n}-{step}"
                shutil.copytree(base, copy)
                result = _in_child("measure", {"step": step, "size": n, "root": str(copy)})
                print(json.dumps(result), flush=True)
                results.append(result)
                shutil.rmtree(copy)
            shutil.rmtree(base)
    return results


def flatness(results: list[dict[str, Any]], step: str) -> dict[str, Any]:
    """The driver's growth during a step (peak minus RSS before) at the smallest and the largest
    size; flat when the largest grows at most 1.5x the smallest's growth plus 32 MiB (allocator
    noise), whatever the size factor (4-16x here)."""
    rows = sorted((r for r in results if r["step"] == step), key=lambda r: r["size"])
    small, large = rows[0], rows[-1]
    return {"step": step, "sizes": [small["size"], large["size"]],
            "driver_peak_mb": [small["driver_peak_mb"], large["driver_peak_mb"]],
            "driver_growth_mb": [small["driver_growth_mb"], large["driver_growth_mb"]],
            "flat": large["driver_growth_mb"] <= 1.5 * small["driver_growth_mb"] + 32}


def report(size: str, results: list[dict[str, Any]]) -> str:
    lines = [f"# Driver memory (`python -m bench.driver_memory --size {size}`)", "",
             "Each step in a fresh process, peaks reset after a warm-up; `local[2]` on a shared 2-core "
             "machine. MiB.", "",
             "| step | size | seconds | driver RSS before | driver peak | driver growth | JVM peak "
             "| executor Python (one worker / sum) |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['step']} | {r['size']:,} | {r['seconds']} | {r['driver_rss_before_mb']} | "
                     f"{r['driver_peak_mb']} | {r['driver_growth_mb']} | {r['jvm_peak_mb']} | "
                     f"{r['executor_python_worker_peak_mb']} / {r['executor_python_sum_peak_mb']} |")
    lines += ["", "| step | sizes | driver peak | driver growth during the step | flat? |",
              "|---|---|---|---|---|"]
    for step in dict.fromkeys(r["step"] for r in results):
        f = flatness(results, step)
        lines.append(f"| {step} | {f['sizes'][0]:,} → {f['sizes'][1]:,} | {f['driver_peak_mb'][0]} → "
                     f"{f['driver_peak_mb'][1]} MiB | {f['driver_growth_mb'][0]} → {f['driver_growth_mb'][1]} MiB "
                     f"| {'yes' if f['flat'] else 'NO'} |")
    lines += ["", "Where a growing step's driver memory goes (docs/decisions/0011-bounded-driver-memory.md):",
              "- compact: the verifying read routes the segment in whole-line pieces and appends, per touched "
              "table, (line, byte range, key) rows to a route file beside the segment that the tasks read "
              "(`compaction/frames.verify_and_route`); the driver keeps counts and key ranges only, never a row;",
              "- snapshot and close_intervals: Spark tasks over key ranges; the driver plans and commits;",
              "- driver_live_rows: the snapshot's previous implementation, for comparison."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="quick")
    parser.add_argument("--report", action="store_true", help="rewrite the .md from the saved .json")
    parser.add_argument("--only", choices=sorted(STEPS), help="only these cases (results printed, not saved)")
    parser.add_argument("--setup", help=argparse.SUPPRESS)
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.setup:
        setup(json.loads(args.setup))
        return 0
    if args.measure:
        print(json.dumps(measure(json.loads(args.measure))), flush=True)
        return 0
    if args.report:
        saved = json.loads((RESULTS / "driver_memory.json").read_text())
        args.size, results = saved["size"], saved["results"]
    else:
        with tempfile.TemporaryDirectory() as tmp:
            results = run(args.size, Path(tmp), (args.only,) if args.only else ("compact", "snapshot"))
    text = report(args.size, results)
    print(text)
    if args.only:
        return 0
    RESULTS.mkdir(exist_ok=True)
    summary = {"size": args.size, "results": results,
               "flatness": [flatness(results, s) for s in dict.fromkeys(r["step"] for r in results)]}
    (RESULTS / "driver_memory.json").write_text(json.dumps(summary, indent=2))
    (RESULTS / "driver_memory.md").write_text(provenance() + "\n\n" + text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
