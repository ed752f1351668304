"""``overlay``: a snapshot's rows overridden by the newest later version of each key, checked
against a plain dictionary model on random histories (versions in several files, in any file
order, deletes and re-inserts, snapshot pieces out of key order)."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from history_pipeline.supertable import DELETED, KEY, LT
from history_pipeline.supertable.read import gather, overlay, survivors_in_key_order

SCHEMA = pa.schema([pa.field(KEY, pa.int64(), nullable=False), pa.field(DELETED, pa.bool_(), nullable=False),
                    pa.field(LT, pa.int64(), nullable=False), pa.field("v", pa.int64())])


def _table(rows: list[tuple[int, bool, int, int | None]]) -> pa.Table:
    columns = list(zip(*rows, strict=True)) if rows else [[], [], [], []]
    return pa.table([pa.array(c, f.type) for c, f in zip(columns, SCHEMA, strict=True)], schema=SCHEMA)


#: key universes: sparse (keys are sorted), dense (a slot per key), dense near the int64 bounds
UNIVERSES = {"sparse": range(-50, 10_000), "dense": range(-50, 400),
             "low": range(-2**63, -2**63 + 400), "high": range(2**63 - 400, 2**63)}


def _history(seed: int, universe: range = UNIVERSES["sparse"]) -> tuple[pa.Table, pa.Table,
                                                                          dict[int, tuple[int, int | None]]]:
    rng = random.Random(seed)
    keys = rng.sample(universe, rng.randrange(0, 300))
    base_rows = [(k, False, rng.randrange(1, 100), rng.randrange(1000)) for k in keys]
    model = {k: (t, v) for k, _, t, v in base_rows}
    files: list[list[tuple[int, bool, int, int | None]]] = []
    t = 100
    for _ in range(rng.randrange(0, 5)):  # version files with disjoint, increasing t ranges
        versions = []
        for _ in range(rng.randrange(0, 200)):
            t += 1
            key = rng.choice(keys) if keys and rng.random() < 0.7 else rng.choice(universe)
            if rng.random() < 0.15:
                versions.append((key, True, t, None))
                model.pop(key, None)
            else:
                value = rng.randrange(1000)
                versions.append((key, False, t, value))
                model[key] = (t, value)
        files.append(sorted(versions))  # one file is (key, t) ordered
    rng.shuffle(files)  # a dataset may hand the files back in any order
    pieces = [base_rows[i::3] for i in range(3)]
    rng.shuffle(pieces)
    base = _table([r for piece in pieces for r in sorted(piece)])
    changes = _table([r for f in files for r in f])
    return base, changes, model


@pytest.mark.parametrize("universe", sorted(UNIVERSES))
@pytest.mark.parametrize("seed", range(30))
def test_overlay_equals_the_model(seed: int, universe: str) -> None:
    base, changes, model = _history(seed, UNIVERSES[universe])
    got = overlay(base, changes)
    assert got.column(KEY).to_pylist() == sorted(model)
    assert list(zip(got.column(LT).to_pylist(), got.column("v").to_pylist(), strict=True)) == \
        [model[k] for k in sorted(model)]
    assert not any(got.column(DELETED).to_pylist())


@pytest.mark.parametrize("universe", sorted(UNIVERSES))
def test_overlay_without_a_snapshot_or_without_changes(universe: str) -> None:
    base, changes, _ = _history(7, UNIVERSES[universe])
    newest: dict[int, tuple[int, bool]] = {}
    for key, deleted, t in zip(*(changes.column(c).to_pylist() for c in (KEY, DELETED, LT)), strict=True):
        if key not in newest or t > newest[key][0]:
            newest[key] = (t, deleted)
    only_changes = overlay(base.slice(0, 0), changes)
    assert only_changes.column(KEY).to_pylist() == sorted(k for k, (_, gone) in newest.items() if not gone)
    assert only_changes.column(LT).to_pylist() == [newest[k][0] for k in only_changes.column(KEY).to_pylist()]
    only_base = overlay(base, changes.slice(0, 0))
    assert only_base.column(KEY).to_pylist() == sorted(base.column(KEY).to_pylist())



@pytest.mark.parametrize("universe", [*sorted(UNIVERSES), "full"])
@pytest.mark.parametrize("seed", range(5))
def test_unique_keys_alone_come_back_in_key_order_with_their_rows(seed: int, universe: str) -> None:
    """A closed read's current rows (unique keys in row-group runs, at row numbers of their own)
    are ordered by the same function with no later rows; "full": every key of a span, once."""
    rng = random.Random(seed)
    if universe == "full":
        keys = list(range(seed * 1000 - 7, seed * 1000 + rng.randrange(1, 300)))
        rng.shuffle(keys)
    else:
        keys = rng.sample(UNIVERSES[universe], rng.randrange(0, 300))
    rows = np.array(rng.sample(range(10_000), len(keys)), dtype=np.int32)
    none = np.empty(0, dtype=np.int64)
    order, ordered_keys = survivors_in_key_order(np.array(keys, dtype=np.int64), None, none,
                                                 np.empty(0, dtype=bool), none, rows)
    expected = sorted(zip(keys, rows.tolist(), strict=True))
    assert ordered_keys.tolist() == [k for k, _ in expected]
    assert order.tolist() == [r for _, r in expected]


@pytest.mark.parametrize("kind", ["updates", "deletes", "beyond"])
@pytest.mark.parametrize("seed", range(5))
def test_a_snapshot_of_every_key_in_its_span_overlaid_with_changes(seed: int, kind: str) -> None:
    """A snapshot holding every key of its span (a table without deletes) under updates of those
    keys, and deletes of some of them ("deletes"), or keys inserted beyond the span ("beyond"):
    the model's rows, in key order."""
    rng = random.Random(seed)
    low = rng.choice([0, -40, 2**40])
    base_rows = [(k, False, 1, rng.randrange(1000)) for k in range(low, low + rng.randrange(1, 300))]
    model = {k: (t, v) for k, _, t, v in base_rows}
    versions = []
    for t in range(100, 100 + rng.randrange(1, 400)):
        key = rng.choice(base_rows)[0]
        gone = kind == "deletes" and rng.random() < 0.1
        if kind == "beyond" and rng.random() < 0.1:
            key = low + len(base_rows) + rng.randrange(1, 50)
        value = None if gone else rng.randrange(1000)
        versions.append((key, gone, t, value))
        if gone:
            model.pop(key, None)
        else:
            model[key] = (t, value)
    got = overlay(_table(base_rows), _table(sorted(versions)))
    assert got.column(KEY).to_pylist() == sorted(model)
    assert list(zip(got.column(LT).to_pylist(), got.column("v").to_pylist(), strict=True)) == \
        [model[k] for k in sorted(model)]


def test_a_large_gather_decodes_dictionaries_in_halves_equal_to_arrow_take() -> None:
    """``gather`` above its threshold (columns on threads, each dictionary column unified from its
    chunks' own dictionaries and decoded in two halves) equals Arrow's take and cast."""
    rng = np.random.default_rng(3)
    n = 150_001
    names = pa.array([None if i % 97 == 0 else f"name-{i % 1000}" for i in range(n)], pa.string())
    chunks = [names.slice(a, b - a).dictionary_encode() for a, b in ((0, 40_000), (40_000, 40_000), (40_000, n))]
    values = pa.array(rng.integers(0, 1000, n), pa.int64())
    read = pa.table({"v": pa.chunked_array([values.slice(0, 70_000), values.slice(70_000)]),
                     "name": pa.chunked_array(chunks)})
    target = pa.schema([pa.field("v", pa.int64()), pa.field("name", pa.string())])
    indices = pa.array(rng.permutation(n)[: n - 5].astype(np.int32))
    got = gather(read, indices, target)
    assert got.schema == target
    assert got.equals(read.take(indices).cast(target))
