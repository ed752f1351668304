"""Compaction into a table that already holds a long history, beside its baselines in one run.

    python -m bench.compaction_at_scale --size quick      # 100k live rows, 4M versions held
    python -m bench.compaction_at_scale --size full       # 1M live rows, 40M versions held

The target: compaction into a table already holding 40M versions at ≥ 0.5× Spark's JSON → Parquet
and ≥ 1× Delta Lake MERGE. Replaying 40M versions through the WAL would take hours on this
machine, so the held history is written directly as version files (one file per round, every
live key updated once per round, full row images in the table's supertable schema) and
committed with one catalog transaction, then a snapshot is taken as compaction would. Only the
measured segments go through the WAL and the real compaction, with each engine on its own copy
of the same store and the same Spark session:

- ours: ``HistoryStore.compact`` of the measured segments (updates 70 %, inserts 25 %,
  deletes 5 % of the held table's keys);
- Spark's own JSON -> Parquet of the same segment files, warm (run once untimed first), explicit
  schema, same session;
- Delta Lake MERGE (delta-rs) of the same changes, once per segment, into a Delta table holding
  the same live rows. Delta's MERGE reads only its current files, not its history, so its
  baseline table is written once from the live rows instead of replaying 40M versions;
- peak RSS of the driver, the JVM and the executors' Python workers while ours runs.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bench import provenance
from bench.compaction import RssSampler, spark_json_to_parquet_s
from bench.workload import COLUMNS, _value, typed_wal_schema
from history_pipeline import HistoryStore, StoreSettings
from history_pipeline.catalog.files import write_parquet
from history_pipeline.catalog.model import AddFile, AdvanceFrontier, FileKind
from history_pipeline.schema import Supercolumn, replay_schema_history
from history_pipeline.supertable import DELETED, KEY, LT, FileMetadata, new_file_path, supertable_schema
from history_pipeline.wal import SegmentState

RESULTS = Path(__file__).parent / "results"
TABLE_UUID = "00000000-0000-4000-8000-00000000a11e"
COLUMN_UUIDS = {f"0000a11e-{j:04d}-4000-8000-000000000000": (name, ty) for j, (name, ty) in enumerate(COLUMNS)}


#: the held table's creation (its columns' types make the typed JSON schema of the baseline)
CREATE = {"op": "create_table", "t": 1, "table_uuid": TABLE_UUID, "table_name": "held",
          "columns": [{"column_uuid": c, "column_name": n, "data_type": ty} for c, (n, ty) in COLUMN_UUIDS.items()]}


@dataclass(frozen=True)
class Scale:
    live_rows: int
    held_versions: int
    segments: int
    segment_events: int


SIZES = {
    "small": Scale(live_rows=20_000, held_versions=400_000, segments=2, segment_events=20_000),
    "quick": Scale(live_rows=100_000, held_versions=4_000_000, segments=3, segment_events=50_000),
    "full": Scale(live_rows=1_000_000, held_versions=40_000_000, segments=4, segment_events=100_000),
}
ENGINES = ("tasks", "dataframes")


def _create_table(store: HistoryStore) -> None:
    with store.wal_writer(max_segment_bytes=1 << 40) as wal:
        wal.append(CREATE)
        wal.append({"op": "close", "t": 1})
        wal.seal()
    store.compact(spark=False)


def _round_of_versions(supercolumns: Sequence[Supercolumn], keys: pa.Array, first_t: int, round_no: int) -> pa.Table:
    """Every key once, sorted by key, t increasing with the key: one round of full-image updates."""
    n = len(keys)
    ordinal = pc.add(keys, round_no)
    by_name: dict[str, pa.Array] = {
        "qty": pc.multiply(ordinal, 7),
        "price": pc.bit_wise_and(ordinal, 1_048_575),
        "name": pc.binary_join_element_wise("item-", pc.cast(pc.bit_wise_and(ordinal, 8191), pa.string()), ""),
        "at": pc.multiply(ordinal, 3_600_000_000),
        "flag": pc.equal(pc.bit_wise_and(ordinal, 1), 0),
        "score": pc.divide(pc.cast(pc.bit_wise_and(ordinal, 65535), pa.float64()), 7.0),
    }
    names = {uuid: name for uuid, (name, _) in COLUMN_UUIDS.items()}
    schema = supertable_schema(supercolumns)
    columns = {KEY: keys, DELETED: pa.array(np.zeros(n, dtype=bool)), LT: pa.array(np.arange(first_t, first_t + n))}
    for s in supercolumns:
        value = by_name[names[s.column_uuid]]
        field_type = schema.field(s.name).type
        if pa.types.is_timestamp(field_type):
            value = value.cast(pa.int64()).cast(pa.timestamp("us")).cast(field_type)
        elif pa.types.is_decimal(field_type):
            value = value.cast(pa.int32())  # an int64 does not fit DECIMAL(12, 2) as far as Arrow knows
        columns[s.name] = value.cast(field_type)
    return pa.table([columns[f.name] for f in schema], schema=schema)


def hold_history(store: HistoryStore, scale: Scale) -> int:
    """Write ``scale.held_versions`` versions of ``scale.live_rows`` keys as version files, commit
    them, and take a snapshot; returns the frontier after them."""
    state = store.catalog_state()
    supercolumns = replay_schema_history(state.schema_history).supercolumns[TABLE_UUID]
    keys = pa.array(np.arange(1, scale.live_rows + 1, dtype=np.int64))
    t = state.frontier + 1
    entries = []
    for round_no in range(scale.held_versions // scale.live_rows):
        table = _round_of_versions(supercolumns, keys, t, round_no)
        meta = FileMetadata(database=store.database, table_uuid=TABLE_UUID, kind=FileKind.VERSIONS,
                            txn_id=state.txn_id + 1, lower=t, upper=t + scale.live_rows)
        path = new_file_path(store.database, TABLE_UUID, FileKind.VERSIONS, state.txn_id + 1)
        entries.append(write_parquet(store.objects, path, table, meta))
        t += scale.live_rows
    frontier = t - 1
    store.catalog.commit("bench: held history",
                         lambda current: [*(AddFile(e) for e in entries), AdvanceFrontier(frontier)])
    store.refresh_snapshots(force=True)
    return frontier


def measured_events(scale: Scale, first_t: int, seed: int = 7) -> Iterator[dict[str, Any]]:
    """Updates, inserts and deletes of the held table's keys, a close after each segment."""
    rng = random.Random(seed)
    live = list(range(1, scale.live_rows + 1))
    next_key = scale.live_rows + 1
    t = first_t
    uuids = sorted(COLUMN_UUIDS)
    for _ in range(scale.segments):
        for n in range(scale.segment_events):
            roll = rng.random()
            if roll < 0.25:
                key, next_key = next_key, next_key + 1
                live.append(key)
                yield {"op": "insert", "t": t, "table_uuid": TABLE_UUID, "key": key,
                       "values": {c: _value(rng, ty, key) for c, (_, ty) in COLUMN_UUIDS.items()}}
            elif roll < 0.95:
                c = rng.choice(uuids)
                yield {"op": "update", "t": t, "table_uuid": TABLE_UUID, "key": live[rng.randrange(len(live))],
                       "values": {c: _value(rng, COLUMN_UUIDS[c][1], n)}}
            else:
                index = rng.randrange(len(live))
                live[index], live[-1] = live[-1], live[index]
                yield {"op": "delete", "t": t, "table_uuid": TABLE_UUID, "key": live.pop()}
            t += 1
        yield {"op": "close", "t": t - 1}


