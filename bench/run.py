"""Benchmarks of history_pipeline, each beside a baseline measured in the same run.

    python -m bench.run --quick     # about 5 minutes on 2 cores
    python -m bench.run             # the full sizes of the targets (long)

Prints a table and writes bench/results/results.json, results.md and PNG plots.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson
import pyarrow.parquet as pq

from bench import write_results
from bench.history import HOT_KEY, build_history
from bench.read_path import answer_file
from bench.workload import Workload, typed_wal_schema, write_workload
from bench.workload import events as events_of
from history_pipeline import HistoryStore, StoreSettings
from history_pipeline.catalog import AddFile, AdvanceFrontier, FileEntry, FileKind, TransactionLog
from history_pipeline.io.store import LocalStore
from history_pipeline.supertable import SUPERSEDED
from history_pipeline.supertable.row_cache import ROW_CACHE_BYTES, row_cache_stats, set_row_cache_bytes
from history_pipeline.wal import SegmentState

RESULTS = Path(__file__).parent / "results"

SIZES = {
    "quick": {
        "workload": Workload(tables=2, live_rows=20_000, versions=200_000, segment_events=50_000),
        "live_rows": 100_000,
        "histories": [1_000_000, 4_000_000, 16_000_000],
        "batch": 250_000,
        "catalog_transactions": 10_000,
    },
    "full": {
        "workload": Workload(tables=2, live_rows=250_000, versions=2_000_000, segment_events=100_000),
        "live_rows": 1_000_000,
        "histories": [2_500_000, 10_000_000, 40_000_000],
        "batch": 1_000_000,
        "catalog_transactions": 10_000,
    },
}


#: the HistoryService figures (bench/service.py): a modest history, the point is the network's cost
SERVICE_SIZES = {
    "quick": {"live_rows": 20_000, "versions": 100_000},
    "full": {"live_rows": 100_000, "versions": 1_000_000},
}


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def median_time(fn: Callable[[], Any], repeat: int = 3) -> float:
    return statistics.median(timed(fn)[0] for _ in range(repeat))


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# --- 1. compaction throughput (and 6. storage) -------------------------------------------------


def bench_compaction(work: Path, w: Workload, spark: Any) -> dict[str, Any]:
    from bench.compaction import spark_json_to_parquet_s

    warm = HistoryStore.open(work / "compaction_warm", database="bench")  # ours warm, like the baseline
    write_workload(warm, Workload(tables=2, live_rows=500, versions=3_000, segment_events=1_500))
    warm.compact(spark=spark)
    store = HistoryStore.open(work / "compaction", database="bench")
    events = write_workload(store, w)
    segments = [r.path for r in store.segments(SegmentState.SEALED)]
    copies = work / "segments"
    copies.mkdir()
    for path in segments:
        shutil.copy(path, copies / path.name)
    seconds, summary = timed(lambda: store.compact(spark=spark))
    versions = summary.versions_written

    def pyarrow_json_to_parquet() -> None:
        out = work / "pyarrow_out"
        out.mkdir(exist_ok=True)
        options = pajson.ParseOptions(unexpected_field_behavior="infer")
        for path in sorted(copies.iterdir()):
            table = pajson.read_json(path, parse_options=options)
            pq.write_table(table, out / (path.name + ".parquet"), compression="zstd")

    pyarrow_s = median_time(pyarrow_json_to_parquet, repeat=1)
    spark_json = [str(p) for p in sorted(copies.iterdir())]
    # the typed schema a user who knows the tables gives (values as a struct of their columns)
    spark_s = spark_json_to_parquet_s(spark, spark_json, work / "spark_out", typed_wal_schema(events_of(w)))
    delta = bench_delta_merge(work, store)
    # files replaced by a merge or an interval close answer nothing any more (unlike Delta's old
    # files, which are its time travel): measured after the garbage collection that removes them
    store.cleanup(grace=timedelta(0))
    ours_bytes = dir_bytes(Path(store.objects.uri) / "bench" / "tables")
    return {
        "events": events,
        "versions": versions,
        "ours_s": seconds,
        "ours_versions_per_s": versions / seconds,
        "pyarrow_json_to_parquet_s": pyarrow_s,
        "pyarrow_versions_per_s": events / pyarrow_s,
        "spark_json_to_parquet_s": spark_s,
        "spark_versions_per_s": events / spark_s,
        "delta_merge_s": delta["seconds"],
        "delta_versions_per_s": versions / delta["seconds"] if delta["seconds"] else None,
        "ours_bytes": ours_bytes,
        "delta_bytes": delta["bytes"],
        "ours_bytes_per_version": ours_bytes / max(versions, 1),
        "delta_bytes_per_version": delta["bytes"] / max(versions, 1),
    }


def bench_delta_merge(work: Path, store: HistoryStore) -> dict[str, Any]:
    """Delta Lake applying the same changes as MERGE upserts, one MERGE per segment and table."""
    from deltalake import DeltaTable, write_deltalake

    state = store.catalog_state()
    total = 0.0
    root = work / "delta"
    for table_uuid in sorted({f.table_uuid for f in state.files.values() if f.table_uuid}):
        path = root / table_uuid
        # one MERGE per segment and table: a segment may be written as several files (key parts)
        by_segment: dict[tuple[Any, ...], list[FileEntry]] = {}
        for entry in state.versions_of(table_uuid):  # with the snapshot pieces holding versions
            by_segment.setdefault(entry.segments or (entry.path,), []).append(entry)
        batches = sorted(by_segment.values(), key=lambda files: min(f.min_t or 0 for f in files))
        created = False
        for files in batches:
            parts = [pq.read_table(store.objects.full_path(f.path)) for f in files]
            # our own bookkeeping column of closed intervals is not part of the rows Delta holds
            parts = [t.drop_columns([SUPERSEDED]) if SUPERSEDED in t.column_names else t for t in parts]
            source = _latest_per_key(pa.concat_tables(parts, promote_options="default"))
            if not created:
                start = time.perf_counter()
                write_deltalake(str(path), source.filter(pc.invert(source["is_deleted"])))
                total += time.perf_counter() - start
                created = True
                continue
            start = time.perf_counter()
            (
                DeltaTable(str(path))
                .merge(source, predicate="t.synthetic_key = s.synthetic_key", source_alias="s", target_alias="t")
                .when_matched_delete(predicate="s.is_deleted")
                .when_matched_update_all(predicate="NOT s.is_deleted")
                .when_not_matched_insert_all(predicate="NOT s.is_deleted")
                .execute()
            )
            total += time.perf_counter() - start
    return {"seconds": total, "bytes": dir_bytes(root) if root.exists() else 0}


def _latest_per_key(table: pa.Table) -> pa.Table:
    from history_pipeline.supertable.read import keep_latest

    return keep_latest(table, include_deleted=True)


# --- 2. as-of load, 3. fetch_row / row_history -----------------------------------------------


def bench_as_of(work: Path, live_rows: int, histories: list[int], batch: int) -> list[dict[str, Any]]:
    rows = []
    for versions in histories:
        store = HistoryStore.open(work / f"history_{versions}", database="bench",
                                  settings=StoreSettings(snapshot_min_versions=live_rows))
        build_s, history = timed(lambda s=store, v=versions: build_history(s, live_rows, v, batch))
        for label, as_of in (("latest", history.frontier + 1), ("middle", history.frontier // 2 + batch // 3)):
            seconds = median_time(lambda s=store, t=as_of: s.load_table("bench", t))
            answer = store.load_table("bench", as_of)
            answer_path = work / f"answer_{versions}_{label}.parquet"
            answer_file(answer, answer_path)
            con = duckdb.connect()
            query = f"SELECT * FROM read_parquet('{answer_path}')"
            limit = median_time(lambda c=con, q=query: c.sql(q).to_arrow_table())
            con.close()
            rows.append({
                "versions": versions, "live_rows": answer.num_rows, "as_of": label, "ours_s": seconds,
                "duckdb_answer_file_s": limit, "ratio": seconds / limit, "build_s": build_s,
            })
        if versions == histories[1] or len(histories) == 1:
            rows[-1]["lookups"] = bench_lookups(store, history.frontier + 1, live_rows)
    return rows


def bench_lookups(store: HistoryStore, as_of: int, live_rows: int, lookups: int = 200,
                  warm_keys: int = 2000) -> dict[str, Any]:
    """fetch_row as bench.lookups times it, in a warm process (one frozen catalog state): the same
    random keys of the live set, none asked before, timed twice: **cold**, no row group kept decoded
    (each lookup decodes its row's row group; key indexes and footers warm from a tenth of the
    warm-up keys), then **warm**, the row cache at its default budget after ``warm_keys`` lookups
    of other keys (a worker's steady state: a timed key hits when a warm-up key shared its row
    group). Also row_history of the key with the most versions."""
    from bench.lookups import random_keys
    from bench.timing import interleaved, repeated

    context = store.query_context()

    def fetch(key: int) -> Any:
        return context.fetch_row("bench", key, as_of)

    keys = random_keys(random.Random(3), live_rows, lookups)
    warm = random_keys(random.Random(5), live_rows, warm_keys, set(keys))
    budget = row_cache_stats().budget_bytes
    try:
        set_row_cache_bytes(0)
        (cold,) = interleaved([fetch], keys, warmup=warm[:max(20, warm_keys // 10)])
        set_row_cache_bytes(ROW_CACHE_BYTES)
        for key in warm:
            fetch(key)
        before = row_cache_stats()
        (hot,) = interleaved([fetch], keys)
        after = row_cache_stats()
    finally:
        set_row_cache_bytes(budget)
    hits, misses = after.hits - before.hits, after.misses - before.misses
    (history,) = repeated([lambda: context.row_history("bench", HOT_KEY)], 25, warmup=0)
    return {
        "lookups": lookups, "warm_keys": warm_keys, "row_cache_budget_mib": ROW_CACHE_BYTES / 2**20,
        "row_cache_hit_rate": hits / (hits + misses) if hits + misses else None,
        "fetch_row_cold": cold.percentiles(), "fetch_row_warm": hot.percentiles(),
        "row_history_versions": len(history.last),
        "row_history_p50_ms": 1000 * history.at(0.5),
        "row_history_p99_ms": 1000 * max(history.wall),
    }


def fetch_row_lines(lookups: dict[str, Any], where: str = "") -> list[str]:
    """The report's rows of ``bench_lookups``' figures: fetch_row warm and cold against the target,
    then row_history (``where``: what the figures are of, for the rows' labels)."""
    hit = lookups["row_cache_hit_rate"]
    warm, cold = lookups["fetch_row_warm"], lookups["fetch_row_cold"]

    def pair(f: dict[str, float]) -> str:
        return (f"{f['p50_ms']:.2f} / {f['p99_ms']:.2f} ms (CPU {f['cpu_p50_ms']:.2f} / {f['cpu_p99_ms']:.2f})"
                f" | — | — | ≤ 1 / ≤ 3 ms | {verdict(f['p50_ms'], 1)} / {verdict(f['p99_ms'], 3)} |")

    return [
        f"| fetch_row p50 / p99{where}, warm: {lookups['lookups']} keys never asked, the row cache at "
        f"{lookups['row_cache_budget_mib']:.0f} MiB after {lookups['warm_keys']:,} lookups of other keys "
        f"(hit rate {'—' if hit is None else f'{100 * hit:.0f} %'}) | {pair(warm)}",
        f"| fetch_row p50 / p99{where}, cold: the same keys, no row group kept decoded | {pair(cold)}",
        f"| row_history p50 / p99, a key with {lookups['row_history_versions']:,} versions | "
        f"{lookups['row_history_p50_ms']:.1f} / {lookups['row_history_p99_ms']:.1f} ms | — | — | "
        f"≤ 50 ms | {verdict(lookups['row_history_p50_ms'], 50)} |",
    ]


def bench_delta_time_travel(work: Path, live_rows: int, versions: int, batch: int) -> dict[str, Any]:
    """Delta's time-travel read of a state equal to ours, on the same synthetic history."""
    from deltalake import DeltaTable, write_deltalake

    store = HistoryStore.open(work / f"history_{versions}", database="bench")
    state = store.catalog_state()
    files = sorted(state.versions_of("bench-table"), key=lambda f: f.min_t or 0)
    path = work / "delta_history"
    for i, entry in enumerate(files):
        source = _latest_per_key(pq.read_table(store.objects.full_path(entry.path)))
        if i == 0:
            write_deltalake(str(path), source)
        else:
            # files overlap in time (an interval's pieces, its snapshot's pieces holding versions):
            # the newer version of a key wins whatever the order of the files
            (DeltaTable(str(path)).merge(source, predicate="t.synthetic_key = s.synthetic_key",
                                         source_alias="s", target_alias="t")
             .when_matched_update_all(predicate="s.logical_timestamp > t.logical_timestamp")
             .when_not_matched_insert_all().execute())
    version = DeltaTable(str(path)).version()
    seconds = median_time(lambda: DeltaTable(str(path), version=version).to_pyarrow_table())
    ours = median_time(lambda: store.load_table("bench", store.frontier + 1))
    store.cleanup(grace=timedelta(0))  # replaced files are garbage, not history (see above)
    return {"versions": versions, "delta_time_travel_s": seconds, "ours_s": ours,
            "delta_bytes": dir_bytes(path), "ours_bytes": dir_bytes(Path(store.objects.uri) / "bench" / "tables")}


# --- 5. catalog open ---------------------------------------------------------------------


def bench_catalog(work: Path, transactions: int) -> dict[str, Any]:
    results = {}
    for interval in (100, 0):
        store = LocalStore(work / f"catalog_{interval}")
        log = TransactionLog(store, "db/_catalog", checkpoint_interval=interval)
        for i in range(transactions):
            entry = FileEntry(f"f{i}", FileKind.VERSIONS, "t", 1, 1, i, i)
            log.commit("add", lambda s, e=entry, f=i: [AddFile(e), AdvanceFrontier(f)])
        seconds = median_time(
            lambda s=store, i=interval: TransactionLog(s, "db/_catalog", checkpoint_interval=i).latest()
        )
        results["with_checkpoints_s" if interval else "replay_all_s"] = seconds
    return results


# --- 4. seal to queryable through the daemon ------------------------------------------------


def bench_seal_to_queryable(work: Path) -> dict[str, Any]:
    """Start `dagster dev` with default settings, seal a segment, time until it is queryable."""
    import signal
    import socket
    import urllib.request

    repo = Path(__file__).resolve().parents[1]
    home = work / "dagster_home"
    home.mkdir()
    shutil.copy(repo / "dagster.yaml", home / "dagster.yaml")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dagster = str(Path(sys.executable).parent / "dagster")
    launcher = (
        "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])"
    )
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    proc = subprocess.Popen([sys.executable, "-c", launcher, dagster, "dev", "-w", str(repo / "workspace.yaml"),
                             "-h", "127.0.0.1", "-p", str(port)], cwd=work, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2)
                break
            except OSError:
                time.sleep(1)
        time.sleep(5)  # let the daemon's sensor loop settle, as in steady operation
        store = HistoryStore.open(work / "data", database="e2e")
        start = time.time()
        with store.wal_writer() as wal:
            wal.append({"op": "create_table", "t": 1, "table_uuid": "t", "table_name": "t",
                        "columns": [{"column_uuid": "c", "column_name": "c", "data_type": "TEXT"}]})
            for key in range(1, 5):
                wal.append({"op": "insert", "t": key + 1, "table_uuid": "t", "key": key, "values": {"c": "x"}})
            wal.append({"op": "close", "t": 5})
            wal.seal()
        while store.frontier < 5 and time.time() - start < 300:
            time.sleep(0.5)
        return {"seal_to_queryable_s": time.time() - start, "reached": store.frontier >= 5}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)


