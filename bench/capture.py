"""Capture throughput: rows/s of ``history-pipeline capture postgres`` on pgbench's accounts, beside
psycopg's own ``COPY ... TO STDOUT`` of the same rows in the same run (the floor any capture pays to
read them from the server).

Two paths are measured on a throwaway PostgreSQL (started here, stopped at the end):

* snapshot: ``pgbench -i`` loads the tables before the capture is set up, so they arrive as the
  capture's snapshot of existing tables;
* stream: the capture is set up first, then ``pgbench -i`` loads the tables, which arrive as the
  logical replication stream's inserts.

A capture's seconds include the server's own part (the snapshot function, logical decoding), as a
user waits for them.

    python -m bench.capture                 # scale 1: 100,000 accounts
    python -m bench.capture --scale 2 --profile
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench import write_results
from history_pipeline import HistoryStore
from history_pipeline.capture.model import CaptureOptions
from history_pipeline.capture.postgres import CaptureConfig, run_capture
from history_pipeline_tests.pg_support import PostgresServer, pg_bin, postgres_server

_EXCLUDE = ("pgbench_history",)  # no key; empty after pgbench -i anyway


def _pgbench_init(server: PostgresServer, dbname: str, scale: int) -> None:
    client = ["-h", "127.0.0.1", "-p", str(server.port), "-U", "postgres"]
    subprocess.run([pg_bin("pgbench"), "-i", "-I", "dtgp", "-s", str(scale), "-q", *client, dbname], check=True,
                   capture_output=True)


def _copy_baseline(server: PostgresServer, dbname: str) -> tuple[int, float]:
    """psycopg's ``COPY pgbench_accounts TO STDOUT``: rows read and seconds."""
    with server.connect(dbname) as conn:
        started = time.perf_counter()
        rows = 0
        with conn.cursor().copy("COPY pgbench_accounts TO STDOUT") as copy:
            for block in copy:
                rows += bytes(block).count(b"\n")
        return rows, time.perf_counter() - started


def _capture(server: PostgresServer, dbname: str, root: Path, profile: bool) -> tuple[int, float]:
    """One capture run until caught up: rows inserted and seconds."""
    store = HistoryStore.open(root, database=dbname)
    keys = {"pgbench_accounts": "aid", "pgbench_branches": "bid", "pgbench_tellers": "tid"}
    config = CaptureConfig(dsn=server.dsn(dbname), slot="bench",
                           options=CaptureOptions(keys=keys, exclude=_EXCLUDE))
    profiler = cProfile.Profile() if profile else None
    started = time.perf_counter()
    if profiler:
        profiler.enable()
    progress = run_capture(store, config, once=True)
    if profiler:
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    return progress.inserts, time.perf_counter() - started


def measure(server: PostgresServer, work: Path, scale: int, profile: bool) -> list[dict[str, Any]]:
    """The snapshot and stream paths, each beside the COPY baseline of the same rows."""
    out = []
    for path in ("snapshot", "stream"):
        dbname = f"bench_{path}_{uuid.uuid4().hex[:8]}"
        with server.connect() as admin:
            admin.execute(f"CREATE DATABASE {dbname}")
        root = work / dbname
        if path == "stream":
            _capture(server, dbname, root, profile=False)  # set up before the load: its rows are streamed
        _pgbench_init(server, dbname, scale)
        rows, seconds = _capture(server, dbname, root, profile)
        copied, copy_seconds = _copy_baseline(server, dbname)
        out.append({"path": path, "rows": rows, "capture_s": round(seconds, 3),
                    "rows_per_s": round(rows / seconds), "copy_rows": copied, "copy_s": round(copy_seconds, 3),
                    "copy_rows_per_s": round(copied / copy_seconds), "ratio": round(seconds / copy_seconds, 1)})
        with server.connect() as admin:
            admin.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                          "WHERE database = %s", (dbname,))
            admin.execute(f"DROP DATABASE {dbname} WITH (FORCE)")
    return out


def table(results: list[dict[str, Any]]) -> str:
    """The results as a Markdown table."""
    lines = ["| path | rows | capture s | rows/s | COPY TO STDOUT s | COPY rows/s | capture / COPY |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['path']} | {r['rows']:,} | {r['capture_s']} | {r['rows_per_s']:,} | {r['copy_s']} | "
                     f"{r['copy_rows_per_s']:,} | {r['ratio']}x |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=1, help="pgbench scale (100,000 accounts each)")
    parser.add_argument("--profile", action="store_true", help="print the capture's profile (slower)")
    parser.add_argument("--no-save", action="store_true", help="do not write bench/results/capture.*")
    args = parser.parse_args()
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp, \
            postgres_server("wal_level=logical", "max_replication_slots=4", "max_wal_senders=4") as server:
        results = measure(server, Path(tmp), args.scale, args.profile)
    text = table(results) + f"\nLoad average at the start: {load[0]:.1f}, {load[1]:.1f}, {load[2]:.1f} (2 cores).\n"
    print(text)
    if not args.no_save and not args.profile:
        write_results("capture", {"results": results, "loadavg": load}, text)


if __name__ == "__main__":
    main()
