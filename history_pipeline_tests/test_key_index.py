"""Point lookups through the key indexes (``supertable.key_index``): every (key, T) is answered as
load_table answers it, through snapshots, intervals closed and cut by time, open-interval marks,
deletes and maintenance, on local and S3 roots; a warm lookup reads only its row's row group, and
of it only the columns it returns; the kept indexes stay within their byte budget and follow the
catalog state (a lookup after an erasure, a merge, a retention or a new compaction answers from the
files of the new state)."""

from __future__ import annotations

import random
from dataclasses import replace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from history_pipeline import HistoryStore, PurgedTimestampError, supertable
from history_pipeline.catalog.files import newest_of_key, select_files
from history_pipeline.errors import DataFileError
from history_pipeline.supertable import DELETED, KEY, LT, SUPERSEDED, key_index, row_cache
from history_pipeline_tests.test_closed_intervals import (
    HOT_KEY,
    SMALL_SNAPSHOTS,
    TINY_ROW_GROUPS,
    _items_history,
    _snapshots,
)
from history_pipeline_tests.test_open_marks import MARKED
from history_pipeline_tests.test_open_marks import _history as _marked_history
from history_pipeline_tests.test_open_marks import _reads as read_kinds
from history_pipeline_tests.test_query_layers import _delete, _load, _update

KEYS = [*range(0, 51), HOT_KEY, 10_000]  # every key the history has, and one it never had


def check_lookups_equal_load_table(store: HistoryStore, as_ofs, keys=KEYS, table: str = "items") -> int:
    """fetch_row of every key at every T equals that key's row of load_table; the rows compared."""
    context = store.query_context()
    compared = 0
    for as_of in as_ofs:
        rows = {r.pop("synthetic_key"): r for r in context.load_table(table, as_of).to_pylist()}
        for key in keys:
            assert context.fetch_row(table, key, as_of) == rows.get(key), (as_of, key)
            compared += key in rows
        for key in keys[::10]:  # the store's own call: a context of its newest state each time
            assert store.fetch_row(table, key, as_of) == rows.get(key), (as_of, key)
    return compared


def some_ts(store: HistoryStore, first: int = 2) -> list[int]:
    """Every third T from ``first``, and each snapshot's T and the T just before it."""
    snapshots = [s for s in _snapshots(store) if s > first]
    return sorted({*range(first, store.frontier + 2, 3), *snapshots, *(s - 1 for s in snapshots),
                   store.frontier + 1})


@pytest.fixture
def small_row_groups(monkeypatch):
    """Files written with row groups of a few rows, a closed file's in 3 buckets: many row groups."""
    monkeypatch.setattr(supertable, "ROW_GROUP_ROWS", TINY_ROW_GROUPS)
    monkeypatch.setattr(supertable, "CLOSED_BUCKETS", 3)


@pytest.fixture(autouse=True)
def fresh_indexes():
    """Each test starts and ends without kept indexes or decoded row groups (they are per process),
    at the default budget of the decoded row groups."""
    row_cache.set_row_cache_bytes(row_cache.ROW_CACHE_BYTES)
    key_index.forget_indexes()
    yield
    row_cache.set_row_cache_bytes(row_cache.ROW_CACHE_BYTES)
    key_index.forget_indexes()


def test_every_lookup_equals_load_table_through_closed_marked_and_open_reads(tmp_path, small_row_groups):
    # in-process maintenance (no JVM): the same tasks
    store = HistoryStore.open(tmp_path, database="db", settings=replace(MARKED, spark_master=None))
    _marked_history(store)
    reads = set(read_kinds(store).values())
    assert {"closed", "marked"} <= reads, reads  # (and layered at T=2)
    assert check_lookups_equal_load_table(store, range(2, store.frontier + 2)) > 0


