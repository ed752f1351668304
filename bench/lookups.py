"""``fetch_row`` on a long history, in-process and through the HistoryService (one client), beside
DuckDB's point query on a Parquet file holding exactly the answer (the reference), in one run.

    python -m bench.lookups                          # 1M live rows, 10M versions (builds the history)
    python -m bench.lookups --root DIR               # keeps the history in DIR and reuses it next time
    python -m bench.lookups --live-rows 50000 --versions 500000 --batch 50000   # a few minutes

At the latest T and at a T inside a closed interval, the same random keys of the live set (not
among the warm-up keys) are timed twice: cold, with no row group kept decoded (each lookup decodes
its row's row group; the cold round keeps none), beside the previous lookup (``live_rows`` of one
key: the candidate row groups read whole) and DuckDB's ``WHERE synthetic_key = ?`` on a Parquet
file holding exactly the answer (a warm connection); then warm, with the row cache at its budget
(``--row-cache-mib``, here and in the server) after ``--warm-keys`` lookups of other keys,
in-process and through the service (one client; ``history-pipeline serve`` in a process of its
own, one worker), beside a Flight round trip to the same server answering a constant
(``ListActions``: the floor of any call on this machine at its load). Every answer is checked
equal to that key's row of ``load_table`` as of the same T.
Writes bench/results/lookups.json and lookups.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.compute as pc

from bench import write_results
from bench.history import build_history
from bench.read_path import answer_file
from bench.timing import interleaved
from history_pipeline import HistoryStore, StoreSettings
from history_pipeline.query.engine import QueryContext
from history_pipeline.supertable.key_index import indexed_bytes
from history_pipeline.supertable.row_cache import ROW_CACHE_BYTES, row_cache_stats, set_row_cache_bytes
from history_pipeline.types import from_arrow_value

TOKEN = "bench-token"


def _rounds(fns: list[Callable[[int], Any]], keys: list[int]) -> list[dict[str, float]]:
    """Each function's p50/p99 over ``keys``, the functions taking turns key by key, in wall time and
    in the CPU time of this process (all its threads: DuckDB's too; not the service's worker process)."""
    return [samples.percentiles() for samples in interleaved(fns, keys)]


def _previous_lookup(context: QueryContext, table: str, key: int, as_of: int) -> dict[str, Any] | None:
    """The lookup before the key indexes: ``live_rows`` of the one key (the candidate row groups read
    whole), as ``fetch_row`` answered it."""
    descriptor = context.resolve(table, as_of)
    rows = context._live(descriptor, as_of, keys=[key])
    if rows.num_rows == 0:
        return None
    row = rows.slice(0, 1).to_pylist()[0]
    return {c.column_name: from_arrow_value(c.data_type, row[c.supercolumn]) for c in descriptor.columns}


def _expected(answer: Any, key: int) -> dict[str, Any] | None:
    rows = answer.filter(pc.equal(answer.column("synthetic_key"), key)).to_pylist()
    if not rows:
        return None
    return {name: value for name, value in rows[0].items() if name != "synthetic_key"}


def random_keys(rng: random.Random, live_rows: int, count: int, besides: set[int] = frozenset()) -> list[int]:
    """``count`` distinct random keys of the live set, none of ``besides``."""
    keys: list[int] = []
    while len(keys) < count:
        key = rng.randrange(live_rows)
        if key not in besides and key not in keys:
            keys.append(key)
    return keys


def bench_at(store: HistoryStore, work: Path, label: str, as_of: int, live_rows: int, lookups: int,
             service: Any | None, warm_keys: int, budget: int) -> dict[str, Any]:
    """The figures at one T (``service``: a client of a server over the store, or None): first with
    no row group kept decoded (every lookup decodes its row's row group: a first lookup of it), then
    with the row cache at ``budget`` after ``warm_keys`` lookups of other keys (a worker's steady
    state); the timed keys are the same random keys of the live set in both, never asked before."""
    context = store.query_context()
    answer = context.load_table("bench", as_of, ordered=True)
    path = answer_file(answer, work / f"answer_{as_of}.parquet")
    con = duckdb.connect()
    query = f"SELECT * FROM read_parquet('{path}') WHERE synthetic_key = ?"
    keys = random_keys(random.Random(3), live_rows, lookups)
    # the warm context's keys are others: a key just asked by HistoryStore.fetch_row would find its
    # row group decoded
    others = random_keys(random.Random(4), live_rows, lookups, set(keys))
    warm = random_keys(random.Random(5), live_rows, warm_keys, set(keys) | set(others))

    # cold row groups: key indexes and footers warm (the warm-up builds them), nothing decoded kept
    set_row_cache_bytes(0)
    for key in warm[:max(20, warm_keys // 10)]:
        context.fetch_row("bench", key, as_of)
        con.execute(query, [key]).fetchall()
    cold = _rounds([
        lambda k: context.fetch_row("bench", k, as_of),
        lambda k: store.fetch_row("bench", k, as_of),
        lambda k: _previous_lookup(context, "bench", k, as_of),
        lambda k: con.execute(query, [k]).fetchall(),
    ], keys)

    # warm: the row cache at its budget, filled by lookups of the warm-up keys (not the timed ones)
    set_row_cache_bytes(budget)
    for key in warm:
        context.fetch_row("bench", key, as_of)
        if service is not None:
            service.fetch_row("bench", key, as_of)
    before = row_cache_stats()
    other = dict(zip(keys, others, strict=True))
    fns: list[Callable[[int], Any]] = [
        lambda k: context.fetch_row("bench", other[k], as_of),
        lambda k: store.fetch_row("bench", k, as_of),
    ]
    if service is not None:  # (the server's row cache is its own: the same key is a first ask there)
        fns.append(lambda k: service.fetch_row("bench", k, as_of))
        # the floor: a Flight round trip to the same server answering a constant (ListActions)
        fns.append(lambda k: service._client.list_actions(service._options))
    hot = _rounds(fns, keys)
    after = row_cache_stats()
    con.close()
    for key in keys:  # every answer timed equals load_table's row
        expected = _expected(answer, key)
        assert context.fetch_row("bench", key, as_of) == expected, (label, key)
        assert context.fetch_row("bench", other[key], as_of) == _expected(answer, other[key]), (label, key)
        assert store.fetch_row("bench", key, as_of) == expected, (label, key)
        if service is not None:
            assert service.fetch_row("bench", key, as_of) == expected, (label, key)
    asked = (after.hits - before.hits) + (after.misses - before.misses)
    result = {"as_of": label, "t": as_of, "live_rows": answer.num_rows, "lookups": lookups, "warm_keys": len(warm),
              "row_cache_budget_mib": budget / 2**20, "row_cache_held_mib": after.held_bytes / 2**20,
              "row_cache_hit_rate": (after.hits - before.hits) / asked if asked else None,
              "context": hot[0], "store": hot[1], "cold_context": cold[0], "cold_store": cold[1],
              "previous": cold[2], "duckdb_answer_file": cold[3]}
    if service is not None:
        result["service"] = hot[2]
        result["flight_floor"] = hot[3]
    return result


def run(root: Path, live_rows: int, versions: int, batch: int, lookups: int, service: bool, warm_keys: int,
        budget: int) -> dict[str, Any]:
    """Build the history under ``root`` unless it is there, then measure at the latest and a middle T."""
    spec = root / "history.json"
    if spec.exists():
        history = json.loads(spec.read_text())
        store = HistoryStore.open(root, database="bench")
    else:
        print(f"lookups: building {versions:,} versions over {live_rows:,} keys in {root} ...", flush=True)
        store = HistoryStore.open(root, database="bench", settings=StoreSettings(snapshot_min_versions=live_rows))
        built = build_history(store, live_rows, versions, batch)
        history = {"live_rows": built.live_rows, "versions": built.versions, "batch": built.batch,
                   "frontier": built.frontier}
        spec.write_text(json.dumps(history))
    ts = (("latest", history["frontier"] + 1), ("middle", history["frontier"] // 2 + history["batch"] // 3))
    results: dict[str, Any] = {"versions": history["versions"], "live_rows": history["live_rows"], "rows": [],
                               "load": " ".join(f"{x:.1f}" for x in os.getloadavg())}
    with tempfile.TemporaryDirectory() as tmp:
        client, server = _service(root, Path(tmp), budget) if service else (None, None)
        try:
            for label, as_of in ts:
                print(f"lookups: {lookups} at T={label} ...", flush=True)
                results["rows"].append(bench_at(store, Path(tmp), label, as_of, history["live_rows"], lookups, client,
                                                warm_keys, budget))
        finally:
            if client is not None:
                client.close()
                server.close()
    results["key_index_mib"] = indexed_bytes() / 2**20
    results["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return results


class _Served:
    """A ``history-pipeline serve`` process of its own (one worker: one client asks one request at a
    time), so that nothing this process keeps warm (footers, key indexes) is the server's."""

    def __init__(self, root: Path, work: Path, budget: int):
        from history_pipeline.service.auth import token_digest

        config = work / "server.toml"
        config.write_text(f'root = "{root.resolve()}"\nworkers = 1\nrow_cache_mib = {budget // 2**20}\n'
                          f'[tenants.bench]\ndatabase = "bench"\ntoken_sha256 = "{token_digest(TOKEN)}"\n')
        self.log = (work / "server.log").open("w")  # a line per request: a pipe left unread would fill
        self.process = subprocess.Popen([sys.executable, "-m", "history_pipeline.cli", "serve", "--config",
                                         str(config), "--port", "0"], stdout=subprocess.PIPE, stderr=self.log,
                                        text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        line = self.process.stdout.readline() if self.process.stdout is not None else ""
        if "serving" not in line:
            self.close()
            raise RuntimeError(f"the server did not start: {line!r}; see {work / 'server.log'}")
        self.url = line.split()[-1]

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def _service(root: Path, work: Path, budget: int) -> tuple[Any, _Served]:
    """A server over ``root`` in a process of its own (its row cache at ``budget``), and a client of it."""
    from history_pipeline.client import connect

    server = _Served(root, work, budget)
    return connect(server.url, TOKEN), server


def report(results: dict[str, Any], commit: str, date: str) -> str:
    """A Markdown table: ours warm and cold, the previous lookup and DuckDB's point query, each p50 / p99."""
    first = results["rows"][0]
    lines = [
        f"## fetch_row, {results['live_rows']:,} live rows, {results['versions']:,} versions ({date}, commit {commit})",
        "",
        f"Command: `python -m bench.lookups`; each T: {first['lookups']} random keys of the live set (not among the "
        "warm-up keys), timed twice:",
        "**cold**, no row group kept decoded (each lookup decodes its row's row group: a first lookup of it; key",
        "indexes and footers warm), beside the previous lookup and DuckDB's point query on a Parquet file holding "
        "exactly",
        f"the answer; then **warm**, the row cache at {first['row_cache_budget_mib']:.0f} MiB (in this process and "
        f"in the server's) after {first['warm_keys']:,}",
        "lookups of other random keys (a worker's steady state; the warm context asks another such set of keys;",
        "the hit rate is that of the timed lookups in this process). Every",
        "answer checked equal to load_table's row. Target: p50 <= 1 ms / p99 <= 3 ms in-process, <= 2 / 5 ms through",
        "the service with one client (its own `serve` process). Wall time p50 / p99, and in parentheses the CPU time "
        "of",
        "this process in the call (what a lookup costs when it has a core; the machine may be shared).",
        f"Load average at the start: {results.get('load', '?')}. Key indexes held: "
        f"{results.get('key_index_mib', 0):.0f} MiB; peak RSS of the bench process: "
        f"{results.get('peak_rss_mib', 0):.0f} MiB.",
        "",
        "| T | HistoryStore.fetch_row, warm | fetch_row, warm context | through the service, one client, warm | "
        "a Flight round trip answering a constant (ListActions, same server, same rounds) | "
        "row cache (held, hit rate) | HistoryStore.fetch_row, cold | previous lookup (cold, same run) | "
        "DuckDB point query on the answer file (reference) | verdict |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]

    def pair(f: dict[str, float] | None, cpu: bool = True) -> str:
        if f is None:
            return "—"
        text = f"{f['p50_ms']:.2f} / {f['p99_ms']:.2f} ms"
        return text + (f" (CPU {f['cpu_p50_ms']:.2f} / {f['cpu_p99_ms']:.2f})" if cpu else "")

    def meets(f: dict[str, float], p50: float, p99: float) -> str:
        return "meets" if f["p50_ms"] <= p50 and f["p99_ms"] <= p99 else "MISSES"

    for row in results["rows"]:
        remote = row.get("service")
        verdict = f"in-process warm {meets(row['store'], 1, 3)}, cold {meets(row['cold_store'], 1, 3)} target"
        if remote is not None:
            verdict += f"; service warm {meets(remote, 2, 5)} target"
        hit = row["row_cache_hit_rate"]
        cache = f"{row['row_cache_held_mib']:.0f} MiB, {'—' if hit is None else f'{100 * hit:.0f} %'}"
        lines.append(f"| {row['as_of']} (t={row['t']:,}) | {pair(row['store'])} | {pair(row['context'])} | "
                     f"{pair(remote, False)} | {pair(row.get('flight_floor'), False)} |"
                     f" {cache} | {pair(row['cold_store'])} | {pair(row['previous'])} | "
                     f"{pair(row['duckdb_answer_file'])} | {verdict} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", help="where the history is kept (built there when absent); default: a temp dir")
    parser.add_argument("--live-rows", type=int, default=1_000_000)
    parser.add_argument("--versions", type=int, default=10_000_000)
    parser.add_argument("--batch", type=int, default=1_000_000)
    parser.add_argument("--lookups", type=int, default=300)
    parser.add_argument("--no-service", action="store_true", help="in-process only")
    parser.add_argument("--warm-keys", type=int, default=2000,
                        help="lookups of other keys before the warm rounds (they fill the row cache)")
    parser.add_argument("--row-cache-mib", type=int, default=ROW_CACHE_BYTES // 2**20,
                        help="the row cache's budget in the warm rounds, here and in the server")
    parser.add_argument("--out", default="lookups", help="results file name (under bench/results/)")
    args = parser.parse_args(argv)
    budget = args.row_cache_mib * 2**20
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip() or "unknown"
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if args.root:
        results = run(Path(args.root), args.live_rows, args.versions, args.batch, args.lookups, not args.no_service,
                      args.warm_keys, budget)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            results = run(Path(tmp), args.live_rows, args.versions, args.batch, args.lookups, not args.no_service,
                          args.warm_keys, budget)
    results.update(commit=commit, date=date)
    text = report(results, commit, date)
    print(text)
    write_results(args.out, results, text, dated=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
