"""A pool of worker processes that answer requests, so that a query can really be cancelled.

A query runs Python (reconstruction) and DuckDB code that a thread cannot be stopped in; a
process can. Each request takes an idle worker, sends it the ticket and waits for the Arrow IPC
answer. When the query exceeds its time limit, or the client has gone away, the worker is killed
(freeing its memory, DuckDB connections and file handles with it) and a fresh one takes its
place. Workers cache one HistoryStore per database; they never hold state between requests.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import pyarrow as pa

from history_pipeline.service.errors import (
    ConcurrencyLimitError,
    QueryTimeoutError,
    ServiceError,
    ServiceUnavailableError,
    error_from_payload,
    error_payload,
)
from history_pipeline.service.limits import Limits

#: how long a freshly started worker may take to import its libraries
_STARTUP_TIMEOUT_S = 120.0
#: how often a waiting request checks whether its client is still there
_CANCEL_POLL_S = 0.05


@dataclass(frozen=True)
class Job:
    """One request for a worker: where the tenant's history lives and the request ticket."""

    root: str
    database: str
    ticket: bytes
    limits: Limits
    batch_rows: int


def worker_main(conn: Connection) -> None:
    """The worker process: answer jobs from ``conn`` until it closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server decides when workers stop
    from history_pipeline.service.execute import execute
    from history_pipeline.service.protocol import decode_request
    from history_pipeline.store import HistoryStore

    stores: dict[tuple[str, str], HistoryStore] = {}
    conn.send(("ready", os.getpid()))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message[0] == "stop":
            return
        job: Job = message[1]
        try:
            store = stores.get((job.root, job.database))
            if store is None:
                store = stores[(job.root, job.database)] = HistoryStore.open(job.root, database=job.database)
            table = execute(store, decode_request(job.ticket), job.limits)
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table, max_chunksize=job.batch_rows)
            payload = sink.getvalue()
        except Exception as exc:  # every failure goes back to the request, typed
            conn.send(("error", error_payload(exc)))
            continue
        conn.send(("ok", payload.size))
        conn.send_bytes(payload)


@dataclass
class _Worker:
    process: Any
    conn: Connection
    ready: bool = False


class WorkerPool:
    """``size`` worker processes; :meth:`run` answers one job on an idle one."""

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"a worker pool needs at least one worker, got {size}")
        self.size = size
        self._context = multiprocessing.get_context("spawn")
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._lock = threading.Lock()
        self._busy = 0
        self._closed = False
        self._workers: list[_Worker] = []
        #: workers killed and replaced (timeouts, clients gone, crashes)
        self.replaced = 0
        for _ in range(size):
            self._idle.put(self._spawn())

    def _spawn(self) -> _Worker:
        parent, child = self._context.Pipe()
        process = self._context.Process(target=worker_main, args=(child,), daemon=True, name="history-worker")
        process.start()
        child.close()
        worker = _Worker(process, parent)
        with self._lock:
            self._workers.append(worker)
        return worker

    @property
    def busy(self) -> int:
        """Workers answering a job now."""
        return self._busy

    def pids(self) -> dict[str, list[int]]:
        """Process ids of the workers, idle and busy."""
        with self._lock:
            every = [w.process.pid for w in self._workers]
        idle = {w.process.pid for w in list(self._idle.queue)}
        return {"idle": sorted(p for p in every if p in idle), "busy": sorted(p for p in every if p not in idle)}

    def run(self, job: Job, cancelled: Callable[[], bool] = lambda: False) -> pa.Buffer:
        """The Arrow IPC answer to ``job``; kills the worker when the time limit passes or ``cancelled()``."""
        timeout = job.limits.query_timeout_s
        worker = self._acquire(timeout)
        try:
            self._await_ready(worker)
            worker.conn.send(("run", job))
            deadline = time.monotonic() + timeout
            while not worker.conn.poll(max(0.0, min(_CANCEL_POLL_S, deadline - time.monotonic()))):
                if cancelled():
                    worker = self._replace(worker)
                    raise ServiceUnavailableError("the client went away; its query was cancelled")
                if time.monotonic() >= deadline:
                    worker = self._replace(worker)
                    raise QueryTimeoutError(
                        f"the query ran longer than this server's limit of {timeout:g} s and was cancelled; "
                        "narrow it (WHERE, LIMIT, fewer tables) or ask the operator for a longer query_timeout_s"
                    )
            status = worker.conn.recv()
            if status[0] == "error":
                raise error_from_payload(status[1], ServiceError, "the query failed")
            return pa.py_buffer(worker.conn.recv_bytes())
        except (EOFError, OSError) as exc:
            code = worker.process.exitcode
            worker = self._replace(worker)
            raise ServiceError(f"a worker process died while answering (exit code {code}): {exc}") from None
        finally:
            self._release(worker)

    def _acquire(self, timeout: float) -> _Worker:
        if self._closed:
            raise ServiceUnavailableError("the server is shutting down")
        try:
            worker = self._idle.get(timeout=timeout)
        except queue.Empty:
            raise ConcurrencyLimitError(
                f"all {self.size} workers of the server stayed busy for {timeout:g} s; retry later"
            ) from None
        with self._lock:
            self._busy += 1
        if not worker.process.is_alive():  # died while idle (killed from outside): start afresh
            worker = self._replace(worker)
        return worker

    def _release(self, worker: _Worker) -> None:
        with self._lock:
            self._busy -= 1
        if self._closed:
            self._stop(worker)
        else:
            self._idle.put(worker)

    def _await_ready(self, worker: _Worker) -> None:
        if worker.ready:
            return
        if not worker.conn.poll(_STARTUP_TIMEOUT_S):
            raise ServiceError(f"a worker process did not start within {_STARTUP_TIMEOUT_S:g} s")
        message = worker.conn.recv()
        if message[0] != "ready":
            raise ServiceError(f"a worker process started with an unexpected message {message[0]!r}")
        worker.ready = True

    def _replace(self, worker: _Worker) -> _Worker:
        """Kill a worker (its query with it) and start a fresh one in its place."""
        worker.process.kill()
        worker.process.join(10)
        worker.conn.close()
        with self._lock:
            self.replaced += 1
            self._workers.remove(worker)
        return self._spawn()

    def _stop(self, worker: _Worker) -> None:
        with self._lock:
            self._workers.remove(worker)
        try:
            worker.conn.send(("stop",))
        except OSError:
            pass
        worker.process.join(5)
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join(5)
        worker.conn.close()

    def close(self) -> None:
        """Stop every idle worker now, and each busy one as soon as its job ends."""
        self._closed = True
        while True:
            try:
                worker = self._idle.get_nowait()
            except queue.Empty:
                return
            self._stop(worker)
