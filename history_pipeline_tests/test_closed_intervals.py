"""Closed intervals: once snapshot S' exists, the files of [S, S') carry ``superseded_at``
and a read as of T in [S, S') is filtered scans, no join. Each test asserts the filter path is the
one taken (on the selection and the SQL, not on timing) and that every answer equals the model at
every T, also after merge, erasure, retention and a catalog rebuild; where a file loses its mark the
reader falls back to the layered reconstruction and stays exact."""

from __future__ import annotations

import random
from dataclasses import replace

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from history_pipeline import HistoryStore, QueryError, StoreSettings, supertable
from history_pipeline.catalog.files import (
    closed_row_groups,
    dictionary_reads,
    is_closed_read,
    is_marked_read,
    open_tests,
    select_files,
    superseded_settled,
)
from history_pipeline.catalog.model import FileKind
from history_pipeline.errors import PurgedTimestampError
from history_pipeline.maintenance import snapshots as snapshots_module
from history_pipeline.maintenance.snapshots import close_intervals, closed_intervals
from history_pipeline.query import sandbox
from history_pipeline.query.scan import live_sql
from history_pipeline.schema import replay_schema_history
from history_pipeline.supertable import DELETED, KEY, LT, SUPERSEDED, read_file_metadata
from history_pipeline.supertable.read import RowGroupTimes, footer
from history_pipeline_tests.model import BaseDatabase, replayed
from history_pipeline_tests.test_compaction import _split, check_against_model, random_history, write
from history_pipeline_tests.test_query_layers import CREATE, _delete, _insert, _load, _update
from history_pipeline_tests.test_read_path import check_sql_against_model, damage_column

SMALL_SNAPSHOTS = StoreSettings(snapshot_min_versions=6, snapshot_ratio=0.2)


HOT_KEY = 60


def _items_history(store, hot: bool = False, rounds: int = 12):
    """Inserts, updates (several per key per segment), deletes and re-inserts over ``rounds``
    segments; with ``hot``, key ``HOT_KEY`` updated after each of them too (a counter row)."""
    rng = random.Random(7)
    batches = [[CREATE] + [_insert(2, k, k) for k in [*range(40), *([HOT_KEY] if hot else [])]]]
    t = 3
    for _ in range(rounds):
        batch = []
        for _ in range(rng.randint(1, 3)):
            keys = rng.sample(range(50), 12)
            batch += [_update(t, k, rng.randint(0, 100)) for k in keys[:6]]
            batch += [_delete(t, k) for k in keys[6:9]] + [_insert(t, k, rng.randint(0, 100)) for k in keys[9:]]
            t += 1
            if hot:
                batch.append(_update(t, HOT_KEY, rng.randint(0, 100)))
                t += 1
        batches.append(batch)
    return _load(store, batches)


def _snapshots(store, table="T"):
    return sorted({f.snapshot_as_of for f in store.catalog_state().files_of(table, FileKind.SNAPSHOT)})


def _closed(store, as_of, table="T"):
    return is_closed_read(store.objects, select_files(store.catalog_state(), table, as_of))


def _in_key_order(table):
    return table.sort_by("synthetic_key").combine_chunks()


def _check_rows(store, model, as_ofs):
    """load_table (in key order) against the model: the rows every T answers."""
    for as_of in as_ofs:
        expected = model.table_as_of("items", as_of) or {}
        got = store.load_table("items", as_of, ordered=True)
        assert got.column("synthetic_key").to_pylist() == sorted(expected), as_of
        assert {r.pop("synthetic_key"): r for r in got.to_pylist()} == expected, as_of


def _check_items(store, events, as_ofs):
    """load_table, its stream and sql (whole rows and a filtered aggregate) against the model;
    the SQL checks of ``check_sql_against_model`` over the same model (replayed once)."""
    model = replayed(events)
    as_ofs = list(as_ofs)
    for as_of in as_ofs:
        expected = model.table_as_of("items", as_of) or {}
        got = store.load_table("items", as_of, ordered=True)
        assert {r.pop("synthetic_key"): r for r in got.to_pylist()} == expected, as_of
        assert got.column("synthetic_key").to_pylist() == sorted(expected), as_of  # key order
        assert store.load_table_reader("items", as_of, batch_size=7, ordered=True).read_all().equals(got), as_of
        # the default: the same rows in no promised order
        assert _in_key_order(store.load_table("items", as_of)).equals(got), as_of
        assert _in_key_order(store.load_table_reader("items", as_of, batch_size=7).read_all()).equals(got), as_of
        kept = [r["a"] for r in expected.values() if r["a"] is not None and r["a"] >= 50]
        answer = store.sql("SELECT count(*) AS c, sum(a) AS s FROM items WHERE a >= 50", as_of).to_pylist()
        assert answer == [{"c": len(kept), "s": sum(kept) if kept else None}], as_of
    check_sql_against_model(store, events, as_ofs, model=model)


