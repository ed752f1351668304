"""The HistoryService over Arrow Flight, and Arrow Flight SQL on the same port.

Every operation of the service's own protocol is a ``do_get``: the ticket is a request message
(``protocol.py``), the answer an Arrow stream. Flight SQL clients send protobuf commands
(``flight_sql.py``): a statement or catalog call runs at GetFlightInfo and its answer is kept for
the one DoGet of its ticket; prepared statements are DoActions and a DoPut of their parameters.

A request is authenticated by its bearer token (middleware), which fixes the
tenant and so the only database it can read; it then takes one of the tenant's query slots,
runs on a worker process under the time limit (a point lookup, bounded work, on the server's own
thread instead), and its answer is streamed in record batches.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from history_pipeline.errors import HistoryError
from history_pipeline.lsn import to_timestamp
from history_pipeline.service import flight_sql as fsql
from history_pipeline.service.auth import Tenant, TenantDirectory
from history_pipeline.service.config import ServerConfig
from history_pipeline.service.errors import (
    AuthenticationError,
    ConcurrencyLimitError,
    InvalidRequestError,
    QueryTimeoutError,
    ServiceError,
    error_payload,
    redact,
)
from history_pipeline.service.limits import ConcurrencyGate, Limits
from history_pipeline.service.protocol import (
    FETCH_ROW_ACTION,
    OPERATIONS,
    FetchRowRequest,
    Request,
    SqlRequest,
    StatusRequest,
    TableSchemasRequest,
    decode_request,
    encode_request,
    fetch_row_stream,
    operation,
    status_from_arrow,
    table_schemas_from_arrow,
)
from history_pipeline.service.workers import Job, WorkerPool
from history_pipeline.store import HistoryStore
from history_pipeline.supertable.row_cache import set_row_cache_bytes


class _TenantMiddleware(flight.ServerMiddleware):
    """Carries the authenticated tenant of one call and the as-of its connection asks for."""

    def __init__(self, tenant: Tenant, as_of: str | None = None):
        self.tenant = tenant
        self.as_of = as_of


#: Flight's calls by the names its protocol gives them
_CALL_NAMES = {
    flight.FlightMethod.HANDSHAKE: "Handshake",
    flight.FlightMethod.LIST_FLIGHTS: "ListFlights",
    flight.FlightMethod.GET_FLIGHT_INFO: "GetFlightInfo",
    flight.FlightMethod.GET_SCHEMA: "GetSchema",
    flight.FlightMethod.DO_GET: "DoGet",
    flight.FlightMethod.DO_PUT: "DoPut",
    flight.FlightMethod.DO_EXCHANGE: "DoExchange",
    flight.FlightMethod.LIST_ACTIONS: "ListActions",
    flight.FlightMethod.DO_ACTION: "DoAction",
}


def not_offered(call: str) -> InvalidRequestError:
    """The error for a Flight call this service does not answer."""
    return InvalidRequestError(
        f"{call} is not offered: this service answers DoGet with a ticket naming one of "
        f"{', '.join(OPERATIONS)} (history_pipeline.client.connect(url, token) sends them), and "
        "Arrow Flight SQL queries (GetFlightInfo, DoGet, DoAction) of a Flight SQL client"
    )


#: the calls answered: the service's own DoGet and Flight SQL's read-only calls
_OFFERED = {
    flight.FlightMethod.DO_GET, flight.FlightMethod.GET_FLIGHT_INFO, flight.FlightMethod.DO_ACTION,
    flight.FlightMethod.LIST_ACTIONS, flight.FlightMethod.DO_PUT,
}
#: the actions this server answers, with what they do: Flight SQL's, and a point lookup
_ACTIONS = {
    "CreatePreparedStatement": "prepare a read-only statement (its handle carries the statement)",
    "ClosePreparedStatement": "close a prepared statement (nothing is held for it)",
    FETCH_ROW_ACTION: "one row as of T: the body a FetchRow request, the one result its Arrow answer",
}
#: how long a Flight SQL answer waits for its DoGet before it is dropped
_ANSWER_TTL_S = 120.0


def _ipc(table: pa.Table) -> pa.Buffer:
    """A table as an Arrow IPC stream (the form every answer is kept in)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


