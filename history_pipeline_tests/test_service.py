"""The HistoryService over the network: every answer equals the local API's, tenants are kept
apart, limits refuse with their own errors, cancelled work is freed, TLS and the serve command.

Servers run in-process on 127.0.0.1 (port 0) with real worker processes, real Flight and real
stores built by in-process compaction; the serve command runs as a subprocess.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from history_pipeline import (
    FutureTimestampError,
    HistoryError,
    HistoryStore,
    SandboxViolationError,
    TableNotFoundError,
)
from history_pipeline.client import FetchRowRequest, GetCatalogRequest, LoadTableRequest, connect
from history_pipeline.sample import sample_events
from history_pipeline.service import (
    AuthenticationError,
    ConcurrencyLimitError,
    InvalidRequestError,
    QueryTimeoutError,
    ResultTooLargeError,
    ServiceError,
    ServiceUnavailableError,
)
from history_pipeline.service.auth import Tenant, TenantDirectory, new_token, token_digest
from history_pipeline.service.config import ServerConfig, config_from_mapping
from history_pipeline.service.limits import Limits, admit, release
from history_pipeline.service.protocol import (
    SqlRequest,
    decode_request,
    decode_value,
    encode_request,
    encode_value,
    fetch_row_from_arrow,
)
from history_pipeline.service.server import HistoryServer
from history_pipeline.types import Interval
from history_pipeline_tests.test_query import TYPED_COLUMNS

CUSTOMERS_UUID = "7d6c0c1e-0000-4000-8000-000000000001"  # of the sample workload
TOKEN_A, TOKEN_B = "token-of-tenant-a", "token-of-tenant-b"
# a query that runs for minutes unless it is stopped
ENDLESS_SQL = "SELECT sum(hash(range)) FROM range(100000000000)"


# --- helpers ----------------------------------------------------------------------------


def same(a: Any, b: Any) -> bool:
    """Equal values, NaN equal to NaN; Arrow tables by schema (metadata included) and rows."""
    if isinstance(a, pa.Table) or isinstance(b, pa.Table):
        return (
            isinstance(a, pa.Table) and isinstance(b, pa.Table)
            and a.schema.equals(b.schema, check_metadata=True)
            and same(a.to_pylist(), b.to_pylist())
        )
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def answer(call: Callable[[], Any]) -> Any:
    """What a call returns, or the type and message of the HistoryError it raises."""
    try:
        return call()
    except HistoryError as exc:
        return (type(exc), str(exc))


def columns_of(store: HistoryStore, table: str, as_of: int) -> list[str]:
    """The column names of a table as of ``as_of`` (none when it does not exist then)."""
    return [c.column_name for d in store.get_catalog(as_of) if d.table_name == table for c in d.columns]


def wait_until(condition: Callable[[], bool], what: str, limit_s: float = 30.0) -> None:
    """Wait for a condition the server reaches asynchronously (a hang guard, not a timing check)."""
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.02)


def build_typed(root: Path) -> HistoryStore:
    store = HistoryStore.open(root, database="tenant_b")
    with store.wal_writer() as wal:
        wal.append({"op": "create_table", "t": 1, "table_uuid": "T", "table_name": "typed",
                    "columns": [{"column_uuid": c, "column_name": c, "data_type": ty} for c, ty, _ in TYPED_COLUMNS]})
        wal.append({"op": "insert", "t": 2, "table_uuid": "T", "key": 1, "values": {c: v for c, _, v in TYPED_COLUMNS}})
        wal.append({"op": "insert", "t": 2, "table_uuid": "T", "key": 2, "values": {"i": 7}})
        wal.append({"op": "update", "t": 3, "table_uuid": "T", "key": 2,
                    "values": {"j": {"$uuid": "not a tag"}, "r": "-Infinity", "n": "-0.50"}})
        wal.append({"op": "delete", "t": 4, "table_uuid": "T", "key": 1})
        wal.append({"op": "close", "t": 4})
        wal.seal()
    store.compact(spark=False)
    return store


def build_sample(root: Path) -> HistoryStore:
    store = HistoryStore.open(root, database="tenant_a")
    with store.wal_writer() as wal:
        for event in sample_events(seed=3, customers=60, orders=2000):
            wal.append(event)
            if event["op"] == "close":
                wal.seal()
    store.compact(spark=False)
    return store


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, HistoryStore]:
    root = tmp_path_factory.mktemp("service-root")
    return {"a": build_sample(root), "b": build_typed(root)}


def config_for(stores: dict[str, HistoryStore], **changes: Any) -> ServerConfig:
    root = stores["a"].objects.uri
    tenants = (
        Tenant("a", "tenant_a", token_digest(TOKEN_A)),
        Tenant("b", "tenant_b", token_digest(TOKEN_B)),
    )
    return ServerConfig(root=str(root), tenants=tenants, port=0, **changes)


@pytest.fixture(scope="module")
def server(stores):
    config = config_for(stores, workers=3, batch_rows=1000, limits=Limits(max_concurrent_queries=8))
    with HistoryServer(config) as running:
        yield running


# --- every answer equals the local API's ---------------------------------------------------------


@pytest.mark.daemon
def test_every_type_comes_back_equal_to_the_local_api(server, stores):
    local = stores["b"]
    with connect(server.url, TOKEN_B) as remote:
        assert (remote.frontier, remote.earliest) == (local.frontier, local.earliest)
        assert same(remote.get_catalog(), local.get_catalog())  # both default to the newest state
        assert same(local.get_catalog(), local.get_catalog(local.frontier + 1))
        for as_of in range(0, local.frontier + 2):
            assert same(remote.get_catalog(as_of), local.get_catalog(as_of))
            if not local.get_catalog(as_of):
                continue
            for key in (1, 2, 3):
                assert same(remote.fetch_row("typed", key, as_of), local.fetch_row("typed", key, as_of))
                assert same(remote.fetch_row("T", key, as_of), local.fetch_row("T", key, as_of))
            assert same(remote.load_table("typed", as_of), local.load_table("typed", as_of))
            query = "SELECT * FROM typed ORDER BY synthetic_key"
            assert same(remote.sql(query, as_of), local.sql(query, as_of))
        row = remote.fetch_row("typed", 1, 3)
        assert row["n"] == row["n"].__class__("12.34") and row["iv"] == Interval(1, 2, 3)
        assert row["tz"] == dt.datetime(2024, 1, 1, 21, 34, 5, tzinfo=dt.UTC)
        assert remote.fetch_row("typed", 2, 4)["j"] == {"$uuid": "not a tag"}  # JSONB is never a tag
        for key in (1, 2):
            assert same(remote.row_history("typed", key), local.row_history("typed", key))
        assert same(remote.diff("typed", 2, 5), local.diff("typed", 2, 5))
        assert same(remote.diff("typed", 0, 4), local.diff("typed", 0, 4))
        assert same(remote.diff_reader("typed", 0, 5).read_all(), local.diff_reader("typed", 0, 5).read_all())


def test_schema_changes_renames_and_drops_answer_as_locally(server, stores):
    local = stores["a"]
    end = local.frontier + 1
    stamps = sorted({0, 3, end // 3, end // 2, end - 5, end})
    with connect(server.url, TOKEN_A) as remote:
        for as_of in stamps:
            assert same(remote.get_catalog(as_of), local.get_catalog(as_of))
            for descriptor in local.get_catalog(as_of):
                name = descriptor.table_name
                assert same(remote.load_table(name, as_of, ordered=True), local.load_table(name, as_of, ordered=True))
                # in no promised order (the default): the same rows
                assert same(remote.load_table(name, as_of).sort_by("synthetic_key"),
                            local.load_table(name, as_of, ordered=True))
        keys = local.load_table("orders", end).column("synthetic_key").to_pylist()[:5] + [10_000, 10_001, 1, -1]
        for key in keys:
            for as_of in stamps:
                assert same(answer(lambda: remote.fetch_row("orders", key, as_of)),  # noqa: B023
                            answer(lambda: local.fetch_row("orders", key, as_of)))  # noqa: B023
            assert same(remote.row_history("orders", key), local.row_history("orders", key))
        # renamed: customers becomes clients; the drop of audit_tmp; the change of a column type
        for table in ("customers", "clients", "audit_tmp"):
            assert same(answer(lambda: remote.row_history(table, 1)),  # noqa: B023
                        answer(lambda: local.row_history(table, 1)))  # noqa: B023
        assert same(remote.diff("orders", end // 3, end), local.diff("orders", end // 3, end))
        query = ("SELECT c.name, count(*) AS n, sum(o.amount) AS total FROM orders o JOIN clients c "
                 "ON o.customer_id = c.synthetic_key GROUP BY c.name ORDER BY n DESC, c.name LIMIT 10")
        assert same(remote.sql(query, end), local.sql(query, end))
        assert same(remote.sql("SELECT * FROM _history_catalog.schema_history ORDER BY logical_timestamp", end),
                    local.sql("SELECT * FROM _history_catalog.schema_history ORDER BY logical_timestamp", end))


def test_the_messages_carry_column_uuids(server, stores):
    local = stores["a"]
    end = local.frontier + 1
    orders = next(d for d in local.get_catalog(end) if d.table_name == "orders")
    key = local.load_table("orders", end).column("synthetic_key")[0].as_py()
    with connect(server.url, TOKEN_A) as remote:
        row = remote.fetch_row_response(FetchRowRequest(orders.table_uuid, key, end))
        assert row.column_uuid_mapping == tuple(c.column_uuid for c in orders.columns)
        assert row.as_row() == local.fetch_row("orders", key, end)
        missing = remote.fetch_row_response(FetchRowRequest(orders.table_uuid, -5, end))
        assert missing.values is None and missing.column_uuid_mapping == row.column_uuid_mapping
        loaded = remote.load_table_response(LoadTableRequest(orders.table_uuid, end))
        assert loaded.column_uuid_mapping == row.column_uuid_mapping
        assert same(loaded.table, local.load_table("orders", end))
        assert remote.get_catalog_response(GetCatalogRequest(end)).table_descriptors == local.get_catalog(end)


def test_errors_come_back_as_the_local_ones(server, stores):
    local = stores["a"]
    end = local.frontier + 1
    with connect(server.url, TOKEN_A) as remote:
        for call in (
            lambda api: api.fetch_row("orders", 1, end + 1),
            lambda api: api.load_table("no_such_table", end),
            lambda api: api.sql("SELECT * FROM read_parquet('/etc/passwd')", end),
            lambda api: api.sql("DELETE FROM orders", end),
            lambda api: api.sql("SELECT * FROM nowhere", end),
        ):
            with pytest.raises(Exception) as local_error:
                call(local)
            with pytest.raises(type(local_error.value)) as remote_error:
                call(remote)
            assert type(remote_error.value) is type(local_error.value)
            assert str(remote_error.value) == str(local_error.value)
        for api in (local, remote):  # a timestamp that is neither an integer nor an LSN, before anything is sent
            with pytest.raises(HistoryError, match="LSN"):
                api.fetch_row("orders", 1, "seven")
        # an X/Y LSN is a timestamp everywhere, remotely too
        assert remote.fetch_row("orders", 1, "0/7") == local.fetch_row("orders", 1, 7)
    with pytest.raises(FutureTimestampError, match="frontier"):
        connect(server.url, TOKEN_A).fetch_row("orders", 1, end + 10)


# --- under load --------------------------------------------------------------------------------


@pytest.mark.daemon
def test_concurrent_clients_mixing_lookups_and_sql_get_the_local_answers(server, stores):
    local = stores["a"]
    end = local.frontier + 1
    rng = random.Random(11)
    keys = local.load_table("orders", end).column("synthetic_key").to_pylist()
    # from the rename of status to state on, so that one SQL text fits every as_of
    since = end
    while "state" in columns_of(local, "orders", since - 1):
        since -= 1
    calls: list[tuple[str, tuple[Any, ...]]] = []
    for _ in range(8 * 25):
        roll = rng.random()
        as_of = rng.randint(since, end)
        if roll < 0.6:
            calls.append(("fetch_row", ("orders", rng.choice(keys + [-1]), as_of)))
        elif roll < 0.9:
            calls.append(("sql", (f"SELECT state, count(*) AS n, sum(amount) AS s FROM orders "
                                  f"WHERE synthetic_key >= {rng.choice(keys)} GROUP BY state ORDER BY state", as_of)))
        else:
            calls.append(("load_table", (CUSTOMERS_UUID, as_of)))  # named customers, then clients
    expected = [getattr(local, name)(*args) for name, args in calls]
    shared = connect(server.url, TOKEN_A)

    def worker(index: int) -> list[bool]:
        # half the threads share one client, half hold their own
        client = shared if index % 2 else connect(server.url, TOKEN_A)
        return [same(getattr(client, calls[i][0])(*calls[i][1]), expected[i]) for i in range(index, len(calls), 8)]

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = [f.result(timeout=300) for f in [pool.submit(worker, i) for i in range(8)]]
    assert sum(len(r) for r in results) == 200
    assert all(all(r) for r in results)
    stats = server.stats()
    assert stats.open_streams == 0 and dict(stats.running_queries) == {} and stats.busy_workers == 0


@pytest.mark.daemon
def test_answers_follow_new_compactions(tmp_path):
    local = HistoryStore.open(tmp_path, database="tenant_b")
    with local.wal_writer() as wal:
        wal.append({"op": "create_table", "t": 1, "table_uuid": "T", "table_name": "typed",
                    "columns": [{"column_uuid": "i", "column_name": "i", "data_type": "INTEGER"}]})
        wal.append({"op": "insert", "t": 2, "table_uuid": "T", "key": 1, "values": {"i": 1}})
        wal.append({"op": "close", "t": 2})
        wal.seal()
    local.compact(spark=False)
    config = ServerConfig(root=str(tmp_path), tenants=(Tenant("b", "tenant_b", token_digest(TOKEN_B)),),
                          port=0, workers=1)
    with HistoryServer(config) as running, connect(running.url, TOKEN_B) as remote:
        assert remote.frontier == 2 and remote.fetch_row("typed", 1, 3) == {"i": 1}
        with pytest.raises(FutureTimestampError):
            remote.fetch_row("typed", 1, 4)
        with local.wal_writer() as wal:
            wal.append({"op": "update", "t": 3, "table_uuid": "T", "key": 1, "values": {"i": 2}})
            wal.append({"op": "close", "t": 3})
            wal.seal()
        local.compact(spark=False)
        assert remote.frontier == 3
        assert remote.fetch_row("typed", 1, 4) == local.fetch_row("typed", 1, 4) == {"i": 2}
        assert remote.fetch_row("typed", 1, 3) == {"i": 1}


@pytest.mark.daemon
def test_a_worker_killed_from_outside_is_replaced(stores):
    end = stores["b"].frontier + 1
    expected = stores["b"].fetch_row("typed", 2, end)
    with HistoryServer(config_for(stores, workers=1)) as running, connect(running.url, TOKEN_B) as remote:
        assert remote.fetch_row("typed", 2, end) == expected
        (idle,) = running.stats().worker_pids["idle"]
        os.kill(idle, signal.SIGKILL)  # dies while idle: the next request starts a fresh worker
        assert remote.fetch_row("typed", 2, end) == expected
        failure: dict[str, BaseException] = {}

        def endless() -> None:
            try:
                remote.sql(ENDLESS_SQL, end)
            except BaseException as exc:  # noqa: BLE001 - checked below
                failure["error"] = exc

        thread = threading.Thread(target=endless)
        thread.start()
        wait_until(lambda: len(running.stats().worker_pids["answering"]) == 1, "the endless query runs")
        os.kill(running.stats().worker_pids["answering"][0], signal.SIGKILL)  # dies while answering
        thread.join(60)
        assert isinstance(failure.get("error"), ServiceError) and "died" in str(failure["error"])
        assert remote.fetch_row("typed", 2, end) == expected
        stats = running.stats()
        assert stats.replaced_workers == 2 and len(stats.worker_pids["idle"]) == 1
        assert not stats.running_queries and stats.busy_workers == 0


# --- tenants and tokens -------------------------------------------------------------------------


def test_a_tenant_reads_only_its_own_database(server, stores):
    end_b = stores["b"].frontier + 1
    with connect(server.url, TOKEN_A) as remote:
        with pytest.raises(TableNotFoundError, match="orders"):  # lists tenant a's tables, never b's
            remote.load_table("typed", end_b)
        with pytest.raises(TableNotFoundError):
            remote.load_table("T", end_b)
        other_files = f"{stores['b'].objects.uri}/tenant_b/**/*.parquet"
        with pytest.raises(SandboxViolationError):
            remote.sql(f"SELECT * FROM read_parquet('{other_files}')", end_b)
    with connect(server.url, TOKEN_B) as remote:
        assert [d.table_name for d in remote.get_catalog(end_b)] == ["typed"]


def test_requests_without_a_known_token_are_refused(server):
    for token in ("", "not-a-token", TOKEN_A + "x"):
        with pytest.raises(AuthenticationError):
            connect(server.url, token).get_catalog(0)
    with pytest.raises(ServiceUnavailableError):  # nothing listens there
        connect("grpc://127.0.0.1:1", TOKEN_A, timeout=10).get_catalog(0)
    plain = flight.FlightClient(server.url)
    with pytest.raises(flight.FlightUnauthenticatedError, match="bearer token"):
        plain.do_get(flight.Ticket(encode_request(GetCatalogRequest(0)))).read_all()


def test_a_malformed_ticket_is_refused_as_invalid(server):
    options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN_A}".encode())])
    raw = flight.FlightClient(server.url)
    for ticket in (b"not json", b'{"op": "DropTable"}', b'{"op": "Sql", "query": 1, "query_timestamp": 0}'):
        with pytest.raises(flight.FlightServerError) as error:
            raw.do_get(flight.Ticket(ticket), options).read_all()
        assert b"InvalidRequestError" in error.value.extra_info


@pytest.mark.daemon
def test_a_point_lookup_is_one_action_answering_as_its_ticket_and_the_local_api(stores):
    """The client sends FetchRow as one DoAction (no stream is opened for it); its answers, values
    and errors, are the local API's and those of the same request as a DoGet ticket. A malformed
    body, or another request in the action, is refused as invalid; a call without a known token,
    as unauthenticated."""
    local = stores["a"]
    end = local.frontier + 1
    keys = [*local.load_table("orders", end).column("synthetic_key").to_pylist()[:15], -1, 10**9]
    asks = [("orders", key, as_of) for key in keys for as_of in (end, end // 2, 1)] + [("no_such_table", 1, end)]
    options = flight.FlightCallOptions(headers=[(b"authorization", f"Bearer {TOKEN_A}".encode())], timeout=30)
    with HistoryServer(config_for(stores, workers=1)) as running, connect(running.url, TOKEN_A) as remote:
        remotely = [answer(lambda ask=ask: remote.fetch_row(*ask)) for ask in asks]
        assert running.stats().finished_streams == 0  # not one DoGet stream
        for ask, got in zip(asks, remotely, strict=True):
            assert same(got, answer(lambda ask=ask: local.fetch_row(*ask))), ask
            # the same request as a DoGet ticket (as a client from before the action sends it)
            streamed = answer(lambda ask=ask: fetch_row_from_arrow(remote.call(FetchRowRequest(*ask))).as_row())
            assert same(streamed, got), ask
        # each ticket answered opened a stream (an error none): the actions before opened not one
        answered = sum(not isinstance(got, tuple) for got in remotely)
        wait_until(lambda: running.stats().finished_streams == answered, "every DoGet stream finished")
        assert any(isinstance(got, dict) for got in remotely) and any(got is None for got in remotely)
        assert remotely[-1][0] is TableNotFoundError
        raw = flight.FlightClient(running.url)
        malformed = (b"not json", b'{"op": "FetchRow", "table_uuid": "orders"}',
                     encode_request(SqlRequest("SELECT 1", end)))
        for body in malformed:
            with pytest.raises(flight.FlightServerError) as error:
                list(raw.do_action(flight.Action("FetchRow", body), options))
            assert b"InvalidRequestError" in error.value.extra_info, body
        with pytest.raises(flight.FlightUnauthenticatedError):
            list(raw.do_action(flight.Action("FetchRow", encode_request(FetchRowRequest("orders", 1, end))),
                               flight.FlightCallOptions(timeout=30)))


# --- limits and cancellation ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def strict_server(stores):
    limits = Limits(max_result_rows=50, query_timeout_s=5, max_concurrent_queries=1)
    with HistoryServer(config_for(stores, workers=2, limits=limits)) as running:
        yield running


@pytest.mark.daemon
def test_a_result_over_the_size_limit_is_refused(strict_server, stores):
    end = stores["a"].frontier + 1
    with connect(strict_server.url, TOKEN_A) as remote:
        with pytest.raises(ResultTooLargeError, match="limit of 50"):
            remote.load_table("orders", end)
        with pytest.raises(ResultTooLargeError, match="rows"):
            remote.sql("SELECT * FROM range(51)", end)
        assert remote.sql("SELECT * FROM range(50)", end).num_rows == 50
        assert same(remote.fetch_row("orders", 10_000, end), stores["a"].fetch_row("orders", 10_000, end))


@pytest.mark.daemon
def test_a_query_over_the_time_limit_is_cancelled_and_the_tenant_limited_to_its_slots(strict_server, stores):
    end = stores["a"].frontier + 1
    before = strict_server.stats().replaced_workers
    outcome: dict[str, BaseException] = {}

    def endless() -> None:
        try:
            connect(strict_server.url, TOKEN_A).sql(ENDLESS_SQL, end)
        except BaseException as exc:  # noqa: BLE001 - checked by the test below
            outcome["error"] = exc

    thread = threading.Thread(target=endless)
    thread.start()
    wait_until(lambda: strict_server.stats().running_queries.get("a") == 1, "the endless query runs")
    with pytest.raises(ConcurrencyLimitError, match="already runs 1"):
        connect(strict_server.url, TOKEN_A).fetch_row("orders", 10_000, end)
    # another tenant has slots of its own
    assert connect(strict_server.url, TOKEN_B).fetch_row("typed", 2, 4) == stores["b"].fetch_row("typed", 2, 4)
    thread.join(120)
    assert isinstance(outcome.get("error"), QueryTimeoutError), outcome
    assert "cancelled" in str(outcome["error"])
    stats = strict_server.stats()
    assert stats.replaced_workers == before + 1  # the worker running it was killed
    assert dict(stats.running_queries) == {} and stats.busy_workers == 0
    assert same(connect(strict_server.url, TOKEN_A).fetch_row("orders", 10_000, end),
                stores["a"].fetch_row("orders", 10_000, end))


def test_a_client_gone_mid_query_cancels_it(server, stores):
    end = stores["a"].frontier + 1
    before = server.stats().replaced_workers
    impatient = connect(server.url, TOKEN_A, timeout=1.0)
    with pytest.raises(QueryTimeoutError):
        impatient.sql(ENDLESS_SQL, end)
    # the server notices the cancelled call and kills the worker, well before its own 60 s limit
    wait_until(lambda: server.stats().replaced_workers == before + 1, "the worker is replaced")
    wait_until(lambda: not server.stats().running_queries, "the query slot is free")


def test_a_client_gone_mid_stream_leaks_nothing(server, stores):
    end = stores["a"].frontier + 1
    before = server.stats()
    # without gRPC's bandwidth probing the client's receive window stays at its initial 64 KiB, so
    # the server cannot have pushed the whole answer (about 20 MB in 1000-row batches) ahead
    with connect(server.url, TOKEN_A, grpc_options=[("grpc.http2.bdp_probe", 0)]) as remote:
        reader = remote.stream(SqlRequest("SELECT range AS i, repeat('x', 1000) AS pad FROM range(20000)", end))
        first = reader.read_chunk()
        assert first.data.num_rows == 1000
        assert server.stats().open_streams == 1  # the server is still in the middle of it
        reader.cancel()
    wait_until(lambda: server.stats().abandoned_streams == before.abandoned_streams + 1, "the stream is abandoned")
    after = server.stats()
    assert after.open_streams == 0 and not after.running_queries and after.busy_workers == 0
    with connect(server.url, TOKEN_A) as remote:
        assert remote.sql("SELECT count(*) AS n FROM range(20000)", end).column("n").to_pylist() == [20000]


# --- TLS and the serve command ---------------------------------------------------------------------


def self_signed_certificate() -> tuple[bytes, bytes]:
    """A certificate for 127.0.0.1 and localhost and its key (PEM), made for this test only."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "history-service-test")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