def test_every_t_below_the_newest_snapshot_is_a_filter_scan_equal_to_the_model(tmp_path):
    store = HistoryStore.open(tmp_path, database="db", settings=SMALL_SNAPSHOTS)
    events = _items_history(store)
    snapshots = _snapshots(store)
    assert len(snapshots) >= 3
    state = store.catalog_state()
    assert closed_intervals(state, "T") == []  # every closed interval is marked
    for f in state.files_of("T"):
        marked = f.closed_until is not None
        assert marked == (SUPERSEDED in pq.read_schema(store.objects.full_path(f.path)).names), f.path
        # every snapshot is marked, the newest as of its own t (its rows are all current there)
        assert marked == (f.kind is FileKind.SNAPSHOT or f.kind is FileKind.VERSIONS and f.max_t < snapshots[-1])
    # closing stopped each snapshot repeating its interval: the versions current at its end are
    # stored once, in pieces of the snapshot that hold versions
    for point in snapshots[1:]:
        pieces = [f for f in state.files_of("T", FileKind.SNAPSHOT) if f.snapshot_as_of == point]
        assert any(f.holds_versions and f.row_count for f in pieces), point
        assert all(f.min_t >= _previous(snapshots, point) for f in pieces if f.holds_versions and f.row_count)
        # and the snapshot's own pieces only the rows written before that interval
        assert all(f.max_t < _previous(snapshots, point) for f in pieces if not f.holds_versions and f.row_count)
    for as_of in range(3, store.frontier + 2):  # at 2 there is nothing to read
        assert _closed(store, as_of) == (as_of <= snapshots[-1]), as_of
    assert store.verify() == []  # every mark agrees with the versions
    # the SQL itself has no join on the filter path; above the newest snapshot it overlays the
    # versions since on the rows current at the snapshot (marked as of its own t)
    supers = replay_schema_history(state.schema_history).supercolumns["T"]
    with duckdb.connect() as db:
        for as_of, closed in ((snapshots[-2] - 1, True), (snapshots[-1] + 1, False)):
            sql = live_sql(store.objects, state, "T", supers, as_of, [s.name for s in supers], "v", db).sql
            assert SUPERSEDED in sql and ("JOIN" not in sql or not closed), as_of
    _check_items(store, events, range(2, store.frontier + 2))


def _previous(points, point):
    return points[points.index(point) - 1]


def _interval_ends(store, table="T"):
    """The last T of each closed interval (the most rows superseded inside it; every T of an
    interval reads the same files) and the T above the frontier."""
    return [s - 1 for s in _snapshots(store, table)[1:]] + [store.frontier + 1]


def _turning_points(store, table="T", seed=0, extra=3):
    """The T at which a read of ``table`` takes other files or another path: the first rows (2),
    each snapshot S and the T around it (the last T of one interval, the first of the next), the
    purge point, the frontier and the T above it; and ``extra`` T between them drawn with ``seed``.
    Inside an interval every T reads the same files by the same filter, with another bound."""
    last = store.frontier + 1
    points = {2, 3, store.earliest, store.earliest + 1, last - 1, last}
    points |= {p for s in _snapshots(store, table) for p in (s - 1, s, s + 1)}
    points = {p for p in points if max(2, store.earliest) <= p <= last}
    between = [t for t in range(max(2, store.earliest), last + 1) if t not in points]
    return sorted(points | set(random.Random(seed).sample(between, min(extra, len(between)))))


@pytest.mark.slow
@pytest.mark.spark
def test_marks_survive_merge_erasure_and_rebuild_and_retention_falls_back_where_it_must(tmp_path):
    # small pieces: snapshots and closed intervals are written over several key ranges, so an
    # interval has small files for the merge to regroup
    store = HistoryStore.open(tmp_path, database="db",
                              settings=replace(SMALL_SNAPSHOTS, snapshot_piece_rows=20, interval_piece_rows=20))
    events = _items_history(store)
    snapshots = _snapshots(store)
    closed_ts = [t for t in range(3, store.frontier + 2) if t < snapshots[-1]]

    # merge and retention in-process (test_the_closed_layout_survives_maintenance runs both on Spark
    # over marked files); the erasure below on Spark
    summary = store.merge(spark=False, small_file_bytes=1 << 30)
    assert summary.files_removed > summary.files_added  # files of one interval were merged, marks kept
    assert all(_closed(store, t) for t in closed_ts)
    _check_layout(store)
    _check_items(store, events, range(2, store.frontier + 2))

    erased = (3, 17, 44)
    store.erase("items", erased, requested_by="test")
    events = [e for e in events if e.get("key") not in erased]
    assert all(_closed(store, t) for t in closed_ts)
    # the erasure and the rebuild (the marks read back from the footers) change which rows the files
    # hold, not which files a T reads: every T's rows, the streams and SQL at each interval's last T
    _check_rows(store, replayed(events), range(2, store.frontier + 2))
    _check_items(store, events, _interval_ends(store))

    store.rebuild_catalog()
    assert all(_closed(store, t) for t in closed_ts)
    _check_rows(store, replayed(events), range(2, store.frontier + 2))
    _check_items(store, events, _interval_ends(store))

    # retention inside an interval: its snapshot goes, the kept rows are a new unmarked file, so
    # reads in what is left of that interval fall back; intervals above the purge point stay closed
    purge = (snapshots[1] + snapshots[2]) // 2
    store.retain(purge, spark=False)
    with pytest.raises(PurgedTimestampError):
        store.load_table("items", purge - 1)
    left = range(purge, store.frontier + 2)
    assert not _closed(store, purge)
    assert all(_closed(store, t) for t in left if snapshots[2] <= t < snapshots[-1])
    _check_items(store, events, left)
    # the next close marks the interval again (the kept rows' next versions are the same history)
    assert close_intervals(store) > 0
    assert all(_closed(store, t) for t in left if t < snapshots[-1])
    _check_items(store, events, left)


def test_a_query_in_a_closed_interval_reads_only_the_columns_it_uses(tmp_path):
    store = HistoryStore.open(tmp_path, database="db", settings=SMALL_SNAPSHOTS)
    _items_history(store)
    as_of = _snapshots(store)[-1] - 1  # the worst T: just before the newest snapshot
    assert _closed(store, as_of)
    rows = store.load_table("items", as_of).to_pylist()
    expected = [{"s": sum(r["a"] for r in rows if r["a"] is not None), "c": len(rows)}]
    # damaged before the first query at T: keeping the live rows as a table cannot read them, so
    # the query scans the files, only the columns it uses
    assert damage_column(store, "T", "n-1")
    assert store.sql("SELECT sum(a) AS s, count(*) AS c FROM items", as_of).to_pylist() == expected
    with pytest.raises(QueryError):
        store.sql("SELECT max(note) AS m FROM items", as_of)


