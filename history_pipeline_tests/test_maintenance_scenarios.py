"""Maintenance scenarios over every data type and every schema change, against the model.

A fixed history (``typed_history``) writes every type of the contract (integers at their
limits, NUMERIC with scale and unconstrained, DOUBLE/REAL with NaN and infinities, TEXT with
empty strings and unicode, BOOLEAN, DATE, TIME, TIMESTAMP(TZ), INTERVAL, UUID, BYTEA, JSONB,
arrays) through every schema change (add with default, rename, retype, reorder, drop column,
rename table, a table re-created under an old name, drop table), with deletes and re-inserts
of the same keys. Small ``StoreSettings`` make snapshots, pieces and closed intervals happen.
Each scenario runs a sequence of maintenance steps (merge, snapshots, retention at a snapshot
or a schema change, rebuild, cleanup, cold-tier load-back, export and load_export, erasure)
and after each step compares every query API, at every answerable T, with ``model.py``.
"""

from __future__ import annotations

import math
import random
import shutil
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from history_pipeline import HistoryStore, PurgedTimestampError, StoreSettings
from history_pipeline.catalog.files import select_files
from history_pipeline.catalog.model import CatalogState, FileKind
from history_pipeline.io.store import open_store
from history_pipeline.maintenance.export import load_export
from history_pipeline.types import Interval, TypeKind
from history_pipeline_tests.model import BaseDatabase, erase_keys, names_of, nullability_of, replayed
from history_pipeline_tests.test_compaction import write
from history_pipeline_tests.test_maintenance_properties import mutations_by_key

COLS = [
    ("c_id", "id", "INTEGER"), ("c_sm", "sm", "SMALLINT"), ("c_big", "big", "BIGINT"),
    ("c_num", "num", "NUMERIC(10,3)"), ("c_any", "anynum", "NUMERIC"), ("c_dbl", "dbl", "DOUBLE PRECISION"),
    ("c_rl", "rl", "REAL"), ("c_txt", "txt", "TEXT"), ("c_vc", "vc", "VARCHAR(8)"), ("c_flag", "flag", "BOOLEAN"),
    ("c_day", "day", "DATE"), ("c_tod", "tod", "TIME"), ("c_ts", "ts", "TIMESTAMP"), ("c_tz", "tstz", "TIMESTAMPTZ"),
    ("c_span", "span", "INTERVAL"), ("c_uid", "uid", "UUID"), ("c_raw", "raw", "BYTEA"), ("c_doc", "doc", "JSONB"),
    ("c_ints", "ints", "INTEGER[]"), ("c_tags", "tags", "TEXT[]"),
]
POOLS = {
    "INTEGER": [0, -1, 2147483647, -2147483648, 42],
    "BIGINT": [2**63 - 1, -2**63, 0, 123456789012],
    "SMALLINT": [32767, -32768, 0, 7],
    "NUMERIC(10,3)": ["0.000", "-1234567.891", "12.340", "0.001"],
    "NUMERIC": ["0.00000000000000000001", "123456789012345678901234567890.5", "-0", "1.10", "7"],
    "DOUBLE PRECISION": ["NaN", "Infinity", "-Infinity", 0.1, -0.0, 1e308, 5e-324, 3],
    "REAL": [1.5, "NaN", "-Infinity", 0.1, -2.0],
    "TEXT": ["", "ü😀", "line\nbreak", "a'b\"c", "x" * 40],
    "VARCHAR(8)": ["abc", "", "ñandú"],
    "BOOLEAN": [True, False],
    "DATE": ["2024-02-29", "0001-01-01", "9999-12-31", "1970-01-01"],
    "TIME": ["00:00:00", "23:59:59.999999", "12:34:56.5"],
    "TIMESTAMP": ["2024-02-29T12:00:00", "1969-12-31T23:59:59.999999", "0001-01-01T00:00:00", "9999-12-31T23:59:59"],
    "TIMESTAMPTZ": ["2024-03-10T02:30:00+05:30", "1970-01-01T00:00:00+00:00", "1969-07-20T20:17:40.5-04:00"],
    "INTERVAL": [{"months": 1, "days": -2, "micros": 3000000}, {"months": 0, "days": 0, "micros": 0},
                 {"months": -14, "days": 400, "micros": -1}],
    "UUID": ["00000000-0000-0000-0000-000000000000", "123e4567-e89b-12d3-a456-426614174000",
             "ffffffff-ffff-ffff-ffff-ffffffffffff"],
    "BYTEA": ["", "AAEC/w==", "3q2+7w=="],
    "JSONB": [{"a": [1, None, "x"]}, [], "str", 1.5, True, {"nested": {"k": "ü"}}, 0],
    "INTEGER[]": [[1, None, 3], [], [[1, 2], [3, 4]], [None]],
    "TEXT[]": [["a", "", None], ["ü"], []],
    "NUMERIC(6,2)": ["1.50", "-9999.99", "0.00"],
    "TEXT_INTS": ["12", "-7", "0", "9223372036854775807"],  # TEXT values that cast to BIGINT
}


def value(rng, ty):
    if rng.random() < 0.12:
        return None
    return rng.choice(POOLS[ty])


