"""Sensor tick time against the number of databases (tenants) and the length of their history.

    python -m bench.tenants             # 10, 100 and 1,000 databases, and the history sweep
    python -m bench.tenants --quick     # 10 and 100 databases, a shorter sweep

Every database gets ``applied`` applied segments (its history), ``sealed`` new sealed segments
and one open segment, written as plain files: the sensor reads no segment, it lists folders. Its
WAL folders are then dated a minute back, as a WAL that last changed a while ago. Measured on
``finished_wal_segments_sensor`` itself, through ``build_sensor_context`` on a real (ephemeral)
Dagster instance:

- first tick: no cursor, every new sealed segment registered and requested (a full scan);
- steady tick: nothing new, the change journal read (median and fastest of 31; the fastest is
  the least disturbed by other work on a shared machine), and the Python function calls it makes
  (counted by ``cProfile``: a measure of the work that no other process can disturb);
- one new segment: one database sealed one more segment and left its journal marker, as the
  writer does (median of 11, a different database each);
- periodic full scan: a steady tick that scans every WAL instead of the journal, as the sensor
  does once every ``FULL_SCAN_EVERY`` ticks (median of 5), and the tick averaged over that cycle;
- for reference, what a sensor without a cursor has to do to tell what is new: list every
  segment of every database, applied ones included, and stat each (the previous sensor did
  that, and also opened each database's store and read every partition key of the instance).

A sweep at a fixed number of databases varies the history (applied segments per database) to
show that the steady tick does not grow with it either. Prints a table and writes
``bench/results/tenants.json`` and ``tenants.md``.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import logging
import os
import platform
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import write_results

SIZES = {
    "quick": {"databases": [10, 100], "applied": 200, "sealed": 3, "sweep_databases": 100,
              "sweep_applied": [10, 100, 1_000]},
    "full": {"databases": [10, 100, 1_000], "applied": 200, "sealed": 3, "sweep_databases": 100,
             "sweep_applied": [10, 100, 1_000, 5_000]},
}

AGE_S = 60  # how long ago the WAL folders last changed


def segment_file(segment_id: int, suffix: str = ".sealed") -> str:
    """A segment's file name (``<20-digit id><suffix>``)."""
    from history_pipeline.wal.segments import segment_name

    return segment_name(segment_id) + suffix


def fake_wal(wal_dir: Path, applied: int, sealed: int, age_s: float = AGE_S) -> int:
    """A WAL of plain files: ``applied`` applied segments, then ``sealed`` sealed ones and an open
    one, its folders dated ``age_s`` seconds back. Returns the next free segment id."""
    for folder in ("segments", "applied"):
        (wal_dir / folder).mkdir(parents=True, exist_ok=True)
    for i in range(1, applied + 1):
        (wal_dir / "applied" / segment_file(i)).write_bytes(b"")
    for i in range(applied + 1, applied + sealed + 1):
        (wal_dir / "segments" / segment_file(i)).write_bytes(b"")
    open_id = applied + sealed + 1
    (wal_dir / "segments" / segment_file(open_id, ".open")).write_bytes(b"")
    age(wal_dir, age_s)
    return open_id


def age(wal_dir: Path, age_s: float = AGE_S) -> None:
    """Date a WAL's folders ``age_s`` seconds back (as if it last changed then)."""
    when = time.time() - age_s
    for folder in (wal_dir, wal_dir / "segments", wal_dir / "applied", wal_dir / "quarantine"):
        if folder.exists():
            os.utime(folder, (when, when))


def seal_next(wal_dir: Path, journal: bool = True) -> int:
    """Seal the open segment (rename) and open the next, as the writer does, and leave a marker in
    the change journal as the writer does (unless ``journal`` is False: a tool that does not
    journal, such as a hand copy). Returns the sealed id."""
    from history_pipeline.wal.journal import note_change

    opened = next((wal_dir / "segments").glob("*.open"))
    segment_id = int(opened.name.partition(".")[0])
    opened.rename(opened.with_name(segment_file(segment_id)))
    (wal_dir / "segments" / segment_file(segment_id + 1, ".open")).write_bytes(b"")
    if journal:
        note_change(wal_dir)
    return segment_id


def full_listing(wal_dirs: dict[str, Path]) -> int:
    """What a cursor-less sensor does: every segment of every database, with a stat each."""
    from history_pipeline.wal.segments import list_segments

    count = 0
    for wal_dir in wal_dirs.values():
        for ref in list_segments(wal_dir):
            ref.path.stat()
            count += 1
    return count


