"""The run coordinator: Dagster's queue, except that a compaction run the sensor requests is
launched at once when the queue is empty and every limit of the queue has room for it.

A queued run waits for the queue daemon's next pass (``dequeue_interval_seconds``, a whole second
at least); a compaction run is launched as soon as it is submitted when nothing waits before it.
The queue's limits hold for it as they hold in the queue (:func:`launch_now`): the run is counted
against ``max_concurrent_runs`` and every tag limit that applies to it, among the runs in progress.
Any run waiting in the queue sends it to the queue too, so the queue daemon never launches beside
it from an older count, and queued runs keep their order. Other runs (maintenance, runs from the
UI) are queued as before.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import dagster as dg

from history_pipeline.orchestration.sensors import BATCH_TAG_VALUE, COMPACTION_TAG

#: the tag (and value) of the runs launched without the queue when there is room: the sensor's
#: compaction runs
DIRECT_TAG = (COMPACTION_TAG, BATCH_TAG_VALUE)
#: run states that hold a slot of the queue's limits (Dagster's queue counts the same ones)
IN_PROGRESS = (dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING)


def _limit_counts(limit: Mapping[str, Any], tags: Mapping[str, str], others: Iterable[Mapping[str, str]]) -> bool:
    """Whether ``limit`` (a ``tag_concurrency_limits`` entry) has room for a run tagged ``tags``
    beside runs in progress tagged ``others``."""
    key, value = limit["key"], limit.get("value")
    if key not in tags:
        return True
    if isinstance(value, Mapping) and value.get("applyLimitPerUniqueValue"):
        same = [t for t in others if t.get(key) == tags[key]]
    elif value is None:
        same = [t for t in others if key in t]
    elif tags[key] == value:
        same = [t for t in others if t.get(key) == value]
    else:
        return True
    return len(same) + 1 <= int(limit["limit"])


def launch_now(tags: Mapping[str, str], max_concurrent_runs: int, tag_limits: Sequence[Mapping[str, Any]],
               in_progress: Sequence[Mapping[str, str]], queued: int) -> bool:
    """Whether a run tagged ``tags`` may be launched without the queue: it is a compaction run of
    the sensor, no run is queued, and ``max_concurrent_runs`` (-1: no limit) and every tag limit
    have room for it beside the runs in progress (their tags: ``in_progress``)."""
    if tags.get(DIRECT_TAG[0]) != DIRECT_TAG[1] or queued:
        return False
    if max_concurrent_runs != -1 and len(in_progress) + 1 > max_concurrent_runs:
        return False
    return all(_limit_counts(limit, tags, in_progress) for limit in tag_limits)


class CompactionFirstRunCoordinator(dg.QueuedRunCoordinator):
    """Dagster's ``QueuedRunCoordinator`` (same configuration), launching the sensor's compaction
    runs at once when the queue is empty and its limits have room (:func:`launch_now`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # submissions of one process are decided one at a time: two never count the same free slot
        self._deciding = threading.Lock()

    def submit_run(self, context: dg.SubmitRunContext) -> dg.DagsterRun:
        """Launch the run now when :func:`launch_now` allows it, else queue it."""
        run = context.dagster_run
        if run.status != dg.DagsterRunStatus.NOT_STARTED or run.tags.get(DIRECT_TAG[0]) != DIRECT_TAG[1]:
            return super().submit_run(context)
        with self._deciding:
            instance = self._instance
            config = self.get_run_queue_config()
            queued = instance.get_runs_count(dg.RunsFilter(statuses=[dg.DagsterRunStatus.QUEUED]))
            running = instance.get_runs(dg.RunsFilter(statuses=list(IN_PROGRESS)))
            tags = [r.tags for r in running if r.run_id != run.run_id]
            if not launch_now(run.tags, config.max_concurrent_runs, config.tag_concurrency_limits, tags, queued):
                return super().submit_run(context)
            instance.launch_run(run.run_id, context.workspace)
        launched = instance.get_run_by_id(run.run_id)
        if launched is None:
            raise dg.DagsterInvariantViolationError(f"run {run.run_id} vanished while it was launched")
        return launched
