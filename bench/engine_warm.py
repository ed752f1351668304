"""The first run on a newly started engine, cold and warmed: ``engine start`` runs a tiny job of
the runs' kind (an Arrow UDF importing the compaction code) in the engine session the Dagster
instance's runs share, before it reports the engine up. Baseline: the same engine started without
it, in the same run. Measured: the engine's start (listening, plus the warm-up when on) and the
first segment's compaction through the runs' shared session right after, as a Dagster run does.

    python -m bench.engine_warm [--repeats N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench import write_results
from history_pipeline import HistoryStore
from history_pipeline.engine import start_engine, stop_engine
from history_pipeline.execution import shared_session_url, spark_session
from history_pipeline_tests.test_compaction import example_events, write

#: the Dagster instance's root directory the runs' session is scoped by
INSTANCE = "/bench/dagster_home"


def first_run(work: Path, warm: bool) -> tuple[float, float]:
    """Seconds of the engine's start and of the first compaction on it."""
    folder = work / "engine"
    started = time.perf_counter()
    info = start_engine(folder, driver_memory="1g", warm=warm, scope=INSTANCE)
    start_s = time.perf_counter() - started
    try:
        store = HistoryStore.open(work / "data", database="db")
        write(store, example_events())
        session = spark_session(shared_session_url(info.url, time.time(), INSTANCE))
        began = time.perf_counter()
        outcome = store.compact_batch([1], spark=session)
        first_s = time.perf_counter() - began
        if outcome.error is not None:
            raise outcome.error
        session.client.close()
    finally:
        stop_engine(folder)
    return start_s, first_s


def main(argv: list[str] | None = None) -> int:
    """Cold and warmed engines, alternately, ``--repeats`` times each."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args(argv)
    figures: dict[str, list[tuple[float, float]]] = {"cold": [], "warmed": []}
    for _ in range(args.repeats):
        for kind in ("cold", "warmed"):
            with tempfile.TemporaryDirectory(prefix="engine-warm-") as scratch:
                figures[kind].append(first_run(Path(scratch), kind == "warmed"))
            print(f"{kind}: start {figures[kind][-1][0]:.1f} s, first run {figures[kind][-1][1]:.1f} s",
                  file=sys.stderr)
    rows = {kind: {"start_s": statistics.median(s for s, _ in v), "first_run_s": statistics.median(f for _, f in v)}
            for kind, v in figures.items()}
    table = "| engine | start (s) | first run's compaction (s) |\n|---|---|---|\n" + "".join(
        f"| {kind} | {r['start_s']:.1f} | {r['first_run_s']:.1f} |\n" for kind, r in rows.items())
    write_results("engine_warm", {"repeats": args.repeats, "median": rows, "all": figures}, table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
