"""The read path, each measure beside its baseline in the same run.

1. ``load_table`` as of T (latest, middle, and the worst T: just before the newest snapshot, so
   the read takes the previous snapshot plus every version in between) beside DuckDB reading a
   Parquet file that holds exactly the answer (written by DuckDB, see ``answer_file``); the
   streamed ``load_table_reader`` too; bytes on disk (versions, snapshots, and Delta Lake
   holding the same history with ``--delta``).
2. A TPC-H-style workload: tables generated here (no extension can be installed offline), loaded
   through the WAL and compaction, then refresh cycles (new orders, deleted orders, updated
   orders and line items) through the WAL; standard queries run with ``store.sql`` as of several
   T and by DuckDB on Parquet copies of the tables as of the same T: answers checked equal, times
   compared.

    python -m bench.read_path --quick
    python -m bench.read_path --live-rows 1000000 --histories 10000000 40000000 --tpch-orders 15000
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.parquet as pq

from bench import write_results
from bench.history import TABLE_UUID, append_open_versions, build_history, default_segment_events
from history_pipeline import HistoryStore, StoreSettings
from history_pipeline.catalog import FileKind
from history_pipeline.catalog.files import is_closed_read, is_marked_read, select_files
from history_pipeline.maintenance.snapshots import due_tables, marking_share


def median_time(fn: Callable[[], Any], repeat: int = 3) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def interleaved_medians(fns: list[Callable[[], Any]], rounds: int = 7) -> list[float]:
    """Each function's median time over ``rounds`` rounds that run every function once, in turn."""
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for fn, times in zip(fns, samples, strict=True):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return [statistics.median(times) for times in samples]


def answer_file(table: Any, path: Path) -> Path:
    """``table`` as a Parquet file the way a DuckDB user has one: written by DuckDB's own ``COPY``
    (zstd, its default row groups of 122,880 rows, which its reader scans in parallel). A file
    of one row group, as ``pyarrow.parquet.write_table`` writes 1M rows, is read by one thread:
    about 1.8x slower on this machine, a baseline that would flatter our side."""
    con = duckdb.connect()
    con.register("answer", table)
    con.execute(f"COPY answer TO '{path}' (FORMAT parquet, COMPRESSION zstd)")
    con.close()
    return path


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# --- 1. load_table as of T ---------------------------------------------------------------------


