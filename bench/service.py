"""The HistoryService over the network against the same calls in-process.

    python -m bench.service                 # modest size, about a minute on 2 cores
    python -m bench.service --live-rows 100000 --versions 1000000

FetchRow p50/p99 (one request at a time, and requests/s with several client threads) and
LoadTable throughput, each through a server on 127.0.0.1 (in this process, worker processes
behind it) and through ``HistoryStore`` directly. Writes bench/results/service.json and
service.md.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import write_results
from bench.timing import Samples, interleaved, repeated
from bench.workload import Workload, write_workload
from history_pipeline import HistoryStore, StoreSettings
from history_pipeline.client import connect
from history_pipeline.service.auth import Tenant, token_digest
from history_pipeline.service.config import ServerConfig
from history_pipeline.service.server import HistoryServer

TABLE = "00000000-0000-4000-8000-000000000000"  # the workload's first table, by uuid (it is renamed)
TOKEN = "bench-token"


def _parallel_lookups(fetch: Callable[[int], Any], keys: list[int], threads: int) -> float:
    """Requests per second with ``threads`` callers splitting ``keys``."""
    def run(part: list[int]) -> None:
        for key in part:
            fetch(key)

    workers = [threading.Thread(target=run, args=(keys[i::threads],)) for i in range(threads)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return len(keys) / (time.perf_counter() - start)


def _loads(samples: Samples) -> dict[str, float]:
    median, table = samples.median_s, samples.last
    return {"load_table_s": median, "load_table_rows_per_s": table.num_rows / median,
            "load_table_mb_per_s": table.nbytes / median / 1e6, "rows": table.num_rows, "bytes": table.nbytes}


def bench_service(work: Path, live_rows: int, versions: int, lookups: int = 300, loads: int = 5,
                  workers: int = 2, threads: int = 4) -> dict[str, Any]:
    """Build a history, then time FetchRow and LoadTable locally and through a server."""
    store = HistoryStore.open(work / "service", database="bench_service", settings=StoreSettings(spark_master=None))
    start = time.perf_counter()
    write_workload(store, Workload(tables=1, live_rows=live_rows, versions=versions, segment_events=50_000))
    store.compact(spark=False)
    build_s = time.perf_counter() - start
    as_of = store.frontier + 1
    live = store.load_table(TABLE, as_of).column("synthetic_key").to_pylist()
    rng = random.Random(5)
    keys = [rng.choice(live) for _ in range(lookups)]
    results: dict[str, Any] = {"live_rows": len(live), "versions": versions, "build_s": build_s,
                               "lookups": lookups, "client_threads": threads, "server_workers": workers}

    store.fetch_row(TABLE, keys[0], as_of)  # warm
    config = ServerConfig(root=str(work / "service"), tenants=(Tenant("bench", "bench_service", token_digest(TOKEN)),),
                          port=0, workers=workers)
    with HistoryServer(config) as server, connect(server.url, TOKEN) as client:
        for key in keys[: workers * 4]:  # every worker started and warm
            client.fetch_row(TABLE, key, as_of)
        assert client.fetch_row(TABLE, keys[0], as_of) == store.fetch_row(TABLE, keys[0], as_of)

        def local_fetch(key: int) -> Any:
            return store.fetch_row(TABLE, key, as_of)

        def remote_fetch(key: int) -> Any:
            return client.fetch_row(TABLE, key, as_of)

        # in-process and through the server take turns key by key (the server's cache is its own)
        fetches = interleaved([local_fetch, remote_fetch], keys)
        local, remote = ({f"fetch_row_{name}": v for name, v in f.percentiles().items()} for f in fetches)
        local["fetch_row_per_s_parallel"] = _parallel_lookups(local_fetch, keys, threads)
        remote["fetch_row_per_s_parallel"] = _parallel_lookups(remote_fetch, keys, threads)
        local_loads, remote_loads = repeated([lambda: store.load_table(TABLE, as_of),
                                              lambda: client.load_table(TABLE, as_of)], loads, warmup=0)
        local.update(_loads(local_loads))
        remote.update(_loads(remote_loads))
    results["in_process"] = local
    results["server"] = remote
    return results


def report(r: dict[str, Any]) -> str:
    """A Markdown table of the figures, server beside in-process."""
    local, remote = r["in_process"], r["server"]
    lines = [
        f"## HistoryService over Arrow Flight vs in-process ({r['live_rows']:,} live rows, "
        f"{r['versions']:,} versions, {r['server_workers']} server workers)",
        "",
        "| measure | in-process | through the server | ratio |",
        "| --- | ---: | ---: | ---: |",
    ]
    for label, key, fmt in (
        ("FetchRow p50 (ms)", "fetch_row_p50_ms", "{:.2f}"),
        ("FetchRow p99 (ms)", "fetch_row_p99_ms", "{:.2f}"),
        (f"FetchRow requests/s, {r['client_threads']} client threads", "fetch_row_per_s_parallel", "{:,.0f}"),
        (f"LoadTable ({local['rows']:,} rows) median (s)", "load_table_s", "{:.3f}"),
        ("LoadTable rows/s", "load_table_rows_per_s", "{:,.0f}"),
        ("LoadTable MB/s (Arrow bytes)", "load_table_mb_per_s", "{:,.1f}"),
    ):
        ratio = remote[key] / local[key] if local[key] else float("nan")
        lines.append(f"| {label} | {fmt.format(local[key])} | {fmt.format(remote[key])} | {ratio:.2f}x |")
    lines += [
        "",
        "Ratio = through the server / in-process: above 1 is slower for times, below 1 is slower for rates.",
        "In-process calls HistoryStore directly in the benchmark's process; the server answers from",
        "worker processes over gRPC on 127.0.0.1 (same machine, so no network latency is included).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--live-rows", type=int, default=20_000)
    parser.add_argument("--versions", type=int, default=100_000)
    parser.add_argument("--lookups", type=int, default=300)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default="service", help="results file name (under bench/results/)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        results = bench_service(Path(tmp), args.live_rows, args.versions, args.lookups, workers=args.workers)
    results["date"] = time.strftime("%Y-%m-%d %H:%M")
    text = report(results)
    print(text)
    write_results(args.out, results, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
