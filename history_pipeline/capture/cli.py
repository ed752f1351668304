"""``history-pipeline capture postgres``: the capture loop from a terminal."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def _key_option(text: str) -> tuple[str, str]:
    table, sep, column = text.partition("=")
    if not sep or not table or not column:
        raise argparse.ArgumentTypeError(f"--key takes TABLE=COLUMN, got {text!r}")
    return table, column


def cmd_capture_postgres(args: argparse.Namespace) -> int:
    """Capture a PostgreSQL database into the store's WAL (see README "Capturing a PostgreSQL database")."""
    from history_pipeline.capture.model import CaptureOptions
    from history_pipeline.capture.postgres import CaptureConfig, default_slot_name, run_capture
    from history_pipeline.store import HistoryStore

    store = HistoryStore.open(args.root, database=args.database)
    config = CaptureConfig(
        dsn=args.dsn,
        slot=args.slot or default_slot_name(args.database),
        publication=args.publication,
        options=CaptureOptions(
            schemas=tuple(args.schema or ["public"]), keys=dict(args.key or []), text_fallback=args.text_fallback,
            exclude=tuple(args.exclude or []),
        ),
    )

    def report(progress: Any) -> None:
        print(progress.line(), file=sys.stderr, flush=True)

    try:
        progress = run_capture(
            store,
            config,
            once=args.once,
            max_seconds=args.max_seconds,
            max_transactions=args.max_transactions,
            on_progress=report,
        )
    except KeyboardInterrupt:
        print("stopped; the next run resumes after the last written transaction", file=sys.stderr)
        return 0
    print(progress.line())
    return 0


def register_capture(subparsers: Any) -> None:
    """Add ``capture postgres`` to the CLI's subcommands."""
    capture = subparsers.add_parser("capture", help="capture a live database's changes into the WAL")
    sources = capture.add_subparsers(dest="source", required=True)
    p = sources.add_parser(
        "postgres",
        help="capture a PostgreSQL database (logical decoding; needs wal_level=logical and a superuser)",
    )
    p.add_argument("--dsn", required=True, help="libpq connection string, e.g. 'host=127.0.0.1 dbname=app'")
    p.add_argument("--slot", default=None, help="replication slot name (default: history_<database>)")
    p.add_argument("--publication", default="history_capture", help="PostgreSQL publication the slot reads")
    p.add_argument("--schema", action="append", help="PostgreSQL schema to capture (repeatable; default public)")
    p.add_argument("--key", action="append", type=_key_option, metavar="TABLE=COLUMN",
                   help="integer column used as the synthetic key of a table without a single-column primary key")
    p.add_argument("--exclude", action="append", metavar="TABLE", help="a table not to capture (repeatable)")
    p.add_argument("--text-fallback", action="store_true",
                   help="capture columns of types outside the contract as TEXT (their text output)")
    p.add_argument("--once", action="store_true", help="stop when caught up")
    p.add_argument("--max-seconds", type=float, default=None, help="stop after this long")
    p.add_argument("--max-transactions", type=int, default=None, help="stop after this many transactions")
    p.set_defaults(func=cmd_capture_postgres)
