"""``history-pipeline serve``: run the HistoryService (registered into the main CLI's parser)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa

from history_pipeline.service.auth import new_token, token_digest
from history_pipeline.service.config import config_help


def register_serve(subparsers: Any) -> None:
    """Add the ``serve`` command to the ``history-pipeline`` subcommands."""
    p = subparsers.add_parser(
        "serve",
        help="serve FetchRow, LoadTable, GetCatalog, SQL, row history and diff over Arrow Flight",
        description="Run the HistoryService for the tenants of a TOML configuration; "
        "one line per request goes to stderr (time, tenant, call, rows, bytes or error, ms).",
        epilog=config_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", help="the server's TOML configuration (tenants, token digests, limits, TLS)")
    p.add_argument("--host", default=None, help="override the configured host")
    p.add_argument("--port", type=int, default=None, help="override the configured port (0: any free port)")
    p.add_argument("--workers", type=int, default=None, help="override the number of worker processes")
    p.add_argument("--tls-cert", default=None, help="PEM certificate chain (with --tls-key)")
    p.add_argument("--tls-key", default=None, help="PEM private key (with --tls-cert)")
    p.add_argument("--hash-token", action="store_true",
                   help="read a token on stdin, print the token_sha256 to configure, and exit")
    p.add_argument("--new-token", action="store_true",
                   help="print a fresh random token and its token_sha256, and exit")
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve until SIGINT or SIGTERM (or print a token digest)."""
    if args.new_token:
        token = new_token()
        print(f"token        {token}\ntoken_sha256 {token_digest(token)}")
        return 0
    if args.hash_token:
        print(token_digest(sys.stdin.readline().strip()))
        return 0
    if not args.config:
        print("error: serve needs --config <file.toml> (tenants and their token digests)", file=sys.stderr)
        return 2

    from history_pipeline.service.config import load_config
    from history_pipeline.service.server import HistoryServer

    try:
        config = load_config(args.config).with_overrides(
            host=args.host,
            port=args.port,
            workers=args.workers,
            tls_cert=Path(args.tls_cert).read_bytes() if args.tls_cert else None,
            tls_key=Path(args.tls_key).read_bytes() if args.tls_key else None,
        )
        server = HistoryServer(config, log=lambda line: print(line, file=sys.stderr, flush=True))
    except (ValueError, OSError, pa.ArrowException) as exc:
        # a configuration mistake, an unreadable file or a port in use: one line, not a trace
        print(f"error: cannot serve with {args.config}: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    print(f"serving {len(config.tenants)} tenant(s) of {config.root} on {server.url}", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        server.close()
    return 0
