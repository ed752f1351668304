"""The run coordinator: the sensor's compaction runs skip the queue only when it is empty and
every limit of the queue has room for them; every other run is queued."""

import dagster as dg
import pytest

from history_pipeline.orchestration.coordinator import launch_now
from history_pipeline.orchestration.segment_runs import batch_run_config, compact_segments_job

DATABASE, COMPACTION = "history_pipeline/database", "history_pipeline/compaction"
LIMITS = [{"key": DATABASE, "value": {"applyLimitPerUniqueValue": True}, "limit": 1},
          {"key": COMPACTION, "limit": 3}]


def _compaction(database):
    return {DATABASE: database, COMPACTION: "segments"}


def test_a_compaction_run_skips_the_queue_only_with_room_under_every_limit():
    assert launch_now(_compaction("a"), 4, LIMITS, [], queued=0)
    assert not launch_now(_compaction("a"), 4, LIMITS, [], queued=1)  # a queued run goes first
    assert not launch_now({DATABASE: "a"}, 4, LIMITS, [], queued=0)  # not the sensor's: queued
    assert not launch_now(_compaction("a"), 4, LIMITS, [_compaction("a")], queued=0)  # one per database
    assert launch_now(_compaction("a"), 4, LIMITS, [_compaction("b"), _compaction("c")], queued=0)
    assert not launch_now(_compaction("a"), 4, LIMITS, [_compaction(x) for x in "bcd"], queued=0)  # 3 compactions
    assert not launch_now(_compaction("a"), 2, LIMITS, [{}, {}], queued=0)  # all runs
    assert launch_now(_compaction("a"), -1, LIMITS, [{}] * 9, queued=0)  # -1: no overall limit
    only_b = [{"key": DATABASE, "value": "b", "limit": 0}]
    assert launch_now(_compaction("a"), 4, only_b, [], queued=0)
    assert not launch_now(_compaction("b"), 4, only_b, [], queued=0)


@pytest.fixture
def instance():
    overrides = {
        "run_coordinator": {"module": "history_pipeline.orchestration.coordinator",
                            "class": "CompactionFirstRunCoordinator",
                            "config": {"max_concurrent_runs": 4, "tag_concurrency_limits": LIMITS}},
        "run_launcher": {"module": "dagster._core.test_utils", "class": "MockedRunLauncher"},
    }
    with dg.instance_for_test(overrides=overrides) as instance:
        yield instance


def _submit(instance, tags):
    # a run as the daemon creates it: with the origin of its code location (the queue needs one)
    from dagster._core.remote_origin import InProcessCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

    target = LoadableTargetOrigin(module_name="history_pipeline.orchestration.definitions")
    location = InProcessCodeLocationOrigin(target)
    origin = RemoteJobOrigin(RemoteRepositoryOrigin(location, "__repository__"), compact_segments_job.name)
    run = instance.create_run_for_job(compact_segments_job, run_config=batch_run_config(["db.00000000000000000001"]),
                                      tags=tags, remote_job_origin=origin)
    return instance.run_coordinator.submit_run(dg.SubmitRunContext(run, workspace=None)).status


def test_the_coordinator_launches_compaction_runs_at_once_and_queues_the_rest(instance):
    launched, queued = dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.QUEUED
    assert _submit(instance, _compaction("a")) == launched
    assert _submit(instance, _compaction("a")) == queued  # its database has a run in progress
    for run in instance.get_runs(dg.RunsFilter(statuses=[queued])):
        instance.report_run_canceled(run)
    assert _submit(instance, {}) == queued  # maintenance: always queued
    assert _submit(instance, _compaction("b")) == queued  # behind the queued run
    for run in instance.get_runs(dg.RunsFilter(statuses=[queued])):
        instance.report_run_canceled(run)
    assert [_submit(instance, _compaction(db)) for db in "bcd"] == [launched, launched, queued]  # 3 compactions
    assert len(instance.run_launcher.queue()) == 3
