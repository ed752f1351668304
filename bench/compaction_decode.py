"""What decoding a workload's row events costs in the compaction's Python tasks and in Spark's JVM.

    python -m bench.compaction_decode                          # update-heavy, 3 repeats
    python -m bench.compaction_decode --workload multi-table --repeat 5

The same sealed segments are decoded:

- as a group task does (``frames._decoder`` over the lines it reads: ``vector_decode`` for the
  canonical lines, the reference decoder for the rest), in this process;
- by Spark, reading the files as text, with ``from_json`` and the tables' typed struct (the
  baseline's own parse) and the ways Spark has to tell a column's key given from one absent
  (``values`` set to NULL is not the same as not set): the keys of ``values`` from
  ``json_object_keys``, ``values`` as ``map<string,string>`` with a cast per column, the line as
  a variant (``parse_json``, ``try_variant_get``); and the first of these handed to a Python
  task as Arrow, as a fold task would receive it.

Every Spark variant ends in a ``noop`` write (or a Python task that counts), so the decode is
all it does. Repeats alternate the variants; the medians of wall and CPU seconds are printed (CPU
time of this process, the JVM and its Python workers: comparable under any load).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from bench.compaction import FRAMES, Timer, Timing, cases
from history_pipeline import HistoryStore
from history_pipeline.compaction import frames
from history_pipeline.schema import SchemaState
from history_pipeline.wal import SegmentState


def python_decode(store: HistoryStore, routes: Path) -> Callable[[], int]:
    """The group tasks' decode of every sealed segment of ``store`` (routed once, here); returns
    a function that decodes them all again and gives the rows decoded."""
    state = store.catalog_state()
    routed = [frames.verify_and_route(ref, routes) for ref in store.segments(SegmentState.SEALED)]

    def run() -> int:
        decoded, schema = 0, SchemaState()
        for sealed, route in routed:
            if route is None:
                raise RuntimeError(f"segment {sealed.ref.name} is not routed on the driver")
            plan = frames.plan_frames(sealed, route.records, route.touched, schema, state)
            schema = plan.schema_after
            for work in plan.tables:
                if work.table_uuid not in route.tables:
                    continue
                lines = frames._read_lines(str(sealed.ref.path), route.tables[work.table_uuid].load())
                for batch in frames._decoder(work, sealed.ref.name)(frames._coalesced(lines, frames.DECODE_BYTES)):
                    decoded += batch.num_rows
        return decoded

    return run


def _count(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    rows = 0
    for batch in batches:
        rows += batch.num_rows
    yield pa.RecordBatch.from_pydict({"n": [rows]})


def spark_decodes(spark: Any, paths: list[str], typed: Any) -> dict[str, Callable[[], Any]]:
    """Spark's ways to decode the files' row events with the tables' types and a "was set" flag
    per column, each a function running it once."""
    from pyspark.sql import functions as F

    values = typed["values"].dataType
    columns = [(f.name, f.dataType.simpleString()) for f in values.fields]
    text = F.col("value")
    envelope = "op string, t bigint, table_uuid string, key bigint"

    def lines() -> Any:
        return spark.read.text(paths)

    def typed_struct() -> Any:
        return lines().select(F.from_json(text, typed).alias("e")).select("e.*")

    def with_keys() -> Any:
        keys = F.json_object_keys(F.get_json_object(text, "$.values")).alias("keys")
        return lines().select(F.from_json(text, typed).alias("e"), keys).select(
            "e.op", "e.t", "e.key", "e.values.*",
            *[F.array_contains(F.col("keys"), name).alias(f"s{i}") for i, (name, _) in enumerate(columns)])

    def as_map() -> Any:
        parsed = lines().select(F.from_json(text, f"{envelope}, `values` map<string,string>").alias("e"))
        given = F.col("e.values")
        return parsed.select("e.op", "e.t", "e.key", *[
            item for i, (name, kind) in enumerate(columns)
            for item in (given.getItem(name).cast(kind).alias(f"v{i}"),
                         F.map_contains_key(given, name).alias(f"s{i}"))])

    def as_variant() -> Any:
        line = F.parse_json(text)
        return lines().select(
            F.variant_get(line, "$.op", "string"), F.variant_get(line, "$.t", "bigint"),
            F.variant_get(line, "$.key", "bigint"), *[
                item for i, (name, kind) in enumerate(columns)
                for item in (F.try_variant_get(line, f"$.values.{name}", kind).alias(f"v{i}"),
                             F.try_variant_get(line, f"$.values.{name}", "variant").isNotNull().alias(f"s{i}"))])

    def noop(frame: Callable[[], Any]) -> Callable[[], Any]:
        return lambda: frame().write.format("noop").mode("overwrite").save()

    return {
        "Spark: envelope only (from_json)": noop(lambda: lines().select(F.from_json(text, envelope).alias("e"))),
        "Spark: typed struct (from_json), no set flags": noop(typed_struct),
        "Spark: typed struct + keys (json_object_keys)": noop(with_keys),
        "Spark: map<string,string> + casts + map_contains_key": noop(as_map),
        "Spark: variant (parse_json, try_variant_get)": noop(as_variant),
        "Spark: typed struct + keys, to a Python task": lambda: with_keys().mapInArrow(_count, "n bigint").collect(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=("update-heavy", "multi-table"), default="update-heavy")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    from history_pipeline.execution import local_spark

    spark = local_spark("local[2]", {"spark.ui.showConsoleProgress": "false"})
    case = cases("quick")[args.workload]
    with tempfile.TemporaryDirectory(prefix="hp-bench-decode-") as tmp:
        store = HistoryStore.open(Path(tmp) / "store", database="bench", settings=FRAMES)
        events = case.write(store)
        paths = [str(ref.path) for ref in store.segments(SegmentState.SEALED)]
        variants: dict[str, Callable[[], Any]] = {"ours: the group tasks' decode (Python, Arrow)":
                                                  python_decode(store, Path(tmp) / "routes")}
        variants |= spark_decodes(spark, paths, case.typed_schema())
        timings: dict[str, list[Timing]] = {name: [] for name in variants}
        for run in variants.values():
            run()  # warm-up, untimed
        for _ in range(args.repeat):
            for name, run in variants.items():
                with Timer() as timer:
                    run()
                timings[name].append(timer.timing)
        print(f"{case.name}: {events:,} records "
              f"in {len(paths)} segments, {args.repeat} repeats, load average {os.getloadavg()[0]:.1f}")
        print("| decode | wall s (median) | CPU s (median) | CPU s (each repeat) |")
        print("|---|---:|---:|---|")
        for name, runs in timings.items():
            print(f"| {name} | {statistics.median(t.wall for t in runs):.2f} | "
                  f"{statistics.median(t.cpu for t in runs):.2f} | {', '.join(f'{t.cpu:.2f}' for t in runs)} |")
    spark.stop()


if __name__ == "__main__":
    main()
