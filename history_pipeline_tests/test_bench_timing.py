"""The compaction bench's CPU time counts the whole process tree, ended children included."""

from __future__ import annotations

import subprocess
import sys

from bench.compaction import Timer

#: a child that spends about 0.2 s of CPU time, then ends
_BUSY = "import time\nend = time.process_time() + 0.2\nwhile time.process_time() < end:\n    pass\n"


def test_timer_counts_the_cpu_time_of_a_child_that_ended():
    with Timer() as timer:
        subprocess.run([sys.executable, "-c", _BUSY], check=True)
    assert timer.timing.cpu >= 0.15
    assert timer.timing.wall >= 0.15
