"""A run launcher whose run processes start warm: each run is a process of its own, forked from a
parent that has already imported Dagster, the code location and the Spark client.

Dagster's default launcher asks the code server to start a run; the code server spawns a fresh
interpreter that imports Dagster, the code location and pyspark again (seconds, many more on a
loaded machine) before the run's first step. :class:`WarmRunLauncher` keeps a fork server
(Python's ``multiprocessing`` "forkserver" context, modules preloaded with
``set_forkserver_preload``) in the process that launches runs (the daemon, or the webserver for a
run launched from the UI without a queue); each run is a fork of it, so a crash or a kill stays
within its run, and the run still loads its job from its code origin and executes it as Dagster's
own run worker does (``dagster api execute_run``).

Set it in ``dagster.yaml``::

    run_launcher:
      module: history_pipeline.orchestration.launcher
      class: WarmRunLauncher

Termination sends the run process SIGTERM (Dagster's run worker takes it as an interrupt: the
run is marked canceled); run monitoring asks :meth:`WarmRunLauncher.check_run_worker_health`.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dagster import _check as check
from dagster._core.launcher.base import CheckRunHealthResult, LaunchRunContext, RunLauncher, WorkerStatus
from dagster._serdes import ConfigurableClass, ConfigurableClassData, serialize_value

from history_pipeline.engine import process_alive

#: modules the fork server imports once; every run process starts with them loaded
DEFAULT_PRELOAD = (
    "dagster",
    # what a run worker loads before its job: the run-execution entry, the SQLite instance
    # storages and their schema-migration checks (a second and more on a loaded machine otherwise)
    "dagster._cli.api",
    "dagster._core.storage.sqlite_storage",
    "dagster._core.storage.runs.sqlite.sqlite_run_storage",
    "dagster._core.storage.event_log.sqlite.sqlite_event_log",
    "dagster._core.storage.schedules.sqlite.sqlite_schedule_storage",
    "alembic.command",
    "upath",
    "history_pipeline.orchestration.definitions",
    # the Spark Connect client (grpc, pandas, pyarrow): a run's session on the engine
    "pyspark.sql.connect.session",
)

#: run tags naming the process of a run, so that another process (the webserver) can terminate it
PID_TAG = "history_pipeline/run_pid"
HOST_TAG = "history_pipeline/run_host"


@dataclass(frozen=True)
class WorkerHandle:
    """Where a run's process is: its pid on a host."""

    pid: int
    host: str


def worker_handle(tags: Mapping[str, str]) -> WorkerHandle | None:
    """The run process named by a run's tags, or None when the run was not launched warm."""
    pid, host = tags.get(PID_TAG), tags.get(HOST_TAG)
    if pid is None or host is None or not pid.isdigit():
        return None
    return WorkerHandle(int(pid), host)


def run_worker(run_id: str, instance_ref: str) -> None:
    """The body of a run process: execute the run as Dagster's own run worker does, the job loaded
    from the run's code origin (its modules are already imported in the fork server)."""
    from dagster._cli.api import _execute_run_command_body
    from dagster._core.instance import DagsterInstance, InstanceRef
    from dagster._serdes import deserialize_value
    from dagster._utils.interrupts import capture_interrupts, setup_interrupt_handlers

    # a fork inherits the server's default handlers; Dagster's interrupt handling needs SIGINT's,
    # and takes SIGTERM (what terminate sends) as SIGINT
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with capture_interrupts():
        setup_interrupt_handlers()
        with DagsterInstance.from_ref(deserialize_value(instance_ref, InstanceRef)) as instance:
            failed = _execute_run_command_body(run_id, instance, lambda event: None,
                                               set_exit_code_on_failure=True)
    sys.stdout.flush()
    sys.stderr.flush()
    # exit at once: a client thread left by the run (Spark Connect's) must not hold the process;
    # a failed run exits 1, so monitoring tells it from a process that died mid-run
    os._exit(failed)


