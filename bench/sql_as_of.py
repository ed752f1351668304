"""``sql()`` as of T beside DuckDB running the same query on Parquet copies of the tables as of T.

Both sides are warm and timed interleaved in one process (the machine is shared: only the ratios
of one run mean anything). Two workloads:

1. TPC-H-style tables at two sizes, loaded and refreshed through the WAL and compaction
   (``bench.read_path.build_tpch``), queried with TPC-H queries 1 (with its exact NUMERIC
   averages), 3, 5, 6, 10, 12, 14 (an exact NUMERIC division) and 18 as of three T each;
2. a wide single table (twelve columns of seven types) with 90,000 live rows and 400,000 versions
   (inserts, then updates of one to three columns and some deletes), through the WAL too.

Each query's ratio is printed; the verdict is every ratio <= 2 and the geometric mean <= 1.5.
Beside it, each query's first run at a T (``first at T``): before each of its timings, what the
process keeps for that T (its views and kept tables; its idle cursors serve it again set up anew,
as a previous T's do) is forgotten through ``QueryContext.forget``, so every timing is a first
query at a T in a state already read, as a worker's every query is (it runs one query at the T of
each event); DuckDB on the copies is timed interleaved as before. The first of those timings is
printed too (``once``): the first time the process asks that query at T at all (for each T's
first query, nothing is kept for the files only T reads yet; the first T's first query is the very
first query of the state: its sandbox is made then), beside DuckDB's first run of it on
its copies (a connection new for each T).

    python -m bench.sql_as_of --quick
    python -m bench.sql_as_of
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb

from bench.read_path import TPCH_QUERIES, TPCH_TABLES, _compact_and_maintain, _same_answer, answer_file, build_tpch
from history_pipeline import HistoryStore

RESULTS = Path(__file__).parent / "results"

WIDE_COLUMNS = [("account", "BIGINT"), ("qty", "BIGINT"), ("price", "DOUBLE PRECISION"), ("name", "TEXT"),
                ("city", "TEXT"), ("note", "TEXT"), ("amount", "NUMERIC(12,2)"), ("fee", "NUMERIC(12,2)"),
                ("level", "INTEGER"), ("day", "DATE"), ("active", "BOOLEAN"), ("seen", "TIMESTAMP")]
CITIES = ["Berlin", "Lagos", "Lima", "Osaka", "Perth", "Quito", "Riga", "Sofia"]

WIDE_QUERIES: dict[str, str] = {
    "count": "SELECT count(*) AS n FROM wide",
    "group": """SELECT city, count(*) AS n, sum(amount) AS amount, avg(amount) AS avg_amount, sum(qty) AS qty,
        avg(price) AS avg_price FROM wide GROUP BY city ORDER BY city""",
    "ratio": """SELECT level, 100.00 * sum(fee) / sum(amount) AS fee_pct FROM wide WHERE active
        GROUP BY level ORDER BY level""",
    "filter": """SELECT synthetic_key, name, amount, day FROM wide WHERE amount > 9990 AND city = 'Lima'
        ORDER BY synthetic_key""",
    "top": "SELECT synthetic_key, account, amount, fee FROM wide ORDER BY amount DESC, synthetic_key LIMIT 20",
    "distinct": "SELECT count(DISTINCT account) AS accounts, min(day) AS first, max(seen) AS last FROM wide",
    "point": "SELECT * FROM wide WHERE synthetic_key = 4242",
}


def _wide_row(rng: random.Random, key: int) -> dict[str, Any]:
    return {"account": rng.randrange(20_000), "qty": rng.randrange(1000), "price": round(rng.random() * 100, 6),
            "name": f"name-{key % 5000}", "city": rng.choice(CITIES), "note": "n" * rng.randrange(5, 40),
            "amount": f"{rng.randrange(1_000_000) / 100:.2f}", "fee": f"{rng.randrange(10_000) / 100:.2f}",
            "level": rng.randrange(10), "day": (dt.date(2020, 1, 1) + dt.timedelta(rng.randrange(1500))).isoformat(),
            "active": rng.random() < 0.7,
            "seen": (dt.datetime(2024, 1, 1) + dt.timedelta(seconds=rng.randrange(10**8))).isoformat()}


def build_wide(store: HistoryStore, live_rows: int, versions: int, seed: int = 5) -> list[int]:
    """``live_rows`` inserts then updates (one to three columns) and a few deletes up to ``versions``
    events, in transactions of ten through the WAL, compacted in four parts; the as_of after each."""
    rng = random.Random(seed)
    t = 1
    as_ofs = []
    with store.wal_writer() as wal:
        wal.append({"op": "create_table", "t": t, "table_uuid": "W", "table_name": "wide",
                    "columns": [{"column_uuid": c, "column_name": c, "data_type": ty} for c, ty in WIDE_COLUMNS]})
        wal.append({"op": "close", "t": t})
        wal.seal()
    live = list(range(live_rows))
    written = 0
    parts = 4
    per_part = math.ceil(versions / parts)
    next_key = live_rows
    for _ in range(parts):
        with store.wal_writer() as wal:
            goal = min(versions, written + per_part)
            while written < goal:
                t += 1
                for _ in range(min(10, goal - written)):
                    if written < live_rows:
                        key = written
                        wal.append({"op": "insert", "t": t, "table_uuid": "W", "key": key,
                                    "values": _wide_row(rng, key)})
                    elif rng.random() < 0.03:
                        index = rng.randrange(len(live))
                        key = live[index]
                        live[index] = next_key  # a delete and an insert keep the live rows level
                        wal.append({"op": "delete", "t": t, "table_uuid": "W", "key": key})
                        wal.append({"op": "insert", "t": t, "table_uuid": "W", "key": next_key,
                                    "values": _wide_row(rng, next_key)})
                        next_key += 1
                        written += 1
                    else:
                        key = rng.choice(live)
                        row = _wide_row(rng, key)
                        columns = rng.sample(list(row), rng.randint(1, 3))
                        wal.append({"op": "update", "t": t, "table_uuid": "W", "key": key,
                                    "values": {c: row[c] for c in columns}})
                    written += 1
                if t % 20 == 0:
                    wal.append({"op": "close", "t": t})
            if t % 20:
                wal.append({"op": "close", "t": t})
            wal.seal()
        _compact_and_maintain(store)
        as_ofs.append(t + 1)
    return as_ofs


def _time(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _first_at_t(store: HistoryStore, con: Any, query: str, as_of: int,
                samples: int) -> tuple[float, float, float, float]:
    """Medians of ``samples`` interleaved timings: ``sql()`` as the first query at T, DuckDB on the
    copies; then the first timing of each (the first time the process runs this query at T).

    Before each, what the process keeps for queries at T is forgotten (``QueryContext.forget``); what
    is kept per state (its sandbox, footers, rewrites, replays) stays, as it does for a worker."""
    ours, theirs = [], []
    for _ in range(samples):
        store.query_context().forget(as_of)
        ours.append(_time(lambda: store.sql(query, as_of)))
        theirs.append(_time(lambda: con.sql(query).to_arrow_table()))
    return statistics.median(ours), statistics.median(theirs), ours[0], theirs[0]


def compare(store: HistoryStore, work: Path, tables: list[str], queries: dict[str, str], as_ofs: list[int],
            label: str, samples: int) -> list[dict[str, Any]]:
    """Each query as of each T: answers checked equal, ``samples`` interleaved timings a side, medians."""
    rows = []
    for as_of in as_ofs:
        copies = work / f"{label}_copy_{as_of}"
        copies.mkdir()
        con = duckdb.connect()
        # the same PostgreSQL-like settings store.sql applies, so both engines answer alike
        con.execute("SET integer_division = true")
        con.execute("SET default_null_order = 'nulls_last_on_asc_first_on_desc'")
        con.execute("SET TimeZone = 'UTC'")
        for name in tables:
            path = copies / f"{name}.parquet"
            answer_file(store.load_table(name, as_of, ordered=True), path)
            con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet('{path}')")
        for query_name, query in queries.items():
            first_s, first_copy_s, once_s, once_copy_s = _first_at_t(store, con, query, as_of, samples)
            ours = store.sql(query, as_of).to_pylist()  # warm: views, rewrites and footers cached
            theirs = con.sql(query).to_arrow_table().to_pylist()
            ours_samples, copy_samples = [], []
            for _ in range(samples):
                ours_samples.append(_time(lambda q=query, t=as_of: store.sql(q, t)))
                copy_samples.append(_time(lambda q=query, c=con: c.sql(q).to_arrow_table()))
            ours_s, copy_s = statistics.median(ours_samples), statistics.median(copy_samples)
            rows.append({"workload": label, "query": query_name, "as_of": as_of, "rows": len(ours),
                         "same_answer": _same_answer(ours, theirs), "ours_s": ours_s, "duckdb_copy_s": copy_s,
                         "ratio": ours_s / copy_s, "first_s": first_s, "first_copy_s": first_copy_s,
                         "first_ratio": first_s / first_copy_s, "once_s": once_s, "once_copy_s": once_copy_s})
            print(f"  {label} {query_name} as of {as_of}: {ours_s * 1000:.1f} ms vs {copy_s * 1000:.1f} ms "
                  f"= {ours_s / copy_s:.2f}x{'' if rows[-1]['same_answer'] else ' ANSWERS DIFFER'}; first at T "
                  f"{first_s * 1000:.1f} ms vs {first_copy_s * 1000:.1f} ms = {first_s / first_copy_s:.2f}x; once "
                  f"{once_s * 1000:.1f} ms vs {once_copy_s * 1000:.1f} ms",
                  flush=True)
        con.close()
    return rows


def run(work: Path, tpch_sizes: list[int], cycles: int, wide_live: int, wide_versions: int,
        samples: int) -> dict[str, Any]:
    results: dict[str, Any] = {"rows": [], "sizes": {}}
    for orders in tpch_sizes:
        print(f"sql as of T: TPC-H-style, {orders:,} orders, {cycles} refresh cycles ...", flush=True)
        store = HistoryStore.open(work / f"tpch_{orders}", database="tpch")
        as_ofs = build_tpch(store, orders, cycles)
        chosen = sorted({as_ofs[0], as_ofs[len(as_ofs) // 2], as_ofs[-1]})
        label = f"tpch-{orders}"
        results["sizes"][label] = store.load_table("lineitem", as_ofs[-1]).num_rows
        results["rows"] += compare(store, work, list(TPCH_TABLES), TPCH_QUERIES, chosen, label, samples)
    if wide_versions:
        print(f"sql as of T: a wide table, {wide_live:,} live rows, {wide_versions:,} versions ...", flush=True)
        store = HistoryStore.open(work / "wide", database="wide")
        as_ofs = build_wide(store, wide_live, wide_versions)
        label = "wide"
        results["sizes"][label] = store.load_table("wide", as_ofs[-1]).num_rows
        results["rows"] += compare(store, work, ["wide"], WIDE_QUERIES, [as_ofs[1], as_ofs[-1]], label, samples)
    return results


def report(results: dict[str, Any], when: str, commit: str) -> str:
    rows = results["rows"]
    load = results.get("load")
    shared = f" Load average (1 min) {load[0]:.1f} at the start, {load[1]:.1f} at the end." if load else ""
    lines = [f"sql() as of T beside DuckDB on Parquet copies of the tables as of T; measured {when}, "
             f"commit {commit}; medians of interleaved runs, both sides warm, one process.{shared}", "",
             "| workload | query | as of | ours | DuckDB on copies | ratio | same answer | first at T | "
             "DuckDB on copies | first ratio | once: ours / DuckDB on copies |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        size = results["sizes"].get(r["workload"], 0)
        lines.append(f"| {r['workload']} ({size:,} rows) | {r['query']} | {r['as_of']} | "
                     f"{r['ours_s'] * 1000:.1f} ms | {r['duckdb_copy_s'] * 1000:.1f} ms | {r['ratio']:.2f}× | "
                     f"{'yes' if r['same_answer'] else 'NO'} | {r['first_s'] * 1000:.1f} ms | "
                     f"{r['first_copy_s'] * 1000:.1f} ms | {r['first_ratio']:.2f}× | "
                     f"{r['once_s'] * 1000:.1f} / {r['once_copy_s'] * 1000:.1f} ms |")
    if rows:
        worst = max(rows, key=lambda r: r["ratio"])
        geo = math.exp(statistics.fmean(math.log(r["ratio"]) for r in rows))
        lines += ["", f"Worst ratio {worst['ratio']:.2f}× ({worst['workload']} {worst['query']}), target ≤ 2×: "
                  f"{'meets target' if worst['ratio'] <= 2 else 'MISSES target'}. Geometric mean {geo:.2f}×, "
                  f"target ≤ 1.5×: {'meets target' if geo <= 1.5 else 'MISSES target'}. "
                  f"Answers equal on every query: {'yes' if all(r['same_answer'] for r in rows) else 'NO'}."]
        first = max(rows, key=lambda r: r["first_ratio"])
        first_geo = math.exp(statistics.fmean(math.log(r["first_ratio"]) for r in rows))
        lines += ["", f"First query at a T (what the process kept for T dropped before each timing): worst "
                  f"{first['first_ratio']:.2f}× ({first['workload']} {first['query']}), geometric mean "
                  f"{first_geo:.2f}×."]
        # the first query at each T is the first time anything is read for T's files; the very
        # first of a workload is also its state's first query (its sandbox made then)
        opening = [r for n, r in enumerate(rows) if n == 0 or (r["workload"], r["as_of"]) !=
                   (rows[n - 1]["workload"], rows[n - 1]["as_of"])]
        states = {r["workload"]: r for r in reversed(opening)}  # each workload's first row
        lines += ["", "Once (one timing each, the first time the process runs the query at T: nothing kept "
                  "for the files only T reads yet), each T's first query, ours against DuckDB's first run on "
                  "that T's copies: " +
                  "; ".join(f"{r['workload']} {r['query']} at {r['as_of']}"
                            f"{' (the state’s first query)' if states[r['workload']] is r else ''}"
                            f" {r['once_s'] * 1000:.0f} ms / {r['once_copy_s'] * 1000:.0f} ms" for r in opening) + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a few minutes)")
    parser.add_argument("--tpch-orders", type=int, nargs="*", default=[15_000, 60_000])
    parser.add_argument("--cycles", type=int, default=4)
    parser.add_argument("--wide-live", type=int, default=90_000)
    parser.add_argument("--wide-versions", type=int, default=400_000)
    parser.add_argument("--samples", type=int, default=15)
    parser.add_argument("--out", default=None,
                        help="results file name under bench/results/ (sql_as_of, or sql_as_of_quick with --quick)")
    args = parser.parse_args(argv)
    if args.quick:
        args.tpch_orders, args.cycles, args.samples = [2000, 8000], 2, 9
        args.wide_live, args.wide_versions = 20_000, 80_000
    if args.out is None:
        args.out = "sql_as_of_quick" if args.quick else "sql_as_of"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip() or "unknown"
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    start_load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        results = run(Path(tmp), args.tpch_orders, args.cycles, args.wide_live, args.wide_versions, args.samples)
    results["load"] = [start_load, os.getloadavg()[0]]  # the machine may be shared: how busy it was
    table = report(results, when, commit)
    print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps({"when": when, "commit": commit, **results}, indent=2))
    (RESULTS / f"{args.out}.md").write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