class Ticker:
    """The sensor evaluated as the daemon does, keeping its cursor."""

    def __init__(self, root: Path):
        import dagster as dg

        from history_pipeline.orchestration.resources import HistoryRootResource, S3Settings, SparkResource

        self.dg = dg
        self.spark = SparkResource()
        self.instance = dg.DagsterInstance.ephemeral()
        self.history = HistoryRootResource(root=str(root), s3=S3Settings())
        # the same root with a full scan on every tick, as every FULL_SCAN_EVERY-th tick is
        self.scanning = HistoryRootResource(root=str(root), s3=S3Settings(), sensor_full_scan_every=1)
        self.cursor: str | None = None

    def tick(self, full_scan: bool = False) -> tuple[float, Any]:
        from history_pipeline.orchestration.sensors import finished_wal_segments_sensor

        history = self.scanning if full_scan else self.history
        with self.dg.build_sensor_context(instance=self.instance, cursor=self.cursor,
                                          resources={"history": history, "spark": self.spark}) as context:
            gc.disable()  # as timeit does: a collection of unrelated garbage is not the tick's cost
            try:
                start = time.perf_counter()
                result = finished_wal_segments_sensor(context)
                elapsed = time.perf_counter() - start
            finally:
                gc.enable()
        self.cursor = result.cursor
        return elapsed, result


def measure(work: Path, databases: int, applied: int, sealed: int, repeat: int = 11) -> dict[str, Any]:
    """First, steady and one-new-segment tick times for ``databases`` databases."""
    root = work / f"root_{databases}_{applied}"
    wal_dirs = {}
    start = time.perf_counter()
    for n in range(databases):
        name = f"tenant_{n:06d}"
        wal_dirs[name] = root / name / "wal"
        fake_wal(wal_dirs[name], applied, sealed)
    built_s = time.perf_counter() - start
    ticker = Ticker(root)
    first_s, first = ticker.tick()
    assert len(first.run_requests) == databases * sealed, "the first tick must request every sealed segment"
    steady = []
    for _ in range(31):
        elapsed, result = ticker.tick()
        assert not result.run_requests, "a steady tick must request nothing"
        steady.append(elapsed)
    profile = cProfile.Profile()
    profile.enable()
    ticker.tick()
    profile.disable()
    steady_calls = pstats.Stats(profile).total_calls  # type: ignore[attr-defined]
    from history_pipeline.orchestration.resources import FULL_SCAN_EVERY
    from history_pipeline.orchestration.sensor_marks import marks_path

    full_scans = []
    for _ in range(5):
        elapsed, result = ticker.tick(full_scan=True)
        assert not result.run_requests, "a full scan over unchanged WALs must request nothing"
        full_scans.append(elapsed)
    one_new = []
    names = sorted(wal_dirs)
    for k in range(repeat):
        wal_dir = wal_dirs[names[(k * 7919) % databases]]
        segment_id = seal_next(wal_dir)
        elapsed, result = ticker.tick()
        assert [r.partition_key.rpartition(".")[2] for r in result.run_requests] == [segment_file(segment_id, "")]
        one_new.append(elapsed)
        age(wal_dir)  # settled before the next measurement, as it would be seconds later
    reference = []
    for _ in range(3):
        start = time.perf_counter()
        listed = full_listing(wal_dirs)
        reference.append(time.perf_counter() - start)
    return {
        "databases": databases,
        "applied_per_database": applied,
        "sealed_per_database": sealed,
        "segments_in_history": listed,
        "build_s": built_s,
        "first_tick_s": first_s,
        "first_tick_runs": len(first.run_requests),
        "steady_tick_s": statistics.median(steady),
        "steady_tick_min_s": min(steady),
        "steady_tick_calls": steady_calls,
        "one_new_segment_tick_s": statistics.median(one_new),
        "full_scan_tick_s": statistics.median(full_scans),
        "full_scan_every": FULL_SCAN_EVERY,
        "mean_tick_over_cycle_s": ((FULL_SCAN_EVERY - 1) * statistics.median(steady)
                                   + statistics.median(full_scans)) / FULL_SCAN_EVERY,
        "full_listing_s": statistics.median(reference),
        "cursor_bytes": len(ticker.cursor or ""),
        "marks_store_bytes": sum(os.path.getsize(p) for p in Path(marks_path(root)).parent.iterdir()),
    }