def typed_history(seed=1):
    """Row mutations over every type, with a schema change every few timestamps."""
    rng = random.Random(seed)
    tables = {}  # uuid -> {"name", "cols": {cuuid: type}, "keys": set}
    events = []
    t = 0

    def emit(e):
        events.append(e)

    def create(uuid, name, cols):
        nonlocal t
        t += 1
        tables[uuid] = {"name": name, "cols": {c: ty for c, _, ty in cols}, "keys": set()}
        emit({"op": "create_table", "t": t, "table_uuid": uuid, "table_name": name,
              "columns": [{"column_uuid": c, "column_name": n, "data_type": ty} for c, n, ty in cols]})

    def rows(uuid, n_ts=2):
        nonlocal t
        table = tables[uuid]
        for _ in range(n_ts):
            t += 1
            for _ in range(rng.randint(1, 4)):
                live = sorted(table["keys"])
                roll = rng.random()
                if not live or roll < 0.3:
                    key = rng.randint(1, 8)
                    if key in table["keys"]:
                        continue
                    table["keys"].add(key)
                    emit({"op": "insert", "t": t, "table_uuid": uuid, "key": key,
                          "values": {c: value(rng, ty) for c, ty in table["cols"].items() if rng.random() < 0.9}})
                elif roll < 0.8:
                    key = rng.choice(live)
                    cols = rng.sample(sorted(table["cols"]), rng.randint(1, min(4, len(table["cols"]))))
                    emit({"op": "update", "t": t, "table_uuid": uuid, "key": key,
                          "values": {c: value(rng, table["cols"][c]) for c in cols}})
                else:
                    key = rng.choice(live)
                    table["keys"].discard(key)
                    emit({"op": "delete", "t": t, "table_uuid": uuid, "key": key})

    def schema(uuid, op, **fields):
        nonlocal t
        t += 1
        emit({"op": op, "t": t, "table_uuid": uuid, **fields})

    create("TA", "items", COLS)
    rows("TA", 3)
    schema("TA", "add_column", column={"column_uuid": "c_extra", "column_name": "extra", "data_type": "NUMERIC(6,2)"},
           default="1.50")
    tables["TA"]["cols"]["c_extra"] = "NUMERIC(6,2)"
    rows("TA", 2)
    schema("TA", "rename_column", column_uuid="c_txt", new_name="label")
    rows("TA", 2)
    schema("TA", "change_column_type", column_uuid="c_id", data_type="BIGINT")
    tables["TA"]["cols"]["c_id"] = "BIGINT"
    rows("TA", 2)
    schema("TA", "change_column_type", column_uuid="c_num", data_type="TEXT")
    tables["TA"]["cols"]["c_num"] = "TEXT"
    rows("TA", 1)
    schema("TA", "reorder_column", column_uuid="c_dbl", ordinal_key="0")
    rows("TA", 2)
    t += 1
    for key in sorted(tables["TA"]["keys"]):
        emit({"op": "update", "t": t, "table_uuid": "TA", "key": key, "values": {"c_vc": "v"}})
    schema("TA", "change_column_nullable", column_uuid="c_vc", is_nullable=False)
    t += 1  # a key deleted and inserted again in one transaction
    again = sorted(tables["TA"]["keys"])[0]
    emit({"op": "delete", "t": t, "table_uuid": "TA", "key": again})
    emit({"op": "insert", "t": t, "table_uuid": "TA", "key": again, "values": {"c_id": 7, "c_vc": "again"}})
    schema("TA", "change_column_nullable", column_uuid="c_vc", is_nullable=True)
    rows("TA", 1)
    schema("TA", "drop_column", column_uuid="c_sm")
    del tables["TA"]["cols"]["c_sm"]
    rows("TA", 2)
    schema("TA", "rename_table", new_name="goods")
    tables["TA"]["name"] = "goods"
    create("TB", "items", [("b_k", "k", "TEXT"), ("b_v", "v", "DOUBLE PRECISION"), ("b_j", "j", "JSONB")])
    rows("TB", 2)
    rows("TA", 2)
    schema("TB", "change_column_type", column_uuid="b_v", data_type="TEXT")
    tables["TB"]["cols"]["b_v"] = "TEXT"
    rows("TB", 2)
    schema("TB", "drop_table")
    del tables["TB"]
    create("TC", "items", [("x_a", "a", "INTEGER[]"), ("x_b", "b", "INTERVAL"), ("x_c", "c", "BYTEA")])
    rows("TC", 3)
    rows("TA", 3)
    schema("TA", "change_column_type", column_uuid="c_flag", data_type="TEXT")
    tables["TA"]["cols"]["c_flag"] = "TEXT"
    rows("TA", 3)
    rows("TC", 2)
    return events


def split(events, every=3):
    """Segments cut at timestamp boundaries, about ``every`` timestamps each."""
    batches, current, seen = [], [], set()
    for i, e in enumerate(events):
        current.append(e)
        seen.add(e["t"])
        nxt = events[i + 1]["t"] if i + 1 < len(events) else None
        if nxt != e["t"] and len(seen) >= every:
            batches.append(current)
            current, seen = [], set()
    if current:
        batches.append(current)
    return batches


SMALL = StoreSettings(snapshot_min_versions=6, snapshot_ratio=0.2, spark_master=None)
PIECES = StoreSettings(snapshot_min_versions=6, snapshot_ratio=0.2, snapshot_piece_rows=5, interval_piece_rows=5,
                       spark_master=None)
ROW_OPS = ("insert", "update", "delete")


# --- comparing values strictly --------------------------------------------------------------

