"""The benches' timing: the compaction bench's CPU time counts the whole process tree, ended children
included; the shared timed rounds take turns and report percentiles by one rule."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

#: a child that spends about 0.2 s of CPU time, then ends
_BUSY = "import time\nend = time.process_time() + 0.2\nwhile time.process_time() < end:\n    pass\n"


#: times the busy child in a process of its own: a test worker's other descendants (a JVM, a
#: daemon's processes) may end during the block without being reaped in this tree, and the CPU
#: time they had taken would leave the total with them
_TIMED = (
    "import subprocess, sys\n"
    "from bench.compaction import Timer\n"
    "with Timer() as timer:\n"
    "    subprocess.run([sys.executable, '-c', sys.argv[1]], check=True)\n"
    "print(timer.timing.cpu, timer.timing.wall)\n"
)


def test_timer_counts_the_cpu_time_of_a_child_that_ended():
    done = subprocess.run([sys.executable, "-c", _TIMED, _BUSY], check=True, capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1])
    cpu, wall = (float(x) for x in done.stdout.split())
    assert cpu >= 0.15
    assert wall >= 0.15


def test_timed_rounds_take_turns_after_untimed_warm_up_rounds():
    from bench.timing import interleaved, repeated

    calls: list[tuple[str, int]] = []
    first, second = interleaved([lambda k: calls.append(("a", k)) or k, lambda k: calls.append(("b", k)) or -k],
                                [1, 2, 3], warmup=[0])
    assert calls == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2), ("b", 2), ("a", 3), ("b", 3)]
    assert (len(first.wall), len(first.cpu), first.last, second.last) == (3, 3, 3, -3)
    count = iter(range(100))
    (only,) = repeated([lambda: next(count)], repeat=4, warmup=2)
    assert (len(only.wall), only.last) == (4, 5)


def test_percentiles_keep_the_benches_rule_for_the_sorted_sample():
    from bench.timing import Samples

    samples = Samples(wall=tuple(i / 1000 for i in range(200, 0, -1)), cpu=tuple(i / 1000 for i in range(200)))
    figures = samples.percentiles()
    assert round(figures["p50_ms"]) == 101 and round(figures["p99_ms"]) == 198  # sorted[100], sorted[197]
    assert round(figures["cpu_p50_ms"]) == 100 and round(figures["cpu_p99_ms"]) == 197
    assert samples.median_s == 0.1005
    assert Samples(wall=(0.004,), cpu=(0.001,)).percentiles()["p99_ms"] == 4.0
