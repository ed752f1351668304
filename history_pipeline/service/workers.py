"""A pool of worker processes that answer requests, so that a query can really be cancelled.

A query runs Python (reconstruction) and DuckDB code that a thread cannot be stopped in; a
process can. Each request takes an idle worker, sends it the ticket and waits for the Arrow IPC
answer. When the query exceeds its time limit, or the client has gone away, the worker is killed
(freeing its memory, DuckDB connections and file handles with it) and a fresh one takes its
place. Between requests a worker keeps only one open HistoryStore per database (whose catalog
log it re-reads on every query, so new compactions are seen at once) and the footers it read.
Point lookups (FetchRow) do not come here: the server answers them on its own threads, where
their key indexes stay warm (``HistoryServer._lookup``).

A worker dies with its server, however the server ends (even SIGKILL, which runs no cleanup): on
Linux the kernel sends it SIGKILL when the server goes (``PR_SET_PDEATHSIG``), and everywhere a
thread of the worker waits on a pipe only the server holds open, and ends the process when it
closes. Every process start goes through one long-lived thread of the server, because Linux sends
the parent-death signal when the *thread* that started the child ends, not only the process.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
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


#: prctl(2) option: the signal the kernel sends this process when its parent thread ends
_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int, lifeline: Connection) -> None:
    """End this process as soon as the process ``parent_pid`` is gone, whatever ended it.

    On Linux the kernel kills it (``PR_SET_PDEATHSIG``); everywhere a daemon thread waits on
    ``lifeline``, a pipe whose other end only the parent holds, and exits when it closes.
    """
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before the signal was asked for
        os._exit(1)

    def watch() -> None:
        try:
            lifeline.recv_bytes()  # the parent never sends: this returns only by EOF
        except (EOFError, OSError):
            pass
        os._exit(1)  # no cleanup: the main thread may be deep in a query

    threading.Thread(target=watch, name="history-worker-lifeline", daemon=True).start()


def worker_main(conn: Connection, parent_pid: int | None = None, lifeline: Connection | None = None) -> None:
    """The worker process: answer jobs from ``conn`` until it closes; dies with ``parent_pid``."""
    if parent_pid is not None and lifeline is not None:
        die_with_parent(parent_pid, lifeline)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server decides when workers stop
    from history_pipeline.service.execute import answer_bytes, execute
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
        conn.send(("started",))
        try:
            store = stores.get((job.root, job.database))
            if store is None:
                store = stores[(job.root, job.database)] = HistoryStore.open(job.root, database=job.database)
            payload = answer_bytes(execute(store, decode_request(job.ticket), job.limits), job.batch_rows)
        except Exception as exc:  # every failure goes back to the request, typed
            conn.send(("error", error_payload(exc)))
            continue
        conn.send(("ok", payload.size))
        conn.send_bytes(payload)


@dataclass(eq=False)
class _Worker:
    """One worker slot: its current process (restarted in place) and the pipe to it."""

    process: Any
    conn: Connection
    #: the server's end of the pipe whose closing tells the worker that its server is gone
    lifeline: Connection
    ready: bool = False
    #: the process has taken a job and is answering it
    answering: bool = False


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
        #: workers killed and restarted (timeouts, clients gone, crashes)
        self.replaced = 0
        for _ in range(size):
            parent, process, lifeline = self._start_process()
            worker = _Worker(process, parent, lifeline)
            self._workers.append(worker)
            self._idle.put(worker)

    def _start_process(self) -> tuple[Connection, Any, Connection]:
        """A fresh worker process, its pipe and the server's end of its lifeline."""
        return _spawner().submit(self._start_here).result()

    def _start_here(self) -> tuple[Connection, Any, Connection]:
        parent, child = self._context.Pipe()
        watched, held = self._context.Pipe(duplex=False)
        process = self._context.Process(
            target=worker_main, args=(child, os.getpid(), watched), daemon=True, name="history-worker"
        )
        process.start()
        child.close()
        watched.close()
        return parent, process, held

    @property
    def busy(self) -> int:
        """Workers answering a job now."""
        return self._busy

    def pids(self) -> dict[str, list[int]]:
        """Process ids of the workers: idle, busy (taken by a request) and answering (running its job)."""
        idle = {id(w) for w in list(self._idle.queue)}
        with self._lock:
            return {
                "idle": sorted(w.process.pid for w in self._workers if id(w) in idle),
                "busy": sorted(w.process.pid for w in self._workers if id(w) not in idle),
                "answering": sorted(w.process.pid for w in self._workers if w.answering),
            }

    def run(self, job: Job, cancelled: Callable[[], bool] = lambda: False) -> pa.Buffer:
        """The Arrow IPC answer to ``job``; kills the worker when the time limit passes or ``cancelled()``."""
        timeout = job.limits.query_timeout_s
        worker = self._acquire(timeout)
        try:
            self._hand_over(worker, job)
            # the query's time starts when a worker has taken it (not while a fresh worker starts)
            deadline = time.monotonic() + timeout
            status = self._next_message(worker, deadline, cancelled, timeout)
            if status[0] == "error":
                raise error_from_payload(status[1], ServiceError, "the query failed")
            return pa.py_buffer(worker.conn.recv_bytes())
        except (EOFError, OSError) as exc:
            code = worker.process.exitcode
            self._restart(worker)
            raise ServiceError(f"a worker process died while answering (exit code {code}): {exc}") from None
        finally:
            self._release(worker)

    def _hand_over(self, worker: _Worker, job: Job) -> None:
        """Give the job to the worker; a worker found dead before it took the job is restarted first.

        The job has not run then, so running it on the fresh process is safe (and queries are
        read-only anyway); a worker that dies after taking a job fails that job instead.
        """
        for attempt in (1, 2):
            try:
                self._await_ready(worker)
                worker.conn.send(("run", job))
                if worker.conn.poll(_STARTUP_TIMEOUT_S) and worker.conn.recv()[0] == "started":
                    worker.answering = True
                    return
                self._restart(worker)  # stuck, or out of step with its pipe
                raise ServiceError("a worker process did not take its job; it was restarted, retry")
            except (EOFError, OSError):
                self._restart(worker)
                if attempt == 2:
                    raise ServiceError("worker processes die on start: see the server's log") from None

    def _next_message(
        self, worker: _Worker, deadline: float, cancelled: Callable[[], bool], timeout: float
    ) -> tuple[Any, ...]:
        while not worker.conn.poll(max(0.0, min(_CANCEL_POLL_S, deadline - time.monotonic()))):
            if cancelled():
                self._restart(worker)
                raise ServiceUnavailableError("the client went away; its query was cancelled")
            if time.monotonic() >= deadline:
                self._restart(worker)
                raise QueryTimeoutError(
                    f"the query ran longer than this server's limit of {timeout:g} s and was cancelled; "
                    "narrow it (WHERE, LIMIT, fewer tables) or ask the operator for a longer query_timeout_s"
                )
        return worker.conn.recv()

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
        return worker

    def _release(self, worker: _Worker) -> None:
        with self._lock:
            self._busy -= 1
            worker.answering = False
        if self._closed:
            self._stop(worker)
        else:
            self._idle.put(worker)

    def _await_ready(self, worker: _Worker) -> None:
        if worker.ready:
            return
        if worker.conn.poll(_STARTUP_TIMEOUT_S) and worker.conn.recv()[0] == "ready":
            worker.ready = True
            return
        self._restart(worker)
        raise ServiceError(f"a worker process did not start within {_STARTUP_TIMEOUT_S:g} s; it was restarted")

    def _restart(self, worker: _Worker) -> None:
        """Kill a worker's process (its query with it) and start a fresh one in its place."""
        worker.process.kill()
        worker.process.join(10)
        worker.conn.close()
        worker.lifeline.close()
        conn, process, lifeline = self._start_process()
        with self._lock:
            worker.conn, worker.process, worker.lifeline = conn, process, lifeline
            worker.ready, worker.answering = False, False
            self.replaced += 1

    def _stop(self, worker: _Worker) -> None:
        with self._lock:
            if worker in self._workers:
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
        worker.lifeline.close()

    def close(self) -> None:
        """Stop every idle worker now, and each busy one as soon as its job ends."""
        self._closed = True
        while True:
            try:
                worker = self._idle.get_nowait()
            except queue.Empty:
                return
            self._stop(worker)


_SPAWNER: ThreadPoolExecutor | None = None
_SPAWNER_LOCK = threading.Lock()


def _spawner() -> ThreadPoolExecutor:
    """The one thread that starts every worker process: it lives as long as the server process,
    so a worker's parent-death signal fires when the server ends, never when a request's thread does."""
    global _SPAWNER
    with _SPAWNER_LOCK:
        if _SPAWNER is None:
            _SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="history-worker-spawner")
        return _SPAWNER