def test_a_closed_read_keeps_its_live_rows_as_a_table_for_the_next_queries_at_t(tmp_path):
    """The second query at a closed T keeps the live rows (every column) as a table (the first reads
    the files only: a single query at T would pay for keeping them for nothing): later queries at
    that T answer from it, so they equal the model even after the files' bytes are damaged, while a
    T asked only once reads the files."""
    store = HistoryStore.open(tmp_path, database="db", settings=SMALL_SNAPSHOTS)
    events = _items_history(store)
    as_of = _snapshots(store)[-1] - 1
    other = next(t for t in range(as_of - 1, 0, -1) if _closed(store, t))
    assert _closed(store, as_of)
    model = BaseDatabase()
    for e in events:
        model.apply(e)
    rows = (model.table_as_of("items", as_of) or {}).values()
    query = "SELECT count(*) AS c, sum(a) AS s, max(note) AS m FROM items"
    expected = [{"c": len(rows), "s": sum(r["a"] for r in rows if r["a"] is not None) if rows else None,
                 "m": max((r["note"] for r in rows if r["note"] is not None), default=None)}]
    assert store.sql("SELECT count(*) AS c FROM items", as_of).to_pylist() == [{"c": len(rows)}]
    con, kept = sandbox._sandboxes[store.query_context()._sandbox_key()]
    before = kept.kept_bytes
    assert kept.deferred and before == 0  # one query at T keeps nothing
    assert store.sql("SELECT count(*) AS c FROM items", as_of).to_pylist() == [{"c": len(rows)}]
    assert kept.kept_bytes > before  # the second keeps the rows
    assert damage_column(store, "T", "n-1")
    assert store.sql(query, as_of).to_pylist() == expected
    with pytest.raises(QueryError):
        store.sql(query, other)


@pytest.mark.slow
def test_a_kept_closed_read_is_counted_at_no_less_than_the_memory_it_takes(tmp_path):
    """The sandbox's budget counts a kept closed read at least at what DuckDB's table takes (its
    Parquet bytes alone are several times less), over enough rows to fill DuckDB's row groups."""
    store = HistoryStore.open(tmp_path, database="db", settings=SMALL_SNAPSHOTS)
    rows = 130_000
    _load(store, [[CREATE] + [_insert(2, k, k) for k in range(rows)], [_update(3, k, 1) for k in range(0, rows, 97)]])
    store.refresh_snapshots(force=True, spark=False)
    _load(store, [[_update(4, k, 2) for k in range(0, rows, 89)]], set(range(rows)))
    store.refresh_snapshots(force=True, spark=False)
    close_intervals(store)
    as_of = next(t for t in range(2, store.frontier + 2) if _closed(store, t))
    for _ in range(2):  # the second query at T keeps the rows
        assert store.sql("SELECT count(*) AS c FROM items", as_of).to_pylist() == [{"c": rows}]
    con, kept = sandbox._sandboxes[store.query_context()._sandbox_key()]
    used = con.sql("SELECT sum(memory_usage_bytes) FROM duckdb_memory() WHERE tag = 'IN_MEMORY_TABLE'").fetchall()[0][0]
    assert 0 < used <= kept.kept_bytes


@pytest.mark.slow
@pytest.mark.parametrize("seed", [5, 21])
def test_random_histories_with_schema_changes_equal_the_model_and_use_the_filter_path(tmp_path, seed):
    events = random_history(seed, n_events=120)
    store = HistoryStore.open(tmp_path, database="db", settings=SMALL_SNAPSHOTS)
    for batch in _split(events, random.Random(seed)):
        write(store, batch)
        store.compact(spark=False)
    state = store.catalog_state()
    tables = sorted({f.table_uuid for f in state.files.values() if f.table_uuid})
    closed = sum(_closed(store, t, table) for table in tables for t in range(0, store.frontier + 2))
    assert closed > 0
    check_against_model(store, events)
    check_sql_against_model(store, events, range(0, store.frontier + 2))


@pytest.mark.slow
@pytest.mark.parametrize("kind", [FileKind.VERSIONS, FileKind.SNAPSHOT])
def test_verify_names_a_file_whose_superseded_at_is_wrong(tmp_path, kind):
    store = HistoryStore.open(tmp_path, database="db", settings=SMALL_SNAPSHOTS)
    _items_history(store)
    assert store.verify() == []
    marked = [f for f in store.catalog_state().files_of("T", kind) if f.closed_until is not None]
    # a file with a row superseded inside its interval
    victim = next(f for f in marked
                  if pq.read_table(store.objects.full_path(f.path)).column(SUPERSEDED).null_count < f.row_count)
    path = store.objects.full_path(victim.path)
    table = pq.read_table(path)
    column = table.schema.get_field_index(SUPERSEDED)
    table = table.set_column(column, table.schema.field(column), pa.nulls(table.num_rows, pa.int64()))
    pq.write_table(table, path)
    problems = store.verify()
    assert problems and {p.kind for p in problems} == {"superseded_mismatch"}
    assert all(p.path == victim.path for p in problems)


# --- the closed layout: row groups a read as of T can skip -------------------------------------

TINY_ROW_GROUPS = 4  # rows per row group, so the small histories here have many, in several buckets


