"""``history-pipeline``: the main operations from a terminal.

Exit codes: 0 success, 1 a HistoryError (one clear line on stderr; ``--debug``
for the stack trace), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from history_pipeline.errors import HistoryError
from history_pipeline.store import HistoryStore


def _store(args: argparse.Namespace) -> HistoryStore:
    return HistoryStore.open(args.root, database=args.database)


def _print_table(table: pa.Table, fmt: str) -> None:
    if fmt == "json":
        for row in table.to_pylist():
            print(json.dumps(row, default=str))
    elif fmt == "csv":
        import pyarrow.csv as pacsv

        sink = pa.BufferOutputStream()
        pacsv.write_csv(_stringify(table), sink)
        sys.stdout.write(sink.getvalue().to_pybytes().decode())
    elif fmt == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, sys.stdout.buffer)
    else:
        rows = [[_cell(v) for v in row.values()] for row in table.to_pylist()]
        widths = [max([len(n)] + [len(r[i]) for r in rows]) for i, n in enumerate(table.column_names)]
        print("  ".join(n.ljust(w) for n, w in zip(table.column_names, widths, strict=True)))
        print("  ".join("-" * w for w in widths))
        for r in rows:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
        print(f"({table.num_rows} rows)")


def _stringify(table: pa.Table) -> pa.Table:
    return pa.table({n: pa.array([_cell(v) for v in table.column(n).to_pylist()]) for n in table.column_names})


def _cell(value: Any) -> str:
    return "NULL" if value is None else str(value)


def cmd_append(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    source = open(args.file, encoding="utf-8") if args.file != "-" else sys.stdin
    count = 0
    with _store(args).wal_writer() as wal:
        for line in tqdm(source, desc="appending", unit=" events", disable=not sys.stderr.isatty()):
            if line.strip():
                wal.append_line(line)
                count += 1
        if args.seal:
            wal.seal()
    print(f"appended {count} events")
    return 0


def cmd_compact(args: argparse.Namespace) -> int:
    spark = False if args.in_process else None  # None: the store's Spark (local[*] by default)
    from tqdm import tqdm

    from history_pipeline.wal import SegmentState

    store = _store(args)
    pending = len(store.segments(SegmentState.SEALED))
    with tqdm(total=pending, desc="compacting", unit=" segments", disable=not sys.stderr.isatty()) as bar:
        summary = store.compact(spark=spark, on_step=lambda step: bar.update(1) if step == "committed" else None)
    print(json.dumps(summary.as_dict(), indent=2))
    return 0


def cmd_sql(args: argparse.Namespace) -> int:
    _print_table(_store(args).sql(args.query, as_of=args.as_of), args.format)
    return 0


def cmd_load(args: argparse.Namespace) -> int:
    _print_table(_store(args).load_table(args.table, as_of=args.as_of), args.format)
    return 0


def cmd_row_history(args: argparse.Namespace) -> int:
    for version in _store(args).row_history(args.table, args.key):
        print(json.dumps(version, default=str))
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    print(json.dumps(_store(args).diff(args.table, from_=args.from_, to=args.to), default=str, indent=2))
    return 0


def cmd_release(args: argparse.Namespace) -> int:
    """An operator's act: put a quarantined segment (after fixing it) back in line for compaction."""
    store = _store(args)
    ref = store.release_segment(args.segment_id)
    print(f"segment {ref.name} is sealed again and waits for compaction")
    return 0


def cmd_segments(args: argparse.Namespace) -> int:
    for ref in _store(args).segments():
        print(f"{ref.name}  {ref.state.value:12s} {ref.path}")
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    print(json.dumps(_store(args).merge().as_dict(), indent=2))
    return 0


def cmd_retain(args: argparse.Namespace) -> int:
    print(json.dumps(_store(args).retain(args.purge_before, cold_tier=args.cold_tier).as_dict(), indent=2))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    manifest = _store(args).export(as_of=args.as_of, to=args.to)
    print(json.dumps({"as_of": manifest["as_of"], "tables": [t["table_name"] for t in manifest["tables"]]}))
    return 0


def cmd_load_cold_tier(args: argparse.Namespace) -> int:
    print(f"earliest answerable as_of is now {_store(args).load_cold_tier(args.cold_tier)}")
    return 0


def cmd_cleanup(args: argparse.Namespace) -> int:
    from datetime import timedelta

    print(json.dumps(_store(args).cleanup(grace=timedelta(seconds=args.grace_seconds)).as_dict()))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    problems = _store(args).verify()
    for problem in problems:
        print(problem)
    print(f"{len(problems)} problem(s)")
    return 1 if problems else 0


def cmd_rebuild(args: argparse.Namespace) -> int:
    state = _store(args).rebuild_catalog()
    print(f"rebuilt: {len(state.files)} live files, frontier {state.frontier}")
    return 0