@pytest.mark.s3
def test_every_lookup_equals_load_table_on_an_s3_root(tmp_path, s3_bucket, s3_options, small_row_groups):
    store = HistoryStore.open(s3_bucket, database="db", wal_dir=tmp_path / "wal", s3=s3_options,
                              settings=SMALL_SNAPSHOTS)
    _items_history(store)
    snapshots = _snapshots(store)
    picked = [2, snapshots[1] - 1, snapshots[1], (snapshots[-2] + snapshots[-1]) // 2, store.frontier + 1]
    assert check_lookups_equal_load_table(store, picked) > 0


def _reads(monkeypatch):
    """Every read of row groups of a Parquet file from now on (whole, or as batches): (row groups, columns)."""
    calls = []
    whole, batches = pq.ParquetFile.read_row_groups, pq.ParquetFile.iter_batches

    def read_row_groups(self, row_groups, columns=None, **kwargs):
        calls.append((list(row_groups), list(columns) if columns is not None else None))
        return whole(self, row_groups, columns=columns, **kwargs)

    def iter_batches(self, batch_size=65536, row_groups=None, columns=None, **kwargs):
        calls.append((list(row_groups) if row_groups is not None else None,
                      list(columns) if columns is not None else None))
        return batches(self, batch_size, row_groups=row_groups, columns=columns, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", read_row_groups)
    monkeypatch.setattr(pq.ParquetFile, "iter_batches", iter_batches)
    return calls


@pytest.mark.parametrize("kept_row_groups", [False, True], ids=["row-cache-off", "row-cache-cold"])
def test_a_warm_lookup_reads_one_row_group_and_only_the_columns_it_returns(tmp_path, small_row_groups, monkeypatch,
                                                                          kept_row_groups):
    """With its row group not kept decoded (no row cache, or dropped from it), a lookup whose key
    index is warm reads one row group, and of it only the columns it returns."""
    if not kept_row_groups:
        row_cache.set_row_cache_bytes(0)
    store = HistoryStore.open(tmp_path, database="db", settings=SMALL_SNAPSHOTS)
    _items_history(store, hot=True)
    snapshots = _snapshots(store)
    context = store.query_context()
    for as_of in (snapshots[1] - 1, (snapshots[-2] + snapshots[-1]) // 2, store.frontier + 1):
        for key in KEYS:  # warm: every row group a lookup of these keys asks is indexed
            context.fetch_row("items", key, as_of)
        calls = _reads(monkeypatch)
        for key in KEYS:
            row_cache.forget_row_groups()
            calls.clear()
            row = context.fetch_row("items", key, as_of)
            if row is None:  # deleted, or never there: nothing is read
                assert calls == [], (as_of, key)
                continue
            assert len(calls) == 1, (as_of, key, calls)
            (groups, columns), = calls
            assert groups is not None and len(groups) == 1, (as_of, key, calls)
            assert columns and not {KEY, LT, DELETED, SUPERSEDED} & set(columns), (as_of, key, columns)
        monkeypatch.undo()


def test_a_lookup_of_a_kept_row_group_reads_nothing_and_answers_as_load_table(tmp_path, small_row_groups,
                                                                               monkeypatch):
    """Once a lookup decoded its row group, every later lookup of a row there (the same key, or
    another) reads no file at all: the row is taken from the kept columns, and equals load_table's."""
    store = HistoryStore.open(tmp_path, database="db", settings=SMALL_SNAPSHOTS)
    _items_history(store, hot=True)
    as_ofs = some_ts(store)[::3]
    check_lookups_equal_load_table(store, as_ofs)  # warm: indexes built, row groups decoded
    before = row_cache.row_cache_stats()
    assert before.columns > 0 and before.misses > 0
    calls = _reads(monkeypatch)
    context = store.query_context()
    answered = 0
    for as_of in as_ofs:
        rows = {r.pop("synthetic_key"): r for r in context.load_table("items", as_of).to_pylist()}
        calls.clear()  # (load_table reads row groups itself)
        for key in KEYS:
            assert context.fetch_row("items", key, as_of) == rows.get(key), (as_of, key)
            answered += key in rows
        assert calls == [], as_of
    after = row_cache.row_cache_stats()
    assert answered > 0 and after.hits - before.hits >= answered and after.misses == before.misses


def test_the_kept_row_groups_stay_within_their_budget(tmp_path, small_row_groups):
    """The decoded columns kept take at most the budget; past it the least recently used go, and the
    answers stay load_table's (those dropped are decoded again)."""
    store = HistoryStore.open(tmp_path, database="db", settings=SMALL_SNAPSHOTS)
    _items_history(store, hot=True)
    every_t = some_ts(store)
    check_lookups_equal_load_table(store, every_t)
    unbounded = row_cache.row_cache_stats()
    budget = unbounded.held_bytes // 10
    row_cache.set_row_cache_bytes(budget)
    assert row_cache.row_cache_stats().held_bytes == 0
    assert check_lookups_equal_load_table(store, every_t) > 0
    bounded = row_cache.row_cache_stats()
    assert 0 < bounded.held_bytes <= budget < unbounded.held_bytes
    assert bounded.columns < unbounded.columns and bounded.misses > unbounded.columns // 3
    with pytest.raises(ValueError, match="budget"):
        row_cache.set_row_cache_bytes(-1)


def test_the_kept_indexes_stay_within_their_budget(tmp_path, small_row_groups, monkeypatch):
    store = HistoryStore.open(tmp_path, database="db", settings=SMALL_SNAPSHOTS)
    _items_history(store, hot=True)
    every_t = some_ts(store)
    check_lookups_equal_load_table(store, every_t)
    unbounded = key_index.indexed_bytes()
    key_index.forget_indexes()
    budget = unbounded // 10
    monkeypatch.setattr(key_index, "KEY_INDEX_BYTES", budget)
    check_lookups_equal_load_table(store, every_t)
    # within the budget, give or take the last index kept (a row group of four rows here)
    assert 0 < key_index.indexed_bytes() <= budget + 200
    assert unbounded > budget + 200


def test_lookups_follow_the_catalog_state_through_maintenance(tmp_path, small_row_groups):
    """Indexes are kept across states (files never change); each state asks only its own files, so a
    process that looked keys up before an erasure, a merge, a retention or a new compaction answers
    after it as load_table does, without forgetting anything."""
    store = HistoryStore.open(tmp_path, database="db", settings=SMALL_SNAPSHOTS)
    events = _items_history(store)
    every_t = some_ts(store)
    check_lookups_equal_load_table(store, every_t)

    erased = (3, 17, 44)
    store.erase("items", erased, requested_by="test", spark=False, purge_now=True)
    for key in erased:
        assert all(store.fetch_row("items", key, t) is None for t in every_t), key
    check_lookups_equal_load_table(store, every_t)

    store.merge(spark=False, small_file_bytes=1 << 30)
    check_lookups_equal_load_table(store, every_t)

    # a new compaction: later versions of some live keys, one of them deleted
    rng = random.Random(3)
    t = store.frontier + 1
    alive = set(store.load_table("items", t).column(KEY).to_pylist())
    changed = rng.sample(sorted(alive), 10)
    batch = [_update(t + i, k, rng.randint(0, 100)) for i, k in enumerate(changed)] + [_delete(t + 10, changed[0])]
    assert len(_load(store, [batch], alive)) == len(batch)
    assert store.fetch_row("items", changed[0], store.frontier + 1) is None
    check_lookups_equal_load_table(store, some_ts(store))

    purge = (_snapshots(store)[1] + _snapshots(store)[2]) // 2
    store.retain(purge, spark=False)
    with pytest.raises(PurgedTimestampError):
        store.fetch_row("items", 5, purge - 1)
    check_lookups_equal_load_table(store, some_ts(store, purge))
    assert events


def test_a_warm_lookup_searches_only_the_row_groups_its_bloom_filters_keep(tmp_path, small_row_groups, monkeypatch):
    """Where more than ``BLOOM_FIRST`` row groups of a file span a key (a marked file laid out by
    time: every row group's key range covers most keys), their Bloom filters are tested before any
    kept index is searched, and the answers stay load_table's."""
    store = HistoryStore.open(tmp_path, database="db", settings=SMALL_SNAPSHOTS)
    _items_history(store, hot=True)
    monkeypatch.setattr(key_index, "BLOOM_FIRST", 0, raising=False)
    every_t = some_ts(store)[::4]
    check_lookups_equal_load_table(store, every_t)  # warm: every row group asked is indexed
    asked = []
    cached = key_index._cached
    monkeypatch.setattr(key_index, "_cached", lambda spot: asked.append(spot) or cached(spot))
    context = store.query_context()
    searched = ruled_out = 0
    for as_of in every_t:
        for key in KEYS:
            asked.clear()
            context.fetch_row("items", key, as_of)
            for _, path, rg in asked:
                blooms = supertable.read.footer(store.objects, path).blooms
                searched += 1
                ruled_out += blooms is not None and blooms.may_hold([rg], key) == []
    assert searched > 0
    assert ruled_out == 0
    assert check_lookups_equal_load_table(store, every_t) > 0


def test_a_warm_lookup_reads_through_a_kept_reader_and_the_kept_readers_stay_bounded(tmp_path, small_row_groups,
                                                                                       monkeypatch):
    """Reading a row reuses an open reader of its file (no file opened, no Parquet reader built); at
    most ``IDLE_READERS`` stay open, and ``forget_indexes`` closes them."""
    store = HistoryStore.open(tmp_path, database="db", settings=SMALL_SNAPSHOTS)
    _items_history(store, hot=True)
    as_ofs = some_ts(store)[::4]
    check_lookups_equal_load_table(store, as_ofs)  # warm: indexes built, readers opened
    built = []
    original = pq.ParquetFile.__init__

    def counting(self, *args, **kwargs):
        built.append(args)
        original(self, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "__init__", counting)
    assert check_lookups_equal_load_table(store, as_ofs) > 0
    assert built == []
    monkeypatch.undo()
    monkeypatch.setattr(key_index, "IDLE_READERS", 2)
    key_index.forget_indexes()
    check_lookups_equal_load_table(store, as_ofs)
    kept = [reader for readers in key_index._open_readers._idle.values() for reader in readers]
    assert 0 < len(kept) <= 2 and not any(reader.closed for reader in kept)
    key_index.forget_indexes()
    assert all(reader.closed for reader in kept) and not key_index._open_readers._idle


def test_the_row_groups_a_footer_allows_are_those_of_a_fresh_footer_for_any_bounds(tmp_path, small_row_groups):
    """The row groups a file's footer allows for a key and time bounds (kept for the last few bounds
    asked) are those a footer never asked before finds, bounds repeated, alternating and more of them
    than are kept."""
    store = HistoryStore.open(tmp_path, database="db", settings=SMALL_SNAPSHOTS)
    _items_history(store, hot=True)
    rng = random.Random(11)
    ts = list(range(0, store.frontier + 3))
    # few (lower, upper) pairs, many current_at: bounds alike but for one of them
    pairs = [(None, store.frontier + 1), (None, store.frontier // 2), (store.frontier // 3, store.frontier + 1)]
    bounds = [(*rng.choice(pairs), rng.choice([None, *ts])) for _ in range(3 * supertable.read.TIME_MASKS)]
    compared = 0
    for path, entry in store.query_context().state.files.items():
        if entry.table_uuid is None:  # the schema history's files hold no keys
            continue
        cached = supertable.read.footer(store.objects, path)
        if cached.meta.num_row_groups < 2:
            continue
        for lower, upper, current_at in bounds + bounds[::-1] + bounds:
            key = rng.choice(KEYS)
            fresh = replace(cached)  # nothing kept
            assert cached.row_groups_spanning(key, lower, upper, current_at) == \
                fresh.row_groups_spanning(key, lower, upper, current_at), (path, key, lower, upper, current_at)
            compared += 1
    assert compared > 0


@pytest.mark.parametrize("kept_row_groups", [False, True], ids=["row-cache-off", "row-cache-on"])
def test_a_row_its_row_group_does_not_hold_is_a_data_file_error_naming_the_file(tmp_path, kept_row_groups):
    """A row index past its row group's rows (the file changed under its index) is one clear error
    naming the file, read through the row cache or without it."""
    if not kept_row_groups:
        row_cache.set_row_cache_bytes(0)
    store = HistoryStore.open(tmp_path, database="db", settings=SMALL_SNAPSHOTS)
    _items_history(store)
    context = store.query_context()
    as_of = store.frontier + 1
    descriptor = context.resolve("items", as_of)
    key = context.load_table("items", as_of).column("synthetic_key")[0].as_py()
    found = newest_of_key(store.objects, select_files(context.state, descriptor.table_uuid, as_of, (key,)), as_of, key)
    assert found is not None and not found.deleted
    schema = supertable.supertable_schema(context.supercolumns(descriptor.table_uuid))
    target = pa.schema([schema.field(c.supercolumn) for c in descriptor.columns])
    assert key_index.read_version(store.objects, found, target).num_rows == 1
    with pytest.raises(DataFileError, match=found.path):
        key_index.read_version(store.objects, replace(found, row=10**6), target)
