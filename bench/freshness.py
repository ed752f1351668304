"""Freshness through the real daemon: how long a sealed segment takes to become queryable when
Dagster compacts it (``dagster dev``: webserver, daemon, sensor, queue, run processes) on the
long-lived Spark engine (a local Spark Connect server), as ``make demo`` runs it.

    python -m bench.freshness                 # (a) 30 segments of 1,000 events, one database
    python -m bench.freshness --load          # and (b) 20 databases x a 2,000-event segment / 20 s, 10 min
    python -m bench.freshness --load-only --minutes 3
    python -m bench.freshness --demo-only     # (c) make demo's sample: UI up -> every segment compacted

(a) One segment at a time (the next is sealed once the previous is queryable): seal -> queryable
p50 / p90 / p99, split into the chain's stages, read from the Dagster instance's run records and
events: seal -> run created (the sensor), created -> launched (the queue), launched -> started
(the run's process and code load), started -> first step, and the work (first step -> the
frontier covering the segment, as a reader sees it). And the run's tail, which the next segment
(sealed at queryable) waits behind: queryable -> the run's last materialization -> its step's end
-> the run's success -> the database's next run created.

(c) As ``make demo``: the sample workload is written (sealed segments), then the engine and
``dagster dev`` start; the time from the UI answering to every sample segment applied.

(b) Every database seals a segment every ``interval`` seconds (staggered); each segment's lag
(seal -> queryable) is recorded, with p50 / p99 / max, and whether it grows over the run (the
median of the last third against the first third).

Writes ``bench/results/freshness.json`` and ``freshness.md`` (date, commit, machine load).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
TABLE = "tbl-fresh"
EVENTS_PER_T = 10  # events per transaction (one logical timestamp)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


class Tenant:
    """One database and its WAL writer: seals segments of ``events`` row events."""

    def __init__(self, root: Path, database: str):
        from history_pipeline import HistoryStore

        self.store = HistoryStore.open(root, database=database)
        self.database = database
        self.t = 0
        self.key = 0
        self.segments = 0

    def seal(self, events: int) -> tuple[int, int, float]:
        """Write and seal one segment; returns (segment number, its last t, seal time)."""
        batch = []
        if self.t == 0:
            self.t = 1
            batch.append({"op": "create_table", "t": self.t, "table_uuid": TABLE, "table_name": "items",
                          "columns": [{"column_uuid": "c-v", "column_name": "v", "data_type": "BIGINT"},
                                      {"column_uuid": "c-s", "column_name": "s", "data_type": "TEXT"}]})
        for i in range(events):
            if i % EVENTS_PER_T == 0:
                self.t += 1
            # two thirds new keys, a third updates of recent ones
            if i % 3 == 2 and self.key:
                op, key = "update", max(1, self.key - (i % 50))
            else:
                self.key += 1
                op, key = "insert", self.key
            batch.append({"op": op, "t": self.t, "table_uuid": TABLE, "key": key,
                          "values": {"c-v": i, "c-s": f"row {key}"}})
        batch.append({"op": "close", "t": self.t})
        with self.store.wal_writer() as wal:
            for event in batch:
                wal.append(event)
            wal.seal()
        self.segments += 1
        return self.segments, self.t, time.time()

    def queryable(self, t: int) -> bool:
        return self.store.frontier >= t


@dataclass(frozen=True)
class SegmentTiming:
    database: str
    segment: int
    sealed: float
    queryable: float
    created: float | None = None
    launched: float | None = None
    started: float | None = None
    first_step: float | None = None
    materialized: float | None = None
    step_end: float | None = None
    run_end: float | None = None
    next_created: float | None = None

    @property
    def latency(self) -> float:
        return self.queryable - self.sealed

    def stages(self) -> dict[str, float] | None:
        if None in (self.created, self.launched, self.started, self.first_step):
            return None
        return {"seal->created": self.created - self.sealed, "created->launched": self.launched - self.created,
                "launched->started": self.started - self.launched,
                "started->first step": self.first_step - self.started,
                "work (first step->queryable)": self.queryable - self.first_step}

    def tail(self) -> dict[str, float] | None:
        """After the commit: until the run's last materialization, its step's end, the run's
        success, and the database's next run created (the next segment is sealed at queryable)."""
        if None in (self.materialized, self.step_end, self.run_end, self.next_created):
            return None
        return {"queryable->materialized": self.materialized - self.queryable,
                "materialized->step end": self.step_end - self.materialized,
                "step end->run success": self.run_end - self.step_end,
                "run success->next run created": self.next_created - self.run_end,
                "queryable->next run created": self.next_created - self.queryable}