def bench_load_table(work: Path, live_rows: int, versions: int, batch: int, delta: bool,
                     snapshot_ratio: float) -> list[dict[str, Any]]:
    store = HistoryStore.open(work / f"history_{versions}", database="bench",
                              settings=StoreSettings(snapshot_min_versions=live_rows, snapshot_ratio=snapshot_ratio))
    history = build_history(store, live_rows, versions, batch)
    state = store.catalog_state()
    snapshots = sorted({f.snapshot_as_of for f in state.files_of(TABLE_UUID, FileKind.SNAPSHOT)
                        if f.snapshot_as_of is not None})
    worst = snapshots[-1] - 1 if snapshots else history.frontier + 1
    # a snapshot's pieces holding versions count as versions: they are the history's only copy of them
    version_bytes = sum(f.size_bytes for f in state.versions_of(TABLE_UUID))
    snapshot_bytes = sum(f.size_bytes for f in state.files_of(TABLE_UUID, FileKind.SNAPSHOT) if not f.holds_versions)
    delta_bytes = delta_batch_bytes = segment_events = None
    if delta:
        # the target's baseline: one MERGE per WAL segment of the writer's default size, measured
        segment_events = default_segment_events(work / "segment_size", live_rows, versions)
        delta_bytes = _delta_bytes(work, store, segment_events)
        delta_batch_bytes = _delta_bytes(work, store, batch)  # one MERGE per batch, as before (kept for comparison)
    from bench.run import bench_lookups  # the same fetch_row / row_history measure as bench/run.py

    lookups = bench_lookups(store, history.frontier + 1, live_rows)
    middle = history.frontier // 2 + batch // 3
    # the same lookups inside a closed interval (the latest T reads the open one, never closed files)
    lookups_middle = bench_lookups(store, middle, live_rows)
    rows = [dict(_time_load_table(store, work, versions, label, as_of),
                 lookups=lookups if label == "latest" else lookups_middle if label == "middle" else None,
                 version_bytes=version_bytes, snapshot_bytes=snapshot_bytes, delta_bytes=delta_bytes,
                 delta_segment_events=segment_events, batch=batch, delta_batch_bytes=delta_batch_bytes)
            for label, as_of in (("latest", history.frontier + 1), ("middle", middle),
                                 ("worst (just before a snapshot)", worst))]
    # a key's versions sit in every batch's file until the maintenance job's merge rewrites the small
    # files key-sorted (then in one or two): row_history measured again after it, on the same history
    from history_pipeline.maintenance.merge import merge

    merge_s = median_time(lambda: merge(store), repeat=1)  # in-process (Arrow), as without Spark
    rows[0]["lookups_after_merge"] = bench_lookups(store, history.frontier + 1, live_rows)
    rows[0]["lookups_after_merge"]["merge_s"] = merge_s
    rows[0]["lookups_after_merge"]["version_bytes"] = sum(
        f.size_bytes for f in store.catalog_state().versions_of(TABLE_UUID))
    # the open interval at its longest: the versions above the newest snapshot one short of making
    # the next one due. It is marked as of the frontier at every marking's share of them
    # (``mark_open_fraction``), so the worst latest T is just before the next marking: marked at
    # the last one, then one version short of another
    settings = store.settings
    due_after = max(settings.snapshot_min_versions, int(settings.snapshot_ratio * live_rows))
    share = int(marking_share(settings.snapshot_min_versions, settings.snapshot_ratio, live_rows,
                              settings.mark_open_fraction)) if settings.mark_open_fraction else 0
    marked_at = (due_after - 1) // share * share if share else 0
    grown = history
    if select_files(store.catalog_state(), TABLE_UUID, history.frontier + 1).versions:
        # snapshots spaced otherwise than the batches (``--snapshot-ratio``) leave versions above the
        # newest one: a snapshot now (after the bytes above were counted) starts the open interval empty
        store.refresh_snapshots(force=True, spark=False)
        assert not select_files(store.catalog_state(), TABLE_UUID, history.frontier + 1).versions
    if marked_at:
        grown = append_open_versions(store, grown, marked_at)
        mark_s = median_time(lambda: store.refresh_snapshots(spark=False), repeat=1)  # marks, in-process
        marks = select_files(store.catalog_state(), TABLE_UUID, grown.frontier + 1).marked_until
        assert marks == grown.frontier + 1, marks
        rows.append(dict(_time_load_table(store, work, versions, f"open interval, in the middle of its marks "
                                          f"({marked_at:,} versions marked)", history.frontier + 1 + marked_at // 2),
                         mark_s=mark_s))
    grown = append_open_versions(store, grown, min(share, due_after) - 1 if share else due_after - 1, seed=3)
    assert not due_tables(store.catalog_state(), store.settings.snapshot_min_versions, store.settings.snapshot_ratio)
    above = f"{marked_at:,} marked, {grown.frontier - history.frontier - marked_at:,} since" if marked_at else \
        f"{due_after - 1:,} versions above it"
    rows.append(_time_load_table(store, work, versions, "latest, open interval just before the next snapshot is due "
                                 f"({above})", grown.frontier + 1))
    return rows


def _time_load_table(store: HistoryStore, work: Path, versions: int, label: str, as_of: int) -> dict[str, Any]:
    """load_table (and its streamed reader) as of ``as_of`` beside DuckDB reading a file holding the answer."""
    context = store.query_context()
    answer = context.load_table("bench", as_of, ordered=True)
    path = work / f"answer_{versions}_{as_of}.parquet"
    answer_file(answer, path)
    con = duckdb.connect()
    # the default answer (rows in no promised order, as a Delta or Iceberg scan) checked equal to the
    # key-ordered one; both timed, in interleaved rounds so that load from others on a shared
    # machine hits each measure alike
    scanned = context.load_table("bench", as_of)
    assert scanned.sort_by("synthetic_key").combine_chunks().equals(answer.combine_chunks()), as_of
    ours, streamed, key_order, limit = interleaved_medians([
        lambda t=as_of: context.load_table("bench", t),
        lambda t=as_of: context.load_table_reader("bench", t).read_all(),
        lambda t=as_of: context.load_table("bench", t, ordered=True),
        lambda c=con, p=path: c.sql(f"SELECT * FROM read_parquet('{p}')").to_arrow_table(),
    ])
    con.close()
    state = store.catalog_state()
    selection = select_files(state, TABLE_UUID, as_of)
    closed = is_closed_read(store.objects, selection)
    read = "closed interval (filter)" if closed else \
        "above the marks (rows current at them, overlaid)" if is_marked_read(store.objects, selection) else \
        "layered (joins)"
    return {"versions": versions, "live_rows": answer.num_rows, "as_of": label, "t": as_of, "read": read,
            "row_groups_read": _row_groups_read(store, selection, as_of) if closed else None,
            "ours_s": ours, "reader_s": streamed, "key_order_s": key_order, "key_order_ratio": key_order / limit,
            "duckdb_answer_file_s": limit, "ratio": ours / limit}


def _row_groups_read(store: HistoryStore, selection: Any, as_of: int) -> str:
    """"read / in the files" of a closed read (instrumentation: how much the layout lets it skip)."""
    from history_pipeline.catalog import files
    from history_pipeline.supertable.read import footer

    total = sum(footer(store.objects, f.path).meta.num_row_groups for f in selection.snapshot + selection.versions)
    chooser = getattr(files, "closed_row_groups", None)  # absent before the closed layout
    read = sum(len(groups) for _, groups in chooser(store.objects, selection, as_of)) if chooser else total
    return f"{read}/{total}"


def _delta_bytes(work: Path, store: HistoryStore, per: int) -> int:
    """Delta Lake holding the same history, one MERGE per ``per`` consecutive versions (a segment's
    worth, as a CDC sink would), each keeping the newest change per key of its versions."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import DeltaTable, write_deltalake

    from history_pipeline.supertable import SUPERSEDED
    from history_pipeline.supertable.read import keep_latest

    # every version once: the version files and the snapshot pieces holding versions
    files = sorted(store.catalog_state().versions_of(TABLE_UUID), key=lambda f: f.min_t or 0)
    path = work / f"delta_{store.frontier}_{per}"
    merges = 0

    def apply(rows: pa.Table) -> None:
        nonlocal merges
        source = keep_latest(rows, include_deleted=True)
        if not merges:
            write_deltalake(str(path), source)
        else:
            (DeltaTable(str(path)).merge(source, predicate="t.synthetic_key = s.synthetic_key",
                                         source_alias="s", target_alias="t")
             .when_matched_update_all().when_not_matched_insert_all().execute())
        merges += 1

    # a closed interval's files are pieces over key ranges, each spanning the interval's times: a
    # chunk's versions are gathered from every file before its MERGE (file by file, a chunk would
    # be cut into a MERGE per piece, and Delta's bytes grow with every MERGE)
    first_t = min(f.min_t or 0 for f in files)
    by_chunk: dict[int, list[pa.Table]] = {}
    for entry in files:
        rows = pq.read_table(store.objects.full_path(entry.path))
        if SUPERSEDED in rows.column_names:  # our closed-interval bookkeeping, not part of Delta's rows
            rows = rows.drop_columns([SUPERSEDED])
        chunk_of = pc.divide(pc.subtract(rows["logical_timestamp"], first_t), per)
        for chunk in pc.unique(chunk_of).to_pylist():
            by_chunk.setdefault(chunk, []).append(rows.filter(pc.equal(chunk_of, chunk)))
    chunks = sorted(by_chunk)
    fed = 0
    for chunk in chunks:
        rows = pa.concat_tables(by_chunk.pop(chunk))
        fed += rows.num_rows
        apply(rows)
    # the bench's history gives each version a t of its own: Delta got all of them
    assert fed == store.frontier - first_t + 1, (fed, store.frontier - first_t + 1)
    assert merges == len(chunks) == (store.frontier - first_t) // per + 1, (merges, len(chunks))
    return dir_bytes(path)


# --- 2. TPC-H-style SQL as of T ----------------------------------------------------------------

TPCH_TABLES: dict[str, list[tuple[str, str]]] = {
    "region": [("r_regionkey", "INTEGER"), ("r_name", "TEXT")],
    "nation": [("n_nationkey", "INTEGER"), ("n_name", "TEXT"), ("n_regionkey", "INTEGER")],
    "customer": [("c_custkey", "BIGINT"), ("c_name", "TEXT"), ("c_nationkey", "INTEGER"),
                 ("c_acctbal", "NUMERIC(15,2)"), ("c_mktsegment", "TEXT")],
    "part": [("p_partkey", "BIGINT"), ("p_name", "TEXT"), ("p_type", "TEXT"), ("p_size", "INTEGER"),
             ("p_retailprice", "NUMERIC(15,2)")],
    "orders": [("o_orderkey", "BIGINT"), ("o_custkey", "BIGINT"), ("o_orderstatus", "TEXT"),
               ("o_totalprice", "NUMERIC(15,2)"), ("o_orderdate", "DATE"), ("o_orderpriority", "TEXT"),
               ("o_shippriority", "INTEGER")],
    "lineitem": [("l_orderkey", "BIGINT"), ("l_partkey", "BIGINT"), ("l_linenumber", "INTEGER"),
                 ("l_quantity", "NUMERIC(15,2)"), ("l_extendedprice", "NUMERIC(15,2)"),
                 ("l_discount", "NUMERIC(15,2)"), ("l_tax", "NUMERIC(15,2)"), ("l_returnflag", "TEXT"),
                 ("l_linestatus", "TEXT"), ("l_shipdate", "DATE"), ("l_commitdate", "DATE"),
                 ("l_receiptdate", "DATE"), ("l_shipmode", "TEXT"), ("l_comment", "TEXT")],
}

REGIONS = ["AFRICA", "AMERICA", "ASIA", "EUROPE", "MIDDLE EAST"]
SEGMENTS = ["AUTOMOBILE", "BUILDING", "FURNITURE", "HOUSEHOLD", "MACHINERY"]
PRIORITIES = ["1-URGENT", "2-HIGH", "3-MEDIUM", "4-NOT SPECIFIED", "5-LOW"]
SHIPMODES = ["AIR", "FOB", "MAIL", "RAIL", "REG AIR", "SHIP", "TRUCK"]
TYPES = ["PROMO BRUSHED", "STANDARD POLISHED", "ECONOMY ANODIZED", "LARGE PLATED", "MEDIUM BURNISHED"]

# TPC-H queries 1, 3, 5, 6, 10, 12, 14 and 18, in the dialect both engines accept
TPCH_QUERIES: dict[str, str] = {
    "Q1": """SELECT l_returnflag, l_linestatus, sum(l_quantity) AS sum_qty, sum(l_extendedprice) AS sum_base,
        sum(l_extendedprice * (1 - l_discount)) AS sum_disc, sum(l_extendedprice * (1 - l_discount) * (1 + l_tax))
        AS sum_charge, avg(l_quantity) AS avg_qty, avg(l_extendedprice) AS avg_price, avg(l_discount) AS avg_disc,
        count(*) AS n FROM lineitem WHERE l_shipdate <= DATE '1998-09-02'
        GROUP BY l_returnflag, l_linestatus ORDER BY l_returnflag, l_linestatus""",
    "Q3": """SELECT l_orderkey, sum(l_extendedprice * (1 - l_discount)) AS revenue, o_orderdate, o_shippriority
        FROM customer, orders, lineitem WHERE c_mktsegment = 'BUILDING' AND c_custkey = o_custkey
        AND l_orderkey = o_orderkey AND o_orderdate < DATE '1995-03-15' AND l_shipdate > DATE '1995-03-15'
        GROUP BY l_orderkey, o_orderdate, o_shippriority ORDER BY revenue DESC, o_orderdate, l_orderkey LIMIT 10""",
    "Q5": """SELECT n_name, sum(l_extendedprice * (1 - l_discount)) AS revenue FROM customer, orders, lineitem,
        nation, region WHERE c_custkey = o_custkey AND l_orderkey = o_orderkey AND c_nationkey = n_nationkey
        AND n_regionkey = r_regionkey AND r_name = 'ASIA' AND o_orderdate >= DATE '1994-01-01'
        AND o_orderdate < DATE '1995-01-01' GROUP BY n_name ORDER BY revenue DESC, n_name""",
    "Q6": """SELECT sum(l_extendedprice * l_discount) AS revenue FROM lineitem WHERE l_shipdate >= DATE '1994-01-01'
        AND l_shipdate < DATE '1995-01-01' AND l_discount BETWEEN 0.05 AND 0.07 AND l_quantity < 24""",
    "Q10": """SELECT c_custkey, c_name, sum(l_extendedprice * (1 - l_discount)) AS revenue, c_acctbal, n_name
        FROM customer, orders, lineitem, nation WHERE c_custkey = o_custkey AND l_orderkey = o_orderkey
        AND o_orderdate >= DATE '1993-10-01' AND o_orderdate < DATE '1994-01-01' AND l_returnflag = 'R'
        AND c_nationkey = n_nationkey GROUP BY c_custkey, c_name, c_acctbal, n_name
        ORDER BY revenue DESC, c_custkey LIMIT 20""",
    "Q12": """SELECT l_shipmode, sum(CASE WHEN o_orderpriority IN ('1-URGENT', '2-HIGH') THEN 1 ELSE 0 END) AS high,
        sum(CASE WHEN o_orderpriority NOT IN ('1-URGENT', '2-HIGH') THEN 1 ELSE 0 END) AS low
        FROM orders, lineitem WHERE o_orderkey = l_orderkey AND l_shipmode IN ('MAIL', 'SHIP')
        AND l_commitdate < l_receiptdate AND l_shipdate < l_commitdate AND l_receiptdate >= DATE '1994-01-01'
        AND l_receiptdate < DATE '1995-01-01' GROUP BY l_shipmode ORDER BY l_shipmode""",
    "Q14": """SELECT 100.00 * sum(CASE WHEN p_type LIKE 'PROMO%' THEN l_extendedprice * (1 - l_discount) ELSE 0 END)
        / sum(l_extendedprice * (1 - l_discount)) AS promo_revenue FROM lineitem, part
        WHERE l_partkey = p_partkey AND l_shipdate >= DATE '1995-09-01' AND l_shipdate < DATE '1995-10-01'""",
    "Q18": """SELECT c_name, c_custkey, o_orderkey, o_orderdate, o_totalprice, sum(l_quantity) AS qty
        FROM customer, orders, lineitem WHERE o_orderkey IN (SELECT l_orderkey FROM lineitem GROUP BY l_orderkey
        HAVING sum(l_quantity) > 250) AND c_custkey = o_custkey AND o_orderkey = l_orderkey
        GROUP BY c_name, c_custkey, o_orderkey, o_orderdate, o_totalprice
        ORDER BY o_totalprice DESC, o_orderdate, o_orderkey LIMIT 100""",
}


class TpchGenerator:
    """TPC-H-shaped rows (value domains as in the specification, not its exact text generator)."""

    def __init__(self, orders: int, seed: int = 7):
        self.rng = random.Random(seed)
        self.customers = max(10, orders // 10)
        self.parts = max(10, orders // 7)
        self.next_order = 1

    def _money(self, low: float, high: float) -> str:
        return f"{self.rng.uniform(low, high):.2f}"

    def _date(self, start: dt.date, days: int) -> dt.date:
        return start + dt.timedelta(days=self.rng.randrange(days))

    def static_rows(self) -> dict[str, list[dict[str, Any]]]:
        rng = self.rng
        return {
            "region": [{"r_regionkey": i, "r_name": name} for i, name in enumerate(REGIONS)],
            "nation": [{"n_nationkey": i, "n_name": f"NATION{i:02d}", "n_regionkey": i % 5} for i in range(25)],
            "customer": [{"c_custkey": k, "c_name": f"Customer#{k:09d}", "c_nationkey": rng.randrange(25),
                          "c_acctbal": self._money(-999.99, 9999.99), "c_mktsegment": rng.choice(SEGMENTS)}
                         for k in range(1, self.customers + 1)],
            "part": [{"p_partkey": k, "p_name": f"part {k}", "p_type": rng.choice(TYPES), "p_size": rng.randint(1, 50),
                      "p_retailprice": self._money(900, 2000)} for k in range(1, self.parts + 1)],
        }

    def new_order(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        rng = self.rng
        key = self.next_order
        self.next_order += 1
        orderdate = self._date(dt.date(1992, 1, 1), 2405)
        lines = []
        for number in range(1, rng.randint(1, 7) + 1):
            quantity = rng.randint(1, 50)
            ship = orderdate + dt.timedelta(days=rng.randint(1, 121))
            commit = orderdate + dt.timedelta(days=rng.randint(30, 90))
            receipt = ship + dt.timedelta(days=rng.randint(1, 30))
            returned = receipt <= dt.date(1995, 6, 17)
            lines.append({
                "l_orderkey": key, "l_partkey": rng.randint(1, self.parts), "l_linenumber": number,
                "l_quantity": f"{quantity}.00", "l_extendedprice": f"{quantity * rng.uniform(900, 2000):.2f}",
                "l_discount": f"{rng.randint(0, 10) / 100:.2f}", "l_tax": f"{rng.randint(0, 8) / 100:.2f}",
                "l_returnflag": rng.choice("RA") if returned else "N", "l_linestatus": "F" if returned else "O",
                "l_shipdate": ship, "l_commitdate": commit, "l_receiptdate": receipt,
                "l_shipmode": rng.choice(SHIPMODES), "l_comment": "x" * rng.randint(10, 43),
            })
        order = {"o_orderkey": key, "o_custkey": rng.randint(1, self.customers),
                 "o_orderstatus": rng.choice("OFP"), "o_totalprice": self._money(1000, 400000),
                 "o_orderdate": orderdate, "o_orderpriority": rng.choice(PRIORITIES), "o_shippriority": 0}
        return order, lines


def _wal_value(value: Any) -> Any:
    return value.isoformat() if isinstance(value, dt.date) else value


def _row_key(table: str, row: dict[str, Any]) -> int:
    if table == "lineitem":
        return row["l_orderkey"] * 8 + row["l_linenumber"]
    return int(next(iter(row.values())))


def _insert(table: str, row: dict[str, Any], t: int) -> dict[str, Any]:
    return {"op": "insert", "t": t, "table_uuid": table, "key": _row_key(table, row),
            "values": {f"{table}.{c}": _wal_value(v) for c, v in row.items()}}


def build_tpch(store: HistoryStore, orders: int, cycles: int, seed: int = 7) -> list[int]:
    """Load the tables through the WAL, then ``cycles`` refresh cycles; the as_of after each step."""
    gen = TpchGenerator(orders, seed)
    rng = random.Random(seed + 1)
    t = 1
    with store.wal_writer() as wal:
        for name, columns in TPCH_TABLES.items():
            wal.append({"op": "create_table", "t": t, "table_uuid": name, "table_name": name,
                        "columns": [{"column_uuid": f"{name}.{c}", "column_name": c, "data_type": ty}
                                    for c, ty in columns]})
            t += 1
        for name, rows in gen.static_rows().items():
            for row in rows:
                wal.append(_insert(name, row, t))
        live: dict[int, list[int]] = {}
        for _ in range(orders):
            order, lines = gen.new_order()
            wal.append(_insert("orders", order, t))
            for line in lines:
                wal.append(_insert("lineitem", line, t))
            live[order["o_orderkey"]] = [_row_key("lineitem", line) for line in lines]
        wal.append({"op": "close", "t": t})
        wal.seal()
    _compact_and_maintain(store)
    as_ofs = [t + 1]
    per_cycle = max(1, orders // 100)  # each refresh touches about 1% of the orders, as RF1/RF2 do
    for _ in range(cycles):
        t += 1
        with store.wal_writer() as wal:
            for _ in range(per_cycle):  # RF1: new orders
                order, lines = gen.new_order()
                wal.append(_insert("orders", order, t))
                for line in lines:
                    wal.append(_insert("lineitem", line, t))
                live[order["o_orderkey"]] = [_row_key("lineitem", line) for line in lines]
            for key in rng.sample(sorted(live), per_cycle):  # RF2: deleted orders
                wal.append({"op": "delete", "t": t, "table_uuid": "orders", "key": key})
                for line in live.pop(key):
                    wal.append({"op": "delete", "t": t, "table_uuid": "lineitem", "key": line})
            for key in rng.sample(sorted(live), per_cycle):  # order and line item updates
                wal.append({"op": "update", "t": t, "table_uuid": "orders", "key": key,
                            "values": {"orders.o_orderstatus": "F", "orders.o_totalprice": gen._money(1000, 400000)}})
                for line in live[key][:2]:
                    wal.append({"op": "update", "t": t, "table_uuid": "lineitem", "key": line,
                                "values": {"lineitem.l_discount": f"{rng.randint(0, 10) / 100:.2f}",
                                           "lineitem.l_shipmode": rng.choice(SHIPMODES)}})
            wal.append({"op": "close", "t": t})
            wal.seal()
        _compact_and_maintain(store)
        as_ofs.append(t + 1)
    return as_ofs


def _compact_and_maintain(store: HistoryStore) -> None:
    """A compaction and the snapshot maintenance a deployment runs after it (the ``supertables``
    asset's ``refresh_snapshots``: snapshots, intervals closed, the open interval marked when due)."""
    store.compact(spark=False)
    store.refresh_snapshots(spark=False)


def _same_answer(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> bool:
    if len(ours) != len(theirs):
        return False
    for a, b in zip(ours, theirs, strict=True):
        if a.keys() != b.keys():
            return False
        for key in a:
            x, y = a[key], b[key]
            if isinstance(x, float) or isinstance(y, float):
                if not math.isclose(float(x), float(y), rel_tol=1e-9):
                    return False
            elif isinstance(x, Decimal) and isinstance(y, Decimal):
                if x != y:
                    return False
            elif x != y:
                return False
    return True


def bench_tpch(work: Path, orders: int, cycles: int) -> list[dict[str, Any]]:
    store = HistoryStore.open(work / "tpch", database="tpch")
    as_ofs = build_tpch(store, orders, cycles)
    chosen = sorted({as_ofs[0], as_ofs[len(as_ofs) // 2], as_ofs[-1]})
    rows = []
    for as_of in chosen:
        copies = work / f"tpch_copy_{as_of}"
        copies.mkdir()
        con = duckdb.connect()
        # the same PostgreSQL-like settings store.sql applies, so both engines answer alike
        con.execute("SET integer_division = true")
        con.execute("SET default_null_order = 'nulls_last_on_asc_first_on_desc'")
        for name in TPCH_TABLES:
            path = copies / f"{name}.parquet"
            answer_file(store.load_table(name, as_of, ordered=True), path)
            con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet('{path}')")
        for query_name, query in TPCH_QUERIES.items():
            ours = store.sql(query, as_of).to_pylist()
            theirs = con.sql(query).to_arrow_table().to_pylist()
            # five each, interleaved, so that a burst of load on the shared machine hits both sides
            ours_samples, copy_samples = [], []
            for _ in range(5):
                ours_samples.append(median_time(lambda q=query, t=as_of: store.sql(q, t), repeat=1))
                copy_samples.append(median_time(lambda q=query, c=con: c.sql(q).to_arrow_table(), repeat=1))
            ours_s, copy_s = statistics.median(ours_samples), statistics.median(copy_samples)
            rows.append({"query": query_name, "as_of": as_of, "rows": len(ours),
                         "same_answer": _same_answer(ours, theirs), "ours_s": ours_s,
                         "duckdb_copy_s": copy_s, "ratio": ours_s / copy_s})
        con.close()
    lineitems = store.load_table("lineitem", as_ofs[-1]).num_rows
    for row in rows:
        row["lineitem_rows_latest"] = lineitems
    return rows


# --- report --------------------------------------------------------------------------------------


def verdict(value: float, target: float) -> str:
    return "meets target" if value <= target else "MISSES target"


def _key_order(row: dict[str, Any]) -> str:
    """The key order's figure (``ordered=True``) of a load_table row, timed beside the default."""
    return f"; in key order, ordered=True, {row['key_order_s']:.3f} s = {row['key_order_ratio']:.2f}×"


def report(results: dict[str, Any]) -> str:
    lines = ["| measure | ours | baseline (same run) | ratio | target | verdict |", "|---|---|---|---|---|---|"]
    for row in results.get("load_table", []):
        lines.append(f"| as-of load_table, {row['live_rows']:,} live rows, {row['versions']:,} versions, "
                     f"T={row['as_of']}{', ' + row['read'] if row.get('read') else ''}"
                     f"{', row groups ' + row['row_groups_read'] if row.get('row_groups_read') else ''} | "
                     f"{row['ours_s']:.3f} s (streamed {row['reader_s']:.3f} s"
                     f"{_key_order(row)}"
                     f"{', marking took {:.1f} s'.format(row['mark_s']) if row.get('mark_s') else ''}) | "
                     "DuckDB reading the "
                     f"answer file (DuckDB-written) {row['duckdb_answer_file_s']:.3f} s | {row['ratio']:.2f}× | ≤ 2× | "
                     f"{verdict(row['ratio'], 2.0)} |")
    for row in results.get("load_table", []):
        if row.get("lookups"):
            from bench.run import fetch_row_lines

            lines += fetch_row_lines(row["lookups"], f", {row['versions']:,} versions, T={row['as_of']}")
        merged = row.get("lookups_after_merge")
        if merged:
            lines.append(f"| row_history p50 after merge ({merged['merge_s']:.1f} s), the same key | "
                         f"{merged['row_history_p50_ms']:.1f} ms | — | — | ≤ 50 ms | "
                         f"{verdict(merged['row_history_p50_ms'], 50)} |")
            lines.append(f"| bytes of the version files after merge, {row['versions']:,} versions | "
                         f"{merged['version_bytes']:,} (before {row['version_bytes']:,}) | — | — | — | — |")
    seen = set()
    for row in results.get("load_table", []):
        if row["versions"] in seen:
            continue
        seen.add(row["versions"])
        ours = row["version_bytes"] + row["snapshot_bytes"]
        if row["delta_bytes"]:
            ratio = ours / row["delta_bytes"]
            per = row.get("delta_segment_events")
            how = f"a MERGE per default-size WAL segment ({per:,} versions)" if per else "a MERGE per batch"
            lines.append(f"| bytes on disk, {row['versions']:,} versions (snapshots {row['snapshot_bytes']:,}) | "
                         f"{ours:,} | Delta, {how}: {row['delta_bytes']:,} | {ratio:.2f}× | ≤ 0.5× | "
                         f"{verdict(ratio, 0.5)} |")
            if row.get("delta_batch_bytes"):
                ratio = ours / row["delta_batch_bytes"]
                lines.append(f"| bytes on disk, {row['versions']:,} versions | {ours:,} | Delta, a MERGE per "
                             f"{row['batch']:,}-version batch: {row['delta_batch_bytes']:,} | {ratio:.2f}× | — | — |")
        else:
            lines.append(f"| bytes on disk, {row['versions']:,} versions | {ours:,} (of which snapshots "
                         f"{row['snapshot_bytes']:,}) | Delta not measured (run with --delta) | — | ≤ 0.5× | n/a |")
    tpch = results.get("tpch", [])
    if tpch:
        for query in TPCH_QUERIES:
            mine = [r for r in tpch if r["query"] == query]
            worst = max(mine, key=lambda r: r["ratio"])
            same = all(r["same_answer"] for r in mine)
            lines.append(f"| sql() {query}, TPC-H-style, {mine[0]['lineitem_rows_latest']:,} line items, "
                         f"{len(mine)} T (worst shown) | {worst['ours_s']:.3f} s | DuckDB on Parquet copies "
                         f"{worst['duckdb_copy_s']:.3f} s | {worst['ratio']:.2f}× | ≤ 2× | "
                         f"{verdict(worst['ratio'], 2.0)}{'' if same else ' — ANSWERS DIFFER'} |")
    return "\n".join(lines) + "\n"


def run(work: Path, live_rows: int, histories: list[int], batch: int, orders: int, cycles: int,
        delta: bool, snapshot_ratio: float) -> dict[str, Any]:
    results: dict[str, Any] = {"load_table": [], "tpch": [], "snapshot_ratio": snapshot_ratio}
    for versions in histories:
        print(f"read path: load_table at {versions:,} versions, snapshots every {snapshot_ratio:g}x the live "
              "rows ...", flush=True)
        results["load_table"] += bench_load_table(work, live_rows, versions, batch, delta, snapshot_ratio)
    if orders:
        print(f"read path: TPC-H-style workload, {orders:,} orders, {cycles} refresh cycles ...", flush=True)
        results["tpch"] = bench_tpch(work, orders, cycles)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a few minutes)")
    parser.add_argument("--live-rows", type=int, default=1_000_000)
    parser.add_argument("--histories", type=int, nargs="*", default=[10_000_000, 40_000_000])
    parser.add_argument("--batch", type=int, default=1_000_000)
    parser.add_argument("--tpch-orders", type=int, default=15_000)
    parser.add_argument("--cycles", type=int, default=4)
    parser.add_argument("--delta", action="store_true", help="also write the history to Delta Lake for storage")
    parser.add_argument("--out", default="read_path", help="results file name (under bench/results/)")
    parser.add_argument("--snapshot-ratio", type=float, default=StoreSettings().snapshot_ratio,
                        help="a snapshot once the versions since the last one reach this times the live rows "
                             "(default: the store's)")
    args = parser.parse_args(argv)
    if args.quick:
        args.live_rows, args.histories, args.batch, args.tpch_orders, args.cycles = 50_000, [500_000], 50_000, 3000, 3
    with tempfile.TemporaryDirectory() as tmp:
        results = run(Path(tmp), args.live_rows, args.histories, args.batch, args.tpch_orders, args.cycles,
                      args.delta, args.snapshot_ratio)
    table = report(results)
    print(table)
    write_results(args.out, results, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