@pytest.fixture
def tiny_row_groups(monkeypatch):
    """Every file written with row groups of 4 rows, a closed file's classes in 3 buckets each."""
    monkeypatch.setattr(supertable, "ROW_GROUP_ROWS", TINY_ROW_GROUPS)
    monkeypatch.setattr(supertable, "CLOSED_BUCKETS", 3)


def _parquet(store, path):
    """A stored file opened directly (local or S3), not through the reader under test."""
    fs, _ = store.objects.arrow_filesystem()
    return pq.ParquetFile(store.objects.full_path(path), filesystem=fs)


def _marked_files(store, table="T"):
    return [f for f in store.catalog_state().files_of(table) if f.closed_until is not None]


def _current(rows, as_of):
    """The rows of ``rows`` (dicts) current as of ``as_of`` (the reference mask, in Python)."""
    return [r for r in rows if not r["is_deleted"] and r["logical_timestamp"] < as_of
            and (r[SUPERSEDED] is None or r[SUPERSEDED] >= as_of)]


def _check_pruning(store, as_ofs, table="T"):
    """At each closed T: the row groups ``closed_row_groups`` skips hold no current row (read back
    directly). Returns the rows (read, current, in the files) summed over the closed T."""
    read = current = total = 0
    state = store.catalog_state()
    files: dict[str, list] = {}  # each file read once, as its row groups' rows
    for as_of in as_ofs:
        selection = select_files(state, table, as_of)
        if not is_closed_read(store.objects, selection):
            continue
        chosen = dict((f.path, groups) for f, groups in closed_row_groups(store.objects, selection, as_of))
        for f in selection.snapshot + selection.versions:
            if f.path not in files:
                parquet = _parquet(store, f.path)
                files[f.path] = [parquet.read_row_group(rg).to_pylist() for rg in range(parquet.num_row_groups)]
            groups = files[f.path]
            kept = chosen.get(f.path, [])
            skipped = [rg for rg in range(len(groups)) if rg not in kept]
            if skipped:
                assert _current([r for rg in skipped for r in groups[rg]], as_of) == [], (as_of, f.path, skipped)
            read += sum(len(groups[rg]) for rg in kept)
            current += len(_current([r for rows in groups for r in rows], as_of))
            total += sum(len(rows) for rows in groups)
    assert total
    return read, current, total


def _assert_skips_most(read, current, total):
    """The layout's point: the rows read beyond the answer are under half of what a scan of every
    row would read beyond it."""
    assert current <= read < total
    assert read - current <= 0.5 * (total - current), (read, current, total)


def _check_layout(store, table="T") -> int:
    """Every marked file is in the closed layout: its footer and entry name it, a row group holds
    one class (never superseded here, or superseded; that class first) and is key-sorted, and the
    hot keys' versions come last, in (key, t) order. Returns the hot rows seen.
    (That buckets follow each other in time is what ``_check_pruning`` measures.)"""
    marked = _marked_files(store, table)
    assert marked
    hot_seen = 0
    for f in marked:
        # (the newest snapshot, marked as of its own t when its interval closed, is one key-sorted
        # run in any layout; it is laid out again with the open interval's files)
        assert f.closed_layout == supertable.CLOSED_LAYOUT or f.closed_until == f.snapshot_as_of, f.path
        meta, _ = read_file_metadata(store.objects, f.path)
        assert meta.closed_layout == supertable.CLOSED_LAYOUT or f.closed_until == f.snapshot_as_of
        parquet = _parquet(store, f.path)
        everything = parquet.read()
        # the hot keys' versions (``supertable.hot_keys_mask``) are the last rows, a run per class
        # (never superseded here, then superseded) in (key, t) order, each starting a row group;
        # the row groups before them are the time-cut classes
        hot = supertable.hot_keys_mask(everything.column(KEY).to_numpy(), supertable.CLOSED_BUCKETS)
        hot_rows = 0 if hot is None else int(hot.sum())
        hot_seen += hot_rows
        if hot_rows:
            tail = everything.slice(everything.num_rows - hot_rows)
            assert hot[everything.num_rows - hot_rows:].all(), f.path
            triples = list(zip(tail.column(SUPERSEDED).is_valid().to_pylist(), tail.column(KEY).to_pylist(),
                               tail.column(LT).to_pylist(), strict=True))
            assert triples == sorted(triples), f.path
        sizes = [parquet.metadata.row_group(rg).num_rows for rg in range(parquet.num_row_groups)]
        time_cut = len(sizes)
        while hot_rows > 0:
            time_cut -= 1
            hot_rows -= sizes[time_cut]
        assert hot_rows == 0, (f.path, sizes)
        classes = []
        for rg in range(parquet.num_row_groups):  # the file read once above, cut at its row groups
            rows = everything.slice(sum(sizes[:rg]), sizes[rg]).to_pylist()
            nulls = {r[SUPERSEDED] is None for r in rows}
            assert len(nulls) == 1, (f.path, rg)  # one class a row group, in the hot runs too
            keys = [(r["synthetic_key"], r["logical_timestamp"]) for r in rows]
            assert keys == sorted(keys), (f.path, rg)
            classes.append(0 if nulls == {True} else 1)
        assert classes[:time_cut] == sorted(classes[:time_cut]), f.path
        assert classes[time_cut:] == sorted(classes[time_cut:]), f.path
    return hot_seen


def _check_lookups(store, events, as_ofs, keys=range(0, 50, 3)):
    """fetch_row at each T and row_history of some keys against the model and the files."""
    model = BaseDatabase()
    for e in events:
        model.apply(e)
    for as_of in as_ofs:
        expected = model.table_as_of("items", as_of) or {}
        for key in keys:
            assert store.fetch_row("items", key, as_of) == expected.get(key), (as_of, key)
    files = [_parquet(store, f.path).read()
             for f in store.catalog_state().versions_of("T")]
    for key in keys:
        ts = sorted(t for rows in files for k, t in zip(rows.column("synthetic_key").to_pylist(),
                                                       rows.column("logical_timestamp").to_pylist(),
                                                       strict=True) if k == key)
        assert [v["logical_timestamp"] for v in store.row_history("items", key)] == ts, key


