"""The HistoryService answers Arrow Flight SQL: the real ADBC Flight SQL driver gets the answers
of ``HistoryStore.sql`` as of the newest state or as of T, through the same tokens, tenants,
limits and sandbox; the standard's messages keep their field numbers and type URLs.

Servers run in-process on 127.0.0.1 (port 0) with real worker processes over stores built by
in-process compaction.
"""

from __future__ import annotations

import threading

import adbc_driver_flightsql.dbapi as flight_sql_dbapi
import pyarrow as pa
import pyarrow.flight as flight
import pytest
from adbc_driver_manager import Error as AdbcError

from history_pipeline.lsn import format_lsn
from history_pipeline.service import InvalidRequestError
from history_pipeline.service import flight_sql as fsql
from history_pipeline.service.limits import Limits
from history_pipeline.service.server import HistoryServer
from history_pipeline_tests.test_service import (
    ENDLESS_SQL,
    TOKEN_A,
    TOKEN_B,
    build_sample,
    build_typed,
    config_for,
    same,
    wait_until,
)

AUTH = "adbc.flight.sql.authorization_header"
AS_OF = f"adbc.flight.sql.rpc.call_header.{fsql.AS_OF_HEADER}"


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("flight-sql-root")
    return {"a": build_sample(root), "b": build_typed(root)}


@pytest.fixture(scope="module")
def server(stores):
    config = config_for(stores, workers=2, batch_rows=500, limits=Limits(max_concurrent_queries=8))
    with HistoryServer(config) as running:
        yield running


def adbc(server: HistoryServer, token: str, **options: str):
    """A DB-API connection of the ADBC Flight SQL driver, with the bearer token as ADBC sends it."""
    return flight_sql_dbapi.connect(server.url, db_kwargs={AUTH: f"Bearer {token}", **options})


def query(server: HistoryServer, token: str, sql: str, **options: str) -> pa.Table:
    with adbc(server, token, **options) as conn, conn.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetch_arrow_table()


SQL = "SELECT customer_id, count(*) AS n, sum(amount) AS total FROM orders GROUP BY customer_id ORDER BY customer_id"


@pytest.mark.daemon
def test_a_statement_answers_as_the_store_does_newest_or_as_of_t(server, stores):
    local = stores["a"]
    newest = local.frontier + 1
    assert query(server, TOKEN_A, SQL).equals(local.sql(SQL, newest))
    with adbc(server, TOKEN_A) as conn, conn.cursor() as cursor:  # pandas through ADBC
        cursor.execute(SQL)
        assert cursor.fetch_df().equals(local.sql(SQL, newest).to_pandas())
    earlier = newest // 2
    expected = local.sql(SQL, earlier)
    assert not expected.equals(local.sql(SQL, newest))  # the as-of below is not the newest state in disguise
    # per statement, as an integer or an X/Y LSN
    assert query(server, TOKEN_A, f"SET as_of = '{earlier}'; {SQL}").equals(expected)
    assert query(server, TOKEN_A, f"set AS_OF = '{format_lsn(earlier)}';\n{SQL}").equals(expected)
    # per connection, by its call header; a statement's own SET as_of takes precedence
    assert query(server, TOKEN_A, SQL, **{AS_OF: str(earlier)}).equals(expected)
    assert query(server, TOKEN_A, f"SET as_of = {newest}; {SQL}", **{AS_OF: str(earlier)}).equals(
        local.sql(SQL, newest))


@pytest.mark.daemon
def test_every_type_comes_back_as_the_store_gives_it(server, stores):
    local = stores["b"]
    for t in (3, local.frontier + 1):
        got = query(server, TOKEN_B, f"SET as_of = '{t}'; SELECT * FROM typed ORDER BY synthetic_key")
        want = local.sql("SELECT * FROM typed ORDER BY synthetic_key", t)
        assert same(got, want)  # schema (field metadata too) and values, NaN equal to NaN


@pytest.mark.daemon
def test_writes_bad_tokens_and_other_tenants_are_refused(server, stores):
    with pytest.raises(AdbcError, match="(?i)read-only|not allowed|only"):
        query(server, TOKEN_A, "DELETE FROM orders")
    with adbc(server, TOKEN_A) as conn, conn.cursor() as cursor, pytest.raises(AdbcError, match="read-only"):
        cursor.adbc_statement.set_sql_query("DELETE FROM orders")
        cursor.adbc_statement.execute_update()
    with pytest.raises(AdbcError, match="unknown bearer token"):
        query(server, "not-a-token", "SELECT 1")
    # tenant b's token reads tenant b's database: tenant a's tables are not there
    with pytest.raises(AdbcError, match="orders"):
        query(server, TOKEN_B, "SELECT count(*) FROM orders")
    with pytest.raises(AdbcError, match="LSN"):
        query(server, TOKEN_A, "SET as_of = 'yesterday'; SELECT 1")
    with pytest.raises(AdbcError, match="SET as_of applies"):
        query(server, TOKEN_A, "SET as_of = '0/10'")