# --- report ----------------------------------------------------------------------------------


def verdict(value: float | None, target: float, lower_is_better: bool = True) -> str:
    if value is None:
        return "n/a"
    ok = value <= target if lower_is_better else value >= target
    return "meets target" if ok else "MISSES target"


def report(results: dict[str, Any]) -> str:
    c = results["compaction"]
    lines = [
        f"# history_pipeline benchmarks ({results['size']})",
        "",
        f"Machine: {results['machine']}; run {results['date']}.",
        "",
        "| measure | ours | baseline (same run) | ratio | target | verdict |",
        "|---|---|---|---|---|---|",
    ]
    ratio_spark = c["ours_versions_per_s"] / c["spark_versions_per_s"]
    lines.append(f"| compaction, versions/s ({c['versions']:,} versions) | {c['ours_versions_per_s']:,.0f} | "
                 f"Spark JSON→Parquet (warm, explicit schema) {c['spark_versions_per_s']:,.0f} | "
                 f"{ratio_spark:.2f}× | ≥ 0.5× | "
                 f"{verdict(ratio_spark, 0.5, False)} |")
    ratio_py = c["ours_versions_per_s"] / c["pyarrow_versions_per_s"]
    lines.append(f"| compaction vs the practical limit | {c['ours_versions_per_s']:,.0f} | "
                 f"pyarrow JSON→Parquet {c['pyarrow_versions_per_s']:,.0f} | {ratio_py:.2f}× | — | — |")
    if c["delta_versions_per_s"]:
        ratio_delta = c["ours_versions_per_s"] / c["delta_versions_per_s"]
        lines.append(f"| compaction vs Delta MERGE per segment | {c['ours_versions_per_s']:,.0f} | "
                     f"{c['delta_versions_per_s']:,.0f} | {ratio_delta:.2f}× | ≥ 1× at 40M versions | "
                     f"{verdict(ratio_delta, 1.0, False)} (at this size) |")
    for row in results["as_of"]:
        lines.append(f"| as-of load_table, {row['live_rows']:,} live rows, {row['versions']:,} versions, "
                     f"T={row['as_of']} | {row['ours_s']:.3f} s | DuckDB reading the answer file (DuckDB-written) "
                     f"{row['duckdb_answer_file_s']:.3f} s | {row['ratio']:.2f}× | ≤ 2× | "
                     f"{verdict(row['ratio'], 2.0)} |")
    lookups = next((r["lookups"] for r in results["as_of"] if "lookups" in r), None)
    if lookups:
        lines += fetch_row_lines(lookups)
    d = results.get("delta_time_travel")
    if d:
        lines.append(f"| as-of load vs Delta time travel ({d['versions']:,} versions) | {d['ours_s']:.3f} s | "
                     f"{d['delta_time_travel_s']:.3f} s | {d['ours_s'] / d['delta_time_travel_s']:.2f}× | — | — |")
    cat = results["catalog"]
    lines.append(f"| catalog open, {results['catalog_transactions']:,} transactions | "
                 f"{cat['with_checkpoints_s']:.3f} s | replaying all {cat['replay_all_s']:.3f} s | "
                 f"{cat['with_checkpoints_s'] / cat['replay_all_s']:.3f}× | ≤ 0.5 s | "
                 f"{verdict(cat['with_checkpoints_s'], 0.5)} |")
    storage = c["ours_bytes"] / max(c["delta_bytes"], 1)
    lines.append(f"| bytes on disk for the compaction history | {c['ours_bytes']:,} | Delta {c['delta_bytes']:,} | "
                 f"{storage:.2f}× | ≤ 0.5× | {verdict(storage, 0.5)} |")
    s2q = results.get("seal_to_queryable")
    if s2q:
        lines.append(f"| seal → queryable through the Dagster daemon | {s2q['seal_to_queryable_s']:.1f} s | — | — | "
                     f"≤ 30 s | {verdict(s2q['seal_to_queryable_s'], 30)} |")
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, marker in (("latest", "o"), ("middle", "^")):
        rows = [r for r in results["as_of"] if r["as_of"] == label]
        ax.plot([r["versions"] for r in rows], [r["ours_s"] for r in rows], marker=marker,
                label=f"load_table (ours), T={label}")
    rows = [r for r in results["as_of"] if r["as_of"] == "middle"]
    ax.plot([r["versions"] for r in rows], [r["duckdb_answer_file_s"] for r in rows], marker="s",
            label="DuckDB reading the answer file")
    ax.set_xscale("log")
    ax.set_xlabel("versions in history")
    ax.set_ylabel("seconds")
    ax.set_title("as-of load vs history length")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "as_of_scaling.png", dpi=100)
    c = results["compaction"]
    fig, ax = plt.subplots(figsize=(6, 4))
    names = ["ours", "pyarrow JSON→Parquet", "Spark JSON→Parquet", "Delta MERGE"]
    values = [c["ours_versions_per_s"], c["pyarrow_versions_per_s"], c["spark_versions_per_s"],
              c["delta_versions_per_s"] or 0]
    ax.bar(names, values)
    ax.set_ylabel("versions per second")
    ax.set_title("compaction throughput")
    plt.setp(ax.get_xticklabels(), rotation=15)
    fig.tight_layout()
    fig.savefig(RESULTS / "compaction_throughput.png", dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (about 5 minutes)")
    parser.add_argument("--skip-daemon", action="store_true", help="skip the seal-to-queryable measurement")
    parser.add_argument("--skip-read-path", action="store_true", help="skip bench/read_path.py (worst T, TPC-H SQL)")
    parser.add_argument("--skip-service", action="store_true", help="skip the HistoryService (network) figures")
    parser.add_argument("--tenants", action="store_true",
                        help="also run bench/tenants.py (sensor tick time against databases and history)")
    args = parser.parse_args(argv)
    size = "quick" if args.quick else "full"
    config = SIZES[size]
    RESULTS.mkdir(parents=True, exist_ok=True)
    from history_pipeline.execution import local_spark

    spark = local_spark("local[2]")
    results: dict[str, Any] = {
        "size": size,
        "machine": f"{platform.platform()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "catalog_transactions": config["catalog_transactions"],
    }
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        print("1/6 compaction throughput ...", flush=True)
        results["compaction"] = bench_compaction(work, config["workload"], spark)
        from bench.compaction import Case, bench_case
        from bench.compaction import report as compaction_report

        workload = config["workload"]
        frames_work = work / "compaction_frames"
        frames_work.mkdir()
        case = Case("multi-table", lambda store: write_workload(store, workload),
                    lambda: typed_wal_schema(events_of(workload)))
        results["compaction_frames"] = bench_case(frames_work, case, spark)
        print(compaction_report(results["compaction_frames"]), flush=True)
        print("2-3/6 as-of load, fetch_row, row_history ...", flush=True)
        results["as_of"] = bench_as_of(work, config["live_rows"], config["histories"], config["batch"])
        print("   Delta time travel ...", flush=True)
        results["delta_time_travel"] = bench_delta_time_travel(work, config["live_rows"], config["histories"][0],
                                                               config["batch"])
        print("5/6 catalog open ...", flush=True)
        results["catalog"] = bench_catalog(work, config["catalog_transactions"])
        if not args.skip_daemon:
            print("4/6 seal to queryable through the daemon ...", flush=True)
            results["seal_to_queryable"] = bench_seal_to_queryable(work)
        if not args.skip_read_path:
            from bench import read_path

            print("7/7 read path: worst T, TPC-H-style SQL as of T ...", flush=True)
            (work / "read_path").mkdir()
            results["read_path"] = read_path.run(work / "read_path", config["live_rows"], config["histories"][1:],
                                                 config["batch"], config["live_rows"] // 20, 4, delta=False,
                                                 snapshot_ratio=StoreSettings().snapshot_ratio)
        if not args.skip_service:
            from bench.service import bench_service

            print("   HistoryService over the network ...", flush=True)
            results["service"] = bench_service(work, **SERVICE_SIZES[size])
    spark.stop()
    table = report(results)
    if "read_path" in results:
        from bench import read_path

        table += "\n" + read_path.report(results["read_path"])
    if "service" in results:
        from bench.service import report as service_report

        table += "\n" + service_report(results["service"])
    print(table)
    write_results("results", results, table)
    plot(results)
    if args.tenants:
        from bench import tenants

        tenants.main(["--quick"] if args.quick else [])  # writes bench/results/tenants.*
    return 0


if __name__ == "__main__":
    sys.exit(main())
