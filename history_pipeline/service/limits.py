"""The server's limits and the per-tenant count of running queries. Pure pieces.

Every limit refuses with its own error: a result over ``max_result_rows`` / ``max_result_bytes``
(ResultTooLargeError), a query running past ``query_timeout_s`` (QueryTimeoutError, the query is
cancelled), a tenant's query beyond ``max_concurrent_queries`` (ConcurrencyLimitError).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from types import MappingProxyType
from typing import Any

import pyarrow as pa

from history_pipeline.service.errors import ConcurrencyLimitError, ResultTooLargeError


@dataclass(frozen=True)
class Limits:
    """What one query of one tenant may use."""

    max_result_rows: int = 5_000_000
    max_result_bytes: int = 512 * 1024 * 1024
    query_timeout_s: float = 60.0
    max_concurrent_queries: int = 4

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):  # ("x" <= 0: a TypeError)
                raise ValueError(f"limit {f.name} must be a number, got {value!r}")
            if value <= 0:
                raise ValueError(f"limit {f.name} must be positive, got {getattr(self, f.name)!r}")

    def with_overrides(self, overrides: Mapping[str, Any]) -> Limits:
        """These limits with some fields replaced (a tenant's own limits)."""
        known = {f.name for f in fields(self)}
        if not isinstance(overrides, Mapping):
            raise ValueError(f"limits are a table of {sorted(known)}, not {overrides!r}")
        unknown = set(overrides) - known
        if unknown:
            raise ValueError(f"unknown limits {sorted(unknown)}; known: {sorted(known)}")
        return replace(self, **overrides)


def check_result_size(table: pa.Table, limits: Limits, what: str) -> None:
    """Refuse a result larger than the limits allow (before any of it is sent)."""
    if table.num_rows > limits.max_result_rows:
        raise ResultTooLargeError(
            f"{what} has {table.num_rows:,} rows, over this server's limit of {limits.max_result_rows:,}; "
            "ask for less (sql() with WHERE, LIMIT or an aggregate)"
        )
    size = table.get_total_buffer_size()
    if size > limits.max_result_bytes:
        raise ResultTooLargeError(
            f"{what} is {size:,} bytes, over this server's limit of {limits.max_result_bytes:,}; "
            "ask for less (sql() with WHERE, LIMIT, fewer columns or an aggregate)"
        )


def admit(running: Mapping[str, int], tenant: str, limit: int) -> Mapping[str, int]:
    """The running counts with one more query of ``tenant`` (ConcurrencyLimitError at the limit)."""
    now = running.get(tenant, 0)
    if now >= limit:
        raise ConcurrencyLimitError(
            f"tenant {tenant!r} already runs {now} quer{'y' if now == 1 else 'ies'}, the most this server "
            "allows at once; "
            "retry when one has finished"
        )
    return MappingProxyType({**running, tenant: now + 1})


def release(running: Mapping[str, int], tenant: str) -> Mapping[str, int]:
    """The running counts with one query of ``tenant`` finished."""
    now = running.get(tenant, 0)
    rest = {k: v for k, v in running.items() if k != tenant}
    if now > 1:
        rest[tenant] = now - 1
    return MappingProxyType(rest)


class ConcurrencyGate:
    """Holds the running counts; swaps them under a lock (the transitions are admit/release)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: Mapping[str, int] = MappingProxyType({})

    @property
    def running(self) -> Mapping[str, int]:
        """Queries running now, per tenant."""
        return self._running

    @contextmanager
    def slot(self, tenant: str, limit: int) -> Iterator[None]:
        """Hold one of the tenant's query slots for the duration of the block."""
        with self._lock:
            self._running = admit(self._running, tenant, limit)
        try:
            yield
        finally:
            with self._lock:
                self._running = release(self._running, tenant)