def write_measured(store: HistoryStore, scale: Scale, first_t: int) -> int:
    count = 0
    with store.wal_writer(max_segment_bytes=1 << 40) as wal:
        for event in measured_events(scale, first_t):
            wal.append(event)
            if event["op"] == "close":
                wal.seal()
            else:
                count += 1
    return count


def delta_merge(work: Path, store: HistoryStore, held_frontier: int) -> float:
    """Delta Lake holding the same live rows, then one MERGE per measured segment's changes."""
    from deltalake import DeltaTable, write_deltalake

    from history_pipeline.supertable.read import keep_latest

    state = store.catalog_state()
    snapshot = [f for f in state.files_of(TABLE_UUID, FileKind.SNAPSHOT) if f.snapshot_as_of == held_frontier + 1]
    live = pa.concat_tables(pq.read_table(store.objects.full_path(f.path)) for f in snapshot)
    path = work / "delta"
    write_deltalake(str(path), live)
    batches = sorted((f for f in state.files_of(TABLE_UUID, FileKind.VERSIONS) if (f.min_t or 0) > held_frontier),
                     key=lambda f: f.min_t or 0)
    # one MERGE per segment, as a CDC sink would: each file must hold one segment's versions (a
    # file rewritten over several, by a merge or a marking, would flatter Delta with fewer MERGEs)
    assert all(len(entry.segments) == 1 for entry in batches), [entry.segments for entry in batches]
    total = 0.0
    for entry in batches:
        source = keep_latest(pq.read_table(store.objects.full_path(entry.path)), include_deleted=True)
        start = time.perf_counter()
        (DeltaTable(str(path))
         .merge(source, predicate="t.synthetic_key = s.synthetic_key", source_alias="s", target_alias="t")
         .when_matched_delete(predicate="s.is_deleted")
         .when_matched_update_all(predicate="NOT s.is_deleted")
         .when_not_matched_insert_all(predicate="NOT s.is_deleted")
         .execute())
        total += time.perf_counter() - start
    return total


