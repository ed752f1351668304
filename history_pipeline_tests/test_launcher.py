"""WarmRunLauncher: each run is a process of its own, forked from a fork server that imported the
code location before the run was launched; a run can be terminated, a killed run process is seen
by run monitoring and leaves the next runs unharmed."""

import multiprocessing.forkserver
import os
import signal
import time
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.launcher.base import WorkerStatus

from history_pipeline.engine import process_alive
from history_pipeline.orchestration.launcher import PID_TAG, WarmRunLauncher, worker_handle

#: the process that imported this module: in a warm run, the fork server, not the run's own
IMPORTED_IN = os.getpid()


class Waiting(dg.Config):
    """Where the op reports its process, and the file whose presence lets it finish."""

    report: str
    go: str


@dg.op
def report_and_wait(config: Waiting) -> None:
    Path(config.report).write_text(f"{IMPORTED_IN} {os.getpid()}")
    deadline = time.time() + 120
    while not Path(config.go).exists() and time.time() < deadline:
        time.sleep(0.05)


@dg.op
def after(config: Waiting) -> None:
    Path(config.report + ".after").write_text(str(os.getpid()))


@dg.job(executor_def=dg.in_process_executor)
def waiting_job() -> None:
    report_and_wait()


@dg.job(executor_def=dg.multiprocess_executor)
def step_processes_job() -> None:
    after()


def _wait(predicate, timeout=60.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s")


@pytest.fixture
def instance(tmp_path):
    config = {"module": "history_pipeline.orchestration.launcher", "class": "WarmRunLauncher",
              "config": {"preload": ["dagster", __name__]}}
    (tmp_path / "home").mkdir()
    with dg.instance_for_test(overrides={"run_launcher": config}, temp_dir=str(tmp_path / "home")) as instance:
        yield instance
        instance.run_launcher.join(30)
    # the fork server lives as long as the process that launched runs: this test stops it
    multiprocessing.forkserver._forkserver._stop()


def _launch(instance, job, tmp_path, name):
    config = Waiting(report=str(tmp_path / f"{name}.report"), go=str(tmp_path / f"{name}.go"))
    op = "report_and_wait" if job is waiting_job else "after"
    run = instance.create_run_for_job(job_def=job, run_config={"ops": {op: {"config": config.model_dump()}}},
                                      job_code_origin=dg.reconstructable(job).get_python_origin())
    instance.launch_run(run.run_id, workspace=None)
    return run.run_id, config


def _status(instance, run_id):
    return instance.get_run_by_id(run_id).status


@pytest.mark.daemon
def test_runs_fork_warm_terminate_and_stay_isolated(instance, tmp_path):
    launcher = instance.run_launcher
    assert isinstance(launcher, WarmRunLauncher)

    # a run: its own process, forked from the server that imported the job's module
    run_id, config = _launch(instance, waiting_job, tmp_path, "first")
    Path(config.go).touch()
    _wait(lambda: _status(instance, run_id) == dg.DagsterRunStatus.SUCCESS)
    imported_in, ran_in = map(int, Path(config.report).read_text().split())
    assert ran_in not in (os.getpid(), imported_in)  # not this process, not the warm parent
    assert imported_in != os.getpid()  # the module was imported before the fork, not in the run
    assert worker_handle(instance.get_run_by_id(run_id).tags).pid == ran_in

    # terminated from the launcher: the run is canceled, its process ends
    run_id, config = _launch(instance, waiting_job, tmp_path, "terminated")
    _wait(lambda: Path(config.report).exists())
    assert launcher.terminate(run_id)
    _wait(lambda: _status(instance, run_id) == dg.DagsterRunStatus.CANCELED)
    pid = int(instance.get_run_by_id(run_id).tags[PID_TAG])
    _wait(lambda: launcher.check_run_worker_health(instance.get_run_by_id(run_id)).status is not WorkerStatus.RUNNING)
    assert not process_alive(pid, reap=True)  # reaped in case it were ours (the fork server reaps it)
    assert not launcher.terminate(run_id)  # finished: nothing to terminate

    # a run's process killed: monitoring sees it failed; the next run is unharmed
    run_id, config = _launch(instance, waiting_job, tmp_path, "killed")
    _wait(lambda: Path(config.report).exists())
    os.kill(int(instance.get_run_by_id(run_id).tags[PID_TAG]), signal.SIGKILL)
    _wait(lambda: launcher.check_run_worker_health(instance.get_run_by_id(run_id)).status is WorkerStatus.FAILED)
    assert _status(instance, run_id) == dg.DagsterRunStatus.STARTED  # monitoring's to fail it, as for any launcher

    # a job whose executor starts step processes of its own (the maintenance jobs' default)
    run_id, config = _launch(instance, step_processes_job, tmp_path, "steps")
    _wait(lambda: _status(instance, run_id) in (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE), 120)
    assert _status(instance, run_id) == dg.DagsterRunStatus.SUCCESS
    assert Path(config.report + ".after").exists()

