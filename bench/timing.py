"""Timed rounds shared by the benches: each way of doing a thing is called in turn, round by round,
so that load from others on a shared machine hits every way alike; wall time and CPU time per call.

    fetch, service = interleaved([lambda k: store.fetch_row(t, k, as_of),
                                  lambda k: client.fetch_row(t, k, as_of)], keys)
    fetch.percentiles()   # {"p50_ms": ..., "p99_ms": ..., "cpu_p50_ms": ..., "cpu_p99_ms": ...}
    (join,) = repeated([lambda: con.sql(query).to_arrow_table()], repeat=3)
    join.median_s, join.last
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

K = TypeVar("K")


@dataclass(frozen=True)
class Samples:
    """One way's timed calls: wall seconds, CPU seconds of this process (all its threads, not its
    children: waiting for a core on a loaded machine does not count), and the last call's answer."""

    wall: tuple[float, ...]
    cpu: tuple[float, ...]
    last: Any = None

    def at(self, q: float, cpu: bool = False) -> float:
        """The ``q`` quantile in seconds: the sorted sample at ``max(0, int(n * q) - 1)``, the median
        at ``n // 2`` (the rule every bench has reported by)."""
        ordered = sorted(self.cpu if cpu else self.wall)
        return ordered[len(ordered) // 2] if q == 0.5 else ordered[max(0, int(len(ordered) * q) - 1)]

    @property
    def median_s(self) -> float:
        """The median wall time in seconds (the mean of the middle two for an even count)."""
        return statistics.median(self.wall)

    def percentiles(self) -> dict[str, float]:
        """p50 and p99 of wall and CPU time in milliseconds, under the keys the results files use."""
        return {"p50_ms": 1000 * self.at(0.5), "p99_ms": 1000 * self.at(0.99),
                "cpu_p50_ms": 1000 * self.at(0.5, cpu=True), "cpu_p99_ms": 1000 * self.at(0.99, cpu=True)}


def interleaved(calls: Sequence[Callable[[K], Any]], keys: Iterable[K], warmup: Iterable[K] = ()) -> list[Samples]:
    """Each call timed on every key, the calls taking turns key by key, after the ``warmup`` keys
    (called alike, not timed); one ``Samples`` a call, in the order given."""
    for key in warmup:
        for call in calls:
            call(key)
    wall: list[list[float]] = [[] for _ in calls]
    cpu: list[list[float]] = [[] for _ in calls]
    last: list[Any] = [None for _ in calls]
    for key in keys:
        for i, call in enumerate(calls):
            start, start_cpu = time.perf_counter(), time.process_time()
            last[i] = call(key)
            wall[i].append(time.perf_counter() - start)
            cpu[i].append(time.process_time() - start_cpu)
    return [Samples(tuple(w), tuple(c), answer) for w, c, answer in zip(wall, cpu, last, strict=True)]


def repeated(calls: Sequence[Callable[[], Any]], repeat: int, warmup: int = 1) -> list[Samples]:
    """Each call timed ``repeat`` times in interleaved rounds after ``warmup`` untimed rounds."""
    return interleaved([lambda _, call=call: call() for call in calls], range(repeat), range(warmup))
