"""The thin client: HistoryStore's query methods, answered by a HistoryService over the network.

    from history_pipeline.client import connect

    with connect("grpc+tls://history.internal:8815", token, tls_root_certs=ca_pem) as history:
        before = history.fetch_row("orders", 42, as_of=event_t)     # the pre-image of event_t

Values come back equal to the local API's (Decimal, UUID, datetime, JSONB, Interval, ...), and a
refused or failed request raises the same ``HistoryError`` subclass the server met.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from history_pipeline.errors import HistoryError
from history_pipeline.lsn import to_timestamp
from history_pipeline.schema import TableDescriptor
from history_pipeline.service import protocol as p
from history_pipeline.service.errors import (
    AuthenticationError,
    QueryTimeoutError,
    ServiceError,
    ServiceUnavailableError,
    error_from_payload,
)

_FALLBACK: list[tuple[type[flight.FlightError], type[HistoryError]]] = [
    (flight.FlightUnauthenticatedError, AuthenticationError),
    (flight.FlightTimedOutError, QueryTimeoutError),
    (flight.FlightUnavailableError, ServiceUnavailableError),
]


def _as_history_error(exc: flight.FlightError) -> HistoryError:
    """The HistoryError a Flight error carries (or the one its kind means when it carries none)."""
    fallback: type[HistoryError] = ServiceError
    for kind, error in _FALLBACK:
        if isinstance(exc, kind):
            fallback = error
            break
    # Flight appends gRPC debug context to the message; the first line is the server's own text
    message = str(exc).split(". Detail:")[0]
    return error_from_payload(getattr(exc, "extra_info", None), fallback, message)


class HistoryClient:
    """A connection to a HistoryService; the same query methods as ``HistoryStore``. Thread-safe."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        tls_root_certs: bytes | None = None,
        timeout: float | None = None,
        grpc_options: Sequence[tuple[str, str | int]] = (),
    ):
        if "://" not in url:  # host:port alone means plain gRPC
            url = f"grpc://{url}"
        kwargs: dict[str, Any] = {}
        if tls_root_certs is not None:
            kwargs["tls_root_certs"] = tls_root_certs
        if grpc_options:
            kwargs["generic_options"] = list(grpc_options)
        self.url = url
        self._client = flight.FlightClient(url, **kwargs)
        self._options = flight.FlightCallOptions(
            headers=[(b"authorization", b"Bearer " + token.encode("utf-8"))], timeout=timeout
        )

    # --- the service's messages --------------------------------------------------------

    def call(self, request: p.Request) -> pa.Table:
        """Send one request message; its answer as an Arrow table (all batches read)."""
        try:
            return self._client.do_get(flight.Ticket(p.encode_request(request)), self._options).read_all()
        except flight.FlightError as exc:
            raise _as_history_error(exc) from None

    def stream(self, request: p.Request) -> flight.FlightStreamReader:
        """Send one request message; a reader of its record batches as they arrive.

        Errors the server finds before answering raise here already; ``reader.cancel()`` stops
        the stream early (the server frees what it held for it).
        """
        try:
            reader = self._client.do_get(flight.Ticket(p.encode_request(request)), self._options)
            reader.schema  # noqa: B018  (waits for the first message: refusals raise now)
            return reader
        except flight.FlightError as exc:
            raise _as_history_error(exc) from None

    def fetch_row_response(self, request: p.FetchRowRequest) -> p.FetchRowResponse:
        """FetchRow: one row as of T, or None. Sent as a DoAction (one round trip, the answer in its
        one result) rather than as a DoGet ticket, which streams the schema and the row apart."""
        try:
            results = list(self._client.do_action(flight.Action(p.FETCH_ROW_ACTION, p.encode_request(request)),
                                                  self._options))
        except flight.FlightError as exc:
            raise _as_history_error(exc) from None
        if len(results) != 1:
            raise ServiceError(f"a FetchRow answer is one result, got {len(results)}: is the server of this version?")
        return p.fetch_row_from_stream(results[0].body)

    def load_table_response(self, request: p.LoadTableRequest) -> p.LoadTableResponse:
        """LoadTable: a whole table as of T."""
        return p.load_table_from_arrow(self.call(request))

    def get_catalog_response(self, request: p.GetCatalogRequest) -> p.GetCatalogResponse:
        """GetCatalog: the table descriptors as of T."""
        return p.catalog_from_arrow(self.call(request))

    # --- HistoryStore's query side ----------------------------------------------------------

    def load_table(self, table: str, as_of: int | str, ordered: bool = False) -> pa.Table:
        """The table as of ``as_of``: synthetic_key then its columns in order, named as then; rows in
        no promised order (as the store answers it), or in key order with ``ordered=True``."""
        return self.load_table_response(p.LoadTableRequest(table, to_timestamp(as_of), ordered)).table

    def fetch_row(self, table: str, key: int, as_of: int | str) -> dict[str, Any] | None:
        """One row as of ``as_of`` as {column name: value}, or None."""
        return self.fetch_row_response(p.FetchRowRequest(table, key, to_timestamp(as_of))).as_row()

    def get_catalog(self, as_of: int | str | None = None) -> tuple[TableDescriptor, ...]:
        """The table descriptors in force as of ``as_of`` (omitted: the newest state, frontier + 1)."""
        as_of = self.frontier + 1 if as_of is None else to_timestamp(as_of)
        return self.get_catalog_response(p.GetCatalogRequest(as_of)).table_descriptors

    def sql(self, query: str, as_of: int | str) -> pa.Table:
        """Read-only SQL against the database as of ``as_of`` (the server's sandbox)."""
        return self.call(p.SqlRequest(query, to_timestamp(as_of)))

    def row_history(self, table: str, key: int) -> list[dict[str, Any]]:
        """Every retained version of a key: logical_timestamp, is_deleted, values."""
        return p.row_history_from_arrow(self.call(p.RowHistoryRequest(table, key)))

    def diff(self, table: str, from_: int | str, to: int | str) -> dict[str, list[dict[str, Any]]]:
        """Keys inserted, deleted and changed between two states."""
        return p.diff_from_arrow(self.call(p.DiffRequest(table, to_timestamp(from_), to_timestamp(to))))

    def diff_reader(self, table: str, from_: int | str, to: int | str) -> pa.RecordBatchReader:
        """``diff`` as the record batches of ``HistoryStore.diff_reader`` (kind, key, before, after),
        read as they arrive."""
        return self.stream(p.DiffRequest(table, to_timestamp(from_), to_timestamp(to), True)).to_reader()

    def changes(self, tables: Sequence[str] | None = None, since: int | str = 0,
                until: int | str | None = None) -> list[dict[str, Any]]:
        """Every committed change with t in [since, until), in (t, table, key) order, one dict each:
        t, table, table_uuid, key, op, before, after and the cursor to resume from after it."""
        wanted = None if tables is None else (tables,) if isinstance(tables, str) else tuple(tables)
        end = None if until is None else to_timestamp(until)
        return p.changes_from_arrow(self.call(p.ChangesRequest(to_timestamp(since), end, wanted)))

    @property
    def frontier(self) -> int:
        """The largest t closed by a compacted segment of the tenant's database."""
        return p.status_from_arrow(self.call(p.StatusRequest()))[0]

    @property
    def earliest(self) -> int:
        """The smallest answerable as_of of the tenant's database."""
        return p.status_from_arrow(self.call(p.StatusRequest()))[1]

    # --- lifetime ------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection."""
        self._client.close()

    def __enter__(self) -> HistoryClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"HistoryClient({self.url!r})"


def connect(
    url: str,
    token: str,
    *,
    tls_root_certs: bytes | str | Path | None = None,
    timeout: float | None = None,
    grpc_options: Sequence[tuple[str, str | int]] = (),
) -> HistoryClient:
    """A client of the HistoryService at ``url`` (``grpc://host:port`` or ``grpc+tls://host:port``).

    ``token`` is the tenant's bearer token; ``tls_root_certs`` the PEM (bytes, or a file path) of
    the certificate authority to trust when the server's certificate is not publicly trusted;
    ``timeout`` bounds each call in seconds; ``grpc_options`` are gRPC channel arguments
    (for instance ``("grpc.max_receive_message_length", n)``).
    """
    if isinstance(tls_root_certs, (str, Path)):
        tls_root_certs = Path(tls_root_certs).read_bytes()
    return HistoryClient(url, token, tls_root_certs=tls_root_certs, timeout=timeout, grpc_options=grpc_options)