class WarmRunLauncher(RunLauncher, ConfigurableClass):
    """Launches each run in its own process forked from a warm fork server (see the module)."""

    def __init__(self, inst_data: ConfigurableClassData | None = None, preload: Sequence[str] = DEFAULT_PRELOAD):
        self._inst_data = inst_data
        self._preload = list(preload)
        self._lock = threading.Lock()
        self._context: Any = None
        #: processes this launcher started, by run id, until they are seen finished
        self._processes: dict[str, Any] = {}
        super().__init__()

    @property
    def inst_data(self) -> ConfigurableClassData | None:
        return self._inst_data

    @classmethod
    def config_type(cls) -> dict[str, Any]:
        from dagster import Array, Field

        return {"preload": Field(Array(str), is_required=False, default_value=list(DEFAULT_PRELOAD),
                                 description="Modules the fork server imports before any run forks from it.")}

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]) -> WarmRunLauncher:
        return cls(inst_data=inst_data, preload=config_value.get("preload", DEFAULT_PRELOAD))

    def _forkserver(self) -> Any:
        """The forkserver context, its preload set before the server first starts."""
        with self._lock:
            if self._context is None:
                context = multiprocessing.get_context("forkserver")
                context.set_forkserver_preload(self._preload)
                self._context = context
            return self._context

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        check.not_none(run.job_code_origin, f"run {run.run_id} has no code origin to load its job from")
        self._reap()
        process = self._forkserver().Process(
            target=run_worker,
            args=(run.run_id, serialize_value(self._instance.get_ref())),
            name=f"dagster-run-{run.run_id}",
            daemon=False,
        )
        process.start()
        with self._lock:
            self._processes[run.run_id] = process
        self._instance.add_run_tags(run.run_id, {PID_TAG: str(process.pid), HOST_TAG: socket.gethostname()})

    def _reap(self) -> None:
        """Forget (and close) the processes that have exited: each holds a file descriptor."""
        with self._lock:
            done = [run_id for run_id, p in self._processes.items() if p.exitcode is not None]
            for run_id in done:
                self._processes.pop(run_id).close()

    def _process_of(self, run_id: str) -> Any:
        with self._lock:
            return self._processes.get(run_id)

    def terminate(self, run_id: str) -> bool:
        run = self._instance.get_run_by_id(run_id)
        if run is None or run.is_finished:
            return False
        handle = worker_handle(run.tags)
        if handle is None or handle.host != socket.gethostname():
            self._instance.report_engine_event(
                "The run's process is not on this host (or was not launched warm): it cannot be terminated here.",
                run, cls=self.__class__)
            return False
        process = self._process_of(run_id)
        if process is not None and process.exitcode is not None:
            return False
        if process is None and not process_alive(handle.pid):
            return False
        self._instance.report_run_canceling(run)
        try:
            os.kill(handle.pid, signal.SIGTERM)
        except ProcessLookupError:
            return False
        return True

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: Any) -> CheckRunHealthResult:
        process = self._process_of(run.run_id)
        if process is not None:
            code = process.exitcode
            if code is None:
                return CheckRunHealthResult(WorkerStatus.RUNNING, run_worker_id=str(process.pid))
            if code == 0:
                return CheckRunHealthResult(WorkerStatus.SUCCESS, run_worker_id=str(process.pid))
            return CheckRunHealthResult(WorkerStatus.FAILED, f"the run's process exited with code {code}",
                                        run_worker_id=str(process.pid))
        handle = worker_handle(run.tags)
        if handle is None or handle.host != socket.gethostname():
            return CheckRunHealthResult(WorkerStatus.UNKNOWN, "the run was not launched by this host's launcher")
        if process_alive(handle.pid):
            return CheckRunHealthResult(WorkerStatus.RUNNING, run_worker_id=str(handle.pid))
        return CheckRunHealthResult(WorkerStatus.NOT_FOUND, f"no process {handle.pid} for the run",
                                    run_worker_id=str(handle.pid))

    def join(self, timeout: int = 30) -> None:
        """Wait for the processes this launcher started (tests, shutdown)."""
        with self._lock:
            processes = list(self._processes.values())
        for process in processes:
            process.join(timeout)

    def dispose(self) -> None:
        self._reap()
