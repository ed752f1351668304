"""``diff`` of two states of a table against DuckDB joining Parquet copies of both states.

    python -m bench.diff                     # 300,000 live rows, a few minutes on 2 cores
    python -m bench.diff --live-rows 50000   # smaller

One table of the benchmark workload's columns: ``live_rows`` inserted, then a tenth of them
updated, a hundredth deleted and as many inserted. The diff between the state after the inserts
and the last one is timed (warm, median of ``repeat``) as ``diff_reader`` (Arrow batches),
``diff`` (the Python dict, its changed rows as Python values) and through a HistoryService
(``HistoryClient.diff_reader``), beside the baseline: the two states written as Parquet files
(exactly the live rows) and DuckDB's FULL OUTER JOIN of them on the key, keeping the keys
inserted, deleted or with a column IS DISTINCT FROM, in the same order as the answer
(kind, key), read into Arrow. Writes bench/results/diff.json and diff.md.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.parquet as pq

from bench import write_results
from bench.timing import repeated
from bench.workload import COLUMNS, _value
from history_pipeline import HistoryStore, StoreSettings
from history_pipeline.client import connect
from history_pipeline.service.auth import Tenant, token_digest
from history_pipeline.service.config import ServerConfig
from history_pipeline.service.server import HistoryServer

TABLE = "table_0"
UUID = "00000000-0000-4000-8000-000000000000"
TOKEN = "bench-token"
TARGET = 2.0


def history(live_rows: int, seed: int = 7) -> Iterator[dict[str, Any]]:
    """The event stream: inserts of ``live_rows`` keys, then updates (10 %), deletes and inserts (1 % each)."""
    rng = random.Random(seed)
    cols = {f"00000000-{j:04d}-4000-8000-000000000000": (name, ty) for j, (name, ty) in enumerate(COLUMNS)}
    yield {"op": "create_table", "t": 1, "table_uuid": UUID, "table_name": TABLE,
           "columns": [{"column_uuid": c, "column_name": n, "data_type": ty} for c, (n, ty) in cols.items()]}
    t = 1
    for key in range(1, live_rows + 1):
        if key % 10_000 == 1:
            t += 1
        yield {"op": "insert", "t": t, "table_uuid": UUID, "key": key,
               "values": {c: _value(rng, ty, key) for c, (_, ty) in cols.items()}}
    yield {"op": "close", "t": t}
    keys = rng.sample(range(1, live_rows + 1), live_rows // 10 + live_rows // 100)
    updated, deleted = keys[: live_rows // 10], keys[live_rows // 10:]
    t += 1
    for n, key in enumerate(updated):
        c = rng.choice(sorted(cols))
        yield {"op": "update", "t": t + n // 10_000, "table_uuid": UUID, "key": key,
               "values": {c: _value(rng, cols[c][1], key + 1)}}
    t += len(updated) // 10_000 + 1
    for key in deleted:
        yield {"op": "delete", "t": t, "table_uuid": UUID, "key": key}
    for key in range(live_rows + 1, live_rows + 1 + live_rows // 100):
        yield {"op": "insert", "t": t, "table_uuid": UUID, "key": key,
               "values": {c: _value(rng, ty, key) for c, (_, ty) in cols.items()}}
    yield {"op": "close", "t": t}


def bench_diff(work: Path, live_rows: int, repeat: int = 3) -> dict[str, Any]:
    """Build the history, then time the diff three ways and the baseline join."""
    store = HistoryStore.open(work / "root", database="bench_diff", settings=StoreSettings(spark_master=None))
    start = time.perf_counter()
    first_state = None
    with store.wal_writer() as wal:
        for event in history(live_rows):
            wal.append(event)
            if event["op"] == "close":
                wal.seal()
                first_state = first_state or event["t"] + 1
    store.compact(spark=False)
    build_s = time.perf_counter() - start
    t1, t2 = first_state, store.frontier + 1

    for name, as_of in (("before", t1), ("after", t2)):
        pq.write_table(store.load_table(TABLE, as_of), work / f"{name}.parquet")
    columns = [name for name, _ in COLUMNS]
    distinct = " OR ".join(f'b."{c}" IS DISTINCT FROM a."{c}"' for c in columns)
    baseline_sql = (
        "SELECT CASE WHEN b.synthetic_key IS NULL THEN 0 WHEN a.synthetic_key IS NULL THEN 1 ELSE 2 END AS kind, "
        "coalesce(a.synthetic_key, b.synthetic_key) AS key, "
        + ", ".join(f'b."{c}" AS "b_{c}"' for c in columns) + ", "
        + ", ".join(f'a."{c}" AS "a_{c}"' for c in columns)
        + f" FROM read_parquet('{work / 'before.parquet'}') b"
        f" FULL OUTER JOIN read_parquet('{work / 'after.parquet'}') a"
        f" ON b.synthetic_key = a.synthetic_key WHERE b.synthetic_key IS NULL OR a.synthetic_key IS NULL OR {distinct}"
        " ORDER BY kind, key"
    )
    con = duckdb.connect()
    config = ServerConfig(root=str(work / "root"), tenants=(Tenant("bench", "bench_diff", token_digest(TOKEN)),),
                          port=0, workers=1)
    with HistoryServer(config) as server, connect(server.url, TOKEN) as client:
        # a warm-up round, then the four ways take turns round by round
        baseline, reader, as_dict, service = repeated([
            lambda: con.sql(baseline_sql).to_arrow_table(),
            lambda: store.diff_reader(TABLE, t1, t2).read_all(),
            lambda: store.diff(TABLE, t1, t2),
            lambda: client.diff_reader(TABLE, t1, t2).read_all(),
        ], repeat)
    baseline_s, reader_s, dict_s, service_s = (s.median_s for s in (baseline, reader, as_dict, service))
    answer = reader.last
    counts = {kind: len(as_dict.last[kind]) for kind in ("inserted", "deleted", "changed")}
    assert answer.num_rows == baseline.last.num_rows == sum(counts.values()), (answer.num_rows, baseline.last.num_rows)
    assert answer.column("key").to_pylist() == baseline.last.column("key").to_pylist()
    assert service.last.num_rows == answer.num_rows
    return {
        "live_rows": live_rows, "build_s": build_s, "from": t1, "to": t2, "counts": counts,
        "baseline_join_s": baseline_s, "diff_reader_s": reader_s, "diff_dict_s": dict_s,
        "service_diff_reader_s": service_s,
        "ratio": reader_s / baseline_s, "target": TARGET,
    }


def report(r: dict[str, Any]) -> str:
    """A Markdown table of the figures beside the baseline."""
    verdict = "meets" if r["ratio"] <= r["target"] else "MISSES"
    c = r["counts"]
    lines = [
        f"## diff of two states, {r['live_rows']:,} live rows ({c['inserted']:,} inserted, {c['deleted']:,} deleted, "
        f"{c['changed']:,} changed)",
        "",
        f"{r['date']}, commit {r['commit']}, `python -m bench.diff --live-rows {r['live_rows']}`",
        "",
        "| measure | median (s) | / baseline |",
        "| --- | ---: | ---: |",
        f"| baseline: DuckDB FULL OUTER JOIN of Parquet copies of both states | {r['baseline_join_s']:.3f} | 1.00x |",
        f"| `diff_reader(...).read_all()` (Arrow) | {r['diff_reader_s']:.3f} | {r['ratio']:.2f}x |",
        f"| `diff(...)` (Python dict of the changed rows) | {r['diff_dict_s']:.3f} | "
        f"{r['diff_dict_s'] / r['baseline_join_s']:.2f}x |",
        f"| `HistoryClient.diff_reader(...)` through the service | {r['service_diff_reader_s']:.3f} | "
        f"{r['service_diff_reader_s'] / r['baseline_join_s']:.2f}x |",
        "",
        f"Target: `diff_reader` <= {r['target']:g}x the baseline: {verdict} ({r['ratio']:.2f}x).",
        "The baseline reads files holding exactly each state; the diff reconstructs both states from the",
        "history's files as of each timestamp, then joins them the same way.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--live-rows", type=int, default=300_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default="diff", help="results file name (under bench/results/)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        results = bench_diff(Path(tmp), args.live_rows, args.repeat)
    results["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    results["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                       cwd=Path(__file__).parent).stdout.strip() or "unknown"
    text = report(results)
    print(text)
    write_results(args.out, results, text, dated=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
