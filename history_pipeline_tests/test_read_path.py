"""The read path where DuckDB does the work: SQL over views of the catalog's files equals the model,
reads only the columns a query uses, streams, and keeps unconstrained NUMERIC exact."""

from __future__ import annotations

import math
import random
from decimal import Decimal, localcontext

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from history_pipeline import HistoryStore, QueryError, StoreSettings
from history_pipeline.catalog.model import FileKind
from history_pipeline.errors import NegativeTimestampError, PurgedTimestampError
from history_pipeline_tests.model import replayed
from history_pipeline_tests.test_compaction import _split, random_history, write


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def check_sql_against_model(store, events, as_ofs, model=None):
    """Every table's rows and count through SQL at each of ``as_ofs`` against the model of ``events``
    (``model``: that model, replayed already)."""
    model = replayed(events) if model is None else model
    checked = 0
    for as_of in as_ofs:
        for table in model.state_as_of(as_of).values():
            name = table["name"]
            quoted = '"' + name + '"'
            got = store.sql(f"SELECT * FROM {quoted} ORDER BY synthetic_key", as_of)
            assert got.column_names == ["synthetic_key"] + model.column_order(name, as_of), (name, as_of)
            rows = {r.pop("synthetic_key"): r for r in got.to_pylist()}
            assert rows == model.table_as_of(name, as_of), (name, as_of)
            count = store.sql(f"SELECT count(*) AS n FROM {quoted}", as_of).column("n").to_pylist()
            assert count == [len(rows)]
            checked += 1
    assert checked > 0


@pytest.mark.slow
@pytest.mark.parametrize("seed", [11, 13])
def test_sql_over_file_views_equals_the_model_with_snapshots(tmp_path, seed):
    events = random_history(seed, n_events=90)
    store = HistoryStore.open(
        tmp_path, database="db", settings=StoreSettings(snapshot_min_versions=4, snapshot_ratio=0.5)
    )
    for batch in _split(events, random.Random(seed)):
        write(store, batch)
        store.compact(spark=False)
    assert any(f.kind is FileKind.SNAPSHOT for f in store.catalog_state().files.values())
    check_sql_against_model(store, events, range(0, store.frontier + 2))


def test_sql_on_s3_reads_through_registered_datasets(tmp_path, s3_bucket, s3_options):
    store = HistoryStore.open(s3_bucket, database="db", wal_dir=tmp_path / "wal", s3=s3_options,
                              settings=StoreSettings(snapshot_min_versions=4, snapshot_ratio=0.5))
    events = random_history(78, n_events=50)
    for batch in _split(events, random.Random(2)):
        write(store, batch)
        store.compact(spark=False)
    check_sql_against_model(store, events, range(0, store.frontier + 2, 3))
    with pytest.raises(Exception, match="sandbox"):
        store.sql(f"SELECT * FROM read_parquet('{tmp_path}/*.parquet')", store.frontier + 1)


def _two_column_store(tmp_path, rows=2000):
    store = HistoryStore.open(tmp_path, database="db")
    events = [{"op": "create_table", "t": 1, "table_uuid": "T", "table_name": "orders",
               "columns": [{"column_uuid": "a", "column_name": "amount", "data_type": "BIGINT"},
                           {"column_uuid": "n", "column_name": "note", "data_type": "TEXT"}]}]
    events += [{"op": "insert", "t": 2, "table_uuid": "T", "key": k,
                "values": {"a": k, "n": f"note {k} " + "x" * 50}} for k in range(rows)]
    events += [{"op": "update", "t": 3, "table_uuid": "T", "key": k, "values": {"a": -k}} for k in range(0, rows, 7)]
    events += [{"op": "delete", "t": 4, "table_uuid": "T", "key": k} for k in range(0, rows, 11)]
    write(store, events)
    store.compact(spark=False)
    return store


def damage_column(store: HistoryStore, table_uuid: str, supercolumn: str) -> int:
    """Overwrite the bytes of one supercolumn's chunks in every file of a table; the chunks hit."""
    damaged = 0
    for f in store.catalog_state().files.values():
        if f.table_uuid != table_uuid:
            continue
        path = store.objects.full_path(f.path)
        meta = pq.read_metadata(path)
        index = meta.schema.to_arrow_schema().get_field_index(supercolumn)
        with open(path, "r+b") as handle:
            for rg in range(meta.num_row_groups):
                chunk = meta.row_group(rg).column(index)
                handle.seek(chunk.dictionary_page_offset or chunk.data_page_offset)
                handle.write(b"\xff" * chunk.total_compressed_size)
                damaged += 1
    return damaged


def test_a_query_reads_only_the_columns_it_uses(tmp_path):
    """Overwrite the bytes of the `note` column in every file: a query of `amount` alone still runs
    (so it never read them), a query of `note` fails."""
    store = _two_column_store(tmp_path)
    as_of = store.frontier + 1
    expected = store.sql("SELECT sum(amount) AS s, count(*) AS c FROM orders", as_of).to_pylist()
    model_rows = store.load_table("orders", as_of).to_pylist()
    assert expected == [{"s": sum(r["amount"] for r in model_rows), "c": len(model_rows)}]
    assert damage_column(store, "T", "n-1")
    assert store.sql("SELECT sum(amount) AS s, count(*) AS c FROM orders", as_of).to_pylist() == expected
    with pytest.raises(QueryError):
        store.sql("SELECT max(note) AS m FROM orders", as_of)


