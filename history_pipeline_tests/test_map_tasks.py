"""``map_tasks``: picklable tasks through Spark, results in the tasks' order, one job each call;
what a Python worker imports to run a compaction or maintenance task."""

from __future__ import annotations

import subprocess
import sys

import pytest

from history_pipeline.execution import map_tasks


def test_map_tasks_in_process_keeps_the_order():
    assert map_tasks(None, abs, [-3, 1, -2]) == [3, 1, 2]
    assert map_tasks(None, abs, []) == []


@pytest.mark.spark
def test_map_tasks_runs_one_spark_job_and_keeps_the_order(spark):
    # a frame of the tasks partitioned by index costs a sampling job and a shuffle before the tasks
    # run: a snapshot refresh inside compaction pays that twice (its pieces, then the close)
    context = spark.sparkContext
    tracker = context.statusTracker()
    context.setJobGroup("map-tasks-one-job", "map_tasks", False)
    try:
        assert map_tasks(spark, abs, [-3, 1, -2, 5]) == [3, 1, 2, 5]
        jobs = tracker.getJobIdsForGroup("map-tasks-one-job")
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    assert len(jobs) == 1
    stages = tracker.getJobInfo(jobs[0]).stageIds
    assert len(stages) == 1  # no shuffle
    assert tracker.getStageInfo(stages[0]).numTasks == 4  # one partition per task


def test_a_task_of_compaction_or_maintenance_imports_neither_the_store_nor_duckdb():
    # a fresh Spark Python worker unpickles a task's function by reference to its module: what that
    # imports is paid before its first task, whenever Spark starts a worker (after a minute idle)
    probe = ("import sys, history_pipeline.compaction.frames, history_pipeline.maintenance.snapshots; "
             "print(sorted(m for m in ('duckdb', 'history_pipeline.store', 'history_pipeline.query.engine') "
             "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    public = ("import history_pipeline as hp; "
              "print(hp.HistoryStore.__name__, hp.StoreSettings.__name__)")
    out = subprocess.run([sys.executable, "-c", public], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["HistoryStore", "StoreSettings"]
