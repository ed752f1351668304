"""``map_tasks``: picklable tasks through Spark, results in the tasks' order, one job each call."""

from __future__ import annotations

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