def _rows_read_and_current(table, groups, as_of):
    """(rows of the row groups a read as of ``as_of`` keeps by their statistics, rows current then)."""
    t = table.column(LT).to_numpy()
    superseded = table.column(SUPERSEDED)
    ends = np.where(superseded.is_valid().to_numpy(zero_copy_only=False), superseded.fill_null(0).to_numpy(),
                    np.iinfo(np.int64).max)
    read = begin = 0
    for rows in groups:
        if t[begin:begin + rows].min() < as_of and ends[begin:begin + rows].max() >= as_of:
            read += rows
        begin += rows
    return read, int(((t < as_of) & (ends >= as_of)).sum())


def test_the_closed_layout_cuts_superseded_rows_by_t_too_for_long_intervals():
    """An interval three times as long as its live rows: most rows superseded after a T early in
    it were also written after T, and the cells by t let a read skip them. Every row group is
    key-sorted and one (class, bucket, cell) run, the rows are the table's, and the rows read
    beyond the answer shrink from buckets by ``superseded_at`` alone (``time_buckets=1``)."""
    rng = np.random.default_rng(5)
    live, n = 4000, 12000
    keys = np.concatenate([np.arange(live), rng.integers(0, live, n - live)])
    times = np.arange(1, n + 1)
    table = pa.table({KEY: keys, DELETED: np.zeros(n, dtype=bool), LT: times,
                      SUPERSEDED: snapshots_module.superseded_at(keys, times)})
    excess = {}
    for time_buckets in (1, 4):
        rows, groups = supertable.closed_layout(table, None, row_group_rows=64, buckets=8,
                                                time_buckets=time_buckets)
        assert sum(groups) == n and sorted(rows.column(LT).to_pylist()) == times.tolist()
        begin = 0
        for size in groups:
            group = rows.slice(begin, size)
            assert group.column(KEY).to_pylist() == sorted(group.column(KEY).to_pylist())
            begin += size
        read_and_current = [_rows_read_and_current(rows, groups, as_of) for as_of in range(2000, n + 1, 1000)]
        assert all(current <= read for read, current in read_and_current)
        excess[time_buckets] = sum(read - current for read, current in read_and_current)
    assert excess[4] < 0.6 * excess[1], excess