#: Flight SQL's catalog calls answered without reading the tenant's database
_PLAIN_CATALOG_CALLS: Mapping[str, Any] = {
    "CommandGetCatalogs": lambda command: fsql.catalogs_table(),
    "CommandGetDbSchemas": lambda command: fsql.db_schemas_table(
        command.catalog if command.HasField("catalog") else None,
        command.db_schema_filter_pattern if command.HasField("db_schema_filter_pattern") else None,
    ),
    "CommandGetTableTypes": lambda command: fsql.table_types_table(),
    "CommandGetSqlInfo": lambda command: fsql.sql_info_table(list(command.info)),
    "CommandGetXdbcTypeInfo": lambda command: fsql.xdbc_type_info_table(
        command.data_type if command.HasField("data_type") else None
    ),
}


class _BearerAuth(flight.ServerMiddlewareFactory):
    """Authenticates every call by its ``authorization: Bearer <token>`` header, and refuses every
    call not offered (ListFlights, GetSchema, DoExchange, Handshake) here, before pyarrow runs a
    handler: some of its handlers (GetSchema) turn any
    Python exception into an error that quotes the server's stack trace."""

    def __init__(self, directory: TenantDirectory, refused: Callable[[str, str, str], None]):
        """``refused(tenant, call, error class)`` is told of every call refused here."""
        self.directory = directory
        self.refused = refused

    def start_call(self, info: Any, headers: Mapping[str, list[str]]) -> _TenantMiddleware:
        values = headers.get("authorization") or []
        call = _CALL_NAMES.get(info.method, str(info.method))
        try:
            tenant = self.directory.authenticate(values[0] if values else None)
        except AuthenticationError as exc:
            self.refused("-", call, type(exc).__name__)  # no tenant: the token named none
            raise flight.FlightUnauthenticatedError(str(exc), extra_info=error_payload(exc)) from None
        if info.method not in _OFFERED:
            error = not_offered(call)
            self.refused(tenant.name, call, type(error).__name__)
            raise flight_error(error)
        as_of = headers.get(fsql.AS_OF_HEADER) or []
        return _TenantMiddleware(tenant, as_of[0] if as_of else None)


def flight_error(exc: HistoryError, roots: tuple[str, ...] = ()) -> flight.FlightError:
    """The Flight error that carries a HistoryError to the client; no path of the server's disk
    shows in it (``roots`` as ``<root>``; any absolute path in a ServiceError, a bug's message)."""
    message = redact(str(exc), roots, any_path=type(exc) is ServiceError)
    if message != str(exc):
        exc = type(exc).__new__(type(exc))
        Exception.__init__(exc, message)
    kind: type[flight.FlightError] = flight.FlightServerError
    if isinstance(exc, AuthenticationError):
        kind = flight.FlightUnauthenticatedError
    elif isinstance(exc, QueryTimeoutError):
        kind = flight.FlightTimedOutError
    elif isinstance(exc, ConcurrencyLimitError):
        kind = flight.FlightUnavailableError
    return kind(str(exc), extra_info=error_payload(exc))


@dataclass(frozen=True)
class RequestRecord:
    """What the request log says of one request: never a value of the tenant's data."""

    at: datetime
    tenant: str
    call: str
    ms: float
    rows: int = 0
    bytes: int = 0
    #: the error's class name, or "abandoned" for an answer its client stopped reading
    error: str | None = None


def request_line(record: RequestRecord) -> str:
    """One request as one line of the log: time, tenant, call, rows and bytes or the error, ms."""
    at = record.at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    outcome = f"error={record.error}" if record.error else f"rows={record.rows} bytes={record.bytes}"
    return f"{at} tenant={record.tenant} call={record.call} {outcome} ms={record.ms:.0f}"