def run(scale: Scale, spark: Any, work: Path) -> dict[str, Any]:
    """Hold the history once, copy the store per engine, and measure everything in one session."""
    base = work / "held"
    store = HistoryStore.open(base, database="bench", settings=StoreSettings(spark_master=None))
    _create_table(store)
    began = time.perf_counter()
    held_frontier = hold_history(store, scale)
    hold_s = time.perf_counter() - began
    events = write_measured(store, scale, held_frontier + 1)
    copies = work / "segment_copies"
    copies.mkdir()
    for ref in store.segments(SegmentState.SEALED):
        shutil.copy(ref.path, copies / f"{ref.name}.json")

    tiny = Scale(live_rows=500, held_versions=2_000, segments=1, segment_events=1_500)
    for engine in ENGINES:  # both engines warm (Python workers started, code loaded), like the baseline
        warm = HistoryStore.open(work / f"warm_{engine}", database="bench",
                                 settings=StoreSettings(spark_master=None, compaction_engine=engine))
        _create_table(warm)
        write_measured(warm, tiny, hold_history(warm, tiny) + 1)
        warm.compact(spark=spark)
    engines: dict[str, Any] = {}
    for engine in ENGINES:
        settings = StoreSettings(spark_master=None, compaction_engine=engine)
        shutil.copytree(base, work / engine)
        copy = HistoryStore.open(work / engine, database="bench", settings=settings)
        with RssSampler() as rss:
            start = time.perf_counter()
            summary = copy.compact(spark=spark)
            seconds = time.perf_counter() - start
        engines[engine] = {"seconds": seconds, "versions": summary.versions_written,
                           "versions_per_s": summary.versions_written / seconds, "peak_rss_mb": rss.peak,
                           "store": copy}
    answers = {e: engines[e]["store"].load_table("held", engines[e]["store"].frontier + 1).sort_by("synthetic_key")
               for e in ENGINES}
    same = answers["tasks"].equals(answers["dataframes"])

    paths = [str(p) for p in sorted(copies.iterdir())]

    spark_s = spark_json_to_parquet_s(spark, paths, work / "spark_json_out", typed_wal_schema(iter([CREATE])))
    delta_s = delta_merge(work, engines["tasks"]["store"], held_frontier)
    versions = engines["tasks"]["versions"]
    result: dict[str, Any] = {
        "live_rows": scale.live_rows, "held_versions": scale.held_versions, "segments": scale.segments,
        "segment_events": scale.segment_events, "events": events, "hold_s": hold_s,
        "answers_equal": same, "spark_json_to_parquet_s": spark_s, "spark_events_per_s": events / spark_s,
        "delta_merge_s": delta_s, "delta_versions_per_s": versions / delta_s,
    }
    for engine in ENGINES:
        figures = engines[engine]
        result[engine] = {k: v for k, v in figures.items() if k != "store"}
        result[engine]["ratio_to_spark_json"] = figures["versions_per_s"] / (events / spark_s)
        result[engine]["ratio_to_delta_merge"] = figures["versions_per_s"] / (versions / delta_s)
    return result


def report(r: dict[str, Any]) -> str:
    def verdict(ratio: float, target: float) -> str:
        return "meets target" if ratio >= target else "MISSES target"

    lines = [
        f"## Compaction into a table already holding {r['held_versions']:,} versions "
        f"({r['live_rows']:,} live rows; {r['segments']} segments of {r['segment_events']:,} events)",
        "",
        "| engine | versions/s | vs Spark JSON→Parquet (target ≥ 0.5×) | vs Delta MERGE per segment (target ≥ 1×) "
        "| peak RSS MiB: driver / JVM / executor Python |",
        "|---|---:|---|---|---|",
    ]
    for engine in ENGINES:
        e = r[engine]
        rss = e["peak_rss_mb"]
        lines.append(
            f"| {engine} | {e['versions_per_s']:,.0f} | {e['ratio_to_spark_json']:.2f}× "
            f"({verdict(e['ratio_to_spark_json'], 0.5)}) | {e['ratio_to_delta_merge']:.2f}× "
            f"({verdict(e['ratio_to_delta_merge'], 1.0)}) | {rss['driver_python_mb']:.0f} / {rss['jvm_mb']:.0f} / "
            f"{rss['executor_python_mb']:.0f} |")
    lines += [
        "",
        f"Baselines in the same run and Spark session: Spark JSON→Parquet (warm, explicit schema) "
        f"{r['spark_events_per_s']:,.0f} events/s; Delta MERGE (delta-rs, one per segment) "
        f"{r['delta_versions_per_s']:,.0f} versions/s. Both engines' answers equal: {r['answers_equal']}. "
        f"Writing the held history took {r['hold_s']:.1f} s (not measured against anything).",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="quick")
    parser.add_argument("--note", default="", help="what else ran on the machine")
    args = parser.parse_args()
    try:  # the Delta baseline runs last: a missing package should stop the run before, not after, ours
        import deltalake  # noqa: F401
    except ImportError:
        parser.error("the Delta baseline needs the bench extras: run `make bench-setup` first")
    from history_pipeline.execution import local_spark

    spark = local_spark("local[*]")
    with tempfile.TemporaryDirectory(prefix="hp-bench-scale-") as tmp:
        result = run(SIZES[args.size], spark, Path(tmp))
    result["note"] = args.note
    text = report(result) + (f"\n\nNote: {args.note}" if args.note else "")
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"compaction_at_scale_{args.size}.json").write_text(json.dumps(result, indent=2, default=str))
    (RESULTS / f"compaction_at_scale_{args.size}.md").write_text(provenance() + "\n\n" + text + "\n")


if __name__ == "__main__":
    main()