def _run_stages(home: Path) -> dict[str, dict[str, float]]:
    """Per partition key: the newest successful run's created / launched / started / first step times."""
    import dagster as dg

    instance = dg.DagsterInstance.from_config(str(home))
    out: dict[str, dict[str, float]] = {}
    try:
        for record in instance.get_run_records(dg.RunsFilter(statuses=[dg.DagsterRunStatus.SUCCESS])):
            run = record.dagster_run
            # a compaction run names its segments in its run config (a run of one partition: its tag)
            config = run.run_config.get("ops", {}).get("compact_segments", {}).get("config", {})
            keys = config.get("partition_keys") or [run.tags.get("dagster/partition")]
            if keys == [None]:
                continue
            times: dict[str, float] = {"created": record.create_timestamp.timestamp()}
            for entry in instance.all_logs(run.run_id):
                event = entry.dagster_event
                if event is None:
                    continue
                kind = event.event_type_value
                if kind == "PIPELINE_STARTING":
                    times.setdefault("launched", entry.timestamp)
                elif kind == "PIPELINE_START":
                    times.setdefault("started", entry.timestamp)
                elif kind == "STEP_START":
                    times.setdefault("first_step", entry.timestamp)
                elif kind == "ASSET_MATERIALIZATION":
                    times["materialized"] = entry.timestamp
                elif kind == "STEP_SUCCESS":
                    times["step_end"] = entry.timestamp
                elif kind == "PIPELINE_SUCCESS":
                    times["run_end"] = entry.timestamp
            for key in keys:
                if key not in out or out[key]["created"] < times["created"]:
                    out[key] = times
    finally:
        instance.dispose()
    return out


def _segment_key(database: str, segment: int) -> str:
    from history_pipeline.orchestration.partitions import segment_partition_key
    from history_pipeline.wal.segments import segment_name

    return segment_partition_key(database, segment_name(segment))


def measure_latency(root: Path, home: Path, segments: int, events: int, timeout: float) -> list[SegmentTiming]:
    """(a): one segment at a time, seal -> queryable, with each run's stage times."""
    tenant = Tenant(root, "fresh_a")
    raw = []
    for i in range(segments):
        number, last_t, sealed = tenant.seal(events)
        give_up = sealed + timeout
        while not tenant.queryable(last_t):
            if time.time() > give_up:
                raise RuntimeError(f"segment {number} not queryable after {timeout:.0f}s")
            time.sleep(0.05)
        raw.append((number, sealed, time.time()))
        print(f"  segment {i + 1}/{segments}: {raw[-1][2] - sealed:.2f}s", file=sys.stderr)
    time.sleep(2)  # the last run's success event
    stages = _run_stages(home)
    out = []
    for k, (number, sealed, queryable) in enumerate(raw):
        s = stages.get(_segment_key("fresh_a", number), {})
        following = stages.get(_segment_key("fresh_a", raw[k + 1][0]), {}) if k + 1 < len(raw) else {}
        out.append(SegmentTiming("fresh_a", number, sealed, queryable, s.get("created"), s.get("launched"),
                                 s.get("started"), s.get("first_step"), s.get("materialized"), s.get("step_end"),
                                 s.get("run_end"), following.get("created")))
    return out