@dataclass(frozen=True)
class ServerStats:
    """What the server holds now (for operators and for the leak tests)."""

    open_streams: int
    finished_streams: int
    abandoned_streams: int
    running_queries: Mapping[str, int]
    busy_workers: int
    replaced_workers: int
    #: process ids of the worker processes: "idle", "busy" (taken by a request), "answering" (running it)
    worker_pids: Mapping[str, list[int]]
    #: Flight SQL answers computed and not yet fetched by their DoGet
    pending_answers: int = 0


@dataclass(frozen=True)
class _Answer:
    """A Flight SQL answer waiting for its DoGet: whose it is, the Arrow IPC stream, when made."""

    tenant: str
    payload: pa.Buffer
    made: float


@dataclass(frozen=True)
class _Logged:
    """What the log line of a streamed answer needs from the call that started it."""

    tenant: str
    call: str
    started: float
    size: int


class HistoryServer(flight.FlightServerBase):
    """The HistoryService for the tenants of one configuration; listens once constructed."""

    def __init__(self, config: ServerConfig, log: Callable[[str], None] | None = None):
        """``log`` receives one line per request (``serve`` writes them to stderr)."""
        self.config = config
        self._log = log
        self._gate = ConcurrencyGate()
        self._pool = WorkerPool(config.workers)
        self._lock = threading.Lock()
        self._open = self._finished = self._abandoned = 0
        self._roots = (config.root,)
        self._answers: dict[bytes, _Answer] = {}
        #: the stores point lookups are answered from, one per database (``_lookup``)
        self._stores: dict[str, HistoryStore] = {}
        #: each tenant's limits, worked out once (a lookup is answered in well under a millisecond)
        self._limits = {tenant.name: config.limits_of(tenant) for tenant in config.tenants}
        set_row_cache_bytes(config.row_cache_mib * 2**20)  # (the lookups of this process are this server's)
        tls = []
        if config.tls_cert is not None and config.tls_key is not None:
            tls = [flight.CertKeyPair(cert=config.tls_cert, key=config.tls_key)]
        try:
            super().__init__(
                f"{config.scheme}://{config.host}:{config.port}",
                tls_certificates=tls,
                middleware={"auth": _BearerAuth(
                    TenantDirectory.of(config.tenants),
                    lambda tenant, call, error: self._record(tenant, call, time.monotonic(), error=error),
                )},
            )
        except BaseException:
            self._pool.close()
            raise

    @property
    def url(self) -> str:
        """Where clients connect (with the port actually bound)."""
        return f"{self.config.scheme}://{self.config.host}:{self.port}"

    def stats(self) -> ServerStats:
        """Counters of streams, running queries and workers."""
        with self._lock:
            return ServerStats(
                self._open, self._finished, self._abandoned, self._gate.running, self._pool.busy,
                self._pool.replaced, self._pool.pids(), len(self._answers),
            )

    def do_get(self, context: flight.ServerCallContext, ticket: flight.Ticket) -> flight.FlightDataStream:
        tenant: Tenant = context.get_middleware("auth").tenant
        started = time.monotonic()
        call = "DoGet"  # named more precisely as the ticket is read
        with self._failures_recorded(tenant.name, lambda: call, started):
            command = fsql.unpack(ticket.ticket)
            if command is not None:
                call = "FlightSQL"
                answer = self._take_answer(tenant, command)
            else:
                request = decode_request(ticket.ticket)  # a malformed request costs no slot and no worker
                call = operation(request)
                answer = self._run(tenant, ticket.ticket, request, context)
            reader = pa.ipc.open_stream(answer)
        logged = _Logged(tenant.name, call, started, answer.size)
        return flight.GeneratorStream(reader.schema, self._stream(reader, logged))

    @contextmanager
    def _failures_recorded(self, tenant: str, call: Callable[[], str], started: float) -> Iterator[None]:
        """A call's failure logged (as ``call()`` names it when it fails) and sent to the client as
        a typed Flight error."""
        try:
            yield
        except HistoryError as exc:
            self._record(tenant, call(), started, error=type(exc).__name__)
            raise flight_error(exc, self._roots) from None
        except Exception as exc:  # a bug: a typed ServiceError for the client, not the server's stack trace
            self._record(tenant, call(), started, error=type(exc).__name__)
            raise self._internal(exc) from None

    def _record(self, tenant: str, call: str, started: float, rows: int = 0, size: int = 0,
                error: str | None = None) -> None:
        if self._log is not None:
            ms = (time.monotonic() - started) * 1000
            self._log(request_line(RequestRecord(datetime.now(UTC), tenant, call, ms, rows, size, error)))

    def _run(self, tenant: Tenant, ticket: bytes, request: Request, context: Any) -> pa.Buffer:
        """The Arrow IPC answer of one request of the tenant, in one of its slots: a point lookup on
        this thread (``_lookup``), any other request on a worker."""
        limits: Limits = self.config.limits_of(tenant)
        with self._gate.slot(tenant.name, limits.max_concurrent_queries):
            if isinstance(request, FetchRowRequest):
                return self._lookup(tenant.database, request)
            job = Job(self.config.root, tenant.database, ticket, limits, self.config.batch_rows)
            return self._pool.run(job, cancelled=context.is_cancelled)

    def _run_request(self, tenant: Tenant, request: Request, context: Any) -> pa.Buffer:
        """``_run`` of a request made here (a Flight SQL call's), encoded as its ticket would be."""
        return self._run(tenant, encode_request(request), request, context)

    def _fetch_row_action(self, context: flight.ServerCallContext, body: bytes) -> bytes:
        """A FetchRow sent as a DoAction: the same slot, lookup, answer, errors and log line as its
        DoGet, in one round trip (the answer's Arrow stream is the one result: no stream of
        messages to run on this server's threads)."""
        tenant: Tenant = context.get_middleware("auth").tenant
        started = time.monotonic()
        call = FETCH_ROW_ACTION
        with self._failures_recorded(tenant.name, lambda: call, started):
            request = decode_request(body)
            if not isinstance(request, FetchRowRequest):
                raise InvalidRequestError(
                    f"the {FETCH_ROW_ACTION} action takes a FetchRow request, not {operation(request)}: "
                    "send other requests as a DoGet ticket"
                )
            limits = self._limits[tenant.name]
            with self._gate.slot(tenant.name, limits.max_concurrent_queries):
                rows, answer = self._lookup_answer(tenant.database, request)
        self._record(tenant.name, call, started, rows, len(answer))
        return answer

    def _lookup(self, database: str, request: FetchRowRequest) -> pa.Buffer:
        """A FetchRow answered in the server process, from a store kept open per database.

        A lookup's work is bounded (an index search per file, then one row group of one file),
        so it needs no process to be killed in; handing it to a worker and back cost about as
        much as the lookup itself. The store's catalog log is re-read on every call, as a
        worker's is, and the key indexes it builds stay warm in this process."""
        return pa.py_buffer(self._lookup_answer(database, request)[1])

    def _lookup_answer(self, database: str, request: FetchRowRequest) -> tuple[int, bytes]:
        """``_lookup``'s answer as the bytes of its Arrow IPC stream, and its rows (one, or none)."""
        with self._lock:
            store = self._stores.get(database)
            if store is None:
                store = self._stores[database] = HistoryStore.open(self.config.root, database=database)
        # the row and its columns' names and types from one state, as ``execute`` answers it
        descriptor, row = store.fetch_row_described(request.table_uuid, request.synthetic_key,
                                                    request.query_timestamp)
        return fetch_row_stream(descriptor, row)

    # --- Arrow Flight SQL -------------------------------------------------------------------

    def get_flight_info(
        self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor
    ) -> flight.FlightInfo:
        middleware = context.get_middleware("auth")
        tenant: Tenant = middleware.tenant
        try:
            command = fsql.unpack(descriptor.command or b"") if descriptor.command else None
            if command is None:
                raise not_offered("GetFlightInfo without a Flight SQL command")
            answer = self._flight_sql_answer(tenant, middleware.as_of, command, context)
            schema = pa.ipc.open_stream(answer).schema
            handle = self._keep_answer(tenant, answer)
        except HistoryError as exc:
            raise flight_error(exc, self._roots) from None
        except Exception as exc:  # a bug: typed, without the server's stack trace
            raise self._internal(exc) from None
        ticket = flight.Ticket(fsql.pack(fsql.message("TicketStatementQuery", statement_handle=handle)))
        return flight.FlightInfo(schema, descriptor, [flight.FlightEndpoint(ticket, [])], -1, -1)

    def _flight_sql_answer(self, tenant: Tenant, as_of: str | None, command: Any, context: Any) -> pa.Buffer:
        """The Arrow IPC answer of a Flight SQL command (run now; its DoGet fetches it)."""
        name = fsql.name_of(command)
        if name in ("CommandStatementQuery", "CommandPreparedStatementQuery"):
            text = (command.query if name == "CommandStatementQuery"
                    else fsql.Prepared.of(command.prepared_statement_handle).bound_query())
            statement = fsql.split_as_of(text)
            timestamp = self._as_of(tenant, statement.as_of or as_of, context)
            return self._run_request(tenant, SqlRequest(statement.query, timestamp), context)
        if name in _PLAIN_CATALOG_CALLS:
            return _ipc(_PLAIN_CATALOG_CALLS[name](command))
        if name in ("CommandGetTables", "CommandGetPrimaryKeys"):
            timestamp = self._as_of(tenant, as_of, context)
            request = TableSchemasRequest(timestamp)
            schemas = table_schemas_from_arrow(pa.ipc.open_stream(
                self._run_request(tenant, request, context)).read_all())
            if name == "CommandGetTables":
                return _ipc(fsql.tables_table(command, schemas))
            return _ipc(fsql.primary_keys_table(command, set(schemas)))
        raise InvalidRequestError(f"the Flight SQL command {name} is not offered by this server")

    def do_put(self, context: flight.ServerCallContext, descriptor: flight.FlightDescriptor,
               reader: flight.MetadataRecordBatchReader, writer: flight.FlightMetadataWriter) -> None:
        try:
            command = fsql.unpack(descriptor.command) if descriptor.command else None
            if command is None or fsql.name_of(command) != "CommandPreparedStatementQuery":
                raise InvalidRequestError(
                    "this service is read-only: DoPut is not offered but to bind a prepared query's "
                    "parameters (no updates, no ingestion)"
                )
            prepared = fsql.Prepared.of(command.prepared_statement_handle)
            parameters = reader.read_all()
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, parameters.schema) as stream:
                stream.write_table(parameters)
            bound = fsql.Prepared(prepared.query, sink.getvalue().to_pybytes())
            bound.bound_query()  # parameters that do not fit are refused now
            # the parameters travel in the handle the client gets back: nothing is held here
            result = fsql.message("DoPutPreparedStatementResult", prepared_statement_handle=bound.handle())
            writer.write(pa.py_buffer(result.SerializeToString()))
        except HistoryError as exc:
            raise flight_error(exc, self._roots) from None
        except Exception as exc:  # a bug: typed, without the server's stack trace
            raise self._internal(exc) from None

    def do_action(self, context: flight.ServerCallContext, action: flight.Action) -> Iterator[Any]:
        if action.type == FETCH_ROW_ACTION:
            return iter([self._fetch_row_action(context, action.body.to_pybytes() if action.body is not None else b"")])
        try:
            if action.type not in _ACTIONS:
                raise InvalidRequestError(
                    f"DoAction {action.type!r} is not offered; offered: {', '.join(_ACTIONS)}"
                )
            command = fsql.unpack(action.body.to_pybytes() if action.body is not None else b"")
            if action.type == "ClosePreparedStatement":
                return iter(())
            if command is None or fsql.name_of(command) != "ActionCreatePreparedStatementRequest":
                raise InvalidRequestError("CreatePreparedStatement takes an ActionCreatePreparedStatementRequest")
            fsql.split_as_of(command.query)  # a malformed SET as_of is refused at once
            # the handle is the statement's text: a prepared statement holds nothing on the server
            result = fsql.message("ActionCreatePreparedStatementResult",
                                  prepared_statement_handle=fsql.Prepared(command.query).handle())
            return iter([fsql.pack(result)])
        except HistoryError as exc:
            raise flight_error(exc, self._roots) from None
        except Exception as exc:  # a bug: typed, without the server's stack trace
            raise self._internal(exc) from None

    def list_actions(self, context: Any) -> list[tuple[str, str]]:
        return list(_ACTIONS.items())

    def _as_of(self, tenant: Tenant, as_of: str | None, context: Any) -> int:
        """The timestamp a statement runs as of: the one given, else the newest answerable state."""
        if as_of is not None:
            return to_timestamp(as_of)
        status = pa.ipc.open_stream(self._run_request(tenant, StatusRequest(), context)).read_all()
        frontier, _ = status_from_arrow(status)
        return frontier + 1

    def _keep_answer(self, tenant: Tenant, answer: pa.Buffer) -> bytes:
        """Keep an answer for its DoGet; answers never fetched are dropped after a while."""
        handle = secrets.token_bytes(16)
        now = time.monotonic()
        self.drop_stale_answers(now)
        with self._lock:
            self._answers[handle] = _Answer(tenant.name, answer, now)
        return handle

    def drop_stale_answers(self, now: float | None = None) -> None:
        """Drop the Flight SQL answers no DoGet fetched within their time (``now``: monotonic seconds)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            for stale in [h for h, a in self._answers.items() if now - a.made > _ANSWER_TTL_S]:
                del self._answers[stale]

    def _take_answer(self, tenant: Tenant, command: Any) -> pa.Buffer:
        """The kept answer a Flight SQL ticket names, once, and only to its own tenant."""
        if fsql.name_of(command) != "TicketStatementQuery":
            raise InvalidRequestError(f"a DoGet ticket carries a TicketStatementQuery, not {fsql.name_of(command)}")
        with self._lock:
            kept = self._answers.get(command.statement_handle)
            if kept is None or kept.tenant != tenant.name:  # another tenant's handle: as if unknown
                raise InvalidRequestError(
                    "unknown or already fetched statement handle: run the statement again (GetFlightInfo)"
                )
            del self._answers[command.statement_handle]
        return kept.payload

    def _internal(self, exc: Exception) -> flight.FlightError:
        """A bug's exception as a typed ServiceError, without the server's stack trace or paths."""
        return flight_error(ServiceError(f"internal error ({type(exc).__name__}): {exc}"), self._roots)

    # Flight's other calls: the middleware refuses them before they get here; these stay as a
    # second line (pyarrow's defaults answer with a Python stack trace of the server)
    def list_flights(self, context: Any, criteria: Any) -> Iterator[flight.FlightInfo]:
        raise flight_error(not_offered("ListFlights"))

    def get_schema(self, context: Any, descriptor: Any) -> flight.SchemaResult:
        raise flight_error(not_offered("GetSchema"))

    def do_exchange(self, context: Any, descriptor: Any, reader: Any, writer: Any) -> None:
        raise flight_error(not_offered("DoExchange"))

    def _stream(self, reader: pa.ipc.RecordBatchStreamReader, logged: _Logged) -> Iterator[pa.RecordBatch]:
        # counted from the first batch pulled; a client that goes away closes the generator
        # (GeneratorExit), which releases the answer's buffers with it
        with self._lock:
            self._open += 1
        finished = False
        rows = 0
        error: str | None = "abandoned"
        try:
            try:
                for batch in reader:
                    rows += batch.num_rows
                    yield batch
            except Exception as exc:  # an answer that cannot be read back (a bug): typed, no stack trace
                error = type(exc).__name__
                raise self._internal(exc) from None
            finished = True
            error = None
        finally:
            self._record(logged.tenant, logged.call, logged.started, rows, logged.size, error)
            with self._lock:
                self._open -= 1
                if finished:
                    self._finished += 1
                else:
                    self._abandoned += 1
            reader.close()

    def close(self) -> None:
        """Stop listening and stop the worker processes."""
        try:
            self.shutdown()
        finally:
            self._pool.close()

    def __enter__(self) -> HistoryServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