def norm(value: Any, scale: bool = True) -> Any:
    """A form in which equal means equal in the contract: NaN equals NaN, a Decimal keeps its
    scale (``scale=False``: compared by value, as SQL's fitted DECIMAL(p, s) shows it; NUMERIC has
    no negative zero), True is not 1, an INTERVAL is its three fields, an instant is compared in UTC."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, float):
        return ("nan",) if math.isnan(value) else ("float", value, math.copysign(1.0, value))
    if isinstance(value, int):
        return ("int", value)
    if isinstance(value, Decimal):
        if not scale:
            return ("dec", abs(value) if value.is_zero() else value)
        return ("dec", value.as_tuple().exponent if value.is_zero() else value.as_tuple())
    if isinstance(value, Interval):
        return ("interval", value.months, value.days, value.micros)
    if isinstance(value, pa.MonthDayNano):
        return ("interval", value.months, value.days, value.nanoseconds // 1000)
    if isinstance(value, list):
        return [norm(v, scale) for v in value]
    if isinstance(value, dict):
        return {k: norm(v, scale) for k, v in value.items()}
    if hasattr(value, "utcoffset") and getattr(value, "tzinfo", None) is not None:
        return ("instant", (value - value.utcoffset()).replace(tzinfo=None))
    return value


def _sql_value(data_type, value):
    """SQL gives an unconstrained NUMERIC back as its exact decimal text."""
    if data_type.kind is TypeKind.NUMERIC and isinstance(value, str):
        return Decimal(value)
    return value


def expected_rows(model: BaseDatabase, uuid: str, as_of: int, scale: bool = True) -> dict[int, dict[str, Any]]:
    cols = names_of(model, uuid, as_of)
    rows = model.state_as_of(as_of)[uuid]["rows"]
    return {k: {n: norm(row.get(u), scale) for u, n, _ in cols} for k, row in rows.items()}


def rows_of(table: pa.Table, types: dict[str, Any] | None = None) -> dict[int, dict[str, Any]]:
    out = {}
    for row in table.to_pylist():
        key = row.pop("synthetic_key")
        assert key not in out, f"key {key} twice"
        out[key] = {n: norm(_sql_value(types[n], v), False) if types else norm(v) for n, v in row.items()}
    return out


def _schema_change_between(events, uuid, lo, hi):
    """True when a schema event of ``uuid`` has lo <= t < hi."""
    return any(lo <= e["t"] < hi and e.get("table_uuid") == uuid and e["op"] not in ROW_OPS + ("close",)
               for e in events)


def _check_diff(store, model, events, uuid, name, lo, hi):
    before, after = expected_rows(model, uuid, lo), expected_rows(model, uuid, hi)
    got = store.diff(name, from_=lo, to=hi)
    where = (name, lo, hi)
    assert [d["key"] for d in got["inserted"]] == sorted(after.keys() - before.keys()), where
    assert [d["key"] for d in got["deleted"]] == sorted(before.keys() - after.keys()), where
    changed = sorted(k for k in before.keys() & after.keys() if before[k] != after[k])
    assert [d["key"] for d in got["changed"]] == changed, where
    assert all(norm(d["after"]) == after[d["key"]] for d in got["changed"] + got["inserted"]), where
    assert all(norm(d["before"]) == before[d["key"]] for d in got["changed"] + got["deleted"]), where


def expected_schema_history(model: BaseDatabase, events: list[dict], as_of: int) -> list[tuple]:
    """(table uuid, table name, t, columns as (uuid, name, type, nullable) or None) of every schema
    change below ``as_of``: a rename is a null descriptor under the old name and the full one."""
    rows, names = [], {}
    for e in events:
        if e["t"] >= as_of or e["op"] in ROW_OPS + ("close",):
            continue
        uuid, t = e["table_uuid"], e["t"]
        if e["op"] in ("drop_table", "rename_table"):
            rows.append((uuid, names[uuid], t, None))
        if e["op"] == "drop_table":
            continue
        if e["op"] in ("create_table", "rename_table"):
            names[uuid] = e["table_name"] if e["op"] == "create_table" else e["new_name"]
        cols = [(u, n, str(ty), nullable) for (u, n, ty), nullable
                in zip(names_of(model, uuid, t + 1), nullability_of(model, uuid, t + 1), strict=True)]
        rows.append((uuid, names[uuid], t, cols))
    return sorted(rows, key=lambda r: (r[2], r[0], r[1], repr(r[3])))


def schema_history_rows(store: HistoryStore, as_of: int) -> list[tuple]:
    got = store.sql("SELECT * FROM _history_catalog.schema_history", as_of).to_pylist()
    return sorted(((r["table_uuid"], r["table_name"], r["logical_timestamp"], None if r["schema_descriptor"] is None
                    else [(c["column_uuid"], c["column_name"], c["data_type"], c["is_nullable"])
                          for c in r["schema_descriptor"]["column_descriptors"]]) for r in got),
                  key=lambda r: (r[2], r[0], r[1], repr(r[3])))


def _read_of(state: CatalogState, uuid: str, as_of: int) -> tuple:
    """What a read of ``uuid`` as of ``as_of`` takes: its files, and how it reads them (a filter
    over files closed past ``as_of``, marked files and the versions since, or the join)."""
    selection = select_files(state, uuid, as_of)
    return (tuple(f.path for f in selection.snapshot), tuple(f.path for f in selection.versions),
            selection.closed, selection.marked_and_since is not None)


def check(store: HistoryStore, model: BaseDatabase, events: list[dict], erased: dict[str, set[int]] | None = None,
          as_ofs: list[int] | str = "boundaries", diffs: bool = True, also: tuple[int, ...] = ()) -> None:
    """get_catalog and load_table against the model at every answerable T; every other query API
    (load_table unordered and by uuid, fetch_row, SQL, and diff unless ``diffs`` is False) at
    ``as_ofs``: "every" T, the T around snapshots and schema changes ("boundaries", plus the T of
    ``also``), or a list (then only those T at all); then row_history, the schema history and
    verify(). Past the ends, those other APIs are checked once per read (diff: per pair of reads)
    over the same files, read the same way, under the same name, columns and nullability: two T of
    one read differ only in the T its rows are filtered by, which load_table checks at every T."""
    erased = erased or {}
    earliest, frontier = store.earliest, store.frontier
    layout = store.catalog_state()
    checked: set[tuple] = set()  # the reads (and pairs of reads diffed) checked by the other APIs

    def first(*read: Any) -> bool:
        """True the first time ``read`` is seen, and at the ends."""
        if read[0] in (earliest, frontier + 1) or read[1:] not in checked:
            checked.add(read[1:])
            return True
        return False
    if earliest > 0:
        with pytest.raises(PurgedTimestampError):
            store.query_context().check_as_of(earliest - 1)
    every: Any = range(earliest, frontier + 2)
    if as_ofs == "boundaries":
        as_ofs = sorted({*_boundaries(store, events), *also})
    elif as_ofs != "every":
        every = as_ofs  # a list: those T only
    for as_of in every:
        state = model.state_as_of(as_of)
        catalog = {d.table_uuid: d for d in store.get_catalog(as_of)}
        assert sorted(catalog) == sorted(state), as_of
        for uuid, table in state.items():
            name = table["name"]
            cols = names_of(model, uuid, as_of)
            descriptor = catalog[uuid]
            assert descriptor.table_name == name, as_of
            assert [(c.column_uuid, c.column_name, c.data_type) for c in descriptor.columns] == cols, (name, as_of)
            assert [c.is_nullable for c in descriptor.columns] == nullability_of(model, uuid, as_of), (name, as_of)
            expected = expected_rows(model, uuid, as_of)
            where = (name, as_of)
            got = store.load_table(name, as_of, ordered=True)
            assert got.column_names == ["synthetic_key", *(n for _, n, _ in cols)], where
            keys = got.column("synthetic_key").to_pylist()
            assert keys == sorted(keys), where
            assert rows_of(got) == expected, where
            if as_ofs != "every" and as_of not in as_ofs:
                continue
            read = _read_of(layout, uuid, as_of)
            shape = (name, tuple(cols), tuple(nullability_of(model, uuid, as_of)))
            if first(as_of, uuid, read, shape):
                assert rows_of(store.load_table(name, as_of)) == expected, where  # the default: no promised order
                assert rows_of(store.load_table(uuid, as_of)) == expected, where
                if as_of in (earliest, frontier + 1):  # the streamed forms, in small batches
                    for ordered in (True, False):
                        streamed = store.load_table_reader(name, as_of, batch_size=2, ordered=ordered).read_all()
                        assert rows_of(streamed) == expected, (name, as_of, ordered)
                for key in [*sorted(expected), 99]:
                    row = store.fetch_row(name, key, as_of)
                    assert (None if row is None else norm(row)) == expected.get(key), (name, key, as_of)
                types = {n: ty for _, n, ty in cols}
                by_value = expected_rows(model, uuid, as_of, scale=False)
                assert rows_of(store.sql(f'SELECT * FROM "{name}"', as_of), types) == by_value, where
                if as_of in (earliest, frontier + 1):
                    streamed = store.sql_reader(f'SELECT * FROM "{name}"', as_of, batch_size=2).read_all()
                    assert rows_of(streamed, types) == by_value, where
            if diffs and as_of - 1 >= earliest and uuid in model.state_as_of(as_of - 1) \
                    and not _schema_change_between(events, uuid, as_of - 1, as_of):
                if first(as_of, uuid, "diff", _read_of(layout, uuid, as_of - 1), read, shape):
                    _check_diff(store, model, events, uuid, name, as_of - 1, as_of)
                lo = max(earliest, *(e["t"] + 1 for e in events if e.get("table_uuid") == uuid
                                     and e["op"] not in ROW_OPS and e["t"] < as_of))
                # from the table's last schema change: the changes of several T at once
                if lo < as_of - 1 and first(as_of, uuid, "diff from", _read_of(layout, uuid, lo), read, shape):
                    _check_diff(store, model, events, uuid, name, lo, as_of)
    for as_of in {earliest, frontier + 1}:  # schema history is kept whatever is purged
        assert schema_history_rows(store, as_of) == expected_schema_history(model, events, as_of), as_of
    latest = model.state_as_of(frontier + 1)
    for (uuid, key), seq in mutations_by_key(events).items():
        if uuid not in latest:
            continue  # a dropped table's history is not asked for here
        if key in erased.get(uuid, ()):
            assert store.row_history(uuid, key) == [], (uuid, key)
            continue
        below = [m for m in seq if m[0] < earliest]
        wanted = [m for m in seq if m[0] >= earliest]
        if below and not below[-1][1]:
            wanted.insert(0, below[-1])  # retention keeps the newest live version as of the purge point
        got = store.row_history(uuid, key)
        assert [(v["logical_timestamp"], v["is_deleted"]) for v in got] == wanted, (uuid, key)
        for version in got:
            if not version["is_deleted"]:
                t = version["logical_timestamp"]
                assert norm(version["values"]) == expected_rows(model, uuid, t + 1)[key], (uuid, key, t)
    assert store.verify() == []


# --- the scenarios --------------------------------------------------------------------------

def build(root, settings=SMALL, every=3, seed=1):
    """A store with the typed history written as sealed segments; the model of it (not applied)."""
    events = typed_history(seed)
    segments = split(events, every)
    store = HistoryStore.open(root, database="db", settings=settings)
    write(store, *segments)
    return store, events, segments


def compacted(root, settings=SMALL, every=3, seed=1):
    store, events, _ = build(root, settings, every, seed)
    store.compact(spark=False)
    return store, replayed(events), events


@pytest.fixture(scope="module")
def compacted_copy(tmp_path_factory):
    """``compacted`` at ``root`` as a copy of one compaction per settings made once for the
    module: the scenarios start from the same compacted history, and each changes its own copy."""
    made: dict[StoreSettings, Path] = {}

    def copy(root: Path, settings: StoreSettings = SMALL):
        if settings not in made:
            made[settings] = tmp_path_factory.mktemp("compacted") / "root"
            compacted(made[settings], settings)
        shutil.copytree(made[settings], root)
        store = HistoryStore.open(root, database="db", settings=settings)
        events = typed_history()
        return store, replayed(events), events

    return copy


@pytest.mark.slow
def test_every_type_and_schema_change_reads_back_exactly(tmp_path, compacted_copy):
    store, model, events = compacted_copy(tmp_path / "root")
    assert store.catalog_state().files_of("TA", FileKind.SNAPSHOT), "snapshots must happen on this history"
    # every T is read whole; every other API at the T where the files or the schema a read uses
    # change (each snapshot, schema change, creation, rename, drop, the ends) and at a few T in
    # between, drawn with a fixed seed: between two boundaries a read takes the same files and schema
    between = [t for t in range(store.earliest, store.frontier + 2) if t not in _boundaries(store, events)]
    check(store, model, events, also=tuple(random.Random(11).sample(between, 5)))


def _schema_ts(events, uuid="TA"):
    return [e["t"] for e in events if e.get("table_uuid") == uuid and e["op"] not in ROW_OPS + ("close",)]


def _snapshot_ts(store, uuid="TA"):
    return sorted({f.snapshot_as_of for f in store.catalog_state().files_of(uuid, FileKind.SNAPSHOT)})


def _probe(store, events):
    """A few T for the checks between steps: the ends, the newest snapshot, the first retype."""
    snaps = _snapshot_ts(store)
    retype = next(e["t"] for e in events if e["op"] == "change_column_type")
    points = {store.earliest, store.earliest + 1, store.frontier + 1, retype + 1,
              *snaps[-1:], *(s - 1 for s in snaps[-1:])}
    return sorted(p for p in points if store.earliest <= p <= store.frontier + 1)


def _boundaries(store, events):
    """The T worth checking after a step: at and just before each snapshot, at and just after a
    retype, a table's creation, rename or drop, the purge point and the frontier."""
    points = {store.earliest, store.earliest + 1, store.frontier + 1}
    for t in _snapshot_ts(store):
        points |= {t - 1, t}
    for e in events:
        if e["op"] in ("change_column_type", "create_table", "rename_table", "drop_table", "add_column"):
            points |= {e["t"], e["t"] + 1}
    return sorted(p for p in points if store.earliest <= p <= store.frontier + 1)