def measure_load(root: Path, databases: int, events: int, interval: float, minutes: float,
                 drain: float) -> tuple[list[SegmentTiming], list[SegmentTiming]]:
    """(b): every database seals a segment every ``interval`` s (staggered) for ``minutes``; each
    segment's seal -> queryable, polled by one watcher. Writing stops after ``minutes``; segments
    still not queryable ``drain`` s later are returned apart, with their lag so far."""
    tenants = [Tenant(root, f"fresh_b{i:02d}") for i in range(databases)]
    pending: list[tuple[Tenant, int, int, float]] = []
    done: list[SegmentTiming] = []
    lock = threading.Lock()
    stop = threading.Event()

    def writer(tenant: Tenant, offset: float) -> None:
        start = time.time() + offset
        k = 0
        while not stop.is_set():
            if stop.wait(max(0.0, start + k * interval - time.time())):
                return
            number, last_t, sealed = tenant.seal(events)
            with lock:
                pending.append((tenant, number, last_t, sealed))
            k += 1

    threads = [threading.Thread(target=writer, args=(t, i * interval / databases), daemon=True)
               for i, t in enumerate(tenants)]
    for th in threads:
        th.start()
    end = time.time() + minutes * 60
    while True:
        now = time.time()
        if now >= end:
            stop.set()
        if now >= end + drain:
            break
        with lock:
            waiting = list(pending)
        if now >= end and not waiting:
            break
        frontiers: dict[str, int] = {}
        for entry in waiting:
            tenant, number, last_t, sealed = entry
            if tenant.database not in frontiers:
                frontiers[tenant.database] = tenant.store.frontier
            if frontiers[tenant.database] >= last_t:
                with lock:
                    pending.remove(entry)
                done.append(SegmentTiming(tenant.database, number, sealed, time.time()))
        time.sleep(0.2)
    for th in threads:
        th.join()
    now = time.time()
    unfinished = [SegmentTiming(t.database, n, sealed, now) for t, n, _, sealed in pending]
    return done, unfinished


def measure_demo(root: Path, timeout: float) -> dict:
    """(c): from now (the UI answers) until no sealed segment is left in any database of ``root``."""
    from history_pipeline import HistoryStore
    from history_pipeline.wal import SegmentState

    stores = [HistoryStore.open(root, database=p.parent.name, create=False) for p in sorted(root.glob("*/wal"))]
    segments = sum(len(s.segments(SegmentState.SEALED)) for s in stores)
    started = time.time()
    while any(s.segments(SegmentState.SEALED) for s in stores):
        if time.time() - started > timeout:
            raise RuntimeError(f"the demo's sample not compacted {timeout:.0f}s after the UI was up")
        time.sleep(0.2)
    return {"segments": segments, "compacted_after_ui_s": time.time() - started,
            "quarantined": sum(len(s.segments(SegmentState.QUARANTINED)) for s in stores)}


def summarize(timings: list[SegmentTiming]) -> dict:
    lat = [t.latency for t in timings]
    out = {"segments": len(lat), "p50_s": _pct(lat, 50), "p90_s": _pct(lat, 90), "p99_s": _pct(lat, 99),
           "max_s": max(lat) if lat else float("nan")}
    split = [t.stages() for t in timings]
    split = [s for s in split if s is not None]
    if split:
        out["stages_p50_s"] = {k: statistics.median(s[k] for s in split) for k in split[0]}
        out["stages_p90_s"] = {k: _pct([s[k] for s in split], 90) for k in split[0]}
    tails = [t.tail() for t in timings]
    tails = [t for t in tails if t is not None]
    if tails:
        out["tail_p50_s"] = {k: statistics.median(t[k] for t in tails) for k in tails[0]}
        out["tail_p90_s"] = {k: _pct([t[k] for t in tails], 90) for k in tails[0]}
    ordered = sorted(timings, key=lambda t: t.sealed)
    third = len(ordered) // 3
    if third:
        first = statistics.median(t.latency for t in ordered[:third])
        last = statistics.median(t.latency for t in ordered[-third:])
        out["first_third_p50_s"], out["last_third_p50_s"] = first, last
        out["grows"] = last > 1.5 * first + 1.0
    return out


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _carry_over(results: dict, path: Path) -> dict:
    """A run of one part keeps the other part's figures of the previous run (each part says when
    and on which commit it was measured)."""
    try:
        old = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return results
    for part, keys in (("latency", ["events_a", "latency_raw"]), ("demo", []),
                       ("load", ["databases_b", "events_b", "interval_b", "minutes_b", "drain_b", "load_raw"])):
        if part not in results and part in old:
            results[part] = {"date": old.get("date"), "commit": old.get("commit"),
                             "load_average": f"{old.get('load_start')} / {old.get('load_end')}", **old[part]}
            results.update({k: old[k] for k in keys if k in old})
    return results