def measure_apart(databases: int, applied: int, sealed: int) -> dict[str, Any]:
    """:func:`measure` in a fresh process, so one configuration's leftovers (files in the page
    cache, objects in the heap) do not weigh on the next one's figures."""
    done = subprocess.run([sys.executable, "-m", "bench.tenants", "--one", str(databases), str(applied), str(sealed)],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(results: dict[str, Any]) -> str:
    """The Markdown tables and the verdict."""
    def ms(s: float) -> str:
        return f"{s * 1000:.1f} ms"

    lines = [
        "# Sensor tick time against tenants and history (`python -m bench.tenants`)",
        "",
        f"Machine: {results['machine']}; run {results['date']}. {results.get('note', '')}".rstrip(),
        "",
        "Every database: applied segments (history), 3 new sealed segments, 1 open segment, as plain files.",
        "",
        "| databases | segments in history | first tick (registers and requests all) | steady tick (nothing new, "
        "journal read): median / fastest | function calls per steady tick | one new segment | periodic full "
        "scan tick | mean tick over the "
        f"{results['by_databases'][0]['full_scan_every']}-tick cycle | Dagster cursor | marks store | "
        "cursor-less full listing (reference) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["by_databases"]:
        lines.append(f"| {r['databases']:,} | {r['segments_in_history']:,} | {ms(r['first_tick_s'])} "
                     f"({r['first_tick_runs']:,} runs) | {ms(r['steady_tick_s'])} / {ms(r['steady_tick_min_s'])} | "
                     f"{r['steady_tick_calls']:,} | "
                     f"{ms(r['one_new_segment_tick_s'])} | {ms(r['full_scan_tick_s'])} | "
                     f"{ms(r['mean_tick_over_cycle_s'])} | {r['cursor_bytes']:,} B | "
                     f"{r.get('marks_store_bytes', 0):,} B | {ms(r['full_listing_s'])} |")
    lines += [
        "",
        f"History sweep at {results['sweep'][0]['databases']:,} databases:",
        "",
        "| applied segments per database | segments in history | steady tick: median / fastest | function calls "
        "per steady tick | one new segment | cursor-less full listing (reference) |",
        "|---|---|---|---|---|---|",
    ]
    for r in results["sweep"]:
        lines.append(f"| {r['applied_per_database']:,} | {r['segments_in_history']:,} | {ms(r['steady_tick_s'])} / "
                     f"{ms(r['steady_tick_min_s'])} | {r['steady_tick_calls']:,} | "
                     f"{ms(r['one_new_segment_tick_s'])} | {ms(r['full_listing_s'])} |")
    lines += ["", verdict(results), ""]
    return "\n".join(lines)


def verdict(results: dict[str, Any]) -> str:
    """Plain words on how the steady tick grows with databases and with history."""
    rows = results["by_databases"]
    small, large = rows[0], rows[-1]
    db_span = large["databases"] / small["databases"]
    db_growth = large["steady_tick_min_s"] / small["steady_tick_min_s"]
    calls_growth = large["steady_tick_calls"] / small["steady_tick_calls"]
    full_per_db = large["full_scan_tick_s"] / large["databases"]
    sweep = results["sweep"]
    history_growth = sweep[-1]["steady_tick_min_s"] / sweep[0]["steady_tick_min_s"]
    history_span = sweep[-1]["segments_in_history"] / sweep[0]["segments_in_history"]
    reference_growth = sweep[-1]["full_listing_s"] / sweep[0]["full_listing_s"]
    flat_history = history_growth < 2.0
    flat_databases = db_growth < 1.5 and calls_growth < 1.05
    return (
        f"Verdict: against the number of databases the steady tick {'is flat' if flat_databases else 'is NOT flat'}: "
        f"{db_span:.0f}× more databases changed its fastest time {db_growth:.2f}× "
        f"({ms_text(small['steady_tick_min_s'])} → {ms_text(large['steady_tick_min_s'])}) and its Python function "
        f"calls {calls_growth:.3f}× ({small['steady_tick_calls']:,} → {large['steady_tick_calls']:,}; it reads the "
        "journal folder and the marks of the databases it names, "
        f"and its Dagster cursor is {large['cursor_bytes']} B at every size). The periodic full scan stays "
        f"linear ({full_per_db * 1e6:.0f} µs per database at "
        f"{large['databases']:,}), once every {large['full_scan_every']} ticks. Against history it "
        f"{'is flat' if flat_history else 'is NOT flat'}: {history_span:.0f}× more segments in history changed the "
        f"steady tick's fastest time {history_growth:.2f}× (the cursor-less full listing grew {reference_growth:.1f}×)."
    )


def ms_text(seconds: float) -> str:
    """Seconds as milliseconds, one decimal."""
    return f"{seconds * 1000:.1f} ms"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 and 100 databases, a shorter sweep")
    parser.add_argument("--one", nargs=3, type=int, metavar=("DATABASES", "APPLIED", "SEALED"),
                        help="measure one configuration and print its figures as JSON (used by the others)")
    parser.add_argument("--note", default="", help="what else ran on the machine, printed beside the figures")
    args = parser.parse_args(argv)
    if args.one:
        logging.getLogger("dagster").setLevel(logging.WARNING)
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(measure(Path(tmp), *args.one)))
        return 0
    size = SIZES["quick" if args.quick else "full"]
    results: dict[str, Any] = {
        "size": "quick" if args.quick else "full",
        "machine": f"{platform.platform()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "note": args.note,
        "by_databases": [],
        "sweep": [],
    }
    for n in size["databases"]:
        print(f"{n} databases ...", flush=True)
        results["by_databases"].append(measure_apart(n, size["applied"], size["sealed"]))
    for applied in size["sweep_applied"]:
        print(f"{size['sweep_databases']} databases, {applied} applied segments each ...", flush=True)
        results["sweep"].append(measure_apart(size["sweep_databases"], applied, size["sealed"]))
    table = report(results)
    print(table)
    write_results("tenants", results, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