def test_the_versions_of_hot_keys_are_key_sorted_runs_at_the_end():
    """A key written far more often than the others (a counter row) would sit in every bucket of a
    time-cut file; its versions are key-sorted runs of their own instead (one per class), so a key
    lookup reads a row group or two for it. The run holds the most-written keys with at least a bucket's count of
    versions, within half a bucket of rows; reads as of every T still skip the rest as before."""
    rng = np.random.default_rng(11)
    live, n = 4000, 8000
    keys = np.concatenate([np.arange(live), rng.integers(0, live, n - live - 300), np.full(300, 7),
                           np.full(40, 12), np.full(5, 30)])
    rng.shuffle(keys[live:])
    times = np.arange(1, len(keys) + 1)
    table = pa.table({KEY: keys, DELETED: np.zeros(len(keys), dtype=bool), LT: times,
                      SUPERSEDED: snapshots_module.superseded_at(keys, times)})
    hot = supertable.hot_keys_mask(keys, 8)
    assert hot is not None
    assert set(keys[hot].tolist()) == {7, 12}  # key 30 has fewer versions than buckets
    rows, groups = supertable.closed_layout(table, None, row_group_rows=64, buckets=8)
    assert sum(groups) == len(keys) and sorted(rows.column(LT).to_pylist()) == times.tolist()
    run = int(hot.sum())
    tail = rows.slice(rows.num_rows - run)
    sevens, twelves = int((keys == 7).sum()), int((keys == 12).sum())
    # a run per class: each key's newest version (never superseded here), then the superseded ones
    assert run == sevens + twelves
    assert tail.column(KEY).to_pylist() == [7, 12] + [7] * (sevens - 1) + [12] * (twelves - 1)
    assert tail.column(SUPERSEDED).null_count == 2 and tail.slice(0, 2).column(SUPERSEDED).null_count == 2
    superseded_sevens = tail.column(LT).to_pylist()[2:sevens + 1]
    assert superseded_sevens == sorted(superseded_sevens)
    # the run starts a row group, and key 7's versions are in the run's row groups only
    begin, holding_7 = 0, 0
    for size in groups:
        if 7 in rows.slice(begin, size).column(KEY).to_pylist():
            holding_7 += 1
            assert begin >= rows.num_rows - run
        begin += size
    assert holding_7 <= -(-sevens // 64) + 2
    for as_of in range(1, len(keys) + 2, 97):
        read, current = _rows_read_and_current(rows, groups, as_of)
        assert current <= read
    # within half a bucket: the hottest keys are taken first and the run stops before the budget
    crowded = np.concatenate([np.arange(1000), np.repeat(np.arange(1000, 1010), 50)])
    taken = supertable.hot_keys_mask(crowded, 8)
    assert taken is not None and taken.sum() <= len(crowded) // 16
    assert set(crowded[taken].tolist()) < set(range(1000, 1010))
    assert supertable.hot_keys_mask(np.arange(1000), 8) is None


@pytest.mark.slow
@pytest.mark.parametrize("hot", [False, True])
def test_the_closed_layout_skips_row_groups_and_equals_the_model_at_every_t(tmp_path, tiny_row_groups, hot):
    # with a counter row, intervals long enough that it is at most half a bucket of their rows
    settings = StoreSettings(snapshot_min_versions=40, snapshot_ratio=0.2) if hot else SMALL_SNAPSHOTS
    store = HistoryStore.open(tmp_path, database="db", settings=settings)
    events = _items_history(store, hot)
    snapshots = _snapshots(store)
    assert (_check_layout(store) > 0) == hot  # a counter row is written often enough to be hot
    every_t = range(2, store.frontier + 2)  # every T: S, S' - 1, each bucket's bounds and around them
    _assert_skips_most(*_check_pruning(store, every_t))
    # the worst T of each closed interval (just before the next snapshot) too
    _assert_skips_most(*_check_pruning(store, [s - 1 for s in snapshots[1:]]))
    _check_items(store, events, every_t)
    _check_lookups(store, events, every_t, [*range(0, 50, 3), HOT_KEY])
    assert store.verify() == []


@pytest.mark.spark
def test_the_closed_layout_survives_maintenance(tmp_path, tiny_row_groups):
    # smaller pieces, so that an interval has several small files for the merge (see above)
    store = HistoryStore.open(tmp_path, database="db", settings=SMALL_SNAPSHOTS)
    events = _items_history(store)
    snapshots = _snapshots(store)
    every_t = range(2, store.frontier + 2)
    _assert_skips_most(*_check_pruning(store, every_t))
    purge = (snapshots[1] + snapshots[2]) // 2
    left = range(purge, store.frontier + 2)
    read, current, _ = _check_pruning(store, left)
    excess_before = read - current

    # an interval is closed as one file per kind and key range, so the merge leaves marked files
    # alone here (merging the marked small files of pieces is tested above)
    marked = {f.path for f in _marked_files(store)}
    store.merge(small_file_bytes=1 << 30)
    assert marked <= {f.path for f in _marked_files(store)}
    _check_layout(store)
    _assert_skips_most(*_check_pruning(store, every_t))
    _check_items(store, events, every_t)

    erased = (3, 17, 44)
    store.erase("items", erased, requested_by="test", spark=False, purge_now=True)
    events = [e for e in events if e.get("key") not in erased]
    _check_layout(store)
    _check_pruning(store, every_t)
    # the erasure and the rebuild change which rows the files hold, not which files a T reads:
    # the answers where the reads change files (every T is read after the merge above)
    points = _turning_points(store, seed=518)
    _check_items(store, events, points)
    _check_lookups(store, events, points)

    store.rebuild_catalog()
    _check_layout(store)
    _check_items(store, events, points)

    store.retain(purge)
    while close_intervals(store):
        pass
    _check_layout(store)
    # the retention took rows the reads skipped; those they read beyond the answer are no more
    # than before the maintenance, give or take a row group (the buckets and cells by t are cut
    # again over the rows retention keeps, so their bounds move)
    read, current, _ = _check_pruning(store, left)
    assert read - current <= excess_before + TINY_ROW_GROUPS, (read - current, excess_before)
    _check_items(store, events, left)
    _check_lookups(store, events, left)
    assert store.verify() == []


@pytest.mark.slow
def test_files_closed_in_the_key_sorted_layout_read_right_and_are_laid_out_again(tmp_path, tiny_row_groups,
                                                                                 monkeypatch):
    """A store closed before the layout (key-sorted files, no layout named) reads the same, by the
    same filter (statistics prune nothing wrongly in any order), and the next closes lay it out."""
    with monkeypatch.context() as before:
        before.setattr(snapshots_module, "CLOSED_LAYOUT", None)
        # the layout before: rows in (key, t) order, row groups of the default size
        before.setattr(snapshots_module, "layout_of", lambda table, as_of, holds: (
            table.sort_by([("synthetic_key", "ascending"), ("logical_timestamp", "ascending")]), None))
        store = HistoryStore.open(tmp_path, database="db", settings=SMALL_SNAPSHOTS)
        events = _items_history(store)
    old = _marked_files(store)
    assert old and all(f.closed_layout is None for f in old)
    for f in old:
        keys = _parquet(store, f.path).read().column("synthetic_key").to_pylist()
        assert keys == sorted(keys)
    every_t = range(2, store.frontier + 2)
    closed_ts = [t for t in every_t if _closed(store, t)]
    assert closed_ts
    _check_items(store, events, every_t)
    rounds = 0
    while close_intervals(store):
        rounds += 1
    assert rounds >= 1
    assert all(_closed(store, t) for t in closed_ts)
    _check_layout(store)
    _assert_skips_most(*_check_pruning(store, every_t))
    _check_items(store, events, every_t)


def test_the_closed_layout_on_an_s3_root(tmp_path, s3_bucket, s3_options, tiny_row_groups):
    """On S3 the interval is closed through Arrow datasets (no local paths), in the closed layout,
    and read the same way."""
    store = HistoryStore.open(s3_bucket, database="db", wal_dir=tmp_path / "wal", s3=s3_options,
                              settings=SMALL_SNAPSHOTS)
    events = _items_history(store, rounds=6)  # closes on S3 more than one interval
    closed = [t for t in range(3, store.frontier + 2) if _closed(store, t)]
    assert closed and max(closed) == _snapshots(store)[-1] and len(_snapshots(store)) >= 3
    _check_layout(store)
    _assert_skips_most(*_check_pruning(store, closed))
    picked = [closed[0], closed[len(closed) // 2], closed[-1], store.frontier + 1]
    _check_items(store, events, picked)
    _check_lookups(store, events, picked, keys=range(0, 50, 7))


def test_superseded_at_is_each_keys_next_t():
    rng = random.Random(11)
    keys = [rng.randrange(20) for _ in range(500)]
    times = rng.sample(range(10_000), 500)
    got = snapshots_module.superseded_at(np.array(keys, np.int64), np.array(times, np.int64)).to_pylist()
    for key, t, superseded in zip(keys, times, got, strict=True):
        later = [u for k, u in zip(keys, times, strict=True) if k == key and u > t]
        assert superseded == (min(later) if later else None)
    assert snapshots_module.superseded_at(np.array([], np.int64), np.array([], np.int64)).to_pylist() == []


def _upload(root, uri, s3_options):
    """Every file under the local ``root`` put under the S3 prefix ``uri``, at the same relative path."""
    import boto3

    bucket, prefix = uri[len("s3://"):].split("/", 1)
    client = boto3.client("s3", endpoint_url=s3_options.endpoint_url, region_name=s3_options.region,
                          aws_access_key_id=s3_options.access_key_id,
                          aws_secret_access_key=s3_options.secret_access_key)
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(root).as_posix()}")


def test_intervals_are_closed_by_spark_tasks_over_key_ranges_on_s3(tmp_path, s3_bucket, s3_options, spark,
                                                                    monkeypatch):
    """Closing on Spark executors, several key ranges per interval, through the S3 endpoint: each
    range is its own marked file per kind, and every T answers as the model."""
    settings = replace(SMALL_SNAPSHOTS, snapshot_piece_rows=20, interval_piece_rows=20,
                       mark_open_fraction=0)  # closes only
    # the history is compacted on a local root and uploaded as it is: the closes below are what runs
    # through S3 (compactions that close on S3: test_the_closed_layout_on_an_s3_root)
    local = HistoryStore.open(tmp_path / "root", database="db", wal_dir=tmp_path / "wal", settings=settings)
    with monkeypatch.context() as unclosed:  # the history without its closes, to close them below
        unclosed.setattr(snapshots_module, "close_intervals", lambda *_, **__: 0)
        # nor by the pass that writes a due snapshot by closing its interval
        unclosed.setattr(snapshots_module, "open_interval", lambda *_: None)
        events = _items_history(local)
    _upload(tmp_path / "root", s3_bucket, s3_options)
    store = HistoryStore.open(s3_bucket, database="db", wal_dir=tmp_path / "wal", s3=s3_options, settings=settings)
    assert store.frontier == local.frontier and store.catalog_state().files == local.catalog_state().files
    assert not _marked_files(store)
    assert len(closed_intervals(store.catalog_state(), "T")) > 4  # more than one call's worth
    replaced = 0
    while n := close_intervals(store, spark=spark, piece_rows=20):
        replaced += n
    assert replaced and closed_intervals(store.catalog_state(), "T") == []
    by_interval: dict[int, list] = {}
    for f in _marked_files(store):
        by_interval.setdefault(f.closed_until, []).append(f)
    assert any(sum(f.kind is FileKind.VERSIONS for f in files) > 1 for files in by_interval.values())
    # the newest closed interval's snapshot was split on the executors too: pieces holding versions
    assert any(f.holds_versions for f in _marked_files(store))
    every_t = range(2, store.frontier + 2)
    assert all(_closed(store, t) for t in every_t if 2 < t < _snapshots(store)[-1])  # at 2 nothing is read
    # every T's rows; the streams and SQL at each closed interval's last T (inside an interval every
    # T reads the same files by the same filter, and verify checks every row's mark) and above them
    _check_rows(store, replayed(events), every_t)
    _check_items(store, events, _interval_ends(store))
    assert store.verify() == []


def test_open_tests_follow_the_row_groups_statistics():
    settled = RowGroupTimes(1, 9, 0, max_t=5, any_deleted=False)
    assert open_tests([settled], 6) == (False, False)
    assert open_tests([settled], 5) == (False, True)  # a row at t = 5 is not current as of 5
    assert open_tests([settled, RowGroupTimes(1, 9, 0, max_t=2, any_deleted=True)], 9) == (True, False)
    assert open_tests([RowGroupTimes(None, None, None)], 10**9) == (True, True)  # nothing known: test both
    # superseded_at need not be read only where every row's is NULL (rows current at any T up to the marks)
    never = RowGroupTimes(1, None, 4, rows=4)
    assert superseded_settled([never]) and superseded_settled([never, never])
    assert not superseded_settled([never, RowGroupTimes(1, 9, 3, rows=4)])  # one row superseded at 9
    assert not superseded_settled([RowGroupTimes(1, None, 4)])  # its rows not known


@pytest.mark.slow
def test_closed_reads_that_skip_settled_columns_equal_the_model(tmp_path, tiny_row_groups):
    """Without deletes, a closed read never reads ``is_deleted`` for load_table, and at some T not
    ``t`` either; the answers still equal the model at every T (with deletes: every other test)."""
    store = HistoryStore.open(tmp_path, database="db", settings=SMALL_SNAPSHOTS)
    batches = [[CREATE] + [_insert(2, k, k) for k in range(40)]]
    batches += [[_update(t, k, t + k) for k in range(t % 4, 40, 3)] for t in range(3, 16)]
    events = _load(store, batches)
    state = store.catalog_state()
    settled = []
    for as_of in range(3, _snapshots(store)[-1]):
        assert _closed(store, as_of), as_of
        groups = closed_row_groups(store.objects, select_files(state, "T", as_of), as_of)
        settled.append(open_tests([footer(store.objects, f.path).times[rg] for f, rgs in groups for rg in rgs],
                                  as_of))
    assert all(not deleted for deleted, _ in settled) and any(not t for _, t in settled)
    _check_items(store, events, range(2, store.frontier + 2))


@pytest.mark.slow
@pytest.mark.parametrize("mark_open_fraction", [0, 0.25])
def test_reads_of_dictionary_strings_equal_the_model(tmp_path, mark_open_fraction):
    """A text column of few values is stored with a dictionary: a closed read, and a layered one
    (snapshot and changes) or one above the open interval's marks, take it as dictionaries and
    decode the rows they keep, nulls and all, equal to the model at every T."""
    store = HistoryStore.open(tmp_path, database="db",
                              settings=replace(SMALL_SNAPSHOTS, mark_open_fraction=mark_open_fraction))
    create = {"op": "create_table", "t": 1, "table_uuid": "M", "table_name": "modes",
              "columns": [{"column_uuid": "m", "column_name": "mode", "data_type": "TEXT"}]}
    rng = random.Random(4)
    modes = ["MAIL", "SHIP", "AIR", None]
    row = {"op": "insert", "t": 2, "table_uuid": "M"}
    batches = [[create] + [dict(row, key=k, values={"m": rng.choice(modes)}) for k in range(300)]]
    for t in range(3, 14):
        batches.append([{"op": "update", "t": t, "table_uuid": "M", "key": k, "values": {"m": rng.choice(modes)}}
                        for k in rng.sample(range(300), 80)] + [{"op": "delete", "t": t, "table_uuid": "M", "key": t}])
    # too few for a snapshot (fewer than 0.2 of the live rows): the latest T reads the newest
    # snapshot and these changes (marked, when marking: then the last ten are too few for it, and
    # of one value, so that their file too has a dictionary)
    batches.append([{"op": "update", "t": 14, "table_uuid": "M", "key": k, "values": {"m": rng.choice(modes)}}
                    for k in rng.sample(range(20, 300), 45)])
    batches.append([{"op": "update", "t": 15 + i // 5, "table_uuid": "M", "key": k, "values": {"m": "AIR"}}
                    for i, k in enumerate(rng.sample(range(20, 300), 10))])
    events, alive = [], set()
    for batch in batches:
        events += _load(store, [batch], alive)
        # the maintenance after compaction (which marks when due), in-process: the same tasks mark on
        # Spark in test_intervals_are_closed_by_spark_tasks_over_key_ranges_on_s3
        store.refresh_snapshots(spark=False)
    model = BaseDatabase()
    for e in events:
        model.apply(e)
    state = store.catalog_state()
    stored = store.query_context().resolve("modes", store.frontier + 1).columns[0].supercolumn
    closed_reads = layered_reads = marked_reads = 0
    for as_of in range(2, store.frontier + 2):
        selection = select_files(state, "M", as_of)
        if is_closed_read(store.objects, selection):
            closed_reads += all(stored in footer(store.objects, f.path).dictionary_strings
                                for f, _ in closed_row_groups(store.objects, selection, as_of))
        elif selection.versions:  # layered, or above the marks: both read the same files' dictionaries
            layered_reads += dictionary_reads(store.objects, selection.snapshot + selection.versions,
                                              [stored]) == [stored]
            marked_reads += is_marked_read(store.objects, selection)
        expected = model.table_as_of("modes", as_of) or {}
        got = store.load_table("modes", as_of, ordered=True)
        assert got.schema.field("mode").type == pa.string(), as_of
        assert _in_key_order(store.load_table("modes", as_of)).equals(got.combine_chunks()), as_of
        assert {r.pop("synthetic_key"): r for r in got.to_pylist()} == expected, as_of
        assert got.column("synthetic_key").to_pylist() == sorted(expected), as_of
    assert closed_reads >= 3 and layered_reads >= 1, (closed_reads, layered_reads)
    # above the newest snapshot (marked as of its own t) a read overlays the versions since on it
    assert marked_reads >= 1, marked_reads


def test_a_snapshot_filling_a_new_supercolumn_keeps_its_rows_whole_where_the_versions_differ(tmp_path):
    """A type change's snapshot (written by compaction, the new supercolumn filled for every row)
    is not the versions before it: closing keeps its rows whole and the versions in their files
    (split anyway, the reads after it lost the filled values). A later snapshot, whose rows are
    the versions, stops repeating its interval. Every T reads as the model, and verify agrees."""
    store = HistoryStore.open(tmp_path, database="db", settings=StoreSettings(snapshot_min_versions=10**9))
    change = {"op": "change_column_type", "t": 4, "table_uuid": "T", "column_uuid": "a",
              "data_type": "DOUBLE PRECISION"}
    alive: set[int] = set()
    events = _load(store, [[CREATE] + [_insert(2, k, k) for k in range(20)],
                           [_update(3, k, k + 100) for k in range(0, 20, 2)], [change]], alive)
    (changed,) = _snapshots(store)
    events += _load(store, [[_update(5, k, 7) for k in range(0, 20, 3)], [_delete(6, 4), _delete(6, 5)]], alive)
    store.refresh_snapshots(force=True, spark=False)
    first, later = _snapshots(store)
    assert first == changed
    state = store.catalog_state()
    assert closed_intervals(state, "T") == []  # both intervals are marked
    pieces = {point: [f for f in state.files_of("T", FileKind.SNAPSHOT) if f.snapshot_as_of == point]
              for point in (first, later)}
    assert not any(f.holds_versions for f in pieces[first])  # the filled rows stay whole
    assert sum(f.row_count for f in pieces[first]) == 20
    held = [f for f in pieces[later] if f.holds_versions]
    assert held and sum(f.row_count for f in held) == 7  # the updates at t 5, none of them deleted
    assert sum(f.row_count for f in pieces[later] if not f.holds_versions) == 20 - 7 - 2
    assert store.verify() == []
    _check_items(store, events, range(2, store.frontier + 2))
    _check_lookups(store, events, range(2, store.frontier + 2), keys=range(20))