@pytest.mark.daemon
def test_tls_serves_trusting_clients_only(stores):
    cert, key = self_signed_certificate()
    with HistoryServer(config_for(stores, workers=1, tls_cert=cert, tls_key=key)) as running:
        assert running.url.startswith("grpc+tls://")
        end = stores["b"].frontier + 1
        with connect(running.url, TOKEN_B, tls_root_certs=cert) as remote:
            assert same(remote.load_table("typed", end), stores["b"].load_table("typed", end))
        with pytest.raises(ServiceUnavailableError):  # the certificate is not trusted
            connect(running.url, TOKEN_B, timeout=10).get_catalog(end)
        with pytest.raises(ServiceUnavailableError):  # no TLS against a TLS server
            connect(running.url.replace("grpc+tls", "grpc"), TOKEN_B, timeout=10).get_catalog(end)


@pytest.mark.daemon
def test_serve_command_runs_the_service_with_tls_until_terminated(tmp_path, stores):
    cli = [sys.executable, "-m", "history_pipeline.cli"]
    made = subprocess.run([*cli, "serve", "--new-token"], capture_output=True, text=True, check=True, timeout=60)
    token = made.stdout.split()[1]
    digest = made.stdout.split()[3]
    hashed = subprocess.run([*cli, "serve", "--hash-token"], input=token + "\n", capture_output=True, text=True,
                            check=True, timeout=60)
    assert hashed.stdout.strip() == digest == token_digest(token)
    config = tmp_path / "server.toml"
    config.write_text(
        f'root = "{stores["a"].objects.uri}"\nworkers = 1\n[limits]\nquery_timeout_s = 30\n'
        f'[tenants.a]\ndatabase = "tenant_a"\ntoken_sha256 = "{digest}"\n'
    )
    bad = tmp_path / "bad.toml"
    bad.write_text(config.read_text() + "max_rows = 5\n")
    refused = subprocess.run([*cli, "serve", "--config", str(bad)], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "unknown settings ['max_rows']" in refused.stderr, refused.stderr
    cert, key = self_signed_certificate()
    (tmp_path / "cert.pem").write_bytes(cert)
    (tmp_path / "key.pem").write_bytes(key)
    process = subprocess.Popen([*cli, "serve", "--config", str(config), "--port", "0",
                                "--tls-cert", str(tmp_path / "cert.pem"), "--tls-key", str(tmp_path / "key.pem")],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        line = process.stdout.readline()
        assert "serving 1 tenant(s)" in line, line + process.stderr.read()
        url = line.split()[-1]
        assert url.startswith("grpc+tls://127.0.0.1:")
        end = stores["a"].frontier + 1
        with connect(url, token, tls_root_certs=tmp_path / "cert.pem") as remote:
            assert same(remote.fetch_row("orders", 10_000, end), stores["a"].fetch_row("orders", 10_000, end))
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


# --- the pure pieces ----------------------------------------------------------------------------


def test_the_client_has_the_query_methods_of_the_store():
    import inspect

    from history_pipeline.client import HistoryClient

    for name in ("load_table", "fetch_row", "get_catalog", "sql", "row_history", "diff"):
        local, remote = inspect.signature(getattr(HistoryStore, name)), inspect.signature(getattr(HistoryClient, name))
        assert list(local.parameters) == list(remote.parameters), name
        assert local.return_annotation == remote.return_annotation, name
    for name in ("frontier", "earliest"):
        assert isinstance(getattr(HistoryStore, name), property) and isinstance(getattr(HistoryClient, name), property)


def test_request_messages_round_trip_and_refuse_malformed_tickets():
    for request in (FetchRowRequest("orders", -3, 17), SqlRequest("SELECT 1", 0), GetCatalogRequest(5)):
        assert decode_request(encode_request(request)) == request
    assert decode_request(encode_request(LoadTableRequest("orders", 4, ordered=False))) == \
        LoadTableRequest("orders", 4, ordered=False)
    # a ticket from a client before ``ordered`` asks for key order, as it did then
    assert decode_request(b'{"op": "LoadTable", "table_uuid": "orders", "query_timestamp": 4}') == \
        LoadTableRequest("orders", 4, ordered=True)
    for ticket in (b"[1]", b'{"op": "FetchRow", "table_uuid": "x", "query_timestamp": 1}',
                   b'{"op": "GetCatalog", "query_timestamp": true}', b"\xff"):
        with pytest.raises(InvalidRequestError):
            decode_request(ticket)
    with pytest.raises(TypeError, match="query_timestamp"):
        LoadTableRequest("orders", 1.5)


def test_tagged_values_round_trip_exactly():
    from decimal import Decimal
    from uuid import UUID

    values = [
        None, True, 0, -(2**63), 2**70, 0.1, float("nan"), float("-inf"), Decimal("12.3400"), "héllo",
        b"\x00\xff", UUID(int=5), dt.date(2024, 2, 29), dt.time(1, 2, 3, 4),
        dt.datetime(2024, 1, 2, 3, 4, 5, 6), dt.datetime(2024, 1, 2, tzinfo=dt.UTC), Interval(1, -2, 3),
        [1, [None, "a"]], {"$uuid": "x", "nested": {"$decimal": [1.5]}}, {},
    ]
    for value in values:
        back = decode_value(encode_value(value))
        assert same(back, value), (value, back)
    with pytest.raises(TypeError, match="no wire form"):
        encode_value(object())


@pytest.mark.parametrize(
    ("data_type", "wal_value"),
    [
        ("REAL[]", [0.1, None, "NaN"]),
        ("INTERVAL[]", [{"months": -1, "days": 2, "micros": 3}]),
        ("JSONB[]", [{"a": 1.5}, None, "s"]),
        ("UUID[]", ["0b4f6f36-5d1e-4c47-9b8a-2f0f3d6e9a01", None]),
        ("NUMERIC[]", ["1e-40", "-0.000"]),
        ("NUMERIC(40,3)", "1234567890123456789012345678901234567.125"),
        ("TIMESTAMPTZ[][]", [["2024-01-02T03:04:05.000001-08:00"], [None]]),
        ("BYTEA[]", ["AAEC/w=="]),
        ("TIME", "23:59:59.999999"),
        ("DATE[]", ["0001-01-01", "9999-12-31"]),
    ],
)
def test_a_fetched_row_of_any_type_survives_its_arrow_form(data_type, wal_value):
    from history_pipeline.schema import ColumnDescriptor, TableDescriptor
    from history_pipeline.service.execute import answer_bytes
    from history_pipeline.service.protocol import (
        fetch_row_from_arrow,
        fetch_row_from_stream,
        fetch_row_stream,
        fetch_row_to_arrow,
    )
    from history_pipeline.types import decode_value as from_wal
    from history_pipeline.types import parse_data_type

    column_type = parse_data_type(data_type)
    descriptor = TableDescriptor("T", "t", (ColumnDescriptor("c-1", "c", column_type, True, "a", "c-1-1"),))
    row = {"c": from_wal(column_type, wal_value)}
    response = fetch_row_from_arrow(fetch_row_to_arrow(descriptor, row))
    assert response.column_uuid_mapping == ("c-1",)
    assert same(response.as_row(), row)
    assert fetch_row_from_arrow(fetch_row_to_arrow(descriptor, None)).as_row() is None
    # the server's stream of it: the bytes an Arrow IPC writer makes of that table, read back alike
    rows, stream = fetch_row_stream(descriptor, row)
    assert rows == 1 and stream == answer_bytes(fetch_row_to_arrow(descriptor, row), 1000).to_pybytes()
    for _ in range(2):  # the second read takes the schema it read the first time
        streamed = fetch_row_from_stream(stream)
        assert streamed.column_uuid_mapping == ("c-1",) and same(streamed.as_row(), row)
    rows, stream = fetch_row_stream(descriptor, None)
    assert rows == 0 and fetch_row_from_stream(stream) == fetch_row_from_arrow(fetch_row_to_arrow(descriptor, None))
    assert fetch_row_from_stream(pa.py_buffer(stream)).as_row() is None


def test_a_fetch_row_answer_that_is_no_arrow_stream_of_a_row_is_a_service_error():
    from history_pipeline.schema import ColumnDescriptor, TableDescriptor
    from history_pipeline.service.protocol import fetch_row_from_stream, fetch_row_stream
    from history_pipeline.types import parse_data_type

    column = ColumnDescriptor("c-1", "c", parse_data_type("BIGINT"), True, "a", "c-1-1")
    _, stream = fetch_row_stream(TableDescriptor("T", "t", (column,)), {"c": 7})
    with pytest.raises(ServiceError, match="not an Arrow stream"):
        fetch_row_from_stream(b"not arrow")
    with pytest.raises(ServiceError, match="not an Arrow stream"):
        fetch_row_from_stream(stream[: len(stream) // 2])


def test_tokens_are_stored_hashed_and_checked():
    token = new_token()
    tenant = Tenant("a", "db", token_digest(token))
    assert token not in repr(tenant)
    directory = TenantDirectory.of([tenant])
    assert directory.authenticate(f"Bearer {token}") is tenant
    for header in (None, "", token, f"Basic {token}", "Bearer ", f"Bearer {token}x"):
        with pytest.raises(AuthenticationError):
            directory.authenticate(header)
    with pytest.raises(ValueError, match="share a token"):
        TenantDirectory.of([tenant, Tenant("b", "db2", tenant.token_sha256)])
    with pytest.raises(ValueError, match="64 lowercase hex"):
        Tenant("c", "db", token)


def test_concurrency_counts_admit_up_to_the_limit_and_release():
    running = admit({}, "a", 2)
    running = admit(running, "a", 2)
    with pytest.raises(ConcurrencyLimitError, match="already runs 2"):
        admit(running, "a", 2)
    assert admit(running, "b", 1) == {"a": 2, "b": 1}
    assert release(release(running, "a"), "a") == {}


@pytest.mark.daemon
def test_the_servers_row_cache_budget_is_configured_and_taken_by_the_server(stores):
    """``row_cache_mib`` (default: the process default) is the budget of the decoded row groups the
    server keeps for its point lookups; a negative one is refused when the file is read."""
    from history_pipeline.supertable import row_cache

    digest = token_digest("t")
    tenants = {"a": {"token_sha256": digest}}
    assert config_from_mapping({"tenants": tenants}).row_cache_mib * 2**20 == row_cache.ROW_CACHE_BYTES
    assert config_from_mapping({"row_cache_mib": 0, "tenants": tenants}).row_cache_mib == 0
    with pytest.raises(ValueError, match="row_cache_mib"):
        config_from_mapping({"row_cache_mib": -1, "tenants": tenants})
    try:
        with HistoryServer(config_for(stores, workers=1, row_cache_mib=3)) as running, \
                connect(running.url, TOKEN_A) as remote:
            end = stores["a"].frontier + 1
            key = stores["a"].load_table("orders", end).column("synthetic_key")[0].as_py()
            row = remote.fetch_row("orders", key, end)
            kept = row_cache.row_cache_stats()  # (the server's: it runs in this process)
            assert kept.budget_bytes == 3 * 2**20 and 0 < kept.held_bytes <= kept.budget_bytes
            assert row is not None and same(row, stores["a"].fetch_row("orders", key, end))
    finally:
        row_cache.set_row_cache_bytes(row_cache.ROW_CACHE_BYTES)


def test_config_reads_tenants_limits_and_refuses_mistakes():
    digest = token_digest("t")
    config = config_from_mapping({
        "root": "r", "port": 0, "limits": {"query_timeout_s": 5},
        "tenants": {"a": {"token_sha256": digest, "max_concurrent_queries": 1}},
    })
    (tenant,) = config.tenants
    assert tenant.database == "a" and config.limits.query_timeout_s == 5
    assert config.limits_of(tenant) == Limits(query_timeout_s=5, max_concurrent_queries=1)
    for bad, message in (
        ({"tenants": {}}, "no tenants"),
        ({"tenants": {"a": {}}}, "no token_sha256"),
        ({"tenants": {"a": {"token_sha256": digest, "max_rows": 1}}}, "unknown settings"),
        ({"prot": 1, "tenants": {"a": {"token_sha256": digest}}}, "unknown server settings"),
        ({"limits": {"query_timeout_s": 0}, "tenants": {"a": {"token_sha256": digest}}}, "must be positive"),
        ({"tls_cert": None, "tenants": {"a": {"token_sha256": digest}}, "tls_key": "k.pem"}, "No such file"),
    ):
        with pytest.raises((ValueError, OSError), match=message):
            config_from_mapping(bad)


@pytest.mark.daemon
def test_changes_come_back_as_the_local_feed_delivers_them(server, stores):
    from history_pipeline.service.protocol import changes_from_arrow, changes_to_arrow

    local = stores["a"]
    end = local.frontier + 1
    with connect(server.url, TOKEN_A) as remote:
        for since, until, tables in ((0, None, None), (end // 2, end - 3, None), (0, None, ["customers"])):
            expected = changes_from_arrow(changes_to_arrow(local.changes(tables, since=since, until=until)))
            got = remote.changes(tables, since=since, until=until)
            assert got == expected and got
            rows = [r for b in local.changes(tables, since=since, until=until) for r in b.records.to_pylist()]
            assert [(r["t"], r["table"], r["key"], r["op"]) for r in got] == \
                [(r["t"], r["table"], r["key"], r["op"]) for r in rows]
            assert got[-1]["cursor"] == (end if until is None else until)
        assert any(r["op"] == "rename_table" for r in remote.changes(["customers"], since=0))
        with pytest.raises(FutureTimestampError, match=f"frontier is {local.frontier}"):
            remote.changes(since=0, until=end + 1)


def test_change_rows_keep_their_values_through_the_wire_form(stores):
    from history_pipeline.service.protocol import ChangesRequest, changes_from_arrow, changes_to_arrow

    store = stores["b"]
    rows = changes_from_arrow(changes_to_arrow(store.changes(since=0)))
    local = [r for b in store.changes(since=0) for r in b.records.to_pylist()]
    assert len(rows) == len(local) and rows
    for got, want in zip(rows, local, strict=True):
        assert (got["t"], got["key"], got["op"]) == (want["t"], want["key"], want["op"])
        if want["key"] is not None:  # row images come back as fetch_row gives them, every type exactly
            assert same(got["before"], store.fetch_row(got["table_uuid"], got["key"], got["t"]))
            assert same(got["after"], store.fetch_row(got["table_uuid"], got["key"], got["t"] + 1))
    request = ChangesRequest(3, None, ["orders"])
    assert decode_request(encode_request(request)) == request and request.tables == ("orders",)


# --- the server's death takes its processes with it -------------------------------------------------


def _children_of() -> dict[int, list[int]]:
    """Every live process's children, from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(entry))
    return children


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` in the process tree now."""
    children, found, todo = _children_of(), [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def cpu_ticks(pid: int) -> int:
    """User plus system CPU time of a process, in clock ticks (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])


def alive(pid: int) -> bool:
    """Is the process still there (a zombie, dead but not yet reaped by whoever adopted it, is not)?"""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@pytest.mark.daemon
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="walks the process tree in /proc (Linux)")
def test_a_killed_server_takes_its_workers_and_helpers_with_it(tmp_path, stores):
    """SIGKILL runs no cleanup in the server: its workers (one in the middle of a query that would run
    for minutes) and multiprocessing's helper processes must still end within seconds."""
    config = tmp_path / "server.toml"
    config.write_text(
        f'root = "{stores["a"].objects.uri}"\nworkers = 2\n[limits]\nquery_timeout_s = 600\n'
        f'[tenants.a]\ndatabase = "tenant_a"\ntoken_sha256 = "{token_digest(TOKEN_A)}"\n'
    )
    process = subprocess.Popen([sys.executable, "-m", "history_pipeline.cli", "serve", "--config", str(config),
                                "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    below: list[int] = []
    try:
        line = process.stdout.readline()
        assert "serving 1 tenant(s)" in line, line + process.stderr.read()
        client = connect(line.split()[-1], TOKEN_A)
        end = stores["a"].frontier + 1
        assert [d.table_name for d in client.get_catalog(end)] == [d.table_name for d in stores["a"].get_catalog(end)]
        below = descendants(process.pid)
        start = {pid: cpu_ticks(pid) for pid in below}
        threading.Thread(target=answer, args=(lambda: client.sql(ENDLESS_SQL, end),), daemon=True).start()
        # a worker is answering once it has burnt half a second of CPU since the query was sent
        wait_until(lambda: any(cpu_ticks(pid) - start[pid] >= os.sysconf("SC_CLK_TCK") // 2 for pid in below),
                   "the endless query runs on a worker", limit_s=120)
        assert len(below) >= 3, below  # two workers and the resource tracker
        process.kill()
        process.wait(timeout=30)
        wait_until(lambda: not any(alive(pid) for pid in below), "every process of the server ends", limit_s=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for pid in below:  # what the server left behind (only when the test fails)
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


# --- every Flight call answers a typed error, never the server's internals ---------------------------


def _raw_calls(raw: flight.FlightClient, options: flight.FlightCallOptions) -> dict[str, Callable[[], Any]]:
    """Each Flight call, made as a client of the bare protocol would."""
    descriptor = flight.FlightDescriptor.for_command(b"orders")
    schema = pa.schema([("a", pa.int64())])

    def put() -> None:
        writer, _ = raw.do_put(descriptor, schema, options)
        writer.write_table(pa.table({"a": [1]}))
        writer.close()

    def exchange() -> None:
        writer, reader = raw.do_exchange(descriptor, options)
        writer.begin(schema)
        writer.done_writing()
        reader.read_all()

    return {
        "Handshake": lambda: raw.authenticate_basic_token("user", "password", options),
        "ListFlights": lambda: list(raw.list_flights(options=options)),
        "GetFlightInfo": lambda: raw.get_flight_info(descriptor, options),
        "GetSchema": lambda: raw.get_schema(descriptor, options),
        "DoPut": put,
        "DoExchange": exchange,
        "ListActions": lambda: raw.list_actions(options),
        "DoAction": lambda: list(raw.do_action(flight.Action("drop", b""), options)),
        "DoGet": lambda: raw.do_get(flight.Ticket(b'{"op": "Drop"}'), options).read_all(),
    }


def test_every_flight_call_answers_a_typed_error_without_the_servers_internals(server, stores):
    root = str(stores["a"].objects.uri)
    for token, problem in ((TOKEN_A, "not offered"), (None, "bearer")):
        headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
        options = flight.FlightCallOptions(headers=headers, timeout=30)
        for call, make in _raw_calls(flight.FlightClient(server.url), options).items():
            if call == "ListActions" and token:  # offered: Flight SQL's actions and the point lookup
                assert {a.type for a in make()} == {"CreatePreparedStatement", "ClosePreparedStatement", "FetchRow"}
                continue
            with pytest.raises((pa.ArrowException, OSError)) as error:
                make()
            text = str(error.value)
            assert "Traceback" not in text and ".py" not in text, (call, text)
            assert root not in text and "/" not in text.split(". Detail:")[0], (call, text)
            if call == "DoGet" and token:
                assert "unknown operation 'Drop'" in text, text
                continue
            assert problem in text.lower(), (call, text)
            if token and call != "Handshake":  # (the client's handshake wrapper names no call)
                assert call in text, (call, text)
            if call not in ("Handshake", "GetSchema"):  # (pyarrow's client drops these calls' error details)
                assert isinstance(error.value, flight.FlightError), (call, error.value)
                name = "InvalidRequestError" if token else "AuthenticationError"
                assert name.encode() in error.value.extra_info, (call, error.value.extra_info)


def test_no_error_shows_where_the_server_keeps_its_files(tmp_path):
    from history_pipeline.service.errors import redact

    root = str(tmp_path / "data")
    message = f"IO Error: cannot open {root}/tenant_a/orders/part-1.parquet"
    assert redact(message, [root]) == "IO Error: cannot open <root>/tenant_a/orders/part-1.parquet"
    bug = "internal error (OSError): [Errno 2] No such file: '/srv/history/lib/x.py', line 3"
    assert redact(bug, [root], any_path=True) == "internal error (OSError): [Errno 2] No such file: '<path>', line 3"
    assert redact("3/4 of 1/2", [root], any_path=True) == "3/4 of 1/2"
    assert redact("s3://bucket/prefix/x.parquet is gone", ["s3://bucket/prefix"]) == "<root>/x.parquet is gone"


# --- the request log and the configuration's help -------------------------------------------------


@pytest.mark.daemon
def test_every_request_logs_one_line_without_values(stores):
    lines: list[str] = []
    local = stores["a"]
    end = local.frontier + 1
    with HistoryServer(config_for(stores, workers=1), log=lines.append) as running:
        with connect(running.url, TOKEN_A) as remote:
            answer = remote.sql("SELECT * FROM orders", end)
            row = remote.fetch_row("orders", 1, end)
            with pytest.raises(HistoryError):
                remote.sql("SELECT * FROM nowhere", end)
        with pytest.raises(AuthenticationError):
            connect(running.url, "not-a-token").get_catalog(0)
        refused = lines.pop()
    assert refused.split(" ")[1:4] == ["tenant=-", "call=DoGet", "error=AuthenticationError"], refused
    assert len(lines) == 3, lines
    sql, fetch, failed = (line.split(" ") for line in lines)
    assert sql[1:4] == ["tenant=a", "call=Sql", f"rows={answer.num_rows}"]
    assert sql[4].startswith("bytes=") and int(sql[4].removeprefix("bytes=")) > 0
    assert fetch[1:4] == ["tenant=a", "call=FetchRow", f"rows={0 if row is None else 1}"]
    assert failed[1:3] == ["tenant=a", "call=Sql"] and failed[3].startswith("error=")
    assert len(failed) == 5 and "nowhere" not in lines[2]  # the class only, not the message
    for line in lines:
        dt.datetime.fromisoformat(line.split(" ")[0])
        assert line.split(" ")[-1].startswith("ms=")


def test_a_request_line_holds_time_tenant_call_size_or_error_and_ms():
    from history_pipeline.service.server import RequestRecord, request_line

    at = dt.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=dt.UTC)
    assert request_line(RequestRecord(at, "a", "LoadTable", 12.4, rows=3, bytes=900)) == (
        "2026-01-02T03:04:05.678Z tenant=a call=LoadTable rows=3 bytes=900 ms=12"
    )
    assert request_line(RequestRecord(at, "b", "Diff", 7.0, error="QueryTimeoutError")) == (
        "2026-01-02T03:04:05.678Z tenant=b call=Diff error=QueryTimeoutError ms=7"
    )


def test_serve_help_lists_every_configuration_key_with_its_default():
    from dataclasses import fields

    from history_pipeline.service.config import _TENANT_KEYS, _TOP_KEYS, CONFIG_KEYS
    from history_pipeline_tests.cli_support import run_command

    result = run_command(["serve", "--help"])
    assert result.returncode == 0
    listed = {line.split()[0]: line for line in result.stdout.splitlines() if line.startswith("  ")}
    accepted = (
        set(_TOP_KEYS) | {f"tenants.<name>.{key}" for key in _TENANT_KEYS}
        | {f"limits.{f.name}" for f in fields(Limits)}
    )
    assert accepted <= set(listed)
    for key in CONFIG_KEYS:
        assert key.meaning in listed[key.key]
    assert "65536" in listed["batch_rows"] and str(Limits().max_result_rows) in listed["limits.max_result_rows"]
    digest = token_digest("t")
    for key in _TOP_KEYS - {"tenants", "tls_cert", "tls_key", "limits"}:  # each listed key is accepted
        config_from_mapping({key: 1 if key != "host" else "h", "tenants": {"a": {"token_sha256": digest}}})


@pytest.mark.daemon
def test_a_point_lookup_is_answered_while_every_worker_is_busy(stores):
    """FetchRow runs on the server's own threads (an index search and one row group): it neither
    waits for a worker nor takes one, yet keeps to its tenant's slots; other requests still go to
    the workers."""
    limits = Limits(query_timeout_s=5, max_concurrent_queries=2)
    with HistoryServer(config_for(stores, workers=1, limits=limits)) as running:
        end = stores["a"].frontier + 1
        outcome: dict[str, BaseException] = {}

        def endless() -> None:
            try:
                connect(running.url, TOKEN_A).sql(ENDLESS_SQL, end)
            except BaseException as exc:  # noqa: BLE001 - checked below
                outcome["error"] = exc

        thread = threading.Thread(target=endless)
        thread.start()
        wait_until(lambda: running.stats().busy_workers == 1, "the only worker is taken")
        with connect(running.url, TOKEN_A, timeout=3) as remote:
            for key in (1, 2, 10_000, -5):
                assert same(remote.fetch_row("orders", key, end), stores["a"].fetch_row("orders", key, end))
        assert same(connect(running.url, TOKEN_B, timeout=3).fetch_row("typed", 2, 4),
                    stores["b"].fetch_row("typed", 2, 4))
        assert running.stats().busy_workers == 1  # still the endless query's
        thread.join(120)
        assert isinstance(outcome.get("error"), QueryTimeoutError), outcome
        with pytest.raises(TableNotFoundError):  # errors come back typed, as from a worker
            connect(running.url, TOKEN_A).fetch_row("no_such_table", 1, end)
