"""Benchmarks of history_pipeline, each beside a baseline measured in the same run."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path


def provenance() -> str:
    """One line dating a measurement: UTC time, the commit measured (``+`` when the tree had
    changes) and the command that ran, for the head of a results file."""
    repo = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = "unknown", ""
    command = " ".join(["python -m bench." + Path(sys.argv[0]).stem, *sys.argv[1:]])
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return f"Measured {when} on commit {commit}{'+' if dirty else ''}: `{command}`."
