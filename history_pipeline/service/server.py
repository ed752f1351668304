"""The HistoryService over Arrow Flight.

Every operation is a ``do_get``: the ticket is a request message (``protocol.py``), the answer
an Arrow stream. A request is authenticated by its bearer token (middleware), which fixes the
tenant and so the only database it can read; it then takes one of the tenant's query slots,
runs on a worker process under the time limit, and its answer is streamed in record batches.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
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
    error_payload,
)
from history_pipeline.service.limits import ConcurrencyGate
from history_pipeline.service.protocol import OPERATIONS, decode_request
from history_pipeline.service.workers import Job, WorkerPool


class _TenantMiddleware(flight.ServerMiddleware):
    """Carries the authenticated tenant of one call."""

    def __init__(self, tenant: Tenant):
        self.tenant = tenant


class _BearerAuth(flight.ServerMiddlewareFactory):
    """Authenticates every call by its ``authorization: Bearer <token>`` header."""

    def __init__(self, directory: TenantDirectory):
        self.directory = directory

    def start_call(self, info: Any, headers: Mapping[str, list[str]]) -> _TenantMiddleware:
        values = headers.get("authorization") or []
        try:
            return _TenantMiddleware(self.directory.authenticate(values[0] if values else None))
        except AuthenticationError as exc:
            raise flight.FlightUnauthenticatedError(str(exc), extra_info=error_payload(exc)) from None


def flight_error(exc: HistoryError) -> flight.FlightError:
    """The Flight error that carries a HistoryError to the client."""
    kind: type[flight.FlightError] = flight.FlightServerError
    if isinstance(exc, AuthenticationError):
        kind = flight.FlightUnauthenticatedError
    elif isinstance(exc, QueryTimeoutError):
        kind = flight.FlightTimedOutError
    elif isinstance(exc, ConcurrencyLimitError):
        kind = flight.FlightUnavailableError
    return kind(str(exc), extra_info=error_payload(exc))


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


class HistoryServer(flight.FlightServerBase):
    """The HistoryService for the tenants of one configuration; listens once constructed."""

    def __init__(self, config: ServerConfig):
        self.config = config
        self._gate = ConcurrencyGate()
        self._pool = WorkerPool(config.workers)
        self._lock = threading.Lock()
        self._open = self._finished = self._abandoned = 0
        tls = []
        if config.tls_cert is not None and config.tls_key is not None:
            tls = [flight.CertKeyPair(cert=config.tls_cert, key=config.tls_key)]
        try:
            super().__init__(
                f"{config.scheme}://{config.host}:{config.port}",
                tls_certificates=tls,
                middleware={"auth": _BearerAuth(TenantDirectory.of(config.tenants))},
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
        try:
            decode_request(ticket.ticket)  # a malformed request costs no slot and no worker
            limits = self.config.limits_of(tenant)
            with self._gate.slot(tenant.name, limits.max_concurrent_queries):
                job = Job(self.config.root, tenant.database, ticket.ticket, limits, self.config.batch_rows)
                answer = self._pool.run(job, cancelled=context.is_cancelled)
        except HistoryError as exc:
            raise flight_error(exc) from None
        except Exception as exc:  # a bug: a typed ServiceError for the client, not the server's stack trace
            raise flight.FlightServerError(str(exc), extra_info=error_payload(exc)) from None
        reader = pa.ipc.open_stream(answer)
        return flight.GeneratorStream(reader.schema, self._stream(reader))

    # Flight's other calls: refused as invalid requests (pyarrow's defaults answer with a Python
    # stack trace of the server)
    def _only_do_get(self, call: str) -> flight.FlightError:
        return flight_error(InvalidRequestError(
            f"{call} is not offered: this service answers do_get tickets only ({', '.join(OPERATIONS)})"))

    def list_flights(self, context: Any, criteria: Any) -> Iterator[flight.FlightInfo]:
        raise self._only_do_get("list_flights")

    def get_flight_info(self, context: Any, descriptor: Any) -> flight.FlightInfo:
        raise self._only_do_get("get_flight_info")

    def get_schema(self, context: Any, descriptor: Any) -> flight.SchemaResult:
        raise self._only_do_get("get_schema")

    def do_put(self, context: Any, descriptor: Any, reader: Any, writer: Any) -> None:
        raise self._only_do_get("do_put")

    def do_exchange(self, context: Any, descriptor: Any, reader: Any, writer: Any) -> None:
        raise self._only_do_get("do_exchange")

    def list_actions(self, context: Any) -> list[Any]:
        raise self._only_do_get("list_actions")

    def do_action(self, context: Any, action: Any) -> Iterator[Any]:
        raise self._only_do_get("do_action")

    def _stream(self, reader: pa.ipc.RecordBatchStreamReader) -> Iterator[pa.RecordBatch]:
        # counted from the first batch pulled; a client that goes away closes the generator
        # (GeneratorExit), which releases the answer's buffers with it
        with self._lock:
            self._open += 1
        finished = False
        try:
            yield from reader
            finished = True
        finally:
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