@pytest.mark.daemon
@pytest.mark.daemon
def test_an_answer_is_fetched_once_and_only_by_its_tenant(server, stores):
    raw = flight.FlightClient(server.url)
    as_a = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN_A}".encode())])
    as_b = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN_B}".encode())])
    command = fsql.pack(fsql.message("CommandStatementQuery", query="SELECT count(*) AS n FROM orders"))
    info = raw.get_flight_info(flight.FlightDescriptor.for_command(command), as_a)
    ticket = info.endpoints[0].ticket
    assert server.stats().pending_answers == 1
    with pytest.raises(flight.FlightServerError, match="unknown or already fetched"):
        raw.do_get(ticket, as_b).read_all()
    assert server.stats().pending_answers == 1  # another tenant's attempt takes nothing
    local = stores["a"]
    assert raw.do_get(ticket, as_a).read_all().equals(local.sql("SELECT count(*) AS n FROM orders", local.frontier + 1))
    assert server.stats().pending_answers == 0
    with pytest.raises(flight.FlightServerError, match="unknown or already fetched"):
        raw.do_get(ticket, as_a).read_all()
    raw.close()


def test_messages_keep_the_standards_numbers_and_type_urls():
    packed = fsql.pack(fsql.message("CommandStatementQuery", query="SELECT 1"))
    # Any{type_url=1, value=2}; CommandStatementQuery{query=1}: the bytes a Flight SQL client sends
    url = b"type.googleapis.com/arrow.flight.protocol.sql.CommandStatementQuery"
    assert packed == b"\x0a" + bytes([len(url)]) + url + b"\x12\x0a" + b"\x0a\x08SELECT 1"
    tables = fsql.unpack(fsql.pack(fsql.message("CommandGetTables", include_schema=True, table_types=["TABLE"])))
    assert fsql.name_of(tables) == "CommandGetTables" and tables.include_schema
    assert not tables.HasField("catalog")  # proto3 optional: absent is not ""
    assert fsql.unpack(b'{"op": "Status"}') is None  # the service's own tickets are not Flight SQL
    with pytest.raises(InvalidRequestError, match="CommandStatementSubstraitPlan"):
        fsql.unpack(fsql.any_pb2.Any(
            type_url="type.googleapis.com/arrow.flight.protocol.sql.CommandStatementSubstraitPlan").SerializeToString())


def test_a_leading_set_as_of_is_taken_off_the_statement():
    assert fsql.split_as_of("SELECT 1") == fsql.Statement("SELECT 1", None)
    assert fsql.split_as_of("  SET as_of = '0/1A2B3C8';  SELECT 1") == fsql.Statement("  SELECT 1", "0/1A2B3C8")
    assert fsql.split_as_of("set as_of to 42; SELECT ';'") == fsql.Statement(" SELECT ';'", "42")
    for bad in ("SET as_of = '0/1'", "SET as_of = '0/1';  ", "SET as_of 7; SELECT 1"):
        with pytest.raises(InvalidRequestError, match="as_of"):
            fsql.split_as_of(bad)


def raw_call(server: HistoryServer, token: str, name: str, headers: tuple = (), **fields) -> pa.Table:
    """A Flight SQL command as a bare Flight client sends it: GetFlightInfo, then DoGet of its ticket."""
    raw = flight.FlightClient(server.url)
    try:
        options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {token}".encode()), *headers])
        command = fsql.pack(fsql.message(name, **fields))
        info = raw.get_flight_info(flight.FlightDescriptor.for_command(command), options)
        table = raw.do_get(info.endpoints[0].ticket, options).read_all()
        assert table.schema.equals(info.schema)
        return table
    finally:
        raw.close()