def _write_sample(store: HistoryStore) -> None:
    from history_pipeline.sample import sample_events

    if not store.segments() and store.frontier < 0:
        with store.wal_writer() as wal:
            for event in sample_events():
                wal.append(event)
                if event["op"] == "close":
                    wal.seal()
    print(f"WAL of {store.database} under {store.wal_dir}:")
    for ref in store.segments():
        print(f"  segment {ref.name}  {ref.state.value:8s} {ref.path.stat().st_size:>8d} bytes")


def cmd_sample(args: argparse.Namespace) -> int:
    """Write the sample workload into the WAL (sealed segments) and show what was written."""
    _write_sample(_store(args))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Write the sample workload into the WAL, compact it, and show some answers."""
    store = _store(args)
    _write_sample(store)
    summary = store.compact()
    print("compaction:", json.dumps(summary.as_dict()))
    frontier = store.frontier
    print(f"frontier = {frontier}")
    for table in store.get_catalog(frontier + 1):
        print(f"  table {table.table_name}: {[c.column_name for c in table.columns]}")
    print("orders by state, as of now:")
    _print_table(
        store.sql('SELECT state, count(*) AS n, sum(amount) AS total FROM orders GROUP BY state ORDER BY state',
                  as_of=frontier + 1),
        "table",
    )
    print("history of order 10000:")
    for version in store.row_history("orders", 10_000)[:5]:
        print("  ", json.dumps(version, default=str))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="history-pipeline", description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="data", help="storage root: a path or s3://bucket/prefix")
    parser.add_argument("--database", default="tenant_a")
    parser.add_argument("--debug", action="store_true", help="show stack traces")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("append", help="append events from a JSON-lines file or stdin")
    p.add_argument("file", nargs="?", default="-")
    p.add_argument("--seal", action="store_true", help="seal the segment afterwards")
    p.set_defaults(func=cmd_append)

    p = sub.add_parser("compact", help="compact every sealed segment")
    p.add_argument("--in-process", action="store_true", help="run the compaction tasks without Spark")
    p.set_defaults(func=cmd_compact)

    for name, func, help_text in (("sql", cmd_sql, "run read-only SQL as of T"), ("load", cmd_load, "a table as of T")):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("query" if name == "sql" else "table")
        p.add_argument("--as-of", type=int, required=True)
        p.add_argument("--format", choices=["table", "csv", "json", "parquet"], default="table")
        p.set_defaults(func=func)

    p = sub.add_parser("row-history", help="every version of a row")
    p.add_argument("table")
    p.add_argument("key", type=int)
    p.set_defaults(func=cmd_row_history)

    p = sub.add_parser("diff", help="keys inserted, deleted and changed between two timestamps")
    p.add_argument("table")
    p.add_argument("--from", dest="from_", type=int, required=True)
    p.add_argument("--to", type=int, required=True)
    p.set_defaults(func=cmd_diff)

    sub.add_parser("merge", help="merge small files").set_defaults(func=cmd_merge)
    p = sub.add_parser("retain", help="purge history before a timestamp")
    p.add_argument("purge_before", type=int)
    p.add_argument("--cold-tier", default=None, help="keep the purged files there first (path or s3://)")
    p.set_defaults(func=cmd_retain)
    p = sub.add_parser("export", help="export every table as of T")
    p.add_argument("--as-of", type=int, required=True)
    p.add_argument("--to", required=True)
    p.set_defaults(func=cmd_export)
    p = sub.add_parser("load-cold-tier", help="bring purged history back")
    p.add_argument("cold_tier")
    p.set_defaults(func=cmd_load_cold_tier)
    p = sub.add_parser("cleanup", help="delete tombstoned and orphan files past the grace period")
    p.add_argument("--grace-seconds", type=float, default=3600)
    p.set_defaults(func=cmd_cleanup)
    sub.add_parser("verify", help="check the catalog against its files").set_defaults(func=cmd_verify)
    sub.add_parser("rebuild-catalog", help="rebuild the catalog from Parquet files").set_defaults(func=cmd_rebuild)
    p = sub.add_parser("release", help="release a quarantined segment after fixing it")
    p.add_argument("segment_id", type=int)
    p.set_defaults(func=cmd_release)
    sub.add_parser("segments", help="list WAL segments and their states").set_defaults(func=cmd_segments)
    sub.add_parser("sample", help="write the sample workload into the WAL").set_defaults(func=cmd_sample)
    sub.add_parser("demo", help="write the sample workload, compact it, query it").set_defaults(func=cmd_demo)
    __import__("history_pipeline.service.cli", fromlist=["register_serve"]).register_serve(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except HistoryError as exc:
        if args.debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