def run_step(store, step, cold_uri):
    """One maintenance step by name (``retain@T`` purges before T)."""
    if step == "merge":
        store.merge(spark=False, small_file_bytes=10**9)
    elif step == "snapshot":
        store.refresh_snapshots(force=True, spark=False)
    elif step == "refresh":
        store.refresh_snapshots(spark=False)
    elif step == "rebuild":
        store.rebuild_catalog()
    elif step == "cleanup":
        store.cleanup(grace=timedelta(0))
    elif step == "load_back":
        store.load_cold_tier(cold_uri)
    elif step.startswith("retain@"):
        store.retain(purge_before=int(step.split("@")[1]), cold_tier=cold_uri, spark=False)
    else:  # pragma: no cover - a typo in a scenario
        raise AssertionError(step)


def _purge_points(store, events):
    """Named purge points of the typed history: on a snapshot, on / after a schema change."""
    snaps = [t for t in _snapshot_ts(store) if t > 1]
    retype = next(e["t"] for e in events if e["op"] == "change_column_type" and e["table_uuid"] == "TA")
    rename = next(e["t"] for e in events if e["op"] == "rename_table")
    drop = next(e["t"] for e in events if e["op"] == "drop_table")
    return {"snap": snaps[0], "snap2": snaps[len(snaps) // 2], "retype": retype, "after_retype": retype + 1,
            "rename": rename, "after_rename": rename + 1, "drop": drop, "after_drop": drop + 1}


def run_checked(store, model, events, steps, points, cold_uri):
    """Run ``steps`` (``retain@name`` purges to ``points[name]``, skipped below ``earliest``),
    checking against the model after each retention, load-back and rebuild, and at the end."""
    for i, step in enumerate(steps):
        if step.startswith("retain@"):
            step = f"retain@{points[step.split('@')[1]]}"
            if int(step.split("@")[1]) < store.earliest:
                continue
        run_step(store, step, cold_uri)
        if i < len(steps) - 1 and (step.startswith("retain@") or step in ("load_back", "rebuild")):
            # not after the last step: the boundaries checked below hold the probe's T. Diffs are
            # checked at every boundary after the last step; here the reads they are the change of
            check(store, model, events, as_ofs=_probe(store, events), diffs=False)
    check(store, model, events)


SEQUENCES = {
    "retain_on_snapshot_rebuild_load_back": ["retain@snap", "rebuild", "load_back", "merge", "cleanup", "rebuild"],
    "retain_on_retype_then_rename": ["retain@retype", "merge", "snapshot", "retain@after_rename", "cleanup",
                                     "rebuild", "load_back"],
    "retain_on_drop_and_after": ["merge", "retain@drop", "load_back", "retain@after_drop", "cleanup", "rebuild",
                                 "load_back"],
}


@pytest.mark.slow
@pytest.mark.parametrize("sequence", sorted(SEQUENCES))
def test_maintenance_sequences_keep_every_answer(tmp_path, compacted_copy, sequence):
    store, model, events = compacted_copy(tmp_path / "root")
    cold_uri = str(tmp_path / "cold")
    points = _purge_points(store, events)
    run_checked(store, model, events, SEQUENCES[sequence], points, cold_uri)


@pytest.mark.slow
def test_incremental_compaction_with_merge_snapshot_pieces_and_erasure(tmp_path):
    """Segments applied one by one with merges (files across schema changes) and forced snapshot
    pieces in between; then an erasure of keys that were deleted and re-inserted, a rebuild."""
    from history_pipeline.compaction.compactor import CompactionSummary, compact_segment

    store, events, segments = build(tmp_path / "root", PIECES, every=2)
    model = BaseDatabase()
    applied: list[dict] = []
    for i, (ref, batch) in enumerate(zip(store.segments(), segments, strict=True)):
        compact_segment(store, ref, None, CompactionSummary())
        for e in batch:
            model.apply(e)
        applied += batch
        run_step(store, ["merge", "snapshot", "refresh"][i % 3], "")
    check(store, model, applied, as_ofs=_probe(store, applied))
    reinserted = sorted({e["key"] for e in events if e["op"] == "delete" and e["table_uuid"] == "TA"})[:2]
    store.erase("goods", reinserted, requested_by="test", spark=False)
    erase_keys(model, "TA", set(reinserted))
    check(store, model, applied, erased={"TA": set(reinserted)}, as_ofs=_probe(store, applied))
    store.rebuild_catalog()
    run_step(store, "merge", "")
    check(store, model, applied, erased={"TA": set(reinserted)})


def _check_export(loaded: dict[str, pa.Table], model: BaseDatabase, as_of: int) -> None:
    state = model.state_as_of(as_of)
    assert sorted(loaded) == sorted(t["name"] for t in state.values()), as_of
    for uuid, table in state.items():
        cols = names_of(model, uuid, as_of)
        got = loaded[table["name"]]
        assert got.column_names == ["synthetic_key", *(n for _, n, _ in cols)], as_of
        # an unconstrained NUMERIC is exported as DECIMAL(38, s) with one s for the column: by value
        assert rows_of(got, {n: ty for _, n, ty in cols}) == expected_rows(model, uuid, as_of, scale=False), \
            (table["name"], as_of)


@pytest.mark.slow
def test_export_load_back_around_schema_changes_and_after_erasure(tmp_path, compacted_copy):
    store, model, events = compacted_copy(tmp_path / "root")
    target = str(tmp_path / "exports")
    cold_uri = str(tmp_path / "cold")
    as_ofs = sorted({p for t in _schema_ts(events) + _schema_ts(events, "TB") for p in (t, t + 1)}
                    | {store.frontier + 1})
    for as_of in as_ofs:
        store.export(as_of, target)
        _check_export(load_export(open_store(target), "db", as_of), model, as_of)
    points = _purge_points(store, events)
    store.retain(purge_before=points["after_retype"], cold_tier=cold_uri, spark=False)
    keys = sorted(model.state_as_of(points["after_retype"])["TA"]["rows"])[:2]
    store.erase("goods", keys, requested_by="test", spark=False)
    erase_keys(model, "TA", set(keys))
    for as_of in as_ofs:
        _check_export(load_export(open_store(target), "db", as_of), model, as_of)
    store.load_cold_tier(cold_uri)
    assert store.earliest == 0
    check(store, model, events, erased={"TA": set(keys)})
    store.rebuild_catalog()
    check(store, model, events, erased={"TA": set(keys)}, as_ofs=_probe(store, events))


def test_sql_reads_small_unconstrained_numerics(tmp_path):
    """Python writes 0.0000001 as "1E-7": SQL over such a NUMERIC column failed to cast it."""
    store = HistoryStore.open(tmp_path, database="db", settings=SMALL)
    values = ["0.0000001", "0.00000000000000000001", "-0.0000015", "0.20"]  # all below 1: DECIMAL(p, p)
    events = [{"op": "create_table", "t": 1, "table_uuid": "TN", "table_name": "n",
               "columns": [{"column_uuid": "v", "column_name": "v", "data_type": "NUMERIC"}]}]
    events += [{"op": "insert", "t": 2, "table_uuid": "TN", "key": k, "values": {"v": v}} for k, v in enumerate(values)]
    write(store, events)
    store.compact(spark=False)
    got = store.sql("SELECT synthetic_key, v FROM n ORDER BY synthetic_key", 3).to_pylist()
    assert [Decimal(r["v"]) if isinstance(r["v"], str) else r["v"] for r in got] == [Decimal(v) for v in values]
    total = store.sql("SELECT sum(v) AS s FROM n", 3).to_pylist()[0]["s"]
    assert Decimal(str(total)) == sum(Decimal(v) for v in values)


def test_spark_compaction_and_maintenance_over_every_type(tmp_path, spark):
    """The same history and maintenance on Spark (DataFrame compaction, merge, snapshot pieces,
    retention): the Spark paths must give the answers the in-process ones give."""
    store, events, _ = build(tmp_path / "root", PIECES, every=6)  # half the segments of every=3, the same snapshot T
    store.compact(spark=spark)
    model = BaseDatabase()
    for e in events:
        model.apply(e)
    store.merge(spark=spark, small_file_bytes=10**9)
    store.refresh_snapshots(force=True, spark=spark)
    points = _purge_points(store, events)
    store.retain(purge_before=points["after_retype"], cold_tier=str(tmp_path / "cold"), spark=spark)
    check(store, model, events)


EXTREME_KEYS = [-2**63, -2**63 + 1, -1, 0, 1, 2**31, 2**63 - 2, 2**63 - 1]


def edge_history(seed=3):
    """Extreme synthetic keys; a column retyped and back, dropped and its name reused, names
    swapped; a table renamed away and back; insert+delete at one t; many updates at one t."""
    rng = random.Random(seed)
    events: list[dict] = []
    t = 1
    cols = {"e_a": "INTEGER", "e_b": "TEXT", "e_c": "DOUBLE PRECISION"}
    events.append({"op": "create_table", "t": t, "table_uuid": "TE", "table_name": "edge",
                   "columns": [{"column_uuid": "e_a", "column_name": "a", "data_type": "INTEGER"},
                               {"column_uuid": "e_b", "column_name": "b", "data_type": "TEXT"},
                               {"column_uuid": "e_c", "column_name": "c", "data_type": "DOUBLE PRECISION"}]})
    live: set[int] = set()

    def mutate(n):
        nonlocal t
        for _ in range(n):
            t += 1
            for _ in range(rng.randint(1, 4)):
                key = rng.choice(EXTREME_KEYS)
                if key not in live:
                    live.add(key)
                    events.append({"op": "insert", "t": t, "table_uuid": "TE", "key": key,
                                   "values": {c: value(rng, ty) for c, ty in cols.items()}})
                    if rng.random() < 0.2:  # gone again in the same transaction: no version
                        live.discard(key)
                        events.append({"op": "delete", "t": t, "table_uuid": "TE", "key": key})
                elif rng.random() < 0.75:
                    for _ in range(rng.randint(1, 3)):  # several updates of one key at one t
                        c = rng.choice(sorted(cols))
                        events.append({"op": "update", "t": t, "table_uuid": "TE", "key": key,
                                       "values": {c: value(rng, cols[c])}})
                else:
                    live.discard(key)
                    events.append({"op": "delete", "t": t, "table_uuid": "TE", "key": key})

    def schema(op, **fields):
        nonlocal t
        t += 1
        events.append({"op": op, "t": t, "table_uuid": "TE", **fields})

    mutate(3)
    schema("change_column_type", column_uuid="e_a", data_type="TEXT")
    cols["e_a"] = "TEXT_INTS"
    mutate(2)
    schema("change_column_type", column_uuid="e_a", data_type="BIGINT")  # back: every text is an integer's
    cols["e_a"] = "BIGINT"
    mutate(2)
    schema("drop_column", column_uuid="e_b")
    del cols["e_b"]
    mutate(1)
    schema("add_column", column={"column_uuid": "e_b2", "column_name": "b", "data_type": "BYTEA"}, default="AAEC/w==")
    cols["e_b2"] = "BYTEA"
    mutate(2)
    schema("rename_column", column_uuid="e_a", new_name="tmp")
    schema("rename_column", column_uuid="e_c", new_name="a")
    schema("rename_column", column_uuid="e_a", new_name="c")
    mutate(2)
    schema("rename_table", new_name="edge_old")
    mutate(2)
    schema("rename_table", new_name="edge")
    schema("reorder_column", column_uuid="e_b2", ordinal_key="")
    mutate(3)
    return events


@pytest.fixture(scope="module")
def edge_compacted(tmp_path_factory):
    """The edge history compacted once for the module and checked against the model (before any
    maintenance, the same for every sequence); each test changes a copy of it."""
    built = tmp_path_factory.mktemp("edge") / "root"
    events = edge_history()
    store = HistoryStore.open(built, database="db", settings=PIECES)
    write(store, *split(events, 2))
    store.compact(spark=False)
    check(store, replayed(events), events, as_ofs=_probe(store, events))

    def copy(root: Path):
        shutil.copytree(built, root)
        return HistoryStore.open(root, database="db", settings=PIECES), replayed(events), events

    return copy


@pytest.mark.slow
@pytest.mark.parametrize("steps", [
    ["snapshot", "merge", "retain@mid", "rebuild", "load_back", "cleanup"],
    ["merge", "retain@late", "snapshot", "merge", "rebuild", "load_back", "retain@mid", "rebuild"],
])
def test_extreme_keys_and_reused_names_through_maintenance(tmp_path, edge_compacted, steps):
    store, model, events = edge_compacted(tmp_path / "root")
    schema_ts = _schema_ts(events, "TE")
    points = {"mid": schema_ts[len(schema_ts) // 2], "late": schema_ts[-2] + 1}
    cold_uri = str(tmp_path / "cold")
    run_checked(store, model, events, steps, points, cold_uri)


def _lose(store, *prefixes):
    for prefix in prefixes:
        for obj in store.objects.list(f"{store.database}/{prefix}/"):
            store.objects.delete(obj.path)


@pytest.mark.slow
def test_rebuild_after_the_log_is_lost_following_every_kind_of_maintenance(tmp_path, compacted_copy):
    """The transaction log deleted after merge, retention, erasure, load-back and cleanup: the
    rebuilt catalog answers as before (the commit records survive the log)."""
    store, model, events = compacted_copy(tmp_path / "root", PIECES)
    cold_uri = str(tmp_path / "cold")
    points = _purge_points(store, events)
    store.merge(spark=False, small_file_bytes=10**9)
    store.retain(purge_before=points["after_retype"], cold_tier=cold_uri, spark=False)
    keys = sorted(model.state_as_of(store.frontier + 1)["TA"]["rows"])[-1:]
    store.erase("goods", keys, requested_by="test", spark=False)
    erase_keys(model, "TA", set(keys))
    store.cleanup(grace=timedelta(0))
    _lose(store, "_catalog")
    store.rebuild_catalog()
    assert store.earliest == points["after_retype"]
    check(store, model, events, erased={"TA": set(keys)}, as_ofs=_probe(store, events))
    store.load_cold_tier(cold_uri)
    store.cleanup(grace=timedelta(0))
    _lose(store, "_catalog")
    store.rebuild_catalog()
    check(store, model, events, erased={"TA": set(keys)})


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=(
    "rebuild_catalog from the Parquet files alone (log and commit records both lost) adopts only "
    "compaction files: after merge + cleanup the merged files are treated as orphans, every table "
    "reads empty and verify() reports nothing. Adopting maintenance outputs whose replaced files "
    "are gone (and restoring earliest from a retention file) is a larger change to upkeep.rebuild"))
def test_rebuild_from_files_alone_after_merge_and_cleanup(tmp_path, compacted_copy):
    store, model, events = compacted_copy(tmp_path / "root")
    store.merge(spark=False, small_file_bytes=10**9)
    store.cleanup(grace=timedelta(0))
    _lose(store, "_catalog", "_history_catalog/commits")
    store.rebuild_catalog()
    problems = store.verify()
    if not problems:  # a rebuild that cannot recover the data must at least say so
        check(store, model, events, as_ofs=[10, store.frontier + 1])


def test_every_type_through_maintenance_on_s3(tmp_path, s3_bucket, s3_options):
    """On an object store the readers take other paths (no local files for DuckDB): the same
    history through merge, retention to a cold tier on S3, erasure, load-back and an export."""
    events = typed_history()
    store = HistoryStore.open(s3_bucket, database="db", settings=PIECES, s3=s3_options,
                              wal_dir=tmp_path / "wal")
    write(store, *split(events, 6))  # half the S3 commits of three T a segment; the snapshots fall at the same T
    store.compact(spark=False)
    model = BaseDatabase()
    for e in events:
        model.apply(e)
    few = sorted({*_purge_points(store, events).values(), store.frontier + 1})  # S3 round trips are slow
    cold_uri = s3_bucket.replace("/warehouse", "/cold")
    points = _purge_points(store, events)
    store.merge(spark=False, small_file_bytes=10**9)
    store.retain(purge_before=points["after_rename"], cold_tier=cold_uri, spark=False)
    keys = sorted(model.state_as_of(store.frontier + 1)["TA"]["rows"])[:1]
    store.erase("goods", keys, requested_by="test", spark=False)
    erase_keys(model, "TA", set(keys))
    check(store, model, events, erased={"TA": set(keys)}, as_ofs=[t for t in few if t >= store.earliest])
    store.load_cold_tier(cold_uri)
    store.cleanup(grace=timedelta(0))
    store.rebuild_catalog()
    # what the load-back brought back (a snapshot, a retype, a rename: below the purge point), the
    # purge point and the frontier; the T above it read the files checked above
    back = [points["snap"], points["after_retype"], points["rename"], points["after_rename"], store.frontier + 1]
    check(store, model, events, erased={"TA": set(keys)}, as_ofs=back)
    target = s3_bucket.replace("/warehouse", "/exports")
    for as_of in (points["after_rename"],):
        store.export(as_of, target)
        _check_export(load_export(open_store(target, s3_options), "db", as_of), model, as_of)


def test_sql_refuses_names_that_differ_only_in_case(tmp_path):
    """PostgreSQL tells "Orders" from "orders" (and columns "v" from "V"); DuckDB does not, even
    quoted, so SQL read one table (one column) for both. Now a clear error; load_table is exact."""
    from history_pipeline import QueryError

    store = HistoryStore.open(tmp_path, database="db", settings=SMALL)
    col = {"column_name": "v", "data_type": "INTEGER"}
    events = [
        {"op": "create_table", "t": 1, "table_uuid": "A", "table_name": "Orders",
         "columns": [{**col, "column_uuid": "a"}]},
        {"op": "create_table", "t": 2, "table_uuid": "B", "table_name": "orders",
         "columns": [{**col, "column_uuid": "b"}]},
        {"op": "create_table", "t": 3, "table_uuid": "C", "table_name": "cols", "columns": [
            {**col, "column_uuid": "c1"}, {"column_uuid": "c2", "column_name": "V", "data_type": "INTEGER"}]},
        {"op": "insert", "t": 4, "table_uuid": "A", "key": 1, "values": {"a": 1}},
        {"op": "insert", "t": 4, "table_uuid": "B", "key": 1, "values": {"b": 2}},
        {"op": "insert", "t": 4, "table_uuid": "C", "key": 1, "values": {"c1": 3, "c2": 4}},
        {"op": "drop_table", "t": 5, "table_uuid": "B"},
    ]
    write(store, events)
    store.compact(spark=False)
    for query in ('SELECT * FROM "Orders"', 'SELECT * FROM orders', 'SELECT "V" FROM cols'):
        with pytest.raises(QueryError, match="differ only in case"):
            store.sql(query, 5)
    assert store.load_table("Orders", 5).to_pylist() == [{"synthetic_key": 1, "v": 1}]
    assert store.load_table("orders", 5).to_pylist() == [{"synthetic_key": 1, "v": 2}]
    assert store.sql('SELECT v FROM "Orders"', 6).to_pylist() == [{"v": 1}]  # once "orders" is dropped


def _check_with_table_purge_points(store, model, as_ofs):
    """load_table, fetch_row and SQL against the model where each table is answerable; below a
    table's own purge point (its TTL) the typed error."""
    for as_of in as_ofs:
        for uuid, table in model.state_as_of(as_of).items():
            if as_of < store.earliest_of(uuid):
                with pytest.raises(PurgedTimestampError):
                    store.load_table(uuid, as_of)
                with pytest.raises(PurgedTimestampError):  # a diff from a state the TTL forgot
                    store.diff(uuid, from_=as_of, to=store.frontier + 1)
                continue
            expected = expected_rows(model, uuid, as_of)
            assert rows_of(store.load_table(uuid, as_of)) == expected, (table["name"], as_of)
            assert rows_of(store.load_table(uuid, as_of, ordered=True)) == expected, (table["name"], as_of)
            for key in range(1, 9):
                row = store.fetch_row(uuid, key, as_of)
                assert (None if row is None else norm(row)) == expected.get(key), (table["name"], key, as_of)
            types = {n: ty for _, n, ty in names_of(model, uuid, as_of)}
            by_value = expected_rows(model, uuid, as_of, scale=False)
            assert rows_of(store.sql(f'SELECT * FROM "{table["name"]}"', as_of), types) == by_value, as_of
    assert store.verify() == []


@pytest.mark.slow
@pytest.mark.parametrize("order", ["retain_then_ttl", "ttl_then_retain"])
def test_load_back_after_a_table_ttl_purged_past_the_purge_point(tmp_path, compacted_copy, order):
    """A database purge to P1 (cold tier), a table's TTL purge to P2 > P1, then the load-back:
    the load-back restored the table's files below P2 too, so keys deleted between P1 and P2
    came back to life in every answer at or after P2."""
    store, model, events = compacted_copy(tmp_path / "root")
    cold_uri = str(tmp_path / "cold")
    points = _purge_points(store, events)
    p1, p2 = points["retype"], points["after_rename"]
    if order == "retain_then_ttl":
        store.retain(purge_before=p1, cold_tier=cold_uri, spark=False)
    store.set_ttl("goods", store.frontier + 1 - p2)
    assert store.apply_ttl(spark=False).purged == {"TA": p2}
    if order == "ttl_then_retain":  # the database purge above the TTL point, then below it too
        store.retain(purge_before=p2 + 3, cold_tier=cold_uri, spark=False)
        store.load_cold_tier(cold_uri)
        assert store.earliest_of("goods") == p2
        store.retain(purge_before=p1, cold_tier=cold_uri, spark=False)
    store.load_cold_tier(cold_uri)
    assert store.earliest == 0 and store.earliest_of("goods") == p2
    _check_with_table_purge_points(store, model, sorted({*range(0, store.frontier + 2, 3), p1 - 1, p1, p2 - 1, p2,
                                                         store.frontier + 1}))
    store.merge(spark=False, small_file_bytes=10**9)
    store.rebuild_catalog()
    _check_with_table_purge_points(store, model, _boundaries(store, events))


@pytest.mark.slow
def test_erasure_with_segments_still_pending_then_retention_and_load_back(tmp_path):
    """Keys erased while later segments (updates, deletes, re-inserts of them) wait in the WAL:
    those events are masked too, so every answer is the history without the keys, before and
    after the rest is compacted, a retention to a cold tier and its load-back."""
    from history_pipeline.compaction.compactor import CompactionSummary, compact_segment

    store, events, segments = build(tmp_path / "root", PIECES, every=3)
    half = len(segments) // 2
    for ref in store.segments()[:half]:
        compact_segment(store, ref, None, CompactionSummary())
    touched_later = {e["key"] for batch in segments[half:] for e in batch if e.get("table_uuid") == "TA"
                     and e["op"] in ROW_OPS}
    erased = sorted(touched_later)[:2]
    store.erase("goods" if any(e["op"] == "rename_table" for b in segments[:half] for e in b) else "items",
                erased, requested_by="test", spark=False)
    kept = [e for e in events if not (e.get("table_uuid") == "TA" and e["op"] in ROW_OPS and e["key"] in erased)]
    applied_ts = max(e["t"] for e in segments[half - 1])
    model = BaseDatabase()
    for e in kept:
        if e["t"] <= applied_ts:
            model.apply(e)
    check(store, model, [e for e in kept if e["t"] <= applied_ts], erased={"TA": set(erased)},
          as_ofs=_probe(store, [e for e in kept if e["t"] <= applied_ts]))
    store.compact(spark=False)
    model = BaseDatabase()
    for e in kept:
        model.apply(e)
    check(store, model, kept, erased={"TA": set(erased)}, as_ofs=_probe(store, kept))
    cold_uri = str(tmp_path / "cold")
    store.retain(purge_before=_purge_points(store, events)["after_retype"], cold_tier=cold_uri, spark=False)
    store.load_cold_tier(cold_uri)
    check(store, model, kept, erased={"TA": set(erased)})


@pytest.mark.parametrize("values", [
    [[1, 2], [[1, 2], [3, 4]], None],  # depths differ: the result type holds them
    [[], None, [[5]], [[6, 7]]],  # one depth, but the first batches hold none of it
])
def test_load_table_reader_types_arrays_by_the_whole_result(tmp_path, values):
    """A stream typed each batch's array column by the depths in that batch alone: a batch of
    flat arrays, then one of nested arrays, and reading the stream failed (ArrowInvalid)."""
    store = HistoryStore.open(tmp_path, database="db", settings=SMALL)
    events = [{"op": "create_table", "t": 1, "table_uuid": "TR", "table_name": "r",
               "columns": [{"column_uuid": "a", "column_name": "a", "data_type": "INTEGER[]"}]}]
    events += [{"op": "insert", "t": 2, "table_uuid": "TR", "key": k, "values": {"a": v}} for k, v in enumerate(values)]
    write(store, events)
    store.compact(spark=False)
    whole = store.load_table("r", 3)
    for ordered in (True, False):
        streamed = store.load_table_reader("r", 3, batch_size=1, ordered=ordered).read_all()
        assert streamed.schema == whole.schema
        assert rows_of(streamed) == rows_of(whole) == {k: {"a": norm(v)} for k, v in enumerate(values)}


ON_REQUEST = StoreSettings(snapshot_min_versions=10**9, spark_master=None)


@pytest.mark.slow
def test_load_back_after_an_interval_closed_over_the_purge(tmp_path, compacted_copy):
    """Retention, then a snapshot whose closing moves the versions current at it (the rows
    retention kept or rewrote) into snapshot pieces holding versions, then the load-back: it
    removed the duplicates from version files only, so those versions were live twice (row_history
    listed them twice; verify reported duplicate versions)."""
    store, model, events = compacted_copy(tmp_path / "root", ON_REQUEST)
    cold_uri = str(tmp_path / "cold")
    store.retain(purge_before=_purge_points(store, events)["after_drop"], cold_tier=cold_uri, spark=False)
    store.refresh_snapshots(force=True, spark=False)
    assert any(f.holds_versions for f in store.catalog_state().files.values())
    store.load_cold_tier(cold_uri)
    check(store, model, events)
    store.rebuild_catalog()
    store.cleanup(grace=timedelta(0))
    check(store, model, events, as_ofs=_probe(store, events))