@pytest.mark.daemon
def test_catalog_calls_answer_for_the_tenants_tables_as_of_t(server, stores):
    local = stores["a"]
    newest = local.frontier + 1
    names = sorted(d.table_name for d in local.get_catalog(newest))
    with adbc(server, TOKEN_A) as conn:
        objects = conn.adbc_get_objects().read_all().to_pylist()
        assert [(c["catalog_name"], [s["db_schema_name"] for s in c["catalog_db_schemas"]]) for c in objects] == [
            (fsql.CATALOG, [fsql.DB_SCHEMA])]
        tables = objects[0]["catalog_db_schemas"][0]["db_schema_tables"]
        assert sorted(t["table_name"] for t in tables) == names
        for table in tables:  # every column, in the order SELECT * gives them
            expected = local.sql(f'SELECT * FROM "{table["table_name"]}" LIMIT 0', newest).schema
            assert [c["column_name"] for c in table["table_columns"]] == expected.names
        for name in names:
            expected = local.sql(f'SELECT * FROM "{name}" LIMIT 0', newest).schema
            assert conn.adbc_get_table_schema(name).equals(expected, check_metadata=True)
        assert conn.adbc_get_table_types() == [fsql.TABLE_TYPE]
        info = conn.adbc_get_info()
        assert info["vendor_name"] == "history_pipeline" and info["vendor_arrow_version"] == pa.__version__
    # raw calls: filters, the schema as of an earlier T, the synthetic key, and another tenant's tables
    orders = raw_call(server, TOKEN_A, "CommandGetTables", table_name_filter_pattern="ord%", include_schema=True)
    assert orders.column("table_name").to_pylist() == ["orders"]
    assert pa.ipc.read_schema(pa.py_buffer(orders.column("table_schema")[0].as_py())).equals(
        local.sql("SELECT * FROM orders LIMIT 0", newest).schema, check_metadata=True)
    first = min(t for t in range(newest + 1) if local.get_catalog(t))  # the first state with a table
    early = raw_call(server, TOKEN_A, "CommandGetTables", headers=((fsql.AS_OF_HEADER.encode(), str(first).encode()),))
    assert sorted(early.column("table_name").to_pylist()) == sorted(d.table_name for d in local.get_catalog(first))
    assert early.num_rows < len(names)  # as of T is not the newest state in disguise
    assert raw_call(server, TOKEN_A, "CommandGetTables", catalog="elsewhere").num_rows == 0
    assert raw_call(server, TOKEN_B, "CommandGetTables").column("table_name").to_pylist() == ["typed"]
    keys = raw_call(server, TOKEN_A, "CommandGetPrimaryKeys", table="orders")
    assert keys.to_pylist() == [{"catalog_name": fsql.CATALOG, "db_schema_name": fsql.DB_SCHEMA,
                                 "table_name": "orders", "column_name": "synthetic_key", "key_sequence": 1,
                                 "key_name": None}]
    assert raw_call(server, TOKEN_B, "CommandGetPrimaryKeys", table="orders").num_rows == 0
    assert raw_call(server, TOKEN_A, "CommandGetCatalogs").to_pylist() == [{"catalog_name": fsql.CATALOG}]
    assert raw_call(server, TOKEN_A, "CommandGetDbSchemas", db_schema_filter_pattern="x%").num_rows == 0
    infos = raw_call(server, TOKEN_A, "CommandGetSqlInfo", info=[3, 0, 12345]).to_pylist()
    assert infos == [{"info_name": 3, "value": True}, {"info_name": 0, "value": "history_pipeline"}]
    types = raw_call(server, TOKEN_A, "CommandGetXdbcTypeInfo")
    assert types.schema.equals(fsql.XDBC_TYPE_INFO_SCHEMA) and "numeric" in types.column("type_name").to_pylist()
    assert raw_call(server, TOKEN_A, "CommandGetXdbcTypeInfo", data_type=93).column("type_name").to_pylist() == [
        "timestamp", "timestamp with time zone"]
    assert server.stats().pending_answers == 0


def test_filter_patterns_follow_sql_like():
    assert fsql.like_matches("ord%", "orders") and fsql.like_matches("o_ders", "orders")
    assert not fsql.like_matches("ord", "orders") and not fsql.like_matches("o.ders", "orders")
    assert fsql.like_matches(None, "anything") and fsql.like_matches("%", "")


@pytest.mark.daemon
def test_prepared_statements_bind_parameters_of_their_exact_types(server, stores):
    import datetime as dt
    from decimal import Decimal

    local = stores["a"]
    newest = local.frontier + 1
    sql = "SELECT customer_id, count(*) AS n FROM orders WHERE customer_id = ? AND ? GROUP BY customer_id"
    expected = local.sql(sql.replace("?", "7", 1).replace("?", "TRUE"), newest)
    assert expected.num_rows == 1
    with adbc(server, TOKEN_A) as conn, conn.cursor() as cursor:
        cursor.execute(sql, (7, True))
        assert cursor.fetch_arrow_table().equals(expected)
        cursor.execute(sql, (8, False))  # the same statement again, other values
        assert cursor.fetch_arrow_table().num_rows == 0
        # each parameter keeps its type: NUMERIC at its precision and scale, text with quotes, dates
        cursor.execute("SELECT ? AS d, ? AS s, ? AS day, $1 AS again",
                       (Decimal("12.340"), "it's -- not a comment ?", dt.date(2024, 2, 29)))
        row = cursor.fetch_arrow_table()
        assert row.schema.field("d").type == pa.decimal128(5, 3) and row.column("d")[0].as_py() == Decimal("12.340")
        assert row.column("s")[0].as_py() == "it's -- not a comment ?"
        assert row.column("day").type == pa.date32() and row.column("again").type == pa.decimal128(5, 3)
        with pytest.raises(AdbcError, match="placeholders"):
            cursor.execute("SELECT ? AS a", (1, 2))
        cursor.execute("SET as_of = '1'; SELECT count(*) AS n FROM range(?)", (3,))  # as of, and bound
        assert cursor.fetch_arrow_table().column("n").to_pylist() == [3]
    assert server.stats().pending_answers == 0


