"""Bloom filters on the key column of time-cut files: the hash is Parquet's, a lookup skips the row
groups whose filter rules its key out, and never one that holds it."""

from __future__ import annotations

import random

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from history_pipeline.io.store import LocalStore
from history_pipeline.supertable import (
    DELETED,
    KEY,
    LT,
    ROW_GROUP_ROWS,
    SUPERSEDED,
    FileKind,
    FileMetadata,
    time_cut,
    write_file,
)
from history_pipeline.supertable.bloom import BLOCK_BYTES, SALT, bitset_bytes, xxh64_int64
from history_pipeline.supertable.read import KeyBlooms, footer, read_key


def block_of(key_hash: int, bitset_size: int) -> int:
    """The format's block index of ``key_hash`` for a bitset of ``bitset_size`` bytes (the reference)."""
    return ((key_hash >> 32) * (bitset_size // BLOCK_BYTES)) >> 32


def block_may_hold(block: bytes, key_hash: int) -> bool:
    """Does this 32-byte block have every bit ``key_hash`` sets? The format's check, one salted
    word at a time: the reference ``KeyBlooms.may_hold`` is held to."""
    low = key_hash & 0xFFFFFFFF
    for i, salt in enumerate(SALT):
        bit = ((low * salt) & 0xFFFFFFFF) >> 27
        if not int.from_bytes(block[4 * i:4 * i + 4], "little") >> bit & 1:
            return False
    return True


def _check_against_pyarrow(keys: list[int]) -> bool:
    """Every key of a pyarrow-written filter passes our check of it (no false negative)."""
    buffer = pa.BufferOutputStream()
    pq.write_table(pa.table({"k": pa.array(keys, pa.int64())}), buffer,
                   bloom_filter_options={"k": {"ndv": max(len(keys), 1), "fpp": 0.05}})
    data = buffer.getvalue().to_pybytes()
    column = pq.ParquetFile(pa.BufferReader(data)).metadata.row_group(0).column(0)
    region = data[column.bloom_filter_offset:column.bloom_filter_offset + column.bloom_filter_length]
    size = bitset_bytes(column.bloom_filter_length)
    bits = region[-size:]

    def may_hold(key: int) -> bool:
        key_hash = xxh64_int64(key)
        at = block_of(key_hash, size) * BLOCK_BYTES
        return block_may_hold(bits[at:at + BLOCK_BYTES], key_hash)

    return all(may_hold(k) for k in keys)


def test_every_key_written_passes_the_filter_pyarrow_wrote():
    rng = random.Random(7)
    keys = [0, 1, -1, 2**63 - 1, -(2**63)] + rng.sample(range(-(10**15), 10**15), 5_000)
    assert _check_against_pyarrow(keys)


def test_the_check_of_every_filter_at_once_agrees_with_the_block_by_block_one(tmp_path):
    """``KeyBlooms.may_hold`` (a file's row groups at once, with NumPy) answers as ``block_may_hold``
    does row group by row group, for filters of different sizes in one file, keys present and
    absent, and keeps a row group without a filter."""
    rng = random.Random(9)
    groups = [rng.sample(range(10**6), n) for n in (3_000, 500, 40)]
    store = LocalStore(tmp_path)
    path = "f.parquet"
    with pq.ParquetWriter(store.full_path(path), pa.schema([(KEY, pa.int64())]),
                          bloom_filter_options={KEY: {"ndv": 3_000, "fpp": 0.05}}) as writer:
        for keys in groups:
            writer.write_table(pa.table({KEY: pa.array(keys, pa.int64())}))
    data = (tmp_path / path).read_bytes()
    meta = pq.read_metadata(store.full_path(path))
    spots = [(meta.row_group(rg).column(0).bloom_filter_offset, meta.row_group(rg).column(0).bloom_filter_length)
             for rg in range(meta.num_row_groups)]
    blooms = KeyBlooms(store, path, tuple(spots))
    without_third = KeyBlooms(store, path, (*spots[:2], None))
    answers = set()
    for key in [k for keys in groups for k in keys[:200]] + rng.sample(range(10**6, 2 * 10**6), 2_000):
        key_hash = xxh64_int64(key)
        one_by_one = []
        for offset, length in spots:
            size = bitset_bytes(length)
            at = offset + length - size + block_of(key_hash, size) * BLOCK_BYTES
            one_by_one.append(block_may_hold(data[at:at + BLOCK_BYTES], key_hash))
        expected = [rg for rg, holds in enumerate(one_by_one) if holds]
        assert blooms.may_hold([0, 1, 2], key) == expected, key
        assert without_third.may_hold([0, 1, 2], key) == [rg for rg in expected if rg < 2] + [2]
        assert blooms.may_hold([1], key) == [rg for rg in expected if rg == 1]
        answers.update(one_by_one)
    assert answers == {True, False}  # both answers were checked


def _time_cut_file(store: LocalStore, keys_per_group: int, groups: int, seed: int) -> tuple[str, pa.Table]:
    """A marked version file whose row groups each span the whole key range (updates in random
    key order, cut by time), as ``closed_layout`` leaves them."""
    rng = random.Random(seed)
    span = keys_per_group * groups * 4
    parts = []
    t = 1
    for _ in range(groups):
        keys = sorted(rng.sample(range(span), keys_per_group))
        parts.append(pa.table({
            KEY: pa.array(keys, pa.int64()),
            DELETED: pa.array([False] * len(keys)),
            LT: pa.array(range(t, t + len(keys)), pa.int64()),
            "qty-1": pa.array([rng.randrange(1000) for _ in keys], pa.int64()),
            SUPERSEDED: pa.array([t + len(keys) + 5] * len(keys), pa.int64()),
        }))
        t += len(keys)
    table = pa.concat_tables(parts)
    meta = FileMetadata("db", "t", FileKind.VERSIONS, 1, 1, t, closed_until=t + 10, closed_layout=2)
    assert time_cut(meta)
    written = write_file(LocalStore(store.root), "db/tables/t/cut.parquet", table, meta,
                         row_groups=[keys_per_group] * groups)
    return written.path, table


def test_a_lookup_skips_row_groups_whose_filter_rules_the_key_out_and_finds_every_key(tmp_path):
    store = LocalStore(tmp_path)
    path, table = _time_cut_file(store, ROW_GROUP_ROWS // 4, 8, seed=3)
    cached = footer(store, path)
    assert cached.blooms is not None
    assert all(bounds is not None and bounds[0] < 100 for bounds in cached.key_ranges)  # stats exclude nothing
    keys = table.column(KEY).to_pylist()
    group_of = {}
    for g in range(8):
        for k in keys[g * (ROW_GROUP_ROWS // 4):(g + 1) * (ROW_GROUP_ROWS // 4)]:
            group_of.setdefault(k, set()).add(g)
    rng = random.Random(11)
    skipped = 0
    for key in rng.sample(sorted(group_of), 300):
        kept = cached.row_groups_holding(key)
        assert group_of[key] <= set(kept), key  # never a false negative
        skipped += 8 - len(kept)
    assert skipped > 300 * 8 * 0.8  # most row groups ruled out (each holds a quarter of the span)
    # read_key through the filters equals filtering every row, present and absent keys alike
    schema = table.schema
    entry = _Entry(path)
    for key in rng.sample(sorted(group_of), 20) + [1, 2, 3, max(group_of) + 1]:
        got = read_key(store, [entry], schema, schema.names, key, None, 2**63 - 1)
        want = table.filter(pc.equal(table.column(KEY), key))
        assert got.sort_by([(LT, "ascending")]).equals(want.select(got.column_names)), key


class _Entry:
    def __init__(self, path: str) -> None:
        self.path, self.min_key, self.max_key = path, None, None


def test_duckdb_reads_the_same_rows_from_files_with_filters(tmp_path):
    store = LocalStore(tmp_path)
    path, table = _time_cut_file(store, 2_000, 4, seed=5)
    key = table.column(KEY)[100].as_py()
    rows = duckdb.sql(f"SELECT {KEY}, {LT} FROM read_parquet('{store.full_path(path)}') "
                      f"WHERE {KEY} = {key} ORDER BY {LT}").fetchall()
    want = table.filter(pc.equal(table.column(KEY), key))
    assert rows == list(zip(want.column(KEY).to_pylist(), want.column(LT).to_pylist(), strict=True))


@pytest.mark.parametrize("kind, holds, layout, superseded, expected", [
    (FileKind.VERSIONS, False, 3, [4, 5, 6], True),  # a closed interval's version file
    (FileKind.SNAPSHOT, True, 3, [None, 7, None], True),  # a snapshot piece holding versions
    (FileKind.SNAPSHOT, True, 3, [None, None, None], True),  # (cut by t too)
    # a snapshot's own rows: those superseded in the interval are bucketed by time
    (FileKind.SNAPSHOT, False, 3, [None, 7, None], True),
    (FileKind.SNAPSHOT, False, 3, [None, None, None], False),  # none superseded: one key-sorted run
    (FileKind.VERSIONS, False, None, None, False),  # compaction's key-sorted batch
])
def test_only_time_cut_files_carry_key_filters(tmp_path, kind, holds, layout, superseded, expected):
    meta = FileMetadata("db", "t", kind, 1, 1, 10, closed_layout=layout, holds_versions=holds,
                        snapshot_as_of=5 if kind is FileKind.SNAPSHOT else None)
    assert time_cut(meta, superseded is not None and any(s is not None for s in superseded)) is expected
    table = pa.table({KEY: pa.array([1, 2, 3], pa.int64()), DELETED: pa.array([False] * 3),
                      LT: pa.array([1, 2, 3], pa.int64())})
    if superseded is not None:
        table = table.append_column(SUPERSEDED, pa.array(superseded, pa.int64()))
    written = write_file(LocalStore(tmp_path), "db/tables/t/f.parquet", table, meta)
    column = pq.read_metadata(LocalStore(tmp_path).full_path(written.path)).row_group(0).column(0)
    assert (column.bloom_filter_offset is not None) is expected


def test_the_filter_cache_keeps_within_its_budget_and_counts_what_it_holds(tmp_path, monkeypatch):
    from history_pipeline.supertable import read as read_module

    store = LocalStore(tmp_path)
    paths = []
    for seed in range(4):
        path, _ = _time_cut_file(store, 1_000, 2, seed=seed)
        target = f"db/tables/t/cut-{seed}.parquet"
        (tmp_path / target).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).rename(tmp_path / target)
        paths.append(target)
    monkeypatch.setattr(read_module, "_BLOOMS", type(read_module._BLOOMS)())
    monkeypatch.setattr(read_module, "_bloom_held", [0])
    one_file = None
    for i, path in enumerate(paths):
        blooms = footer(store, path).blooms
        assert blooms is not None
        words = read_module._filter_words(blooms)
        one_file = one_file or words.nbytes
        if i == 0:  # room for two files' filters, not three
            monkeypatch.setattr(read_module, "_BLOOM_CACHE_BYTES", 2 * one_file + one_file // 2)
        held = sum(kept.words.nbytes for kept in read_module._BLOOMS.values())
        assert read_module._bloom_held[0] == held <= max(read_module._BLOOM_CACHE_BYTES, one_file)
    assert [p for _, p in read_module._BLOOMS] == paths[-2:]  # the oldest went first
