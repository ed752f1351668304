"""The DataFrame path's array check of the ordering rules (``compaction/order.py``) names the same
first line, with the same message, as the event-by-event check of the in-process path, however
the lines are cut into runs (routing pieces, Spark partitions)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from history_pipeline.compaction.order import (
    CLOSE,
    ROW,
    SCHEMA,
    UNREADABLE,
    RunScanner,
    order_error,
)
from history_pipeline.errors import TimestampOrderError
from history_pipeline.wal.writer import WalPosition


def reference(ts: list[int], kinds: list[int], lower: int, frontier: int, upper: int) -> tuple[int, str] | None:
    """``compactor.check_order``, line by line (lines 2, 3, ...; an unreadable line ends it)."""
    position = WalPosition(closed_t=max(lower, frontier))
    for i, (t, kind) in enumerate(zip(ts, kinds, strict=True)):
        line = i + 2
        if kind == UNREADABLE:
            return None
        if t > upper:
            return line, f"t={t} is above the segment's upper bound {upper}"
        try:
            position = position.admit_kind(t, kind == CLOSE, kind == SCHEMA)
        except TimestampOrderError as exc:
            return line, exc.reason
    return None


def by_runs(ts: list[int], kinds: list[int], lower: int, frontier: int, upper: int,
            cuts: list[int], pieces: int) -> tuple[int, str] | None:
    lines = np.arange(2, len(ts) + 2, dtype=np.int64)
    t, k = np.asarray(ts, np.int64), np.asarray(kinds, np.int8)
    runs = []
    bounds = [0, *cuts, len(ts)]
    for a, b in zip(bounds, bounds[1:], strict=False):
        scanner = RunScanner(upper)
        inner = sorted({a, b, *(random.randint(a, b) for _ in range(pieces))})
        for c, d in zip(inner, inner[1:], strict=False):  # fed piece by piece, as the router does
            scanner.feed(lines[c:d], t[c:d], k[c:d])
        run = scanner.run()
        if run is not None:
            runs.append(run)
    random.shuffle(runs)  # collected from partitions in any order
    found = order_error(runs, lower, frontier, upper, "seg")
    return None if found is None else (found.line, found.reason)


@pytest.mark.parametrize("seed", range(300))
def test_runs_name_the_first_violation_as_the_sequential_check(seed):
    random.seed(seed)
    n = random.randint(0, 14)
    lower = random.randint(-1, 3)
    frontier = random.choice([-1, lower, lower + random.randint(0, 3)])
    upper = random.randint(lower, lower + 12)
    ts, kinds, t = [], [], lower
    for _ in range(n):  # mostly well-ordered, with the odd step back, repeat or jump past upper
        t = max(-1, t + random.choice([0, 0, 1, 1, 1, 2, -1, -3, 5]))
        kind = random.choices([ROW, SCHEMA, CLOSE, UNREADABLE], [8, 2, 2, 0.3])[0]
        ts.append(max(t, 0) if kind != CLOSE else t)
        kinds.append(kind)
    cuts = sorted(random.sample(range(1, n), random.randint(0, min(4, n - 1)))) if n > 1 else []
    assert by_runs(ts, kinds, lower, frontier, upper, cuts, 3) == reference(ts, kinds, lower, frontier, upper)


def test_the_writer_s_own_order_passes():
    ts = [2, 2, 3, 4, 5, 6, 6, 7]
    kinds = [ROW, ROW, CLOSE, ROW, SCHEMA, ROW, CLOSE, CLOSE]
    assert reference(ts, kinds, 1, 1, 7) is None
    assert by_runs(ts, kinds, 1, 1, 7, [3, 5], 2) is None
