"""The change feed: changes delivered per second, and the cost of resuming from a cursor, on a long
history, each beside DuckDB reading a Parquet file that holds exactly the changes delivered
(written here from the feed's own answer, so both deliver the same rows in (t, key) order).

The history is built as ``bench.history`` builds it for the read path (one t per version, updates
in random key order, snapshots by the store's policy). Resuming is measured from a cursor near the
frontier and from one in the middle of the history (a closed interval), for a few window sizes: the
cost should follow the changes delivered, not the history's length.

    python -m bench.changes --quick
    python -m bench.changes --live-rows 1000000 --versions 10000000
    python -m bench.changes --root DIR        # keeps the history in DIR and reuses it next time
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from bench import write_results
from bench.history import build_history
from bench.read_path import median_time
from history_pipeline import HistoryStore, StoreSettings


def delivered(store: HistoryStore, since: int, until: int) -> pa.Table:
    """Every change in [since, until) read to the end, as one table (one table's row changes here)."""
    batches = [b.records for b in store.changes(since=since, until=until)]
    return pa.Table.from_batches(batches)


def answer_file(rows: pa.Table, path: Path) -> Path:
    """The changes as a Parquet file of their own (the baseline reads exactly the answer)."""
    pq.write_table(rows, path)
    return path


def baseline(path: Path) -> Callable[[], Any]:
    con = duckdb.connect(":memory:")
    return lambda: con.sql(f"SELECT * FROM read_parquet('{path}') ORDER BY t, key").to_arrow_table()


def measure(store: HistoryStore, work: Path, label: str, since: int, until: int, repeat: int) -> dict[str, Any]:
    rows = delivered(store, since, until)  # warm, and the answer the baseline reads
    ours = median_time(lambda: delivered(store, since, until), repeat)
    path = answer_file(rows, work / f"answer_{label}_{since}.parquet")
    base = median_time(baseline(path), repeat)
    return {"label": label, "since": since, "until": until, "changes": rows.num_rows, "ours_s": ours,
            "baseline_s": base, "ratio": ours / base if base else None,
            "changes_per_s": rows.num_rows / ours if ours else None}


def run(work: Path, live_rows: int, versions: int, batch: int, windows: list[int], repeat: int,
        root: Path | None = None) -> dict[str, Any]:
    """Build the history (under ``root`` unless one is kept there, else in ``work``), then measure."""
    home = root or work / "history"
    spec = home / "history.json"
    if spec.exists():
        kept = json.loads(spec.read_text())
        store = HistoryStore.open(home, database="bench", create=False, settings=StoreSettings(spark_master=None))
        live_rows, versions, frontier = kept["live_rows"], kept["versions"], kept["frontier"]
    else:
        store = HistoryStore.open(home, database="bench",
                                  settings=StoreSettings(snapshot_min_versions=live_rows, spark_master=None))
        print(f"changes: building {versions:,} versions over {live_rows:,} keys ...", flush=True)
        frontier = build_history(store, live_rows, versions, batch).frontier
        if root is not None:
            spec.write_text(json.dumps({"live_rows": live_rows, "versions": versions, "batch": batch,
                                        "frontier": frontier}))
    end = frontier + 1
    middle = end // 2
    results: dict[str, Any] = {"live_rows": live_rows, "versions": versions, "measures": [],
                               "load": " ".join(f"{x:.1f}" for x in os.getloadavg())}
    for window in windows:
        for label, at in (("latest", end - window), ("middle", middle)):
            print(f"changes: {window:,} changes from the {label} cursor ...", flush=True)
            results["measures"].append(measure(store, work, label, max(2, at), min(end, at + window), repeat))
    results["load_after"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
    return results


def report(results: dict[str, Any]) -> str:
    lines = ["| measure | ours | baseline (same run) | ratio | changes/s |", "|---|---|---|---|---|"]
    for m in results["measures"]:
        lines.append(
            f"| changes(since={m['since']:,}) to {m['until']:,}: {m['changes']:,} changes, cursor at the "
            f"{m['label']} point of {results['versions']:,} versions over {results['live_rows']:,} keys | "
            f"{m['ours_s'] * 1000:.1f} ms | DuckDB reading the answer file in (t, key) order "
            f"{m['baseline_s'] * 1000:.1f} ms | {m['ratio']:.2f}× | {m['changes_per_s']:,.0f} |")
    loads = f"Load average (1, 5, 15 min) before: {results.get('load', '?')}; after: {results.get('load_after', '?')}."
    return "\n".join(lines) + "\n\n" + loads + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a minute)")
    parser.add_argument("--live-rows", type=int, default=1_000_000)
    parser.add_argument("--versions", type=int, default=10_000_000)
    parser.add_argument("--batch", type=int, default=1_000_000)
    parser.add_argument("--windows", type=int, nargs="*", default=[1_000, 100_000, 1_000_000])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default="changes", help="results file name (under bench/results/)")
    parser.add_argument("--root", help="where the history is kept (built there when absent); default: a temp dir")
    args = parser.parse_args(argv)
    if args.quick:
        args.live_rows, args.versions, args.batch, args.windows = 50_000, 500_000, 50_000, [1_000, 100_000]
    with tempfile.TemporaryDirectory() as tmp:
        results = run(Path(tmp), args.live_rows, args.versions, args.batch, args.windows, args.repeat,
                      Path(args.root) if args.root else None)
    table = report(results)
    print(table)
    write_results(args.out, results, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
