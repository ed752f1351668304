"""A query through the Flight SQL endpoint (the ADBC Flight SQL driver) against the same query
in-process and through the service's own client, in the same run.

    python -m bench.flight_sql                      # modest size, about a minute on 2 cores
    python -m bench.flight_sql --live-rows 200000 --versions 1000000

Two statements as of the newest state: an aggregate (a small answer) and a full ``SELECT *`` of
the table (the answer's transfer dominates). Writes bench/results/flight_sql.json and flight_sql.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import adbc_driver_flightsql.dbapi as flight_sql_dbapi
import pyarrow as pa

from bench import provenance, write_results
from bench.timing import repeated
from bench.workload import Workload, write_workload
from history_pipeline import HistoryStore, StoreSettings
from history_pipeline.client import connect
from history_pipeline.service.auth import Tenant, token_digest
from history_pipeline.service.config import ServerConfig
from history_pipeline.service.server import HistoryServer

TOKEN = "bench-token"


def bench_flight_sql(work: Path, live_rows: int, versions: int, repeat: int = 5, workers: int = 2) -> dict[str, Any]:
    """Build a history, then time each statement in-process, through the own client and through ADBC."""
    store = HistoryStore.open(work / "flight_sql", database="bench_flight_sql",
                              settings=StoreSettings(spark_master=None))
    write_workload(store, Workload(tables=1, live_rows=live_rows, versions=versions, segment_events=50_000))
    store.compact(spark=False)
    as_of = store.frontier + 1
    (table,) = [d.table_name for d in store.get_catalog(as_of)]
    statements = {
        "aggregate": f'SELECT count(*) AS n, sum(qty) AS qty, max(price) AS price FROM "{table}"',
        "full table": f'SELECT * FROM "{table}"',
    }
    config = ServerConfig(root=str(work / "flight_sql"),
                          tenants=(Tenant("bench", "bench_flight_sql", token_digest(TOKEN)),), port=0,
                          workers=workers)
    results: dict[str, Any] = {"live_rows": live_rows, "versions": versions, "repeat": repeat,
                               "server_workers": workers, "statements": {}}
    with HistoryServer(config) as server, connect(server.url, TOKEN) as client, flight_sql_dbapi.connect(
        server.url, db_kwargs={"adbc.flight.sql.authorization_header": f"Bearer {TOKEN}"}
    ) as conn:
        def through_adbc(sql: str) -> pa.Table:
            with conn.cursor() as cursor:
                cursor.execute(sql)
                return cursor.fetch_arrow_table()

        for label, sql in statements.items():
            runs = {
                "in_process": lambda sql=sql: store.sql(sql, as_of),
                "service_client": lambda sql=sql: client.sql(sql, as_of),
                "adbc_flight_sql": lambda sql=sql: through_adbc(sql),
            }
            # one warm-up round: every worker started, files cached
            timed = dict(zip(runs, repeated(list(runs.values()), repeat), strict=True))
            answers = [samples.last for samples in timed.values()]
            rows = answers[0].num_rows
            assert all(a.num_rows == rows and a.schema.equals(answers[0].schema) for a in answers)
            results["statements"][label] = {"sql": sql, "rows": rows, "bytes": answers[0].nbytes,
                                            **{name: samples.median_s for name, samples in timed.items()}}
    return results


def report(r: dict[str, Any]) -> str:
    """A Markdown table: each statement in-process, through the own client and through ADBC."""
    lines = [
        f"## A statement through Flight SQL (ADBC) vs in-process ({r['live_rows']:,} live rows, "
        f"{r['versions']:,} versions, {r['server_workers']} server workers, median of {r['repeat']})",
        "",
        "| statement | rows | in-process (s) | service client (s) | ADBC Flight SQL (s) | ADBC / in-process |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, s in r["statements"].items():
        lines.append(
            f"| {label} | {s['rows']:,} | {s['in_process']:.3f} | {s['service_client']:.3f} | "
            f"{s['adbc_flight_sql']:.3f} | {s['adbc_flight_sql'] / s['in_process']:.2f}x |"
        )
    lines += [
        "",
        "In-process calls HistoryStore.sql in the benchmark's process; both remote columns go through a",
        "server on 127.0.0.1 (in this process, worker processes behind it), so no network latency is included.",
        "The Flight SQL answer runs the statement at GetFlightInfo, then streams it at DoGet (two calls).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--live-rows", type=int, default=20_000)
    parser.add_argument("--versions", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default="flight_sql", help="results file name (under bench/results/)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        results = bench_flight_sql(Path(tmp), args.live_rows, args.versions, args.repeat)
    text = report(results)
    print(text)
    results["measured"] = provenance()
    write_results(args.out, results, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