def test_streams_equal_the_whole_results(tmp_path):
    store = _two_column_store(tmp_path)
    as_of = store.frontier + 1
    reader = store.sql_reader("SELECT synthetic_key, amount FROM orders ORDER BY synthetic_key", as_of,
                              batch_size=500)
    assert isinstance(reader, pa.RecordBatchReader)
    batches = list(reader)
    assert len(batches) > 1
    assert pa.Table.from_batches(batches).to_pylist() == store.sql(
        "SELECT synthetic_key, amount FROM orders ORDER BY synthetic_key", as_of).to_pylist()
    for t in (2, 3, 4, as_of):
        streamed = store.load_table_reader("orders", t, batch_size=300, ordered=True).read_all()
        whole = store.load_table("orders", t, ordered=True)
        assert streamed.equals(whole), t
        # in no promised order (the default): the same rows (and, sorted, the same table)
        unordered = store.load_table("orders", t)
        assert unordered.schema == whole.schema and unordered.num_rows == whole.num_rows, t
        assert unordered.sort_by("synthetic_key").combine_chunks().equals(whole.combine_chunks()), t


def test_negative_as_of_says_what_is_wrong(tmp_path):
    store = _two_column_store(tmp_path, rows=3)
    for call in (lambda: store.load_table("orders", -1), lambda: store.sql("SELECT 1", -5),
                 lambda: store.fetch_row("orders", 1, -1)):
        with pytest.raises(NegativeTimestampError, match="negative") as raised:
            call()
        assert not isinstance(raised.value, PurgedTimestampError)
        assert "retention" not in str(raised.value)


def _numeric_store(tmp_path, values):
    store = HistoryStore.open(tmp_path, database="db")
    events = [{"op": "create_table", "t": 1, "table_uuid": "M", "table_name": "money",
               "columns": [{"column_uuid": "v", "column_name": "v", "data_type": "NUMERIC"}]}]
    events += [{"op": "insert", "t": 2, "table_uuid": "M", "key": k, "values": {"v": v}}
               for k, v in enumerate(values)]
    write(store, events)
    store.compact(spark=False)
    return store


def test_unconstrained_numeric_is_exact_in_sql(tmp_path):
    thirty = "123456789012345678901234567.891"
    store = _numeric_store(tmp_path, ["0.1", "0.2", thirty, "-1.5E-7", None])
    result = store.sql("SELECT sum(v) AS s, min(v) AS lo, max(v) AS hi FROM money", 3).to_pylist()[0]
    with localcontext() as context:
        context.prec = 100  # Python's default 28 digits would round the expected sum itself
        exact = Decimal("0.1") + Decimal("0.2") + Decimal(thirty) + Decimal("-1.5E-7")
    assert result["s"] == exact and isinstance(result["s"], Decimal)
    assert result["lo"] == Decimal("-1.5E-7") and result["hi"] == Decimal(thirty)
    small = store.sql("SELECT sum(v) AS s FROM money WHERE v < 1", 3).column("s").to_pylist()
    assert small == [Decimal("0.3") + Decimal("-1.5E-7")]


def test_numeric_wider_than_decimal_38_is_exact_text_and_arithmetic_says_why(tmp_path):
    wide = "1234567890123456789012345678901234567890.5"  # 41 digits
    store = _numeric_store(tmp_path, [wide, "1"])
    values = store.sql("SELECT v FROM money ORDER BY synthetic_key", 3).column("v").to_pylist()
    assert [Decimal(v) for v in values] == [Decimal(wide), Decimal(1)]
    with pytest.raises(QueryError, match="wider than DECIMAL"):
        store.sql("SELECT sum(v) FROM money", 3)


def test_exports_keep_unconstrained_numeric_exact(tmp_path):
    store = _numeric_store(tmp_path / "db", ["0.1", "0.2", "123456789012345678901234567.891"])
    manifest = store.export(3, str(tmp_path / "export"))
    path = tmp_path / "export" / manifest["tables"][0]["path"]
    column = pq.read_table(path).column("v")
    assert pa.types.is_decimal(column.type)
    assert column.to_pylist() == [Decimal("0.1"), Decimal("0.2"), Decimal("123456789012345678901234567.891")]
    wide_store = _numeric_store(tmp_path / "wide", ["1234567890123456789012345678901234567890.5"])
    manifest = wide_store.export(3, str(tmp_path / "export_wide"))
    column = pq.read_table(tmp_path / "export_wide" / manifest["tables"][0]["path"]).column("v")
    assert pa.types.is_string(column.type) or pa.types.is_string(getattr(column.type, "storage_type", None))
    assert [Decimal(str(v)) for v in column.to_pylist()] == [Decimal("1234567890123456789012345678901234567890.5")]