def test_placeholders_are_bound_outside_quotes_and_comments():
    literals = ["CAST(1 AS BIGINT)", "'x'"]
    assert fsql.bind_placeholders("SELECT ?, '?', \"?\" -- ?\n, ? /* ? */", literals) == (
        "SELECT CAST(1 AS BIGINT), '?', \"?\" -- ?\n, 'x' /* ? */")
    assert fsql.bind_placeholders("SELECT $2, $1, $2", literals) == "SELECT 'x', CAST(1 AS BIGINT), 'x'"
    with pytest.raises(InvalidRequestError, match="no parameter"):
        fsql.bind_placeholders("SELECT ?, ?, ?", literals)
    field = pa.field("p", pa.string())
    assert fsql.sql_literal(pa.scalar("o'clock"), field) == "'o''clock'"
    assert fsql.sql_literal(pa.scalar(None, pa.int64()), field) == "NULL"
    prepared = fsql.Prepared("SELECT 1")
    assert fsql.Prepared.of(prepared.handle()) == prepared
    with pytest.raises(InvalidRequestError, match="did not make"):
        fsql.Prepared.of(b"SELECT 1")


@pytest.mark.daemon
def test_a_cancelled_query_frees_its_worker_and_slot(server):
    before = server.stats().replaced_workers
    with adbc(server, TOKEN_A) as conn, conn.cursor() as cursor:
        failure: list[BaseException] = []

        def run() -> None:
            try:
                cursor.execute(ENDLESS_SQL)
            except BaseException as exc:  # the cancelled call's error, checked below
                failure.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        wait_until(lambda: server.stats().running_queries.get("a"), "the query runs")
        cursor.adbc_cancel()
        thread.join(60)
        assert not thread.is_alive() and failure and isinstance(failure[0], AdbcError), failure
    # the server notices the cancelled call and kills the worker, well before its own time limit
    wait_until(lambda: server.stats().replaced_workers == before + 1, "the worker is replaced")
    wait_until(lambda: not server.stats().running_queries, "the query slot is free")
    assert server.stats().pending_answers == 0


@pytest.mark.daemon
def test_a_client_gone_mid_stream_leaves_nothing_behind(server):
    before = server.stats()
    # without gRPC's bandwidth probing the client's receive window stays at its initial 64 KiB, so
    # the server cannot have pushed the whole answer (about 20 MB in 500-row batches) ahead
    raw = flight.FlightClient(server.url, generic_options=[("grpc.http2.bdp_probe", 0)])
    options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN_A}".encode())])
    command = fsql.pack(fsql.message(
        "CommandStatementQuery", query="SELECT range AS i, repeat('x', 1000) AS pad FROM range(20000)"))
    info = raw.get_flight_info(flight.FlightDescriptor.for_command(command), options)
    reader = raw.do_get(info.endpoints[0].ticket, options)
    assert reader.read_chunk().data.num_rows == 500
    assert server.stats().open_streams == before.open_streams + 1  # the server is in the middle of it
    reader.cancel()
    raw.close()
    wait_until(lambda: server.stats().abandoned_streams == before.abandoned_streams + 1, "the stream is abandoned")
    after = server.stats()
    assert after.open_streams == 0 and not after.running_queries and after.busy_workers == 0
    assert after.pending_answers == 0
    # an answer asked for and never fetched is dropped once it is stale
    assert raw_call_info(server, TOKEN_A, "SELECT 1 AS one").schema.names == ["one"]
    assert server.stats().pending_answers == 1
    server.drop_stale_answers(now=float("inf"))
    assert server.stats().pending_answers == 0


def raw_call_info(server: HistoryServer, token: str, sql: str) -> flight.FlightInfo:
    raw = flight.FlightClient(server.url)
    options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {token}".encode())])
    try:
        command = fsql.pack(fsql.message("CommandStatementQuery", query=sql))
        return raw.get_flight_info(flight.FlightDescriptor.for_command(command), options)
    finally:
        raw.close()