def write_results(results: dict, name: str = "freshness") -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    results = _carry_over(results, RESULTS / f"{name}.json")
    (RESULTS / f"{name}.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = [f"# Freshness through the Dagster daemon on the Spark engine ({results['date']}, commit "
             f"{results['commit']})", "",
             f"Command: `{results['command']}`. Machine: {results['machine']}; load average at start "
             f"{results['load_start']}, at end {results['load_end']}.", "",
             "| measure | segments | p50 s | p90 s | p99 s | max s | target | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    a = results.get("latency")
    if a:
        ok = a["p50_s"] <= 5 and a["p99_s"] <= 15
        lines.append(f"| (a) seal -> queryable, {results['events_a']} events/segment, one at a time | "
                     f"{a['segments']} | {a['p50_s']:.1f} | {a['p90_s']:.1f} | {a['p99_s']:.1f} | {a['max_s']:.1f} | "
                     f"p50 <= 5, p99 <= 15 | {'meets' if ok else 'misses'} |")
    b = results.get("load")
    if b:
        ok = b["p99_s"] <= 30 and not b.get("grows", False) and not b["not_queryable_at_end"]
        lines.append(f"| (b) frontier lag, {results['databases_b']} databases x {results['events_b']} events every "
                     f"{results['interval_b']:.0f} s for {results['minutes_b']:g} min | {b['segments']} | "
                     f"{b['p50_s']:.1f} | {b['p90_s']:.1f} | {b['p99_s']:.1f} | {b['max_s']:.1f} | p99 <= 30, "
                     f"not growing | {'meets' if ok else 'misses'} (first third p50 {b.get('first_third_p50_s', 0):.1f}"
                     f" s, last third {b.get('last_third_p50_s', 0):.1f} s; {b['not_queryable_at_end']} of "
                     f"{b['sealed']} segments not queryable {results.get('drain_b', 0):.0f} s after the last seal) |")
    c = results.get("demo")
    if c:
        lines += ["", f"(c) `make demo`'s sample ({c['segments']} segments): every segment compacted "
                      f"{c['compacted_after_ui_s']:.1f} s after the UI answered (target <= 60 s: "
                      f"{'meets' if c['compacted_after_ui_s'] <= 60 else 'misses'})."]
    if a and "stages_p50_s" in a:
        lines += ["", "Stages of (a), p50 / p90 (s):", "", "| stage | p50 | p90 |", "|---|---|---|"]
        lines += [f"| {k} | {v:.2f} | {a['stages_p90_s'][k]:.2f} |" for k, v in a["stages_p50_s"].items()]
    if a and "tail_p50_s" in a:
        lines += ["", "After the commit, until the next segment's run is created, p50 / p90 (s):", "",
                  "| stage | p50 | p90 |", "|---|---|---|"]
        lines += [f"| {k} | {v:.2f} | {a['tail_p90_s'][k]:.2f} |" for k, v in a["tail_p50_s"].items()]
    for part, label in (("latency", "(a)"), ("load", "(b)"), ("demo", "(c)")):
        if part in results and "date" in results[part]:
            lines += ["", f"{label} is from an earlier run: {results[part]['date']}, commit {results[part]['commit']}, "
                          f"load average {results[part]['load_average']} (start / end)."]
    if results.get("note"):
        lines += ["", results["note"]]
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--segments", type=int, default=30)
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--load", action="store_true", help="also run (b)")
    parser.add_argument("--load-only", action="store_true", help="run (b) only")
    parser.add_argument("--databases", type=int, default=20)
    parser.add_argument("--load-events", type=int, default=2000)
    parser.add_argument("--interval", type=float, default=20.0)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="(a): a segment not queryable after this fails the run")
    parser.add_argument("--drain", type=float, default=120.0,
                        help="(b): seconds to wait after the writers stop for the last segments")
    parser.add_argument("--demo-only", action="store_true", help="run (c) only")
    parser.add_argument("--name", default="freshness", help="results file name under bench/results")
    parser.add_argument("--note", default="")
    args = parser.parse_args(argv)

    from history_pipeline.engine import start_engine, stop_engine
    from history_pipeline_tests.dagster_support import dagster_home, running_dagster_dev

    results: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": _commit(),
                     "command": "python -m bench.freshness " + " ".join(argv if argv is not None else sys.argv[1:]),
                     "machine": f"{os.cpu_count()} cores, {platform.machine()}",
                     "load_start": " ".join(f"{x:.1f}" for x in os.getloadavg()), "note": args.note}
    with tempfile.TemporaryDirectory(prefix="freshness-") as scratch:
        work = Path(scratch)
        engine = work / "engine"
        try:
            started = time.time()
            # warmed in the session the runs of the Dagster instance below share, as engine start does
            info = start_engine(engine, scope=str(dagster_home(work)))
            results["engine_start_s"] = time.time() - started
            print(f"engine up at {info.url} in {results['engine_start_s']:.1f}s", file=sys.stderr)
            root = work / "data"
            if args.demo_only:  # written before the UI starts, as make demo does
                from history_pipeline.cli import main as cli

                cli(["--root", str(root), "sample"])
            with running_dagster_dev(work, {"HISTORY_PIPELINE_SPARK": info.url}):
                home = dagster_home(work)
                if args.demo_only:
                    results["demo"] = measure_demo(root, args.timeout)
                    print(json.dumps(results["demo"], indent=2), file=sys.stderr)
                elif not args.load_only:
                    print("(a) seal -> queryable, one segment at a time", file=sys.stderr)
                    timings = measure_latency(root, home, args.segments, args.events, args.timeout)
                    results["events_a"] = args.events
                    results["latency"] = summarize(timings)
                    results["latency_raw"] = [asdict(t) for t in timings]
                    print(json.dumps(results["latency"], indent=2), file=sys.stderr)
                if args.load or args.load_only:
                    print(f"(b) {args.databases} databases for {args.minutes} min", file=sys.stderr)
                    timings, unfinished = measure_load(root, args.databases, args.load_events, args.interval,
                                                       args.minutes, args.drain)
                    results.update(databases_b=args.databases, events_b=args.load_events,
                                   interval_b=args.interval, minutes_b=args.minutes, drain_b=args.drain)
                    # a segment still waiting counts with its lag so far (a lower bound of its lag)
                    results["load"] = summarize(timings + unfinished)
                    results["load"]["sealed"] = len(timings) + len(unfinished)
                    results["load"]["not_queryable_at_end"] = len(unfinished)
                    # a backlog left at the end is a lag that grew, whatever the thirds' medians
                    # (the later segments' lags so far are lower bounds)
                    results["load"]["grows"] = results["load"].get("grows", False) or bool(unfinished)
                    results["load_raw"] = [asdict(t) for t in timings]
                    print(json.dumps(results["load"], indent=2), file=sys.stderr)
        finally:
            stop_engine(engine)
    results["load_end"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
    write_results(results, args.name)
    print(f"written bench/results/{args.name}.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
