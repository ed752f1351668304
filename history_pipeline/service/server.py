"""The HistoryService over Arrow Flight.

Every operation is a ``do_get``: the ticket is a request message (``protocol.py``), the answer
an Arrow stream. A request is authenticated by its bearer token (middleware), which fixes the
tenant and so the only database it can read; it then takes one of the tenant's query slots,
runs on a worker process under the time limit, and its answer is streamed in record batches.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from history_pipeline.errors import HistoryError
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
from history_pipeline.service.limits import ConcurrencyGate
from history_pipeline.service.protocol import OPERATIONS, decode_request, operation
from history_pipeline.service.workers import Job, WorkerPool


class _TenantMiddleware(flight.ServerMiddleware):
    """Carries the authenticated tenant of one call."""

    def __init__(self, tenant: Tenant):
        self.tenant = tenant


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
        f"{call} is not offered: this service answers DoGet only, with a ticket naming one of "
        f"{', '.join(OPERATIONS)} (history_pipeline.client.connect(url, token) sends them)"
    )


class _BearerAuth(flight.ServerMiddlewareFactory):
    """Authenticates every call by its ``authorization: Bearer <token>`` header, and refuses every
    call but DoGet here, before pyarrow runs a handler: some of its handlers (GetSchema) turn any
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
        if info.method != flight.FlightMethod.DO_GET:
            error = not_offered(call)
            self.refused(tenant.name, call, type(error).__name__)
            raise flight_error(error)
        return _TenantMiddleware(tenant)


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
                self._pool.replaced, self._pool.pids(),
            )

    def do_get(self, context: flight.ServerCallContext, ticket: flight.Ticket) -> flight.FlightDataStream:
        tenant: Tenant = context.get_middleware("auth").tenant
        started = time.monotonic()
        call = "DoGet"
        try:
            call = operation(decode_request(ticket.ticket))  # a malformed request costs no slot and no worker
            limits = self.config.limits_of(tenant)
            with self._gate.slot(tenant.name, limits.max_concurrent_queries):
                job = Job(self.config.root, tenant.database, ticket.ticket, limits, self.config.batch_rows)
                answer = self._pool.run(job, cancelled=context.is_cancelled)
            reader = pa.ipc.open_stream(answer)
        except HistoryError as exc:
            self._record(tenant.name, call, started, error=type(exc).__name__)
            raise flight_error(exc, self._roots) from None
        except Exception as exc:  # a bug: a typed ServiceError for the client, not the server's stack trace
            self._record(tenant.name, call, started, error=type(exc).__name__)
            raise self._internal(exc) from None
        logged = _Logged(tenant.name, call, started, answer.size)
        return flight.GeneratorStream(reader.schema, self._stream(reader, logged))

    def _record(self, tenant: str, call: str, started: float, rows: int = 0, size: int = 0,
                error: str | None = None) -> None:
        if self._log is not None:
            ms = (time.monotonic() - started) * 1000
            self._log(request_line(RequestRecord(datetime.now(UTC), tenant, call, ms, rows, size, error)))

    def _internal(self, exc: Exception) -> flight.FlightError:
        """A bug's exception as a typed ServiceError, without the server's stack trace or paths."""
        return flight_error(ServiceError(f"internal error ({type(exc).__name__}): {exc}"), self._roots)

    # Flight's other calls: the middleware refuses them before they get here; these stay as a
    # second line (pyarrow's defaults answer with a Python stack trace of the server)
    def list_flights(self, context: Any, criteria: Any) -> Iterator[flight.FlightInfo]:
        raise flight_error(not_offered("ListFlights"))

    def get_flight_info(self, context: Any, descriptor: Any) -> flight.FlightInfo:
        raise flight_error(not_offered("GetFlightInfo"))

    def get_schema(self, context: Any, descriptor: Any) -> flight.SchemaResult:
        raise flight_error(not_offered("GetSchema"))

    def do_put(self, context: Any, descriptor: Any, reader: Any, writer: Any) -> None:
        raise flight_error(not_offered("DoPut"))

    def do_exchange(self, context: Any, descriptor: Any, reader: Any, writer: Any) -> None:
        raise flight_error(not_offered("DoExchange"))

    def list_actions(self, context: Any) -> list[Any]:
        raise flight_error(not_offered("ListActions"))

    def do_action(self, context: Any, action: Any) -> Iterator[Any]:
        raise flight_error(not_offered("DoAction"))

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
